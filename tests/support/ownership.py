"""The ownership census: for every RPC that takes an id (a transaction id, a receipt handle, a
global transaction id, a check's transaction), a principal allowed on resource A tries an id
of resource B — captured (B's own, as a subscriber of B's topic or a log would see it) and
forged (made from its own id: another sequence, another topic, another group, its tag
moved) — natively and through the RocketMQ proxy, on a real cluster with auth on. Each
attempt must be refused, and afterwards B's resources are read back unchanged. Malformed
ids (a valid checksum over a non-UTF-8 topic) go to every RPC that takes a receipt handle:
never INTERNAL/UNKNOWN (or RocketMQ 50000/50001). Then etcd is tried with a certificate
from the cluster's CA that is not a broker's, and the default chart is rendered and checked.

``tests/integration/test_ownership.py``, ``tests/proxy/test_ownership.py`` and
``tests/integration/test_ownership_etcd.py`` run it; ``python -m tests.ownership_census``
prints every attempt and the totals.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import hmac
import json
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import grpc
from google.protobuf import duration_pb2

from services.common.auth import hash_token
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from txmq.ids import ReceiptHandle, TransactionId
from txmq.v1 import (admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, checker_pb2, checker_pb2_grpc,
                     common_pb2)

C = common_pb2
RPC_TIMEOUT = 10.0
SERVICES = ("nameserver", "broker", "checker", "proxy")
#: Native principals and what they may do. Resource A of the census is the attacker's own;
#: resource B another principal's.
NATIVE_ACL = [
    {"principal": "operator", "resource": "cluster", "actions": ["admin-read", "admin-write", "subscribe"]},
    {"principal": "alice", "resource": "topic:na", "actions": ["publish", "subscribe"]},
    {"principal": "alice", "resource": "producer_group:ga", "actions": ["check"]},
    {"principal": "alice", "resource": "consumer_group:ca", "actions": ["subscribe"]},
    {"principal": "bob", "resource": "topic:nb", "actions": ["publish", "subscribe"]},
    {"principal": "bob", "resource": "producer_group:gb", "actions": ["check"]},
    {"principal": "bob", "resource": "consumer_group:cb", "actions": ["subscribe"]},
    # reader: group cs on topic ta only; owner: group cs on ta and tb (tb's deliveries of cs
    # are owner's business, not reader's).
    {"principal": "reader", "resource": "consumer_group:cs", "actions": ["subscribe"]},
    {"principal": "reader", "resource": "topic:ta", "actions": ["subscribe"]},
    {"principal": "owner", "resource": "consumer_group:cs", "actions": ["subscribe"]},
    {"principal": "owner", "resource": "topic:ta", "actions": ["publish", "subscribe"]},
    {"principal": "owner", "resource": "topic:tb", "actions": ["publish", "subscribe"]},
]
#: RocketMQ principals (access keys): a producer's group is its topic.
RMQ_ACL = [
    {"principal": "rma", "resource": "topic:ra", "actions": ["publish"]},
    {"principal": "rma", "resource": "producer_group:ra", "actions": ["check"]},
    {"principal": "rmb", "resource": "topic:rb", "actions": ["publish"]},
    {"principal": "rmb", "resource": "producer_group:rb", "actions": ["check"]},
    {"principal": "rreader", "resource": "consumer_group:rcs", "actions": ["subscribe"]},
    {"principal": "rreader", "resource": "topic:ta", "actions": ["subscribe"]},
    {"principal": "rowner", "resource": "consumer_group:rcs", "actions": ["subscribe"]},
    {"principal": "rowner", "resource": "topic:ta", "actions": ["subscribe"]},
    {"principal": "rowner", "resource": "topic:tb", "actions": ["subscribe"]},
]
NATIVE_PRINCIPALS = ("operator", "alice", "bob", "reader", "owner")
RMQ_PRINCIPALS = ("rma", "rmb", "rreader", "rowner")
TOPICS = ("na", "nb", "ta", "tb", "ra", "rb")


def token_of(name: str) -> str:
    return f"census-token-{name}-0123456789abcdef"


def secret_of(name: str) -> str:
    return f"census-secret-{name}-0123456789"


def access_key_of(name: str) -> str:
    return f"AK-{name.upper()}"


def write_credentials(workdir: Path, extra_acl: Iterable[dict[str, Any]] = (),
                      extra_rmq: Iterable[str] = (), extra_native: Iterable[str] = ()) -> tuple[Path, Path]:
    """The credential file every service reads, and the access keys only the proxy reads;
    ``extra_rmq`` names more RocketMQ principals (an access key each), ``extra_native`` more
    native ones (a token each, ``token_of``), ``extra_acl`` their rules."""
    rmq = (*RMQ_PRINCIPALS, *extra_rmq)
    principals: dict[str, Any] = {name: {"service": True, "tokens": [hash_token(token_of(name))]}
                                  for name in SERVICES}
    principals.update({name: {"tokens": [hash_token(token_of(name))]}
                       for name in (*NATIVE_PRINCIPALS, *extra_native)})
    principals.update({name: {} for name in rmq})
    creds = workdir / "credentials.json"
    creds.write_text(json.dumps({"principals": principals, "acl": [*NATIVE_ACL, *RMQ_ACL, *extra_acl]}))
    keys = workdir / "access-keys.json"
    keys.write_text(json.dumps({"access_keys": {access_key_of(n): {"principal": n, "secret": secret_of(n)}
                                                for n in rmq}}))
    return creds, keys


def secured_cluster(workdir: Path, extra_acl: Iterable[dict[str, Any]] = (), extra_rmq: Iterable[str] = (),
                    auto_create_topics: bool = False, extra_native: Iterable[str] = (), **kwargs: Any) -> Cluster:
    """A cluster with auth on everywhere (name server, broker(s), checker, one proxy)."""
    workdir.mkdir(parents=True, exist_ok=True)
    creds, keys = write_credentials(workdir, extra_acl, extra_rmq, extra_native)
    env = {}
    for name in SERVICES:
        token_file = workdir / f"{name}.token"
        token_file.write_text(token_of(name) + "\n")
        env[name] = {"TXMQ_AUTH_FILES": str(creds), "TXMQ_AUTH_TOKEN_FILE": str(token_file)}
    env["proxy"]["TXMQ_AUTH_FILES"] += f",{keys}"
    broker_env = {"TXMQ_TRANSACTION_TIMEOUT_SECONDS": "600", "TXMQ_MAX_DELIVERY_ATTEMPTS": "8",
                  **env["broker"], **kwargs.pop("broker_env", {})}
    return Cluster(workdir, broker_env=broker_env, checker=True,
                   checker_env={**env["checker"], **kwargs.pop("checker_env", {})}, proxies=1,
                   proxy_env={"TXMQ_DIRECTORY_REFRESH_SECONDS": "0.5", "TXMQ_MIN_INVISIBLE_DURATION_SECONDS": "0.2",
                              **env["proxy"], **kwargs.pop("proxy_env", {})},
                   nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": str(auto_create_topics).lower(), **env["nameserver"],
                                   **kwargs.pop("nameserver_env", {})},
                   token=token_of("operator"), **kwargs)


def bearer(name: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token_of(name)}")]


def signed(name: str, client_id: str = "") -> list[tuple[str, str]]:
    """A RocketMQ client's signed request headers (MQv2-HMAC-SHA1) for ``name``'s key."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    signature = hmac.new(secret_of(name).encode(), stamp.encode(), hashlib.sha1).hexdigest()
    return [("authorization", f"MQv2-HMAC-SHA1 Credential={access_key_of(name)}, SignedHeaders=x-mq-date-time, "
                              f"Signature={signature}"),
            ("x-mq-date-time", stamp), ("x-mq-client-id", client_id or f"census-{name}")]


