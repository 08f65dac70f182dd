"""Deferred acks (``ack_later``) against a real name server and broker: they ride the next
receive (applied by the broker before it waits), their failures are reported, and
``flush_acks``, ``close`` and the delay bound send the ones no receive carried; a consumer
killed with acks queued loses nothing (the messages are redelivered). Sync and asyncio.

The broker counts acknowledgements by how they came (``txmq_acks_total{via,result}``) and
calls by method (``txmq_rpc_duration_seconds_count{method}``); the ``cluster`` fixture is
shared by the session, so tests compare counts before and after.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import txmq
from txmq.aio import AsyncSimpleConsumer
from txmq.client import MAX_ENTRIES_PER_REQUEST
from tests.support.metrics import metric_sum
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
AWAIT_SECONDS = 1.0
STALE = (txmq.NotFoundError, txmq.FailedPreconditionError)


def acks(cluster, via: str, result: str = "ok") -> float:
    return metric_sum(cluster.brokers[0].metrics_port, "txmq_acks_total", {"via": via, "result": result})


def ack_calls(cluster) -> float:
    return metric_sum(cluster.brokers[0].metrics_port, "txmq_rpc_duration_seconds_count", {"method": "AckMessages"})


def send(cluster, topic: str, count: int) -> list[str]:
    with txmq.Producer(cluster.nameserver_address) as producer:
        return [producer.send(txmq.Message(topic, f"m{i}".encode())).message_id for i in range(count)]


def consumer(cluster, group: str, topic: str, **options) -> txmq.SimpleConsumer:
    return txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                               await_duration_seconds=options.pop("await_duration_seconds", AWAIT_SECONDS),
                               **options)


def receive_all(c: txmq.SimpleConsumer, count: int, invisible: float) -> list[txmq.ReceivedMessage]:
    got: list[txmq.ReceivedMessage] = []

    def step() -> bool:
        got.extend(c.receive(max_messages=count - len(got), invisible_duration_seconds=invisible))
        return len(got) >= count

    wait_until(step, 15.0, interval=0.0, message=lambda: f"received {len(got)} of {count}")
    return got


def nothing_until(c: txmq.SimpleConsumer, wall_time: float) -> None:
    """Receives until ``wall_time`` (time.time()) and asserts nothing was (re)delivered."""
    while time.time() < wall_time:
        again = c.receive(max_messages=8, invisible_duration_seconds=30.0)
        assert again == [], f"redelivered: {[(m.body, m.delivery_attempt) for m in again]}"


def test_deferred_acks_ride_the_next_receive_applied_before_its_long_poll(cluster, unique_name):
    """ack_later then receive: one ReceiveMessages carries the acks, no AckMessages is made,
    the broker applies them as the long poll starts (not when it ends), and the messages are
    not redelivered after their invisible duration."""
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    sent = send(cluster, topic, 3)
    with consumer(cluster, group, topic, max_ack_delay_seconds=60.0, await_duration_seconds=3.0) as c:
        got = receive_all(c, 3, invisible=6.0)
        assert sorted(m.message_id for m in got) == sorted(sent)
        calls, carried = ack_calls(cluster), acks(cluster, "receive")
        for message in got:
            c.ack_later(message)  # due after ~3 s (half the invisibility left): the receive comes first
        poll: list[list[txmq.ReceivedMessage]] = []
        thread = threading.Thread(target=lambda: poll.append(c.receive(max_messages=8, invisible_duration_seconds=6.0)))
        thread.start()
        wait_until(lambda: acks(cluster, "receive") >= carried + 3, 2.5, message="the carried acks were not applied")
        assert thread.is_alive(), "the acks were applied only when the long poll ended"
        thread.join(10.0)
        assert poll == [[]]
        assert acks(cluster, "receive") == carried + 3
        assert ack_calls(cluster) == calls, "a deferred ack made a call of its own"
        nothing_until(c, max(m.invisible_until.timestamp() for m in got) + 0.5)


def test_a_stale_deferred_ack_is_reported_to_the_callback_and_by_flush_acks(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    send(cluster, topic, 2)
    failed: list[tuple[txmq.ReceivedMessage, txmq.TxmqError]] = []
    with consumer(cluster, group, topic, max_ack_delay_seconds=60.0,
                  on_ack_error=lambda m, e: failed.append((m, e))) as c:
        first, second = receive_all(c, 2, invisible=30.0)
        c.ack(first)
        c.ack_later(first)  # already acknowledged: its handle is stale
        assert c.receive(max_messages=8, invisible_duration_seconds=30.0) == []
        assert [(m.message_id, isinstance(e, STALE)) for m, e in failed] == [(first.message_id, True)]
        c.ack_later(first)
        c.ack_later(second)
        outcomes = c.flush_acks()
        assert [(m.message_id, e is None or isinstance(e, STALE)) for m, e in outcomes] == [
            (first.message_id, True), (second.message_id, True)]
        assert outcomes[0][1] is not None and outcomes[1][1] is None
        assert len(failed) == 2 and failed[1][0] is first
        assert c.flush_acks() == []


def test_close_sends_the_deferred_acks(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    send(cluster, topic, 1)
    with consumer(cluster, group, topic, max_ack_delay_seconds=60.0) as c:
        [message] = receive_all(c, 1, invisible=30.0)
        c.ack_later(message)
    with pytest.raises(txmq.ClientClosedError):
        c.ack_later(message)
    with consumer(cluster, group, topic) as other:
        with pytest.raises(STALE):
            other.ack(message)  # close() acknowledged it: the delivery is no longer in flight


@pytest.mark.parametrize("max_ack_delay, invisible", [(0.2, 3.0), (60.0, 1.0)],
                         ids=["the configured delay", "half the invisibility left"])
def test_the_timer_sends_a_deferred_ack_no_receive_carried(cluster, unique_name, max_ack_delay, invisible):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    send(cluster, topic, 1)
    with consumer(cluster, group, topic, max_ack_delay_seconds=max_ack_delay) as c:
        [message] = receive_all(c, 1, invisible=invisible)
        before = acks(cluster, "ack")
        c.ack_later(message)
        wait_until(lambda: acks(cluster, "ack") >= before + 1, 5.0, message="the deferred ack was never sent")
        with pytest.raises(STALE):
            c.ack(message)
        nothing_until(c, message.invisible_until.timestamp() + 0.5)


KILLED = """
import os, signal, sys, txmq
c = txmq.SimpleConsumer(sys.argv[1], consumer_group=sys.argv[2], subscriptions={sys.argv[3]: "*"},
                        await_duration_seconds=1.0, max_ack_delay_seconds=60.0)
