"""The replication port of a replicated shard fuzzed (a bounded budget; ``make fuzz`` runs
more): random well-typed frames and raw bytes at the leader's and a follower's port
(``tests/support/replfuzz.py``). 0 crashes, a clear refusal for what is not the protocol,
the shard serving throughout, and afterwards its replicas equal and clean under fsck."""

from __future__ import annotations

from typing import Any

from tests.integration.test_replication import replicated
from tests.support.replfuzz import Census, run_on_cluster

EXAMPLES = 60


def test_fuzzing_the_replication_port_of_a_replicated_shard(fresh_cluster_factory: Any, capsys: Any) -> None:
    cluster = replicated(fresh_cluster_factory)
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