def non_utf8_handle(broker: str, store_id: int = 1) -> str:
    """A receipt handle with a valid checksum whose topic bytes are not UTF-8."""
    raw = base64.urlsafe_b64decode(ReceiptHandle(broker, store_id, "orders", 0, 0, 1).encode()[1:] + "==")[:-4]
    raw = raw.replace(b"orders", b"\xff\xfe\xfdder")
    raw += struct.pack(">I", zlib.crc32(raw))
    return "R" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# --------------------------------------------------------------------------------- the tally
@dataclasses.dataclass
class Attempt:
    name: str
    #: "unauthorized" (must be refused) or "malformed" (must not be INTERNAL/UNKNOWN).
    kind: str
    outcome: str = ""
    succeeded: bool = False


@dataclasses.dataclass
class Census:
    attempts: list[Attempt] = dataclasses.field(default_factory=list)

    def record(self, name: str, kind: str, outcome: str, succeeded: bool) -> None:
        self.attempts.append(Attempt(name, kind, outcome, succeeded))

    def of(self, kind: str) -> list[Attempt]:
        return [a for a in self.attempts if a.kind == kind]

    @property
    def successes(self) -> list[Attempt]:
        return [a for a in self.attempts if a.succeeded]

    def table(self) -> str:
        width = max([len(a.name) for a in self.attempts] + [10])
        lines = [f"{'attempt'.ljust(width)}  {'kind':<12}  result"]
        for a in self.attempts:
            lines.append(f"{a.name.ljust(width)}  {a.kind:<12}  {'SUCCEEDED ' if a.succeeded else ''}{a.outcome}")
        unauthorized, malformed = self.of("unauthorized"), self.of("malformed")
        lines.append(f"{len(unauthorized)} unauthorized attempts, {sum(a.succeeded for a in unauthorized)} succeeded; "
                     f"{len(malformed)} malformed requests, {sum(a.succeeded for a in malformed)} answered "
                     "INTERNAL/UNKNOWN")
        return "\n".join(lines)


FAILED_SERVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}
#: The same as entry codes (EntryStatus.code: the gRPC code numbers).
FAILED_ENTRY_CODES = {s.value[0] for s in FAILED_SERVER}
IN_BAND_INTERNAL = {50000, 50001}
RMQ_OK = 20000


def status_name(exc: grpc.RpcError) -> str:
    return f"{exc.code().name}: {(exc.details() or '')[:140]}"


