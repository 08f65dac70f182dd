"""A few fault-injection runs against a replicated shard inside ``make test`` (``make
chaos`` runs many more with random seeds; see tests/chaos.py for the faults and the
invariants). Fixed seeds, so a failure here reproduces with ``python -m tests.chaos --seed``
(with ``--classic`` for the first two, which draw from the first faults only, and
``--schedule`` for the third; ``--shards 2 --classic --faults 3`` for the two-shard run)."""

from __future__ import annotations

import os

import pytest

from tests.chaos import report, run_once

#: Three replicas, etcd and a mixed load under faults: the heavy lane (tests/support/lanes.py).
pytestmark = [pytest.mark.timeout(300), pytest.mark.heavy]


@pytest.mark.parametrize("seed", [6, 1])
def test_chaos_run_keeps_every_invariant(seed, tmp_path):
    result = run_once(seed, faults=4, workdir=tmp_path / f"chaos-{seed}", more=False)
    report([result])
    assert result.violations == [], f"seed {seed} schedule {result.schedule}: {result.violations[:10]}"
    assert result.failovers, "the schedule killed or paused no leader"


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_chaos_run_with_network_partitions_keeps_every_invariant(tmp_path):
    seed = 116  # the leader cut off from the cluster while clients reach it, then from everyone
    result = run_once(seed, faults=2, workdir=tmp_path / f"chaos-partitions-{seed}", partitions=True,
                      more=False)
    report([result])
    assert result.schedule == ["partition-leader-from-cluster", "partition-leader"]
    assert result.violations == [], f"seed {seed} schedule {result.schedule}: {result.violations[:10]}"
    assert len(result.failovers) == 2


def test_chaos_run_with_an_elect_two_kills_and_a_check_storm_keeps_every_invariant(tmp_path):
    """The leader ``txmq broker elect`` just chose killed at once; two replicas of three
    killed together (the survivor refuses every send retryably); 300 UNKNOWN transactions
    whose checks fall due as the leader is killed. ``make chaos`` draws these and the
    rebuild and etcd faults with random seeds."""
    seed = 11
    result = run_once(seed, faults=3, workdir=tmp_path / f"chaos-more-{seed}", storm=300,
                      schedule=["elect-kill-leader", "kill-two", "check-storm"])
    report([result])
    assert result.violations == [], f"seed {seed} schedule {result.schedule}: {result.violations[:10]}"
    assert len(result.failovers) == 2


def test_chaos_run_against_two_shards_keeps_every_invariant_on_each(tmp_path):
    """Two shards of three replicas under one load: each shard's leader killed or paused
    alone, then one shard's leader killed while the other's is paused. The load (and the
    checker's claims) must have reached both shards, and both keep every invariant."""
    seed = 4
    result = run_once(seed, faults=3, workdir=tmp_path / f"chaos-shards-{seed}", more=False, shards=2)
    report([result])
    assert result.schedule == ["kill-leader@broker-1", "pause-leader@broker-0", "kill-pause-leaders@broker-0+broker-1"]
    assert result.violations == [], f"seed {seed} schedule {result.schedule}: {result.violations[:10]}"
    # Every stopped leader had an in-sync, complete follower: four fail-overs, two at once.
    assert len(result.failovers) == 4
    for shard in ("broker-0", "broker-1"):
        counts = result.by_shard.get(shard, {})
        assert counts.get("delivered") and counts.get("checks_answered"), f"{shard} was not under load: {result.by_shard}"
