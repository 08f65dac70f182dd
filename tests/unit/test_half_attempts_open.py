"""Both producers keep each attempt of a half message's send open here while the send
runs (``txmq._producing.HalfAttempts``; the plan itself in test_send_plans.py): a check of
it meanwhile is answered IN_PROGRESS, never asked of the listener. The send itself is the
producer's I/O step, replaced here by one that looks at the producer mid-send (no broker)."""

from __future__ import annotations

import asyncio

import txmq
from txmq import aio
from txmq._calling import QueueRoute
from txmq.v1 import broker_pb2

NOWHERE = "127.0.0.1:1"
ROUTE = QueueRoute("broker-a", "a:1", 0)


class Listener(txmq.TransactionListener):
    def execute_local_transaction(self, message, arg):
        return txmq.LocalTransactionState.COMMIT

    def check_local_transaction(self, message):
        return txmq.LocalTransactionState.ROLLBACK


class AsyncListener(aio.AsyncTransactionListener):
    async def execute_local_transaction(self, message, arg):
        return txmq.LocalTransactionState.COMMIT

    async def check_local_transaction(self, message):
        return txmq.LocalTransactionState.ROLLBACK


def _stored(message_id: str) -> broker_pb2.SendMessageResponse:
    return broker_pb2.SendMessageResponse(message_id=message_id, transaction_id="t-1", broker_name="broker-a")


def test_the_sync_producer_keeps_a_half_attempt_open_while_it_is_sent() -> None:
    seen: list[bool] = []
    with txmq.TransactionProducer(NOWHERE, producer_group="pg", listener=Listener(), answer_checks=False) as p:
        def send_new(topic, build, message_group=""):
            pb = build(ROUTE, f"m-{len(seen)}")
            seen.append(pb.message_id in p._open)
            return ROUTE, pb, _stored(pb.message_id)

        p._send_new = send_new
        half, _route = p._send_half(txmq.Message("t", b"x"))
        assert seen == [True] and half.message_id not in p._open  # the listener's to answer after
        tx = p.begin_transaction()
        receipt = p.send(txmq.Message("t", b"y"), tx)
        assert seen == [True, True] and receipt.message_id in p._open  # open until tx ends
        tx.rollback()
        assert receipt.message_id not in p._open


def test_the_asyncio_producer_keeps_a_half_attempt_open_while_it_is_sent() -> None:
    async def scenario() -> None:
        seen: list[bool] = []
        async with aio.AsyncTransactionProducer(NOWHERE, producer_group="pg", listener=AsyncListener(),
                                                answer_checks=False) as p:
            async def send_new(topic, build, message_group=""):
                pb = build(ROUTE, f"m-{len(seen)}")
                seen.append(pb.message_id in p._open)
                return ROUTE, pb, _stored(pb.message_id)

            p._send_new = send_new
            half = await p._send_half(txmq.Message("t", b"x"))
            assert seen == [True] and half.message_id not in p._open
            tx = p.begin_transaction()
            receipt = await p.send(txmq.Message("t", b"y"), tx)
            assert seen == [True, True] and receipt.message_id in p._open
            await tx.rollback()
            assert receipt.message_id not in p._open

    asyncio.run(scenario())
