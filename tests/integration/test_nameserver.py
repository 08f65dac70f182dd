"""The name server as a real process (``python -m services.nameserver``) on port 0, driven
over real gRPC: registrations, heartbeat expiry, routes, the Admin API's fan-out to
brokers, status codes of bad input, /metrics and a clean SIGTERM shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.errors import trailing_metadata
from tests.support.metrics import scrape
from txmq.errors import (BrokerNotFoundError, InvalidFieldError, InvalidIdError, InvalidNameError,
                          NoBrokerError, SystemTopicError, TopicExistsError, TopicNotFoundError,
                          TransactionNotFoundError, TransactionStateError, TxmqError,
                          UnavailableError, error_from_rpc)
from txmq.ids import TransactionId
from txmq.v1 import (admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, common_pb2,
                     nameserver_pb2, nameserver_pb2_grpc)

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 20.0
RPC_TIMEOUT_SECONDS = 10.0
# Nothing listens on port 1: calls to this address fail at once with UNAVAILABLE.
DEAD_ADDRESS = "127.0.0.1:1"


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# --- the name server process ------------------------------------------------------------

class NameServerProcess:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.ready_file = tmp / "ready.json"
        self.log_path = tmp / "nameserver.log"
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
        child_env.update({"TXMQ_HOST": "127.0.0.1", "TXMQ_PORT": "0", "TXMQ_METRICS_PORT": "0",
                          "TXMQ_READY_FILE": str(self.ready_file), "TXMQ_SHUTDOWN_GRACE_SECONDS": "1",
                          **env})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "services.nameserver"], cwd=REPO,
                                     env=child_env, stdout=self._log, stderr=subprocess.STDOUT)
        ready = wait_until(self._ready, START_TIMEOUT_SECONDS, "the name server's ready file")
        self.port: int = ready["port"]
        self.metrics_port: int = ready["metrics_port"]
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.ns = nameserver_pb2_grpc.NameServerServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    def _ready(self) -> dict[str, Any] | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"name server exited with {self.proc.returncode}:\n{self.log()}")
        if not self.ready_file.exists():
            return None
        return json.loads(self.ready_file.read_text())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def metrics(self) -> str:
        return scrape(self.metrics_port)


@pytest.fixture
def start_nameserver(tmp_path: Path) -> Iterator[Callable[..., NameServerProcess]]:
    started: list[NameServerProcess] = []

    def start(**env: str) -> NameServerProcess:
        tmp = tmp_path / f"ns{len(started)}"
        tmp.mkdir()
        proc = NameServerProcess(tmp, env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        code = proc.terminate()
        print(proc.log())  # shown only when the test fails
        assert code == 0, f"name server exited with {code}"


@pytest.fixture
def nameserver(start_nameserver: Callable[..., NameServerProcess]) -> NameServerProcess:
    return start_nameserver()


# --- a fake broker ----------------------------------------------------------------------

class FakeBroker(broker_pb2_grpc.BrokerServiceServicer):
    """Stands in for the real broker ONLY to test the name server's Admin fan-out: it keeps
    topics and transaction rows in memory and records what the name server asked."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.topics: dict[str, int] = {}
        self.transactions: dict[str, common_pb2.Transaction] = {}
        self.calls: list[tuple[str, Any]] = []
        self.failing = False
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def called(self, method: str) -> list[Any]:
        with self._lock:
            return [request for name, request in self.calls if name == method]

    def _enter(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls.append((method, request))
        if self.failing:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name} is failing")

    def _fail(self, context: grpc.ServicerContext, error: TxmqError) -> None:
        context.set_trailing_metadata(trailing_metadata(error))
        context.abort(error.code, error.message)

    def CreateTopicQueues(self, request: broker_pb2.CreateTopicQueuesRequest,
                          context: grpc.ServicerContext) -> broker_pb2.CreateTopicQueuesResponse:
        self._enter("CreateTopicQueues", request, context)
        with self._lock:
            count = self.topics[request.topic] = max(self.topics.get(request.topic, 0), request.queue_count)
        return broker_pb2.CreateTopicQueuesResponse(
            topic=common_pb2.TopicQueues(topic=request.topic, queue_count=count))

    def QueryTransactions(self, request: broker_pb2.QueryTransactionsRequest,
                          context: grpc.ServicerContext) -> broker_pb2.QueryTransactionsResponse:
        self._enter("QueryTransactions", request, context)
        return broker_pb2.QueryTransactionsResponse(transactions=list(self.transactions.values()))

    def GetTransaction(self, request: broker_pb2.GetTransactionRequest,
                       context: grpc.ServicerContext) -> broker_pb2.GetTransactionResponse:
        self._enter("GetTransaction", request, context)
        row = self.transactions.get(request.transaction_id)
        if row is None:
            self._fail(context, TransactionNotFoundError(request.transaction_id))
        return broker_pb2.GetTransactionResponse(transaction=row)

    def EndTransaction(self, request: broker_pb2.EndTransactionRequest,
                       context: grpc.ServicerContext) -> broker_pb2.EndTransactionResponse:
        self._enter("EndTransaction", request, context)
        row = self.transactions.get(request.transaction_id)
        if row is None:
            self._fail(context, TransactionNotFoundError(request.transaction_id))
        wanted = (common_pb2.TRANSACTION_STATE_COMMITTED
                  if request.resolution == common_pb2.TRANSACTION_RESOLUTION_COMMIT
                  else common_pb2.TRANSACTION_STATE_ROLLED_BACK)
        if row.state not in (common_pb2.TRANSACTION_STATE_PREPARED, wanted):
            self._fail(context, TransactionStateError(
                request.transaction_id, common_pb2.TransactionState.Name(row.state),
                common_pb2.TransactionResolution.Name(request.resolution)))
        row.state = wanted
        row.resolution_source = request.source
        row.operator = request.operator
        row.reason = request.reason
        row.ended_at_ms = int(time.time() * 1000)
        return broker_pb2.EndTransactionResponse(transaction_id=row.transaction_id, state=row.state,
                                                 resolution_source=row.resolution_source,
                                                 ended_at_ms=row.ended_at_ms)

    def add_transaction(self, sequence: int, prepared_at_ms: int, group: str = "payments") -> str:
        tid = TransactionId(self.name, 1, sequence).encode()
        self.transactions[tid] = common_pb2.Transaction(
            transaction_id=tid, producer_group=group, topic="orders", broker_name=self.name,
            state=common_pb2.TRANSACTION_STATE_PREPARED, prepared_at_ms=prepared_at_ms)
        return tid

    def info(self) -> nameserver_pb2.BrokerInfo:
        with self._lock:
            topics = [common_pb2.TopicQueues(topic=t, queue_count=n) for t, n in self.topics.items()]
        return nameserver_pb2.BrokerInfo(name=self.name, address=self.address, topics=topics)


