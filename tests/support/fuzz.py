"""Property-based fuzzing of every RPC of every txmq service (``tests/integration/test_fuzz.py``
runs a small budget, ``make fuzz`` → ``python -m tests.fuzz`` a large one).

Requests are generated from the methods' descriptors with hypothesis: every field may be
set, numbers from the extremes (NaN, ±inf, ±0, the type's bounds, huge and tiny values),
strings and bytes from empty to 100 KB, enums from unknown numbers, repeated fields and
maps of a few entries, nested messages three deep; a share of the requests are raw bytes
instead of a message. Unary requests go out in concurrent batches, stream requests as
streams of one to three messages that the client then half-closes. The property, per call:
the status is never INTERNAL, UNKNOWN or CANCELLED (what a server says when its own code
failed or it dropped the call). The census counts every status per RPC.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: Statuses that mean the server failed (its own error, or it dropped the call).
FORBIDDEN = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED})
#: RocketMQ in-band codes that mean the same as INTERNAL (rocketmq-apis definition.proto).
IN_BAND_INTERNAL = frozenset({50000, 50001})
#: Unary requests sent concurrently per hypothesis example.
BATCH = 25
#: A call's deadline: long polls and streams that stay open end with DEADLINE_EXCEEDED.
CALL_TIMEOUT_SECONDS = 3.0
#: The deadline of a call whose responses are a stream.
STREAM_TIMEOUT_SECONDS = 0.5
MAX_DEPTH = 3

_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 0.001, 1e-300, 5e-324, 1e300, -1e300,
           1.7976931348623157e308, 2.0 ** 63, 86400.0 * 367]
_INT_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-2**31, 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1), FieldDescriptor.TYPE_INT64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-2**63, 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_WORDS = ["", "a", "fuzz", "broker-0", "%HALF%", "%DLQ%g", "*", "TagA || TagB", "-1", "\x00", "é" * 3,
          "x" * 256, "y" * 100_000]


#: Strings that name real things in the fuzzed cluster (a topic, groups, ids of stored
#: messages and transactions, a receipt handle: ``seed``), so generated requests also reach
#: past the name and id checks.
SEEDS: list[str] = []


def _openings() -> dict[str, bytes]:
    from txmq.v1 import checker_pb2
    subscribe = checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
        client_id="fuzz", producer_groups=["fuzz"], check_credit=8))
    out = {"txmq.v1.CheckerService/CheckTransactionState": subscribe.SerializeToString()}
    try:
        from services.proxy.protocol import definition_pb2, service_pb2
    except ImportError:  # the proxy's protocol package is not installed
        return out
    settings = service_pb2.TelemetryCommand(settings=definition_pb2.Settings(
        client_type=definition_pb2.PRODUCER, publishing=definition_pb2.Publishing(
            topics=[definition_pb2.Resource(name="fuzz")])))
    out["apache.rocketmq.v2.MessagingService/Telemetry"] = settings.SerializeToString()
    return out


OPENINGS = _openings()


def _int_values(kind: int) -> st.SearchStrategy[int]:
    low, high = _INT_BOUNDS[kind]
    picks = sorted({v for v in (low, high, 0, 1, -1, 2, 1000, high // 2, low // 2) if low <= v <= high})
    return st.sampled_from(picks) | st.integers(low, high)


def _scalar(fd: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = fd.type
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        finite = st.floats(allow_nan=False, allow_infinity=False, width=32 if t == FieldDescriptor.TYPE_FLOAT else 64)
        return st.sampled_from(_FLOATS) | finite
    if t in _INT_BOUNDS:
        return _int_values(t)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return st.sampled_from(_WORDS + SEEDS) | st.text(max_size=24)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.sampled_from([b"", b"\x00", b"z" * 100_000]) | st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in fd.enum_type.values]
        return st.sampled_from(known + [max(known) + 1, 2**31 - 1, -1, -2**31])
    raise AssertionError(f"no strategy for {fd.full_name}")


@st.composite
def messages(draw: Callable[..., Any], descriptor: Descriptor, depth: int = 0) -> Any:
    """A message of ``descriptor`` with any of its fields set to extreme values."""
    message = message_factory.GetMessageClass(descriptor)()
    for fd in descriptor.fields:
        if not draw(st.booleans()):
            continue
        try:
            _set(draw, message, fd, depth)
        except (ValueError, TypeError, OverflowError):
            pass  # a value this field's type cannot hold (a closed enum): leave it unset
    return message


def _set(draw: Callable[..., Any], message: Any, fd: FieldDescriptor, depth: int) -> None:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        sub = fd.message_type
        if sub.GetOptions().map_entry:
            key_fd, value_fd = sub.fields_by_name["key"], sub.fields_by_name["value"]
            target = getattr(message, fd.name)
            for _ in range(draw(st.integers(0, 3))):
                key = draw(_scalar(key_fd))
                if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    if depth < MAX_DEPTH:
                        target[key].CopyFrom(draw(messages(value_fd.message_type, depth + 1)))
                else:
                    target[key] = draw(_scalar(value_fd))
            return
        if depth >= MAX_DEPTH:
            return
        if fd.is_repeated:
            getattr(message, fd.name).extend(draw(st.lists(messages(sub, depth + 1), max_size=3)))
        else:
            getattr(message, fd.name).CopyFrom(draw(messages(sub, depth + 1)))
        return
    if fd.is_repeated:
        getattr(message, fd.name).extend(draw(st.lists(_scalar(fd), max_size=4)))
    else:
        setattr(message, fd.name, draw(_scalar(fd)))


def requests(method: MethodDescriptor) -> st.SearchStrategy[bytes]:
    """Serialized requests of ``method``: generated messages, or raw bytes (a third)."""
    raw = st.binary(min_size=1, max_size=256) | st.sampled_from([b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f"])
    generated = messages(method.input_type).map(lambda m: m.SerializeToString())
    return st.one_of(generated, generated, raw)


@dataclass
class Census:
    """Statuses per RPC (``"Service/Method"`` → code name → count) and the forbidden ones."""

    counts: dict[str, collections.Counter[str]] = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    #: Forbidden outcomes, distinct (RPC, code, first words of the details), with a count.
    failures: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, rpc: str, code: str, details: str, forbidden: bool) -> None:
        self.counts[rpc][code] += 1
        if forbidden:
            self.failures[f"{rpc}: {code}: {details[:160]}"] += 1

    def calls(self, rpc: str) -> int:
        return sum(self.counts[rpc].values())

    def table(self) -> str:
        codes = sorted({c for counter in self.counts.values() for c in counter})
        width = max([len(r) for r in self.counts] + [10])
        lines = [f"{'rpc'.ljust(width)}  " + "  ".join(f"{c:>18}" for c in codes)]
        for rpc in sorted(self.counts):
            lines.append(f"{rpc.ljust(width)}  " + "  ".join(f"{self.counts[rpc].get(c, 0):>18}" for c in codes))
        return "\n".join(lines)


def _identity(data: bytes) -> bytes:
    return data


def _outcome(call: Callable[[], Any], in_band: Callable[[bytes], int] | None) -> tuple[str, str, bool]:
    """(status name, details, forbidden) of one call: the gRPC status, or for a service that
    answers errors in band (the proxy) the worst in-band code of its responses."""
    worst = 0
    try:
        result = call()
        responses = [result] if isinstance(result, (bytes, bytearray)) else result
        for response in responses:
            if in_band is not None:
                code = in_band(response)
                worst = code if code in IN_BAND_INTERNAL else max(worst, code) if worst not in IN_BAND_INTERNAL else worst
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or "", exc.code() in FORBIDDEN
    if in_band is not None and worst not in (0, 20000):
        return f"rmq {worst}", "", worst in IN_BAND_INTERNAL
    return "OK", "", False


class Fuzzer:
    """Fuzzes the methods of ``services`` (descriptor → address) over raw channels."""

    def __init__(self, targets: Iterable[tuple[ServiceDescriptor, str]], census: Census | None = None,
                 threads: int = 16, timeout: float = CALL_TIMEOUT_SECONDS, batch: int = BATCH) -> None:
        self.targets = list(targets)
        #: Requests per hypothesis example (sent concurrently): smaller batches, more examples.
        self.batch = batch
        self.timeout = timeout
        #: A valid first message per client-streaming method ("package.Service/Method").
        self.openings: dict[str, bytes] = dict(OPENINGS)
        #: Sent with every call: the proxy binds streams to the RocketMQ client id header.
        self.metadata = (("x-mq-client-id", "fuzz-client"),)
        self.census = census or Census()
        self._channels: dict[str, grpc.Channel] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(threads)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for channel in self._channels.values():
            channel.close()

    def _channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(
                address, options=[("grpc.max_send_message_length", 64 << 20),
                                  ("grpc.max_receive_message_length", 64 << 20)])
        return self._channels[address]

    @staticmethod
    def _in_band(method: MethodDescriptor) -> Callable[[bytes], int] | None:
        """The RocketMQ services answer errors in a ``status`` field of their responses."""
        output = method.output_type
        if not method.containing_service.full_name.startswith("apache.rocketmq.") or "status" not in output.fields_by_name:
            return None
        cls = message_factory.GetMessageClass(output)

        def code(data: bytes) -> int:
            response = cls.FromString(data)
            return response.status.code if response.HasField("status") else 0
        return code

    def methods(self) -> list[tuple[str, MethodDescriptor, str]]:
        return [(f"{service.name}/{method.name}", method, address)
                for service, address in self.targets for method in service.methods]

    def _callable(self, method: MethodDescriptor, address: str) -> Callable[..., Any]:
        path = f"/{method.containing_service.full_name}/{method.name}"
        channel = self._channel(address)
        kind = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
                (True, False): channel.stream_unary, (True, True): channel.stream_stream}[
            (method.client_streaming, method.server_streaming)]
        return kind(path, request_serializer=_identity, response_deserializer=_identity)

    def run(self, rpc: str, method: MethodDescriptor, address: str, calls: int) -> None:
        """About ``calls`` calls of one RPC (whole batches of :data:`BATCH` for unary ones)."""
        stub = self._callable(method, address)
        census = self.census
        pool = self._pool
        streaming = method.client_streaming

        metadata = self.metadata
        # A server stream that stays open by design (Health/Watch, a long poll) ends at its
        # deadline: keep that short so it does not dominate the budget.
        timeout = min(self.timeout, STREAM_TIMEOUT_SECONDS) if method.server_streaming else self.timeout

        in_band = self._in_band(method)

        def send(bodies: list[Any]) -> None:
            if streaming:
                jobs = [pool.submit(_outcome, lambda b=b: stub(iter(b), timeout=timeout, metadata=metadata), in_band)
                        for b in bodies]
            else:
                jobs = [pool.submit(_outcome, lambda b=b: stub(b, timeout=timeout, metadata=metadata), in_band)
                        for b in bodies]
            for job in jobs:
                census.add(rpc, *job.result())

        one = requests(method)
        body = st.lists(one, min_size=1, max_size=3) if streaming else one
        opening = self.openings.get(f"{method.containing_service.full_name}/{method.name}")
        if streaming and opening is not None:
            # Half the streams open as a real client would, so the rest reaches past the
            # first-message checks.
            body = body | st.lists(one, min_size=1, max_size=3).map(lambda rest: [opening, *rest])
        examples = max(1, math.ceil(calls / self.batch))

        @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(body, min_size=self.batch, max_size=self.batch))
        def batch(bodies: list[Any]) -> None:
            send(bodies)

        batch()


# ------------------------------------------------------------------ a whole cluster
def cluster_targets(cluster: Any) -> list[tuple[ServiceDescriptor, str]]:
    """Every service of ``cluster`` (a name server, a broker, a checker, a proxy) with its
    address, the stock health service of each included."""
    from grpc_health.v1 import health_pb2

    from services.proxy.protocol import service_pb2
    from txmq.v1 import admin_pb2, broker_pb2, checker_pb2, nameserver_pb2, replication_pb2

    health = health_pb2.DESCRIPTOR.services_by_name["Health"]
    ns, broker = cluster.nameserver_address, cluster.brokers[0].address
    targets = [(nameserver_pb2.DESCRIPTOR.services_by_name["NameServerService"], ns),
               (admin_pb2.DESCRIPTOR.services_by_name["AdminService"], ns),
               (broker_pb2.DESCRIPTOR.services_by_name["BrokerService"], broker),
               (replication_pb2.DESCRIPTOR.services_by_name["ReplicationService"], broker),
               (health, ns), (health, broker)]
    for proc in cluster.checkers:
        targets += [(checker_pb2.DESCRIPTOR.services_by_name["CheckerService"], proc.address), (health, proc.address)]
    for proc in cluster.proxies:
        targets += [(service_pb2.DESCRIPTOR.services_by_name["MessagingService"], proc.address), (health, proc.address)]
    return targets


def seed(cluster: Any, topic: str = "fuzz", group: str = "fuzz") -> list[str]:
    """Stores a normal and a half message in ``cluster`` (topic ``topic``, two queues) and
    receives one; returns the names and ids that name them (also added to :data:`SEEDS`)."""
    from txmq.v1 import admin_pb2, broker_pb2, broker_pb2_grpc, common_pb2

    cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(topic=topic, queue_count=2), timeout=5)
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.brokers[0].address))
    words = [topic, group, cluster.brokers[0].name]
    for kind in (common_pb2.MESSAGE_TYPE_NORMAL, common_pb2.MESSAGE_TYPE_TRANSACTION):
        sent = stub.SendMessage(broker_pb2.SendMessageRequest(message=common_pb2.Message(
            topic=topic, body=b"seed", type=kind, producer_group=group, producer_client_id="fuzz")), timeout=5)
        words += [sent.message_id] + ([sent.transaction_id] if sent.transaction_id else [])
    received = stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
        consumer_group=group, topic=topic, queue_id=-1, max_messages=1, invisible_duration_seconds=60), timeout=5)
    words += [m.receipt_handle for m in received.messages]
    SEEDS[:] = words
    return words


def serving(cluster: Any) -> dict[str, str]:
    """Each service's health (``""`` service) by process name: SERVING when it still serves."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    out = {}
    for proc in cluster.processes:
        with grpc.insecure_channel(proc.address) as channel:
            try:
                response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                out[proc.name] = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            except grpc.RpcError as exc:
                out[proc.name] = exc.code().name
    return out


def fsck(data_dir: str) -> tuple[int, str]:
    """``python -m services.broker.fsck`` on a stopped broker's data directory."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "services.broker.fsck", "--data-dir", data_dir],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr
