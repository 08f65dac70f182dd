"""The replication port of a replicated shard fuzzed (a bounded budget; ``make fuzz`` runs
more): random well-typed frames and raw bytes at the leader's and a follower's port
(``tests/support/replfuzz.py``). 0 crashes, a clear refusal for what is not the protocol,
the shard serving throughout, and afterwards its replicas equal and clean under fsck."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from services.broker.store import replog
from tests.integration.test_replication import replicated
from tests.support.replfuzz import Census, run_on_cluster
from tests.support.replstream import exchange, refusal, replication_address

#: A replicated shard fuzzed: the heavy lane (tests/support/lanes.py).
pytestmark = pytest.mark.heavy

EXAMPLES = 60


def test_fuzzing_the_replication_port_of_a_replicated_shard(fresh_cluster_factory: Any, capsys: Any) -> None:
    cluster = replicated(fresh_cluster_factory)
    # A session that claims more than it was shipped is refused: its ack would move the
    # commit point over entries no follower holds.
    leader = cluster.wait_leaders()["broker-0"]
    epoch = {b.name: b for b in cluster.list_brokers()}["broker-0"].leader_epoch
    other = next(int(p.name.rsplit("-r", 1)[1]) for p in cluster.shards["broker-0"] if p is not leader)
    frames, _closed = exchange(replication_address(leader), replog.encode_hello("broker-0", other, epoch, 0, 0)
                               + replog.encode_ack(2**63), max_frames=8)
    assert frames and frames[0][0] == replog.START, frames[:2]
    refused = refusal(frames)
    assert refused is not None and refused.code == grpc.StatusCode.INVALID_ARGUMENT, frames
    assert "beyond the last shipped" in refused.message
    census = Census()
    report = run_on_cluster(cluster, EXAMPLES, census)
    with capsys.disabled():
        print(f"\n{census.table()}")
    assert census.calls("leader") >= EXAMPLES and census.calls("follower") >= EXAMPLES
    assert not census.failures, census.failures
    assert report["errors"] == [], report["errors"]
    assert all(report["running"].values()), report["running"]
    assert report["still_leader"], "the leader lost its shard during the fuzz"
    # Refusals were the answer to most of it (the property is not vacuous).
    refused = sum(v for k, v in census.counts["follower"].items() if k.startswith("refused"))
    assert refused >= EXAMPLES // 2, census.counts["follower"]
