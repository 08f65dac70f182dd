"""``python -m services.local``: every txmq service as a separate local process, and a demo.

``make run`` calls it. It starts the name server (gRPC 9876, metrics 9400, topics
auto-created on a producer's first send), one broker (10911, metrics 9401, data in
``<data-dir>/broker-0``), a checker (10921, metrics 9402) and the RocketMQ 5 proxy (8081,
metrics 9403: the official RocketMQ clients' endpoint, docs/rocketmq-compat.md); waits for
their ready files; runs the demo (three transactional messages: committed, rolled back, left
UNKNOWN and then resolved by the checker's check a few seconds later; a consumer that
receives the two committed ones only); then keeps the services running until Ctrl-C or
SIGTERM, which stops them cleanly.

Service logs (JSON lines) go to ``<data-dir>/<service>.log``. ``TXMQ_*`` variables in the
environment reach every service (``TXMQ_LOG_LEVEL=DEBUG make run``), except the ones this
runner sets itself (ports, addresses, names, directories). With ``TXMQ_TLS_CERT_FILE``,
``TXMQ_TLS_KEY_FILE`` and ``TXMQ_TLS_CA_FILE`` set, every service serves TLS with that
certificate (one for all, valid for 127.0.0.1) and the runner's own calls and the demo use
it too (docs/howto/tls-auth.md).

Flags: ``--ports auto`` binds ephemeral ports instead of the fixed ones (tests),
``--no-demo``, ``--exit-after-demo``, ``--replication-factor 3`` (the broker as a shard of
three replicas, ``broker-0-r0..2``: gRPC 10911-10913, replication 10931-10933, metrics 9411-9413, data in
``<data-dir>/broker-0-r<N>``, with a local etcd started first; see docs/replication.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Sequence

import grpc

from txmq import (TLS, Admin, LocalTransactionState, Message, SimpleConsumer, TopicExistsError, TransactionListener,
                  TransactionProducer)
from txmq.tls import ChannelTLS, sync_channel
from txmq.v1 import common_pb2, nameserver_pb2, nameserver_pb2_grpc

from services.common.etcd import EtcdProcess, password_auth
from services.common.process import ServiceError, ServiceProcess, port_is_free

HOST = "127.0.0.1"
DEMO_TOPIC = "demo-orders"
DEMO_PRODUCER_GROUP = "demo-producers"
DEMO_CONSUMER_GROUP = "demo-consumers"
#: How long the demo's consumer waits for the committed message.
DEMO_RECEIVE_SECONDS = 30.0
READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0
#: Settings the runner owns; the same variables in the caller's environment are ignored.
RUNNER_OWNED = {"TXMQ_HOST", "TXMQ_PORT", "TXMQ_METRICS_PORT", "TXMQ_READY_FILE", "TXMQ_DATA_DIR",
                "TXMQ_BROKER_NAME", "TXMQ_NAMESERVER_ADDRESSES"}


@dataclass(frozen=True)
class Role:
    name: str
    module: str
    port: int
    metrics_port: int


NAMESERVER = Role("nameserver", "services.nameserver", 9876, 9400)
BROKER = Role("broker-0", "services.broker", 10911, 9401)
#: The replicas' replication ports with --replication-factor (fixed ports): this + replica id
#: (the default 10912 is the second replica's gRPC port here).
REPLICATION_PORT = 10931
CHECKER = Role("checker", "services.checker", 10921, 9402)
PROXY = Role("proxy", "services.proxy", 8081, 9403)
#: The demo's UNKNOWN transaction is first checked this long after it was sent (its
#: message's check immunity, instead of the broker's transaction_timeout_seconds).
DEMO_CHECK_AFTER_SECONDS = 2.0


class Shutdown(Exception):
    """SIGTERM (or SIGINT) arrived: stop the services and exit 0."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def say(text: str) -> None:
    print(text, flush=True)


def fail(text: str) -> NoReturn:
    print(f"txmq local: {text}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def checker_available() -> bool:
    try:
        return importlib.util.find_spec(CHECKER.module + ".__main__") is not None
    except ImportError:
        return False


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m services.local",
        description="Run the txmq services locally (separate processes) and a transactional demo.")
    parser.add_argument("--data-dir", default="./data",
                        help="broker data under <data-dir>/broker-0, service logs <data-dir>/<service>.log "
                             "(default ./data)")
    parser.add_argument("--ports", choices=("fixed", "auto"), default="fixed",
                        help="fixed: nameserver 9876, broker 10911, checker 10921, proxy 8081, metrics 9400-9403 "
                             "(default); auto: ephemeral ports, learned from each service's ready file")
    parser.add_argument("--no-demo", action="store_true", help="start the services without running the demo")
    parser.add_argument("--exit-after-demo", action="store_true",
                        help="stop the services after the demo; exit 0 only if it succeeded")
    parser.add_argument("--replication-factor", type=int, default=1, choices=range(1, 10), metavar="N",
                        help="replicas of the broker's shard (default 1: a single broker, no etcd; "
                             "N > 1 starts a local etcd and N replicas, min_insync_replicas 2)")
    return parser.parse_args(argv)


