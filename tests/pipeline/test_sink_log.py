"""The sink log's answers to checks (``SinkLog.decide``): what a check of each kind of half
message the sink wrote gets, from the records the driver keeps in the checkpoint."""

from __future__ import annotations

import txmq
from txmq_pipeline.sink import SinkLog, message_unique, row_key

COMMIT, ROLLBACK = txmq.LocalTransactionState.COMMIT, txmq.LocalTransactionState.ROLLBACK


def test_a_committed_batch_commits_what_its_tasks_reported_and_rolls_back_attempts_left_behind(tmp_path):
    log = SinkLog(str(tmp_path))
    # Batch 3 is running: asked again later.
    assert isinstance(log.decide("q", 0, 3, "reported"), txmq.InProgress)
    # A row first sent to broker-1 (stored, answer lost) went to broker-0: only that copy was reported.
    log.mark_committed(3, 0, ["reported", "other-reported"])
    assert log.decide("q", 0, 3, "reported") == COMMIT
    assert log.decide("q", 0, 3, "left-behind") == ROLLBACK
    assert log.decide("q", 1, 3, "reported") == ROLLBACK  # another epoch's batch 3
    # Every reported transaction is committed: whatever is still asked about was left behind.
    log.mark_settled(3, 0)
    assert log.decide("q", 0, 3, "left-behind") == ROLLBACK
    assert log.committed_epoch(3) == 0 and not (log.root / "committed" / "3.ids").exists()
    # A record written before rerouting existed (a bare epoch) commits the whole epoch.
    (log.root / "committed" / "4").write_text("0")
    assert log.decide("q", 0, 4, "anything") == COMMIT and log.committed_epoch(4) == 0
    # Aborted: rolled back whatever it reported.
    log.mark_aborted(5, 0)
    assert log.decide("q", 0, 5, "reported") == ROLLBACK


def test_a_row_has_one_id_per_shard_and_the_same_one_on_every_attempt_there():
    key = row_key("q", 0, 7, 1, 42)
    assert message_unique(key, "broker-0") == message_unique(row_key("q", 0, 7, 1, 42), "broker-0")
    assert message_unique(key, "broker-0") != message_unique(key, "broker-1")
    assert message_unique(key, "broker-0") != message_unique(row_key("q", 0, 7, 1, 43), "broker-0")
