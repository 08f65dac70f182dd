"""The sans-I/O send and receive plans the sync and asyncio SDKs share (``txmq._sending``,
``txmq._receiving``), driven step by step as a producer or consumer drives them."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from txmq import _receiving, _sending
from txmq._checking import InProgress, answer_locally
from txmq._client import QueueRoute
from txmq._faults import FaultTable
from txmq.errors import InvalidFieldError, NoLeaderError, UnavailableError
from txmq._producing import HalfAttempts, OpenTransactions
from txmq._types import LocalTransactionState
from txmq.ids import MessageId
from txmq.v1 import broker_pb2, common_pb2

A = QueueRoute("broker-a", "a:1", 0)
B = QueueRoute("broker-b", "b:1", 0)


class _Client:
    def __init__(self) -> None:
        self.faults = FaultTable()
        self.invalidated: list[str] = []

    def invalidate_route(self, topic: str) -> None:
        self.invalidated.append(topic)

    def check_open(self) -> None:
        pass


def _sender(max_attempts: int = 3, send_timeout_seconds: float = 1.0) -> SimpleNamespace:
    sender = SimpleNamespace(_client=_Client())
    _sending.configure(sender, producer_group="pg", send_timeout_seconds=send_timeout_seconds,
                       max_attempts=max_attempts, retry_backoff_seconds=0.1, max_body_bytes=1024)
    return sender


def _build(route: QueueRoute, message_id: str) -> common_pb2.Message:
    return common_pb2.Message(topic="t", message_id=message_id, queue_id=route.queue_id,
                              type=common_pb2.MESSAGE_TYPE_TRANSACTION)


def _stored(message_id: str) -> broker_pb2.ProduceResult:
    return broker_pb2.ProduceResult(send_message=broker_pb2.SendMessageResponse(message_id=message_id))


def test_a_send_that_fails_moves_to_another_shard_with_a_new_id_and_the_first_is_abandoned() -> None:
    sender = _sender()
    steps = _sending.send_new(sender, "t", _build)
    assert next(steps) == _sending.Pick("t", frozenset())
    first = steps.send(A)
    assert isinstance(first, _sending.Request) and first.shard == "broker-a" and first.send
    first_id = first.entry.send_message.message.message_id
    assert MessageId.decode(first_id).broker == "broker-a"
    assert steps.throw(UnavailableError("down")) == _sending.Pick("t", frozenset({"broker-a"}), moving=True)
    second = steps.send(B)
    second_id = second.entry.send_message.message.message_id
    assert second.shard == "broker-b" and MessageId.decode(second_id).broker == "broker-b"
    with pytest.raises(StopIteration) as done:
        steps.send(_stored(second_id))
    route, pb, response = done.value.value
    assert (route, pb.message_id, response.message_id) == (B, second_id, second_id)
    assert first_id in sender._abandoned  # its orphan, if stored, is answered ROLLBACK
    assert sender._client.invalidated == ["t"]


def test_with_no_other_shard_a_send_retries_its_own_with_the_same_id_after_a_backoff() -> None:
    sender = _sender()
    steps = _sending.send_new(sender, "t", _build)
    next(steps)
    first = steps.send(A)
    assert steps.throw(UnavailableError("down")) == _sending.Pick("t", frozenset({"broker-a"}), moving=True)
    assert steps.send(A) == _sending.Sleep(0.1)  # the pick found only the same shard
    assert steps.send(None) == _sending.Rebind("t", A, "a:1")
    again = steps.send("a:2")
    assert again.address == "a:2"
    assert again.entry.send_message.message.message_id == first.entry.send_message.message.message_id


def test_a_send_that_failed_on_every_shard_stays_on_the_last_and_waits_for_its_leader() -> None:
    """Both shards' leaders lost at once: the send moved once, failed there too, and the
    fault table has no usable shard left (None): it stays, with its id, backed off, rather
    than bouncing back to the first dead shard at once."""
    sender = _sender()
    sender._client.faults.failed("broker-a")
    steps = _sending.send_new(sender, "t", _build)
    next(steps)
    steps.send(A)
    assert steps.throw(UnavailableError("down")) == _sending.Pick("t", frozenset({"broker-a"}), moving=True)
    second = steps.send(B)
    assert steps.throw(UnavailableError("down too")) == _sending.Pick("t", frozenset({"broker-a", "broker-b"}),
                                                                      moving=True)
    assert steps.send(None) == _sending.Sleep(0.2)  # no shard usable: stays on broker-b
    assert steps.send(None) == _sending.Rebind("t", B, "b:1")
    assert steps.throw(NoLeaderError("t", ["broker-b"])) == _sending.Sleep(0.1)  # between leaders: waits
    assert steps.send(None) == _sending.Rebind("t", B, "b:1")
    again = steps.send("b:2")
    assert again.shard == "broker-b" and again.address == "b:2"
    assert again.entry.send_message.message.message_id == second.entry.send_message.message.message_id


def test_a_moving_send_is_offered_only_a_shard_the_fault_table_lets_take_traffic() -> None:
    sender = _sender()
    faults = sender._client.faults
    assert _sending.pick_other(sender, [A, B], frozenset({"broker-a"})) == B
    faults.failed("broker-b")  # avoided now: no shard but the one it failed on
    assert _sending.pick_other(sender, [A, B], frozenset({"broker-a"})) is None
    assert faults.choose([A, B], lambda q: q.broker_name, 0, frozenset({"broker-a"})) == B  # a first pick still goes
    faults.succeeded("broker-b")
    assert _sending.pick_other(sender, [A, B], frozenset({"broker-a"})) == B


def test_a_send_gives_up_after_max_attempts_and_a_refusal_at_once() -> None:
    steps = _sending.send_new(_sender(max_attempts=1), "t", _build)
    next(steps)
    steps.send(A)
    with pytest.raises(UnavailableError):
        steps.throw(UnavailableError("down"))
    steps = _sending.send_new(_sender(), "t", _build)
    next(steps)
    steps.send(A)
    with pytest.raises(InvalidFieldError):
        steps.throw(InvalidFieldError("body", "bad"))


def test_a_send_waits_for_a_leader_while_its_topic_is_between_leaders() -> None:
    sender = _sender(max_attempts=1)
    steps = _sending.send_new(sender, "t", _build)
    pick = next(steps)
    assert pick == _sending.Pick("t", frozenset())
    assert steps.throw(NoLeaderError("t", ["broker-a"])) == _sending.Sleep(0.1)
    assert steps.send(None) == pick
    assert steps.throw(NoLeaderError("t", ["broker-a"])) == _sending.Sleep(0.2)  # doubling
    assert steps.send(None) == pick
    request = steps.send(A)  # a leader: the send goes on, no attempt spent on the wait
    assert isinstance(request, _sending.Request) and request.shard == "broker-a"


def test_a_send_fails_with_the_retryable_no_leader_error_at_its_send_timeout() -> None:
    steps = _sending.send_new(_sender(send_timeout_seconds=0.05), "t", _build)
    next(steps)
    pause = steps.throw(NoLeaderError("t", ["broker-a"]))
    assert isinstance(pause, _sending.Sleep) and 0 < pause.seconds <= 0.05  # no later than the deadline
    time.sleep(pause.seconds)
    steps.send(None)
    with pytest.raises(NoLeaderError) as caught:
        steps.throw(NoLeaderError("t", ["broker-a"]))
    assert caught.value.retryable


def test_a_retry_on_its_own_shard_waits_for_the_shards_next_leader() -> None:
    steps = _sending.send_new(_sender(), "t", _build)
    next(steps)
    first = steps.send(A)
    steps.throw(UnavailableError("down"))  # the leader died: asks the route again
    assert steps.send(A) == _sending.Sleep(0.1)
    assert steps.send(None) == _sending.Rebind("t", A, "a:1")
    assert steps.throw(NoLeaderError("t", ["broker-a"])) == _sending.Sleep(0.1)  # between leaders
    assert steps.send(None) == _sending.Rebind("t", A, "a:1")
    again = steps.send("a:2")  # the successor
    assert again.address == "a:2"
    assert again.entry.send_message.message.message_id == first.entry.send_message.message.message_id


def test_end_transaction_is_retried_on_its_shard_and_never_raises() -> None:
    from txmq import LocalTransactionState, Message, TransactionMessage, TransactionState

    half = TransactionMessage(message=Message("t", b"x"), message_id="m", transaction_id="tx",
                              broker_name="broker-a", queue_id=0)
    steps = _sending.end_transaction(_sender(max_attempts=2), A, "t", half, LocalTransactionState.COMMIT, "pg")
    first = next(steps)
    assert first.shard == "broker-a" and first.entry.end_transaction.transaction_id == "tx"
    assert steps.throw(UnavailableError("down")) == _sending.Sleep(0.1)
    assert steps.send(None) == _sending.Rebind("t", A, "a:1")
    assert steps.send("a:1").shard == "broker-a"
    with pytest.raises(StopIteration) as done:
        steps.throw(UnavailableError("still down"))
    state, error = done.value.value
    assert state is None and isinstance(error, UnavailableError)
    steps = _sending.end_transaction(_sender(), A, "t", half, LocalTransactionState.COMMIT, "pg")
    next(steps)
    with pytest.raises(StopIteration) as done:
        steps.send(broker_pb2.ProduceResult(end_transaction=broker_pb2.EndTransactionResponse(
            state=common_pb2.TRANSACTION_STATE_COMMITTED)))
    assert done.value.value == (TransactionState.COMMITTED, None)


def test_a_receive_of_one_target_alone_is_its_long_poll() -> None:
    steps = _receiving.receive_steps(["t@a"], 0, 16, 20.0, lambda t: False, lambda t: True, alone=True)
    assert next(steps) == _receiving.Receive("t@a", 16, 20.0)
    with pytest.raises(StopIteration) as done:
        steps.send(["m"])
    assert done.value.value == ["m"]


def test_a_receive_passes_over_the_targets_then_long_polls_them() -> None:
    targets = ["t@a", "t@b", "t@c"]
    steps = _receiving.receive_steps(targets, 1, 16, 20.0, lambda t: t == "t@c", lambda t: True, alone=False)
    assert next(steps) == _receiving.Receive("t@b", 16, 0.0)  # starts at turn 1; t@c is polled already
    assert steps.throw(UnavailableError("b down")) == _receiving.Receive("t@a", 16, 0.0)
    assert steps.send([]) == _receiving.LongPoll(["t@b", "t@c", "t@a"])
    steps = _receiving.receive_steps(targets, 0, 2, 20.0, lambda t: False, lambda t: True, alone=False)
    next(steps)
    with pytest.raises(StopIteration) as done:
        steps.send(["m1", "m2"])  # full at the first target
    assert done.value.value == ["m1", "m2"]


def test_deferred_acks_are_due_by_the_delay_or_half_the_invisibility_left_and_taken_per_target() -> None:
    import datetime as dt
    import time

    def message(broker: str, topic: str, invisible_for: float) -> SimpleNamespace:
        until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=invisible_for)
        return SimpleNamespace(broker_name=broker, topic=topic, invisible_until=until)

    queue = _receiving.deferred_acks(1.0, None)
    assert queue.next_due() is None
    now = time.monotonic()
    a, b, c = message("b0", "t", 30.0), message("b0", "t", 30.0), message("b1", "t", 30.0)
    assert now + 0.9 < queue.add(a) <= time.monotonic() + 1.0  # the configured delay
    queue.add(b)
    short = message("b1", "u", 0.4)
    assert queue.add(short) <= time.monotonic() + 0.2  # half the 0.4 s of invisibility left
    assert queue.next_due() <= time.monotonic() + 0.2
    assert queue.add(message("b1", "u", -5.0)) <= time.monotonic()  # expired: due now
    queue.add(c)
    assert len(queue) == 5
    assert queue.take("b0", "t") == [a, b]
    assert queue.take("b0", "t") == []
    assert queue.take_all()[-1] is c
    assert len(queue) == 0 and queue.next_due() is None
    for bad in (0, 61, "1", True):
        with pytest.raises(InvalidFieldError, match="max_ack_delay_seconds"):
            _receiving.deferred_acks(bad, None)
    with pytest.raises(InvalidFieldError, match="on_ack_error"):
        _receiving.deferred_acks(1.0, "print")


def _answer(sender: SimpleNamespace, open_here: OpenTransactions, message_id: str) -> object:
    """What the producer answers a check of ``message_id`` by itself (None: it asks)."""
    return answer_locally(SimpleNamespace(message_id=message_id, transaction_id="txn"), sender._abandoned,
                          open_here, 1.0)


def test_a_half_attempt_is_open_while_its_send_is_retried_and_an_orphan_once_the_send_moves_away() -> None:
    """A check of an attempt stored with its answer lost, arriving while the send is
    retried with the same id, is answered IN_PROGRESS: asked of the listener, which finds
    no local transaction, it would roll back a half the retry then finds PREPARED and the
    caller commits. Once the send moves away the attempt is an orphan (ROLLBACK)."""
    sender = _sender()
    open_here = OpenTransactions()
    attempts = HalfAttempts(open_here, _build)
    steps = _sending.send_new(sender, "t", attempts.build)
    next(steps)
    first_id = steps.send(A).entry.send_message.message.message_id
    assert isinstance(_answer(sender, open_here, first_id), InProgress)  # in flight
    assert steps.throw(UnavailableError("its answer lost")) == _sending.Pick("t", frozenset({"broker-a"}),
                                                                             moving=True)
    assert steps.send(None) == _sending.Sleep(0.1)  # no other shard: it stays, same id
    assert isinstance(_answer(sender, open_here, first_id), InProgress)  # a check while it waits
    assert steps.send(None) == _sending.Rebind("t", A, "a:1")
    again = steps.send("a:1")
    assert again.entry.send_message.message.message_id == first_id
    assert steps.throw(UnavailableError("lost again")) == _sending.Pick("t", frozenset({"broker-a"}), moving=True)
    second_id = steps.send(B).entry.send_message.message.message_id  # moved: a new id
    assert _answer(sender, open_here, first_id) is LocalTransactionState.ROLLBACK
    assert isinstance(_answer(sender, open_here, second_id), InProgress)
    with pytest.raises(StopIteration):
        steps.send(_stored(second_id))
    attempts.close()
    assert first_id not in open_here and second_id not in open_here
    assert _answer(sender, open_here, second_id) is None  # the listener's (or the decisions table's) now


def test_an_explicit_transactions_half_stays_open_past_its_send() -> None:
    open_here = OpenTransactions()
    attempts = HalfAttempts(open_here, _build)
    attempts.build(A, "m-1")
    attempts.build(B, "m-2")
    attempts.keep("m-2")
    attempts.close()
    assert "m-1" not in open_here and "m-2" in open_here
