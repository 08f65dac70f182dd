"""The bridge on a replicated shard: answers wait for the commit point as well as the local
sync, in ticket order, and a lost leadership fails every waiting answer (and every later
request) instead of leaving it hanging."""

from __future__ import annotations

import asyncio

import pytest

from services.broker.bridge import StoreBridge
from services.broker.store.db import Database
from txmq import LeadershipLostError


def test_answers_wait_for_the_commit_point_and_fail_when_leadership_is_lost(tmp_path):
    async def scenario() -> None:
        db = Database(str(tmp_path / "store"), sync=True, replicated=True)
        db.replication.begin_epoch(7)
        commit = {"lsn": 0}
        bridge = StoreBridge(db, asyncio.get_running_loop(), on_fatal=lambda exc: None)
        bridge.commit_gate = lambda: commit["lsn"]
        first = bridge.run(lambda w: (w.put("meta", b"a", b"1"), "first")[1])
        second = bridge.run(lambda w: (w.put("meta", b"b", b"2"), "second")[1])
        failed: list[BaseException] = []
        _result, ticket = bridge.apply(lambda w: w.put("meta", b"c", b"3"))
        bridge.when_durable(ticket, lambda: failed.append(AssertionError("answered")), failed.append)
        await asyncio.sleep(0.05)  # the local sync has run: still nothing is told
        assert not first.done() and not second.done()
        commit["lsn"] = 1
        bridge.release()
        assert first.done() and first.result() == "first" and not second.done()
        bridge.fail_all(LeadershipLostError("broker-0", 0))
        with pytest.raises(LeadershipLostError):
            await second
        assert len(failed) == 1 and isinstance(failed[0], LeadershipLostError)
        with pytest.raises(LeadershipLostError):
            bridge.apply(lambda w: w.put("meta", b"d", b"4"))
        db.close()
    asyncio.run(scenario())


def test_a_follower_drops_an_epoch_it_led_without_writing_and_follows_an_older_ones_entries(tmp_path):
    """Leader-epoch truncation: a replica won epoch 7 and lost it before writing anything;
    the next leader still holds entries of epoch 5 past that replica's log end (written by
    a leader it never heard from). Truncating to its own log end must also drop the empty
    epoch 7, or every later entry of epoch 5 is refused as older and it never follows again
    (seen in chaos seed 1: "entry 5861 has epoch 9, older than 11", looping forever)."""
    from services.broker.store import replog

    def put(db: Database, key: bytes) -> None:
        db.apply(lambda w: w.put("meta", key, b"v"))

    leader = Database(str(tmp_path / "leader"), sync=False, replicated=True)
    follower = Database(str(tmp_path / "follower"), sync=False, replicated=True)
    leader.replication.begin_epoch(3)
    put(leader, b"a")
    follower.replication.append_entries(replog.pack_entries(leader.replication.read_entries(1, 1 << 20)), follower.replication.commit_lsn)
    leader.replication.begin_epoch(5)
    put(leader, b"b")
    put(leader, b"c")
    follower.replication.begin_epoch(7)  # led, wrote nothing, lost the leadership
    _epoch, end = replog.epoch_end(leader.replication.epochs, follower.replication.last_epoch, leader.written)
    assert follower.replication.truncate(min(follower.written, end)) == 0
    assert follower.replication.epochs == [(3, 1)]
    follower.replication.append_entries(replog.pack_entries(leader.replication.read_entries(2, 1 << 20)), follower.replication.commit_lsn)
    assert follower.written == 3 and follower.replication.epochs == [(3, 1), (5, 2)]
    assert follower.digest() == leader.digest()
    leader.close()
    follower.close()


def test_a_follower_takes_back_what_it_wrote_in_epochs_its_new_leader_never_knew(tmp_path):
    """Kafka's second round of leader-epoch truncation (chaos seed 757300121). Replica A
    followed leader B through epoch 12 up to lsn 3 and missed B's lsn 4; A then led epoch 14
    and wrote lsns 4-5 that nobody acknowledged; B, never hearing of epoch 14, leads epoch
    18 from its lsn 4 on. B answers A's hello (last epoch 14) with its end of epoch 12: lsn
    4. Truncating A to 4 kept A's own epoch-14 lsn 4 in place of B's: every later entry
    applied on top, and A's due and pending indexes kept a rolled-back transaction's entries.
    A must truncate to its own end of epoch 12 (lsn 3) too."""
    from services.broker.store import replog

    def put(db: Database, key: bytes, value: bytes) -> None:
        db.apply(lambda w: w.put("meta", key, value))

    b = Database(str(tmp_path / "b"), sync=False, replicated=True)
    a = Database(str(tmp_path / "a"), sync=False, replicated=True)
    b.replication.begin_epoch(12)
    for key in (b"x", b"y", b"z"):
        put(b, key, b"b12")
    a.replication.append_entries(replog.pack_entries(b.replication.read_entries(1, 1 << 20)), a.replication.commit_lsn)
    put(b, b"w", b"b12")  # lsn 4: A never receives it
    a.replication.begin_epoch(14)
    put(a, b"x", b"a14")  # lsn 4 and 5 on A, acknowledged by nobody
    put(a, b"v", b"a14")
    b.replication.begin_epoch(18)
    put(b, b"y", b"b18")  # lsn 5 on B

    end_epoch, end = replog.epoch_end(b.replication.epochs, a.replication.last_epoch, b.written)
    truncate_to = min(a.written, end)
    assert (end_epoch, truncate_to) == (12, 4)
    target = replog.follower_truncation(a.replication.epochs, a.written, truncate_to, end_epoch)
    assert target == 3
    a.replication.truncate(target)
    assert a.written == 3 and a.replication.epochs == [(12, 1)]
    a.replication.append_entries(replog.pack_entries(b.replication.read_entries(4, 1 << 20)), a.replication.commit_lsn)
    assert a.written == b.written == 5
    assert a.digest() == b.digest()
    b.close()
    a.close()


def test_the_start_frame_carries_the_epoch_its_truncation_point_ends():
    from services.broker.store import replog

    frame = replog.encode_start(18, 40, 4, 12)
    kind, body = frame[4], frame[5:]
    assert replog.decode_leader(kind, body) == (18, 40, 4, b"")
    assert replog.start_end_epoch(body) == 12
    with pytest.raises(replog.FrameError):
        replog.decode_leader(kind, body[:-8])  # a version-2 start without it
