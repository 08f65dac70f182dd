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
        db.begin_epoch(7)
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
    leader.begin_epoch(3)
    put(leader, b"a")
    follower.append_entries(replog.pack_entries(leader.read_entries(1, 1 << 20)), follower.commit_lsn)
    leader.begin_epoch(5)
    put(leader, b"b")
    put(leader, b"c")
    follower.begin_epoch(7)  # led, wrote nothing, lost the leadership
    _epoch, end = replog.epoch_end(leader.epochs, follower.last_epoch, leader.written)
    assert follower.truncate(min(follower.written, end)) == 0
    assert follower.epochs == [(3, 1)]
    follower.append_entries(replog.pack_entries(leader.read_entries(2, 1 << 20)), follower.commit_lsn)
    assert follower.written == 3 and follower.epochs == [(3, 1), (5, 2)]
    assert follower.digest() == leader.digest()
    leader.close()
    follower.close()
