"""Crash tests of anchored transactions (issue 29, item 7) with a real PostgreSQL, name
server, broker and checker. The producer under test is a separate process
(``tests/support/anchored_worker.py``) SIGKILLed at each named step by its fail point
(``TXMQ_SDK_FAILPOINT``), or from outside; the broker is SIGKILLed; the database is
restarted; and a check arrives while the local transaction is open in a process the
checker cannot reach.

After each, another instance of the group (the *survivor*: it answers checks from the
decisions table and sweeps it) settles everything, and the invariant is checked:

- a message is delivered if and only if its order row committed;
- each order's message is stored once (one message id per body): nothing beyond
  at-least-once redelivery;
- no transaction of the group is left undecided on the broker;
- the decisions table drains: no COMMIT row is left; fence (ROLLBACK) rows remain, one per
  transaction a check rolled back, until their retention (counted and checked here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

import txmq
from tests.integration.test_checks import BROKER_ENV, CHECKER_ENV, describe
from tests.support.cluster import Cluster
from tests.support.postgres import PostgresInstance, fresh_database
from tests.support.waiting import wait_until
from txmq.anchored import Decisions, schema_sql
from txmq.v1 import admin_pb2, common_pb2

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresInstance]:
    instance = PostgresInstance(max_connections=100)
    try:
        yield instance
    finally:
        instance.stop()


def prepare(instance: PostgresInstance) -> str:
    dsn = fresh_database(instance)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema_sql())
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY, body bytea NOT NULL)")
    return dsn


@pytest.fixture
def dsn(pg: PostgresInstance) -> str:
    return prepare(pg)


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("anchored-crash"), broker_env=BROKER_ENV, checker=True,
                checker_env=CHECKER_ENV)
    try:
        yield c
    finally:
        c.stop()


class Worker:
    """The producer process under test; its events (JSON lines) collected as they come."""

    def __init__(self, cluster: Cluster, dsn: str, topic: str, group: str, *args: str,
                 failpoint: str = "") -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("TXMQ_SDK_FAILPOINT", None)
        if failpoint:
            env["TXMQ_SDK_FAILPOINT"] = failpoint
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.anchored_worker", "--nameserver", cluster.nameserver_address,
             "--dsn", dsn, "--topic", topic, "--group", group, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT, text=True)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if kind in e]

    def wait_exit(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait_exit()

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read() if self.proc.poll() is not None else ""


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    made: list[Worker] = []
    try:
        yield made
    finally:
        for w in made:
            w.kill()


def survivor(cluster: Cluster, group: str, dsn: str) -> txmq.TransactionProducer:
    """Another instance of the group: answers its checks from the table and sweeps it."""
    p = txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, checker_refresh_seconds=0.5,
                                 decisions=Decisions(dsn, in_progress_retry_seconds=0.2, repair_after_seconds=1.0,
                                                     sweep_interval_seconds=0.3))
    wait_until(lambda: len(p.connected_checkers()) == len(cluster.checkers), 10)
    return p


def undecided(cluster: Cluster, group: str) -> list[str]:
    found = []
    for state in (common_pb2.TRANSACTION_STATE_PREPARED, common_pb2.TRANSACTION_STATE_DISCARDED):
        response = cluster.admin_stub().ListTransactions(
            admin_pb2.ListTransactionsRequest(producer_group=group, state=state, limit=1000), timeout=5)
        found += [t.transaction_id for t in response.transactions]
    return found


def decision_rows(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT transaction_key, decision FROM txmq_decisions").fetchall()


def committed_orders(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM orders")}


def settle_and_check(cluster: Cluster, dsn: str, group: str, topic: str, unique_name) -> dict[str, int]:
    """Waits until the survivor decided everything, then checks the invariant; returns the
    counts (committed, fences)."""
    with survivor(cluster, group, dsn):
        wait_until(lambda: not undecided(cluster, group), 60,
                   message=lambda: f"undecided on the broker: {undecided(cluster, group)}")
        wait_until(lambda: all(d == "rollback" for _k, d in decision_rows(dsn)), 30,
                   message=lambda: f"COMMIT rows left: {decision_rows(dsn)}")
    orders = committed_orders(dsn)
    bodies: dict[str, set[str]] = {}
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=unique_name("audit"),
                             subscriptions={topic: "*"}, await_duration_seconds=0.5) as consumer:
        def drained() -> bool:
            batch = consumer.receive(64)
            for m in batch:
                bodies.setdefault(m.body.decode(), set()).add(m.message_id)
                consumer.ack(m)
            return not batch and set(bodies) >= orders

        wait_until(drained, 30, interval=0, message=lambda: f"consumed {sorted(bodies)}, committed {sorted(orders)}")
    assert set(bodies) == orders, f"delivered iff committed: delivered {sorted(bodies)}, committed {sorted(orders)}"
    twice = {b: ids for b, ids in bodies.items() if len(ids) > 1}
    assert not twice, f"stored more than once: {twice}"
    fences = [k for k, d in decision_rows(dsn) if d == "rollback"]
    return {"committed": len(orders), "fences": len(fences)}


# --- the producer killed at each step ----------------------------------------------------

#: fail point → (whether its order commits, whether a fence stays: a check rolled it back)
STEPS = {
    "begin.after": (False, False),   # inside the local transaction, before the half: nothing was sent
    "half.after": (False, True),     # the half stored, the local transaction open: the check fences it
    "commit.before": (False, True),  # every half stored, just before COMMIT
    "commit.after": (True, False),   # committed, no EndTransaction sent: the check commits from the row
    "end.inflight": (True, False),   # during the EndTransaction
    "end.after": (True, False),      # acknowledged, killed before the row's delete: the sweep repairs
}


#: The worker's flags for each kind of caller's connection.
CONNECTIONS = {"psycopg": [], "sqlalchemy": ["--sqlalchemy"], "aio-psycopg": ["--aio"],
               "aio-sqlalchemy": ["--aio", "--sqlalchemy"]}


@pytest.mark.parametrize("connection", list(CONNECTIONS))
@pytest.mark.parametrize("step", list(STEPS))
def test_producer_killed_at_each_step(checked, dsn, unique_name, workers, step, connection):
    """The caller's connection a psycopg ``Connection`` or a SQLAlchemy ``Session`` on
    psycopg (whose BEGIN and COMMIT the SDK sends itself, after flushing the order row), on
    the sync SDK or on ``txmq.aio`` (an ``AsyncConnection``, an ``AsyncSession``)."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 2)
    commits, fenced = STEPS[step]
    flavour = CONNECTIONS[connection]
    worker = Worker(checked, dsn, topic, group, "--orders", "1", "--no-checks", *flavour, failpoint=step)
    workers.append(worker)
    code = worker.wait_exit(60)
    assert code == -9, f"the fail point {step} was not reached (exit {code}): {worker.events} {worker.stderr()}"
    if not commits:
        assert not worker.of("committed")
    counts = settle_and_check(checked, dsn, group, topic, unique_name)
    assert counts == {"committed": int(commits), "fences": int(fenced)}, counts