class LocalServices:
    """The processes, started in dependency order and stopped in reverse."""

    def __init__(self, data_dir: Path, fixed_ports: bool, replication_factor: int = 1) -> None:
        self.data_dir = data_dir
        self.fixed_ports = fixed_ports
        self.replication_factor = replication_factor
        self.etcd: EtcdProcess | None = None
        self.replicas: list[ServiceProcess] = []
        self.inherited = {k: v for k, v in os.environ.items()
                          if k.startswith("TXMQ_") and k not in RUNNER_OWNED}
        self.started: list[ServiceProcess] = []
        self.nameserver: ServiceProcess | None = None
        self.broker: ServiceProcess | None = None
        self.checker: ServiceProcess | None = None
        self.proxy: ServiceProcess | None = None

    def _env(self, role: Role, **settings: str) -> dict[str, str]:
        ports = (role.port, role.metrics_port) if self.fixed_ports else (0, 0)
        return {**self.inherited, **settings, "TXMQ_HOST": HOST,
                "TXMQ_PORT": str(ports[0]), "TXMQ_METRICS_PORT": str(ports[1])}

    def check_ports(self, roles: Sequence[Role]) -> None:
        if not self.fixed_ports:
            return
        for role in roles:
            for port, what in ((role.port, "gRPC"), (role.metrics_port, "metrics")):
                if not port_is_free(port, HOST):
                    fail(f"port {port} ({role.name} {what}) is already in use on {HOST}: stop what "
                         f"listens there (an earlier `make run`?) or run with --ports auto")

    def _start(self, role: Role, env: dict[str, str]) -> ServiceProcess:
        proc = ServiceProcess(role.module, env, self.data_dir, role.name)
        self.started.append(proc)
        proc.start()
        proc.wait_ready(READY_TIMEOUT_SECONDS)
        return proc

    def start(self, with_checker: bool) -> None:
        self.nameserver = self._start(NAMESERVER, self._env(NAMESERVER, TXMQ_AUTO_CREATE_TOPICS="true", TXMQ_EXPECTED_BROKERS="1"))
        addresses = self.nameserver.address
        if self.replication_factor > 1:
            self._start_replicas(addresses)
        else:
            self.broker = self._start(BROKER, self._env(
                BROKER, TXMQ_BROKER_NAME=BROKER.name, TXMQ_DATA_DIR=str(self.data_dir / BROKER.name),
                TXMQ_NAMESERVER_ADDRESSES=addresses))
            wait_broker_registered(self.nameserver.address, BROKER.name, self.broker.address)
        if with_checker:
            self.checker = self._start(CHECKER, self._env(CHECKER, TXMQ_NAMESERVER_ADDRESSES=addresses))
        self.proxy = self._start(PROXY, self._env(PROXY, TXMQ_NAMESERVER_ADDRESSES=addresses))

    def _start_replicas(self, nameservers: str) -> None:
        """etcd (its authentication on: txmq's keys for the brokers' password user only,
        root's password kept in the data directory), then the replicas of broker-0; returns
        once one leads with enough in sync."""
        say(f"txmq local: starting etcd and {self.replication_factor} replicas of {BROKER.name}")
        auth = password_auth(self.data_dir / "etcd-auth")
        try:
            self.etcd = EtcdProcess(self.data_dir, auth=auth).start(READY_TIMEOUT_SECONDS)
        except grpc.RpcError as exc:
            fail(f"etcd in {self.data_dir} refused its authentication set-up ({exc.details()}): root's password "
                 f"is kept in {self.data_dir / 'etcd-auth'}; if that was removed, remove {self.data_dir / 'etcd.data'} "
                 "too (the shard's leadership records) and start again")
        etcd_user = {"TXMQ_ETCD_USER": auth.broker_users[0],
                     "TXMQ_ETCD_PASSWORD_FILE": str(self.data_dir / "etcd-auth" / "etcd-broker.password")}
        for r in range(self.replication_factor):
            role = Role(f"{BROKER.name}-r{r}", BROKER.module, BROKER.port + r, 9411 + r)
            proc = ServiceProcess(role.module, self._env(
                role, TXMQ_BROKER_NAME=BROKER.name, TXMQ_DATA_DIR=str(self.data_dir / role.name),
                TXMQ_NAMESERVER_ADDRESSES=nameservers, TXMQ_REPLICATION_FACTOR=str(self.replication_factor),
                TXMQ_REPLICA_ID=str(r), TXMQ_MIN_INSYNC_REPLICAS="2", TXMQ_ETCD_ENDPOINTS=self.etcd.endpoint,
                TXMQ_REPLICATION_PORT=str(REPLICATION_PORT + r if self.fixed_ports else 0), **etcd_user),
                self.data_dir, role.name)
            self.started.append(proc)
            self.replicas.append(proc)
            proc.start()
        for proc in self.replicas:
            proc.wait_ready(READY_TIMEOUT_SECONDS)
        self.broker = wait_leader(nameservers, BROKER.name, self.replicas)

    def dead(self) -> list[ServiceProcess]:
        return [p for p in self.started if not p.running]

    def stop(self) -> None:
        """SIGTERM each (checker, broker, name server), waiting for each; a second signal
        kills whatever still runs."""
        def kill_all(signum: int, frame: Any) -> None:
            for p in self.started:
                if p.running and p.pid is not None:
                    try:
                        os.kill(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

        signal.signal(signal.SIGINT, kill_all)
        signal.signal(signal.SIGTERM, kill_all)
        for proc in reversed(self.started):
            if proc.running:
                code = proc.stop(STOP_TIMEOUT_SECONDS)
                say(f"txmq local: stopped {proc.name} (exit code {code})")
            else:
                proc.stop()
        if self.etcd is not None:
            self.etcd.stop()


def wait_leader(nameserver: str, shard: str, replicas: Sequence[ServiceProcess],
                timeout: float = READY_TIMEOUT_SECONDS) -> ServiceProcess:
    """The replica of ``shard`` the name server routes to, once its in-sync set can
    acknowledge writes (at least two members)."""
    deadline = time.monotonic() + timeout
    with _channel(nameserver) as channel:
        stub = nameserver_pb2_grpc.NameServerServiceStub(channel)
        while time.monotonic() < deadline:
            try:
                listed = stub.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=2.0).brokers
            except grpc.RpcError:
                listed = []
            for info in listed:
                if info.name == shard and len(info.replication.in_sync_replicas) >= 2:
                    for proc in replicas:
                        if proc.address == info.address:
                            return proc
            time.sleep(0.1)
    raise TimeoutError(f"no replica of {shard} leads with two in sync after {timeout:g} s")


