"""An anchored transaction from another language (issue 29, item 6): Node.js with the `pg`
package and a txmq client generated from protos/txmq/v1 (tests/integration/node/
anchored_txmq.js follows protos/txmq/v1/DECISIONS.md, no SDK). It commits normally; it is
SIGKILLed after its local COMMIT before any EndTransaction (the check commits it from the
row); and with its local transaction open after the half was stored (the check fences
it). The checks are answered by another instance of the group (a Python producer) from
the decisions table. And when the application's own work fails or ends the transaction
inside the block, the client settles its half itself from the row (DECISIONS.md steps 4
and 5), before any check."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_anchored_crash import (checked, committed_orders, decision_rows, pg,  # noqa: F401 - fixtures
                                                   prepare, settle_and_check, undecided)

NODE_DIR = Path(__file__).parent / "node"
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(shutil.which("node") is None or not (NODE_DIR / "node_modules" / "pg").is_dir(),
                                 reason="node or tests/integration/node/node_modules missing (make anchored-node-deps)")]


def url(dsn: str) -> str:
    parts = dict(p.split("=", 1) for p in dsn.split())
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


def node(cluster, dsn: str, topic: str, group: str, order: str, die: str = "",
         app: str = "") -> tuple[int, list[dict], str]:
    args = {"nameserver": cluster.nameserver_address, "dsn": url(dsn), "topic": topic, "group": group,
            "order": order, "die": die, "app": app}
    done = subprocess.run(["node", str(NODE_DIR / "anchored_txmq.js"), json.dumps(args)], cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def test_a_node_client_commits_is_killed_and_is_decided_by_the_check(checked, pg, unique_name):
    dsn = prepare(pg)
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    code, events, err = node(checked, dsn, topic, group, "node-ok")
    assert code == 0, err
    assert [e["event"] for e in events] == ["half", "committed", "ended"]
    assert events[-1]["state"] == "TRANSACTION_STATE_COMMITTED"
    assert decision_rows(dsn) == []

    code, events, err = node(checked, dsn, topic, group, "node-committed", die="committed")
    assert code == -9, err
    assert [e["event"] for e in events] == ["half", "committed"]
    assert [d for _k, d in decision_rows(dsn)] == ["commit"]

    code, events, err = node(checked, dsn, topic, group, "node-open", die="open")
    assert code == -9, err
    assert [e["event"] for e in events] == ["half"]

    counts = settle_and_check(checked, dsn, group, topic, unique_name)
    assert committed_orders(dsn) == {"node-ok", "node-committed"}
    assert counts == {"committed": 2, "fences": 1}


def test_a_node_client_settles_its_half_from_the_row_when_the_application_ends_the_transaction(
        checked, pg, unique_name):
    """No check involved: right after the client returns, the broker has decided its half as
    the row says. A failing block rolls back and hints ROLLBACK; a commit inside the block
    is found committed (the row lists no halves) and its half commits; a rollback inside
    the block fences the key and the half rolls back."""
    dsn = prepare(pg)
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    code, events, err = node(checked, dsn, topic, group, "node-fails", app="fails")
    assert code == 0, err
    assert [e["event"] for e in events] == ["half", "rolled_back"]
    assert events[-1]["decided"] == "rollback" and events[-1]["states"] == ["TRANSACTION_STATE_ROLLED_BACK"]
    assert undecided(checked, group) == [] and decision_rows(dsn) == []

    code, events, err = node(checked, dsn, topic, group, "node-commits-inside", app="commits-inside")
    assert code == 0, err
    assert [e["event"] for e in events] == ["half", "ended_inside"]
    assert events[-1]["decided"] == "commit" and events[-1]["states"] == ["TRANSACTION_STATE_COMMITTED"]
    assert undecided(checked, group) == [] and decision_rows(dsn) == []

    code, events, err = node(checked, dsn, topic, group, "node-rolls-back-inside", app="rolls-back-inside")
    assert code == 0, err
    assert [e["event"] for e in events] == ["half", "ended_inside"]
    assert events[-1]["decided"] == "rollback" and events[-1]["states"] == ["TRANSACTION_STATE_ROLLED_BACK"]
    assert undecided(checked, group) == [] and [d for _k, d in decision_rows(dsn)] == ["rollback"]

    counts = settle_and_check(checked, dsn, group, topic, unique_name)
    assert committed_orders(dsn) == {"node-commits-inside"}
    assert counts == {"committed": 1, "fences": 1}
