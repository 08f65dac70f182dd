"""The Produce stream's send policy (``txmq._pipeline._requests``): one stream message in
flight, and what arrives meanwhile leaves together once it is answered. Driven directly,
without gRPC: the generator is what gRPC's sending thread iterates."""

from __future__ import annotations

import queue
import threading
from typing import Iterator

import pytest

from tests.support.waiting import wait_until
from txmq import _pipeline
from txmq.v1 import broker_pb2


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

    def answer(self, count: int) -> None:
        """What the reader thread does when a response with ``count`` results arrives."""
        with self.session.answered:
            self.session.unanswered -= count
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
    sender.session.queue.put(_entry(1))
    assert sender.next_message() == [1]


def test_requests_arriving_while_a_message_is_unanswered_leave_together_when_it_is(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    sender.session.queue.put(_entry(1))
    assert sender.next_message() == [1]
    for i in range(2, 6):
        sender.session.queue.put(_entry(i))
    # Held: the sender took the first of them and waits for the answer to message [1].
    wait_until(lambda: sender.session.queue.qsize() == 3, 10, message="the sender never took a held request")
    assert sender.sent.empty()
    sender.answer(1)
    assert sender.next_message() == [2, 3, 4, 5]
    assert sender.session.unanswered == 4


def test_a_late_answer_stops_holding_after_hold_seconds(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 0.05)
    sender.session.queue.put(_entry(1))
    assert sender.next_message() == [1]
    sender.session.queue.put(_entry(2))
    # Never answered: the request leaves anyway once HOLD_SECONDS passed.
    assert sender.next_message() == [2]
    assert sender.session.unanswered == 2


def test_a_failed_stream_stops_holding(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    sender.session.queue.put(_entry(1))
    assert sender.next_message() == [1]
    sender.session.queue.put(_entry(2))
    wait_until(lambda: sender.session.queue.qsize() == 0, 10, message="the sender never took the request")
    with sender.session.answered:
        sender.session.dead = True
        sender.session.answered.notify()
    assert sender.next_message() == [2]


def test_a_message_holds_at_most_max_batch_requests(sender, monkeypatch) -> None:
    monkeypatch.setattr(_pipeline, "HOLD_SECONDS", 60.0)
    sender.session.queue.put(_entry(0))
    assert sender.next_message() == [0]
    for i in range(1, _pipeline.MAX_BATCH + 3):
        sender.session.queue.put(_entry(i))
    wait_until(lambda: sender.session.queue.qsize() == _pipeline.MAX_BATCH + 1, 10,
               message="the sender never took a held request")
    sender.answer(1)
    assert sender.next_message() == list(range(1, _pipeline.MAX_BATCH + 1))
    sender.answer(_pipeline.MAX_BATCH)
    assert sender.next_message() == [_pipeline.MAX_BATCH + 1, _pipeline.MAX_BATCH + 2]
