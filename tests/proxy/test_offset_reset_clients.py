"""An offset reset seen by the official RocketMQ 5 Python client through the proxy (issue
32, item 1): the proxy's receives read the broker's cursor for the group, so after
``txmq group reset`` the client's next receives start from the new position; and the
broker counts the client, by its RocketMQ client id, as a live consumer while it runs."""

from __future__ import annotations

from typing import Callable

import pytest

import txmq
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until

from .support import Clients

pytestmark = pytest.mark.timeout(240)


def test_the_official_client_reads_from_the_reset_position(rmq_cluster: Cluster, clients: Clients,
                                                          unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("reset"), unique_name("g")
    rmq_cluster.create_topic(topic, queue_count=1)
    proxy = rmq_cluster.proxy_addresses[0]
    with txmq.Producer(rmq_cluster.nameserver_address) as p:
        for i in range(6):
            p.send(txmq.Message(topic, f"m{i}".encode()))
    first = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=6, await_seconds=1)
    first.expect_success(90)
    assert sorted(m["body"] for m in first.of("received")) == [f"m{i}" for i in range(6)]
    with txmq.Admin(rmq_cluster.nameserver_address) as admin:
        # The client is gone: once the brokers' session time passes it is no longer live.
        plan = wait_until(lambda: (lambda r: r if not r.live_consumers else None)(
            admin.reset_offsets(group, topic, shift=-4)), 120, message="the stopped client stays live")
        assert [(q.current_offset, q.new_offset) for q in plan.queues] == [(6, 2)]
        admin.reset_offsets(group, topic, shift=-4, dry_run=False, operator="ops")
    second = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=4, await_seconds=1)
    second.expect_success(90)
    assert sorted(m["body"] for m in second.of("received")) == ["m2", "m3", "m4", "m5"]


def test_a_running_official_client_is_a_live_consumer_by_its_client_id(rmq_cluster: Cluster, clients: Clients,
                                                                      unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("live"), unique_name("g")
    rmq_cluster.create_topic(topic, queue_count=1)
    running = clients.python("simple", endpoints=rmq_cluster.proxy_addresses[0], topic=topic, group=group,
                             count=1, await_seconds=1, timeout_seconds=120)
    try:
        with txmq.Admin(rmq_cluster.nameserver_address) as admin:
            live = wait_until(lambda: admin.reset_offsets(group, topic, to_latest=True).live_consumers, 60,
                              message="the running client is not live")
            assert not any(c.address == c.client_id for c in live)  # named by its client id, not an address
            with pytest.raises(txmq.ConsumersLiveError):
                admin.reset_offsets(group, topic, to_latest=True, dry_run=False, operator="ops")
    finally:
        running.kill()
