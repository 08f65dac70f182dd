"""Multi-message transactions across shards with real processes (two shards, a checker):
the SDK's ``send_in_transaction([...])`` (sync and asyncio), the CLI, and the crash matrix —
each broker SIGKILLed at each step of the commit protocol (``TXMQ_FAILPOINT``), and the
producer stopping before and after each of its steps: every time all of the transaction's
messages reach the consumers of every topic involved, or none does.

The crash matrix drives the protocol with raw BrokerService calls (the producer is this
test: "the producer dies" means it sends nothing more, and the group's surviving instance
answers the check of G), so it decides which shard is the coordinator and which step dies.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass

import grpc
import pytest

import txmq
import txmq.aio
import txmq.ids
from txmq.client import CHANNEL_OPTIONS
from txmq.ids import MessageId
from txmq.names import GLOBAL_TRANSACTION_PROPERTY
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from services.broker import failpoints
from tests.support import presets
from tests.support.cli import txmq_cli
from tests.support.metrics import metric
from tests.support.waiting import wait_until

LocalState = txmq.LocalTransactionState
FAST = presets.GLOBAL_BROKER
SHARDS = ("broker-0", "broker-1")


class Consuming:
    """A consumer group reading (and acknowledging) topics on a thread: the messages of
    each global transaction it saw, by G."""

    def __init__(self, cluster, topics: list[str], group: str) -> None:
        self.seen: dict[str, set[str]] = {}
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group,
                                             subscriptions={t: "*" for t in topics}, await_duration_seconds=0.2,
                                             route_refresh_seconds=0.5)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for m in self._consumer.receive(max_messages=32, invisible_duration_seconds=5):
                    with self._lock:
                        self.seen.setdefault(m.global_transaction_id, set()).add(m.message_id)
                    self._consumer.ack(m)
            except txmq.TxmqError as exc:  # a broker of the matrix is down (or was killed mid-call): go on
                if not (exc.retryable or isinstance(exc, txmq.CancelledError)) and not self._stop.is_set():
                    self.errors.append(exc)
                self._stop.wait(0.1)

    def of(self, gid: str) -> set[str]:
        with self._lock:
            return set(self.seen.get(gid, ()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def _listener(decisions: dict[str, LocalState]) -> txmq.TransactionListener:
    class Listener(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            decisions[message.transaction_id] = arg
            return arg

        def check_local_transaction(self, message):
            return decisions.get(message.transaction_id, LocalState.ROLLBACK)
    return Listener()


def _topics(cluster, unique_name, n: int = 2) -> list[str]:
    topics = [unique_name(f"g{i}") for i in range(n)]
    for t in topics:
        cluster.create_topic(t, queue_count=4)
        cluster.wait_route(t, 4)
    return topics


# --- the SDK ------------------------------------------------------------------------------

def test_send_in_transaction_with_several_messages_across_shards(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(brokers=2, checker=True, broker_env=FAST)
    topics = _topics(cluster, unique_name)
    decisions: dict[str, LocalState] = {}
    consumers = Consuming(cluster, topics, unique_name("cg"))
    try:
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                      listener=_listener(decisions)) as producer:
            messages = [txmq.Message(topics[i % 2], f"m{i}".encode()) for i in range(6)]
            committed = producer.send_in_transaction(messages, LocalState.COMMIT)
            rolled_back = producer.send_in_transaction(messages[:4], LocalState.ROLLBACK)
        assert isinstance(committed, txmq.GlobalTransactionResult)
        assert committed.state is txmq.TransactionState.COMMITTED
        assert rolled_back.state is txmq.TransactionState.ROLLED_BACK
        gid = committed.global_transaction_id
        assert {h.broker_name for h in committed.messages} == set(SHARDS)  # both shards took part
        assert committed.messages[0].transaction_id == gid == committed.messages[0].global_transaction_id
        ids = {h.message_id for h in committed.messages}
        wait_until(lambda: consumers.of(gid) == ids, 10, message=lambda: f"{consumers.seen}")
        # The rollback: every part decided, nothing of it was delivered.
        wait_until(lambda: all(not _parts_open(cluster, s, rolled_back.global_transaction_id) for s in SHARDS), 10)
        assert consumers.of(rolled_back.global_transaction_id) == set()
        assert not consumers.errors
    finally:
        consumers.stop()
    # The CLI describes G on its coordinator and lists nothing left to do.
    out = json.loads(txmq_cli(cluster, "txn", "global", gid).stdout)
    assert out["coordinator"]["state"] == "committed" and out["open_parts"] == []
    listed = json.loads(txmq_cli(cluster, "txn", "list-global").stdout)
    assert gid not in [g["global_transaction_id"] for g in listed]
    bad = txmq_cli(cluster, "txn", "global", "not-an-id")
    assert bad.returncode == 1 and "not-an-id" in bad.stderr
    # An undecided one (a group nobody answers for) is listed, with its coordinator.
    route = cluster.query_route(topics[0])[0]
    pb = common_pb2.Message(topic=topics[0], body=b"x", queue_id=route.queue_id,
                            message_id=MessageId.new(route.broker_name, route.queue_id).encode(),
                            type=common_pb2.MESSAGE_TYPE_TRANSACTION, producer_group=unique_name("idle"))
    open_g = broker_pb2_grpc.BrokerServiceStub(cluster.channel(route.broker_address)).SendMessage(
        broker_pb2.SendMessageRequest(message=pb, begin_global=True), timeout=5).transaction_id
    listed = json.loads(txmq_cli(cluster, "txn", "list-global").stdout)
    assert [(g["global_transaction_id"], g["coordinator_shard"]) for g in listed] == [(open_g, route.broker_name)]
    # An operator decides it as a whole (its parts, had it any, with it).
    resolved = txmq_cli(cluster, "txn", "resolve", open_g, "--rollback", "--operator", "ops", "--reason", "test")
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(txmq_cli(cluster, "txn", "list-global").stdout) == []


def test_asyncio_producer_sends_a_multi_message_transaction(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(brokers=2, checker=True, broker_env=FAST)
    topics = _topics(cluster, unique_name)
    consumers = Consuming(cluster, topics, unique_name("cg"))

    class Listener(txmq.aio.AsyncTransactionListener):
        async def execute_local_transaction(self, message, arg):
            return LocalState.COMMIT

        async def check_local_transaction(self, message):
            return LocalState.ROLLBACK

    async def run() -> txmq.GlobalTransactionResult:
        async with txmq.aio.AsyncTransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                                     listener=Listener()) as producer:
            return await producer.send_in_transaction(
                [txmq.Message(topics[i % 2], f"a{i}".encode()) for i in range(5)])
    try:
        result = asyncio.run(run())
        assert result.state is txmq.TransactionState.COMMITTED
        ids = {h.message_id for h in result.messages}
        wait_until(lambda: consumers.of(result.global_transaction_id) == ids, 10)
    finally:
        consumers.stop()


# --- the crash matrix ---------------------------------------------------------------------

def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def _parts_open(cluster, shard: str, gid: str) -> int:
    i = SHARDS.index(shard)
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.brokers[i].address))
    found = stub.GetGlobalTransaction(broker_pb2.GetGlobalTransactionRequest(global_transaction_id=gid), timeout=5)
    open_parts = sum(p.state == common_pb2.TRANSACTION_STATE_PREPARED for p in found.parts)
    return open_parts + len(found.participants_pending) + (
        found.HasField("transaction") and found.transaction.state == common_pb2.TRANSACTION_STATE_PREPARED)


@dataclass(frozen=True)
class Case:
    #: The broker that dies and where ('' for none).
    shard: str = ""
    step: str = ""
    #: The producer's decision, and the last step it takes ("end": all of them).
    decision: LocalState = LocalState.COMMIT
    producer_until: str = "end"
    #: The coordinator names the participant (False: the participant must ask).
    listed: bool = True

    @property
    def commits(self) -> bool:
        return self.decision is LocalState.COMMIT and self.producer_until in ("end", "local")

    def __str__(self) -> str:
        return (f"{self.shard or 'producer'}:{self.step or 'stop-after-' + self.producer_until}:"
                f"{self.decision.name}{'' if self.listed else ':unlisted'}")


#: Every fail point once, on the broker that reaches it (coordinator broker-0, participant
#: broker-1), plus a rollback meeting a crashed participant and the producer stopping after
#: each of its steps. Random combinations, many rounds, and replicated shards:
#: ``python -m tests.chaos_global`` (``make chaos``).
#: A listed participant is broker-1, whose parts never ask within a test (its
#: transaction_timeout_seconds is long): only the coordinator's pushes resolve them. An
#: unlisted one is broker-0 (sub-second timeout), asking coordinator broker-1.
CASES = [
    *(Case("broker-0", step) for step in ("begin.before", "begin.after", "part.before", "part.after",
                                          "decide.before", "decide.after", "push.before", "push.after")),
    Case("broker-1", "resolve.before", listed=False),
    *(Case("broker-1", step) for step in ("part.before", "part.after", "apply.before", "apply.after")),
    Case("broker-0", "pull.before", listed=False),
    Case("broker-1", "apply.before", LocalState.ROLLBACK),
    Case(producer_until="begin"), Case(producer_until="parts"),
    Case(producer_until="local"), Case(producer_until="local", decision=LocalState.ROLLBACK),
    Case(producer_until="local", listed=False),
]


def test_the_matrix_crashes_every_step():
    assert {c.step for c in CASES if c.step} == set(failpoints.STEPS)


class Driver:
    """The producer's side of the protocol as raw calls; a call that meets a dead broker
    restarts it (without its fail point) and is repeated with the same ids."""

    def __init__(self, cluster, topics: list[str], group: str, decisions: dict[str, LocalState],
                 in_flight: set[str]) -> None:
        self.cluster = cluster
        #: The first message of the transaction the producer is running now: checks of G are
        #: answered IN_PROGRESS (as the SDK answers them).
        self.in_flight = in_flight
        self.topics = topics
        self.group = group
        self.decisions = decisions
        self.stubs = {s: broker_pb2_grpc.BrokerServiceStub(_channel(cluster.brokers[i].address))
                      for i, s in enumerate(SHARDS)}
        routes = {t: cluster.query_route(t) for t in topics}
        #: (topic, shard) → a queue id of the topic on that shard.
        self.queue = {(t, r.broker_name): r.queue_id for t in topics for r in routes[t]}

    def revive(self, shard: str) -> None:
        """Restarts ``shard`` once its fail point killed it, disarmed."""
        i = SHARDS.index(shard)
        proc = self.cluster.brokers[i]
        wait_until(lambda: not proc.running, 10, message=f"{shard} did not reach its fail point")
        assert proc.returncode == -9, f"{shard} exited {proc.returncode}, not SIGKILL"
        proc.env.pop("TXMQ_FAILPOINT", None)
        self.cluster.restart_broker(i)

    def arm(self, shard: str, step: str) -> None:
        """Restarts ``shard`` with ``step`` armed."""
        i = SHARDS.index(shard)
        self.cluster.brokers[i].env["TXMQ_FAILPOINT"] = step
        self.cluster.restart_broker(i)

    def call(self, shard: str, method: str, request):
        """``method`` on ``shard``, repeated (same request, same ids) while the broker is
        unreachable; a broker its fail point killed is restarted first."""
        proc = self.cluster.brokers[SHARDS.index(shard)]

        def attempt():
            try:
                return getattr(self.stubs[shard], method)(request, timeout=2)
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                if not proc.running:
                    self.revive(shard)
                return None
        return wait_until(attempt, 20, interval=0.05, message=f"{method} on {shard} kept failing")

    def half(self, shard: str, topic: str, body: bytes, mid: str = "", **fields) -> tuple[str, str]:
        mid = mid or MessageId.new(shard, self.queue[(topic, shard)]).encode()
        pb = common_pb2.Message(topic=topic, body=body, message_id=mid, queue_id=self.queue[(topic, shard)],
                                type=common_pb2.MESSAGE_TYPE_TRANSACTION, producer_group=self.group,
                                producer_client_id="matrix", check_immunity_seconds=0.4)
        sent = self.call(shard, "SendMessage", broker_pb2.SendMessageRequest(message=pb, **fields))
        return mid, sent.transaction_id

    def run(self, case: Case, n: int) -> tuple[str, set[str]]:
        """One global transaction: m1 (topic 0) and m4 (topic 1) on broker-0, the
        coordinator; m2 (topic 1) and m3 (topic 0) on broker-1. Returns G and the ids;
        when it returns the producer is gone (or done)."""
        coordinator = SHARDS[0] if case.listed else SHARDS[1]
        mid = MessageId.new(coordinator, self.queue[(self.topics[0], coordinator)]).encode()
        try:
            self.in_flight.add(mid)
            return self._run(case, n, mid)
        finally:
            self.in_flight.clear()

    def _run(self, case: Case, n: int, mid: str) -> tuple[str, set[str]]:
        a, b = self.topics
        coordinator, participant = SHARDS if case.listed else SHARDS[::-1]
        first, gid = self.half(coordinator, a, f"{n}-1".encode(), mid=mid, begin_global=True,
                               global_participants=[participant] if case.listed else [])
        ids = {first}
        if case.producer_until == "begin":
            return gid, ids
        for shard, topic, body in ((participant, b, "2"), (participant, a, "3"), (coordinator, b, "4")):
            ids.add(self.half(shard, topic, f"{n}-{body}".encode(), global_transaction_id=gid)[0])
        if case.producer_until == "parts":
            return gid, ids
        self.decisions[gid] = case.decision  # the local transaction
        if case.producer_until == "local":
            return gid, ids
        self.call(coordinator, "EndTransaction", broker_pb2.EndTransactionRequest(
            transaction_id=gid, resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT
            if case.decision is LocalState.COMMIT else common_pb2.TRANSACTION_RESOLUTION_ROLLBACK,
            source=common_pb2.TRANSACTION_SOURCE_CLIENT, producer_group=self.group))
        return gid, ids


def two_topics(cluster, prefix: str) -> list[str]:
    """``<prefix>-0`` and ``<prefix>-1``, two queues each (one on each shard), routed."""
    topics = [f"{prefix}-{i}" for i in range(2)]
    for topic in topics:
        cluster.create_topic(topic, queue_count=2)
        cluster.wait_route(topic, 2)
    return topics


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    from tests.conftest import _make_cluster
    cluster = _make_cluster(tmp_path_factory.mktemp("global-matrix"), brokers=2, checker=True, broker_env=FAST)
    try:
        # broker-1's parts never ask within a test: as a listed participant only pushes reach it.
        cluster.brokers[1].env["TXMQ_TRANSACTION_TIMEOUT_SECONDS"] = "60"
        cluster.restart_broker(1)
        topics = two_topics(cluster, "global-matrix")
        decisions: dict[str, LocalState] = {}
        in_flight: set[str] = set()

        def check(message):
            if message.message_id in in_flight:  # the producer still runs: as the SDK answers
                return txmq.InProgress(retry_after_seconds=0.2)
            return decisions.get(message.transaction_id, LocalState.ROLLBACK)
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group="matrix-pg", checker=check) as group:
            wait_until(lambda: group.connected_checkers(), 10)
            consumers = Consuming(cluster, topics, "matrix-cg")
            try:
                yield cluster, Driver(cluster, topics, "matrix-pg", decisions, in_flight), consumers
            finally:
                consumers.stop()
    finally:
        cluster.stop()


@pytest.mark.parametrize("case", CASES, ids=str)
def test_crash_at_every_step_is_all_or_nothing(matrix, case: Case):
    cluster, driver, consumers = matrix
    n = CASES.index(case)
    if case.shard:
        driver.arm(case.shard, case.step)
    gid, ids = driver.run(case, n)
    if case.shard and cluster.brokers[SHARDS.index(case.shard)].env.get("TXMQ_FAILPOINT") == case.step:
        driver.revive(case.shard)  # a step after the producer's last call (a push, an apply, a pull)
    assert len(ids) == (1 if case.producer_until == "begin" else 4)
    if case.commits:
        wait_until(lambda: consumers.of(gid) == ids, 15,
                   message=lambda: f"{case}: consumers saw {len(consumers.of(gid))} of {len(ids)}")
    # Decided everywhere, nothing left to push or ask.
    wait_until(lambda: not any(_parts_open(cluster, s, gid) for s in SHARDS), 15,
               message=lambda: f"{case}: still open {[_parts_open(cluster, s, gid) for s in SHARDS]}",
               ignore=(grpc.RpcError,))
    if not case.commits:
        assert consumers.of(gid) == set()
        assert not _committed_in_queues(driver, gid), f"{case}: a rolled-back part is in a queue"
    assert not consumers.errors


def _committed_in_queues(driver: Driver, gid: str) -> list[str]:
    """Messages of G in any queue of the matrix topics (read without a consumer group)."""
    found = []
    for (topic, shard), queue_id in driver.queue.items():
        read = driver.call(shard, "ReadQueue", broker_pb2.ReadQueueRequest(
            topic=topic, queue_id=queue_id, start_offset=0, max_messages=1000))
        found += [m.message.message_id for m in read.messages
                  if m.message.properties.get(GLOBAL_TRANSACTION_PROPERTY) == gid]
    return found


# --- discards ------------------------------------------------------------------------------

#: A discarded G (the group answers every check UNKNOWN; check_max 2): with its participant
#: named or not (then it asks, and the coordinator adds it), with no crash, the participant
#: killed while applying the discard, and the coordinator killed after its discard push was
#: applied (it pushes again). Every time every part is discarded on its own shard, nothing
#: is delivered, and the operator's later commit of G publishes every part on every shard.
DISCARD_CASES = [Case(producer_until="parts"), Case(producer_until="parts", listed=False),
                 Case("broker-1", "apply.before", producer_until="parts"),
                 Case("broker-0", "push.after", producer_until="parts")]


@pytest.fixture(scope="module")
def discarding(tmp_path_factory):
    from tests.conftest import _make_cluster
    cluster = _make_cluster(tmp_path_factory.mktemp("global-discard"), brokers=2, checker=True,
                            broker_env={**FAST, "TXMQ_CHECK_MAX": "2"})
    try:
        topics = two_topics(cluster, "global-discard")
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group="discard-pg",
                                      checker=lambda m: LocalState.UNKNOWN) as group:
            wait_until(lambda: group.connected_checkers(), 10)
            consumers = Consuming(cluster, topics, "discard-cg")
            try:
                yield cluster, Driver(cluster, topics, "discard-pg", {}, set()), consumers
            finally:
                consumers.stop()
    finally:
        cluster.stop()


def _global_states(cluster, gid: str) -> tuple[list[int], list[str]]:
    """The states of G's first message and every part on both shards, and the participants
    still to be told."""
    states, pending = [], []
    for i in range(len(SHARDS)):
        stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.brokers[i].address))
        found = stub.GetGlobalTransaction(broker_pb2.GetGlobalTransactionRequest(global_transaction_id=gid), timeout=5)
        if found.HasField("transaction"):
            states.append(found.transaction.state)
        states += [p.state for p in found.parts]
        pending += list(found.participants_pending)
    return sorted(states), pending


@pytest.mark.parametrize("case", DISCARD_CASES, ids=lambda c: f"{c.shard or 'no-crash'}:{c.step or '-'}:"
                                                               f"{'listed' if c.listed else 'unlisted'}")
def test_a_discard_acts_on_every_part_and_an_operator_commit_publishes_them_all(discarding, case: Case):
    cluster, driver, consumers = discarding
    coordinator = SHARDS[0] if case.listed else SHARDS[1]
    port = cluster.brokers[SHARDS.index(coordinator)].metrics_port
    ended = lambda result: metric(port, "txmq_global_transactions_total", {"result": result})  # noqa: E731
    pushed = lambda: metric(port, "txmq_global_pushes_total", {"result": "acknowledged"})  # noqa: E731
    before = {r: ended(r) for r in ("discarded", "committed")} | {"pushed": pushed()}
    if case.shard:
        driver.arm(case.shard, case.step)
    gid, ids = driver.run(case, 100 + DISCARD_CASES.index(case))
    assert len(ids) == 4
    if case.shard:
        driver.revive(case.shard)  # its fail point met the discard's push
    discarded = sorted([common_pb2.TRANSACTION_STATE_DISCARDED] * 4)
    wait_until(lambda: _global_states(cluster, gid) == (discarded, []), 20,
               message=lambda: f"{case}: {_global_states(cluster, gid)}", ignore=(grpc.RpcError,))
    if not case.shard:  # the counters of a broker that restarted began again
        assert ended("discarded") == before["discarded"] + 1
    out = json.loads(txmq_cli(cluster, "txn", "global", gid).stdout)
    assert [p["state"] for p in out["parts"]] == ["discarded"] * 3 and len(out["open_parts"]) == 3
    resolved = txmq_cli(cluster, "txn", "resolve", gid, "--commit", "--operator", "ops", "--reason", "known")
    assert resolved.returncode == 0, resolved.stderr
    wait_until(lambda: consumers.of(gid) == ids, 15,
               message=lambda: f"{case}: consumers saw {len(consumers.of(gid))} of {len(ids)}")
    committed = sorted([common_pb2.TRANSACTION_STATE_COMMITTED] * 4)
    wait_until(lambda: _global_states(cluster, gid) == (committed, []), 15,
               message=lambda: f"{case}: {_global_states(cluster, gid)}", ignore=(grpc.RpcError,))
    # Every part, decided ones too, with its state and shard.
    out = json.loads(txmq_cli(cluster, "txn", "global", gid).stdout)
    assert sorted((p["broker"], p["state"]) for p in out["parts"]) == sorted(
        [(coordinator, "committed")] + [(s, "committed") for s in SHARDS if s != coordinator] * 2)
    assert out["open_parts"] == [] and out["coordinator"]["state"] == "committed"
    if not case.shard:
        assert ended("committed") == before["committed"] + 1
        # the commit was pushed to the participant (and, when named from the start, the discard too)
        assert pushed() >= before["pushed"] + (2 if case.listed else 1)
    assert not consumers.errors


# --- replicated shards --------------------------------------------------------------------

@pytest.mark.crash
def test_coordinator_leader_killed_after_the_commit_point_a_new_leader_pushes(fresh_cluster_factory, unique_name):
    """Two shards of three replicas (etcd, 1 s leases): every replica runs with
    ``decide.after`` armed, so the coordinator's leader dies right after G's decision batch
    is acknowledged by the in-sync replicas. A follower takes over, finds the decision and
    the push row replicated, and pushes; the producer's repeated EndTransaction is answered
    COMMITTED; consumers of both topics get every message."""
    env = {**FAST, "TXMQ_FAILPOINT": "decide.after"}
    cluster = fresh_cluster_factory(brokers=2, replication_factor=3, checker=True, broker_env=env)
    cluster.wait_leaders()
    topics = _topics(cluster, unique_name)
    consumers = Consuming(cluster, topics, unique_name("cg"))
    decisions: dict[str, LocalState] = {}
    try:
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                      listener=_listener(decisions), max_attempts=8,
                                      send_timeout_seconds=2.0) as producer:
            result = producer.send_in_transaction([txmq.Message(topics[i % 2], f"r{i}".encode()) for i in range(6)],
                                                  LocalState.COMMIT)
        coordinator = txmq.ids.TransactionId.decode(result.global_transaction_id).broker
        assert {h.broker_name for h in result.messages} == set(SHARDS)
        dead = [p for p in cluster.shards[coordinator] if not p.running]
        assert len(dead) == 1 and dead[0].returncode == -9, "the coordinator's leader did not die at the commit point"
        assert result.state in (txmq.TransactionState.COMMITTED, None)
        ids = {h.message_id for h in result.messages}
        wait_until(lambda: consumers.of(result.global_transaction_id) == ids, 30,
                   message=lambda: f"consumers saw {len(consumers.of(result.global_transaction_id))} of {len(ids)}")
    finally:
        consumers.stop()
