"""Replicated shards (replication_factor 3, min_insync_replicas 2) as real processes with a
real etcd: fail-over keeps every acknowledged write, followers refuse clients naming the
leader, too few replicas refuse writes and apply nothing, a paused old leader acknowledges
nothing after its successor's epoch begins, a wiped replica rebuilds itself, and replicas
end equal (a digest per column family) and clean under fsck."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import grpc
import pytest

import txmq
from txmq import _errors
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2

from tests.support.cluster import Cluster
from tests.support.processes import ServiceProcess
from tests.support.waiting import wait_until
from tests.support.workload import Workload

pytestmark = pytest.mark.timeout(240)

SHARD = "broker-0"


#: Checks claimed just before a leader dies come back after their lease: keep it short.
CHECKER_ENV = {"TXMQ_LEASE_SECONDS": "2.0", "TXMQ_ANSWER_TIMEOUT_SECONDS": "1.0"}


def replicated(make: Callable[..., Cluster], **env: str) -> Cluster:
    return make(brokers=1, replication_factor=3, checker=True, broker_env=env or None, checker_env=CHECKER_ENV)


def broker_stub(address: str) -> broker_pb2_grpc.BrokerServiceStub:
    return broker_pb2_grpc.BrokerServiceStub(grpc.insecure_channel(address))


def send_raw(address: str, topic: str, message_id: str = "", timeout: float = 3.0) -> broker_pb2.SendMessageResponse:
    message = common_pb2.Message(topic=topic, body=b"raw", message_id=message_id, queue_id=0,
                                 type=common_pb2.MESSAGE_TYPE_NORMAL)
    try:
        return broker_stub(address).SendMessage(broker_pb2.SendMessageRequest(message=message), timeout=timeout)
    except grpc.RpcError as exc:
        raise _errors.error_from_rpc(exc) from None


def leader_status(cluster: Cluster) -> Any:
    return {b.name: b for b in cluster.list_brokers()}[SHARD]


def wait_in_sync(cluster: Cluster, replicas: int = 3, timeout: float = 60.0) -> None:
    """Until the leader reports ``replicas`` in-sync members, every follower at its log end."""
    def synced() -> bool:
        info = leader_status(cluster)
        r = info.replication
        followers = [f for f in r.followers if f.in_sync and f.durable_lsn >= r.log_end]
        return len(r.in_sync_replicas) == replicas and len(followers) == replicas - 1
    wait_until(synced, timeout, interval=0.1, message=lambda: f"replicas not in sync: {leader_status(cluster)}",
               ignore=(grpc.RpcError, KeyError))


def fsck(proc: ServiceProcess) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "services.broker.fsck", "--data-dir",
                          proc.env["TXMQ_DATA_DIR"], "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def stop_and_compare(cluster: Cluster) -> list[dict[str, Any]]:
    """Stops every replica cleanly, then: each store clean under fsck, all digests equal."""
    for proc in cluster.shards[SHARD]:
        if proc.running:
            proc.send_term()
    for proc in cluster.shards[SHARD]:
        proc.stop(30)
    reports = [fsck(p) for p in cluster.shards[SHARD]]
    for proc, report in zip(cluster.shards[SHARD], reports):
        assert report["problems"] == [], f"{proc.name}: {report['problems']}"
    ends = {p.name: r["replication"]["log_end"] for p, r in zip(cluster.shards[SHARD], reports)}
    assert len(set(ends.values())) == 1, f"replicas stopped at different log ends: {ends}"
    digests = [r["digest"] for r in reports]
    for proc, digest in zip(cluster.shards[SHARD][1:], digests[1:]):
        differing = sorted(cf for cf in digest if digest[cf] != digests[0][cf])
        assert not differing, f"{proc.name} differs from {cluster.shards[SHARD][0].name} in {differing}"
    return reports


def test_failover_keeps_every_acknowledged_write_and_replicas_end_equal(fresh_cluster_factory, unique_name):
    cluster = replicated(fresh_cluster_factory)
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, 4)
    work = Workload(cluster.nameserver_address, topic, group, producers=2).start()
    try:
        wait_until(lambda: work.sent >= 100, 60, message=lambda: f"load did not start: {work.summary()}")
        old = cluster.wait_leaders()[SHARD]
        at_kill = work.sent
        old.kill()
        started = time.monotonic()
        new = cluster.wait_leaders(not_on=old)[SHARD]
        failover = time.monotonic() - started
        print(f"fail-over {old.name} -> {new.name}: {failover:.2f} s")
        wait_until(lambda: work.sent >= at_kill + 100, 60, message=lambda: f"no progress: {work.summary()}")
        old.restart(60)  # rejoins as a follower and takes back what it never had acknowledged
        work.stop_producers()
        wait_until(lambda: not work.missing(), 60, interval=0.2,
                   message=lambda: f"never delivered: {sorted(work.missing())[:10]} {work.summary()}")
        wait_in_sync(cluster)
    finally:
        work.stop()
    assert work.violations() == []
    assert work.summary()["delivered"] >= 150
    stop_and_compare(cluster)


def test_a_follower_refuses_clients_and_names_the_leader(fresh_cluster_factory, unique_name):
    cluster = replicated(fresh_cluster_factory)
    topic = unique_name("topic")
    cluster.create_topic(topic, 1)
    leader = cluster.wait_leaders()[SHARD]
    follower = next(p for p in cluster.shards[SHARD] if p is not leader)
    with pytest.raises(txmq.NotLeaderError) as caught:
        send_raw(follower.address, topic)
    err = caught.value
    assert err.retryable and err.code == grpc.StatusCode.UNAVAILABLE
    assert err.leader_address == leader.address and err.shard == SHARD
    assert leader.address in str(err)
    assert send_raw(leader.address, topic).message_id  # the leader serves


def test_too_few_replicas_refuse_writes_and_apply_nothing(fresh_cluster_factory, unique_name):
    cluster = replicated(fresh_cluster_factory)
    topic = unique_name("topic")
    cluster.create_topic(topic, 1)
    leader = cluster.wait_leaders()[SHARD]
    followers = [p for p in cluster.shards[SHARD] if p is not leader]
    for proc in followers:
        proc.kill()
    message_id = "refused-" + unique_name("m")[-20:]

    def refused() -> bool:
        try:
            send_raw(leader.address, topic, message_id=message_id, timeout=1.0)
        except txmq.NotEnoughReplicasError as exc:
            assert exc.required == 2 and exc.in_sync == 1
            return True
        except txmq.DeadlineExceededError:
            return False  # applied before the followers were seen gone: waits, never acknowledged
        raise AssertionError("a write was acknowledged by the leader alone")
    wait_until(refused, 30, message="the leader never refused a write with one replica")
    for proc in followers:
        proc.restart(60)
    wait_in_sync(cluster)
    # Nothing of the refused write was applied: the same message id is new, not a duplicate.
    again = send_raw(leader.address, topic, message_id=message_id + "-x")
    assert not again.duplicate
    refused_once = send_raw(leader.address, topic, message_id=message_id)
    assert not refused_once.duplicate or refused_once.queue_offset >= 0


def test_a_paused_leader_acknowledges_nothing_after_its_successor(fresh_cluster_factory, unique_name):
    cluster = replicated(fresh_cluster_factory)
    topic = unique_name("topic")
    cluster.create_topic(topic, 1)
    old = cluster.wait_leaders()[SHARD]
    send_raw(old.address, topic)
    old.pause()
    try:
        new = cluster.wait_leaders(not_on=old)[SHARD]
        # Requests reach the paused process now; it handles them the moment it resumes.
        results: list[Any] = []

        def hammer(i: int) -> None:
            try:
                results.append(send_raw(old.address, topic, message_id=f"stale-{i}-{time.time_ns()}", timeout=5.0))
            except txmq.TxmqError as exc:
                results.append(exc)
        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # the calls must be queued at the paused process before it resumes
    finally:
        old.resume()
    for t in threads:
        t.join(30)
    acknowledged = [r for r in results if not isinstance(r, Exception)]
    assert acknowledged == [], f"the deposed leader acknowledged {len(acknowledged)} writes"
    assert all(isinstance(r, (txmq.NotLeaderError, txmq.LeadershipLostError, txmq.NotEnoughReplicasError,
                              txmq.DeadlineExceededError)) for r in results), results
    # Its own log says it stepped down and, as a follower, took back what it never had acknowledged.
    wait_until(lambda: "stepped down" in old.log_text(), 30, message="no step-down in the old leader's log")
    wait_in_sync(cluster)
    assert cluster.leader(SHARD) is new
    stop_and_compare(cluster)


def test_a_wiped_replica_rebuilds_from_a_checkpoint_and_rejoins(fresh_cluster_factory, unique_name):
    cluster = replicated(fresh_cluster_factory, TXMQ_REPLICATION_LOG_ENTRIES="20")
    topic = unique_name("topic")
    cluster.create_topic(topic, 2)
    leader = cluster.wait_leaders()[SHARD]
    victim = next(p for p in cluster.shards[SHARD] if p is not leader)
    victim.kill()
    shutil.rmtree(victim.env["TXMQ_DATA_DIR"])
    for i in range(120):  # beyond the 20 log entries the leader keeps: only a checkpoint can help
        send_raw(leader.address, topic, message_id=f"m-{i}")
    victim.restart(60)
    wait_until(lambda: "rebuilt from the leader's checkpoint" in victim.log_text(), 60,
               message=lambda: victim.log_tail(30))
    wait_in_sync(cluster)
    for i in range(10):
        send_raw(leader.address, topic, message_id=f"after-{i}")
    wait_in_sync(cluster)
    stop_and_compare(cluster)
