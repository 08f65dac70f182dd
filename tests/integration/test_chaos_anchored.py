"""A short anchored-transaction chaos run inside ``make test`` (``make chaos`` runs many
with random seeds; tests/chaos_anchored.py says what it does and checks): a fixed seed and
schedule — the leader SIGKILLed, a producer SIGKILLed at a random moment, a producer dying
at its fail point right after COMMIT (before any EndTransaction), the whole fleet killed
at once while the checker's resolver answers for the group — reproduced with
``python -m tests.chaos_anchored --seed 5 --resolver on
--schedule kill-leader,kill-producer,failpoint:commit.after,kill-all-producers``.

The invariants' judge is also checked on made-up histories: each violation it must see."""

from __future__ import annotations

import pytest

from tests.chaos import report
from tests.chaos_anchored import judge, run_once
from tests.support.anchored_load import FLAVOURS

SCHEDULE = ["kill-leader", "kill-producer", "failpoint:commit.after", "kill-all-producers"]


#: Three replicas, etcd, PostgreSQL and three producer processes: the heavy lane.
@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_anchored_chaos_run_keeps_every_invariant(tmp_path):
    result = run_once(5, faults=0, workdir=tmp_path / "chaos-anchored-5", schedule=SCHEDULE, resolver=True)
    report([result])
    assert result.violations == [], f"schedule {result.schedule}: {result.violations[:10]}"
    assert result.failovers, "the schedule killed no leader"
    assert result.summary["producer_kills"] >= 5, result.summary  # 1 + the one before arming + 3 at once
    assert result.summary["failpoint_deaths"] == 1, "the producer armed with commit.after never died there"
    assert result.summary["delivered"] > 0 and result.summary["rolled_back"] > 0, result.summary
    assert result.summary["resolver_took_over"] >= 1, "the checker's resolver never served the group"
    assert all(result.summary[f"committed_{flavour}"] > 0 for flavour in FLAVOURS), result.summary


HERE = {("broker-0", 0, 1)}


def test_the_judge_passes_a_clean_history():
    orders = {"a": 1, "b": 2}
    delivered = {"a#0": HERE, "b#0": {("broker-0", 1, 1)}, "b#1": {("broker-0", 1, 2)}}
    assert judge(orders, delivered, [{"committed": "a"}], [{"rolled_back": "c"}],
                 [{"error": "d", "type": "NoLeaderError", "message": "", "retryable": True}]) == []


@pytest.mark.parametrize("orders, delivered, committed, rolled_back, errors, finding", [
    ({"a": 2}, {"a#0": HERE}, [], [], [], "a#1: its order committed but it was never delivered"),
    ({}, {"c#0": HERE}, [], [{"rolled_back": "c"}], [], "c#0: delivered but its order is not in the table (rolled back"),
    ({}, {"x#0": HERE}, [], [], [], "x#0: delivered but its order is not in the table (never committed)"),
    ({"a": 1}, {"a#0": {("broker-0", 0, 1), ("broker-0", 2, 7)}}, [], [], [], "a#0: stored twice"),
    ({}, {}, [{"committed": "a"}], [], [], "a: the producer was told COMMITTED but its row is not in the table"),
    ({"c": 1}, {"c#0": HERE}, [], [{"rolled_back": "c"}], [], "c: the block raised (rolled back) but its row"),
    ({}, {}, [], [], [{"error": "e", "type": "TransactionStateError", "message": "m", "retryable": False}],
     "e: the transaction failed with an error the SDK does not retry: TransactionStateError"),
    ({}, {}, [], [], [{"error": "e", "type": "OperationalError", "message": "m", "retryable": None}],
     "e: the transaction failed with an error the SDK does not retry: OperationalError"),
])
def test_the_judge_sees_each_violation(orders, delivered, committed, rolled_back, errors, finding):
    found = judge(orders, delivered, committed, rolled_back, errors)
    assert any(p.startswith(finding) for p in found), found
