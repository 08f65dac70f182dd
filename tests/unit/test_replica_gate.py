"""A leader's bridge gated by its Leadership (services/broker/replica/term.py), on a real
store with a fake clock: the lone leader — in-sync set {itself, a dead replica it cannot
drop} — fails a write it admitted while its followers might still connect within
``replica_lag_max_seconds`` plus one election round, refuses later writes at once with
nothing applied, and answers a write needing no sync at once while what it reads is
committed."""

from __future__ import annotations

import asyncio

import pytest

from services.broker.bridge import StoreBridge
from services.broker.replica.errors import CommitStalledError
from services.broker.replica.state import InSync, Leadership, Rules
from services.broker.replica.term import Gate
from services.broker.store.db import Database
from txmq.errors import NotEnoughReplicasError

LAG = 1.0  # replica_lag_max_seconds
POLL = 0.05  # election_poll_seconds: the node ticks its gate once a round
T0 = 500.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def put(key: bytes):
    return lambda w: (w.put("meta", key, b"v"), key.decode())[1]


def lone_leader(tmp_path, loop: asyncio.AbstractEventLoop, *, tail: int) -> tuple[Database, StoreBridge, Gate, Clock]:
    """Replica 2 leads after 0 and 1 died, its set {1, 2} keeping the dead 1 (min_insync 2).
    Its log holds 6 committed entries, then ``tail`` it cannot know were committed."""
    db = Database(str(tmp_path / "store"), sync=True, replicated=True)
    db.replication.begin_epoch(3)
    for i in range(6 + tail):
        db.call(put(b"old-%d" % i))
    db.replication.begin_epoch(9)
    db.read_ticket = db.written  # as a new leader does: nothing on disk shown before it is committed
    clock = Clock()
    lead = Leadership(Rules("broker-0", 2, 3, 2, LAG, 1.0), epoch=9, isr=InSync((1, 2), 8), commit=6, now=T0)
    bridge = StoreBridge(db, loop, on_fatal=lambda exc: None)
    gate = Gate(lead, bridge, lambda: db, clock=clock)
    return db, bridge, gate, clock


def test_the_lone_leader_refuses_sends_within_lag_max_and_one_round(tmp_path):
    async def scenario() -> None:
        db, bridge, gate, clock = lone_leader(tmp_path, asyncio.get_running_loop(), tail=1)
        clock.now = T0 + 0.1
        early = bridge.run(put(b"early"))  # admitted: replica 1 may still be connecting
        read = bridge.run(put(b"receive"), sync=False)  # needs no sync, reads the uncommitted tail
        await asyncio.sleep(0.05)
        gate.tick()
        assert not early.done() and not read.done()

        clock.now = T0 + LAG + POLL  # replica 1 never came: the round after lag_max
        gate.tick()
        for answer in (early, read):
            assert answer.done()
            with pytest.raises(CommitStalledError, match="outcome unknown"):
                answer.result()
        written = db.written
        late = bridge.run(put(b"late"))  # refused up front, told at once
        assert late.done()
        with pytest.raises(NotEnoughReplicasError) as refused:
            late.result()
        assert (refused.value.in_sync, refused.value.required) == (1, 2)
        again = bridge.run(put(b"receive-again"), sync=False)
        assert again.done() and isinstance(again.exception(), NotEnoughReplicasError)
        assert db.written == written, "a refused write was applied"
        db.close()
    asyncio.run(scenario())


def test_the_lone_leader_answers_at_once_what_needs_no_sync_while_it_reads_only_committed_state(tmp_path):
    async def scenario() -> None:
        db, bridge, gate, clock = lone_leader(tmp_path, asyncio.get_running_loop(), tail=0)
        clock.now = T0 + LAG + POLL
        gate.tick()
        received = bridge.run(put(b"receive"), sync=False)
        await asyncio.wait_for(received, 1.0)  # answered at once, not after its deadline
        assert received.result() == "receive"
        send = bridge.run(put(b"send"))
        assert send.done() and isinstance(send.exception(), NotEnoughReplicasError)
        db.close()
    asyncio.run(scenario())


def test_a_follower_back_in_time_commits_what_waited_and_nothing_fails(tmp_path):
    async def scenario() -> None:
        db, bridge, gate, clock = lone_leader(tmp_path, asyncio.get_running_loop(), tail=1)
        clock.now = T0 + 0.2
        waiting = bridge.run(put(b"early"))
        await asyncio.sleep(0.05)  # the local sync has run
        progress = gate.lead.connect(1, clock.now, db.written)
        clock.now = T0 + 0.4
        gate.acked(progress, db.written)
        assert waiting.done() and waiting.result() == "early"
        clock.now = T0 + LAG + POLL
        gate.tick()
        assert gate.lead.commit == db.written and not gate.lead.stalled(clock.now)
        db.close()
    asyncio.run(scenario())


