"""What the asyncio SDK gained to be on par with the sync one, against live processes (name
server, broker, checker): the explicit transaction as ``async with`` with a checker (and a
check of an open transaction answered IN_PROGRESS without asking it), ``async for`` over a
consumer, the asyncio push consumer (retries, FIFO groups one at a time), the asyncio
Admin, results carrying the listener's exception in both flavours, and the check drivers
of both flavours sending a decision late when its checker went away."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import txmq
from txmq.aio import (
    AsyncAdmin,
    AsyncProducer,
    AsyncPushConsumer,
    AsyncSimpleConsumer,
    AsyncTransactionListener,
    AsyncTransactionProducer,
)
from txmq.v1 import common_pb2

from tests.integration.test_checks import (
    COMMITTED,
    PREPARED,
    ROLLED_BACK,
    describe,
    received_bodies,
    wait_state,
)
from tests.support import presets
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until

LocalState = txmq.LocalTransactionState


@pytest.fixture
def checked(checks_cluster: Cluster) -> Cluster:
    """test_checks.py's shared cluster (tests/conftest.py): these tests only read it."""
    return checks_cluster


async def subscribed(producer: AsyncTransactionProducer, cluster: Cluster) -> AsyncTransactionProducer:
    await producer.start()
    for _ in range(200):
        if len(producer.connected_checkers()) == len(cluster.checkers):
            return producer
        await asyncio.sleep(0.05)
    raise AssertionError("the asyncio producer did not subscribe with every checker")


# --- the explicit form ----------------------------------------------------------------------

