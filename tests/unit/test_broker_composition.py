"""The broker's domain as composed parts (``services/broker/core.py``): each built from the
shared context and the parts it is handed, decisions and discards reaching the global
transactions by their hooks whoever makes them, and the metrics' snapshot taken on the
event loop. Real RocksDB directories, a controllable clock."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from services.broker import idauth
from services.broker.base import BrokerContext, Listeners, Sequence
from services.broker.bridge import StoreBridge
from services.broker.checks import CHECK_COMMIT, OUTCOME_ANSWERED, OUTCOME_DELIVERED, CheckReport
from services.broker.config import BrokerConfig
from services.broker.core import BrokerCore, open_database, parse_tag_filter, store_identity
from services.broker.metrics import BrokerMetrics, take_snapshot
from services.broker.model import STATE_COMMITTED, STATE_DISCARDED, STATE_PREPARED
from services.broker.queues import Queues
from services.broker.schedule import CheckSchedule
from services.broker.sends import Sends
from services.broker.store import codec
from services.broker.store.codec import LogRecord
from services.broker.timers import Timers
from services.broker.transactions import Transactions
from tests.support.waiting import wait_until
from tests.support.clock import Clock
from txmq.errors import InvalidFieldError
from txmq.ids import MessageId


@pytest.fixture
def config(tmp_path) -> BrokerConfig:
    return BrokerConfig(data_dir=str(tmp_path / "store"), flush="async", broker_name="broker-a",
                        transaction_timeout_seconds=6.0, check_max=2)


@pytest.fixture
def core(config, clock):
    c = BrokerCore(config, clock=clock)
    c.db.call(c.create_topic_op("orders", 2))
    yield c
    c.close()


def _half(core: BrokerCore, **kw: Any) -> Any:
    record = core.validate_message(LogRecord(kind=codec.KIND_HALF, topic="orders", body=b"b", queue_id=0,
                                             stored_ms=0, producer_group="pg",
                                             message_id=MessageId.new(core.name, 0).encode()))
    return core.db.call(core.global_send_op(record, begin=kw.get("begin", False), participants=[],
                                            global_id=kw.get("gid", "")))


def _claim_and_answer(core: BrokerCore, clock: Clock, answer: int) -> None:
    """The checker's round for every due check of ``pg``: claimed, delivered, answered."""
    clock.advance(7)
    claimed = core.db.call(core.claim_op(["pg"], 10, 30.0))
    assert claimed
    for c in claimed:
        tid = core.txn_id(c.row.seq)
        core.db.call(core.report_op([CheckReport(tid, c.row.claim_token, OUTCOME_DELIVERED)]))
        core.db.call(core.report_op([CheckReport(tid, c.row.claim_token, OUTCOME_ANSWERED, answer)]))


# --- the parts, built alone -----------------------------------------------------------------

def test_transactions_built_alone_call_their_hooks_after_the_row_is_staged(config, clock):
    """A Transactions over its own context and parts, with no Globals: its decisions reach a
    hook registered on it, after its own writes and in the same batch."""
    db = open_database(config)
    try:
        ctx = BrokerContext(config=config, name=config.broker_name, store_id=store_identity(db, config),
                            clock=clock, db=db, sequence=Sequence(db), listeners=Listeners())
        ctx.ids = idauth.open_authority(db, ctx.name, ctx.store_id, ctx.sequence.next, [], clock, lambda _d: False)
        queues = Queues(ctx)
        db.call(queues.create_topic_op("orders", 1))
        schedule = CheckSchedule(ctx)
        timers = Timers(ctx, queues)
        transactions = Transactions(ctx, queues, schedule, timers)
        sends = Sends(ctx, queues, transactions, timers)
        decided: list[tuple[int, int, int, int, bool]] = []

        def hook(w: Any, row: Any, was: int, source: int) -> None:
            staged = any(cf == "txn" and key == codec.txn_key(row.seq) for cf, key, _ in w.puts)
            decided.append((row.seq, was, row.state, source, staged))
        transactions.on_decide.append(hook)
        record = sends.validate_message(LogRecord(kind=codec.KIND_HALF, topic="orders", body=b"b", message_id="",
                                                  queue_id=0, stored_ms=0, producer_group="pg"))
        sent = db.call(sends.send_op(record))
        seq = ctx.parse_txn_id(sent.transaction_id)
        assert decided == []  # a prepare is no decision
        written = db.written
        db.call(transactions.end_op(sent.transaction_id, "COMMIT", codec.SOURCE_CLIENT))
        assert decided == [(seq, STATE_PREPARED, STATE_COMMITTED, codec.SOURCE_CLIENT, True)]
        assert db.written == written + 1  # the hook wrote in the decision's own batch
        assert queues.next_offset("orders", 0) == 1  # committed: in its queue through Queues.append
    finally:
        db.close()