def test_a_lone_leader_delivers_what_is_committed_at_once_and_holds_back_the_rest(tmp_path):
    """Issue 33 item 2, with the broker's domain over the replicated store: the queues'
    reads are capped at the first entry above the commit point, so a plain receive (and an
    ack) is answered at once with committed messages only — new deliveries and redeliveries
    past the cap held back — while sends are refused; once a follower is back and the commit
    point covers the tail, the caps are lifted and the rest is delivered."""
    import dataclasses

    from services.broker.config import BrokerConfig
    from services.broker.core import BrokerCore, parse_tag_filter
    from services.broker.store import codec
    from services.broker.store.codec import LogRecord

    class MsClock:
        ms = 1_700_000_000_000

        def __call__(self) -> int:
            return self.ms

    ms = MsClock()

    async def scenario() -> None:
        db = Database(str(tmp_path / "store"), sync=True, replicated=True)
        db.replication.begin_epoch(3)
        config = dataclasses.replace(BrokerConfig(data_dir=str(tmp_path / "store"), flush="sync"))
        core = BrokerCore(config, clock=ms, db=db)

        def send(body: bytes):
            record = core.validate_message(LogRecord(kind=codec.KIND_NORMAL, topic="orders", body=body,
                                                     message_id="", queue_id=0, stored_ms=0))
            return core.send_op(record)

        def receive(group: str, invisible: float = 30.0):
            return core.receive_op(group, "orders", 0, parse_tag_filter("*"), 16, invisible)

        db.call(core.create_topic_op("orders", 1))
        for i in range(3):
            db.call(send(b"m%d" % i))
        committed = db.written
        for i in range(3, 5):  # the tail the new leader cannot know was committed
            db.call(send(b"m%d" % i))
        old = db.call(receive("old", invisible=1.0)).deliveries  # a delivery of all five, in the tail too
        assert [d.offset for d in old] == [0, 1, 2, 3, 4]
        tail_end = db.written
        db.replication.begin_epoch(9)
        db.read_ticket = db.written
        clock = Clock()
        lead = Leadership(Rules("broker-0", 2, 3, 2, LAG, 1.0), epoch=9, isr=InSync((1, 2), 8), commit=committed,
                          now=T0)
        bridge = StoreBridge(db, asyncio.get_running_loop(), on_fatal=lambda exc: None)
        gate = Gate(lead, bridge, lambda: db, clock=clock, cap_reads=core.queues.cap_reads)

        clock.now = T0 + LAG + POLL  # replica 1 never came
        gate.tick()
        assert gate.capped and gate.caps == {("orders", 0): 3}
        got = bridge.run(receive("fresh"), sync=False)
        await asyncio.wait_for(got, 1.0)  # answered at once
        fresh = got.result().deliveries
        assert [core.read_message(d.log_seq).body for d in fresh] == [b"m0", b"m1", b"m2"]
        acked = bridge.run(core.ack_op("fresh", "orders", [fresh[0].receipt_handle]), sync=False)
        await asyncio.wait_for(acked, 1.0)
        assert acked.result() == [None]
        ms.ms += 2000  # the old deliveries' invisibility ended: 0..2 come again, 3..4 are held back
        again = bridge.run(receive("old"), sync=False)
        await asyncio.wait_for(again, 1.0)
        assert [(d.offset, d.attempt) for d in again.result().deliveries] == [(0, 2), (1, 2), (2, 2)]
        assert again.result().next_deadline_ms is None or again.result().next_deadline_ms > ms.ms
        refused = bridge.run(send(b"lone"))
        assert refused.done() and isinstance(refused.exception(), NotEnoughReplicasError)

        progress = lead.connect(1, clock.now, db.written)  # replica 1 is back and catches up
        await asyncio.sleep(0.05)  # the local sync has run
        gate.acked(progress, db.written)
        assert lead.commit >= tail_end  # the inherited tail is committed (receives since need no sync)
        gate.tick()
        assert not gate.capped and core.queues.read_caps == {}
        rest = bridge.run(receive("fresh"), sync=False)
        await asyncio.wait_for(rest, 1.0)
        assert [core.read_message(d.log_seq).body for d in rest.result().deliveries] == [b"m3", b"m4"]
        db.close()
    asyncio.run(scenario())
