"""The broker's domain against a real RocksDB directory, with a controllable clock."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.broker.core import BrokerCore, StoreIdentityError, parse_tag_filter
from services.broker.store import codec
from services.broker.store.codec import LogRecord
from txmq.errors import (DiskFullError, InvalidFieldError, InvalidIdError, MessageTooLargeError,
                          QueueNotFoundError, ReceiptHandleNotFoundError, SystemTopicError,
                          TopicNotFoundError, TransactionNotFoundError, TransactionStateError,
                          WrongBrokerError)
from txmq.ids import TransactionId


@pytest.fixture
def core(make_core) -> BrokerCore:
    c = make_core(transaction_timeout_seconds=6.0, max_delivery_attempts=3)
    c.db.call(c.create_topic_op("orders", 2))
    return c


def half(core: BrokerCore, body: bytes = b"b", group: str = "pg", queue_id: int = 0, **kw: Any):
    record = core.validate_message(LogRecord(kind=codec.KIND_HALF, topic="orders", body=body, message_id="",
                                             queue_id=queue_id, stored_ms=0, producer_group=group, **kw))
    return core.db.call(core.send_op(record))


def normal(core: BrokerCore, body: bytes = b"n", tag: str = "", queue_id: int = 0, message_id: str = ""):
    record = core.validate_message(LogRecord(kind=codec.KIND_NORMAL, topic="orders", body=body,
                                             message_id=message_id, queue_id=queue_id, stored_ms=0, tag=tag))
    return core.db.call(core.send_op(record))


def end(core: BrokerCore, tid: str, resolution: str, source: int = codec.SOURCE_CLIENT, **kw: Any):
    return core.db.call(core.end_op(tid, resolution, source, **kw))


def receive(core: BrokerCore, group: str = "cg", tags: str = "*", n: int = 16, invisible: float = 10.0):
    return core.db.call(core.receive_op(group, "orders", -1, parse_tag_filter(tags), n, invisible)).deliveries


def bodies(core: BrokerCore, deliveries) -> list[bytes]:
    return [core.read_message(d.log_seq).body for d in deliveries]


def test_half_message_is_invisible_until_commit(core) -> None:
    sent = half(core, b"secret")
    assert receive(core) == []
    result = end(core, sent.transaction_id, "COMMIT")
    assert result.state == codec.STATE_COMMITTED and result.queue_offset == 0
    assert bodies(core, receive(core)) == [b"secret"]


def test_rollback_is_never_visible_and_unknown_stays_pending(core) -> None:
    rolled = half(core, b"r")
    unknown = half(core, b"u")
    assert end(core, rolled.transaction_id, "ROLLBACK").state == codec.STATE_ROLLED_BACK
    assert end(core, unknown.transaction_id, "UNKNOWN").state == codec.STATE_PREPARED
    assert receive(core) == []
    assert core.counters["pg"] == [1, 0]


def test_first_decision_wins_and_repeats_are_idempotent(core) -> None:
    sent = half(core)
    first = end(core, sent.transaction_id, "COMMIT")
    again = end(core, sent.transaction_id, "COMMIT")
    assert again == first
    with pytest.raises(TransactionStateError) as info:
        end(core, sent.transaction_id, "ROLLBACK")
    assert info.value.state == "COMMITTED"
    assert len(receive(core)) == 1  # committed once, appears once


def test_commit_after_rollback_is_refused(core) -> None:
    sent = half(core)
    end(core, sent.transaction_id, "ROLLBACK")
    with pytest.raises(TransactionStateError):
        end(core, sent.transaction_id, "COMMIT")
    assert receive(core) == []


def test_unknown_and_foreign_transaction_ids(core) -> None:
    with pytest.raises(TransactionNotFoundError):
        end(core, core.txn_id(999), "COMMIT")  # an id of this store, naming nothing
    with pytest.raises(InvalidIdError, match="carries no authenticator"):  # minted: never issued
        end(core, TransactionId(core.name, core.store_id, 999).encode(), "COMMIT")
    with pytest.raises(WrongBrokerError):
        end(core, TransactionId("other", core.store_id, 1).encode(), "COMMIT")
    with pytest.raises(InvalidIdError):
        end(core, "Tgarbage", "COMMIT")


def test_duplicate_half_send_returns_the_first_transaction(core) -> None:
    record = LogRecord(kind=codec.KIND_HALF, topic="orders", body=b"x", message_id="", queue_id=0,
                       stored_ms=0, producer_group="pg")
    first = core.db.call(core.send_op(core.validate_message(record)))
    again = core.db.call(core.send_op(core.validate_message(dataclasses.replace(record))))
    assert again.duplicate and again.transaction_id == first.transaction_id
    end(core, first.transaction_id, "COMMIT")
    after = core.db.call(core.send_op(core.validate_message(dataclasses.replace(record))))
    assert after.duplicate and after.state == codec.STATE_COMMITTED
    assert core.counters["pg"] == [0, 0]
    assert len(receive(core)) == 1


def test_a_half_sent_again_after_its_rollback_is_refused(core) -> None:
    """Its sender would otherwise run its local transaction on a half that can never commit
    (a check rolled back the attempt whose answer was lost, then the sender sent it again:
    the proxy answers a given-up attempt's check ROLLBACK)."""
    record = LogRecord(kind=codec.KIND_HALF, topic="orders", body=b"x", message_id="", queue_id=0,
                       stored_ms=0, producer_group="pg")
    first = core.db.call(core.send_op(core.validate_message(record)))
    end(core, first.transaction_id, "ROLLBACK")
    seq = core.next_seq
    with pytest.raises(TransactionStateError, match="ROLLED_BACK: a half message sent again"):
        core.db.call(core.send_op(core.validate_message(dataclasses.replace(record))))
    assert core.next_seq == seq and receive(core) == []


def test_limits_refuse_and_change_nothing(core) -> None:
    seq = core.next_seq
    cases = [
        (MessageTooLargeError, dict(body=b"x" * (core.config.max_body_bytes + 1))),
        (TopicNotFoundError, dict(topic="nope")),
        (SystemTopicError, dict(topic="%DLQ%x")),
        (QueueNotFoundError, dict(queue_id=7)),
        (InvalidFieldError, dict(tag="A || B")),
    ]
    for error, fields in cases:
        record = LogRecord(**{**dict(kind=codec.KIND_NORMAL, topic="orders", body=b"", message_id="",
                                     queue_id=0, stored_ms=0), **fields})
        with pytest.raises(error):
            core.validate_message(record)
    assert core.next_seq == seq and receive(core) == []


def test_disk_floor_refuses_sends(core) -> None:
    core.disk_full, core.free_disk_bytes = True, 10
    with pytest.raises(DiskFullError) as info:
        normal(core)
    assert info.value.floor_bytes == core.config.min_free_disk_bytes


def test_redelivery_then_dead_letter_after_max_attempts(core, clock) -> None:
    normal(core, b"poison")
    attempts = []
    for _ in range(3):
        (d,) = receive(core, invisible=1.0)
        attempts.append(d.attempt)
        assert receive(core) == []  # invisible meanwhile
        clock.advance(1.5)
    assert attempts == [1, 2, 3]
    assert receive(core) == []  # the 3rd delivery expired: moved to the DLQ
    dlq = core.db.call(core.receive_op("other", "%DLQ%cg", -1, None, 16, 10.0)).deliveries
    assert bodies(core, dlq) == [b"poison"]


def test_ack_removes_and_stale_handle_is_refused(core, clock) -> None:
    normal(core)
    (d,) = receive(core, invisible=1.0)
    clock.advance(2)
    (again,) = receive(core, invisible=1.0)
    results = core.db.call(core.ack_op("cg", "orders", [d.receipt_handle, again.receipt_handle, again.receipt_handle]))
    assert isinstance(results[0], ReceiptHandleNotFoundError)
    assert results[1] is None
    assert isinstance(results[2], ReceiptHandleNotFoundError)
    clock.advance(5)
    assert receive(core) == []


def test_change_invisible_duration_postpones_redelivery(core, clock) -> None:
    normal(core)
    (d,) = receive(core, invisible=1.0)
    core.db.call(core.change_invisible_op("cg", "orders", d.receipt_handle, 10.0))
    clock.advance(2)
    assert receive(core) == []
    clock.advance(9)
    (again,) = receive(core)
    assert again.attempt == 2


def test_groups_are_independent_and_tags_filter(core) -> None:
    normal(core, b"a", tag="A")
    normal(core, b"b", tag="B")
    normal(core, b"c", tag="C")
    assert sorted(bodies(core, receive(core, "g1", "A || C"))) == [b"a", b"c"]
    assert sorted(bodies(core, receive(core, "g2"))) == [b"a", b"b", b"c"]
    assert receive(core, "g1") == []  # the filtered-out one is never delivered to g1


def test_commit_order_per_queue(core) -> None:
    sent = [half(core, str(i).encode()) for i in range(5)]
    for s in reversed(sent):
        end(core, s.transaction_id, "COMMIT")
    assert bodies(core, receive(core)) == [b"4", b"3", b"2", b"1", b"0"]


def test_claims_are_leased_and_only_for_due_groups(core, clock) -> None:
    half(core, group="pg")
    half(core, group="other")
    assert core.db.call(core.claim_op(["pg"], 10, 1.0)) == []  # not due before the timeout
    clock.advance(6.001)
    claimed = core.db.call(core.claim_op(["pg"], 10, 1.0))
    assert [c.row.producer_group for c in claimed] == ["pg"] and claimed[0].attempt == 1
    assert core.db.call(core.claim_op(["pg"], 10, 1.0)) == []  # leased
    clock.advance(1.001)
    assert len(core.db.call(core.claim_op(["pg"], 10, 1.0))) == 1  # lease over: due again


def test_check_immunity_delays_the_first_check(core, clock) -> None:
    half(core, check_immunity_seconds=60.0)
    clock.advance(30)
    assert core.db.call(core.claim_op(["pg"], 10, 1.0)) == []
    clock.advance(31)
    assert len(core.db.call(core.claim_op(["pg"], 10, 1.0))) == 1


def test_state_survives_a_restart(make_core, clock) -> None:
    first = make_core()
    first.db.call(first.create_topic_op("orders", 1))
    pending = half(first)
    committed = half(first)
    end(first, committed.transaction_id, "COMMIT")
    normal(first, b"n")
    receive(first, n=1)
    first.close()
    second = make_core()
    assert second.counters["pg"] == [1, 0]
    assert second.next_seq == first.next_seq
    assert second.get_txn(pending.transaction_id).state == codec.STATE_PREPARED
    rest = receive(second)
    assert len(rest) == 1  # the one in flight stays in flight; the other is delivered
    assert second.recount() == {"pg": (1, 0)}


def test_store_belongs_to_one_broker_name(make_core, tmp_path) -> None:
    make_core().close()
    with pytest.raises(StoreIdentityError):
        make_core(broker_name="someone-else")


def test_retention_deletes_old_consumed_records_and_keeps_pending(core, clock) -> None:
    pending = half(core, b"keep")
    for i in range(3):
        normal(core, f"n{i}".encode())
    d = receive(core)
    core.db.call(core.ack_op("cg", "orders", [x.receipt_handle for x in d]))
    clock.advance(core.config.retention_seconds + 1)
    stats = core.db.call(core.retention_op())
    assert stats["records_deleted"] == 2  # the newest entry of the queue stays
    assert core.get_txn(pending.transaction_id).state == codec.STATE_PREPARED
    assert core.read_message(core.parse_txn_id(pending.transaction_id)).body == b"keep"


def test_query_transactions_by_group_state_and_age(core, clock) -> None:
    old = half(core, group="pg")
    clock.advance(100)
    half(core, group="pg")
    committed = half(core, group="pg")
    end(core, committed.transaction_id, "COMMIT")
    rows, _ = core.query_txns("pg", codec.STATE_PREPARED, 50.0, 100, "")
    assert [core.txn_id(r.seq) for r in rows] == [old.transaction_id]
    rows, _ = core.query_txns("", codec.STATE_COMMITTED, 0, 100, "")
    assert [core.txn_id(r.seq) for r in rows] == [committed.transaction_id]
    page, token = core.query_txns("pg", 0, 0, 2, "")
    rest, last = core.query_txns("pg", 0, 0, 2, token)
    assert len(page) == 2 and len(rest) == 1 and last == ""


# --- checks: budget, refunds, discards (the broker's half of the checker) ---------------

from services.broker.checks import (CHECK_COMMIT, CHECK_IN_PROGRESS, CHECK_ROLLBACK, CHECK_UNKNOWN,  # noqa: E402 - beside its section
                                    OUTCOME_ANSWERED, OUTCOME_DELIVERED, OUTCOME_UNDELIVERED, CheckReport)
from txmq.errors import InvalidNameError, StaleClaimError  # noqa: E402 - beside its section


@pytest.fixture
def checked(make_core):
    c = make_core(transaction_timeout_seconds=1.0, check_interval_seconds=2.0, check_backoff_multiplier=1.0,
                  check_jitter=0.0, check_max=3, max_transaction_lifetime_seconds=100.0)
    c.db.call(c.create_topic_op("orders", 1))
    return c


def claim_one(core, clock, lease: float = 5.0):
    claimed = core.db.call(core.claim_op(["pg"], 10, lease))
    assert len(claimed) == 1, claimed
    return claimed[0]


def report(core, claim, outcome: int, result: int = 0, retry: float = 0.0):
    # As the checker reports: an answer names the group of the stream that answered it.
    group = claim.row.producer_group if outcome == OUTCOME_ANSWERED else ""
    (error, state, _late), = core.db.call(core.report_op([CheckReport(core.txn_id(claim.row.seq),
                                                                      claim.row.claim_token, outcome, result,
                                                                      retry, 0.5, group)]))
    if error is not None:
        raise error
    return state


def test_budget_counts_only_received_checks_then_discards(checked, clock) -> None:
    sent = half(checked)
    clock.advance(1.0)
    for attempt in range(1, 4):
        c = claim_one(checked, clock)
        assert c.attempt == attempt
        assert report(checked, c, OUTCOME_DELIVERED) == codec.STATE_PREPARED
        state = report(checked, c, OUTCOME_ANSWERED, CHECK_UNKNOWN)
        clock.advance(2.0)
    assert state == codec.STATE_DISCARDED
    row = checked.get_txn(sent.transaction_id)
    assert (row.checks_delivered, row.checks_answered) == (3, 3) and "check_max=3" in row.discard_reason
    assert checked.counters["pg"] == [0, 1]
    parked = checked.db.call(checked.receive_op("ops", "%DISCARD%pg", -1, None, 10, 10.0)).deliveries
    assert [checked.read_message(d.log_seq).body for d in parked] == [b"b"]
    assert receive(checked) == []
    # An operator (or a late answer of the group) can still decide.
    result = end(checked, sent.transaction_id, "COMMIT", codec.SOURCE_OPERATOR, operator="alice", reason="paid")
    assert result.state == codec.STATE_COMMITTED and checked.counters["pg"] == [0, 0]
    assert bodies(checked, receive(checked)) == [b"b"]
    assert checked.get_txn(sent.transaction_id).operator == "alice"


def test_undelivered_checks_spend_nothing(checked, clock) -> None:
    sent = half(checked)
    clock.advance(1.0)
    for _ in range(10):
        c = claim_one(checked, clock)
        report(checked, c, OUTCOME_UNDELIVERED)
    row = checked.get_txn(sent.transaction_id)
    assert row.state == codec.STATE_PREPARED and row.checks_delivered == 0


def test_unanswered_last_check_discards_after_the_answer_timeout(checked, clock) -> None:
    sent = half(checked)
    clock.advance(1.0)
    for _ in range(3):
        report(checked, claim_one(checked, clock), OUTCOME_DELIVERED)  # never answered
        clock.advance(2.0)
    assert checked.db.call(checked.claim_op(["pg"], 10, 5.0)) == []  # discarded by the claim
    assert checked.get_txn(sent.transaction_id).state == codec.STATE_DISCARDED


def test_in_progress_refunds_and_the_lifetime_cap_discards(checked, clock) -> None:
    sent = half(checked)
    clock.advance(1.0)
    for _ in range(6):  # twice the budget, all IN_PROGRESS
        c = claim_one(checked, clock)
        report(checked, c, OUTCOME_DELIVERED)
        report(checked, c, OUTCOME_ANSWERED, CHECK_IN_PROGRESS, retry=10.0)
        assert checked.db.call(checked.claim_op(["pg"], 10, 5.0)) == []  # deferred by retry_after
        clock.advance(10.0)
    row = checked.get_txn(sent.transaction_id)
    assert row.state == codec.STATE_PREPARED and row.checks_delivered == 0
    clock.advance(100.0)
    assert checked.db.call(checked.claim_op(["pg"], 10, 5.0)) == []
    row = checked.get_txn(sent.transaction_id)
    assert row.state == codec.STATE_DISCARDED and "max_transaction_lifetime_seconds" in row.discard_reason


def test_a_late_answer_decides_once_and_a_contradicting_one_is_refused(checked, clock) -> None:
    sent = half(checked)
    clock.advance(1.0)
    first = claim_one(checked, clock, lease=1.0)
    report(checked, first, OUTCOME_DELIVERED)
    clock.advance(2.0)
    second = claim_one(checked, clock)  # no answer in time: claimed again, spending another unit
    report(checked, second, OUTCOME_DELIVERED)
    with pytest.raises(StaleClaimError):  # only answers count on a stale claim
        report(checked, first, OUTCOME_DELIVERED)
    # The first check's answer comes late: it must name the group (a claim token no longer
    # current proves nothing: the broker keeps only the current one) ...
    (error, state, late), = checked.db.call(checked.report_op([CheckReport(
        sent.transaction_id, first.row.claim_token, OUTCOME_ANSWERED, CHECK_COMMIT)]))
    assert isinstance(error, InvalidFieldError) and state == codec.STATE_PREPARED
    # ... and then it decides, and spends nothing more.
    (error, state, late), = checked.db.call(checked.report_op([CheckReport(
        sent.transaction_id, first.row.claim_token, OUTCOME_ANSWERED, CHECK_COMMIT, producer_group="pg")]))
    assert (error, state, late) == (None, codec.STATE_COMMITTED, True)
    row = checked.get_txn(sent.transaction_id)
    assert row.source == codec.SOURCE_CHECK and row.checks_delivered == 2
    # The current claim's answer agrees: accepted, nothing changes; a contradicting one
    # (also without a token, through another checker) is refused with the state.
    assert report(checked, second, OUTCOME_ANSWERED, CHECK_COMMIT) == codec.STATE_COMMITTED
    (error, state, _), = checked.db.call(checked.report_op([CheckReport(
        sent.transaction_id, "", OUTCOME_ANSWERED, CHECK_ROLLBACK, producer_group="pg")]))
    assert isinstance(error, TransactionStateError) and state == codec.STATE_COMMITTED
    assert "COMMITTED" in str(error)
    # A late answer without a token must name the transaction's group.
    for group in ("", "other"):
        (error, _, _), = checked.db.call(checked.report_op([CheckReport(
            sent.transaction_id, "", OUTCOME_ANSWERED, CHECK_COMMIT, producer_group=group)]))
        assert isinstance(error, InvalidFieldError)
    assert checked.get_txn(sent.transaction_id).state == codec.STATE_COMMITTED


def test_a_late_answer_without_a_token_decides_a_discarded_transaction(checked, clock) -> None:
    sent = half(checked)
    clock.advance(1.0)
    for _ in range(3):
        c = claim_one(checked, clock)
        report(checked, c, OUTCOME_DELIVERED)
        report(checked, c, OUTCOME_ANSWERED, CHECK_UNKNOWN)
        clock.advance(3.0)
    assert checked.get_txn(sent.transaction_id).state == codec.STATE_DISCARDED
    (error, state, late), = checked.db.call(checked.report_op([CheckReport(
        sent.transaction_id, "", OUTCOME_ANSWERED, CHECK_ROLLBACK, producer_group="pg")]))
    assert (error, state, late) == (None, codec.STATE_ROLLED_BACK, True)


def test_claims_share_the_batch_between_groups_and_respect_limits(checked, clock) -> None:
    for _ in range(50):
        half(checked, group="aaa-burst")
    for _ in range(3):
        half(checked, group="zzz-quiet")
    clock.advance(1.0)
    batch = checked.db.call(checked.session_claim_op("s1", 1, {"aaa-burst": 8, "zzz-quiet": 8}, {}, 10, 5.0))
    groups = [c.row.producer_group for c in batch.checks]
    assert groups.count("zzz-quiet") == 3 and groups.count("aaa-burst") == 7 and batch.more_due
    # A limit below the capacity (credit in use) caps the group; 0 skips it.
    batch = checked.db.call(checked.session_claim_op("s1", 1, None, {"aaa-burst": 2}, 10, 5.0))
    assert [c.row.producer_group for c in batch.checks] == ["aaa-burst"] * 2
    batch = checked.db.call(checked.session_claim_op("s1", 1, None, {"aaa-burst": 0}, 10, 5.0))
    assert batch.checks == [] and not batch.groups_needed


def test_a_batch_smaller_than_the_groups_due_serves_them_in_turn(checked, clock) -> None:
    for group in ("a", "b", "c"):
        half(checked, group=group)
    clock.advance(1.0)
    groups = {"a": 4, "b": 4, "c": 4}
    first = checked.db.call(checked.session_claim_op("s1", 1, groups, {}, 2, 5.0))
    assert len(first.checks) == 2 and first.more_due
    second = checked.db.call(checked.session_claim_op("s1", 1, None, {}, 2, 5.0))
    served = {c.row.producer_group for c in first.checks + second.checks}
    assert served == {"a", "b", "c"} and not second.more_due


def test_a_claim_session_is_sent_once_and_asked_for_again_when_unknown(make_core, clock) -> None:
    core = make_core(transaction_timeout_seconds=1.0)
    core.db.call(core.create_topic_op("orders", 1))
    half(core, group="pg")
    clock.advance(1.0)
    assert core.db.call(core.session_claim_op("s1", 1, None, {}, 10, 5.0)).groups_needed  # never sent
    assert core.db.call(core.session_claim_op("s1", 1, {"idle": 4}, {}, 10, 5.0)).checks == []
    # The list changed: a new version with it; an old version is asked for again.
    assert len(core.db.call(core.session_claim_op("s1", 2, {"idle": 4, "pg": 4}, {}, 10, 5.0)).checks) == 1
    assert core.db.call(core.session_claim_op("s1", 1, None, {}, 10, 5.0)).groups_needed
    assert not core.db.call(core.session_claim_op("s1", 2, None, {}, 10, 5.0)).groups_needed
    with pytest.raises(InvalidNameError):
        core.session_claim_op("s1", 3, {"bad group": 1}, {}, 10, 5.0)


def test_due_floors_are_known_after_a_restart(make_core, clock) -> None:
    core = make_core(transaction_timeout_seconds=1.0)
    core.db.call(core.create_topic_op("orders", 1))
    half(core, group="a")
    half(core, group="b")
    core.close()
    again = make_core(transaction_timeout_seconds=1.0)
    clock.advance(1.0)
    claimed = again.db.call(again.claim_op(["a", "b"], 10, 5.0))
    assert sorted(c.row.producer_group for c in claimed) == ["a", "b"]


def test_a_check_writes_a_small_row_whatever_the_message_size(make_core, clock) -> None:
    core = make_core(transaction_timeout_seconds=0.001, check_jitter=0.0)
    core.db.call(core.create_topic_op("orders", 1))
    written = []
    for size in (100, 64 * 1024):
        half(core, b"x" * size, group=f"g{size}")
        clock.advance(0.001)
        claimed = core.db.call(core.claim_op([f"g{size}"], 10, 5.0))
        before = core.db.bytes_written
        c = claimed[0]
        core.db.call(core.report_op([CheckReport(core.txn_id(c.row.seq), c.row.claim_token, OUTCOME_DELIVERED)]))
        core.db.call(core.report_op([CheckReport(core.txn_id(c.row.seq), c.row.claim_token, OUTCOME_ANSWERED,
                                                 CHECK_UNKNOWN)]))
        written.append(core.db.bytes_written - before)
    assert abs(written[0] - written[1]) <= 16 and written[1] < 1024, written


def test_read_queue_by_offset_touches_no_group(core) -> None:
    for i in range(5):
        normal(core, str(i).encode())
    entries, nxt = core.read_queue("orders", 0, 1, 0, 2)
    assert [o for o, _ in entries] == [1, 2] and nxt == 3
    entries, nxt = core.read_queue("orders", 0, 3, 0, 100)
    assert [core.read_message(e.log_seq).body for _, e in entries] == [b"3", b"4"] and nxt == 5
    assert core.read_queue("orders", 0, 5, 0, 10) == ([], 5)
    assert core.queue_offsets("orders") == [(0, 0, 5), (1, 0, 0)]
    assert len(receive(core)) == 5  # a group still gets everything
    with pytest.raises(QueueNotFoundError):
        core.read_queue("orders", 7, 0, 0, 1)


def test_a_claim_right_after_a_report_sees_the_key_it_put_below_the_floor(checked, clock) -> None:
    sent = half(checked)
    clock.advance(1.0)
    c = claim_one(checked, clock)  # the floor moves past the claimed key
    # UNDELIVERED: due again now, below the floor the claim left.
    checked.db.call(checked.report_op([CheckReport(checked.txn_id(c.row.seq), c.row.claim_token,
                                                   OUTCOME_UNDELIVERED)]))
    claimed = checked.db.call(checked.claim_op(["pg"], 10, 5.0))
    assert [checked.txn_id(x.row.seq) for x in claimed] == [sent.transaction_id]


def test_dead_letter_on_request_moves_one_delivery_now(core) -> None:
    normal(core, b"hopeless")
    normal(core, b"fine")
    first, second = receive(core)
    topic, offset = core.db.call(core.dead_letter_op("cg", "orders", first.receipt_handle))
    assert (topic, offset) == ("%DLQ%cg", 0)
    dlq = core.db.call(core.receive_op("ops", "%DLQ%cg", -1, None, 10, 10.0)).deliveries
    assert bodies(core, dlq) == [b"hopeless"]
    with pytest.raises(ReceiptHandleNotFoundError):  # no longer in flight
        core.db.call(core.dead_letter_op("cg", "orders", first.receipt_handle))
    assert core.db.call(core.ack_op("cg", "orders", [second.receipt_handle])) == [None]
    assert core.last_txn_id() == ""


def test_a_write_group_is_one_batch_whose_operations_read_each_other(core) -> None:
    def half_op(message_id: str):
        return core.send_op(core.validate_message(LogRecord(
            kind=codec.KIND_HALF, topic="orders", body=b"g", message_id=message_id, queue_id=0, stored_ms=0,
            producer_group="pg")))

    written = core.db.written
    mid = "group-dup-1"
    with core.db.grouped() as group:
        first = core.db.apply(half_op(mid))
        # Nothing is in RocksDB yet, yet the repeat is a duplicate and the commit finds the row.
        assert core.db.cf["dedup"].get(mid.encode()) is None
        repeat = core.db.apply(half_op(mid))
        committed = core.db.apply(core.end_op(first.result.transaction_id, "COMMIT", codec.SOURCE_CLIENT))
        with pytest.raises(TransactionStateError):
            core.db.apply(core.end_op(first.result.transaction_id, "ROLLBACK", codec.SOURCE_CLIENT))
    assert repeat.result.duplicate and repeat.result.transaction_id == first.result.transaction_id
    assert committed.result.state == codec.STATE_COMMITTED
    # One batch for the group, and its ticket covers it.
    assert core.db.written == written + 1 and group.ticket == core.db.written
    assert [d.body for d in [core.read_message(x.log_seq) for x in receive(core)]] == [b"g"]
    assert core.get_txn(first.result.transaction_id).state == codec.STATE_COMMITTED


def test_a_write_group_that_wrote_nothing_has_the_current_ticket_and_groups_do_not_nest(core) -> None:
    sent = half(core)
    written = core.db.written
    with core.db.grouped() as group:
        with pytest.raises(RuntimeError):
            with core.db.grouped():
                pass
        # A repeat decision reads and writes nothing new.
        core.db.apply(core.end_op(sent.transaction_id, "UNKNOWN", codec.SOURCE_CLIENT))
    assert core.db.written == written and group.ticket == written


def test_a_bridge_write_group_refuses_nesting_and_keeps_the_outer_groups_hooks(core) -> None:
    import asyncio

    from services.broker.bridge import StoreBridge

    loop = asyncio.new_event_loop()
    try:
        bridge = StoreBridge(core.db, loop, on_fatal=lambda exc: None)  # flush=async: no sync helper
        stored: list[str] = []
        core.stored_listeners.append(lambda topic, kind: stored.append(topic))
        record = core.validate_message(LogRecord(kind=codec.KIND_HALF, topic="orders", body=b"h",
                                                 message_id="", queue_id=0, stored_ms=0, producer_group="pg"))
        with bridge.grouped() as group:
            bridge.apply(core.send_op(record))
            with pytest.raises(RuntimeError):
                with bridge.grouped():
                    pass
            # The outer group goes on after the refused nesting.
            bridge.apply(core.send_op(dataclasses.replace(record, message_id="")))
            assert stored == []  # the hooks wait for the group's write
        assert stored == ["orders", "orders"] and group.ticket == core.db.written
    finally:
        loop.close()


def _half_record(core: BrokerCore, body: bytes = b"h") -> LogRecord:
    return core.validate_message(LogRecord(kind=codec.KIND_HALF, topic="orders", body=body, message_id="",
                                           queue_id=0, stored_ms=0, producer_group="pg"))


def test_requests_applied_in_one_loop_iteration_share_one_wal_sync_and_wait_for_it(make_core) -> None:
    import asyncio

    from services.broker.bridge import StoreBridge

    core = make_core(flush="sync")
    core.db.call(core.create_topic_op("orders", 1))
    loop = asyncio.new_event_loop()
    syncs: list[int] = []
    try:
        bridge = StoreBridge(core.db, loop, on_fatal=pytest.fail,
                             on_sync=lambda seconds, writes: syncs.append(writes))

        async def three_sends() -> list[Any]:
            futures = [bridge.run(core.send_op(_half_record(core, b"%d" % i))) for i in range(3)]
            # Applied (written to RocksDB) at once, answered only after the sync.
            assert core.db.written >= 3 and not any(f.done() for f in futures) and syncs == []
            return await asyncio.gather(*futures)

        results = loop.run_until_complete(three_sends())
    finally:
        loop.close()
    assert [r.state for r in results] == [codec.STATE_PREPARED] * 3
    assert syncs == [3] and bridge.syncs == 1  # one fdatasync made the three writes durable


def test_writes_that_need_no_sync_hold_no_answer(make_core) -> None:
    import asyncio

    from services.broker.bridge import StoreBridge

    core = make_core(flush="sync")
    core.db.call(core.create_topic_op("orders", 1))
    sent = core.db.call(core.send_op(_half_record(core)))
    core.db.call(core.end_op(sent.transaction_id, "COMMIT", codec.SOURCE_CLIENT))
    loop = asyncio.new_event_loop()
    try:
        bridge = StoreBridge(core.db, loop, on_fatal=pytest.fail)

        async def consume_then_send() -> tuple[int, int, int]:
            written = core.db.written
            # A receive writes its delivery (sync=False): answered without a sync ...
            received = await bridge.run(core.receive_op("cg", "orders", -1, None, 8, 30.0), sync=False)
            assert core.db.written == written + 1 and len(received.deliveries) == 1
            handle = received.deliveries[0].receipt_handle
            # ... so is the ack, and a read of the state they left,
            assert await bridge.run(core.ack_op("cg", "orders", [handle]), sync=False) == [None]
            await bridge.settled()
            after_consuming = bridge.syncs
            # while a send waits for the sync that covers it (and their writes with it).
            await bridge.run(core.send_op(_half_record(core, b"next")))
            return after_consuming, bridge.syncs, core.db.read_ticket

        after_consuming, after_send, read_ticket = loop.run_until_complete(consume_then_send())
    finally:
        loop.close()
    assert after_consuming == 0 and after_send == 1 and read_ticket == core.db.written


def test_the_wal_in_use_is_pre_sized_and_synced_writes_overwrite_it(tmp_path) -> None:
    from services.broker.store.db import Database

    size = 4 * 1024 * 1024
    db = Database(str(tmp_path / "store"), sync=True, wal_prefill_bytes=size)
    try:
        logs = db.wal_files()
        assert max(logs.values()) >= size, logs
        for i in range(200):
            db.call(lambda w, i=i: w.put("meta", b"k%d" % i, b"v" * 1000))  # ~200 KB, synced
        # Written into the blocks the file had: no log grew, none was added.
        assert db.wal_files() == logs
        # The filler is gone from the store, the data is there.
        assert list(db.scan("walfill")) == [] and db.get("meta", b"k199") == b"v" * 1000
    finally:
        db.close()
    reopened = Database(str(tmp_path / "store"), sync=True)
    try:
        assert reopened.get("meta", b"k0") == b"v" * 1000
    finally:
        reopened.close()


def test_checks_due_before_a_restart_are_claimed_though_new_ones_arrive_first(make_core, clock):
    # After a restart (or a fail-over) the in-memory floor of the due index is empty: a
    # new half message of the group must not move it past the older keys on disk.
    first = make_core(transaction_timeout_seconds=1.0)
    first.db.call(first.create_topic_op("orders", 1))
    old = half(first, b"old")
    first.close()
    clock.advance(5)
    core = make_core(transaction_timeout_seconds=1.0)
    new = half(core, b"new")
    clock.advance(2)
    claimed = {core.txn_id(c.row.seq) for c in core.db.call(core.claim_op(["pg"], 10, 1.0))}
    assert claimed == {old.transaction_id, new.transaction_id}


def test_a_deleted_topic_leaves_nothing_behind_after_retention(make_core, clock) -> None:
    """topics.delete_topic_op removes the queues and positions at once; retention then
    removes the records nothing names any more, even each queue's newest (kept otherwise)."""
    from services.broker.topics import delete_topic_op

    core = make_core(transaction_timeout_seconds=6.0)
    core.db.call(core.create_topic_op("orders", 2))
    committed = half(core, b"c")
    end(core, committed.transaction_id, "COMMIT")
    for i in range(3):
        normal(core, f"n{i}".encode(), queue_id=i % 2)
    receive(core, n=1)
    deleted = core.db.call(delete_topic_op(core, "orders", force=True))
    assert (deleted.entries, deleted.groups) == (4, ["cg"])
    assert "orders" not in core.topics and core.consumers.cursors == {}
    clock.advance(core.config.retention_seconds + 1)
    assert core.db.call(core.retention_op())["records_deleted"] == 4
    assert list(core.db.scan("log")) == [] and list(core.db.scan("txn")) == []
