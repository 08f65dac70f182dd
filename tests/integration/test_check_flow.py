"""Checks under load and out of order, end to end (name server, broker and checker
processes; SDK producers and hand-driven CheckTransactionState streams):

- a burst of checks due at once is drained once per transaction, against the producer's
  credit, while a quiet group's checks keep flowing;
- an answer that comes late (after the answer timeout and past the checker's memory of
  the check, after a re-claim, after the checker was SIGKILLed) still decides the
  transaction, once; one that contradicts the decision is refused and changes nothing;
- a producer that stops answering is sent no more checks than its credit, and its checks
  go to another producer of the group.

Every duration is sub-second; waits are deadlines (``wait_until``), never sleeps.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator

import grpc
import pytest

import txmq
from tests.integration.test_checks import (COMMITTED, PREPARED, ROLLED_BACK, Listener, RawStream, describe,
                                           producer, run_cli, wait_state)
from tests.support import presets
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.waiting import wait_until
from txmq.v1 import checker_pb2, common_pb2

LocalState = txmq.LocalTransactionState
CHECKER_ENV = presets.FLOW_CHECKER
ANSWER_TIMEOUT = float(CHECKER_ENV["TXMQ_ANSWER_TIMEOUT_SECONDS"])
LEASE = float(CHECKER_ENV["TXMQ_LEASE_SECONDS"])
#: Checks again soon after an unanswered one (a re-claim while the first answer is late).
FAST_BROKER_ENV = presets.FLOW_BROKER
#: No second check for a minute: an answer after the timeout meets the claim it answers.
SLOW_BROKER_ENV = presets.FLOW_SLOW_BROKER


def _module_cluster(tmp_path_factory: pytest.TempPathFactory, name: str, broker_env: dict[str, str]
                    ) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp(name), broker_env=broker_env, checker=True, checker_env=CHECKER_ENV)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def fast(flow_cluster: Cluster) -> Cluster:
    """The session's ``flow_cluster`` (tests/conftest.py), shared with test_aio_sdk.py."""
    return flow_cluster


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from _module_cluster(tmp_path_factory, "flow-slow", SLOW_BROKER_ENV)


def send_undecided(cluster: Cluster, group: str, topic: str, count: int, **message: Any) -> list[str]:
    """``count`` transactions of ``group`` whose producer never decides them."""
    with producer(cluster, group, Listener(), answer_checks=False) as sender:
        return [sender.send_in_transaction(txmq.Message(topic, b"%d" % i, **message)).transaction_id
                for i in range(count)]


def refused_answers(cluster: Cluster, group: str, reason: str | None = None) -> float:
    labels = {"group": group, **({"reason": reason} if reason else {})}
    return sum(metric_sum(c.metrics_port, "txmq_check_answers_refused_total", labels) for c in cluster.checkers)


def decisions(cluster: Cluster, group: str) -> float:
    return metric_sum(cluster.brokers[0].metrics_port, "txmq_transactions_ended_total", {"group": group})


class Collector:
    """Reads a raw stream in the background: the checks it was sent, and the rest."""

    def __init__(self, raw: RawStream) -> None:
        self.raw = raw
        self.checks: list[checker_pb2.CheckRequest] = []
        self.other: list[checker_pb2.CheckTransactionStateResponse] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for response in self.raw.call:
                if response.WhichOneof("command") == "check":
                    self.checks.append(response.check)
                else:
                    self.other.append(response)
        except grpc.RpcError:
            pass


def late_answer(check: checker_pb2.CheckRequest, result: int) -> dict[str, Any]:
    return dict(answer=checker_pb2.CheckAnswer(
        check_id=check.check_id, result=result, transaction_id=check.transaction_id,
        broker_name=check.broker_name, producer_group=check.message.producer_group))


# ------------------------------------------------------------------------------ a burst