def wait_broker_registered(nameserver: str, broker_name: str, broker_address: str,
                           timeout: float = READY_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    with _channel(nameserver) as channel:
        stub = nameserver_pb2_grpc.NameServerServiceStub(channel)
        while True:
            try:
                response = stub.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=5.0)
                if any(b.name == broker_name and b.address == broker_address for b in response.brokers):
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{broker_name} ({broker_address}) did not register with the name "
                                   f"server {nameserver} within {timeout:.0f}s")
            time.sleep(0.05)


def client_tls() -> Any:
    """The SDK's ``txmq.TLS`` for the runner's own calls when the services run with TLS
    (``TXMQ_TLS_*`` in the environment: they present the services' certificate), else None."""
    cert, key, ca = (os.environ.get(f"TXMQ_TLS_{n}_FILE", "") for n in ("CERT", "KEY", "CA"))
    if not cert:
        return None
    return TLS(ca_file=ca, cert_file=cert, key_file=key, server_name=os.environ.get("TXMQ_TLS_SERVER_NAME", ""))


def _channel(address: str) -> Any:
    """A channel to a local service, with TLS when the services have it."""
    tls = client_tls()
    return sync_channel(address, (), ChannelTLS(tls) if tls is not None else None)


# ---------------------------------------------------------------------------- the demo
def create_demo_topic(nameserver: str) -> None:
    with Admin(nameserver, tls=client_tls()) as admin:
        try:
            admin.create_topic(DEMO_TOPIC, queue_count=4)
        except TopicExistsError:
            pass


def _name(value: Any) -> str:
    return getattr(value, "name", None) or str(value)