def test_an_attempt_given_up_on_shares_the_key_and_is_rolled_back(checked, dsn, unique_name, workers):
    """A half stored by an attempt the producer gave up on (a send moved to another shard
    after its answer was lost) carries the same key as the transaction. The producer dies
    after its COMMIT; the checks find the COMMIT row: the half it lists is committed, the
    other one — not listed — rolled back. The order is delivered once."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 2)
    worker = Worker(checked, dsn, topic, group, "--orders", "1", "--no-checks", "--stray", failpoint="commit.after")
    workers.append(worker)
    assert worker.wait_exit(60) == -9, worker.stderr()
    [stray] = worker.of("stray")
    assert settle_and_check(checked, dsn, group, topic, unique_name) == {"committed": 1, "fences": 0}
    assert describe(checked, stray["transaction_id"]).state == common_pb2.TRANSACTION_STATE_ROLLED_BACK


def test_producer_killed_at_random_points_under_load(checked, dsn, unique_name, workers):
    """Two processes commit in a loop, the second on a SQLAlchemy ``Session``; each is
    SIGKILLed from outside (wherever it is)."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 2)
    for i in range(2):
        flavour = ["--sqlalchemy"] if i == 1 else []
        worker = Worker(checked, dsn, topic, group, "--forever", "--prefix", f"w{i}", "--no-checks", *flavour)
        workers.append(worker)
        wait_until(lambda: len(worker.of("committed")) >= 5 + 7 * i, 30,
                   message=lambda: f"worker events: {worker.events[-3:]} {worker.stderr()}")
        worker.kill()
    counts = settle_and_check(checked, dsn, group, topic, unique_name)
    assert counts["committed"] >= sum(len(w.of("committed")) for w in workers)


# --- a check while the local transaction is open where the checker cannot reach ----------

