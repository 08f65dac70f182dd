"""Anchored transactions (``producer.transaction(conn)``) against a real PostgreSQL, name
server, broker and checker, sync flavour on psycopg 3: the commit path (decided by the
database commit, acknowledged in the background, delivered once, the decision row gone),
rollback by an exception, a half that fails, a check while the transaction is open in an
instance the checker cannot reach (IN_PROGRESS, then COMMIT), a COMMIT row left behind
repaired by the sweeper, and the refusals (a connection already in a transaction). A lost
EndTransaction repaired by the check: test_anchored_crash.py (the producer killed after its
COMMIT).

Checks use the sub-second timings of ``tests/integration/test_checks.py``."""

from __future__ import annotations

import time
from typing import Iterator

import psycopg
import pytest

import txmq
import txmq._produce_stream
from tests.integration.test_checks import BROKER_ENV, CHECKER_ENV, COMMITTED, ROLLED_BACK, describe, wait_state
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.postgres import PostgresInstance, fresh_database
from tests.support.waiting import wait_until
from txmq.anchored import Decisions, schema_sql

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresInstance]:
    instance = PostgresInstance(max_connections=100)
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def dsn(pg: PostgresInstance) -> str:
    """A database of the test's own with the decisions table and an orders table."""
    dsn = fresh_database(pg)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema_sql())
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY, body bytea NOT NULL)")
    return dsn


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("anchored"), broker_env=BROKER_ENV, checker=True, checker_env=CHECKER_ENV)
    try:
        yield c
    finally:
        c.stop()


def anchored_producer(cluster: Cluster, group: str, dsn: str, **options) -> txmq.TransactionProducer:
    answer_checks = options.pop("answer_checks", True)
    p = txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, checker_refresh_seconds=0.5,
                                 answer_checks=answer_checks,
                                 decisions=Decisions(dsn, in_progress_retry_seconds=0.2, **options))
    if answer_checks:
        wait_until(lambda: len(p.connected_checkers()) == len(cluster.checkers), 10)
    return p


