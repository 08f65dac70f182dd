"""A multi-message transaction keeps every field of its messages (issue 32, item 5): a delay
(``delay_seconds`` / ``delivery_time``) holds each committed message back like a single
one, and a FIFO topic's messages keep their ``message_group`` (same queue, in order), with
the sync and the asyncio producer. Before the fix each part was rebuilt without these
fields: delayed messages were delivered at once and a FIFO transaction was refused
("every message needs a message group")."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest

import txmq
import txmq.aio
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2

LocalState = txmq.LocalTransactionState
DELAY_SECONDS = 2.0


class Commit(txmq.TransactionListener):
    def execute_local_transaction(self, message, arg):
        return LocalState.COMMIT

    def check_local_transaction(self, message):
        return LocalState.COMMIT


class AsyncCommit(txmq.aio.AsyncTransactionListener):
    async def execute_local_transaction(self, message, arg):
        return LocalState.COMMIT

    async def check_local_transaction(self, message):
        return LocalState.COMMIT


def _receive_all(cluster, group: str, topic: str, count: int) -> list[tuple[float, txmq.ReceivedMessage]]:
    got: list[tuple[float, txmq.ReceivedMessage]] = []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as consumer:
        def step() -> bool:
            for m in consumer.receive(max_messages=16):
                got.append((time.time(), m))
                consumer.ack(m)
            return len(got) >= count

        wait_until(step, 30, message=f"{count} messages of {topic} not received")
    return got


def _send(flavour: str, cluster, group: str, messages: list[txmq.Message]):
    if flavour == "sync":
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group,
                                      listener=Commit()) as producer:
            return producer.send_in_transaction(messages)

    async def main():
        async with txmq.aio.AsyncTransactionProducer(cluster.nameserver_address, producer_group=group,
                                                     listener=AsyncCommit()) as producer:
            return await producer.send_in_transaction(messages)

    return asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_delays_of_a_multi_message_transaction_hold_its_messages_back(cluster, unique_name, flavour) -> None:
    topic = unique_name("delayed")
    cluster.create_topic(topic, queue_count=2)
    sent_at = time.time()
    due = dt.datetime.fromtimestamp(sent_at + DELAY_SECONDS, tz=dt.UTC)
    result = _send(flavour, cluster, unique_name("pg"), [
        txmq.Message(topic, b"delayed", delay_seconds=DELAY_SECONDS),
        txmq.Message(topic, b"timed", delivery_time=due)])
    assert result.state == txmq.TransactionState.COMMITTED
    got = _receive_all(cluster, unique_name("cg"), topic, 2)
    assert sorted(m.body for _, m in got) == [b"delayed", b"timed"]
    for received_at, m in got:
        # Not before its time, on the consumer's clock (same host) and the broker's stamp.
        assert received_at >= sent_at + DELAY_SECONDS - 0.05, (m.body, received_at - sent_at)
        assert m.visible_at.timestamp() >= m.stored_at.timestamp() + DELAY_SECONDS - 0.5, m.body


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_fifo_multi_message_transaction_keeps_its_message_group(cluster, unique_name, flavour) -> None:
    topic = unique_name("fifo")
    cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(
        topic=topic, queue_count=4, topic_type=common_pb2.TOPIC_TYPE_FIFO), timeout=10)
    cluster.wait_route(topic, 4)
    bodies = [f"step-{i}".encode() for i in range(5)]
    result = _send(flavour, cluster, unique_name("pg"),
                   [txmq.Message(topic, b, message_group="order-7") for b in bodies])
    assert result.state == txmq.TransactionState.COMMITTED
    assert len({part.queue_id for part in result.messages}) == 1  # one group, one queue
    got = _receive_all(cluster, unique_name("cg"), topic, len(bodies))
    assert [m.body for _, m in got] == bodies  # one at a time, in order
    assert {m.message_group for _, m in got} == {"order-7"}