def test_a_check_while_the_transaction_is_open_in_an_unreachable_process(fresh_cluster_factory, dsn, unique_name,
                                                                       workers, tmp_path):
    """The sender answers no checks; the survivor answers from the table: the key is held
    by the open local transaction, so every check is IN_PROGRESS (never ROLLBACK) however
    many come; released, the transaction commits and its message is delivered.

    Each IN_PROGRESS answer comes after the survivor's lock timeout (0.5 s): the checker's
    answer timeout must leave room above that on a loaded machine, or the answer is late,
    the check counts as a timeout and spends budget (with the module's 0.5 s it did, and at
    a load of 24 the transaction was discarded after check_max checks)."""
    checked = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True,
                                    checker_env={**CHECKER_ENV, "TXMQ_ANSWER_TIMEOUT_SECONDS": "3",
                                                 "TXMQ_LEASE_SECONDS": "3"})
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    hold = tmp_path / "release"
    worker = Worker(checked, dsn, topic, group, "--orders", "1", "--no-checks", "--hold", str(hold))
    workers.append(worker)
    with survivor(checked, group, dsn):
        half = wait_until(lambda: worker.of("half"), 30, message=lambda: f"{worker.events} {worker.stderr()}")[0]
        transaction_id = half["transaction_id"]
        wait_until(lambda: describe(checked, transaction_id).checks_answered >= 5, 60,
                   message=lambda: f"{describe(checked, transaction_id)}")
        assert describe(checked, transaction_id).state == common_pb2.TRANSACTION_STATE_PREPARED
        assert decision_rows(dsn) == []  # no fence: the key is held
        hold.touch()
        assert worker.wait_exit(30) == 0, worker.stderr()
    assert [e["committed"] for e in worker.of("committed")] == [half["half"]]
    assert settle_and_check(checked, dsn, group, topic, unique_name) == {"committed": 1, "fences": 0}


def test_killed_while_holding_the_transaction_open_the_check_fences_it(checked, dsn, unique_name, workers,
                                                                      tmp_path):
    """The same, but the process dies while the transaction is open: the server rolls it
    back, the next check inserts the fence and answers ROLLBACK."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    worker = Worker(checked, dsn, topic, group, "--orders", "1", "--no-checks", "--hold", str(tmp_path / "never"))
    workers.append(worker)
    wait_until(lambda: worker.of("half"), 30, message=lambda: f"{worker.events} {worker.stderr()}")
    worker.kill()
    assert settle_and_check(checked, dsn, group, topic, unique_name) == {"committed": 0, "fences": 1}


# --- the broker killed, the database restarted -------------------------------------------

def test_the_broker_killed_under_load(fresh_cluster_factory, dsn, unique_name, workers):
    cluster = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True, checker_env=CHECKER_ENV)
    group, topic = unique_name("g"), unique_name("orders")
    cluster.create_topic(topic, 2)
    worker = Worker(cluster, dsn, topic, group, "--forever", "--no-checks")
    workers.append(worker)
    wait_until(lambda: len(worker.of("committed")) >= 10, 30, message=lambda: f"{worker.events[-3:]}")
    cluster.kill_broker(0)
    errors = len(worker.of("error"))
    wait_until(lambda: len(worker.of("error")) > errors, 30)  # sends fail: those transactions roll back
    cluster.restart_broker(0)
    done = len(worker.of("committed"))
    wait_until(lambda: len(worker.of("committed")) >= done + 10, 60, message=lambda: f"{worker.events[-3:]}")
    worker.kill()
    counts = settle_and_check(cluster, dsn, group, topic, unique_name)
    assert counts["committed"] >= len(worker.of("committed"))


@pytest.mark.parametrize("connection", list(CONNECTIONS))
def test_the_database_restarted_under_load(checked, unique_name, workers, connection):
    instance = PostgresInstance(max_connections=50)
    try:
        dsn = prepare(instance)
        group, topic = unique_name("g"), unique_name("orders")
        checked.create_topic(topic, 2)
        flavour = CONNECTIONS[connection]
        worker = Worker(checked, dsn, topic, group, "--forever", "--no-checks", *flavour)
        workers.append(worker)
        wait_until(lambda: len(worker.of("committed")) >= 10, 30, message=lambda: f"{worker.events[-3:]}")
        instance.restart(immediate=True)  # a crash-like stop: recovery from the WAL at start
        done = len(worker.of("committed"))
        wait_until(lambda: len(worker.of("committed")) >= done + 10, 60,
                   message=lambda: f"{worker.events[-3:]} {worker.stderr()}")
        worker.kill()
        assert worker.of("error"), "the restart interrupted nothing"
        counts = settle_and_check(checked, dsn, group, topic, unique_name)
        assert counts["committed"] >= len(worker.of("committed"))
    finally:
        instance.stop()