got = []
while len(got) < int(sys.argv[4]):
    got.extend(c.receive(max_messages=16, invisible_duration_seconds=4.0))
for m in got:
    c.ack_later(m)
print(" ".join(m.message_id for m in got), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

KILLED_ASYNC = """
import asyncio, os, signal, sys
from txmq.aio import AsyncSimpleConsumer
from txmq.client import MAX_ENTRIES_PER_REQUEST

async def main():
    c = AsyncSimpleConsumer(sys.argv[1], consumer_group=sys.argv[2], subscriptions={sys.argv[3]: "*"},
                            await_duration_seconds=1.0, max_ack_delay_seconds=60.0)
    got = []
    while len(got) < int(sys.argv[4]):
        got.extend(await c.receive(max_messages=16, invisible_duration_seconds=4.0))
    for m in got:
        c.ack_later(m)
    print(" ".join(m.message_id for m in got), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


@pytest.mark.parametrize("script", [KILLED, KILLED_ASYNC], ids=["sync", "asyncio"])
def test_a_consumer_killed_with_deferred_acks_queued_has_its_messages_redelivered(cluster, unique_name, script):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    sent = send(cluster, topic, 4)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "sdk"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", script, cluster.nameserver_address, group, topic, "4"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == -9, done.stderr
    assert sorted(done.stdout.split()) == sorted(sent)
    with consumer(cluster, group, topic) as c:
        again = receive_all(c, 4, invisible=30.0)
        assert sorted(m.message_id for m in again) == sorted(sent)
        assert all(m.delivery_attempt == 2 for m in again)
        assert c.ack_many(again) == [None] * 4


def test_asyncio_deferred_acks_ride_the_receive_report_failures_and_flush(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    sent = send(cluster, topic, 3)
    failed: list[tuple[txmq.ReceivedMessage, txmq.TxmqError]] = []

    async def main() -> tuple[list[txmq.ReceivedMessage], float, float]:
        async with AsyncSimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                                       await_duration_seconds=AWAIT_SECONDS, max_ack_delay_seconds=60.0,
                                       on_ack_error=lambda m, e: failed.append((m, e))) as c:
            got: list[txmq.ReceivedMessage] = []
            while len(got) < 3:
                got.extend(await c.receive(max_messages=8, invisible_duration_seconds=30.0))
            calls, carried = ack_calls(cluster), acks(cluster, "receive")
            first, second, third = got
            c.ack_later(first)
            c.ack_later(second)
            assert await c.receive(max_messages=8, invisible_duration_seconds=30.0) == []
            assert failed == []
            carried_delta, calls_delta = acks(cluster, "receive") - carried, ack_calls(cluster) - calls
            c.ack_later(first)  # stale now
            outcomes = await c.flush_acks()
            assert [(m.message_id, isinstance(e, STALE)) for m, e in outcomes] == [(first.message_id, True)]
            assert [m.message_id for m, _e in failed] == [first.message_id]
            c.ack_later(third)  # sent by close()
        with pytest.raises(txmq.ClientClosedError):
            c.ack_later(third)
        return got, carried_delta, calls_delta

    got, carried_delta, calls_delta = asyncio.run(main())
    assert sorted(m.message_id for m in got) == sorted(sent)
    assert (carried_delta, calls_delta) == (2, 0)
    with consumer(cluster, group, topic) as other:
        for message in got:
            with pytest.raises(STALE):
                other.ack(message)


def test_asyncio_timer_sends_a_deferred_ack_no_receive_carried(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    send(cluster, topic, 1)

    async def main() -> txmq.ReceivedMessage:
        async with AsyncSimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                                       await_duration_seconds=AWAIT_SECONDS, max_ack_delay_seconds=0.2) as c:
            got: list[txmq.ReceivedMessage] = []
            while not got:
                got = await c.receive(max_messages=1, invisible_duration_seconds=30.0)
            before = acks(cluster, "ack")
            c.ack_later(got[0])
            deadline = time.monotonic() + 5.0
            while acks(cluster, "ack") < before + 1:
                assert time.monotonic() < deadline, "the deferred ack was never sent"
                await asyncio.sleep(0.02)
            with pytest.raises(STALE):
                await c.ack(got[0])
            return got[0]

    asyncio.run(main())


def test_bad_deferred_ack_options_are_refused(cluster):
    for bad in (0, -1.0, 61.0, "1", True):
        with pytest.raises(txmq.InvalidFieldError, match="max_ack_delay_seconds"):
            txmq.SimpleConsumer(cluster.nameserver_address, consumer_group="g", subscriptions={"t": "*"},
                                max_ack_delay_seconds=bad)
    with pytest.raises(txmq.InvalidFieldError, match="on_ack_error"):
        AsyncSimpleConsumer(cluster.nameserver_address, consumer_group="g", subscriptions={"t": "*"},
                            on_ack_error="log it")


def test_more_acks_than_one_request_may_carry_are_split_and_all_applied(cluster, unique_name):
    """A broker takes at most MAX_ENTRIES_PER_REQUEST receipt handles in one AckMessages, or in
    one receive carrying acks, and refuses more whole (INVALID_ARGUMENT): ack_many and the
    deferred acks split theirs. Before, ack_many of 1,100 deliveries was one request."""
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    n = MAX_ENTRIES_PER_REQUEST + 76
    send(cluster, topic, 2 * n)
    with consumer(cluster, group, topic, max_ack_delay_seconds=60.0) as c:
        got = receive_all(c, 2 * n, invisible=60.0)
        calls = ack_calls(cluster)
        assert c.ack_many(got[:n]) == [None] * n
        assert ack_calls(cluster) == calls + 2
        carried = acks(cluster, "receive")
        for message in got[n:]:
            c.ack_later(message)
        assert c.receive(max_messages=8, invisible_duration_seconds=60.0) == []
        assert acks(cluster, "receive") == carried + MAX_ENTRIES_PER_REQUEST
        assert [error for _m, error in c.flush_acks()] == [None] * 76
        with consumer(cluster, group, topic) as other:
            for message in (got[0], got[n - 1], got[n], got[-1]):
                with pytest.raises(STALE):
                    other.ack(message)


def test_asyncio_ack_many_splits_more_acks_than_one_request_may_carry(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    n = MAX_ENTRIES_PER_REQUEST + 10
    send(cluster, topic, n)

    async def main() -> list[txmq.TxmqError | None]:
        async with AsyncSimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                                       await_duration_seconds=AWAIT_SECONDS) as c:
            got: list[txmq.ReceivedMessage] = []
            while len(got) < n:
                got.extend(await c.receive(max_messages=n - len(got), invisible_duration_seconds=60.0))
            return await c.ack_many(got)

    calls = ack_calls(cluster)
    assert asyncio.run(main()) == [None] * n
    assert ack_calls(cluster) == calls + 2