def run_demo(nameserver: str) -> bool:
    """Three transactional sends and a consumer; True when the consumer saw exactly the
    committed message."""
    create_demo_topic(nameserver)
    run = uuid.uuid4().hex[:8]
    plan = [("order-1", LocalTransactionState.COMMIT),
            ("order-2", LocalTransactionState.ROLLBACK),
            ("order-3", LocalTransactionState.UNKNOWN)]
    decisions = {f"{key}-{run}": state for key, state in plan}

    # order-3's local transaction cannot say yet (UNKNOWN), and commits right after: the
    # check that comes DEMO_CHECK_AFTER_SECONDS later finds it committed.
    decisions[f"order-3-{run}"] = LocalTransactionState.COMMIT
    checked = threading.Event()
    sent_at: dict[str, float] = {}

    class DemoListener(TransactionListener):
        """The local transaction is a dict lookup: the key says how it ends."""

        def execute_local_transaction(self, message: Any, arg: Any) -> Any:
            return arg

        def check_local_transaction(self, message: Any) -> Any:
            # The checker asks about order-3 (and about any UNKNOWN an earlier run left:
            # unknown here, so it stays pending until check_max discards it).
            keys = getattr(message, "keys", ()) or ()
            answer = decisions.get(keys[0] if keys else "", LocalTransactionState.UNKNOWN)
            if keys and keys[0] in sent_at:
                say(f"demo: the checker asked about order-3 {time.monotonic() - sent_at[keys[0]]:.1f}s after it "
                    f"was sent (check {getattr(message, 'attempt', 1)}): the local transaction says "
                    f"{answer.name}")
                checked.set()
            return answer

    say(f"demo: producer group {DEMO_PRODUCER_GROUP!r} sends three transactional messages to {DEMO_TOPIC!r}")
    results: dict[str, Any] = {}
    with TransactionProducer(nameservers=[nameserver], producer_group=DEMO_PRODUCER_GROUP, tls=client_tls(),
                             listener=DemoListener()) as producer:
        for key, local_state in plan:
            full_key = f"{key}-{run}"
            body = f"{key} (run {run}): local transaction says {local_state.name}".encode()
            immunity = DEMO_CHECK_AFTER_SECONDS if local_state is LocalTransactionState.UNKNOWN else None
            if immunity:
                sent_at[full_key] = time.monotonic()
            result = producer.send_in_transaction(Message(topic=DEMO_TOPIC, body=body, keys=(full_key,),
                                                          check_immunity_seconds=immunity), local_state)
            results[key] = result
            note = {"COMMIT": "visible to consumers",
                    "ROLLBACK": "discarded, never delivered",
                    "UNKNOWN": "pending: the checker will ask the producer group"}[local_state.name]
            say(f"demo: sent {key}: local transaction {local_state.name} -> {_name(result.state)} "
                f"({note}; transaction {result.transaction_id})")
        if not _await_check(checked, results["order-3"].transaction_id, nameserver):
            return False

    committed = {results["order-1"].transaction_id: "order-1", results["order-3"].transaction_id: "order-3"}
    not_delivered = {results["order-2"].transaction_id: "order-2"}
    say(f"demo: consumer group {DEMO_CONSUMER_GROUP!r} receives from {DEMO_TOPIC!r}")
    ok = True
    seen: set[str] = set()
    with SimpleConsumer(nameservers=[nameserver], consumer_group=DEMO_CONSUMER_GROUP, tls=client_tls(),
                        subscriptions={DEMO_TOPIC: "*"}, await_duration_seconds=1.0) as consumer:
        deadline = time.monotonic() + DEMO_RECEIVE_SECONDS
        drained = False
        while not drained:
            if len(seen) == len(committed):
                drained = True  # one more receive: nothing else of this run may arrive
            elif time.monotonic() >= deadline:
                say(f"demo: FAILED: the committed messages were not received within {DEMO_RECEIVE_SECONDS:.0f}s "
                    f"(missing {sorted(set(committed.values()) - seen)})")
                return False
            for msg in consumer.receive(max_messages=16, invisible_duration_seconds=30.0):
                text = bytes(msg.body).decode("utf-8", "replace")
                if msg.transaction_id in committed:
                    key = committed[msg.transaction_id]
                    if key not in seen:
                        say(f"demo: consumed {key}: {text!r} (message {msg.message_id}, "
                            f"transaction {msg.transaction_id})")
                    seen.add(key)
                elif msg.transaction_id in not_delivered:
                    ok = False
                    say(f"demo: FAILED: consumed {not_delivered[msg.transaction_id]}, which was not "
                        f"committed: {text!r}")
                else:
                    say(f"demo: acknowledged a message left by an earlier run: {text!r}")
                consumer.ack(msg)
    if ok:
        say("demo: ok: the consumer received the committed messages only")
    return ok


