"""The explicit transaction form (``tx = producer.begin_transaction(); producer.send(m, tx);
tx.commit()``) against a live name server, broker and checker: commit, rollback, the
context manager, a check while the transaction is open here (IN_PROGRESS, the checker not
asked), and a process killed mid-transaction whose checks another instance answers from
the key it recorded in its local database."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import txmq
import txmq.aio
from tests.integration.test_checks import (COMMITTED, PREPARED, ROLLED_BACK, describe,
                                           received_bodies, wait_state)
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until

LocalState = txmq.LocalTransactionState


@pytest.fixture
def checked(checks_cluster: Cluster) -> Cluster:
    """test_checks.py's shared cluster (``checks_cluster``, tests/conftest.py)."""
    return checks_cluster


def explicit_producer(cluster: Cluster, group: str, checker) -> txmq.TransactionProducer:
    p = txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, checker=checker,
                                 checker_refresh_seconds=0.5, open_transaction_retry_seconds=0.2)
    wait_until(lambda: len(p.connected_checkers()) == len(cluster.checkers), 10)
    return p


def test_commit_rollback_and_the_context_manager(checked, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with explicit_producer(checked, group, lambda m: LocalState.ROLLBACK) as producer:
        tx = producer.begin_transaction(key="order-1")
        producer.send(txmq.Message(topic, b"a1"), tx)
        producer.send(txmq.Message(topic, b"a2"), tx)
        assert all(describe(checked, m.transaction_id).state == PREPARED for m in tx.messages)
        results = tx.commit()
        assert [r.state for r in results] == [txmq.TransactionState.COMMITTED] * 2
        with pytest.raises(txmq.TransactionStateError):
            producer.send(txmq.Message(topic, b"late"), tx)

        rolled = producer.begin_transaction()
        producer.send(txmq.Message(topic, b"never"), rolled)
        assert [r.state for r in rolled.rollback()] == [txmq.TransactionState.ROLLED_BACK]

        with pytest.raises(RuntimeError):
            with producer.begin_transaction() as failed:
                producer.send(txmq.Message(topic, b"never either"), failed)
                raise RuntimeError("the local transaction failed")
        wait_state(checked, failed.messages[0].transaction_id, ROLLED_BACK)
        with producer.begin_transaction() as ok:
            producer.send(txmq.Message(topic, b"b1"), ok)
        wait_state(checked, ok.messages[0].transaction_id, COMMITTED)
        with txmq.Producer(checked.nameserver_address) as plain:
            plain.send(txmq.Message(topic, b"marker"))
    bodies = received_bodies(checked, topic, unique_name("c"), lambda b: b"marker" in b)
    assert bodies == [b"a1", b"a2", b"b1", b"marker"]


def test_a_check_of_an_open_transaction_is_in_progress_without_asking_the_checker(checked, unique_name):
    group, topic = unique_name("g"), unique_name("slow")
    asked: list[str] = []
    with explicit_producer(checked, group, lambda m: asked.append(m.transaction_id) or LocalState.ROLLBACK) as p:
        tx = p.begin_transaction()
        p.send(txmq.Message(topic, b"slow"), tx)
        tid = tx.messages[0].transaction_id
        # Checks come every ~0.3 s (first after 0.3 s) and are answered IN_PROGRESS here,
        # which spends none of the budget (check_max 3): well past it the transaction is open.
        wait_until(lambda: describe(checked, tid).checks_answered >= 4, timeout=15)
        row = describe(checked, tid)
        assert row.state == PREPARED and asked == []
        tx.commit()
    assert describe(checked, tid).state == COMMITTED


class _Slow(txmq.TransactionListener):
    """A local transaction that outlasts several checks, then commits."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.asked: list[str] = []

    def execute_local_transaction(self, message, arg):
        deadline = time.monotonic() + 15
        while describe(self.cluster, message.transaction_id).checks_answered < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # (decided by a check meanwhile: it commits anyway, late)
        return LocalState.COMMIT

    def check_local_transaction(self, message):  # finds nothing committed yet
        self.asked.append(message.transaction_id)
        return LocalState.ROLLBACK


class _AsyncSlow(txmq.aio.AsyncTransactionListener):
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.asked: list[str] = []

    async def execute_local_transaction(self, message, arg):
        tid, deadline = message.transaction_id, time.monotonic() + 15
        while describe(self.cluster, tid).checks_answered < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # (decided by a check meanwhile: it commits anyway, late)
        return LocalState.COMMIT

    async def check_local_transaction(self, message):
        self.asked.append(message.transaction_id)
        return LocalState.ROLLBACK


def test_a_check_while_the_listeners_local_transaction_runs_is_in_progress_without_asking_it(checked, unique_name):
    """Checks of a half whose ``execute_local_transaction`` still runs in this process (it
    outlasts the first check) are answered IN_PROGRESS here, never asked of the listener's
    ``check_local_transaction``, whose lookup would find nothing committed yet and roll
    back a transaction that then commits."""
    group, topic = unique_name("g"), unique_name("slow")
    listener = _Slow(checked)
    with txmq.TransactionProducer(checked.nameserver_address, producer_group=group, listener=listener,
                                  checker_refresh_seconds=0.5, open_transaction_retry_seconds=0.2) as p:
        wait_until(lambda: len(p.connected_checkers()) == len(checked.checkers), 10)
        result = p.send_in_transaction(txmq.Message(topic, b"slow"))
    assert (result.state, listener.asked) == (txmq.TransactionState.COMMITTED, [])
    assert describe(checked, result.transaction_id).state == COMMITTED


def test_the_asyncio_listeners_running_local_transaction_is_in_progress_too(checked, unique_name):
    group, topic = unique_name("g"), unique_name("slow-aio")
    listener = _AsyncSlow(checked)

    async def main() -> txmq.TransactionResult:
        async with txmq.aio.AsyncTransactionProducer(checked.nameserver_address, producer_group=group,
                                                     listener=listener, checker_refresh_seconds=0.5,
                                                     open_transaction_retry_seconds=0.2) as p:
            while len(p.connected_checkers()) != len(checked.checkers):
                await asyncio.sleep(0.05)
            return await p.send_in_transaction(txmq.Message(topic, b"slow"))

    result = asyncio.run(main())
    assert (result.state, listener.asked) == (txmq.TransactionState.COMMITTED, [])


CRASHING = textwrap.dedent("""
    import sqlite3, sys, threading, txmq
    ns, group, topic, db_path = sys.argv[1:5]
    db = sqlite3.connect(db_path)
    producer = txmq.TransactionProducer(ns, producer_group=group, checker=lambda m: txmq.LocalTransactionState.UNKNOWN)
    done = producer.begin_transaction(key="order-done")
    producer.send(txmq.Message(topic, b"done"), done)
    with db:  # the local transaction commits, with the key...
        db.execute("insert into orders(key) values ('order-done')")
    half = producer.begin_transaction(key="order-half")
    producer.send(txmq.Message(topic, b"half"), half)
    print(done.messages[0].transaction_id, half.messages[0].transaction_id, flush=True)
    threading.Event().wait()  # ...and the process dies before tx.commit(); "half" never reached its database
""")


def test_a_process_killed_mid_transaction_is_decided_by_its_recorded_key(checked, unique_name, tmp_path: Path):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    db_path = tmp_path / "orders.db"
    with sqlite3.connect(db_path) as db:
        db.execute("create table orders(key text primary key)")
    proc = subprocess.Popen([sys.executable, "-c", CRASHING, checked.nameserver_address, group, topic, str(db_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert len(line) == 2, "the producer printed no transaction ids"
    finally:
        proc.kill()
        proc.wait(10)
    done_id, half_id = line
    lock = threading.Lock()

    def recorded(message: txmq.TransactionMessage) -> LocalState:
        with lock, sqlite3.connect(db_path) as db:
            found = db.execute("select 1 from orders where key = ?", (message.transaction_key,)).fetchone()
        return LocalState.COMMIT if found else LocalState.ROLLBACK

    started = time.monotonic()
    with explicit_producer(checked, group, recorded):
        wait_state(checked, done_id, COMMITTED, timeout=15)
        wait_state(checked, half_id, ROLLED_BACK, timeout=15)
    assert time.monotonic() - started < 15
    with txmq.Producer(checked.nameserver_address) as plain:
        plain.send(txmq.Message(topic, b"marker"))
    assert received_bodies(checked, topic, unique_name("c"), lambda b: b"marker" in b) == [b"done", b"marker"]


def test_send_in_transaction_needs_a_listener_and_a_producer_needs_a_checker(checked, unique_name):
    with pytest.raises(txmq.InvalidFieldError, match="listener"):
        txmq.TransactionProducer(checked.nameserver_address, producer_group=unique_name("g"))
    with txmq.TransactionProducer(checked.nameserver_address, producer_group=unique_name("g"),
                                  checker=lambda m: LocalState.COMMIT, answer_checks=False) as p:
        with pytest.raises(txmq.InvalidFieldError, match="begin_transaction"):
            p.send_in_transaction(txmq.Message(unique_name("t"), b"x"))