class Native:
    """The native side of the census."""

    def __init__(self, cluster: Cluster, census: Census) -> None:
        self.cluster = cluster
        self.census = census
        self.broker_address = cluster.brokers[0].address if cluster.replication_factor == 1 else \
            cluster.wait_leaders()["broker-0"].address
        self.broker = broker_pb2_grpc.BrokerServiceStub(cluster.channel(self.broker_address))
        self.admin = admin_pb2_grpc.AdminServiceStub(cluster.channel())
        self._raw: dict[str, grpc.Channel] = {}

    def raw(self, address: str) -> grpc.Channel:
        """A channel without the operator's token (each call names its principal)."""
        if address not in self._raw:
            if self.cluster.ca is not None and self.cluster.client_certificate is not None:
                from tests.support.certs import channel_credentials
                self._raw[address] = grpc.secure_channel(
                    address, channel_credentials(self.cluster.ca.cert_file, self.cluster.client_certificate))
            else:
                self._raw[address] = grpc.insecure_channel(address)
        return self._raw[address]

    def close(self) -> None:
        for channel in self._raw.values():
            channel.close()

    def stub(self, who: str) -> Any:
        return _Named(broker_pb2_grpc.BrokerServiceStub(self.raw(self.broker_address)), bearer(who))

    # --- set-up: resources of A and of B ------------------------------------------------------
    def create_topics(self) -> None:
        for topic in TOPICS:
            self.cluster.create_topic(topic, queue_count=1)

    def half(self, who: str, topic: str, group: str, **message: Any) -> broker_pb2.SendMessageResponse:
        return self.stub(who).SendMessage(broker_pb2.SendMessageRequest(message=C.Message(
            topic=topic, body=b"census", type=C.MESSAGE_TYPE_TRANSACTION, producer_group=group,
            producer_client_id=f"census-{who}", **message)), timeout=RPC_TIMEOUT)

    def normal(self, who: str, topic: str) -> broker_pb2.SendMessageResponse:
        return self.stub(who).SendMessage(broker_pb2.SendMessageRequest(message=C.Message(
            topic=topic, body=b"census", type=C.MESSAGE_TYPE_NORMAL)), timeout=RPC_TIMEOUT)

    def receive(self, who: str, group: str, topic: str, n: int = 1) -> list[C.DeliveredMessage]:
        got: list[C.DeliveredMessage] = []

        def more() -> bool:
            got.extend(self.stub(who).ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
                consumer_group=group, topic=topic, queue_id=-1, max_messages=n - len(got),
                invisible_duration_seconds=600, long_polling_timeout_seconds=1.0), timeout=RPC_TIMEOUT).messages)
            return len(got) >= n
        wait_until(more, 30, message=f"{who} did not receive {n} from {topic} as {group}")
        return got

    def state_of(self, transaction_id: str) -> int:
        return self.admin.DescribeTransaction(admin_pb2.DescribeTransactionRequest(
            transaction_id=transaction_id), timeout=RPC_TIMEOUT).transaction.state

    def seed(self) -> dict[str, Any]:
        """A's and B's transactions and deliveries (A: alice, reader; B: bob, owner)."""
        s: dict[str, Any] = {}
        s["alice_txn"] = self.half("alice", "na", "ga").transaction_id
        bob = self.half("bob", "nb", "gb")
        s["bob_txn"], s["bob_half_message_id"] = bob.transaction_id, bob.message_id
        s["bob_txn_2"] = self.half("bob", "nb", "gb").transaction_id
        s["bob_global"] = self.stub("bob").SendMessage(broker_pb2.SendMessageRequest(
            message=C.Message(topic="nb", body=b"g", type=C.MESSAGE_TYPE_TRANSACTION, producer_group="gb",
                              producer_client_id="census-bob"), begin_global=True), timeout=RPC_TIMEOUT).transaction_id
        for _ in range(6):
            self.normal("owner", "tb")
        for _ in range(2):
            self.normal("owner", "ta")
        s["bob_normal_message_id"] = self.normal("bob", "nb").message_id
        s["owner_tb"] = self.receive("owner", "cs", "tb", 6)   # cs's deliveries of tb: owner's, not reader's
        s["reader_ta"] = self.receive("reader", "cs", "ta", 1)[0]
        s["bob_cb"] = self.receive("bob", "cb", "nb", 1)[0]
        return s

    # --- the attempts --------------------------------------------------------------------------
    def attempt(self, name: str, call: Callable[[], Any], entries: Callable[[Any], Iterable[int]] | None = None,
                kind: str = "unauthorized") -> None:
        """Runs ``call``: refused when it raises (an unauthorized attempt: a refusal, not a
        failure of the server) or every entry it answers has a non-OK code."""
        try:
            response = call()
        except grpc.RpcError as exc:
            failed = exc.code() in FAILED_SERVER
            self.census.record(name, kind, status_name(exc), failed)
            return
        codes = list(entries(response)) if entries is not None else []
        server_failed = [c for c in codes if c in FAILED_ENTRY_CODES]
        if server_failed:
            self.census.record(name, kind, f"entry answered {codes}", True)
        elif entries is not None and codes and all(c != 0 for c in codes):
            self.census.record(name, kind, f"refused per entry: {codes}", False)
        elif kind == "malformed":
            self.census.record(name, kind, f"answered {codes or 'OK'}", False)
        else:
            self.census.record(name, kind, f"OK {codes}", True)

    def run(self, s: dict[str, Any]) -> None:
        broker = self.cluster.brokers[0].name
        alice_tid = TransactionId.decode(s["alice_txn"])
        bob_tid = TransactionId.decode(s["bob_txn"])
        forged_txns = {
            "its own tag on B's sequence": TransactionId(broker, alice_tid.store_id, bob_tid.sequence, alice_tid.tag),
            "B's sequence, untagged": TransactionId(broker, alice_tid.store_id, bob_tid.sequence),
            "its own sequence + 1, untagged": TransactionId(broker, alice_tid.store_id, alice_tid.sequence + 1),
        }
        txn_ids = {"captured": s["bob_txn"], **{f"forged ({k})": v.encode() for k, v in forged_txns.items()}}

        def end(transaction_id: str, group: str, source: int = C.TRANSACTION_SOURCE_CLIENT,
                resolution: int = C.TRANSACTION_RESOLUTION_COMMIT) -> broker_pb2.EndTransactionRequest:
            return broker_pb2.EndTransactionRequest(transaction_id=transaction_id, producer_group=group,
                                                    resolution=resolution, source=source)

        alice = self.stub("alice")
        for label, tid in txn_ids.items():
            for group in ("ga", "gb", ""):
                for source, resolution in ((C.TRANSACTION_SOURCE_CLIENT, C.TRANSACTION_RESOLUTION_COMMIT),
                                           (C.TRANSACTION_SOURCE_CHECK, C.TRANSACTION_RESOLUTION_ROLLBACK)):
                    how = "client" if source == C.TRANSACTION_SOURCE_CLIENT else "check"
                    self.attempt(f"EndTransaction {label} id naming {group or 'no group'!s} ({how})",
                                 lambda t=tid, g=group, so=source, r=resolution: alice.EndTransaction(
                                     end(t, g, so, r), timeout=RPC_TIMEOUT))
            self.attempt(f"Produce end_transaction {label} id naming ga",
                         lambda t=tid: list(alice.Produce(iter([broker_pb2.ProduceRequest(entries=[
                             broker_pb2.ProduceEntry(request_id=1, end_transaction=end(t, "ga"))])]),
                             timeout=RPC_TIMEOUT)),
                         entries=lambda responses: [r.status.code for m in responses for r in m.results])
        # Claiming to act for B (only service identities act for others).
        raw = broker_pb2_grpc.BrokerServiceStub(self.raw(self.broker_address))
        self.attempt("EndTransaction of B's acting for B (x-txmq-on-behalf-of from a non-service)",
                     lambda: raw.EndTransaction(end(s["bob_txn"], "gb"), timeout=RPC_TIMEOUT,
                                                metadata=bearer("alice") + [("x-txmq-on-behalf-of", "bob")]))
        # Its own transaction, named as another group's.
        self.attempt("EndTransaction own id naming gb", lambda: alice.EndTransaction(
            end(s["alice_txn"], "gb"), timeout=RPC_TIMEOUT))
        # A further part of B's global transaction, sent as A's group.
        for label, gid in (("captured", s["bob_global"]), ("forged", forged_txns["its own tag on B's sequence"].encode())):
            self.attempt(f"SendMessage part of B's global transaction ({label}) as ga",
                         lambda g=gid: alice.SendMessage(broker_pb2.SendMessageRequest(message=C.Message(
                             topic="na", body=b"x", type=C.MESSAGE_TYPE_TRANSACTION, producer_group="ga",
                             producer_client_id="census-alice"), global_transaction_id=g), timeout=RPC_TIMEOUT))
        # B's message ids sent again as A's: the repeat must not tell A what B's send stored.
        self.attempt("SendMessage half as ga with B's message id (a duplicate of B's transaction)",
                     lambda: self.half("alice", "na", "ga", message_id=s["bob_half_message_id"]))
        self.attempt("SendMessage to na with B's normal message id", lambda: alice.SendMessage(
            broker_pb2.SendMessageRequest(message=C.Message(topic="na", body=b"x", type=C.MESSAGE_TYPE_NORMAL,
                                                            message_id=s["bob_normal_message_id"])),
            timeout=RPC_TIMEOUT))
        # Reading or resolving B's transaction.
        self.attempt("GetTransaction of B's", lambda: alice.GetTransaction(broker_pb2.GetTransactionRequest(
            transaction_id=s["bob_txn"]), timeout=RPC_TIMEOUT))
        self.attempt("QueryTransactions of gb", lambda: alice.QueryTransactions(broker_pb2.QueryTransactionsRequest(
            producer_group="gb"), timeout=RPC_TIMEOUT))
        self.attempt("QueryTransactions, B's id as page token", lambda: alice.QueryTransactions(
            broker_pb2.QueryTransactionsRequest(producer_group="", page_token=s["bob_txn"]), timeout=RPC_TIMEOUT))
        admin = _Named(admin_pb2_grpc.AdminServiceStub(self.raw(self.cluster.nameserver_address)), bearer("alice"))
        self.attempt("Admin DescribeTransaction of B's", lambda: admin.DescribeTransaction(
            admin_pb2.DescribeTransactionRequest(transaction_id=s["bob_txn"]), timeout=RPC_TIMEOUT))
        self.attempt("Admin ResolveTransaction of B's", lambda: admin.ResolveTransaction(
            admin_pb2.ResolveTransactionRequest(transaction_id=s["bob_txn"], operator="alice", reason="census",
                                                resolution=C.TRANSACTION_RESOLUTION_COMMIT), timeout=RPC_TIMEOUT))
        self.attempt("ReportChecks answering B's", lambda: alice.ReportChecks(broker_pb2.ReportChecksRequest(
            reports=[broker_pb2.CheckReport(transaction_id=s["bob_txn"], outcome=broker_pb2.CHECK_OUTCOME_ANSWERED,
                                            result=C.CHECK_RESULT_COMMIT, producer_group="gb")]), timeout=RPC_TIMEOUT))
        self.attempt("ApplyGlobalTransaction deciding B's", lambda: alice.ApplyGlobalTransaction(
            broker_pb2.ApplyGlobalTransactionRequest(global_transaction_id=s["bob_global"],
                                                     state=C.TRANSACTION_STATE_COMMITTED), timeout=RPC_TIMEOUT))
        self._check_stream(s, broker)
        self._receipts(s)

    def _check_stream(self, s: dict[str, Any], broker: str) -> None:
        """A producer of ga answering, on its check stream, a transaction of gb."""
        checker = _Named(checker_pb2_grpc.CheckerServiceStub(self.raw(self.cluster.checkers[0].address)),
                         bearer("alice"))
        R = checker_pb2.CheckTransactionStateRequest
        for label, group in (("naming ga", "ga"), ("naming gb", "gb")):
            def answer(g: str = group) -> Any:
                requests = [R(subscribe=checker_pb2.Subscribe(producer_groups=["ga"], client_id="census-alice",
                                                              check_credit=1)),
                            R(answer=checker_pb2.CheckAnswer(check_id="census", result=C.CHECK_RESULT_COMMIT,
                                                             transaction_id=s["bob_txn_2"], broker_name=broker,
                                                             producer_group=g))]
                responses = []
                call = checker.CheckTransactionState(_then_wait(requests, 3.0), timeout=4.0)
                try:
                    for r in call:
                        responses.append(r)
                        if r.WhichOneof("command") == "error":
                            call.cancel()
                except grpc.RpcError as exc:
                    if exc.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise
                errors = [r.error for r in responses if r.WhichOneof("command") == "error"]
                if errors:
                    raise _Refused(errors[0].reason)
                if self.state_of(s["bob_txn_2"]) == C.TRANSACTION_STATE_PREPARED:
                    raise _Refused("no effect (no error came back within the stream's time)")
                return responses
            self.attempt(f"CheckTransactionState answer for B's transaction {label}", lambda a=answer: _refusal(a))

    def _receipts(self, s: dict[str, Any]) -> None:
        reader = self.stub("reader")
        tb_handles = [m.receipt_handle for m in s["owner_tb"]]
        own = ReceiptHandle.decode(s["reader_ta"].receipt_handle)
        forged = {
            "its own handle re-pointed at tb": dataclasses.replace(own, topic="tb").encode(),
            "its own handle, next offset": dataclasses.replace(own, offset=own.offset + 1).encode(),
            "untagged tb handle": dataclasses.replace(ReceiptHandle.decode(tb_handles[0]), tag=b"").encode(),
            "another group's (cb) handle": s["bob_cb"].receipt_handle,
        }

        def per_entry(r):
            return [e.code for e in r.entries]

        def acks(r):
            return [e.code for e in r.ack_entries]

        cases = [(f"captured tb handle naming {t or 'no topic'}", tb_handles[i], t)
                 for i, t in enumerate(("ta", "", "tb"))]
        cases += [(f"forged ({k}) naming ta", v, "ta") for k, v in forged.items()]
        for label, handle, topic in cases:
            self.attempt(f"AckMessages {label}", lambda h=handle, t=topic: reader.AckMessages(
                broker_pb2.AckMessagesRequest(consumer_group="cs", topic=t, receipt_handles=[h]),
                timeout=RPC_TIMEOUT), entries=per_entry)
            self.attempt(f"ReceiveMessages acking {label}", lambda h=handle, t=topic: reader.ReceiveMessages(
                broker_pb2.ReceiveMessagesRequest(consumer_group="cs", topic=t or "ta", queue_id=-1, max_messages=1,
                                                  invisible_duration_seconds=1, ack_receipt_handles=[h]),
                timeout=RPC_TIMEOUT), entries=acks)
            self.attempt(f"ChangeInvisibleDuration {label}", lambda h=handle, t=topic: reader.ChangeInvisibleDuration(
                broker_pb2.ChangeInvisibleDurationRequest(consumer_group="cs", topic=t, receipt_handle=h,
                                                          invisible_duration_seconds=0), timeout=RPC_TIMEOUT))
            self.attempt(f"DeadLetterMessage {label}", lambda h=handle, t=topic: reader.DeadLetterMessage(
                broker_pb2.DeadLetterMessageRequest(consumer_group="cs", topic=t, receipt_handle=h),
                timeout=RPC_TIMEOUT))
        bad = non_utf8_handle(self.cluster.brokers[0].name)
        self.attempt("AckMessages non-UTF-8 handle", lambda: reader.AckMessages(broker_pb2.AckMessagesRequest(
            consumer_group="cs", topic="ta", receipt_handles=[bad]), timeout=RPC_TIMEOUT), entries=per_entry,
            kind="malformed")
        self.attempt("ReceiveMessages acking a non-UTF-8 handle", lambda: reader.ReceiveMessages(
            broker_pb2.ReceiveMessagesRequest(consumer_group="cs", topic="ta", queue_id=-1, max_messages=1,
                                              invisible_duration_seconds=1, ack_receipt_handles=[bad]),
            timeout=RPC_TIMEOUT), entries=acks, kind="malformed")
        self.attempt("ChangeInvisibleDuration non-UTF-8 handle", lambda: reader.ChangeInvisibleDuration(
            broker_pb2.ChangeInvisibleDurationRequest(consumer_group="cs", topic="ta", receipt_handle=bad,
                                                      invisible_duration_seconds=1), timeout=RPC_TIMEOUT),
            kind="malformed")
        self.attempt("DeadLetterMessage non-UTF-8 handle", lambda: reader.DeadLetterMessage(
            broker_pb2.DeadLetterMessageRequest(consumer_group="cs", topic="ta", receipt_handle=bad),
            timeout=RPC_TIMEOUT), kind="malformed")

    # --- afterwards ------------------------------------------------------------------------------
    def unchanged(self, s: dict[str, Any]) -> list[str]:
        """What the attempts changed of B's resources (empty: nothing)."""
        changed = []
        for key in ("bob_txn", "bob_txn_2", "bob_global"):
            if self.state_of(s[key]) != C.TRANSACTION_STATE_PREPARED:
                changed.append(f"{key} is {C.TransactionState.Name(self.state_of(s[key]))}")
        # owner's deliveries on tb: each still its delivery, still invisible (nobody else's
        # call settled, dead-lettered or re-timed it): none is delivered again, and owner
        # acknowledges every one.
        owner = self.stub("owner")
        again = owner.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
            consumer_group="cs", topic="tb", queue_id=-1, max_messages=16, invisible_duration_seconds=600),
            timeout=RPC_TIMEOUT).messages
        seeded = {m.queue_offset for m in s["owner_tb"]}
        changed += [f"owner's tb delivery at offset {m.queue_offset} was made visible again"
                    for m in again if m.queue_offset in seeded]
        entries = owner.AckMessages(broker_pb2.AckMessagesRequest(
            consumer_group="cs", topic="tb", receipt_handles=[m.receipt_handle for m in s["owner_tb"]]),
            timeout=RPC_TIMEOUT).entries
        changed += [f"owner's tb delivery {i}: {e.reason} {e.message}" for i, e in enumerate(entries) if e.code]
        return changed


