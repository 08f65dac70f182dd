"""Checks (回查) end to end: name server, broker and checker processes, producers of the SDK
answering on their CheckTransactionState streams, and the ``txmq`` CLI.

Every duration is sub-second (see BROKER_ENV / CHECKER_ENV): the first check is due 0.3 s
after the half message, later ones every 0.2-0.5 s, ``check_max`` is 3, a claim is leased
for 1 s and a check not acknowledged or answered within 0.5 s times out. Waits are
deadlines (``wait_until``), never sleeps. Times compared with the broker's clock use the
local clock: the broker runs on this machine.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest

import txmq
from tests.support import presets
from tests.support.cluster import Cluster
from tests.support.metrics import metric
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, checker_pb2, checker_pb2_grpc, common_pb2

REPO = Path(__file__).resolve().parents[2]
LocalState = txmq.LocalTransactionState

BROKER_ENV = presets.CHECKS_BROKER
CHECK_MAX = int(BROKER_ENV["TXMQ_CHECK_MAX"])
CHECK_INTERVAL = float(BROKER_ENV["TXMQ_CHECK_INTERVAL_SECONDS"])
TIMEOUT = float(BROKER_ENV["TXMQ_TRANSACTION_TIMEOUT_SECONDS"])
CHECKER_ENV = presets.QUICK_CHECKER
LEASE = float(CHECKER_ENV["TXMQ_LEASE_SECONDS"])
PREPARED = common_pb2.TRANSACTION_STATE_PREPARED
COMMITTED = common_pb2.TRANSACTION_STATE_COMMITTED
ROLLED_BACK = common_pb2.TRANSACTION_STATE_ROLLED_BACK
DISCARDED = common_pb2.TRANSACTION_STATE_DISCARDED


@pytest.fixture
def checked(checks_cluster: Cluster) -> Cluster:
    """A name server, a broker and a checker shared by this module's tests and
    test_explicit_transactions.py's (each uses groups and topics of its own): the session's
    ``checks_cluster`` (tests/conftest.py)."""
    return checks_cluster


# ------------------------------------------------------------------------------ helpers

class Listener(txmq.TransactionListener):
    """Execute answers ``execute``; checks answer ``check(message)`` and are recorded with
    the local time they arrived."""

    def __init__(self, check: Callable[[txmq.TransactionMessage], Any] = lambda m: LocalState.COMMIT,
                 execute: LocalState = LocalState.UNKNOWN) -> None:
        self.check = check
        self.execute = execute
        self.lock = threading.Lock()
        self.checks: list[tuple[str, int, float]] = []

    def execute_local_transaction(self, message, arg):
        return self.execute

    def check_local_transaction(self, message):
        with self.lock:
            self.checks.append((message.transaction_id, message.attempt, time.time()))
        return self.check(message)

    def calls(self, transaction_id: str) -> list[tuple[str, int, float]]:
        with self.lock:
            return [c for c in self.checks if c[0] == transaction_id]


def producer(cluster: Cluster, group: str, listener: txmq.TransactionListener, **options: Any
             ) -> txmq.TransactionProducer:
    p = txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=listener,
                                 checker_refresh_seconds=0.5, **options)
    if options.get("answer_checks", True):
        wait_until(lambda: len(p.connected_checkers()) == len(cluster.checkers), 10,
                   message="producer not subscribed with every checker")
    return p


def describe(cluster: Cluster, transaction_id: str) -> common_pb2.Transaction:
    return cluster.admin_stub().DescribeTransaction(
        admin_pb2.DescribeTransactionRequest(transaction_id=transaction_id), timeout=5).transaction


def wait_state(cluster: Cluster, transaction_id: str, state: int, timeout: float = 10.0) -> common_pb2.Transaction:
    return wait_until(lambda: (t := describe(cluster, transaction_id)).state == state and t, timeout,
                      message=lambda: f"{transaction_id} not {common_pb2.TransactionState.Name(state)}: "
                                      f"{describe(cluster, transaction_id)}")


def received_bodies(cluster: Cluster, topic: str, group: str, until: Callable[[list[bytes]], bool],
                    timeout: float = 10.0) -> list[bytes]:
    bodies: list[bytes] = []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as consumer:
        def done() -> bool:
            for m in consumer.receive(32):
                bodies.append(m.body)
                consumer.ack(m)
            return until(bodies)
        wait_until(done, timeout, message=lambda: f"received so far: {bodies}")
    return bodies


def run_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, *args],
                          capture_output=True, text=True, timeout=30, env={**os.environ, "USER": "tester"})


# ------------------------------------------------------------------------------ the seeds' scenarios

ORPHAN_SCRIPT = textwrap.dedent("""
    import sys, threading, txmq

    class Listener(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            print(message.transaction_id, flush=True)
            threading.Event().wait()  # "crash" here: killed before EndTransaction

        def check_local_transaction(self, message):
            return txmq.LocalTransactionState.UNKNOWN

    producer = txmq.TransactionProducer(sys.argv[1], producer_group=sys.argv[2], listener=Listener())
    producer.send_in_transaction(txmq.Message(sys.argv[3], b"orphan"))
""")


def test_orphan_is_committed_by_another_instance_and_consumed_once(checked, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, checked.nameserver_address, group, topic],
                            stdout=subprocess.PIPE, text=True)
    try:
        transaction_id = proc.stdout.readline().strip()
        assert transaction_id, "the producer process printed no transaction id"
        proc.kill()
    finally:
        proc.kill()
        proc.wait(10)
    assert describe(checked, transaction_id).state == PREPARED

    listener = Listener(check=lambda m: LocalState.COMMIT)
    with producer(checked, group, listener):
        row = wait_state(checked, transaction_id, COMMITTED)
        assert row.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
        assert [c[0] for c in listener.checks] == [transaction_id]
        with txmq.Producer(checked.nameserver_address) as plain:
            plain.send(txmq.Message(topic, b"marker"))  # after the commit on a 1-queue topic
    bodies = received_bodies(checked, topic, unique_name("c"), lambda b: b"marker" in b)
    assert bodies.count(b"orphan") == 1
    assert bodies.index(b"orphan") < bodies.index(b"marker")


def test_unknown_from_execute_then_the_check_decides_value_mod_3(checked, unique_name):
    """The seeds' TransactionListenerImpl: execute says UNKNOWN; the check answers from the
    local record: value % 3 == 0 → UNKNOWN (discarded after check_max), 1 → COMMIT, 2 → ROLLBACK."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    local = {}
    answers = {0: LocalState.UNKNOWN, 1: LocalState.COMMIT, 2: LocalState.ROLLBACK}
    listener = Listener(check=lambda m: answers[local[m.transaction_id] % 3])
    with producer(checked, group, listener, answer_checks=False) as sender:
        for value in range(6):
            result = sender.send_in_transaction(txmq.Message(topic, str(value).encode()))
            assert result.local_state is LocalState.UNKNOWN and result.state is txmq.TransactionState.PREPARED
            local[result.transaction_id] = value
    with producer(checked, group, listener):
        rows = {t: wait_state(checked, t, [DISCARDED, COMMITTED, ROLLED_BACK][v % 3]) for t, v in local.items()}
    for t, row in rows.items():
        if local[t] % 3 == 0:
            assert row.checks_delivered == CHECK_MAX and "check budget" in row.discard_reason
            # Each counted check reached the producer; one whose lease ran out before its
            # DELIVERED report (a stall longer than the 1 s lease: seen once in make test, 15 s)
            # is sent again, at least once, without spending the budget twice.
            assert len(listener.calls(t)) >= CHECK_MAX
        else:
            assert row.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
            assert row.checks_delivered == 1 and len(listener.calls(t)) == 1
    bodies = received_bodies(checked, topic, unique_name("c"), lambda b: len(b) >= 2)
    assert sorted(bodies) == [b"1", b"4"]


# ------------------------------------------------------------------------------ budget and waiting

def test_no_producer_connected_spends_nothing_and_the_due_age_grows(checked, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with producer(checked, group, Listener(), answer_checks=False) as sender:
        transaction_id = sender.send_in_transaction(txmq.Message(topic, b"x")).transaction_id
    port = checked.brokers[0].metrics_port

    def due_age():
        return metric(port, "txmq_check_due_oldest_age_seconds", {"group": group}) or 0.0

    first = wait_until(due_age, 5, message="the due-age gauge never became positive")
    wait_until(lambda: due_age() >= 10 * CHECK_INTERVAL + first, 15, interval=0.1,
               message=lambda: f"due age stuck at {due_age()}")
    row = describe(checked, transaction_id)
    assert row.state == PREPARED and row.checks_delivered == 0 and row.checks_answered == 0
    assert metric(port, "txmq_transactions_pending", {"group": group}) == 1

    listener = Listener(check=lambda m: LocalState.COMMIT)
    with producer(checked, group, listener):
        row = wait_state(checked, transaction_id, COMMITTED)
    assert row.checks_delivered == 1 and len(listener.checks) == 1
    wait_until(lambda: due_age() == 0.0, 5, message="due age not back to 0")
    lag = metric(checked.checkers[0].metrics_port, "txmq_check_lag_seconds_count", {"group": group})
    assert lag == 1.0


def test_always_unknown_is_discarded_after_check_max_then_resolved_with_the_cli(checked, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    listener = Listener(check=lambda m: LocalState.UNKNOWN)
    with producer(checked, group, listener) as p:
        transaction_id = p.send_in_transaction(txmq.Message(topic, b"stuck")).transaction_id
        row = wait_state(checked, transaction_id, DISCARDED)
    assert row.checks_delivered == CHECK_MAX
    assert [c[1] for c in listener.calls(transaction_id)] == list(range(1, CHECK_MAX + 1))
    assert "check budget spent" in row.discard_reason

    listed = run_cli(checked, "txn", "list", "--group", group, "--state", "discarded", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [t["transaction_id"] for t in json.loads(listed.stdout)["transactions"]] == [transaction_id]
    table = run_cli(checked, "txn", "list", "--group", group, "--state", "discarded", "--older-than", "0s")
    assert transaction_id in table.stdout and "discarded" in table.stdout
    assert run_cli(checked, "txn", "list", "--group", group, "--older-than", "1h", "--json").stdout.count(
        transaction_id) == 0
    # Before deciding, the operator sees what the message says (a discarded one included).
    shown = run_cli(checked, "txn", "describe", transaction_id)
    assert shown.returncode == 0 and "state" in shown.stdout and "discarded" in shown.stdout
    assert re.search(r"^body\s+stuck$", shown.stdout, re.M), shown.stdout

    resolved = run_cli(checked, "txn", "resolve", transaction_id, "--commit", "--operator", "bob",
                       "--reason", "customer confirmed by phone")
    assert resolved.returncode == 0, resolved.stderr
    described = json.loads(run_cli(checked, "--json", "txn", "describe", transaction_id).stdout)
    assert described["state"] == "committed" and described["resolution_source"] == "operator"
    assert described["operator"] == "bob" and described["reason"] == "customer confirmed by phone"
    assert received_bodies(checked, topic, unique_name("c"), lambda b: b"stuck" in b) == [b"stuck"]

    conflict = run_cli(checked, "txn", "resolve", transaction_id, "--rollback", "--reason", "too late")
    assert conflict.returncode == 1 and conflict.stderr.startswith("txmq: ") and conflict.stdout == ""


def test_immunity_delays_the_first_check_and_none_comes_before_the_timeout(checked, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    listener = Listener(check=lambda m: LocalState.COMMIT)
    with producer(checked, group, listener) as p:
        plain = p.send_in_transaction(txmq.Message(topic, b"plain")).transaction_id
        immune = p.send_in_transaction(txmq.Message(topic, b"immune", check_immunity_seconds=1.5)).transaction_id
        rows = {t: wait_state(checked, t, COMMITTED) for t in (plain, immune)}
    for transaction_id, delay in ((plain, TIMEOUT), (immune, 1.5)):
        (first, *_rest) = listener.calls(transaction_id)
        # 5 ms of slack for the broker's millisecond rounding.
        assert first[2] * 1000 >= rows[transaction_id].prepared_at_ms + delay * 1000 - 5, (transaction_id, first)
    assert listener.calls(immune)[0][2] - listener.calls(plain)[0][2] > 0.5


# ------------------------------------------------------------------------------ IN_PROGRESS and lifetime

def test_in_progress_spends_nothing_and_the_lifetime_cap_discards(fresh_cluster_factory, unique_name):
    lifetime, retry_after = 3.0, 0.4
    # The interval (1 s) is longer than the retry-after: only the IN_PROGRESS answers pace the checks.
    cluster = fresh_cluster_factory(broker_env={**BROKER_ENV, "TXMQ_MAX_TRANSACTION_LIFETIME_SECONDS": str(lifetime),
                                                "TXMQ_CHECK_INTERVAL_SECONDS": "1.0",
                                                "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "1.0"},
                                    checker=True, checker_env=CHECKER_ENV)
    group, topic = unique_name("g"), unique_name("orders")
    cluster.create_topic(topic, 1)
    listener = Listener(check=lambda m: txmq.InProgress(retry_after_seconds=retry_after))
    with producer(cluster, group, listener) as p:
        transaction_id = p.send_in_transaction(txmq.Message(topic, b"slow")).transaction_id
        wait_until(lambda: len(listener.calls(transaction_id)) > CHECK_MAX, 10,
                   message="IN_PROGRESS answers spent the budget")
        row = describe(cluster, transaction_id)
        # 1 between a check's DELIVERED and its IN_PROGRESS answer, which refunds it.
        assert row.state == PREPARED and row.checks_delivered <= 1
        row = wait_state(cluster, transaction_id, DISCARDED, timeout=lifetime + 5)
    calls = listener.calls(transaction_id)
    assert "max_transaction_lifetime_seconds" in row.discard_reason
    assert row.discarded_at_ms >= row.prepared_at_ms + lifetime * 1000
    assert all(attempt == 1 for _, attempt, _ in calls)  # nothing spent: always the first check
    gaps = [b[2] - a[2] for a, b in zip(calls, calls[1:])]
    assert min(gaps) >= retry_after - 0.05, gaps  # each answer deferred the next check


# ------------------------------------------------------------------------------ replicas and crashes

def test_two_checkers_and_one_killed_mid_claim(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True, checker_env=CHECKER_ENV)
    cluster.start_checker(CHECKER_ENV)
    group, topic = unique_name("g"), unique_name("orders")
    cluster.create_topic(topic, 2)
    count = 300
    listener = Listener(check=lambda m: LocalState.COMMIT)
    with producer(cluster, group, listener, answer_checks=False) as sender:
        # First checks spread over 2 s, so checks are flowing when the checker dies.
        ids = [sender.send_in_transaction(txmq.Message(
            topic, b"%d" % i, check_immunity_seconds=1.0 + (i % 100) * 0.02)).transaction_id for i in range(count)]
    answering = [producer(cluster, group, listener, check_threads=2) for _ in range(2)]
    try:
        wait_until(lambda: len(listener.checks) >= count // 4, 15, message="checks did not start")
        killed_at = time.time()
        cluster.checkers[0].kill()
        wait_until(lambda: all(describe(cluster, t).state == COMMITTED for t in ids), 30, interval=0.2,
                   message=lambda: f"{sum(describe(cluster, t).state != COMMITTED for t in ids)} not committed")
    finally:
        for p in answering:
            p.close()
    calls: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for transaction_id, attempt, at in listener.checks:
        calls[(transaction_id, attempt)].append(at)
    assert {t for t, _ in calls} == set(ids)  # none lost
    for key, times in calls.items():
        if len(times) > 1:
            # Only a check the killed checker had sent and not reported may come again, once
            # its lease has ended: a new due time, never two at once.
            assert len(times) == 2, (key, times)
            assert times[0] <= killed_at + 0.05 and times[1] >= times[0] + LEASE - 0.3, (key, times, killed_at)
    repeated = sum(len(t) > 1 for t in calls.values())
    assert repeated <= count // 2


# ------------------------------------------------------------------------------ bad input on the stream

class RawStream:
    """A CheckTransactionState stream driven by hand."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.requests: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def iterate() -> Iterator[checker_pb2.CheckTransactionStateRequest]:
            while (item := self.requests.get()) is not None:
                yield item
        self.call = checker_pb2_grpc.CheckerServiceStub(self.channel).CheckTransactionState(iterate(), timeout=30)

    def send(self, **command: Any) -> None:
        self.requests.put(checker_pb2.CheckTransactionStateRequest(**command))

    def next(self) -> checker_pb2.CheckTransactionStateResponse:
        return next(self.call)

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


def test_bad_input_on_the_stream_is_refused_and_changes_nothing(fresh_cluster_factory, unique_name):
    # Long timeouts: the check must stay outstanding while the bad requests are refused.
    checked = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True, checker_env={
        **CHECKER_ENV, "TXMQ_ANSWER_TIMEOUT_SECONDS": "10", "TXMQ_LEASE_SECONDS": "20"})
    address = checked.checkers[0].address
    # Not a Subscribe first, or a bad Subscribe: the stream ends with INVALID_ARGUMENT.
    for first in (dict(received=checker_pb2.CheckReceived(check_id="x")),
                  dict(),
                  dict(subscribe=checker_pb2.Subscribe(producer_groups=["bad group"], client_id="c")),
                  dict(subscribe=checker_pb2.Subscribe(producer_groups=["g"], client_id=""))):
        raw = RawStream(address)
        try:
            raw.send(**first)
            with pytest.raises(grpc.RpcError) as info:
                raw.next()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            raw.close()

    group, other_group, topic = unique_name("g"), unique_name("other"), unique_name("orders")
    checked.create_topic(topic, 1)
    mine, other = RawStream(address), RawStream(address)
    try:
        mine.send(subscribe=checker_pb2.Subscribe(producer_groups=[group], client_id="raw-mine"))
        other.send(subscribe=checker_pb2.Subscribe(producer_groups=[other_group], client_id="raw-other"))
        assert mine.next().subscribed.producer_groups == [group]
        assert other.next().subscribed.checker_name == checked.checkers[0].name

        with producer(checked, group, Listener(), answer_checks=False) as sender:
            transaction_id = sender.send_in_transaction(txmq.Message(topic, b"x")).transaction_id
        check = mine.next().check
        assert check.transaction_id == transaction_id and check.attempt == 1
        assert check.message.topic == topic and check.message.body == b"x"

        def refused(stream: RawStream, reason: str = "INVALID_FIELD", **command: Any) -> common_pb2.EntryStatus:
            stream.send(**command)
            response = stream.next()
            assert response.WhichOneof("command") == "error", response
            assert response.error.reason == reason and response.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            return response.error

        # A check sent to another stream (another group), unknown ids, garbage after subscribe.
        refused(other, answer=checker_pb2.CheckAnswer(check_id=check.check_id, result=common_pb2.CHECK_RESULT_COMMIT))
        refused(other, received=checker_pb2.CheckReceived(check_id=check.check_id))
        error = refused(mine, answer=checker_pb2.CheckAnswer(check_id="never-sent", result=common_pb2.CHECK_RESULT_COMMIT))
        assert "never-sent" in error.details["check_id"]
        refused(mine, received=checker_pb2.CheckReceived(check_id="never-sent"))
        refused(mine, answer=checker_pb2.CheckAnswer(check_id=check.check_id))  # no result
        refused(mine, subscribe=checker_pb2.Subscribe(producer_groups=[group], client_id="again"))
        refused(mine)  # no command at all
        row = describe(checked, transaction_id)
        assert row.state == PREPARED and row.checks_delivered == 0 and row.checks_answered == 0

        # The stream still works: the real answer decides.
        mine.send(received=checker_pb2.CheckReceived(check_id=check.check_id))
        mine.send(answer=checker_pb2.CheckAnswer(check_id=check.check_id, result=common_pb2.CHECK_RESULT_ROLLBACK))
        row = wait_state(checked, transaction_id, ROLLED_BACK)
        assert row.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK and row.checks_delivered == 1
        # Answering it again: no longer outstanding.
        refused(mine, answer=checker_pb2.CheckAnswer(check_id=check.check_id, result=common_pb2.CHECK_RESULT_COMMIT))
        assert describe(checked, transaction_id).state == ROLLED_BACK
    finally:
        mine.close()
        other.close()


def test_cli_lists_brokers_checkers_and_topics(checked, unique_name):
    topic = unique_name("t")
    created = run_cli(checked, "topic", "create", topic, "--queues", "3")
    assert created.returncode == 0, created.stderr
    topics = json.loads(run_cli(checked, "topic", "list", "--json").stdout)["topics"]
    assert {"topic": topic, "type": "NORMAL", "queues": 3, "brokers": {"broker-0": 3}} in topics
    assert run_cli(checked, "topic", "create", topic, "--queues", "3").returncode == 1
    brokers = json.loads(run_cli(checked, "broker", "list", "--json").stdout)["brokers"]
    assert [b["name"] for b in brokers] == ["broker-0"]
    checkers = run_cli(checked, "checker", "list")
    assert checkers.returncode == 0 and "checker-0" in checkers.stdout
    missing = run_cli(checked, "txn", "describe", "not-an-id")
    assert missing.returncode == 1 and missing.stderr.startswith("txmq: ")