def _await_check(checked: threading.Event, transaction_id: str, nameserver: str) -> bool:
    """Waits (the producer still open to answer) until the checker's check resolved order-3."""

    say(f"demo: order-3 waits for the checker (first check {DEMO_CHECK_AFTER_SECONDS:g}s after the send)")
    deadline = time.monotonic() + DEMO_RECEIVE_SECONDS
    with Admin(nameserver, tls=client_tls()) as admin:
        while time.monotonic() < deadline:
            state = admin.describe_transaction(transaction_id).transaction.state
            if checked.is_set() and state == common_pb2.TRANSACTION_STATE_COMMITTED:
                say(f"demo: order-3 resolved by the check: PREPARED -> COMMITTED "
                    f"(transaction {transaction_id})")
                return True
            time.sleep(0.1)
    say(f"demo: FAILED: order-3 was not resolved by a check within {DEMO_RECEIVE_SECONDS:.0f}s")
    return False


# ---------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with_checker = checker_available()
    rf = args.replication_factor
    brokers = [BROKER] if rf == 1 else [Role(f"{BROKER.name}-r{r}", BROKER.module, BROKER.port + r, 9411 + r)
                                        for r in range(rf)]
    roles = [NAMESERVER, *brokers, *([CHECKER] if with_checker else []), PROXY]
    services = LocalServices(data_dir, fixed_ports=args.ports == "fixed", replication_factor=rf)
    services.check_ports(roles)

    def on_signal(signum: int, frame: Any) -> None:
        raise Shutdown(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 0
    try:
        services.start(with_checker)
        show_services(services, args.data_dir)
        if not args.no_demo:
            ok = run_demo(services.nameserver.address)  # type: ignore[union-attr]  # started above
            if not ok:
                code = 1
                if not args.exit_after_demo:
                    say("demo: failed; the services keep running (see their logs)")
        if args.exit_after_demo:
            return code
        parts = [f"nameserver {services.nameserver.address}", f"broker {services.broker.address}"]  # type: ignore[union-attr]  # started
        if services.checker is not None:
            parts.append(f"checker {services.checker.address}")
        if services.proxy is not None:
            parts.append(f"RocketMQ proxy {services.proxy.address}")
        say(f"services are running: {', '.join(parts)} — Ctrl-C to stop")
        supervise(services)
        return 1
    except Shutdown as exc:
        say(f"\ntxmq local: {exc} received, stopping the services")
        return 0
    except ServiceError as exc:
        print(f"txmq local: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception:  # noqa: BLE001 - report, then stop the services
        print(f"txmq local: failed\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        return 1
    finally:
        services.stop()


def show_services(services: LocalServices, data_dir_arg: str) -> None:
    shown = Path(data_dir_arg)
    for proc in services.started:
        extra = f"  data {shown / proc.name}" if proc is services.broker or proc in services.replicas else ""
        if proc is services.broker and services.replicas:
            extra += "  (leader)"
        say(f"txmq local: {proc.name:<10} {proc.address:<16} metrics http://{HOST}:{proc.metrics_port}/metrics"
            f"  log {shown / (proc.name + '.log')}{extra}")
    for line in security_banner(os.environ, services.etcd is not None):
        say(f"txmq local: {line}")
    if services.checker is None:
        say("txmq local: no checker yet (services.checker is not built): transactions left UNKNOWN stay pending")
    if services.proxy is not None:
        say(f"txmq local: RocketMQ 5 clients: endpoints {services.proxy.address} (docs/rocketmq-compat.md)")


def security_banner(environ: Any, with_etcd: bool) -> list[str]:
    """What the banner says about security: who can reach the services and whether they
    ask for credentials (``TXMQ_AUTH_FILES``) and TLS (``TXMQ_TLS_*``) — open unless the
    caller's environment set them."""
    auth = bool(environ.get("TXMQ_AUTH_FILES"))
    tls = bool(environ.get("TXMQ_TLS_CERT_FILE"))
    lines = [f"security: listening on {HOST} only (loopback: reachable from this machine alone); "
             + ("authentication on (TXMQ_AUTH_FILES)" if auth else
                "OPEN: no authentication, every call allowed (set TXMQ_AUTH_FILES; docs/security.md)")
             + ("; TLS on" if tls else "; plaintext (no TLS)")]
    if with_etcd:
        lines.append("security: etcd authentication on, txmq's keys for the brokers' user only "
                     "(passwords in <data-dir>/etcd-auth)")
    return lines


def supervise(services: LocalServices) -> None:
    """Returns when a service exits on its own (a crash); signals interrupt it."""
    idle = threading.Event()
    while not services.dead():
        idle.wait(0.5)
    for proc in services.dead():
        print(f"txmq local: {proc.name} exited unexpectedly (code {proc.returncode})\n"
              f"--- last lines of {proc.log_path} ---\n{proc.log_tail(30)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