class _Refused(Exception):
    """A refusal answered on a stream (an ``error`` message) rather than as a status."""


def _refusal(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except _Refused as refused:
        raise _InBand(grpc.StatusCode.PERMISSION_DENIED if "PERMISSION" in str(refused)
                      else grpc.StatusCode.INVALID_ARGUMENT, f"refused on the stream: {refused}") from None


class _InBand(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _then_wait(requests: list[Any], seconds: float) -> Iterator[Any]:
    """The requests, then the stream kept open (so answers can come back) for ``seconds``."""
    import time
    yield from requests
    time.sleep(seconds)


class _Named:
    """A stub whose every call carries ``metadata`` (a principal's credentials)."""

    def __init__(self, stub: Any, metadata: list[tuple[str, str]]) -> None:
        self._stub = stub
        self._metadata = metadata

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)
        return lambda request, **kw: method(request, metadata=self._metadata, **kw)


# ------------------------------------------------------------------------------------ the proxy
class Proxy:
    """The RocketMQ-protocol side: signed requests of RocketMQ principals through the proxy."""

    def __init__(self, cluster: Cluster, native: Native, census: Census) -> None:
        from services.proxy.protocol import service_pb2_grpc

        self.cluster = cluster
        self.native = native
        self.census = census
        self.address = cluster.proxy_addresses[0]
        self.stub = service_pb2_grpc.MessagingServiceStub(native.raw(self.address))

    def send_half(self, who: str, topic: str, message_id: str = "", expect_ok: bool = True) -> Any:
        from services.proxy.protocol import definition_pb2 as pb, service_pb2 as spb

        m = pb.Message(topic=pb.Resource(name=topic), body=b"census")
        m.system_properties.message_id = message_id or uuid.uuid4().hex.upper()
        m.system_properties.message_type = pb.TRANSACTION
        m.system_properties.body_encoding = pb.IDENTITY
        response = self.stub.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=RPC_TIMEOUT,
                                         metadata=signed(who))
        if not expect_ok:
            return response
        assert response.status.code == RMQ_OK, response.status
        return response.entries[0]

    def receive(self, who: str, group: str, topic: str, n: int) -> list[Any]:
        from services.proxy.protocol import definition_pb2 as pb, service_pb2 as spb

        got: list[Any] = []

        def more() -> bool:
            request = spb.ReceiveMessageRequest(
                group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=n - len(got),
                long_polling_timeout=duration_pb2.Duration(seconds=1))
            request.invisible_duration.FromSeconds(600)
            frames = list(self.stub.ReceiveMessage(request, timeout=RPC_TIMEOUT, metadata=signed(who)))
            got.extend(f.message for f in frames if f.HasField("message"))
            return len(got) >= n
        wait_until(more, 30, message=f"{who} did not receive {n} from {topic} through the proxy")
        return got

    def seed(self) -> dict[str, Any]:
        s: dict[str, Any] = {}
        s["rma_txn"] = self.send_half("rma", "ra").transaction_id
        rmb = self.send_half("rmb", "rb")
        s["rmb_txn"], s["rmb_message_id"] = rmb.transaction_id, rmb.message_id
        s["rmb_txn_2"] = self.send_half("rmb", "rb").transaction_id
        s["native_gb_txn"] = self.native.half("bob", "nb", "gb").transaction_id
        for _ in range(8):
            self.native.normal("owner", "tb")
        self.native.normal("owner", "ta")
        s["rowner_tb"] = self.receive("rowner", "rcs", "tb", 8)
        s["rreader_ta"] = self.receive("rreader", "rcs", "ta", 1)[0]
        return s

    def attempt(self, name: str, call: Callable[[], Any], kind: str = "unauthorized") -> None:
        try:
            response = call()
        except grpc.RpcError as exc:
            self.census.record(name, kind, status_name(exc), exc.code() in FAILED_SERVER)
            return
        frames = response if isinstance(response, list) else [response]
        codes = [f.status.code for f in frames if f.HasField("status")]
        worst = next((c for c in codes if c != RMQ_OK), RMQ_OK)
        if kind == "malformed":
            self.census.record(name, kind, f"in band {worst}", worst in IN_BAND_INTERNAL or not codes)
        else:
            self.census.record(name, kind, f"in band {worst}", worst == RMQ_OK)

    def run(self, s: dict[str, Any]) -> None:
        from services.proxy.protocol import definition_pb2 as pb, service_pb2 as spb

        broker = self.cluster.brokers[0].name
        own = TransactionId.decode(s["rma_txn"])
        theirs = TransactionId.decode(s["rmb_txn"])
        ids = {"captured (rb's)": s["rmb_txn"], "captured (native gb's)": s["native_gb_txn"],
               "forged (own tag on rb's sequence)": TransactionId(broker, own.store_id, theirs.sequence,
                                                                  own.tag).encode(),
               "forged (own sequence + 1)": TransactionId(broker, own.store_id, own.sequence + 1).encode()}
        for label, tid in ids.items():
            for topic in ("ra", "rb"):
                for source, resolution in ((pb.SOURCE_CLIENT, pb.COMMIT), (pb.SOURCE_SERVER_CHECK, pb.ROLLBACK)):
                    how = "client" if source == pb.SOURCE_CLIENT else "server check"
                    self.attempt(f"rmq EndTransaction {label} id naming topic {topic} ({how})",
                                 lambda t=tid, tp=topic, so=source, r=resolution: self.stub.EndTransaction(
                                     spb.EndTransactionRequest(topic=pb.Resource(name=tp), transaction_id=t,
                                                               resolution=r, source=so),
                                     timeout=RPC_TIMEOUT, metadata=signed("rma")))
        self.attempt("rmq EndTransaction of rb's acting for rmb (x-txmq-on-behalf-of from a client)",
                     lambda: self.stub.EndTransaction(spb.EndTransactionRequest(
                         topic=pb.Resource(name="rb"), transaction_id=s["rmb_txn"], resolution=pb.COMMIT,
                         source=pb.SOURCE_CLIENT), timeout=RPC_TIMEOUT,
                         metadata=signed("rma") + [("x-txmq-on-behalf-of", "rmb")]))
        self.attempt("rmq SendMessage half to ra with rb's message id", lambda: self.send_half(
            "rma", "ra", message_id=s["rmb_message_id"], expect_ok=False))
        self.attempt("rmq EndTransaction own id naming topic rb", lambda: self.stub.EndTransaction(
            spb.EndTransactionRequest(topic=pb.Resource(name="rb"), transaction_id=s["rma_txn"], resolution=pb.COMMIT,
                                      source=pb.SOURCE_CLIENT), timeout=RPC_TIMEOUT, metadata=signed("rma")))
        handles = [m.system_properties.receipt_handle for m in s["rowner_tb"]]
        mine = ReceiptHandle.decode(s["rreader_ta"].system_properties.receipt_handle)
        cases = [(f"captured tb handle naming {t}", handles[i], t) for i, t in enumerate(("ta", "tb"))]
        cases += [("forged (own handle re-pointed at tb) naming ta", dataclasses.replace(mine, topic="tb").encode(), "ta"),
                  ("forged (untagged tb handle) naming ta",
                   dataclasses.replace(ReceiptHandle.decode(handles[2]), tag=b"").encode(), "ta")]
        for label, handle, topic in cases:
            self.attempt(f"rmq ChangeInvisibleDuration {label}", lambda h=handle, t=topic: self.stub.ChangeInvisibleDuration(
                spb.ChangeInvisibleDurationRequest(group=pb.Resource(name="rcs"), topic=pb.Resource(name=t),
                                                   receipt_handle=h, invisible_duration=duration_pb2.Duration(seconds=1),
                                                   message_id="census"), timeout=RPC_TIMEOUT, metadata=signed("rreader")))
            self.attempt(f"rmq AckMessage {label}", lambda h=handle, t=topic: self.stub.AckMessage(
                spb.AckMessageRequest(group=pb.Resource(name="rcs"), topic=pb.Resource(name=t), entries=[
                    spb.AckMessageEntry(message_id="census", receipt_handle=h)]),
                timeout=RPC_TIMEOUT, metadata=signed("rreader")))
            self.attempt(f"rmq ForwardMessageToDeadLetterQueue {label}", lambda h=handle, t=topic:
                         self.stub.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
                             group=pb.Resource(name="rcs"), topic=pb.Resource(name=t), receipt_handle=h,
                             message_id="census", delivery_attempt=1, max_delivery_attempts=16),
                             timeout=RPC_TIMEOUT, metadata=signed("rreader")))
        bad = non_utf8_handle(broker)
        self.attempt("rmq ChangeInvisibleDuration non-UTF-8 handle", lambda: self.stub.ChangeInvisibleDuration(
            spb.ChangeInvisibleDurationRequest(group=pb.Resource(name="rcs"), topic=pb.Resource(name="ta"),
                                               receipt_handle=bad, invisible_duration=duration_pb2.Duration(seconds=1)),
            timeout=RPC_TIMEOUT, metadata=signed("rreader")), kind="malformed")
        self.attempt("rmq AckMessage non-UTF-8 handle", lambda: self.stub.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name="rcs"), topic=pb.Resource(name="ta"), entries=[spb.AckMessageEntry(
                message_id="x", receipt_handle=bad)]), timeout=RPC_TIMEOUT, metadata=signed("rreader")), kind="malformed")
        self.attempt("rmq ForwardMessageToDeadLetterQueue non-UTF-8 handle", lambda:
                     self.stub.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
                         group=pb.Resource(name="rcs"), topic=pb.Resource(name="ta"), receipt_handle=bad,
                         message_id="x", delivery_attempt=1, max_delivery_attempts=16),
                         timeout=RPC_TIMEOUT, metadata=signed("rreader")), kind="malformed")
        self.attempt("rmq EndTransaction non-UTF-8 transaction id", lambda: self.stub.EndTransaction(
            spb.EndTransactionRequest(topic=pb.Resource(name="ra"), transaction_id=bad.replace("R", "T", 1),
                                      resolution=pb.COMMIT, source=pb.SOURCE_CLIENT),
            timeout=RPC_TIMEOUT, metadata=signed("rma")), kind="malformed")

    def unchanged(self, s: dict[str, Any]) -> list[str]:
        from services.proxy.protocol import definition_pb2 as pb, service_pb2 as spb

        changed = []
        for key in ("rmb_txn", "rmb_txn_2", "native_gb_txn"):
            state = self.native.state_of(s[key])
            if state != C.TRANSACTION_STATE_PREPARED:
                changed.append(f"{key} is {C.TransactionState.Name(state)}")
        response = self.stub.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name="rcs"), topic=pb.Resource(name="tb"), entries=[
                spb.AckMessageEntry(message_id=m.system_properties.message_id,
                                    receipt_handle=m.system_properties.receipt_handle) for m in s["rowner_tb"]]),
            timeout=RPC_TIMEOUT, metadata=signed("rowner"))
        changed += [f"rowner's tb delivery {i}: {e.status.code} {e.status.message}"
                    for i, e in enumerate(response.entries) if e.status.code != RMQ_OK]
        return changed


