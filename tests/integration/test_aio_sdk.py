"""The asyncio SDK (``txmq.aio``) against real name server, broker and checker processes.

One module cluster with a checker and sub-second check timings (a transaction left
UNKNOWN is checked within about a second); each test uses topics and groups of its own.
Tests drive the coroutines with ``asyncio.run``; waits are deadlines.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import pytest

import txmq
from txmq.aio import AsyncProducer, AsyncSimpleConsumer, AsyncTransactionListener, AsyncTransactionProducer
from tests.support.cluster import Cluster

LocalState = txmq.LocalTransactionState
AWAIT_SECONDS = 0.5


@pytest.fixture
def checked_cluster(flow_cluster: Cluster) -> Cluster:
    """test_check_flow.py's shared cluster (``flow_cluster``, tests/conftest.py)."""
    return flow_cluster


class Orders(AsyncTransactionListener):
    """A local 'database' (a dict) the listener writes and the check reads, as a service would."""

    def __init__(self, decide: Callable[[bytes], Any] | None = None) -> None:
        self.db: dict[str, bytes] = {}
        self.decide = decide or (lambda body: LocalState.COMMIT)
        self.checked: list[str] = []

    async def execute_local_transaction(self, message: txmq.TransactionMessage, arg: Any) -> LocalState:
        await asyncio.sleep(0)  # a real driver awaits its database here
        outcome = self.decide(message.message.body)
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome in (LocalState.COMMIT, "commit-in-db-only"):
            self.db[message.transaction_id] = message.message.body
        return LocalState.UNKNOWN if outcome == "commit-in-db-only" else outcome

    async def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        self.checked.append(message.transaction_id)
        return LocalState.COMMIT if message.transaction_id in self.db else LocalState.ROLLBACK


async def drain(ns: str, group: str, topic: str, until: Callable[[list[txmq.ReceivedMessage]], bool],
                timeout: float = 20.0) -> list[txmq.ReceivedMessage]:
    """Receives and acknowledges until ``until(everything received)``, within ``timeout``."""
    got: list[txmq.ReceivedMessage] = []
    async with AsyncSimpleConsumer(ns, consumer_group=group, subscriptions={topic: "*"},
                                   await_duration_seconds=AWAIT_SECONDS) as consumer:
        deadline = time.monotonic() + timeout
        while not until(got):
            assert time.monotonic() < deadline, f"received {len(got)} messages within {timeout}s"
            batch = await consumer.receive(max_messages=256, invisible_duration_seconds=30)
            assert not any(await consumer.ack_many(batch))
            got.extend(batch)
    return got


def test_concurrent_transactions_commit_once_each_and_share_stream_messages(checked_cluster: Cluster,
                                                                           unique_name) -> None:
    topic, group = unique_name("orders"), unique_name("consumers")
    checked_cluster.create_topic(topic, 4)
    ns = checked_cluster.nameserver_address
    count = 400

    async def main() -> tuple[list[txmq.TransactionResult], tuple[int, int], int, list[txmq.ReceivedMessage]]:
        listener = Orders()
        async with AsyncTransactionProducer(ns, producer_group=unique_name("pg"), listener=listener) as producer:
            results = await asyncio.gather(*(producer.send_in_transaction(txmq.Message(topic, b"%d" % i))
                                             for i in range(count)))
            stats = producer.stream_stats()
            direct = sum(s.direct_sent for s in producer._client._streams.values())
        bodies = {b"%d" % i for i in range(count)}
        got = await drain(ns, group, topic, lambda got: bodies <= {m.body for m in got})
        return results, stats, direct, got

    results, (messages, requests), direct, got = asyncio.run(main())
    assert [r.state for r in results] == [txmq.TransactionState.COMMITTED] * count
    assert len({r.transaction_id for r in results}) == count
    assert sorted(m.body for m in got) == sorted(b"%d" % i for i in range(count))  # once each
    # Every half message and every commit went over the shared stream, but for those of a
    # coroutine alone (the first, the last), sent direct ...
    assert requests + direct == 2 * count and direct <= count / 20, (requests, direct)
    # ... many to a message: concurrent coroutines batch instead of one message each.
    assert messages <= requests / 4, f"{requests} requests in {messages} stream messages"