def test_an_end_guard_refuses_before_anything_is_read_or_written(core):
    sent = _half(core)
    refused: list[str] = []

    def guard(tid: str, seq: int, resolution: str) -> None:
        refused.append(tid)
        raise InvalidFieldError("transaction_id", "refused by the guard")
    core.transactions.end_guards.append(guard)
    written = core.db.written
    with pytest.raises(InvalidFieldError, match="refused by the guard"):
        core.db.call(core.end_op(sent.transaction_id, "COMMIT", codec.SOURCE_CLIENT))
    assert refused == [sent.transaction_id] and core.db.written == written
    assert core.get_txn(sent.transaction_id).state == STATE_PREPARED


# --- decisions made anywhere reach the hooks ---------------------------------------------

def test_a_check_answer_is_a_decision_through_transactions(core, clock):
    """Claims decide through Transactions.decide (no copy of it): a hook sees the answer."""
    seen: list[tuple[int, int]] = []
    core.transactions.on_decide.append(lambda w, row, was, source: seen.append((row.state, source)))
    _half(core)
    _claim_and_answer(core, clock, CHECK_COMMIT)
    assert seen == [(STATE_COMMITTED, codec.SOURCE_CHECK)]


def test_a_spent_check_budget_is_a_discard_through_transactions(core, clock):
    discarded: list[str] = []
    core.transactions.on_discard.append(lambda w, row, reason: discarded.append(reason))
    sent = _half(core)
    for _ in range(2):  # check_max=2 delivered, no answer
        clock.advance(60)
        for c in core.db.call(core.claim_op(["pg"], 10, 1.0)):
            core.db.call(core.report_op([CheckReport(core.txn_id(c.row.seq), c.row.claim_token, OUTCOME_DELIVERED)]))
    clock.advance(60)
    assert core.db.call(core.claim_op(["pg"], 10, 1.0)) == []
    assert core.get_txn(sent.transaction_id).state == STATE_DISCARDED
    assert len(discarded) == 1 and "check budget spent" in discarded[0]


def test_a_global_transaction_decided_by_a_check_decides_its_parts(core, clock):
    """G's decision through a check answer (the claims' path, not EndTransaction) reaches
    the global transactions' hook: its part is committed in the same batch."""
    g = _half(core, begin=True)
    part = _half(core, gid=g.transaction_id)
    assert core.get_txn(part.transaction_id).next_due_ms == 0  # a part has no check schedule
    written = core.db.written
    _claim_and_answer(core, clock, CHECK_COMMIT)  # claim, delivered, answered: three batches
    assert core.db.written == written + 3
    assert core.get_txn(g.transaction_id).state == STATE_COMMITTED
    assert core.get_txn(part.transaction_id).state == STATE_COMMITTED
    got = core.db.call(core.receive_op("cg", "orders", 0, parse_tag_filter("*"), 10, 10.0)).deliveries
    assert sorted(d.log_seq for d in got) == sorted(core.parse_txn_id(t) for t in (g.transaction_id,
                                                                                      part.transaction_id))


def test_a_global_transaction_discarded_by_its_spent_checks_discards_its_parts(core, clock):
    g = _half(core, begin=True)
    part = _half(core, gid=g.transaction_id)
    for _ in range(3):
        clock.advance(60)
        for c in core.db.call(core.claim_op(["pg"], 10, 1.0)):
            core.db.call(core.report_op([CheckReport(core.txn_id(c.row.seq), c.row.claim_token, OUTCOME_DELIVERED)]))
    assert core.get_txn(g.transaction_id).state == STATE_DISCARDED
    assert core.get_txn(part.transaction_id).state == STATE_DISCARDED
    assert core.counters["pg"] == [0, 2]


