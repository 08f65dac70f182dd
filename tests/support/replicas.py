"""Helpers for replicated shards in tests: waiting for the in-sync set, fsck and digests of
stopped replicas, and the check budget read back from a stopped store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from typing import Any

import grpc

from .cluster import Cluster
from .processes import ServiceProcess
from .waiting import wait_until


def leader_status(cluster: Cluster, shard: str) -> Any:
    """The BrokerInfo the name server routes for ``shard`` (its leader's registration)."""
    return {b.name: b for b in cluster.list_brokers()}[shard]


def metric(proc: ServiceProcess, name: str) -> float:
    """The value of ``name`` (an unlabelled sample) on ``proc``'s /metrics, read now."""
    text = urllib.request.urlopen(f"http://{proc.host}:{proc.metrics_port}/metrics", timeout=10).read().decode()
    values = [float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert values, f"{proc.name} exports no {name}"
    return values[0]


def caught_up(procs: list[ServiceProcess]) -> bool:
    """Whether every replica of ``procs`` holds its leader's whole log, by each one's own
    /metrics: the leader's log end is read first, then each follower's (a registration
    the name server holds is up to a heartbeat old, and a follower at its log end may not
    hold what the leader wrote since: receives and acks are answered before they are
    replicated)."""
    leaders = [p for p in procs if metric(p, "txmq_replica_is_leader") == 1]
    if len(leaders) != 1:
        return False
    end = metric(leaders[0], "txmq_replica_log_end")
    return all(metric(p, "txmq_replica_log_end") >= end for p in procs if p is not leaders[0])


def wait_in_sync(cluster: Cluster, shard: str, replicas: int = 3, timeout: float = 60.0,
                 lag_records: int = 0) -> None:
    """Until the leader reports ``replicas`` in-sync members, every follower at its log
    end (within ``lag_records``: under a load that never pauses, the registration's
    snapshot always shows the batch in flight), and every follower in the set holds what
    the leader had written when asked."""
    def synced() -> bool:
        r = leader_status(cluster, shard).replication
        followers = [f for f in r.followers if f.in_sync and f.durable_lsn >= r.log_end - lag_records]
        if len(r.in_sync_replicas) != replicas or len(followers) != replicas - 1:
            return False
        in_sync = [p for p in cluster.shards[shard] if p.running and int(p.env["TXMQ_REPLICA_ID"]) in r.in_sync_replicas]
        return len(in_sync) == replicas and caught_up(in_sync)
    wait_until(synced, timeout, interval=0.1,
               message=lambda: f"replicas of {shard} not in sync: {leader_status(cluster, shard)}",
               ignore=(grpc.RpcError, KeyError, OSError))


def fsck(proc: ServiceProcess) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "services.broker.fsck", "--data-dir",
                          proc.env["TXMQ_DATA_DIR"], "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def stop_and_compare(cluster: Cluster, shard: str) -> list[dict[str, Any]]:
    """Stops every replica of ``shard`` cleanly, then asserts: each store clean under fsck,
    all at the same log end, all digests (per column family) equal."""
    procs = cluster.shards[shard]
    # What the replicas are guaranteed to reach once writes stop: each holds the leader's
    # whole log (and a stopping replica takes no leadership, so none writes after).
    running = [p for p in procs if p.running]
    if running:
        wait_until(lambda: caught_up(running), 60, interval=0.05, ignore=(OSError,),
                   message=lambda: f"replicas of {shard} never held the same log: "
                                   f"{ {p.name: metric(p, 'txmq_replica_log_end') for p in running} }")
    for proc in procs:
        if proc.running:
            proc.send_term()
    for proc in procs:
        proc.stop(30)
    reports = [fsck(p) for p in procs]
    for proc, report in zip(procs, reports):
        assert report["problems"] == [], f"{proc.name}: {report['problems']}"
    ends = {p.name: r["replication"]["log_end"] for p, r in zip(procs, reports)}
    assert len(set(ends.values())) == 1, f"replicas stopped at different log ends: {ends}"
    digests = [r["digest"] for r in reports]
    for proc, digest in zip(procs[1:], digests[1:]):
        differing = sorted(cf for cf in digest if digest[cf] != digests[0][cf])
        assert not differing, f"{proc.name} differs from {procs[0].name} in {differing}"
    return reports


def max_checks_spent(proc: ServiceProcess) -> int:
    """The largest checks_delivered of any transaction in a stopped replica's store."""
    from services.broker.store import codec
    from services.broker.store.db import Database

    db = Database(proc.env["TXMQ_DATA_DIR"], sync=False, replicated=True)
    try:
        return max((codec.decode_txn(v, k).checks_delivered for k, v in db.scan("txn")), default=0)
    finally:
        db.close()


def probe_refused(survivor: ServiceProcess, topic: str, seconds: float) -> list[str]:
    """Sends to the one replica left for ``seconds``: every answer must be a retryable
    refusal (not leading, too few replicas, a deadline); an acknowledgement is a violation."""
    from txmq.errors import TxmqError, error_from_rpc
    from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2

    problems = []
    ends = time.monotonic() + seconds
    with grpc.insecure_channel(survivor.address) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        while time.monotonic() < ends:
            message = common_pb2.Message(topic=topic, body=b"probe", queue_id=0, type=common_pb2.MESSAGE_TYPE_NORMAL)
            try:
                stub.SendMessage(broker_pb2.SendMessageRequest(message=message), timeout=1.0)
                problems.append(f"{survivor.name} acknowledged a send with one replica of three running")
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                if not isinstance(err, TxmqError) or not err.retryable:
                    problems.append(f"{survivor.name} refused a send with a non-retryable {type(err).__name__}: {err}")
            time.sleep(0.1)
    return problems


def delete_leader_key(cluster: Cluster, shard: str) -> int:
    """Deletes ``shard``'s leader key in etcd (as an etcd that lost it would): its leader
    steps down at its next election round. Returns the epoch it led in."""
    from services.broker.coordination import ShardCoordinator
    from services.common.etcd import EtcdCredentials

    assert cluster.etcd is not None
    # As a broker: etcd's authentication is on, txmq's keys are the brokers' (password mode
    # without TLS; with TLS the test's own certificate would be needed, which no caller uses).
    env = cluster.etcd_broker_env
    credentials = (EtcdCredentials(env["TXMQ_ETCD_USER"], env["TXMQ_ETCD_PASSWORD_FILE"])
                   if env.get("TXMQ_ETCD_USER") else None)

    async def delete() -> int:
        coord = ShardCoordinator((cluster.etcd.endpoint,), "/txmq", shard, 0, credentials=credentials)
        try:
            leader = (await coord.read()).leader
            assert leader is not None, f"{shard} has no leader key"
            assert await coord.resign(leader.epoch)
            return leader.epoch
        finally:
            await coord.close()
    return asyncio.run(delete())
