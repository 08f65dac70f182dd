"""The Produce stream's send policy (``txmq._produce_stream._requests``): one stream message in
flight, what arrives meanwhile leaves together once it is answered, after waiting briefly
for the callers that answer woke. Driven directly, without gRPC: the generator is what
gRPC's sending thread iterates, ``put`` is what callers do, ``answer`` what the reader
thread does."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Iterator

import pytest

from tests.support.waiting import wait_until
from txmq import _produce_stream as _pipeline
from txmq.v1 import broker_pb2, common_pb2


def _entry(i: int) -> broker_pb2.ProduceEntry:
    return broker_pb2.ProduceEntry(request_id=i)


class _Sender:
    """Iterates the request generator on its own thread, as gRPC does."""

    def __init__(self, session: _pipeline._Session) -> None:
        self.session = session
        self.sent: "queue.SimpleQueue[list[int]]" = queue.SimpleQueue()
        self._requests: Iterator[broker_pb2.ProduceRequest] = _pipeline._requests(session)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for request in self._requests:
            self.sent.put([e.request_id for e in request.entries])

    def next_message(self, timeout: float = 10.0) -> list[int]:
        return self.sent.get(timeout=timeout)

    def put(self, *ids: int) -> None:
        for i in ids:
            self.session.put(_entry(i))

    def answer(self, count: int) -> None:
        """What the reader thread does when a response with ``count`` results arrives."""
        with self.session.answered:
            self.session.unanswered -= count
            self.session.returning = count
            if self.session.unanswered <= 0:
                self.session.answered.notify()


@pytest.fixture
def sender():
    session = _pipeline._Session()
    s = _Sender(session)
    yield s
    session.queue.put(None)
    s.thread.join(10)


def test_an_idle_stream_sends_a_request_at_once(sender) -> None:
    sender.put(1)
    assert sender.next_message() == [1]


def test_requests_arriving_while_a_message_is_unanswered_leave_together_when_it_is(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    sender.put(1)
    assert sender.next_message() == [1]
    sender.put(2, 3, 4, 5)
    # Held: the sender took the first of them and waits for the answer to message [1].
    wait_until(lambda: sender.session.queue.qsize() == 3, 10, message="the sender never took a held request")
    assert sender.sent.empty()
    sender.answer(1)
    assert sender.next_message() == [2, 3, 4, 5]
    assert sender.session.unanswered == 4


def test_a_hint_in_flight_holds_nothing(sender, monkeypatch) -> None:
    # An anchored end (request(stream=True)) is a hint: nobody's critical path waits on it,
    # so the half message after it leaves at once instead of behind its WAL sync.
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    sender.session.hints.add(1)
    sender.put(1)
    assert sender.next_message() == [1]
    assert sender.session.unanswered == 0
    sender.put(2)
    assert sender.next_message() == [2]
    assert sender.session.unanswered == 1


def test_a_hint_lingers_for_a_request_and_both_leave_in_one_message(sender, monkeypatch) -> None:
    # The next transaction's half message follows an anchored end within a millisecond or
    # so: it shares the end's stream message (one gRPC message, one WAL sync for both).
    monkeypatch.setattr(_pipeline, "HINT_LINGER_SECONDS", 60.0)
    sender.session.hints.add(1)
    sender.put(1)
    wait_until(lambda: sender.session.queue.qsize() == 0, 10, message="the sender never took the hint")
    assert sender.sent.empty()
    sender.put(2)
    assert sender.next_message() == [1, 2]
    assert sender.session.unanswered == 1  # the request, not the hint


def test_hints_lingering_together_leave_with_the_request_that_joins_them(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HINT_LINGER_SECONDS", 60.0)
    sender.session.hints.update({1, 2})
    sender.put(1)
    wait_until(lambda: sender.session.queue.qsize() == 0, 10, message="the sender never took the hint")
    sender.put(2)
    wait_until(lambda: sender.session.queue.qsize() == 0, 10, message="the sender never took the second hint")
    assert sender.sent.empty()  # hints alone: still lingering
    sender.put(3)
    assert sender.next_message() == [1, 2, 3]


def test_a_hint_nobody_joins_leaves_alone_once_the_linger_is_over(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HINT_LINGER_SECONDS", 0.05)
    sender.session.hints.add(1)
    started = time.monotonic()
    sender.put(1)
    assert sender.next_message() == [1]
    assert time.monotonic() - started >= 0.05


def _hold_one(sender: _Sender) -> None:
    """Leaves message [1] in flight and request 2 taken by the sender, held behind it."""
    sender.put(1)
    assert sender.next_message() == [1]
    sender.put(2)
    wait_until(lambda: sender.session.queue.qsize() == 0, 10, message="the sender never took the request")


def test_a_late_answer_stops_holding_after_hold_seconds(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 0.05)
    _hold_one(sender)
    # Never answered: the request leaves anyway once HOLD_SECONDS passed.
    assert sender.next_message() == [2]
    assert sender.session.unanswered == 2


def test_a_failed_stream_stops_holding(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    _hold_one(sender)
    with sender.session.answered:
        sender.session.dead = True
        sender.session.answered.notify()
    assert sender.next_message() == [2]


def test_a_message_holds_at_most_max_batch_requests(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    sender.put(0)
    assert sender.next_message() == [0]
    for i in range(1, _pipeline.MAX_BATCH + 3):
        sender.put(i)
    wait_until(lambda: sender.session.queue.qsize() == _pipeline.MAX_BATCH + 1, 10,
               message="the sender never took a held request")
    sender.answer(1)
    assert sender.next_message() == list(range(1, _pipeline.MAX_BATCH + 1))
    sender.answer(_pipeline.MAX_BATCH)
    assert sender.next_message() == [_pipeline.MAX_BATCH + 1, _pipeline.MAX_BATCH + 2]


def _in_flight_three(sender: _Sender) -> None:
    """Leaves message [2, 3, 4] in flight (three callers waiting for one answer)."""
    sender.put(1)
    assert sender.next_message() == [1]
    sender.put(2, 3, 4)
    wait_until(lambda: sender.session.queue.qsize() == 2, 10, message="the sender never took a held request")
    sender.answer(1)  # one caller answered: one is enough to send at once
    assert sender.next_message() == [2, 3, 4]


def _lingers_for_5_6_7(sender: _Sender) -> None:
    """With request 5 taken and three callers expected back, 5 waits for 6 and 7."""
    wait_until(lambda: sender.session.lingering, 10, message="the sender did not linger")
    sender.put(6)
    assert sender.sent.empty()
    sender.put(7)
    assert sender.next_message() == [5, 6, 7]


def test_after_a_held_message_the_next_waits_for_the_callers_its_answer_woke(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    monkeypatch.setattr(_pipeline, "LINGER_SECONDS", 60.0)
    _in_flight_three(sender)
    sender.put(5)  # an early caller: held behind [2, 3, 4]
    wait_until(lambda: sender.session.queue.qsize() == 0, 10, message="the sender never took the request")
    sender.answer(3)
    # Three callers were answered: the sender lingers until three requests are queued.
    _lingers_for_5_6_7(sender)
    assert not sender.session.lingering


def test_lingering_ends_after_linger_seconds(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    monkeypatch.setattr(_pipeline, "LINGER_SECONDS", 0.05)
    _in_flight_three(sender)
    sender.put(5)
    wait_until(lambda: sender.session.queue.qsize() == 0, 10, message="the sender never took the request")
    sender.answer(3)
    # The other two callers never come back: [5] leaves alone once the linger is over.
    assert sender.next_message() == [5]


def test_after_an_answer_to_several_an_idle_sender_waits_for_as_many_callers(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    monkeypatch.setattr(_pipeline, "LINGER_SECONDS", 60.0)
    _in_flight_three(sender)
    wait_until(lambda: sender.session.unanswered == 3, 10, message="[2, 3, 4] not in flight")
    sender.answer(3)  # nothing was waiting to be sent: the sender is idle
    sender.put(5)
    # The first caller back does not leave alone: it waits for the other two.
    _lingers_for_5_6_7(sender)


def test_after_an_answer_to_one_the_next_request_leaves_at_once(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "LINGER_SECONDS", 60.0)
    sender.put(1)
    assert sender.next_message() == [1]
    sender.answer(1)
    sender.put(2)
    assert sender.next_message() == [2]


def _result(kind: str, *, code: int = 0, transaction_id: str = "") -> broker_pb2.ProduceResult:
    result = broker_pb2.ProduceResult(status=common_pb2.EntryStatus(code=code))
    if kind == "send":
        result.send_message.transaction_id = transaction_id
    else:
        result.end_transaction.transaction_id = "T1"
    return result


def _waited(n: int) -> list:
    return [_pipeline._Reply(waited=True) for _ in range(n)]


def test_callers_expected_back_on_a_clients_only_stream_are_all_it_answered() -> None:
    results = [_result("send", transaction_id="T1"), _result("end"), _result("send"), _result("send", code=3)]
    assert _pipeline._returning(results, _waited(4), sole=True) == 4


def test_with_several_streams_only_stored_half_messages_bring_their_caller_back() -> None:
    # A commit or a normal send may be followed by a send to another broker; a stored
    # half message is followed by its EndTransaction on this stream.
    results = [_result("send", transaction_id="T1"), _result("end"), _result("send"),
               _result("send", code=3, transaction_id="T2"), _result("send", transaction_id="T3")]
    assert _pipeline._returning(results, _waited(5), sole=False) == 2


def test_callers_that_do_not_wait_for_their_reply_are_not_expected_back() -> None:
    # ``submit`` callers (the Spark sink) pipeline many requests from one thread and
    # collect the replies later; a timed-out request's reply is gone.
    results = [_result("end"), _result("end"), _result("end")]
    replies = [_pipeline._Reply(waited=True), _pipeline._Reply(waited=False), None]
    assert _pipeline._returning(results, replies, sole=True) == 1


def test_a_clients_stream_knows_whether_it_is_the_only_one() -> None:
    # No server is needed: gRPC channels connect lazily and no request is sent.
    from txmq.client import Client

    client = Client("127.0.0.1:1", request_timeout_seconds=1.0, route_refresh_seconds=30.0)
    try:
        first = client.produce_stream("127.0.0.1:2")
        assert first._sole()
        second = client.produce_stream("127.0.0.1:3")
        assert not first._sole() and not second._sole()
    finally:
        client.close()


def test_a_submitted_requests_reply_gives_its_response_or_its_failure() -> None:
    from txmq.errors import DeadlineExceededError, UnavailableError

    answered = _pipeline._Reply(waited=False)
    with pytest.raises(DeadlineExceededError):
        answered.result(timeout=0.01)
    response = _result("end")
    answered.set_result(response)
    assert answered.result(timeout=1) is response
    assert answered.result(timeout=1) is response  # it stays answered
    failed = _pipeline._Reply(waited=False)
    failed.set_exception(UnavailableError("stream failed"))
    with pytest.raises(UnavailableError):
        failed.result(timeout=1)


def test_a_session_with_no_linger_sends_the_first_caller_back_at_once(monkeypatch) -> None:
    # A producer's linger_seconds=0 (the module default is patched high to show it wins).
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    monkeypatch.setattr(_pipeline, "LINGER_SECONDS", 60.0)
    s = _Sender(_pipeline._Session(linger_seconds=0.0))
    try:
        _in_flight_three(s)
        s.answer(3)
        s.put(5)
        assert s.next_message() == [5]
    finally:
        s.session.queue.put(None)
        s.thread.join(10)


# --- a stream against a broker that answers every message at once ------------------------

class _Broker:
    """The Produce method of a broker answering each stream message with its entries'
    results at once, as one response; records the request ids of each message it got."""

    def __init__(self) -> None:
        self.messages: list[list[int]] = []

    def __call__(self, requests: Iterator[broker_pb2.ProduceRequest]) -> "_Call":
        return _Call(self, requests)


class _Call:
    """One Produce call: iterating it gives the responses; once the requests end it ends
    after answering them all (as the broker does); ``cancel`` ends it at once."""

    def __init__(self, broker: _Broker, requests: Iterator[broker_pb2.ProduceRequest]) -> None:
        self._responses: "queue.SimpleQueue[broker_pb2.ProduceResponse | None]" = queue.SimpleQueue()
        threading.Thread(target=self._serve, args=(broker, requests), daemon=True).start()

    def _serve(self, broker: _Broker, requests: Iterator[broker_pb2.ProduceRequest]) -> None:
        for request in requests:
            broker.messages.append([e.request_id for e in request.entries])
            self._responses.put(broker_pb2.ProduceResponse(results=[_answer(e) for e in request.entries]))
        self._responses.put(None)

    def __iter__(self) -> Iterator[broker_pb2.ProduceResponse]:
        while (response := self._responses.get()) is not None:
            yield response

    def cancel(self) -> None:
        self._responses.put(None)


def _answer(entry: broker_pb2.ProduceEntry) -> broker_pb2.ProduceResult:
    if entry.WhichOneof("request") == "send_message":
        return broker_pb2.ProduceResult(request_id=entry.request_id, send_message={"message_id": "M1"})
    return broker_pb2.ProduceResult(request_id=entry.request_id, end_transaction={"transaction_id": "T1"})


def _end() -> broker_pb2.ProduceEntry:
    return broker_pb2.ProduceEntry(end_transaction={"transaction_id": "T1"})


def _send() -> broker_pb2.ProduceEntry:
    return broker_pb2.ProduceEntry(send_message={"message": {"topic": "orders"}})


class _Unary:
    """The broker's unary methods, counting the calls a caller alone makes direct."""

    def __init__(self) -> None:
        self.calls = 0

    def SendMessage(self, request: Any, timeout: float) -> broker_pb2.SendMessageResponse:
        self.calls += 1
        return broker_pb2.SendMessageResponse(message_id="M1")

    EndTransaction = SendMessage


