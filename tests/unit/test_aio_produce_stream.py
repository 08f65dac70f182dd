"""The asyncio Produce stream's hints (``txmq.aio._stream.AsyncProduceStream``): an anchored
end (``request(stream=True)``) lingers up to ``HINT_LINGER_SECONDS`` for a request to share
its stream message; a coroutine alone joins a lingering hint instead of going direct; close
sends the lingering hints. Driven against an in-process call that answers every message at
once, without gRPC."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from txmq import _produce_stream
from txmq.aio._stream import AsyncProduceStream
from txmq.v1 import broker_pb2


class _Broker:
    """The Produce method of a broker answering each stream message with its entries'
    results at once, as one response; records the request ids of each message it got."""

    def __init__(self) -> None:
        self.messages: list[list[int]] = []

    def __call__(self) -> "_Call":
        return _Call(self)


class _Call:
    def __init__(self, broker: _Broker) -> None:
        self._broker = broker
        self._responses: asyncio.Queue[Any] = asyncio.Queue()

    async def write(self, request: broker_pb2.ProduceRequest) -> None:
        self._broker.messages.append([e.request_id for e in request.entries])
        self._responses.put_nowait(broker_pb2.ProduceResponse(results=[_answer(e) for e in request.entries]))

    async def read(self) -> Any:
        return await self._responses.get()

    def cancel(self) -> None:
        self._responses.put_nowait(grpc.aio.EOF)


def _answer(entry: broker_pb2.ProduceEntry) -> broker_pb2.ProduceResult:
    if entry.WhichOneof("request") == "send_message":
        return broker_pb2.ProduceResult(request_id=entry.request_id, send_message={"message_id": "M1"})
    return broker_pb2.ProduceResult(request_id=entry.request_id, end_transaction={"transaction_id": "T1"})


class _Unary:
    """The broker's unary methods, counting the calls a coroutine alone makes direct."""

    def __init__(self) -> None:
        self.calls = 0

    async def SendMessage(self, request: Any, timeout: float) -> broker_pb2.SendMessageResponse:
        self.calls += 1
        return broker_pb2.SendMessageResponse(message_id="M1")

    EndTransaction = SendMessage


def _end() -> broker_pb2.ProduceEntry:
    return broker_pb2.ProduceEntry(end_transaction={"transaction_id": "T1"})


def _send() -> broker_pb2.ProduceEntry:
    return broker_pb2.ProduceEntry(send_message={"message": {"topic": "orders"}})


async def _lingering(stream: AsyncProduceStream) -> None:
    """Lets the writer take up the hint queued (it lingers with it, unsent)."""
    for _ in range(10):
        await asyncio.sleep(0)
    assert stream._session is not None and stream._session.queue, "the hint is not waiting unsent"


@pytest.fixture
def linger(monkeypatch):
    def set_linger(seconds: float) -> None:
        monkeypatch.setattr(_produce_stream, "HINT_LINGER_SECONDS", seconds)
    return set_linger


def test_a_coroutine_alone_joins_a_lingering_hint_in_one_message_and_never_waits_for_the_linger(linger) -> None:
    # The next transaction's half message follows the anchored end within a millisecond
    # or so: instead of the unary SendMessage it shares the end's stream message (one gRPC
    # message and one WAL sync for both).
    linger(60.0)

    async def main() -> None:
        broker, unary = _Broker(), _Unary()
        stream = AsyncProduceStream(broker, "broker:1", stub=unary)
        try:
            end = asyncio.ensure_future(stream.request(_end(), 10, stream=True))
            await _lingering(stream)
            assert broker.messages == []
            started = time.monotonic()
            half = await stream.request(_send(), 10)
            assert time.monotonic() - started < 5  # not the 60 s linger
            ended = await asyncio.wait_for(end, 5)
            assert broker.messages == [[ended.request_id, half.request_id]]
            assert unary.calls == 0
        finally:
            await stream.close()

    asyncio.run(main())


def test_a_coroutine_alone_with_no_hint_lingering_goes_direct(linger) -> None:
    linger(60.0)

    async def main() -> None:
        broker, unary = _Broker(), _Unary()
        stream = AsyncProduceStream(broker, "broker:1", stub=unary)
        try:
            result = await stream.request(_send(), 10)
            assert result.send_message.message_id == "M1"
            assert (unary.calls, broker.messages) == (1, [])
        finally:
            await stream.close()

    asyncio.run(main())


def test_a_hint_alone_is_sent_after_the_linger_and_answered(linger) -> None:
    linger(0.05)

    async def main() -> None:
        broker = _Broker()
        stream = AsyncProduceStream(broker, "broker:1", stub=_Unary())
        try:
            started = time.monotonic()
            result = await stream.request(_end(), 10, stream=True)
            assert time.monotonic() - started >= 0.05
            assert result.end_transaction.transaction_id == "T1"
            assert broker.messages == [[result.request_id]]
        finally:
            await stream.close()

    asyncio.run(main())


def test_close_sends_a_lingering_hint_and_it_is_answered(linger) -> None:
    linger(60.0)

    async def main() -> None:
        broker = _Broker()
        stream = AsyncProduceStream(broker, "broker:1", stub=_Unary())
        end = asyncio.ensure_future(stream.request(_end(), 10, stream=True))
        await _lingering(stream)
        started = time.monotonic()
        await stream.close()
        assert time.monotonic() - started < 5
        ended = await asyncio.wait_for(end, 5)  # answered, not ClientClosedError
        assert broker.messages == [[ended.request_id]]

    asyncio.run(main())