def test_a_burst_is_checked_once_per_transaction_and_a_quiet_group_keeps_its_pace(fast, unique_name):
    burst_group, quiet_group = "aaa-" + unique_name("burst"), "zzz-" + unique_name("quiet")
    topic = unique_name("orders")
    fast.create_topic(topic, 4)
    size, lookup = 1500, 0.005  # the burst producer: 4 threads x 5 ms = 800 checks/s
    burst_calls: list[str] = []
    lock = threading.Lock()

    def burst_check(message: txmq.TransactionMessage) -> LocalState:
        with lock:
            burst_calls.append(message.transaction_id)
        time.sleep(lookup)
        return LocalState.COMMIT

    quiet_lags: list[float] = []

    def quiet_check(message: txmq.TransactionMessage) -> LocalState:
        quiet_lags.append(time.time() - int(message.properties["due_ms"]) / 1000)
        return LocalState.COMMIT

    # The burst: due while no producer of its group is connected (the outage), so all of
    # it is due at once when one connects.
    burst = send_undecided(fast, burst_group, topic, size)
    quiet_producer = producer(fast, quiet_group, Listener(check=quiet_check), check_threads=2)
    quiet: list[str] = []

    def send_quiet() -> None:  # 40 quiet transactions due one by one during the burst
        with producer(fast, quiet_group, Listener(), answer_checks=False) as sender:
            for _ in range(40):
                due_ms = int((time.time() + 0.3) * 1000)
                quiet.append(sender.send_in_transaction(txmq.Message(
                    topic, b"q", check_immunity_seconds=0.3, properties={"due_ms": str(due_ms)})).transaction_id)
                time.sleep(0.025)  # paces the sender, not a wait for a condition

    burst_producer = producer(fast, burst_group, Listener(check=burst_check), check_threads=4)
    sending = threading.Thread(target=send_quiet)
    sending.start()
    try:
        sending.join(30)
        wait_until(lambda: all(describe(fast, t).state == COMMITTED for t in quiet), 30, interval=0.2,
                   message=lambda: f"quiet group: {sum(describe(fast, t).state != COMMITTED for t in quiet)} "
                                   "not committed")
        wait_until(lambda: decisions(fast, burst_group) >= size, 60, interval=0.2,
                   message=lambda: f"burst: {decisions(fast, burst_group):.0f} of {size} decided")
    finally:
        burst_producer.close()
        quiet_producer.close()
    assert len(quiet) == 40 and len(quiet_lags) >= 40
    assert all(describe(fast, t).state == COMMITTED for t in burst[:: size // 50])
    assert set(burst_calls) == set(burst)
    per_transaction = len(burst_calls) / size
    assert per_transaction <= 1.05, f"{len(burst_calls)} checks for {size} transactions"
    assert refused_answers(fast, burst_group) == 0 and refused_answers(fast, quiet_group) == 0
    assert decisions(fast, burst_group) == size  # each decided once
    quiet_lags.sort()
    # Unloaded, a quiet check comes within a claim interval (0.05 s here); while the burst
    # drains (~2 s at its producer's capacity) all but a stray one within a second.
    assert quiet_lags[int(len(quiet_lags) * 0.95) - 1] <= 1.0 and quiet_lags[-1] <= 3.0, quiet_lags[-5:]


# ------------------------------------------------------------------------------ late answers

def test_an_answer_after_the_timeout_and_past_the_checkers_memory_decides(slow, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    slow.create_topic(topic, 1)
    raw = RawStream(slow.checkers[0].address)
    try:
        raw.send(subscribe=checker_pb2.Subscribe(producer_groups=[group], client_id="late", check_credit=2))
        assert raw.next().subscribed.producer_groups == [group]
        collector = Collector(raw)
        (transaction_id,) = send_undecided(slow, group, topic, 1)
        wait_until(lambda: collector.checks, 10, message="no check")
        check = collector.checks[0]
        raw.send(received=checker_pb2.CheckReceived(check_id=check.check_id))

        def forgotten() -> bool:
            # A repeated CheckReceived is harmless while the checker holds the check (late,
            # past its answer timeout), and refused once it forgot it (lease_seconds later).
            raw.send(received=checker_pb2.CheckReceived(check_id=check.check_id))
            return any(r.error.details.get("check_id") for r in collector.other)
        wait_until(forgotten, 10, interval=0.1, message="the checker still holds the check")
        # CheckReceived sent while polling may still be answered: the stream answers in order,
        # so once the refusal of one more is in, so are theirs (else one arriving after
        # ``count`` below is taken for the late answer's refusal).
        refusals = sum(1 for r in collector.other if r.error.details.get("check_id"))
        raw.send(received=checker_pb2.CheckReceived(check_id=check.check_id))
        wait_until(lambda: sum(1 for r in collector.other if r.error.details.get("check_id")) > refusals, 5,
                   message="the last CheckReceived was not refused")
        assert metric_sum(slow.checkers[0].metrics_port, "txmq_checks_total",
                          {"group": group, "result": "timeout"}) == 1
        assert describe(slow, transaction_id).state == PREPARED
        count = len(collector.other)
        raw.send(**late_answer(check, common_pb2.CHECK_RESULT_COMMIT))
        row = wait_state(slow, transaction_id, COMMITTED)
        assert row.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK and row.checks_delivered == 1
        wait_until(lambda: metric_sum(slow.checkers[0].metrics_port, "txmq_check_answers_late_total",
                                      {"group": group}) == 1, 5)
        # The same answer again is accepted as it is; a contradicting one is refused with
        # the transaction's state and changes nothing.
        raw.send(**late_answer(check, common_pb2.CHECK_RESULT_COMMIT))
        raw.send(**late_answer(check, common_pb2.CHECK_RESULT_ROLLBACK))
        wait_until(lambda: len(collector.other) > count, 5, message="no refusal")
        assert len(collector.other) == count + 1
        error = collector.other[-1].error
        assert error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert error.reason == "TRANSACTION_STATE_CONFLICT" and "COMMITTED" in error.message
        assert describe(slow, transaction_id).state == COMMITTED and decisions(slow, group) == 1
        assert refused_answers(slow, group, "conflict") == 1
    finally:
        raw.close()


def test_a_late_commit_after_a_rollback_is_refused_and_changes_nothing(slow, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    slow.create_topic(topic, 1)
    raw = RawStream(slow.checkers[0].address)
    try:
        raw.send(subscribe=checker_pb2.Subscribe(producer_groups=[group], client_id="late", check_credit=1))
        raw.next()
        (transaction_id,) = send_undecided(slow, group, topic, 1)
        check = raw.next().check
        raw.send(received=checker_pb2.CheckReceived(check_id=check.check_id))
        resolved = run_cli(slow, "txn", "resolve", transaction_id, "--rollback", "--reason", "test")
        assert resolved.returncode == 0, resolved.stderr
        assert describe(slow, transaction_id).state == ROLLED_BACK
        # Late: the operator's decision came first (the check may be forgotten by now).
        raw.send(**late_answer(check, common_pb2.CHECK_RESULT_COMMIT))
        error = raw.next().error
        assert error.reason == "TRANSACTION_STATE_CONFLICT" and "ROLLED_BACK" in error.message
        row = describe(slow, transaction_id)
        assert row.state == ROLLED_BACK and row.resolution_source == common_pb2.TRANSACTION_SOURCE_OPERATOR
        assert decisions(slow, group) == 1 and refused_answers(slow, group, "conflict") == 1
    finally:
        raw.close()


def first_check_waits(release: threading.Event) -> Any:
    """The first check of a transaction answers COMMIT once ``release`` is set; any later
    one (a re-claim) answers UNKNOWN at once, so only the late answer can decide."""
    def check(message: txmq.TransactionMessage) -> LocalState:
        if message.attempt == 1:
            release.wait(30)
            return LocalState.COMMIT
        return LocalState.UNKNOWN
    return check


def decided_by_the_late_first_answer(cluster: Cluster, unique_name: Any,
                                     meanwhile: Callable[[str, Listener, threading.Event], None],
                                     broker_metrics: bool = True) -> None:
    """One transaction whose first check answers COMMIT only after ``meanwhile`` (which
    sets the release); it is decided by that late answer, once, with nothing refused."""
    group, topic = unique_name("g"), unique_name("orders")
    cluster.create_topic(topic, 1)
    release = threading.Event()
    listener = Listener(check=first_check_waits(release))
    answering = producer(cluster, group, listener, check_threads=2)
    try:
        (transaction_id,) = send_undecided(cluster, group, topic, 1)
        wait_until(lambda: listener.calls(transaction_id), 10, message="no check")
        meanwhile(transaction_id, listener, release)
        row = wait_state(cluster, transaction_id, COMMITTED, timeout=30)
        assert row.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
        assert refused_answers(cluster, group) == 0
        if broker_metrics:  # a new leader counts from its own start
            assert decisions(cluster, group) == 1
    finally:
        release.set()
        answering.close()


def test_an_answer_after_a_reclaim_decides_once(fast, unique_name):
    def reclaimed(transaction_id: str, listener: Listener, release: threading.Event) -> None:
        # Claimed again while the first check runs: the second check answers UNKNOWN.
        wait_until(lambda: any(a >= 2 for _, a, _ in listener.calls(transaction_id)), 10,
                   message=lambda: f"no second check: {listener.calls(transaction_id)}")
        # Its DELIVERED reaches the broker just after the listener starts.
        row = wait_until(lambda: (r := describe(fast, transaction_id)).checks_delivered >= 2 and r, 5,
                         message=lambda: f"second check not reported: {describe(fast, transaction_id)}")
        assert row.state == PREPARED
        release.set()

    decided_by_the_late_first_answer(fast, unique_name, reclaimed)


def test_an_answer_after_the_checker_was_killed_decides_once(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(broker_env=FAST_BROKER_ENV, checker=True, checker_env=CHECKER_ENV)

    def killed(transaction_id: str, listener: Listener, release: threading.Event) -> None:
        cluster.checkers[0].kill()
        release.set()  # answered while no checker is there: kept by the SDK
        cluster.checkers[0].restart()

    decided_by_the_late_first_answer(cluster, unique_name, killed)


def test_an_answer_across_a_broker_failover_decides_once(fresh_cluster_factory, unique_name):
    # A replicated shard (3 replicas, etcd): the leader dies while the first check runs;
    # its answer reaches the new leader (the checker keeps it across the address change).
    cluster = fresh_cluster_factory(brokers=1, replication_factor=3, broker_env=FAST_BROKER_ENV, checker=True,
                                    checker_env={**CHECKER_ENV, "TXMQ_LEASE_SECONDS": "2.0",
                                                 "TXMQ_ANSWER_TIMEOUT_SECONDS": "1.0"})

    def failed_over(transaction_id: str, listener: Listener, release: threading.Event) -> None:
        old = cluster.wait_leaders()["broker-0"]
        old.kill()
        release.set()  # answered while the shard has no leader
        cluster.wait_leaders(not_on=old)

    decided_by_the_late_first_answer(cluster, unique_name, failed_over, broker_metrics=False)


# ------------------------------------------------------------------------------ a producer that hangs

def test_a_hung_producer_gets_no_more_than_its_credit_and_another_answers(fast, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    fast.create_topic(topic, 2)
    credit = 3
    raw = RawStream(fast.checkers[0].address)
    stuck = threading.Event()
    hung_listener = Listener(check=lambda m: (stuck.wait(30), LocalState.COMMIT)[1])
    hung = producer(fast, group, hung_listener, check_threads=1)  # an SDK producer that hangs
    healthy: txmq.TransactionProducer | None = None
    try:
        raw.send(subscribe=checker_pb2.Subscribe(producer_groups=[group], client_id="hung", check_credit=credit))
        raw.next()
        collector = Collector(raw)
        ids = send_undecided(fast, group, topic, 30)
        # The hung ones take what their credit allows, then nothing more comes to them.
        wait_until(lambda: len(collector.checks) == credit and hung_listener.checks, 10,
                   message=lambda: f"raw stream got {len(collector.checks)} checks")
        healthy = producer(fast, group, Listener(check=lambda m: LocalState.COMMIT))
        wait_until(lambda: all(describe(fast, t).state == COMMITTED for t in ids), 30, interval=0.2,
                   message=lambda: f"{sum(describe(fast, t).state != COMMITTED for t in ids)} not committed")
        assert len(collector.checks) == credit, [c.transaction_id for c in collector.checks]
        assert len(hung_listener.checks) == 1  # one thread, stuck in its first check
        assert decisions(fast, group) == len(ids)
    finally:
        stuck.set()
        raw.close()
        hung.close()
        if healthy is not None:
            healthy.close()
