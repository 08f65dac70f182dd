"""FIFO message groups against real name server and broker processes: the topic type
travels admin → name server → broker → routes; a FIFO topic needs a message group and a
normal one refuses it; a group's messages go to one queue and are delivered one at a time
in order (the next only after the previous is acknowledged or dead-lettered) while groups
flow in parallel; redeliveries keep the group blocked; transactional messages follow
commit order; and the delivery state survives a SIGKILL of the broker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import txmq
from tests.support.waiting import wait_until
from txmq.fifo import group_queue_index
from txmq.v1 import admin_pb2, common_pb2, nameserver_pb2

LocalState = txmq.LocalTransactionState


def create_fifo(cluster, topic: str, queue_count: int = 2) -> None:
    cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(
        topic=topic, queue_count=queue_count, topic_type=common_pb2.TOPIC_TYPE_FIFO), timeout=10)
    cluster.wait_route(topic, queue_count)


def consumer(cluster, group: str, topic: str) -> txmq.SimpleConsumer:
    return txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                               await_duration_seconds=0.3)


def drain(c: txmq.SimpleConsumer, want: int, invisible: float = 30.0, ack: bool = True) -> list[txmq.ReceivedMessage]:
    got: list[txmq.ReceivedMessage] = []

    def step() -> bool:
        batch = c.receive(max_messages=32, invisible_duration_seconds=invisible)
        got.extend(batch)
        if ack:
            for m in batch:
                c.ack(m)
        return len(got) >= want
    wait_until(step, timeout=20, message=f"{want} messages")
    return got


def test_topic_type_travels_to_routes_cli_and_is_checked_on_send(cluster, unique_name) -> None:
    fifo, normal = unique_name("fifo"), unique_name("plain")
    cli = [sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, "--json"]
    created = subprocess.run([*cli, "topic", "create", fifo, "--type", "fifo", "--queues", "2"],
                             capture_output=True, text=True, timeout=30)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["type"] == "FIFO"
    cluster.wait_route(fifo, 2)
    cluster.create_topic(normal, queue_count=2)
    described = subprocess.run([*cli, "topic", "describe", fifo], capture_output=True, text=True, timeout=30)
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["type"] == "FIFO"
    listed = json.loads(subprocess.run([*cli, "topic", "list"], capture_output=True, text=True, timeout=30).stdout)
    types = {t["topic"]: t["type"] for t in listed["topics"]}
    assert types[fifo] == "FIFO" and types[normal] == "NORMAL"
    route = cluster.nameserver_stub().QueryRoute(nameserver_pb2.QueryRouteRequest(topic=fifo), timeout=10)
    assert route.topic_type == common_pb2.TOPIC_TYPE_FIFO
    with txmq.Producer(cluster.nameserver_address) as producer:
        with pytest.raises(txmq.InvalidFieldError) as no_group:
            producer.send(txmq.Message(fifo, b"x"))
        assert no_group.value.field == "message_group"
        with pytest.raises(txmq.InvalidFieldError) as grouped:
            producer.send(txmq.Message(normal, b"x", message_group="g1"))
        assert grouped.value.field == "message_group"
        receipt = producer.send(txmq.Message(fifo, b"x", message_group="g1"))
        routes = cluster.query_route(fifo)
        assert receipt.queue_id == routes[group_queue_index("g1", len(routes))].queue_id


def test_a_group_is_delivered_one_at_a_time_in_order_groups_in_parallel(cluster, unique_name) -> None:
    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(cluster, topic, queue_count=1)  # one queue: every group interleaved in it
    with txmq.Producer(cluster.nameserver_address) as producer:
        for i in range(3):
            for g in ("a", "b"):
                producer.send(txmq.Message(topic, f"{g}{i}".encode(), message_group=g))
    with consumer(cluster, group, topic) as c:
        first = drain(c, 2, ack=False)
        assert sorted(m.body for m in first) == [b"a0", b"b0"]  # one per group, in parallel
        assert [m.message_group for m in sorted(first, key=lambda m: m.body)] == ["a", "b"]
        assert c.receive(max_messages=32) == []  # both groups wait for their acks
        a0 = next(m for m in first if m.body == b"a0")
        c.ack(a0)
        nxt = drain(c, 1, ack=False)
        assert [m.body for m in nxt] == [b"a1"]  # only group a moves on
        c.ack(nxt[0])
        b0 = next(m for m in first if m.body == b"b0")
        c.ack(b0)
        rest = drain(c, 3)
        assert sorted(m.body for m in rest)[:1] == [b"a2"]
        assert len(rest) >= 3


def test_redelivery_keeps_the_group_blocked_and_a_dead_letter_unblocks_it(fresh_cluster_factory,
                                                                           unique_name) -> None:
    cl = fresh_cluster_factory(broker_env={"TXMQ_MAX_DELIVERY_ATTEMPTS": "2",
                                           "TXMQ_MIN_INVISIBLE_DURATION_SECONDS": "0.1"})
    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(cl, topic, queue_count=1)
    with txmq.Producer(cl.nameserver_address) as producer:
        for i in range(3):
            producer.send(txmq.Message(topic, f"m{i}".encode(), message_group="g"))
    with consumer(cl, group, topic) as c:
        seen: list[tuple[bytes, int]] = []

        def step() -> bool:
            for m in c.receive(max_messages=8, invisible_duration_seconds=0.2):
                seen.append((m.body, m.delivery_attempt))
                if m.body != b"m0":
                    c.ack(m)  # m0 is never acknowledged: redelivered, then dead-lettered
            return any(b == b"m2" for b, _a in seen)
        wait_until(step, timeout=20, message="m2 after m0 was dead-lettered")
        assert seen[:2] == [(b"m0", 1), (b"m0", 2)], seen  # nothing of the group while m0 is in flight
        assert [b for b, _a in seen[2:]] == [b"m1", b"m2"], seen


def test_transactional_messages_follow_commit_order(cluster, unique_name) -> None:
    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(cluster, topic, queue_count=2)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                  checker=lambda m: LocalState.UNKNOWN, answer_checks=False) as producer:
        txs = []
        for i in range(3):
            tx = producer.begin_transaction()
            producer.send(txmq.Message(topic, f"t{i}".encode(), message_group="order-1"), tx)
            txs.append(tx)
        for tx in reversed(txs):  # commit t2, t1, t0
            tx.commit()
    with consumer(cluster, group, topic) as c:
        got = drain(c, 3)
        assert [m.body for m in got] == [b"t2", b"t1", b"t0"]


def test_group_state_survives_a_broker_sigkill(fresh_cluster_factory, unique_name) -> None:
    cl = fresh_cluster_factory()
    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(cl, topic, queue_count=1)
    with txmq.Producer(cl.nameserver_address) as producer:
        for i in range(4):
            for g in ("a", "b"):
                producer.send(txmq.Message(topic, f"{g}{i}".encode(), message_group=g))
    with consumer(cl, group, topic) as c:
        first = drain(c, 2, ack=False)
        a0 = next(m for m in first if m.body == b"a0")
        c.ack(a0)
        a1 = drain(c, 1, ack=False)
        assert [m.body for m in a1] == [b"a1"]
        c.ack(a1[0])  # a0, a1 settled (a1 past the cursor, which b0 holds); b0 in flight
    cl.kill_broker(0)
    cl.restart_broker(0)
    cl.wait_route(topic, 1)
    with consumer(cl, group, topic) as c:
        got = drain(c, 1, ack=False)
        # a2 next for group a (a0, a1 stay settled); b0 still in flight: b waits
        assert [m.body for m in got] == [b"a2"], [m.body for m in got]


def test_the_asyncio_sdk_sends_and_receives_message_groups(cluster, unique_name) -> None:
    import asyncio

    from txmq.aio import AsyncProducer, AsyncSimpleConsumer

    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(cluster, topic, queue_count=2)

    async def main() -> list[txmq.ReceivedMessage]:
        async with AsyncProducer(cluster.nameserver_address) as producer:
            for i in range(3):
                receipt = await producer.send(txmq.Message(topic, f"x{i}".encode(), message_group="x"))
        routes = cluster.query_route(topic)
        assert receipt.queue_id == routes[group_queue_index("x", len(routes))].queue_id
        got: list[txmq.ReceivedMessage] = []
        async with AsyncSimpleConsumer(cluster.nameserver_address, consumer_group=group,
                                       subscriptions={topic: "*"}, await_duration_seconds=0.3) as c:
            while len(got) < 3:
                batch = await c.receive(max_messages=16)
                assert len(batch) <= 1  # one at a time: the next only after the ack
                for m in batch:
                    got.append(m)
                    await c.ack(m)
        return got
    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert [m.body for m in got] == [b"x0", b"x1", b"x2"] and {m.message_group for m in got} == {"x"}


def test_push_consumer_runs_a_group_one_at_a_time_even_across_a_redelivery(cluster, unique_name) -> None:
    """A listener slower than the invisible duration: the broker redelivers the message
    while its first consumption still runs; the push consumer runs the redelivery after it,
    never beside it, and other groups meanwhile."""
    import threading
    import time

    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(cluster, topic, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as producer:
        for body, g in ((b"m0", "m"), (b"m1", "m"), (b"h0", "h")):
            producer.send(txmq.Message(topic, body, message_group=g))
    lock = threading.Lock()
    running: dict[str, int] = {}
    overlaps: list[bytes] = []
    log: list[tuple[bytes, int]] = []

    def listener(m: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        with lock:
            if running.get(m.message_group):
                overlaps.append(m.body)
            running[m.message_group] = 1
            log.append((m.body, m.delivery_attempt))
        if m.body == b"m0" and m.delivery_attempt == 1:
            time.sleep(1.0)  # beyond the 0.3 s invisibility: redelivered meanwhile
        with lock:
            running[m.message_group] = 0
        return txmq.ConsumeResult.SUCCESS

    with txmq.PushConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                           listener=listener, consume_threads=4, invisible_duration_seconds=0.3,
                           await_duration_seconds=0.3):
        wait_until(lambda: any(b == b"m1" for b, _a in log) and any(b == b"h0" for b, _a in log), 20,
                   message=lambda: f"m1 and h0 consumed: {log}")
    assert overlaps == [], log
    m_log = [(b, a) for b, a in log if b.startswith(b"m")]
    assert m_log[0] == (b"m0", 1) and m_log[-1][0] == b"m1", log
    assert log.index((b"h0", 1)) < log.index(m_log[-1])  # h flowed while m waited


def test_a_grouped_send_waits_for_its_shard_and_is_never_moved(fresh_cluster_factory, unique_name) -> None:
    """Two shards; the one holding a group's queue is SIGKILLed and drops out of the routes.
    A send of that group is retried on that shard with the same message id (never moved to
    the other shard, which would break the order) and lands there once it is back; a new
    send of the group meanwhile still hashes over the full route."""
    import threading

    cl = fresh_cluster_factory(brokers=2, nameserver_env={"TXMQ_BROKER_EXPIRY_SECONDS": "1.5"})
    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(cl, topic, queue_count=4)
    routes = cl.query_route(topic)
    home = routes[group_queue_index("g", len(routes))]
    victim = next(i for i, b in enumerate(cl.brokers) if b.name == home.broker_name)
    with txmq.Producer(cl.nameserver_address, max_attempts=1000, retry_backoff_seconds=0.05,
                       route_refresh_seconds=0.2) as producer:  # it sees the shrunk route
        first = producer.send(txmq.Message(topic, b"g0", message_group="g"))
        assert (first.broker_name, first.queue_id) == (home.broker_name, home.queue_id)
        cl.kill_broker(victim)
        wait_until(lambda: len(cl.query_route(topic)) == 2, 20, message="the killed shard left the routes")
        result: list = []
        sender = threading.Thread(target=lambda: result.append(
            producer.send(txmq.Message(topic, b"g1", message_group="g"))))
        sender.start()
        wait_until(lambda: any(s.shard == home.broker_name and s.failures > 0
                               for s in producer.routing_stats().shards), 20, message="a failed attempt")
        assert not result  # still waiting for its shard
        cl.restart_broker(victim)
        sender.join(60)
        assert result and (result[0].broker_name, result[0].queue_id) == (home.broker_name, home.queue_id)
        assert producer.routing_stats().rerouted == 0
        third = producer.send(txmq.Message(topic, b"g2", message_group="g"))
        assert (third.broker_name, third.queue_id) == (home.broker_name, home.queue_id)
    with consumer(cl, group, topic) as c:
        assert [m.body for m in drain(c, 3)] == [b"g0", b"g1", b"g2"]


def test_push_consumer_keeps_a_redelivery_waiting_behind_its_group_invisible(cluster, unique_name) -> None:
    """A consumption far slower than the invisible duration: the broker redelivers the
    message once, and that copy waits here behind the running one with its invisibility
    renewed, instead of being redelivered again every invisible duration (each redelivery
    spends an attempt towards the dead-letter queue and runs the listener once more)."""
    import threading
    import time

    topic, group = unique_name("fifo"), unique_name("g")
    create_fifo(cluster, topic, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as producer:
        for body in (b"m0", b"m1"):
            producer.send(txmq.Message(topic, body, message_group="m"))
    lock = threading.Lock()
    log: list[tuple[bytes, int]] = []

    def listener(m: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        with lock:
            log.append((m.body, m.delivery_attempt))
        if m.body == b"m0" and m.delivery_attempt == 1:
            time.sleep(3.6)  # twelve invisible durations
        return txmq.ConsumeResult.SUCCESS

    with txmq.PushConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                           listener=listener, consume_threads=2, invisible_duration_seconds=0.3,
                           await_duration_seconds=0.3):
        wait_until(lambda: any(b == b"m1" for b, _a in log), 20, message=lambda: f"m1 consumed: {log}")
    runs = [a for b, a in log if b == b"m0"]
    assert runs[0] == 1 and max(runs) <= 3 and len(runs) <= 3, f"m0 redelivered while it waited: {log}"
    assert log[-1][0] == b"m1", log
