"""Real network partitions of a replicated shard (replication_factor 3, min_insync_replicas 2):
each replica runs in a network namespace of its own (tests/support/netns.py) and the leader is
cut off with iptables — no signal, no kill: the process runs on, only its packets are dropped.

The leader is cut off from etcd, the other replicas and the name server while its clients
(the test, the checker) can still reach it — the partition in which a deposed leader could
still be asked to acknowledge writes. It must acknowledge nothing, step down on its own, the
majority side must elect a successor and serve, and once healed the old leader must rejoin as
a follower, take back what it never had acknowledged, and every replica end equal."""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

import pytest

import txmq

from tests.integration.test_replication import CHECKER_ENV, send_raw
from tests.support import netns, replicas
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"),
]

SHARD = "broker-0"
#: What a client of a partitioned, then deposed, leader may see: never a success.
REFUSALS = (txmq.NotLeaderError, txmq.LeadershipLostError, txmq.NotEnoughReplicasError, txmq.DeadlineExceededError)


def test_a_partitioned_leader_acknowledges_nothing_steps_down_and_rejoins_as_a_follower(
        fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(brokers=1, replication_factor=3, checker=True, checker_env=CHECKER_ENV,
                                    netns=True)
    assert cluster.network is not None
    topic = unique_name("topic")
    cluster.create_topic(topic, 1)
    old = cluster.wait_leaders()[SHARD]
    assert old.address.split(":")[0] == netns.host_of(old).address  # it serves from its namespace
    send_raw(old.address, topic, message_id="before-the-partition")
    replicas.wait_in_sync(cluster, SHARD)

    results: list[Any] = []
    stop = threading.Event()

    def hammer(i: int) -> None:
        for n in range(10_000):
            if stop.is_set():
                return
            try:
                results.append(send_raw(old.address, topic, message_id=f"minority-{i}-{n}", timeout=2.0))
            except txmq.TxmqError as exc:
                results.append(exc)

    since = old.log_size()
    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(4)]
    with netns.isolated(old, clients=True):
        cut = time.monotonic()
        for t in threads:
            t.start()
        try:
            new = cluster.wait_leaders(60, not_on=old)[SHARD]
            print(f"fail-over across the partition {old.name} -> {new.name}: {time.monotonic() - cut:.2f} s")
            # The majority side serves (once the other follower has joined its successor).
            wait_until(lambda: send_raw(new.address, topic, message_id="majority").message_id, 30, interval=0.1,
                       ignore=(txmq.NotEnoughReplicasError,), message="the majority side never served")
            for i in range(5):
                assert send_raw(new.address, topic, message_id=f"majority-{i}").message_id
            # The old leader notices on its own, while still cut off, that it leads no more ...
            wait_until(lambda: "stepped down" in old.log_text(since), 30,
                       message=lambda: f"the partitioned leader never stepped down:\n{old.log_tail(30)}")
            # ... and its clients, who still reach it, are told so.
            wait_until(lambda: any(isinstance(r, txmq.NotLeaderError) for r in results[-8:]), 30,
                       message=lambda: f"the partitioned old leader does not refuse as a follower: {results[-8:]}")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    print(f"answers of the partitioned leader: {collections.Counter(type(r).__name__ for r in results)}")
    acknowledged = [r for r in results if not isinstance(r, Exception)]
    assert acknowledged == [], f"the partitioned leader acknowledged {len(acknowledged)} writes"
    assert all(isinstance(r, REFUSALS) for r in results), {type(r).__name__ for r in results}
    answered = [r for r in results if not isinstance(r, txmq.DeadlineExceededError)]
    assert answered, "no request reached the partitioned leader: the partition cut its clients off too"

    # Healed: the old leader follows the new one, every replica catches up, the leader stays.
    replicas.wait_in_sync(cluster, SHARD, timeout=60)
    assert cluster.leader(SHARD) is new
    for i in range(5):
        send_raw(new.address, topic, message_id=f"after-heal-{i}")
    replicas.wait_in_sync(cluster, SHARD, timeout=60)
    replicas.stop_and_compare(cluster, SHARD)