def rows(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT decision, transaction_ids FROM txmq_decisions ORDER BY decided_at").fetchall()


def orders(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id")]


def consume(cluster: Cluster, topic: str, group: str, want: int, timeout: float = 15.0) -> list[txmq.ReceivedMessage]:
    got: list[txmq.ReceivedMessage] = []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.3) as consumer:
        def done() -> bool:
            batch = consumer.receive(32)
            for m in batch:
                consumer.ack(m)
            got.extend(batch)
            return len(got) >= want
        wait_until(done, timeout, interval=0, message=lambda: f"{len(got)} of {want} consumed")
        extra = consumer.receive(32, ) if want else []
        got.extend(extra)
    return got


class WireTrace:
    """libpq's own trace of a psycopg connection (every protocol message it sends and
    receives), read back as the statements the client sent and its round trips (one per
    ReadyForQuery the server answered)."""

    def __init__(self, conn, path) -> None:
        from psycopg import pq

        self.conn, self.path = conn, path
        self.file = open(path, "w")
        conn.pgconn.trace(self.file.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def stop(self) -> tuple[list[str], int]:
        """(the first three words of every statement sent, in order; round trips)."""
        self.conn.pgconn.untrace()
        self.file.close()
        statements, round_trips = [], 0
        for line in open(self.path):
            direction, _length, kind, *rest = line.rstrip("\n").split("\t")
            if direction == "F" and kind in ("Query", "Parse"):
                # Query "SQL" / Parse "name" "SQL" ...: the SQL is the last quoted string that starts it.
                sql = rest[0].split('"')[1 if kind == "Query" else 3]
                statements.append(" ".join(sql.split()[:3]))
            elif direction == "B" and kind == "ReadyForQuery":
                round_trips += 1
        return statements, round_trips


#: What an anchored transaction with one statement of the caller's sends on the caller's
#: connection (the first words of each), autocommit or not: the SDK begins the transaction
#: itself with the decision row's INSERT (psycopg, on a connection that is not autocommit,
#: would send its BEGIN alone first), the bounds ride in that INSERT (no SET of their own),
#: nothing is read back, and the UPDATE recording the halves (in a WITH that fails unless the
#: row is this transaction's own) travels with the COMMIT.
ANCHORED_STATEMENTS = ["BEGIN; INSERT INTO", "INSERT INTO orders", "WITH mine AS"]
#: One round trip each, the last one the UPDATE and the COMMIT together (a pipeline made it
#: two: its second Sync waits for a second answer). The outbox's transaction makes three.
ANCHORED_ROUND_TRIPS = 3


@pytest.mark.parametrize("autocommit", [False, True], ids=["transactional", "autocommit"])
def test_an_anchored_transaction_costs_the_callers_connection_three_round_trips(
        checked, dsn, unique_name, tmp_path, autocommit):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, \
            psycopg.connect(dsn, autocommit=autocommit) as conn:
        trace = WireTrace(conn, tmp_path / "wire.txt")
        with producer.transaction(conn) as tx:
            tx.send(txmq.Message(topic, b"counted"))
            conn.execute("INSERT INTO orders VALUES (%s, 'x')", (f"c-{autocommit}",))
        statements, round_trips = trace.stop()
        assert tx.result.wait_acknowledged(10), tx.result.end_error
    assert orders(dsn).count(f"c-{autocommit}") == 1  # it committed
    assert statements == ANCHORED_STATEMENTS
    assert round_trips == ANCHORED_ROUND_TRIPS


#: A connection's transaction settings, as psycopg's own BEGIN would apply them, and what
#: the server then reports inside the transaction.
TRANSACTION_SETTINGS = {"isolation_level": psycopg.IsolationLevel.SERIALIZABLE, "read_only": False,
                        "deferrable": True}
TRANSACTION_SHOWN = ("serializable", "off", "on")
SHOW_TRANSACTION = ("SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only'), "
                    "current_setting('transaction_deferrable')")


@pytest.mark.parametrize("autocommit", [False, True], ids=["transactional", "autocommit"])
def test_an_anchored_transaction_begins_with_the_connections_isolation_level(checked, dsn, unique_name, autocommit):
    """The SDK sends the BEGIN itself (with the decision row): it is the one psycopg would
    send, with the connection's isolation level, read-only and deferrable settings."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, \
            psycopg.connect(dsn, autocommit=autocommit) as conn:
        for name, value in TRANSACTION_SETTINGS.items():
            setattr(conn, name, value)
        with producer.transaction(conn) as tx:
            tx.send(txmq.Message(topic, b"isolated"))
            shown = conn.execute(SHOW_TRANSACTION).fetchone()
            conn.execute("INSERT INTO orders VALUES (%s, 'x')", (f"iso-{autocommit}",))
        assert tx.result.wait_acknowledged(10), tx.result.end_error
    assert shown == TRANSACTION_SHOWN
    assert orders(dsn).count(f"iso-{autocommit}") == 1


def test_an_anchored_transaction_on_a_connection_in_pipeline_mode_commits(checked, dsn, unique_name):
    """In pipeline mode a query holds one statement: the UPDATE recording the halves and the
    COMMIT go as two (one simple query with both is refused there), and the SDK does not
    begin the transaction past psycopg's queue."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        with conn.pipeline():
            with producer.transaction(conn) as tx:
                tx.send(txmq.Message(topic, b"piped"))
                conn.execute("INSERT INTO orders VALUES ('piped', 'x')")
        assert tx.result.wait_acknowledged(10), tx.result.end_error
    assert orders(dsn).count("piped") == 1
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"piped"]
    wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_transaction_ended_inside_the_block_is_refused_and_its_messages_follow_it(checked, dsn, unique_name,
                                                                                    ending):
    """The caller commits (or rolls back) on the connection inside the block, against the
    rules: the block raises, and the messages still agree with the database, because the
    decision row was the transaction's first statement: committed with the caller's work
    (the checks answer COMMIT from it) or gone with it (the checks fence ROLLBACK)."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    order = f"inside-{ending}"
    with anchored_producer(checked, group, dsn) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(txmq.InvalidFieldError, match="ended inside the anchored block"):
            with producer.transaction(conn) as tx:
                half = tx.send(txmq.Message(topic, order.encode())).result(10)
                conn.execute("INSERT INTO orders VALUES (%s, 'x')", (order,))
                conn.commit() if ending == "commit" else conn.rollback()
        committed = ending == "commit"
        wait_state(checked, half.transaction_id, COMMITTED if committed else ROLLED_BACK, timeout=20)
        assert (order in orders(dsn)) is committed
    if committed:
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")


def end_calls(cluster: Cluster) -> tuple[float, float]:
    """(unary EndTransaction calls, Produce stream entries) the broker has answered so far."""
    port = cluster.brokers[0].metrics_port
    return (metric_sum(port, "txmq_rpc_duration_seconds_count", {"method": "EndTransaction"}),
            metric_sum(port, "txmq_produce_entries_total"))


def test_the_end_of_an_anchored_transaction_rides_the_produce_stream(checked, dsn, unique_name):
    """A caller alone sends its half as the unary SendMessage or on the stream, but the end
    no caller waits for goes on the Produce stream: a stream entry costs the broker less CPU
    than a unary call (bench.ends)."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        unary_before, entries_before = end_calls(checked)
        for i in range(3):
            with producer.transaction(conn) as tx:
                tx.send(txmq.Message(topic, b"streamed"))
                conn.execute("INSERT INTO orders VALUES (%s, 'x')", (f"s{i}",))
            assert tx.result.wait_acknowledged(10), tx.result.end_error
        unary_after, entries_after = end_calls(checked)
    assert unary_after == unary_before
    assert entries_after - entries_before >= 3  # the three ends (and any half that took the stream)


def test_a_caller_alone_sends_its_half_in_the_message_of_its_last_end(checked, dsn, unique_name, monkeypatch):
    """Back-to-back anchored transactions of one caller: the previous end (a hint nobody
    waits on) lingers unsent for a moment on the Produce stream and the next half shares
    its stream message: one gRPC message and one WAL sync for both (docs/performance.md).
    Before, a half shared it only when the end's hand-off to the sending thread was slower
    than the caller (1.25-1.9 messages per transaction)."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    n = 10
    port = checked.brokers[0].metrics_port
    # Counted, not timed: a linger long enough that no load runs it out between an end and
    # the next half (3 ms by default; the last end waits it out, nobody waiting on it).
    monkeypatch.setattr(txmq._produce_stream, "HINT_LINGER_SECONDS", 1.0)

    def messages() -> float:
        return (metric_sum(port, "txmq_rpc_duration_seconds_count", {"method": "SendMessage"})
                + metric_sum(port, "txmq_produce_stream_messages_total", {"direction": "in"}))

    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        before = messages()
        results = []
        for i in range(n):
            with producer.transaction(conn) as tx:
                tx.send(txmq.Message(topic, b"shared"))
                conn.execute("INSERT INTO orders VALUES (%s, 'x')", (f"h{i}",))
            results.append(tx.result)
        for result in results:
            assert result.wait_acknowledged(10), result.end_error
        sent = messages() - before
    # The first half alone, each later one with the end before it, the last end alone:
    # n + 1 messages (the tree before sent 1.9n).
    assert sent <= n + 1, f"{sent:.0f} messages for {n} anchored transactions"


def test_commit_is_decided_by_the_database_and_acknowledged_in_the_background(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 2)
    with anchored_producer(checked, group, dsn) as producer, psycopg.connect(dsn) as conn:
        with producer.transaction(conn) as tx:
            sent = tx.send(txmq.Message(topic, b"order-1"))
            conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
        result = tx.result
        assert result.state is txmq.TransactionState.COMMITTED
        assert [m.body for m in result.messages] == [b"order-1"]
        assert sent.result().transaction_id == result.messages[0].transaction_id
        assert result.messages[0].transaction_key == tx.key
        assert result.wait_acknowledged(10), result.end_error
        assert describe(checked, result.messages[0].transaction_id).state == COMMITTED
        # The COMMIT row goes once the broker acknowledged the COMMIT.
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
    assert orders(dsn) == ["o1"]
    received = consume(checked, topic, unique_name("c"), 1)
    assert [m.body for m in received] == [b"order-1"]


def test_end_await_waits_for_the_broker(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn) as producer, psycopg.connect(dsn) as conn:
        with producer.transaction(conn, end="await") as tx:
            tx.send(txmq.Message(topic, b"a"))
            tx.send(txmq.Message(topic, b"b"))
        assert tx.result.acknowledged
        ids = [m.transaction_id for m in tx.result.messages]
        assert all(describe(checked, t).state == COMMITTED for t in ids)
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")


def test_an_awaited_end_never_lingers_as_a_hint(checked, dsn, unique_name, monkeypatch):
    """end="await": the caller waits on the end, so it goes as any request does, never as a
    hint lingering for a request to share its message (patched to a minute here)."""
    monkeypatch.setattr(txmq._produce_stream, "HINT_LINGER_SECONDS", 60.0)
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        started = time.monotonic()
        with producer.transaction(conn, end="await") as tx:
            tx.send(txmq.Message(topic, b"awaited"))
        assert tx.result.acknowledged
        assert time.monotonic() - started < 20


def test_an_exception_in_the_block_rolls_everything_back(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(RuntimeError, match="changed my mind"):
            with producer.transaction(conn) as tx:
                half = tx.send(txmq.Message(topic, b"never"))
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                raise RuntimeError("changed my mind")
        assert tx.result is None
        wait_state(checked, half.result().transaction_id, ROLLED_BACK)
    assert orders(dsn) == []
    assert rows(dsn) == []  # the COMMIT row went with the rollback; no check, so no fence


def test_a_half_that_fails_rolls_the_local_transaction_back(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(txmq.InvalidFieldError, match="message_group"):
            with producer.transaction(conn) as tx:
                tx.send(txmq.Message(topic, b"refused: a message group on a normal topic", message_group="m"))
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
        assert tx.result is None
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert orders(dsn) == [] and rows(dsn) == []


def test_a_commit_the_database_refuses_rolls_back_and_its_halves_with_it(checked, dsn, unique_name):
    """A deferred constraint fails at COMMIT (the UPDATE and the COMMIT travel together):
    the caller gets the driver's error, nothing of the transaction stays, its half is
    rolled back (the hint), and the connection is usable."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE once (id text, CONSTRAINT once_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
    with anchored_producer(checked, group, dsn) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            with producer.transaction(conn) as tx:
                half = tx.send(txmq.Message(topic, b"never"))
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                conn.execute("INSERT INTO once VALUES ('a'), ('a')")  # checked at COMMIT
        assert tx.result is None
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        wait_state(checked, half.result().transaction_id, ROLLED_BACK)
        conn.execute("SELECT 1")
        conn.rollback()
    assert orders(dsn) == [] and rows(dsn) == []


def test_a_connection_inside_a_transaction_is_refused(checked, dsn, unique_name):
    group = unique_name("g")
    with anchored_producer(checked, group, dsn, ) as producer, psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")  # psycopg opened a transaction
        with pytest.raises(txmq.InvalidFieldError, match="outermost"):
            with producer.transaction(conn):
                pytest.fail("entered")
        conn.rollback()
    assert rows(dsn) == []


def test_a_check_while_the_transaction_is_open_elsewhere_is_in_progress_then_commit(checked, dsn, unique_name):
    """The sender answers no checks (the checker cannot reach it): another instance of the
    group answers from the table. While the local transaction holds the key, the fence
    waits and times out: IN_PROGRESS, never ROLLBACK. Then the commit is the answer."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as sender, \
            anchored_producer(checked, group, dsn, check_lock_timeout_seconds=0.05), \
            psycopg.connect(dsn) as conn, psycopg.connect(dsn) as probe:
        with sender.transaction(conn) as tx:
            half = tx.send(txmq.Message(topic, b"slow")).result(10)
            # Checks come every ~0.2 s; each finds the key locked. The broker's check counter
            # grows with answers but the transaction stays PREPARED (IN_PROGRESS spends nothing).
            wait_until(lambda: describe(checked, half.transaction_id).checks_answered >= 3, 15,
                       message=lambda: f"{describe(checked, half.transaction_id)}")
            assert describe(checked, half.transaction_id).state != ROLLED_BACK
            assert probe.execute("SELECT count(*) FROM txmq_decisions").fetchone()[0] == 0  # nothing fenced
            conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
        assert tx.result.state is txmq.TransactionState.COMMITTED
        wait_state(checked, half.transaction_id, COMMITTED)
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")


def test_a_check_with_no_decision_row_fences_the_key(checked, dsn, unique_name):
    """A half whose local transaction is gone without committing (rolled back by the
    server, say): the check inserts the fence and answers ROLLBACK; the fence stays."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as sender, \
            anchored_producer(checked, group, dsn), psycopg.connect(dsn) as conn:
        tx = sender.transaction(conn)
        tx.__enter__()
        half = tx.send(txmq.Message(topic, b"abandoned")).result(10)
        conn.close()  # the server rolls the transaction back; nothing tells the broker
        wait_state(checked, half.transaction_id, ROLLED_BACK, timeout=15)
        assert rows(dsn) == [("rollback", None)]
        # The fence stops a late insert of the same key.
        with psycopg.connect(dsn) as late, pytest.raises(psycopg.errors.UniqueViolation):
            late.execute("INSERT INTO txmq_decisions (producer_group, transaction_key, decision) "
                         "VALUES (%s, %s, 'commit')", (sender.producer_group, tx.key))


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_stale_check_of_a_committed_transaction_leaves_no_fence(checked, dsn, unique_name, flavour):
    """A check claimed before the broker held the COMMIT and answered after the COMMIT
    row's delete finds no row, so it fences the key; the broker, asked to roll the half
    back, says it is COMMITTED: the check was stale, the fence goes and the answer is
    COMMIT. (make test saw such a fence left behind under load; the check is sent here by
    hand, as it arrives then.) A fence whose half the broker rolls back stays."""
    import asyncio

    from txmq.aio import AsyncTransactionProducer

    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        with producer.transaction(conn) as tx:
            tx.send(txmq.Message(topic, b"order-1"))
            conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
        assert tx.result.wait_acknowledged(10), tx.result.end_error
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
        committed = tx.result.messages[0]
        with anchored_producer(checked, group, dsn, answer_checks=False) as sender:
            abandoned = sender.transaction(conn)
            abandoned.__enter__()
            gone = abandoned.send(txmq.Message(topic, b"abandoned")).result(10)
            conn.rollback()  # nothing tells the broker: only the check can roll it back
        store = producer._decision_store
        if flavour == "sync":
            answers = [store.check(committed), store.check(gone)]
        else:
            async def checks() -> list:
                p = AsyncTransactionProducer(checked.nameserver_address, producer_group=group, answer_checks=False,
                                             decisions=Decisions(dsn))
                await p.start()
                try:
                    return [await p._decision_store.check(committed), await p._decision_store.check(gone)]
                finally:
                    await p.close()
            answers = asyncio.run(checks())
    assert answers == [txmq.LocalTransactionState.COMMIT, txmq.LocalTransactionState.ROLLBACK]
    assert describe(checked, committed.transaction_id).state == COMMITTED
    assert describe(checked, gone.transaction_id).state == ROLLED_BACK
    assert rows(dsn) == [("rollback", None)]  # the abandoned one's fence only
    assert orders(dsn) == ["o1"]


def test_a_commit_row_left_behind_is_repaired_by_the_sweeper(checked, dsn, unique_name):
    """A COMMIT row whose delete was lost (the process died between the broker's
    acknowledgement and the delete): the sweeper of any instance commits its halves again
    (idempotent) and deletes it."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as sender, psycopg.connect(dsn) as conn:
        with sender.transaction(conn, end="await") as tx:
            tx.send(txmq.Message(topic, b"x"))
        wait_until(lambda: rows(dsn) == [], 10)
        conn.execute("INSERT INTO txmq_decisions (producer_group, transaction_key, decision, transaction_ids, "
                     "decided_at) VALUES (%s, %s, 'commit', %s, now() - interval '1 minute')",
                     (sender.producer_group, tx.key, [tx.result.messages[0].transaction_id]))
        conn.commit()
    assert [r[0] for r in rows(dsn)] == ["commit"]
    with anchored_producer(checked, group, dsn, answer_checks=False, repair_after_seconds=0.5,
                           sweep_interval_seconds=0.2):
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")


def test_close_gives_up_the_retries_of_an_end_and_the_check_repairs_it(fresh_cluster_factory, dsn, unique_name):
    """The broker is down when the local COMMIT returns: the end keeps failing. close()
    stops its retries (it does not wait them out: 30 s) and the transaction is still
    committed later, from the row, once the broker is back."""
    import time

    cluster = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True, checker_env=CHECKER_ENV)
    group, topic = unique_name("g"), unique_name("orders")
    cluster.create_topic(topic, 1)
    producer = anchored_producer(cluster, group, dsn, answer_checks=False)
    with psycopg.connect(dsn) as conn:
        with producer.transaction(conn) as tx:
            half = tx.send(txmq.Message(topic, b"late")).result(10)
            cluster.kill_broker(0)
    assert tx.result.state is txmq.TransactionState.COMMITTED and not tx.result.acknowledged
    began = time.monotonic()
    producer.close()
    assert time.monotonic() - began < 20, "close() waited out the end's retries"
    cluster.restart_broker(0)
    with anchored_producer(cluster, group, dsn):
        wait_state(cluster, half.transaction_id, COMMITTED, timeout=30)
        wait_until(lambda: rows(dsn) == [], 15, message=lambda: f"decision rows left: {rows(dsn)}")