@pytest.fixture
def fake_brokers() -> Iterator[Callable[[str], FakeBroker]]:
    started: list[FakeBroker] = []

    def start(name: str) -> FakeBroker:
        broker = FakeBroker(name)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.server.stop(None)


def register(ns: NameServerProcess, broker: FakeBroker) -> nameserver_pb2.RegisterBrokerResponse:
    return ns.ns.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=broker.info()),
                                timeout=RPC_TIMEOUT_SECONDS)


def rpc_error(call: Callable[..., Any], request: Any) -> TxmqError:
    """The txmq error a failed call maps to (what an SDK user would catch)."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=RPC_TIMEOUT_SECONDS)
    return error_from_rpc(info.value)


def route(ns: NameServerProcess, topic: str, for_send: bool = False) -> list[tuple[str, str, int]]:
    response = ns.ns.QueryRoute(nameserver_pb2.QueryRouteRequest(topic=topic, for_send=for_send),
                                timeout=RPC_TIMEOUT_SECONDS)
    assert response.topic == topic
    return [(q.broker_name, q.broker_address, q.queue_id) for q in response.queues]


def broker_shares(response: admin_pb2.CreateTopicResponse) -> list[tuple[str, int]]:
    return [(b.broker_name, b.queue_count) for b in response.brokers]


# --- registry ---------------------------------------------------------------------------

def test_serves_health_and_registers_brokers(nameserver: NameServerProcess) -> None:
    health = health_pb2_grpc.HealthStub(nameserver.channel)
    for service in ("", "txmq.v1.NameServerService", "txmq.v1.AdminService"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_SECONDS)
        assert status.status == health_pb2.HealthCheckResponse.SERVING

    before_ms = int(time.time() * 1000)
    response = nameserver.ns.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=nameserver_pb2.BrokerInfo(
        name="broker-1", address="10.0.0.1:10911",
        topics=[common_pb2.TopicQueues(topic="orders", queue_count=2),
                common_pb2.TopicQueues(topic="%DLQ%billing", queue_count=1)])), timeout=RPC_TIMEOUT_SECONDS)
    assert response.heartbeat_interval_seconds == 10.0
    assert response.expiry_seconds == 30.0
    nameserver.ns.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=nameserver_pb2.BrokerInfo(
        name="broker-0", address="10.0.0.0:10911",
        topics=[common_pb2.TopicQueues(topic="orders", queue_count=1)])), timeout=RPC_TIMEOUT_SECONDS)

    assert route(nameserver, "orders") == [
        ("broker-0", "10.0.0.0:10911", 0), ("broker-1", "10.0.0.1:10911", 0), ("broker-1", "10.0.0.1:10911", 1)]
    assert route(nameserver, "%DLQ%billing") == [("broker-1", "10.0.0.1:10911", 0)]

    brokers = nameserver.ns.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=RPC_TIMEOUT_SECONDS).brokers
    assert [b.name for b in brokers] == ["broker-0", "broker-1"]
    assert {t.topic: t.queue_count for t in brokers[1].topics} == {"orders": 2, "%DLQ%billing": 1}
    assert all(before_ms - 1000 <= b.last_heartbeat_ms <= int(time.time() * 1000) + 1000 for b in brokers)

    topics = nameserver.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=RPC_TIMEOUT_SECONDS).topics
    assert [(t.topic, [(b.broker_name, b.queue_count) for b in t.brokers]) for t in topics] == [
        ("%DLQ%billing", [("broker-1", 1)]), ("orders", [("broker-0", 1), ("broker-1", 2)])]

    nameserver.ns.UnregisterBroker(nameserver_pb2.UnregisterBrokerRequest(name="broker-0"),
                                   timeout=RPC_TIMEOUT_SECONDS)
    nameserver.ns.UnregisterBroker(nameserver_pb2.UnregisterBrokerRequest(name="never-registered"),
                                   timeout=RPC_TIMEOUT_SECONDS)
    assert route(nameserver, "orders") == [("broker-1", "10.0.0.1:10911", 0), ("broker-1", "10.0.0.1:10911", 1)]


def test_checkers(nameserver: NameServerProcess) -> None:
    for name in ("checker-1", "checker-0"):
        response = nameserver.ns.RegisterChecker(nameserver_pb2.RegisterCheckerRequest(
            checker=nameserver_pb2.CheckerInfo(name=name, address=f"{name}.checkers:10921")),
            timeout=RPC_TIMEOUT_SECONDS)
        assert response.heartbeat_interval_seconds == 10.0
        assert response.expiry_seconds == 30.0
    listed = nameserver.ns.ListCheckers(nameserver_pb2.ListCheckersRequest(), timeout=RPC_TIMEOUT_SECONDS)
    assert [(c.name, c.address) for c in listed.checkers] == [
        ("checker-0", "checker-0.checkers:10921"), ("checker-1", "checker-1.checkers:10921")]
    assert all(c.last_heartbeat_ms > 0 for c in listed.checkers)
    nameserver.ns.UnregisterChecker(nameserver_pb2.UnregisterCheckerRequest(name="checker-0"),
                                    timeout=RPC_TIMEOUT_SECONDS)
    listed = nameserver.ns.ListCheckers(nameserver_pb2.ListCheckersRequest(), timeout=RPC_TIMEOUT_SECONDS)
    assert [c.name for c in listed.checkers] == ["checker-1"]


def test_silent_brokers_and_checkers_expire(start_nameserver: Callable[..., NameServerProcess]) -> None:
    ns = start_nameserver(TXMQ_BROKER_EXPIRY_SECONDS="0.5", TXMQ_CHECKER_EXPIRY_SECONDS="0.5")
    response = ns.ns.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=nameserver_pb2.BrokerInfo(
        name="broker-0", address="10.0.0.0:10911",
        topics=[common_pb2.TopicQueues(topic="orders", queue_count=1)])), timeout=RPC_TIMEOUT_SECONDS)
    assert response.expiry_seconds == 0.5
    ns.ns.RegisterChecker(nameserver_pb2.RegisterCheckerRequest(
        checker=nameserver_pb2.CheckerInfo(name="checker-0", address="10.0.1.0:10921")), timeout=RPC_TIMEOUT_SECONDS)
    assert route(ns, "orders") == [("broker-0", "10.0.0.0:10911", 0)]

    def broker_gone() -> bool:
        listed = ns.ns.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=RPC_TIMEOUT_SECONDS)
        return not listed.brokers

    wait_until(broker_gone, 10, "the silent broker to leave ListBrokers")
    # Its topic is not "not found": with no live broker nobody can say; retryable.
    err = rpc_error(ns.ns.QueryRoute, nameserver_pb2.QueryRouteRequest(topic="orders"))
    assert isinstance(err, NoBrokerError) and err.code == grpc.StatusCode.UNAVAILABLE and err.retryable
    wait_until(lambda: not ns.ns.ListCheckers(nameserver_pb2.ListCheckersRequest(),
                                              timeout=RPC_TIMEOUT_SECONDS).checkers,
               10, "the silent checker to leave ListCheckers")
    assert "txmq_nameserver_brokers 0.0" in ns.metrics()


# --- bad input --------------------------------------------------------------------------

def test_bad_input_gets_the_documented_status(nameserver: NameServerProcess) -> None:
    bad_broker = [nameserver_pb2.BrokerInfo(name="", address="h:1"),
                  nameserver_pb2.BrokerInfo(name="b", address="no-port"),
                  nameserver_pb2.BrokerInfo(name="b", address="h:99999")]
    for info in bad_broker:
        err = rpc_error(nameserver.ns.RegisterBroker, nameserver_pb2.RegisterBrokerRequest(broker=info))
        assert isinstance(err, InvalidFieldError), err
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    err = rpc_error(nameserver.ns.RegisterChecker, nameserver_pb2.RegisterCheckerRequest(
        checker=nameserver_pb2.CheckerInfo(name="c", address="")))
    assert isinstance(err, InvalidFieldError) and err.field == "checker.address"

    # No broker is registered: no topic can be said not to exist (retryable, not NOT_FOUND).
    err = rpc_error(nameserver.ns.QueryRoute, nameserver_pb2.QueryRouteRequest(topic="nobody-has-it"))
    assert isinstance(err, NoBrokerError) and "nobody-has-it" in str(err)
    assert err.code == grpc.StatusCode.UNAVAILABLE
    for topic in ("%HALF%", "bad topic", ""):
        err = rpc_error(nameserver.ns.QueryRoute, nameserver_pb2.QueryRouteRequest(topic=topic))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, topic

    err = rpc_error(nameserver.admin.CreateTopic, admin_pb2.CreateTopicRequest(topic="%DLQ%g"))
    assert isinstance(err, SystemTopicError)
    err = rpc_error(nameserver.admin.CreateTopic, admin_pb2.CreateTopicRequest(topic="has space"))
    assert isinstance(err, InvalidNameError)
    for count in (-1, 1025):
        err = rpc_error(nameserver.admin.CreateTopic, admin_pb2.CreateTopicRequest(topic="t", queue_count=count))
        assert isinstance(err, InvalidFieldError) and err.field == "queue_count"
    err = rpc_error(nameserver.admin.CreateTopic, admin_pb2.CreateTopicRequest(topic="t", queue_count=4))
    assert isinstance(err, NoBrokerError) and err.code == grpc.StatusCode.UNAVAILABLE and err.retryable

    err = rpc_error(nameserver.admin.DescribeTransaction,
                    admin_pb2.DescribeTransactionRequest(transaction_id="not-an-id"))
    assert isinstance(err, InvalidIdError)
    unknown_broker_id = TransactionId("broker-9", 1, 1).encode()
    err = rpc_error(nameserver.admin.DescribeTransaction,
                    admin_pb2.DescribeTransactionRequest(transaction_id=unknown_broker_id))
    assert isinstance(err, BrokerNotFoundError) and err.broker == "broker-9"
    err = rpc_error(nameserver.admin.ResolveTransaction, admin_pb2.ResolveTransactionRequest(
        transaction_id=unknown_broker_id, resolution=common_pb2.TRANSACTION_RESOLUTION_UNKNOWN, operator="alice"))
    assert isinstance(err, InvalidFieldError) and err.field == "resolution"
    err = rpc_error(nameserver.admin.ResolveTransaction, admin_pb2.ResolveTransactionRequest(
        transaction_id=unknown_broker_id, resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT, operator=" "))
    assert isinstance(err, InvalidFieldError) and err.field == "operator"
    err = rpc_error(nameserver.admin.ListTransactions, admin_pb2.ListTransactionsRequest(limit=-1))
    assert isinstance(err, InvalidFieldError) and err.field == "limit"


# --- Admin: topics ----------------------------------------------------------------------

def test_create_topic_spreads_queues_and_routes_them_at_once(
        fake_brokers: Callable[[str], FakeBroker], nameserver: NameServerProcess) -> None:
    brokers = [fake_brokers(name) for name in ("broker-c", "broker-a", "broker-b")]
    for broker in brokers:
        register(nameserver, broker)
    a, b, c = sorted(brokers, key=lambda x: x.name)

    response = nameserver.admin.CreateTopic(admin_pb2.CreateTopicRequest(topic="orders", queue_count=8),
                                            timeout=RPC_TIMEOUT_SECONDS)
    assert response.topic == "orders"
    assert broker_shares(response) == [("broker-a", 3), ("broker-b", 3), ("broker-c", 2)]
    assert [(r.topic, r.queue_count) for r in a.called("CreateTopicQueues")] == [("orders", 3)]
    assert [(r.topic, r.queue_count) for r in c.called("CreateTopicQueues")] == [("orders", 2)]
    # Routed before any broker heartbeat lists the topic.
    assert route(nameserver, "orders") == (
        [("broker-a", a.address, q) for q in range(3)] + [("broker-b", b.address, q) for q in range(3)]
        + [("broker-c", c.address, q) for q in range(2)])

    err = rpc_error(nameserver.admin.CreateTopic, admin_pb2.CreateTopicRequest(topic="orders", queue_count=8))
    assert isinstance(err, TopicExistsError) and err.code == grpc.StatusCode.ALREADY_EXISTS

    # 2 queues over 3 brokers: the third gets none and is not called.
    response = nameserver.admin.CreateTopic(admin_pb2.CreateTopicRequest(topic="pair", queue_count=2),
                                            timeout=RPC_TIMEOUT_SECONDS)
    assert broker_shares(response) == [("broker-a", 1), ("broker-b", 1)]
    assert [r.topic for r in c.called("CreateTopicQueues")] == ["orders"]

    # 0 → the default queue count (4).
    response = nameserver.admin.CreateTopic(admin_pb2.CreateTopicRequest(topic="defaulted"),
                                            timeout=RPC_TIMEOUT_SECONDS)
    assert sum(s for _, s in broker_shares(response)) == 4

    # A heartbeat that lists the topics keeps them routed.
    for broker in brokers:
        register(nameserver, broker)
    topics = nameserver.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=RPC_TIMEOUT_SECONDS).topics
    assert [t.topic for t in topics] == ["defaulted", "orders", "pair"]
    assert len(route(nameserver, "orders")) == 8


def test_create_topic_with_a_failing_broker_completes_on_retry(
        fake_brokers: Callable[[str], FakeBroker], nameserver: NameServerProcess) -> None:
    a, b, c = (fake_brokers(name) for name in ("broker-a", "broker-b", "broker-c"))
    for broker in (a, b, c):
        register(nameserver, broker)
    b.failing = True
    err = rpc_error(nameserver.admin.CreateTopic, admin_pb2.CreateTopicRequest(topic="orders", queue_count=8))
    assert isinstance(err, UnavailableError) and err.code == grpc.StatusCode.UNAVAILABLE
    assert err.broker == "broker-b" and "broker-b" in err.message
    # The shares that were created are routed; b's is missing.
    assert sorted({name for name, _, _ in route(nameserver, "orders")}) == ["broker-a", "broker-c"]

    b.failing = False
    response = nameserver.admin.CreateTopic(admin_pb2.CreateTopicRequest(topic="orders", queue_count=8),
                                            timeout=RPC_TIMEOUT_SECONDS)
    assert broker_shares(response) == [("broker-a", 3), ("broker-b", 3), ("broker-c", 2)]
    assert len(a.called("CreateTopicQueues")) == 1  # a's share was already there
    assert [r.queue_count for r in b.called("CreateTopicQueues")] == [3, 3]
    assert len(route(nameserver, "orders")) == 8


def test_create_topic_on_an_unreachable_broker_is_unavailable(nameserver: NameServerProcess) -> None:
    nameserver.ns.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=nameserver_pb2.BrokerInfo(
        name="broker-dead", address=DEAD_ADDRESS)), timeout=RPC_TIMEOUT_SECONDS)
    err = rpc_error(nameserver.admin.CreateTopic, admin_pb2.CreateTopicRequest(topic="orders", queue_count=2))
    assert isinstance(err, UnavailableError) and err.broker == "broker-dead"


def test_query_route_auto_creates_user_topics_when_enabled(
        fake_brokers: Callable[[str], FakeBroker], start_nameserver: Callable[..., NameServerProcess]) -> None:
    ns = start_nameserver(TXMQ_AUTO_CREATE_TOPICS="true", TXMQ_DEFAULT_QUEUE_COUNT="3")
    broker = fake_brokers("broker-0")
    register(ns, broker)
    # A subscription's lookup (a consumer) never creates: a typo gets TOPIC_NOT_FOUND.
    err = rpc_error(ns.ns.QueryRoute, nameserver_pb2.QueryRouteRequest(topic="fresh"))
    assert isinstance(err, TopicNotFoundError)
    assert broker.called("CreateTopicQueues") == []
    # A producer's lookup (for_send) creates it.
    assert route(ns, "fresh", for_send=True) == [("broker-0", broker.address, q) for q in range(3)]
    assert [(r.topic, r.queue_count) for r in broker.called("CreateTopicQueues")] == [("fresh", 3)]
    assert route(ns, "fresh") == [("broker-0", broker.address, q) for q in range(3)]
    assert len(broker.called("CreateTopicQueues")) == 1
    # System topics are never auto-created.
    err = rpc_error(ns.ns.QueryRoute, nameserver_pb2.QueryRouteRequest(topic="%DLQ%billing", for_send=True))
    assert isinstance(err, TopicNotFoundError)
    assert len(broker.called("CreateTopicQueues")) == 1


# --- Admin: transactions ----------------------------------------------------------------

def test_list_transactions_merges_brokers_and_names_the_unreachable(
        fake_brokers: Callable[[str], FakeBroker], nameserver: NameServerProcess) -> None:
    a, b = fake_brokers("broker-a"), fake_brokers("broker-b")
    t3 = a.add_transaction(1, prepared_at_ms=3000)
    t1 = b.add_transaction(1, prepared_at_ms=1000)
    t2 = a.add_transaction(2, prepared_at_ms=2000)
    for broker in (a, b):
        register(nameserver, broker)
    nameserver.ns.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=nameserver_pb2.BrokerInfo(
        name="broker-dead", address=DEAD_ADDRESS)), timeout=RPC_TIMEOUT_SECONDS)

    response = nameserver.admin.ListTransactions(admin_pb2.ListTransactionsRequest(
        producer_group="payments", state=common_pb2.TRANSACTION_STATE_PREPARED, older_than_seconds=1.5,
        limit=10), timeout=RPC_TIMEOUT_SECONDS)
    assert [t.transaction_id for t in response.transactions] == [t1, t2, t3]
    assert list(response.unreachable_brokers) == ["broker-dead"]
    (forwarded,) = a.called("QueryTransactions")
    assert (forwarded.producer_group, forwarded.state, forwarded.older_than_seconds, forwarded.limit) == (
        "payments", common_pb2.TRANSACTION_STATE_PREPARED, 1.5, 10)


def test_describe_and_resolve_route_by_transaction_id(
        fake_brokers: Callable[[str], FakeBroker], nameserver: NameServerProcess) -> None:
    a, b = fake_brokers("broker-a"), fake_brokers("broker-b")
    tid = b.add_transaction(7, prepared_at_ms=1000)
    for broker in (a, b):
        register(nameserver, broker)

    row = nameserver.admin.DescribeTransaction(admin_pb2.DescribeTransactionRequest(transaction_id=tid),
                                               timeout=RPC_TIMEOUT_SECONDS).transaction
    assert row.transaction_id == tid and row.state == common_pb2.TRANSACTION_STATE_PREPARED
    assert a.called("GetTransaction") == []

    # The broker's own error comes back unchanged.
    missing = TransactionId("broker-b", 1, 99).encode()
    err = rpc_error(nameserver.admin.DescribeTransaction,
                    admin_pb2.DescribeTransactionRequest(transaction_id=missing))
    assert isinstance(err, TransactionNotFoundError) and err.transaction_id == missing

    row = nameserver.admin.ResolveTransaction(admin_pb2.ResolveTransactionRequest(
        transaction_id=tid, resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT, operator="alice",
        reason="INC-42: payment confirmed"), timeout=RPC_TIMEOUT_SECONDS).transaction
    assert row.state == common_pb2.TRANSACTION_STATE_COMMITTED
    assert (row.operator, row.reason) == ("alice", "INC-42: payment confirmed")
    (end,) = b.called("EndTransaction")
    assert end.source == common_pb2.TRANSACTION_SOURCE_OPERATOR
    assert (end.transaction_id, end.resolution) == (tid, common_pb2.TRANSACTION_RESOLUTION_COMMIT)

    err = rpc_error(nameserver.admin.ResolveTransaction, admin_pb2.ResolveTransactionRequest(
        transaction_id=tid, resolution=common_pb2.TRANSACTION_RESOLUTION_ROLLBACK, operator="bob"))
    assert isinstance(err, TransactionStateError) and err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.state == "TRANSACTION_STATE_COMMITTED"


# --- operations -------------------------------------------------------------------------

def test_metrics_show_rpc_durations_and_registrations(nameserver: NameServerProcess) -> None:
    nameserver.ns.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(broker=nameserver_pb2.BrokerInfo(
        name="broker-0", address="10.0.0.0:10911")), timeout=RPC_TIMEOUT_SECONDS)
    rpc_error(nameserver.ns.QueryRoute, nameserver_pb2.QueryRouteRequest(topic="missing"))
    expected = ['txmq_rpc_duration_seconds_count{code="OK",method="RegisterBroker",service="nameserver"} 1.0',
                'txmq_rpc_duration_seconds_count{code="NOT_FOUND",method="QueryRoute",service="nameserver"} 1.0',
                "txmq_nameserver_brokers 1.0", "txmq_nameserver_checkers 0.0"]
    # A scrape is a separate HTTP request: wait (with a deadline) until it shows the calls.
    wait_until(lambda: all(line in nameserver.metrics() for line in expected), 10.0,
               f"/metrics to show {expected}")


def test_sigterm_exits_cleanly(nameserver: NameServerProcess) -> None:
    nameserver.ns.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=RPC_TIMEOUT_SECONDS)
    assert nameserver.terminate() == 0
    assert '"msg": "stopped"' in nameserver.log()
