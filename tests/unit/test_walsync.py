"""The WAL sync helper (services/broker/store/walsync.py): its protocol, which files it
syncs, and the broker-side handle, with a real helper process."""

from __future__ import annotations

import os
import select
import signal
import threading

import pytest

from services.broker.store import walsync
from services.broker.store.walsync import TICKET_BYTES, WalSyncer, WalSyncerGoneError


def _ticket(n: int) -> bytes:
    return n.to_bytes(TICKET_BYTES, "little")


def test_one_sync_answers_every_ticket_waiting_with_the_highest(tmp_path) -> None:
    (tmp_path / "000007.log").write_bytes(b"wal")
    to_helper_r, to_helper_w = os.pipe()
    from_helper_r, from_helper_w = os.pipe()
    # Three requests are waiting before the helper reads: one sync, one answer.
    os.write(to_helper_w, _ticket(3) + _ticket(4) + _ticket(9))
    os.close(to_helper_w)
    status: list[int] = []
    helper = threading.Thread(target=lambda: status.append(walsync.serve(str(tmp_path), to_helper_r, from_helper_w)))
    helper.start()
    helper.join(10)
    os.close(from_helper_w)
    answers = b""
    while chunk := os.read(from_helper_r, 64):
        answers += chunk
    assert answers == _ticket(9)
    assert status == [0]  # stdin closed: the helper ends cleanly


def test_a_partial_ticket_waits_for_its_remaining_bytes(tmp_path) -> None:
    to_helper_r, to_helper_w = os.pipe()
    from_helper_r, from_helper_w = os.pipe()
    helper = threading.Thread(target=walsync.serve, args=(str(tmp_path), to_helper_r, from_helper_w), daemon=True)
    helper.start()
    os.write(to_helper_w, _ticket(5)[:3])
    os.write(to_helper_w, _ticket(5)[3:])
    assert os.read(from_helper_r, 64) == _ticket(5)
    os.close(to_helper_w)
    helper.join(10)
    assert not helper.is_alive()


def test_the_log_files_followed_are_the_directory_s_current_wals(tmp_path) -> None:
    (tmp_path / "000001.log").write_bytes(b"a")
    (tmp_path / "OPTIONS-000005").write_bytes(b"not a wal")
    logs = walsync._LogFiles(str(tmp_path))
    logs.sync()
    assert set(logs.files) == {"000001.log"}
    (tmp_path / "000009.log").write_bytes(b"b")
    (tmp_path / "000001.log").unlink()  # its memtable was flushed: RocksDB removed it
    logs.sync()
    assert set(logs.files) == {"000009.log"}


def test_the_directory_is_listed_again_unless_its_times_are_unchanged_and_settled() -> None:
    second = 1_000_000_000
    listed = (100 * second, 100 * second)
    assert walsync.must_list((100 * second, 101 * second), listed, 200 * second)  # changed
    assert walsync.must_list(listed, None, 200 * second)  # never listed
    assert not walsync.must_list(listed, listed, 200 * second)  # unchanged, long ago
    # Unchanged but recent: a change in the same clock tick would not have moved the times.
    assert walsync.must_list(listed, listed, 100 * second + second // 2)


def test_the_broker_side_handle_requests_reads_and_closes(tmp_path) -> None:
    syncer = WalSyncer(str(tmp_path))
    try:
        syncer.request(41)
        syncer.request(42)
        got = None
        while got != 42:
            ready, _, _ = select.select([syncer.fileno()], [], [], 10)
            assert ready, "the helper did not answer"
            got = syncer.read_synced() or got
        assert syncer.read_synced() is None  # nothing more: non-blocking
    finally:
        syncer.close()
    assert syncer._proc.returncode == 0


def test_a_dead_helper_is_reported_not_waited_for(tmp_path) -> None:
    syncer = WalSyncer(str(tmp_path))
    try:
        os.kill(syncer.pid, signal.SIGKILL)
        syncer._proc.wait(10)
        with pytest.raises(WalSyncerGoneError, match="exit status -9"):
            select.select([syncer.fileno()], [], [], 10)
            syncer.read_synced()
    finally:
        syncer.close()


def test_a_helper_that_cannot_sync_its_directory_ends_with_status_1(tmp_path, capfd) -> None:
    assert walsync.main([str(tmp_path / "missing")]) == 1
    assert "sync of" in capfd.readouterr().err