def run_cluster_census(cluster: Cluster, census: Census, proxy: bool = True) -> list[str]:
    """Seeds, attempts, reads back; returns what changed of B's resources."""
    native = Native(cluster, census)
    try:
        native.create_topics()
        seeds = native.seed()
        rmq = Proxy(cluster, native, census) if proxy else None
        rmq_seeds = rmq.seed() if rmq is not None else {}
        native.run(seeds)
        if rmq is not None:
            rmq.run(rmq_seeds)
        changed = native.unchanged(seeds)
        if rmq is not None:
            changed += rmq.unchanged(rmq_seeds)
        return changed
    finally:
        native.close()


# ------------------------------------------------------------------------------------ etcd
def etcd_census(workdir: Path, census: Census) -> list[str]:
    """etcd with mutual TLS and its authentication on, as the clusters run it: a broker's
    certificate reads and writes txmq's keys; an application's certificate from the same CA,
    the broker's certificate outside txmq's prefix and a client without a certificate are
    refused. Then the password mode (a plaintext etcd): no credentials, a wrong password and
    a non-broker user are refused. Returns what the controls could not do (empty: all)."""
    from aetcd import rpc

    from tests.support.certs import CertificateAuthority
    from tests.support.etcd import EtcdAuth, EtcdProcess, TlsFiles, password_auth

    problems: list[str] = []
    ca = CertificateAuthority(workdir / "pki")
    server, admin, broker, app = (ca.issue(n) for n in ("etcd", "etcd-admin", "txmq-broker-0", "orders-app"))
    auth = EtcdAuth(("txmq-broker-0",), admin_user="etcd-admin")
    etcd = EtcdProcess(workdir / "mtls", cert_file=server.cert_file, key_file=server.key_file, ca_file=ca.cert_file,
                       auth=auth, admin_tls=TlsFiles(ca.cert_file, admin.cert_file, admin.key_file))
    etcd.start()
    try:
        address = etcd.endpoint.removeprefix("https://")

        def channel(cert: Any) -> grpc.Channel:
            from tests.support.certs import channel_credentials
            return grpc.secure_channel(address, channel_credentials(ca.cert_file, cert))

        key = b"/txmq/shards/broker-0/leader"
        attempts: list[tuple[str, Any, Callable[[Any], Any]]] = [
            ("etcd Put of a shard's leader key with an application's certificate", app,
             lambda kv: kv.Put(rpc.PutRequest(key=key, value=b'{"replica": 9}'), timeout=5)),
            ("etcd Range of txmq's keys with an application's certificate", app,
             lambda kv: kv.Range(rpc.RangeRequest(key=b"/txmq/", range_end=b"/txmq0"), timeout=5)),
            ("etcd DeleteRange of txmq's keys with an application's certificate", app,
             lambda kv: kv.DeleteRange(rpc.DeleteRangeRequest(key=b"/txmq/", range_end=b"/txmq0"), timeout=5)),
            ("etcd Txn writing the in-sync set with an application's certificate", app,
             lambda kv: kv.Txn(rpc.TxnRequest(success=[rpc.RequestOp(request_put=rpc.PutRequest(
                 key=b"/txmq/shards/broker-0/isr", value=b"{}"))]), timeout=5)),
            ("etcd Put outside txmq's prefix with a broker's certificate", broker,
             lambda kv: kv.Put(rpc.PutRequest(key=b"/elsewhere", value=b"x"), timeout=5)),
            ("etcd Put with no client certificate", None,
             lambda kv: kv.Put(rpc.PutRequest(key=key, value=b"x"), timeout=5)),
            ("etcd user add with an application's certificate", app,
             lambda kv: rpc.AuthStub(kv.channel).UserAdd(rpc.AuthUserAddRequest(
                 name="mallory", options=rpc.UserAddOptions(no_password=True)), timeout=5)),
            ("etcd auth disable with a broker's certificate", broker,
             lambda kv: rpc.AuthStub(kv.channel).AuthDisable(rpc.AuthDisableRequest(), timeout=5)),
        ]
        for name, cert, call in attempts:
            with channel(cert) as ch:
                _etcd_attempt(census, name, lambda c=call, ch=ch: c(_KV(ch)))
        with channel(broker) as ch:  # the control: the broker's certificate does its work
            try:
                kv = rpc.KVStub(ch)
                kv.Put(rpc.PutRequest(key=key, value=b'{"replica": 0}'), timeout=5)
                found = kv.Range(rpc.RangeRequest(key=key), timeout=5).kvs
                if [k.value for k in found] != [b'{"replica": 0}']:
                    problems.append(f"the broker's certificate read back {found}")
            except grpc.RpcError as exc:
                problems.append(f"the broker's certificate was refused: {status_name(exc)}")
    finally:
        etcd.stop()

    auth = password_auth(workdir / "password-auth")
    etcd = EtcdProcess(workdir / "password", auth=auth).start()
    try:
        with grpc.insecure_channel(etcd.endpoint) as ch:
            kv, stub = rpc.KVStub(ch), rpc.AuthStub(ch)
            _etcd_attempt(census, "etcd Put without credentials (password mode)",
                          lambda: kv.Put(rpc.PutRequest(key=b"/txmq/shards/broker-0/leader", value=b"x"), timeout=5))
            _etcd_attempt(census, "etcd Authenticate as the brokers' user with a wrong password",
                          lambda: stub.Authenticate(rpc.AuthenticateRequest(name=auth.broker_users[0],
                                                                            password="guessed"), timeout=5))
            _etcd_attempt(census, "etcd Authenticate as root without root's password",
                          lambda: stub.Authenticate(rpc.AuthenticateRequest(name="root", password="root"), timeout=5))
            token = stub.Authenticate(rpc.AuthenticateRequest(name=auth.broker_users[0], password=auth.broker_password),
                                      timeout=5).token
            _etcd_attempt(census, "etcd Put outside txmq's prefix as the brokers' user (password mode)",
                          lambda: kv.Put(rpc.PutRequest(key=b"/elsewhere", value=b"x"), timeout=5,
                                         metadata=[("token", token)]))
            try:
                kv.Put(rpc.PutRequest(key=b"/txmq/shards/broker-0/leader", value=b"x"), timeout=5,
                       metadata=[("token", token)])
            except grpc.RpcError as exc:
                problems.append(f"the brokers' password user was refused: {status_name(exc)}")
    finally:
        etcd.stop()
    return problems


