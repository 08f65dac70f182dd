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