def test_a_coroutine_alone_sends_direct_and_concurrent_ones_take_the_stream(checked_cluster: Cluster,
                                                                            unique_name) -> None:
    topic = unique_name("orders")
    checked_cluster.create_topic(topic, 1)
    ns = checked_cluster.nameserver_address

    async def main() -> tuple[txmq.TransactionResult, tuple[int, int], int, tuple[int, int]]:
        async with AsyncTransactionProducer(ns, producer_group=unique_name("pg"), listener=Orders()) as producer:
            alone = await producer.send_in_transaction(txmq.Message(topic, b"alone"))
            streams = producer._client._streams.values()
            before = producer.stream_stats(), sum(s.direct_sent for s in streams)
            await asyncio.gather(*(producer.send_in_transaction(txmq.Message(topic, b"%d" % i)) for i in range(8)))
            return alone, before[0], before[1], producer.stream_stats()

    alone, stream_before, direct, stream_after = asyncio.run(main())
    assert alone.state is txmq.TransactionState.COMMITTED
    assert (stream_before, direct) == ((0, 0), 2)  # its half message and its commit: unary calls
    assert stream_after[1] >= 8  # eight at once: most of their requests on the stream


def test_rollback_is_never_delivered_and_unknown_is_decided_by_the_async_check(checked_cluster: Cluster,
                                                                              unique_name) -> None:
    topic, group = unique_name("orders"), unique_name("consumers")
    checked_cluster.create_topic(topic, 1)
    ns = checked_cluster.nameserver_address
    outcomes = {b"rolled-back": LocalState.ROLLBACK, b"unknown-committed": "commit-in-db-only",
                b"unknown-absent": LocalState.UNKNOWN, b"marker": LocalState.COMMIT}

    async def main() -> tuple[dict[bytes, txmq.TransactionResult], Orders, list[txmq.ReceivedMessage]]:
        listener = Orders(lambda body: outcomes[body])
        async with AsyncTransactionProducer(ns, producer_group=unique_name("pg"), listener=listener) as producer:
            results = {}
            for body in outcomes:  # one queue: consumers see commits in commit order
                results[body] = await producer.send_in_transaction(txmq.Message(topic, body))
            # The UNKNOWN one the local database committed is committed by the check, after the marker.
            got = await drain(ns, group, topic, lambda got: b"unknown-committed" in {m.body for m in got})
            # The UNKNOWN one the database does not know is answered ROLLBACK by its check.
            deadline = time.monotonic() + 20
            while results[b"unknown-absent"].transaction_id not in listener.checked:
                assert time.monotonic() < deadline, "the async listener was never asked"
                await asyncio.sleep(0.05)
            return results, listener, got

    results, listener, got = asyncio.run(main())
    assert results[b"rolled-back"].state is txmq.TransactionState.ROLLED_BACK
    assert results[b"unknown-committed"].state is txmq.TransactionState.PREPARED
    assert [m.body for m in got] == [b"marker", b"unknown-committed"]
    assert results[b"unknown-committed"].transaction_id in listener.checked


def test_orphan_of_a_producer_that_never_ended_is_answered_by_another_async_instance(checked_cluster: Cluster,
                                                                                   unique_name) -> None:
    """A process that committed its database and died before EndTransaction: another
    instance of the group, sharing the database, answers the check."""
    topic, group, pg = unique_name("orders"), unique_name("consumers"), unique_name("pg")
    checked_cluster.create_topic(topic, 1)
    ns = checked_cluster.nameserver_address

    async def main() -> list[txmq.ReceivedMessage]:
        crashed = Orders(lambda body: "commit-in-db-only")
        async with AsyncTransactionProducer(ns, producer_group=pg, listener=crashed, answer_checks=False) as gone:
            orphan = await gone.send_in_transaction(txmq.Message(topic, b"orphan"))
            assert orphan.state is txmq.TransactionState.PREPARED
        survivor = Orders()
        survivor.db.update(crashed.db)  # the same database
        async with AsyncTransactionProducer(ns, producer_group=pg, listener=survivor):
            return await drain(ns, group, topic, lambda got: bool(got))

    assert [m.body for m in asyncio.run(main())] == [b"orphan"]


