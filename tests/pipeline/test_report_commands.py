"""The audit report's next steps (issue 32, item 6), without Spark: every anomaly shows
``txmq txn describe <id>`` first (``message get`` when only a message id is known), a
transaction still undecided gets no decision filled in (a template that runs nothing, saying
how to decide), and ids are printed whole however long."""

from __future__ import annotations

import shlex
import subprocess
import sys
from types import SimpleNamespace

from txmq_pipeline import report

NS = "ns-0.txmq:9876"
LONG_ID = "T" + "A" * 120  # ids of a long broker name are long: none is cut


def _result() -> SimpleNamespace:
    rows = {
        "pending_too_old": [{"transaction_id": LONG_ID, "message_id": "M1", "broker": "b", "producer_group": "pg",
                             "topic": "t", "detail": "prepared 2 h ago"}],
        "discarded_unresolved": [{"transaction_id": "T2", "message_id": "M2", "broker": "b", "producer_group": "pg",
                                  "topic": "t", "detail": "check budget spent"}],
        "duplicate_message_id": [{"transaction_id": "", "message_id": "M3", "broker": "b", "producer_group": "",
                                  "topic": "t", "detail": "2 copies"}],
    }
    return SimpleNamespace(anomalies=3, anomaly_counts={k: 1 for k in rows}, anomaly_examples=rows,
                           transactions=10, messages=10, seconds=1.0, state_counts=[], latency=[], checks=[],
                           generated_at_ms=1_700_000_000_000, latency_histogram=[])


def test_describe_first_no_decision_filled_in_ids_whole() -> None:
    pending = report.commands("pending_too_old", _result().anomaly_examples["pending_too_old"][0], NS)
    assert pending[0] == f"txmq --nameserver {NS} txn describe {LONG_ID}"
    assert len(pending) == 2 and pending[1].startswith("#") and "COMMIT_OR_ROLLBACK" in pending[1]
    assert not any("--rollback" in c or "--commit" in c for c in pending)
    discarded = report.commands("discarded_unresolved", _result().anomaly_examples["discarded_unresolved"][0], NS)
    assert discarded[0].endswith("txn describe T2") and "--rollback" not in "".join(discarded)
    assert report.commands("duplicate_message_id", _result().anomaly_examples["duplicate_message_id"][0], NS) \
        == [f"txmq --nameserver {NS} message get M3"]
    md = report.markdown(_result(), NS, 60.0)
    assert LONG_ID in md and md.count("txn describe") == 2 and "message get M3" in md
    page = report.html_page(_result(), NS, 60.0, {"state_counts": b"", "latency": b""})
    assert f"txn describe {LONG_ID}" in page


def test_the_decision_template_runs_nothing_when_pasted() -> None:
    # Pasted into a shell the template is a comment; run as a command (without the #) the
    # CLI refuses it as a usage error: it can never roll back (or commit) by accident.
    template = report.commands("pending_too_old", {"transaction_id": "T9"}, NS)[1]
    assert subprocess.run(["bash", "-c", template], capture_output=True).returncode == 0
    argv = shlex.split(template.split(": ", 1)[1])
    done = subprocess.run([sys.executable, "-m", "txmq", *argv[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--commit --rollback is required" in done.stderr