def test_async_with_begin_transaction_commits_and_rolls_back(checked, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def scenario() -> None:
        async with AsyncTransactionProducer(checked.nameserver_address, producer_group=group,
                                            checker=lambda m: LocalState.ROLLBACK,
                                            checker_refresh_seconds=0.5) as producer:
            async with producer.begin_transaction(key="order-1") as tx:
                await producer.send(txmq.Message(topic, b"a1"), tx)
                await producer.send(txmq.Message(topic, b"a2"), tx)
                assert all(describe(checked, m.transaction_id).state == PREPARED for m in tx.messages)
                assert all(m.transaction_key == "order-1" for m in tx.messages)
            assert all(describe(checked, m.transaction_id).state == COMMITTED for m in tx.messages)
            with pytest.raises(txmq.TransactionStateError):
                await producer.send(txmq.Message(topic, b"late"), tx)
            with pytest.raises(RuntimeError):
                async with producer.begin_transaction() as failed:
                    await producer.send(txmq.Message(topic, b"never"), failed)
                    raise RuntimeError("the local transaction failed")
            assert describe(checked, failed.messages[0].transaction_id).state == ROLLED_BACK
            explicit = producer.begin_transaction()
            await producer.send(txmq.Message(topic, b"b1"), explicit)
            assert [r.state for r in await explicit.commit()] == [txmq.TransactionState.COMMITTED]
            with pytest.raises(txmq.InvalidFieldError):
                await producer.send(txmq.Message(topic, b"x"), object())  # type: ignore[arg-type]
        async with AsyncProducer(checked.nameserver_address) as plain:
            await plain.send(txmq.Message(topic, b"marker"))

    asyncio.run(scenario())
    assert received_bodies(checked, topic, unique_name("c"), lambda b: b"marker" in b) == [b"a1", b"a2", b"b1",
                                                                                            b"marker"]


def test_a_check_of_an_open_async_transaction_is_in_progress_without_asking_the_checker(checked, unique_name):
    group, topic = unique_name("g"), unique_name("slow")
    asked: list[str] = []

    async def checker(message: txmq.TransactionMessage) -> LocalState:
        asked.append(message.transaction_id)
        return LocalState.ROLLBACK

    async def scenario() -> str:
        producer = AsyncTransactionProducer(checked.nameserver_address, producer_group=group, checker=checker,
                                            checker_refresh_seconds=0.5, open_transaction_retry_seconds=0.2)
        async with await subscribed(producer, checked):
            tx = producer.begin_transaction()
            await producer.send(txmq.Message(topic, b"slow"), tx)
            tid = tx.messages[0].transaction_id
            for _ in range(300):  # checks every ~0.3 s, answered IN_PROGRESS: none of the budget spent
                if describe(checked, tid).checks_answered >= 4:
                    break
                await asyncio.sleep(0.05)
            row = describe(checked, tid)
            assert row.checks_answered >= 4 and row.state == PREPARED and asked == []
            await tx.commit()
            return tid

    tid = asyncio.run(scenario())
    assert describe(checked, tid).state == COMMITTED


def test_a_checker_coroutine_decides_a_transaction_left_open_by_a_gone_instance(checked, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    committed_keys = {"order-done"}

    async def checker(message: txmq.TransactionMessage) -> LocalState:
        return LocalState.COMMIT if message.transaction_key in committed_keys else LocalState.ROLLBACK

    async def scenario() -> tuple[str, str]:
        gone = AsyncTransactionProducer(checked.nameserver_address, producer_group=group,
                                        checker=lambda m: LocalState.UNKNOWN, answer_checks=False)
        done, half = gone.begin_transaction(key="order-done"), gone.begin_transaction(key="order-half")
        await gone.send(txmq.Message(topic, b"done"), done)
        await gone.send(txmq.Message(topic, b"half"), half)
        await gone.close()  # "dies" before either commit
        answering = AsyncTransactionProducer(checked.nameserver_address, producer_group=group, checker=checker,
                                             checker_refresh_seconds=0.5)
        async with await subscribed(answering, checked):
            for _ in range(400):
                states = {describe(checked, t.messages[0].transaction_id).state for t in (done, half)}
                if states == {COMMITTED, ROLLED_BACK}:
                    break
                await asyncio.sleep(0.05)
        return done.messages[0].transaction_id, half.messages[0].transaction_id

    done_id, half_id = asyncio.run(scenario())
    assert (describe(checked, done_id).state, describe(checked, half_id).state) == (COMMITTED, ROLLED_BACK)


# --- consumers --------------------------------------------------------------------------------

def test_async_for_over_a_consumer_and_for_over_the_sync_one(checked, unique_name):
    topic = unique_name("t")
    checked.create_topic(topic, 2)
    with txmq.Producer(checked.nameserver_address) as producer:
        for i in range(5):
            producer.send(txmq.Message(topic, b"%d" % i))

    async def scenario() -> list[bytes]:
        got: list[bytes] = []
        async with AsyncSimpleConsumer(checked.nameserver_address, consumer_group=unique_name("c"),
                                       subscriptions={topic: "*"}, await_duration_seconds=0.5) as consumer:
            async for message in consumer:
                got.append(message.body)
                await consumer.ack(message)
                if len(got) == 5:
                    break
        return got

    assert sorted(asyncio.run(asyncio.wait_for(scenario(), 30))) == [b"%d" % i for i in range(5)]
    got: list[bytes] = []
    consumer = txmq.SimpleConsumer(checked.nameserver_address, consumer_group=unique_name("c"),
                                   subscriptions={topic: "*"}, await_duration_seconds=0.5)
    closer = threading.Timer(30, consumer.close)  # ends the loop if the messages never came
    closer.start()
    try:
        for message in consumer.messages(max_messages=2):
            got.append(message.body)
            consumer.ack(message)
            if len(got) == 5:
                consumer.close()  # the iteration ends with the consumer
    finally:
        closer.cancel()
        consumer.close()
    assert sorted(got) == [b"%d" % i for i in range(5)]


def test_the_async_push_consumer_retries_a_failure_and_keeps_a_groups_order(checked, unique_name):
    plain, fifo = unique_name("plain"), unique_name("fifo")
    checked.create_topic(plain, 2)
    with txmq.Admin(checked.nameserver_address) as admin:
        admin.create_topic(fifo, queue_count=2, fifo=True)
    attempts: dict[bytes, list[int]] = {}
    order: dict[str, list[int]] = {"g1": [], "g2": []}
    running: dict[str, int] = {"g1": 0, "g2": 0}
    overlapped: list[str] = []

    async def listener(message: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        if message.topic.endswith(plain):
            attempts.setdefault(message.body, []).append(message.delivery_attempt)
            if message.delivery_attempt == 1:
                raise RuntimeError("first delivery fails")
            return txmq.ConsumeResult.SUCCESS
        group = message.message_group
        running[group] += 1
        if running[group] > 1:
            overlapped.append(group)
        await asyncio.sleep(0.02)
        order[group].append(int(message.body))
        running[group] -= 1
        return txmq.ConsumeResult.SUCCESS

    async def scenario() -> None:
        async with AsyncProducer(checked.nameserver_address) as producer:
            for i in range(3):
                await producer.send(txmq.Message(plain, b"p%d" % i))
            for i in range(6):
                for group in ("g1", "g2"):
                    await producer.send(txmq.Message(fifo, b"%d" % i, message_group=group))
        async with AsyncPushConsumer(checked.nameserver_address, consumer_group=unique_name("c"),
                                     subscriptions={plain: "*", fifo: "*"}, listener=listener,
                                     consume_concurrency=8, retry_backoff_seconds=0.1,
                                     await_duration_seconds=0.5) as consumer:
            assert consumer.consumer_group
            for _ in range(600):
                if len(attempts) == 3 and all(a[-1] == 2 for a in attempts.values()) and \
                        all(len(o) == 6 for o in order.values()):
                    break
                await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert {body: a for body, a in attempts.items()} == {b"p0": [1, 2], b"p1": [1, 2], b"p2": [1, 2]}
    assert order == {"g1": list(range(6)), "g2": list(range(6))} and overlapped == []


def test_the_async_push_consumer_refuses_bad_options_and_restarting():
    for options in ({"consume_concurrency": 0}, {"listener": "no"}, {"retry_backoff_seconds": 0}):
        with pytest.raises(txmq.InvalidFieldError):
            AsyncPushConsumer("127.0.0.1:1", consumer_group="g", subscriptions={"t": "*"},
                              **{"listener": lambda m: txmq.ConsumeResult.SUCCESS, **options})

    async def scenario() -> None:
        consumer = AsyncPushConsumer("127.0.0.1:1", consumer_group="g", subscriptions={"t": "*"},
                                     listener=lambda m: txmq.ConsumeResult.SUCCESS)
        await consumer.start()
        await consumer.shutdown()
        with pytest.raises(txmq.ClientClosedError):
            await consumer.start()

    asyncio.run(scenario())


# --- the asyncio Admin ----------------------------------------------------------------------

def test_the_async_admin_speaks_as_the_sync_one(checked, unique_name):
    topic, group = unique_name("t"), unique_name("pg")

    class Unknown(AsyncTransactionListener):
        async def execute_local_transaction(self, message: Any, arg: Any) -> LocalState:
            return LocalState.UNKNOWN

        async def check_local_transaction(self, message: Any) -> LocalState:
            return LocalState.UNKNOWN

    async def scenario() -> None:
        async with AsyncAdmin(checked.nameserver_address) as admin:
            created = await admin.create_topic(topic, queue_count=2)
            assert created is not None
            with pytest.raises(txmq.TopicExistsError):
                await admin.create_topic(topic, queue_count=2)
            listed, brokers = await asyncio.gather(admin.list_topics(), admin.list_brokers())
            assert topic in {t.topic for t in listed.topics} and brokers.brokers
            async with AsyncTransactionProducer(checked.nameserver_address, producer_group=group,
                                                listener=Unknown(), answer_checks=False) as producer:
                pending = await producer.send_in_transaction(txmq.Message(topic, b"x"))
            rows = (await admin.list_transactions(producer_group=group)).transactions
            assert [r.transaction_id for r in rows] == [pending.transaction_id]
            await admin.resolve_transaction(pending.transaction_id, "rollback", operator="test", reason="parity")
            assert (await admin.describe_transaction(pending.transaction_id)).transaction.state == ROLLED_BACK
            with pytest.raises(txmq.InvalidFieldError):
                await admin.resolve_transaction(pending.transaction_id, "maybe", operator="t", reason="r")
            await admin.delete_topic(topic, force=True)
            with txmq.Admin(checked.nameserver_address) as sync_admin:
                assert topic not in {t.topic for t in sync_admin.list_topics().topics}
        async with AsyncAdmin("127.0.0.1:1", request_timeout_seconds=0.5) as nowhere:
            with pytest.raises(txmq.UnavailableError):
                await nowhere.list_brokers()

    asyncio.run(scenario())


# --- results carry the listener's exception -----------------------------------------------------

class Failing(txmq.TransactionListener):
    def execute_local_transaction(self, message: Any, arg: Any) -> LocalState:
        raise KeyError(arg)

    def check_local_transaction(self, message: Any) -> LocalState:
        return LocalState.ROLLBACK


class AsyncFailing(AsyncTransactionListener):
    async def execute_local_transaction(self, message: Any, arg: Any) -> LocalState:
        raise KeyError(arg)

    async def check_local_transaction(self, message: Any) -> LocalState:
        return LocalState.ROLLBACK


def test_results_carry_the_exception_of_the_local_transaction_in_both_flavours(checked, unique_name):
    topic, group = unique_name("t"), unique_name("pg")
    with txmq.TransactionProducer(checked.nameserver_address, producer_group=group, listener=Failing(),
                                  answer_checks=False) as producer:
        one = producer.send_in_transaction(txmq.Message(topic, b"x"), arg="sync-one")
        many = producer.send_in_transaction([txmq.Message(topic, b"y"), txmq.Message(topic, b"z")], arg="sync-many")

    async def scenario() -> tuple[Any, Any]:
        async with AsyncTransactionProducer(checked.nameserver_address, producer_group=group,
                                            listener=AsyncFailing(), answer_checks=False) as p:
            return (await p.send_in_transaction(txmq.Message(topic, b"x"), arg="aio-one"),
                    await p.send_in_transaction([txmq.Message(topic, b"y"), txmq.Message(topic, b"z")],
                                                arg="aio-many"))

    aio_one, aio_many = asyncio.run(scenario())
    for result, arg in ((one, "sync-one"), (many, "sync-many"), (aio_one, "aio-one"), (aio_many, "aio-many")):
        assert isinstance(result.local_error, KeyError) and result.local_error.args == (arg,)
        assert result.local_state is LocalState.UNKNOWN and result.state is txmq.TransactionState.PREPARED
    with txmq.TransactionProducer(checked.nameserver_address, producer_group=group, answer_checks=False,
                                  listener=Failing()) as producer:
        assert producer.send(txmq.Message(topic, b"plain")).message_id  # a normal send has no local transaction


# --- the check drivers: a decision whose checker went away ----------------------------------------

@pytest.mark.parametrize("flavour", ["threads", "asyncio"])
def test_a_decision_answered_while_its_checker_is_gone_decides_once_it_is_back(fresh_cluster_factory, unique_name,
                                                                                 flavour):
    """The check-stream core's late answer, through each driver: the check's stream ends
    (its checker is SIGKILLed) while the application decides; the answer waits, then goes
    on the next stream subscribed and decides the transaction."""
    cluster = fresh_cluster_factory(broker_env=presets.CHECKS_BROKER, checker=True,
                                    checker_env=presets.QUICK_CHECKER)
    group, topic = unique_name("g"), unique_name("orders")
    cluster.create_topic(topic, 1)
    asked, release = threading.Event(), threading.Event()

    def decide(message: txmq.TransactionMessage) -> LocalState:
        if message.attempt > 1:
            return LocalState.UNKNOWN  # only the first answer, sent late, may decide
        asked.set()
        release.wait(30)
        return LocalState.COMMIT

    class Unknown(txmq.TransactionListener):
        def execute_local_transaction(self, message: Any, arg: Any) -> LocalState:
            return LocalState.UNKNOWN

        def check_local_transaction(self, message: Any) -> LocalState:
            return LocalState.UNKNOWN

    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=Unknown(),
                                  answer_checks=False) as sender:
        tid = sender.send_in_transaction(txmq.Message(topic, b"x")).transaction_id

    def meanwhile() -> None:
        wait_until(asked.is_set, 15, message="no check came")
        cluster.checkers[0].kill()
        release.set()  # answered with no checker there: kept, then sent late
        cluster.checkers[0].restart()

    if flavour == "threads":
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, checker=decide,
                                      checker_refresh_seconds=0.5):
            meanwhile()
            row = wait_state(cluster, tid, COMMITTED, timeout=30)
    else:
        async def scenario() -> None:
            async def checker(message: txmq.TransactionMessage) -> LocalState:
                return await asyncio.to_thread(decide, message)

            async with AsyncTransactionProducer(cluster.nameserver_address, producer_group=group, checker=checker,
                                                checker_refresh_seconds=0.5):
                await asyncio.to_thread(meanwhile)
                await asyncio.to_thread(wait_state, cluster, tid, COMMITTED, 30)

        asyncio.run(scenario())
        row = describe(cluster, tid)
    assert row.state == COMMITTED and row.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