def _hint_in_background(stream: _pipeline.ProduceStream) -> "tuple[threading.Thread, list[Any]]":
    """An anchored end sent as a hint from a thread of its own, as the producer does; the
    list gets its answer (or what it raised)."""
    got: list[Any] = []

    def end() -> None:
        try:
            got.append(stream.request(_end(), timeout=10, stream=True))
        except Exception as exc:  # noqa: BLE001 - the test checks what came
            got.append(exc)

    thread = threading.Thread(target=end, daemon=True)
    thread.start()
    return thread, got


def _lingering(stream: _pipeline.ProduceStream) -> None:
    """Waits until the stream's sender took the hint (and lingers with it)."""
    session = wait_until(lambda: stream._sessions[0], 10, message="no stream opened")
    wait_until(lambda: session.hints and session.queue.qsize() == 0, 10, message="the hint was never taken")


def test_a_hint_alone_is_sent_after_the_linger_and_answered(monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HINT_LINGER_SECONDS", 0.05)
    broker = _Broker()
    stream = _pipeline.ProduceStream(broker, "broker:1", stub=_Unary())
    try:
        started = time.monotonic()
        result = stream.request(_end(), timeout=10, stream=True)
        assert time.monotonic() - started >= 0.05
        assert result.end_transaction.transaction_id == "T1"
        assert broker.messages == [[result.request_id]]
    finally:
        stream.close()


def test_a_caller_alone_joins_a_lingering_hint_and_never_waits_for_the_linger(monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HINT_LINGER_SECONDS", 60.0)
    broker, unary = _Broker(), _Unary()
    stream = _pipeline.ProduceStream(broker, "broker:1", stub=unary)
    try:
        thread, ended = _hint_in_background(stream)
        _lingering(stream)
        assert broker.messages == []
        started = time.monotonic()
        result = stream.request(_send(), timeout=10)
        assert time.monotonic() - started < 5  # not the 60 s linger
        assert result.send_message.message_id == "M1"
        thread.join(10)
        assert [type(r) for r in ended] == [broker_pb2.ProduceResult]
        assert broker.messages == [[ended[0].request_id, result.request_id]]  # one message for both
        assert unary.calls == 0
    finally:
        stream.close()


def test_close_sends_a_lingering_hint_and_it_is_answered(monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HINT_LINGER_SECONDS", 60.0)
    broker = _Broker()
    stream = _pipeline.ProduceStream(broker, "broker:1", stub=_Unary())
    thread, ended = _hint_in_background(stream)
    _lingering(stream)
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < 5
    thread.join(10)
    assert [type(r) for r in ended] == [broker_pb2.ProduceResult]  # answered, not ClientClosedError
    assert broker.messages == [[ended[0].request_id]]


# --- lanes ----------------------------------------------------------------------------------

def test_a_second_lane_opens_when_enough_callers_wait_at_once_and_closes_when_few_do(monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "SPLIT_AT", 6)
    monkeypatch.setattr(_pipeline, "MERGE_AT", 4)
    monkeypatch.setattr(_pipeline, "LANE_WINDOW_SECONDS", 1.0)
    lanes = _pipeline._Lanes()
    now = 100.0
    lanes.enter(now)  # the first caller opens a window: one lane
    for _ in range(5):
        lanes.enter(now + 0.1)
    assert lanes.count == 1  # six wait at once, but the window has not ended
    lanes.enter(now + 1.0)  # the window ends with a peak of 7: a second lane
    assert lanes.count == 2 and lanes.waiting == 7
    for _ in range(2):
        lanes.leave()
    lanes.enter(now + 2.0)  # peak 7 in that window (it began at 7): still two
    assert lanes.count == 2
    for _ in range(2):
        lanes.leave()  # four wait now
    lanes.enter(now + 3.0)  # this window peaked at 6 (it began at 6): still two
    assert lanes.count == 2
    for _ in range(1):
        lanes.leave()  # four
    lanes.enter(now + 4.0)  # a window that peaked at 5: between the thresholds, unchanged
    assert lanes.count == 2
    lanes.leave()
    lanes.leave()  # three
    lanes.enter(now + 5.0)  # peak 5 (began at 5)
    lanes.leave()
    lanes.enter(now + 6.0)  # peak 4: back to one lane
    assert lanes.count == 1 and lanes.waiting == 4


def test_callers_keep_their_lane_and_two_lanes_split_the_threads_evenly() -> None:
    # No server is needed: gRPC channels connect lazily, and requests wait unanswered.
    from txmq.client import Client

    client = Client("127.0.0.1:1", request_timeout_seconds=1.0, route_refresh_seconds=30.0)
    try:
        stream = client.produce_stream("127.0.0.1:2")
        # As if SPLIT_AT callers had waited at once, in a window that does not end.
        stream._lanes.count, stream._lanes.window_ends = 2, float("inf")
        seen: dict[int, list[int]] = {}

        def caller(i: int) -> None:
            for _ in range(3):
                _reply, session, _request_id = stream._submit(_entry(0), waited=True, now=0.0)
                seen.setdefault(i, []).append(stream._sessions.index(session))
                with stream._lock:
                    stream._lanes.leave()

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
            t.join(10)  # in turn: the order of first use decides the lane
        assert all(len(set(lanes)) == 1 for lanes in seen.values()), seen
        assert sorted(lanes[0] for lanes in seen.values()) == [0] * 4 + [1] * 4
    finally:
        client.close()