# --- the metrics' snapshot ---------------------------------------------------------------

def test_the_snapshot_holds_what_the_domain_holds(core, clock):
    first = _half(core)
    clock.advance(1)
    _half(core)
    snap = core.snapshot()
    assert snap.counters == {"pg": (2, 0)}
    assert snap.oldest_pending_ms == {"pg": core.get_txn(first.transaction_id).prepared_ms}
    assert snap.due_floors["pg"][0] == core.get_txn(first.transaction_id).next_due_ms
    assert snap.topics == {"orders": 2} and snap.queue_next == {("orders", 0): 0, ("orders", 1): 0}
    # A copy: later operations leave it as it was.
    core.db.call(core.end_op(first.transaction_id, "COMMIT", codec.SOURCE_CLIENT))
    assert snap.counters == {"pg": (2, 0)} and snap.queue_next[("orders", 0)] == 0


def test_a_scrape_waits_for_the_event_loop_to_take_the_snapshot(core):
    """The scrape's thread reads the domain's state only as the event loop copied it: while
    the loop is busy, the scrape waits; once it is free, the scrape shows the state."""
    _half(core)
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    try:
        metrics = BrokerMetrics()
        bridge = StoreBridge(core.db, loop, on_fatal=lambda exc: None)
        metrics.watch(lambda: (core, bridge))
        busy, release = threading.Event(), threading.Event()

        def hold_the_loop() -> None:
            busy.set()
            release.wait(30)
        loop.call_soon_threadsafe(hold_the_loop)
        assert busy.wait(10)
        scraped: list[float] = []
        scrape = threading.Thread(target=lambda: scraped.append(
            metrics.registry.get_sample_value("txmq_transactions_pending", {"group": "pg"})), daemon=True)
        scrape.start()
        scrape.join(0.5)
        assert scrape.is_alive() and scraped == []  # waiting for the loop, not reading state itself
        release.set()
        scrape.join(30)
        assert scraped == [1.0]
        # A loop that takes no snapshot in time gives a scrape without state, not a hang.
        release.clear()
        busy.clear()
        loop.call_soon_threadsafe(hold_the_loop)
        assert busy.wait(10)
        assert take_snapshot(core, loop, timeout=0.2) is None
        release.set()
        wait_until(lambda: take_snapshot(core, loop, timeout=5) is not None, timeout=30)
    finally:
        release.set()
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(10)
        loop.close()


def test_the_components_are_the_facades_state(core):
    """The façade's names are the components' own objects (no copies to drift)."""
    assert core.topics is core.queues.topics and core.queue_next is core.queues.queue_next
    assert core.counters is core.transactions.counters
    assert core.send_op == core.sends.send_op and core.end_op == core.transactions.end_op
    core.next_seq = core.next_seq + 5
    assert core.ctx.sequence.next == core.next_seq
    core.leader_epoch = 7
    assert core.deliveries.leader_epoch == 7
    core.disk_full, core.free_disk_bytes = True, 10
    assert core.sends.disk_full and core.sends.free_disk_bytes == 10


def test_a_servicer_made_anew_for_each_leadership_shares_its_metrics():
    """A replicated broker makes a new BrokerServicer, over the process's one BrokerMetrics, at
    each leadership it takes. The quota refusals' counter was registered by the servicer: a
    replica leading for the second time failed every election round (DuplicateTimeseries), and
    the shard's leadership could not come back to it."""
    from services.broker.quotas import SETTINGS

    metrics = BrokerMetrics()
    first = metrics.quota_refusals(SETTINGS)
    again = metrics.quota_refusals(SETTINGS)
    assert all(first[s] is again[s] for s in SETTINGS)
    first[SETTINGS[0]].inc()
    assert metrics.registry.get_sample_value("txmq_quota_refusals_total", {"setting": SETTINGS[0]}) == 1
    assert metrics.registry.get_sample_value("txmq_quota_refusals_total", {"setting": SETTINGS[1]}) == 0
