"""Deleting a consumer group (``AdminService.DeleteConsumerGroup``, ``txmq group delete``)
against real processes: an idle group's positions go on every broker (a dry run first
changes nothing), survive no restart, and a new receive starts the group afresh; a group
with a consumer waiting in a long poll is refused unless forced, and the receipts it held
acknowledge nothing afterwards (not even once the group is receiving again); dead letters
are kept unless asked; the CLI. Auth and quotas are in test_tenant_quotas.py, the
replicated shard in test_group_delete_replicated below."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

import txmq
import txmq.aio
from tests.support.cli import txmq_cli
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2

#: Receivers are live this long after their last receive (the brokers' setting here).
SESSION_SECONDS = 1.5


@pytest.fixture
def cluster(fresh_cluster_factory):
    return fresh_cluster_factory(brokers=2, broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": str(SESSION_SECONDS)})


def consumer(cluster, group: str, topic: str, wait: float = 0.3) -> txmq.SimpleConsumer:
    return txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                               await_duration_seconds=wait)


def send(cluster, topic: str, count: int) -> list[txmq.SendReceipt]:
    with txmq.Producer(cluster.nameserver_address) as p:
        return [p.send(txmq.Message(topic, f"m{i}".encode())) for i in range(count)]


def drain(cluster, group: str, topic: str, count: int) -> list[txmq.ReceivedMessage]:
    got: list[txmq.ReceivedMessage] = []
    with consumer(cluster, group, topic) as c:
        def step() -> bool:
            for m in c.receive(max_messages=64):
                got.append(m)
                c.ack(m)
            return len(got) >= count
        wait_until(step, 60, message=lambda: f"received {len(got)} of {count}")
    return got


def wait_not_live(admin: txmq.Admin, group: str) -> None:
    wait_until(lambda: not admin.delete_consumer_group(group, dry_run=True).live_consumers, SESSION_SECONDS * 20,
               message="the stopped consumer stays live")


def test_an_idle_group_goes_on_every_broker_stays_gone_and_starts_afresh(cluster, unique_name) -> None:
    topic, group, other = unique_name("del"), unique_name("g"), unique_name("keep")
    cluster.create_topic(topic, queue_count=4)  # over both brokers
    receipts = send(cluster, topic, 12)
    assert len({r.broker_name for r in receipts}) == 2
    drain(cluster, group, topic, 12)
    drain(cluster, other, topic, 12)
    with txmq.Admin(cluster.nameserver_address) as admin:
        wait_not_live(admin, group)
        admin.reset_offsets(group, topic, shift=0, dry_run=False, operator="ann")  # a reset record too
        dry = admin.delete_consumer_group(group, dry_run=True)
        assert not dry.applied and sorted(b.broker_name for b in dry.brokers) == ["broker-0", "broker-1"]
        assert sum(b.cursors for b in dry.brokers) == 4 and all(b.resets == 1 for b in dry.brokers)
        assert admin.consumer_groups(group).queues  # a dry run changed nothing
        with pytest.raises(txmq.InvalidFieldError, match="operator"):
            admin.delete_consumer_group(group)
        done = admin.delete_consumer_group(group, operator="ann", reason="retired service")
        assert done.applied and done.operator == "ann" and not done.unreachable_brokers
        assert sorted(b.broker_name for b in done.brokers) == ["broker-0", "broker-1"]
        assert [t for b in done.brokers for t in b.topics] == [topic, topic]
        with pytest.raises(txmq.ConsumerGroupNotFoundError):
            admin.consumer_groups(group)
        with pytest.raises(txmq.ConsumerGroupNotFoundError):
            admin.delete_consumer_group(group, operator="ann")  # nothing left anywhere
        assert len(admin.consumer_groups(other).queues) == 4  # another group of the topic keeps its place
    for i in range(2):
        cluster.restart_broker(i)
    with txmq.Admin(cluster.nameserver_address) as admin:
        with pytest.raises(txmq.ConsumerGroupNotFoundError):
            admin.consumer_groups(group)
        # The group is new again: from the oldest retained message, first attempts.
        again = drain(cluster, group, topic, 12)
        assert sorted((m.broker_name, m.queue_id, m.queue_offset) for m in again) == sorted(
            (r.broker_name, r.queue_id, r.queue_offset) for r in receipts)
        assert {m.delivery_attempt for m in again} == {1}
        status = admin.consumer_groups(group, topic=topic).queues
        assert len(status) == 4 and not any(q.last_reset_operator for q in status)  # its reset records went


def test_a_live_group_is_refused_unless_forced_and_its_receipts_go_stale(cluster, unique_name) -> None:
    topic, group = unique_name("live"), unique_name("g")
    cluster.create_topic(topic, queue_count=1)
    send(cluster, topic, 2)
    waiter_got: list[txmq.ReceivedMessage] = []
    with consumer(cluster, group, topic) as holder, consumer(cluster, group, topic, wait=8) as waiter, \
            txmq.Admin(cluster.nameserver_address) as admin:
        held = holder.receive(max_messages=2)
        assert [m.queue_offset for m in held] == [0, 1]
        thread = threading.Thread(target=lambda: waiter_got.extend(waiter.receive(max_messages=2)))
        thread.start()
        try:
            wait_until(lambda: any(c.waiting for c in admin.delete_consumer_group(group, dry_run=True).live_consumers),
                       20, message="the long poll is not seen waiting")
            dry = admin.delete_consumer_group(group, dry_run=True)
            assert dry.brokers[0].inflight == 2 and dry.brokers[0].clients == 2
            with pytest.raises(txmq.GroupNotEmptyError, match=group) as refused:
                admin.delete_consumer_group(group, operator="bob")
            assert refused.value.code.name == "FAILED_PRECONDITION" and len(refused.value.consumers) == 2
            assert admin.consumer_groups(group).queues  # refused: nothing deleted
            done = admin.delete_consumer_group(group, force=True, operator="bob")
            assert done.applied and done.brokers[0].inflight == 2
            thread.join(20)
        finally:
            thread.join(20)
        # The waiting receive started the group afresh and got both messages again...
        assert [m.queue_offset for m in waiter_got] == [0, 1], waiter_got
        # ...as new deliveries: the handles held from before the deletion settle none of them.
        assert [m.delivery_attempt for m in waiter_got] == [2, 2]
        for m in held:
            with pytest.raises(txmq.ReceiptHandleNotFoundError):
                holder.ack(m)
        for m in waiter_got:
            waiter.ack(m)


def test_dead_letters_are_kept_unless_asked_and_the_cli(fresh_cluster_factory, unique_name) -> None:
    cluster = fresh_cluster_factory(brokers=1, broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": str(SESSION_SECONDS),
                                                           "TXMQ_MAX_DELIVERY_ATTEMPTS": "1"})
    topic, group = unique_name("dlq"), unique_name("g")
    cluster.create_topic(topic, queue_count=1)
    send(cluster, topic, 1)
    with consumer(cluster, group, topic) as c, txmq.Admin(cluster.nameserver_address) as admin:
        assert len(c.receive(max_messages=1, invisible_duration_seconds=0.2)) == 1
        wait_until(lambda: not c.receive(max_messages=1) and admin.dead_letters(group).messages, 20,
                   message="no dead letter")
    with txmq.Admin(cluster.nameserver_address) as admin:
        wait_not_live(admin, group)
    async def dry_run_async() -> admin_pb2.DeleteConsumerGroupResponse:
        async with txmq.aio.AsyncAdmin(cluster.nameserver_address) as admin:
            return await admin.delete_consumer_group(group, dry_run=True)
    dry = asyncio.run(dry_run_async())  # the asyncio flavour answers the same
    assert not dry.applied and dry.brokers[0].dead_letters == 1 and dry.brokers[0].cursors == 1
    done = txmq_cli(cluster, "group", "delete", group, "--dry-run")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["applied"] is False and data["brokers"][0]["dead_letters"] == 1
    done = txmq_cli(cluster, "group", "delete", group, "--operator", "carol")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["applied"] is True and data["operator"] == "carol"
    assert data["brokers"][0]["cursors"] == 1 and data["brokers"][0]["dead_letter_topic_deleted"] is False
    with txmq.Admin(cluster.nameserver_address) as admin:
        assert len(admin.dead_letters(group).messages) == 1  # kept, readable and re-drivable
    done = txmq_cli(cluster, "group", "delete", group, "--dead-letters", "--operator", "carol")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["brokers"][0]["dead_letter_topic_deleted"] is True
    with txmq.Admin(cluster.nameserver_address) as admin:
        with pytest.raises(txmq.ConsumerGroupNotFoundError):
            admin.dead_letters(group)  # %DLQ% and its dead letters went too
    done = txmq_cli(cluster, "group", "delete", group, "--operator", "carol")
    assert done.returncode == 1 and json.loads(done.stderr)["error"]["reason"] == "CONSUMER_GROUP_NOT_FOUND"


@pytest.mark.timeout(240)
def test_group_delete_replicated(fresh_cluster_factory, unique_name) -> None:
    """RF3: the deletion is one replicated write; the next leader knows nothing of the group."""
    from tests.support import replicas

    cluster = fresh_cluster_factory(brokers=1, replication_factor=3,
                                    broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": str(SESSION_SECONDS)})
    topic, group = unique_name("rf3"), unique_name("g")
    cluster.create_topic(topic, 2)
    send(cluster, topic, 10)
    drain(cluster, group, topic, 10)
    with txmq.Admin(cluster.nameserver_address) as admin:
        wait_not_live(admin, group)
        assert admin.delete_consumer_group(group, operator="frank").applied
    replicas.wait_in_sync(cluster, "broker-0")
    old = cluster.wait_leaders()["broker-0"]
    old.kill()
    cluster.wait_leaders(not_on=old)
    with txmq.Admin(cluster.nameserver_address) as admin:
        with pytest.raises(txmq.ConsumerGroupNotFoundError):
            wait_until(lambda: admin.consumer_groups(group), 30, ignore=(txmq.UnavailableError,))
    assert len(drain(cluster, group, topic, 10)) == 10  # afresh, from the new leader
    old.restart(60)
    replicas.stop_and_compare(cluster, "broker-0")