def test_sends_survive_a_broker_restart_with_each_acknowledged_message_stored_once(fresh_cluster_factory,
                                                                                  unique_name) -> None:
    cluster = fresh_cluster_factory()
    topic, group = unique_name("events"), unique_name("consumers")
    cluster.create_topic(topic, 2)
    ns = cluster.nameserver_address

    async def main() -> tuple[list[txmq.SendReceipt], int, list[txmq.ReceivedMessage]]:
        receipts: list[txmq.SendReceipt] = []
        failed = 0
        async with AsyncProducer(ns, send_timeout_seconds=2.0, max_attempts=8, retry_backoff_seconds=0.2) as producer:
            async def sender(i: int) -> None:
                nonlocal failed
                for n in range(30):
                    try:
                        receipts.append(await producer.send(txmq.Message(topic, b"%d-%d" % (i, n))))
                    except txmq.TxmqError as err:
                        assert err.retryable, err
                        failed += 1
            senders = asyncio.gather(*(sender(i) for i in range(8)))
            await asyncio.sleep(0.2)
            await asyncio.to_thread(cluster.restart_broker, 0)
            await senders
        acknowledged = {r.message_id for r in receipts}
        got = await drain(ns, group, topic, lambda got: acknowledged <= {m.message_id for m in got})
        return receipts, failed, got

    receipts, failed, got = asyncio.run(main())
    assert len(receipts) + failed == 8 * 30
    assert len(receipts) >= 8 * 30 - failed and receipts
    ids = [m.message_id for m in got]
    assert len(ids) == len(set(ids)), "a message stored twice"
    assert {r.message_id for r in receipts} <= set(ids)


def test_bad_input_and_closed_clients_raise_the_sync_sdks_errors(cluster: Cluster, unique_name) -> None:
    ns = cluster.nameserver_address

    class Blocking:
        def execute_local_transaction(self, message: Any, arg: Any) -> LocalState:
            return LocalState.COMMIT

        def check_local_transaction(self, message: Any) -> LocalState:
            return LocalState.COMMIT

    with pytest.raises(txmq.InvalidFieldError, match="coroutine function"):
        AsyncTransactionProducer(ns, producer_group="pg", listener=Blocking())  # type: ignore[arg-type]

    async def main() -> None:
        producer = AsyncProducer(ns, max_body_bytes=10)
        with pytest.raises(txmq.InvalidNameError):
            await producer.send(txmq.Message("no spaces in names", b"x"))
        with pytest.raises(txmq.MessageTooLargeError):
            await producer.send(txmq.Message(unique_name("t"), b"x" * 11))
        await producer.close()
        with pytest.raises(txmq.ClientClosedError):
            await producer.send(txmq.Message(unique_name("t"), b"x"))
        consumer = AsyncSimpleConsumer(ns, consumer_group=unique_name("g"), subscriptions={unique_name("t"): "*"})
        with pytest.raises(txmq.InvalidFieldError, match="max_messages"):
            await consumer.receive(max_messages=0)
        await consumer.close()

    asyncio.run(main())


def test_invisibility_change_and_a_stale_receipt_handle(cluster: Cluster, unique_name) -> None:
    topic, group = unique_name("events"), unique_name("consumers")
    cluster.create_topic(topic, 1)
    ns = cluster.nameserver_address

    async def main() -> None:
        async with AsyncProducer(ns) as producer:
            await producer.send(txmq.Message(topic, b"once"))
        async with AsyncSimpleConsumer(ns, consumer_group=group, subscriptions={topic: "*"},
                                       await_duration_seconds=AWAIT_SECONDS) as consumer:
            deadline = time.monotonic() + 10
            got: list[txmq.ReceivedMessage] = []
            while not got:
                assert time.monotonic() < deadline
                got = await consumer.receive(max_messages=1, invisible_duration_seconds=30)
            first = got[0]
            changed = await consumer.change_invisible_duration(first, 0.2)  # redelivered soon
            again: list[txmq.ReceivedMessage] = []
            while not again:
                assert time.monotonic() < deadline, "not redelivered after its invisibility ran out"
                again = await consumer.receive(max_messages=1, invisible_duration_seconds=30)
            assert again[0].message_id == first.message_id
            assert again[0].delivery_attempt == first.delivery_attempt + 1
            with pytest.raises(txmq.NotFoundError):
                await consumer.ack(changed)  # superseded by the redelivery
            await consumer.ack(again[0])

    asyncio.run(main())
