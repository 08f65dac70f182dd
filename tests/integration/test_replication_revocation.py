"""A replica's identity removed from the credential files stops its open replication session,
on a real replicated shard with auth on (etcd, a leader and a follower, a name server): the
leader decides the session again before each frame it sends once it reloaded the files, and
refuses the follower's reconnection at its hello (docs/security.md, "Revoking"). A rebuild's
checkpoint stream is decided again before each chunk. Each failed before: the session (or the
checkpoint), authenticated when it opened, went on for the removed identity."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

import txmq
from services.common.auth import hash_token
from services.broker.replica.following import RETRY_MAX_SECONDS
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.replicas import leader_status, wait_in_sync
from tests.support.waiting import wait_until
from txmq.v1 import replication_pb2, replication_pb2_grpc

pytestmark = pytest.mark.timeout(180)

SERVICES = ("nameserver", "broker", "replica")
TOKENS = {name: f"replication-revocation-{name}-0123456789abcdef" for name in (*SERVICES, "operator")}
ACL = [{"principal": "operator", "resource": "cluster", "actions": ["admin-read", "admin-write"]},
       {"principal": "operator", "resource": "topic:*", "actions": ["publish"]}]


def write_credentials(path: Path, absent: tuple[str, ...] = ()) -> None:
    data = {"principals": {name: {"service": name in SERVICES, "tokens": [hash_token(token)]}
                           for name, token in TOKENS.items() if name not in absent}, "acl": ACL}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # as a Secret update swaps the file


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    creds = tmp_path / "credentials.json"
    write_credentials(creds)
    env: dict[str, dict[str, str]] = {}
    for name in SERVICES:
        token_file = tmp_path / f"{name}.token"
        token_file.write_text(TOKENS[name] + "\n")
        env[name] = {"TXMQ_AUTH_FILES": str(creds), "TXMQ_AUTH_TOKEN_FILE": str(token_file),
                     "TXMQ_AUTH_RELOAD_SECONDS": "0.2"}
    cluster = Cluster(tmp_path, nameserver_env=env["nameserver"], broker_env=env["broker"], token=TOKENS["operator"],
                      replication_factor=2, min_insync_replicas=1)
    try:
        cluster.wait_leaders()
        yield cluster, creds
    finally:
        cluster.stop()


def follower_of(cluster: Cluster) -> Any:
    leader = cluster.leader("broker-0")
    assert leader is not None
    return next(p for p in cluster.shards["broker-0"] if p is not leader)


def follower_status(cluster: Cluster, replica_id: int) -> Any:
    return next(f for f in leader_status(cluster, "broker-0").replication.followers if f.replica_id == replica_id)


def as_replica(cluster: Cluster, creds: Path) -> tuple[Any, Any]:
    """The follower restarted as identity "replica", in sync again: (leader, follower)."""
    follower = follower_of(cluster)
    follower.stop()
    follower.env["TXMQ_AUTH_TOKEN_FILE"] = str(creds.parent / "replica.token")
    follower.restart()
    wait_in_sync(cluster, "broker-0", replicas=2, timeout=60)
    leader = cluster.leader("broker-0")
    assert leader is not None and leader is not follower
    return leader, follower


def refused_sessions(leader: Any, code: str = "UNAUTHENTICATED") -> float:
    return metric_sum(leader.metrics_port, "txmq_replication_sessions_refused_total", {"code": code})


def test_a_removed_replica_identity_stops_its_open_replication_session(shard: tuple[Cluster, Path]) -> None:
    """The follower replicates as identity "replica"; "replica" is removed: its open session
    ends (UNAUTHENTICATED), its reconnections are refused, and it leaves the in-sync set."""
    cluster, creds = shard
    leader, follower = as_replica(cluster, creds)
    replica_id = int(follower.env["TXMQ_REPLICA_ID"])
    assert follower_status(cluster, replica_id).connected
    since = leader.log_size()

    write_credentials(creds, absent=("replica",))
    wait_until(lambda: not follower_status(cluster, replica_id).connected, 20.0,
               message=lambda: f"the follower still replicating: {follower_status(cluster, replica_id)}")
    status = leader_status(cluster, "broker-0").replication
    assert replica_id not in status.in_sync_replicas, status
    refusals = [json.loads(line) for line in leader.log_text(since).splitlines()
                if '"replication connection refused"' in line]
    assert refusals and all(r["code"] == "UNAUTHENTICATED" for r in refusals), refusals


def test_a_refused_follower_reconnects_less_and_less_often(shard: tuple[Cluster, Path]) -> None:
    """"replica" is removed: the leader refuses the follower's every reconnection (counted in
    txmq_replication_sessions_refused_total), and the follower backs off — a handful of
    refusals in 8 s, the gaps growing, not one per election poll (0.05 s here: ~160). With
    "replica" back the follower is in sync again within the backoff's cap. Failed before:
    the follower dialled the leader again at every election round, for ever."""
    cluster, creds = shard
    leader, follower = as_replica(cluster, creds)
    assert refused_sessions(leader) == 0
    write_credentials(creds, absent=("replica",))
    wait_until(lambda: refused_sessions(leader) >= 1, 20.0, message="no refused session at the leader")
    counts = []
    for _ in range(8):
        counts.append(refused_sessions(leader))
        time.sleep(1.0)
    counts.append(refused_sessions(leader))
    assert counts[-1] - counts[0] <= 12, counts
    assert counts[-1] - counts[4] <= counts[4] - counts[0] + 1, counts  # slower in the second half
    write_credentials(creds)
    wait_in_sync(cluster, "broker-0", replicas=2, timeout=2 * RETRY_MAX_SECONDS + 15)
    assert follower.running


def test_a_checkpoint_held_across_a_replica_identitys_removal_sends_no_more_of_the_store(
        shard: tuple[Cluster, Path]) -> None:
    """A rebuild's FetchCheckpoint, as identity "replica", reads its first chunk; "replica" is
    removed: the rest of the checkpoint (the shard's whole store, ~20 MiB: more than gRPC
    lets the leader write ahead of a reader) is refused UNAUTHENTICATED. Failed before: the
    checkpoint, authorized when it began, streamed to its end."""
    cluster, creds = shard
    with txmq.Producer(cluster.nameserver_address, token=TOKENS["operator"]) as producer:
        cluster.create_topic("big", queue_count=1)
        for _ in range(40):
            producer.send(txmq.Message("big", os.urandom(512 * 1024)))
    leader = cluster.leader("broker-0")
    assert leader is not None
    info = leader_status(cluster, "broker-0")
    replica_id = int(follower_of(cluster).env["TXMQ_REPLICA_ID"])
    stub = replication_pb2_grpc.ReplicationServiceStub(grpc.insecure_channel(leader.address))
    call = stub.FetchCheckpoint(replication_pb2.FetchCheckpointRequest(
        shard="broker-0", replica_id=replica_id, leader_epoch=info.leader_epoch),
        metadata=[("authorization", f"Bearer {TOKENS['replica']}")], timeout=60)
    try:
        assert next(call).file_name
        write_credentials(creds, absent=("replica",))

        def refused() -> bool:  # the leader read the removal
            try:
                stub.FetchCheckpoint(replication_pb2.FetchCheckpointRequest(shard="broker-0"), timeout=10,
                                     metadata=[("authorization", f"Bearer {TOKENS['replica']}")]).next()
            except grpc.RpcError as exc:
                return exc.code() == grpc.StatusCode.UNAUTHENTICATED
            return False
        wait_until(refused, 15.0, message="the leader to read the removal")
        with pytest.raises(grpc.RpcError) as ended:
            for _ in call:
                pass
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED, ended.value
    finally:
        call.cancel()