class _KV:
    """aetcd's KV stub that also keeps its channel (for the Auth stub)."""

    def __init__(self, channel: grpc.Channel) -> None:
        from aetcd import rpc
        self.channel = channel
        self._kv = rpc.KVStub(channel)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)


def _etcd_attempt(census: Census, name: str, call: Callable[[], Any]) -> None:
    try:
        call()
    except grpc.RpcError as exc:
        census.record(name, "unauthorized", status_name(exc), False)
        return
    census.record(name, "unauthorized", "OK", True)


# ------------------------------------------------------------------------------------ the chart
def chart_defaults(helm_bin: Path) -> list[str]:
    """What a default ``helm template`` of the chart leaves open (empty: nothing): auth on in
    every service, TLS on, the proxy requiring signed RocketMQ requests, a NetworkPolicy per
    component (one admitting every pod only where auth guards the port), every Secret a pod
    mounts made by the render itself (or by its cert-manager Certificates) so a default
    install starts, and the bundled etcd's authentication set up."""
    from tests.chart.chart import COMPONENTS, render

    problems: list[str] = []
    r = render(helm_bin, [])
    made = {d["metadata"]["name"] for d in r.docs if d["kind"] == "Secret"}
    made |= {d["spec"]["secretName"] for d in r.docs if d["kind"] == "Certificate"}
    auth_on: dict[str, bool] = {}
    for w in r.docs:
        if w["kind"] not in ("StatefulSet", "Deployment"):
            continue
        component = w["metadata"]["labels"].get("app.kubernetes.io/component", "")
        spec = w["spec"]["template"]["spec"]
        for volume in spec.get("volumes", []):
            name = volume.get("secret", {}).get("secretName")
            if name and name not in made:
                problems.append(f"{component}: mounts Secret {name!r}, which a default install does not make")
        if component not in COMPONENTS:
            continue
        container = spec["containers"][0]
        env = {**r.configmap_env(w, container), **{e["name"]: e.get("value", "") for e in container.get("env", [])
                                                  if "value" in e}}
        auth_on[component] = bool(env.get("TXMQ_AUTH_FILES"))
        if not auth_on[component]:
            problems.append(f"{component}: auth off (TXMQ_AUTH_FILES empty)")
        if not env.get("TXMQ_TLS_CERT_FILE"):
            problems.append(f"{component}: TLS off")
        if component == "proxy" and "access-keys" not in env.get("TXMQ_AUTH_FILES", ""):
            problems.append("proxy: no RocketMQ access keys: clients are not required to sign")
    policies = {p["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component"): p
                for p in r.docs if p["kind"] == "NetworkPolicy"}
    for component in auth_on:
        policy = policies.get(component)
        if policy is None:
            problems.append(f"{component}: no NetworkPolicy")
            continue
        for rule in policy["spec"].get("ingress", []):
            if not rule.get("from") and not auth_on[component]:
                problems.append(f"NetworkPolicy {policy['metadata']['name']} admits every pod, without auth, "
                                f"on {rule.get('ports')}")
    replicated = render(helm_bin, [], sets={"broker.replicationFactor": "3", "etcd.enabled": "true"})
    if not [d for d in replicated.docs if d["kind"] == "Job"
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == "etcd-auth"]:
        problems.append("the bundled etcd's authentication is not set up (no etcd-auth Job)")
    return problems
