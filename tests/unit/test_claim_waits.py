"""The broker's held claims (services/broker/claimwaits.py): how long an empty claim is
held, and a lowered floor ending the holds it falls before."""

from __future__ import annotations

import asyncio
import time

from services.broker.claimwaits import MAX_CLAIM_WAIT_MS, ClaimWaits, hold_until


def test_an_empty_claim_is_held_until_its_wait_ends_or_the_sessions_earliest_floor():
    assert hold_until(1_000, 500, 10_000) == 1_500
    assert hold_until(1_000, 500, 1_200) == 1_200  # a check of the session's groups falls due first
    assert hold_until(1_000, 10**9, 2**62) == 1_000 + MAX_CLAIM_WAIT_MS


def test_a_claim_asking_no_wait_or_with_a_check_due_is_answered_at_once():
    assert hold_until(1_000, 0, 10_000) is None
    # Due already (waiting for a producer's capacity, or just due): the checker claims again
    # as its credit frees, so nothing is held.
    assert hold_until(1_000, 500, 1_000) is None
    assert hold_until(1_000, 500, 10) is None


def clock_ms() -> int:
    return int(time.monotonic() * 1000)


def test_a_floor_lowered_before_a_hold_ends_it_and_one_after_does_not():
    async def main() -> tuple[bool, bool, int]:
        waits = ClaimWaits()
        early = asyncio.ensure_future(waits.hold(clock_ms() + 60_000, clock_ms))
        late = asyncio.ensure_future(waits.hold(clock_ms() + 60_000, clock_ms))
        await asyncio.sleep(0)
        held = waits.held
        waits.lowered(clock_ms() + 120_000)  # after both holds end: nothing to claim sooner
        await asyncio.sleep(0.01)
        untouched = not early.done() and not late.done()
        waits.lowered(clock_ms() + 100)
        await asyncio.wait_for(asyncio.gather(early, late), 5)
        return untouched, waits.held == 0, held

    untouched, released, held = asyncio.run(main())
    assert held == 2
    assert untouched
    assert released


def test_a_hold_ends_by_itself_at_its_time():
    async def main() -> int:
        waits = ClaimWaits()
        await asyncio.wait_for(waits.hold(clock_ms() + 20, clock_ms), 5)
        return waits.held

    assert asyncio.run(main()) == 0
    ClaimWaits().lowered(0)  # nothing held: nothing to do


def test_a_half_message_lowering_its_groups_floor_tells_the_held_claims(make_core, clock):
    """``CheckSchedule.on_lowered`` hears the first check of a new half message (sooner
    than anything due of its group), and ``earliest`` is the floor the holds end at."""
    from tests.unit.test_broker_core import half

    core = make_core(transaction_timeout_seconds=6.0)
    core.db.call(core.create_topic_op("orders", 1))
    told: list[int] = []
    core.schedule.on_lowered = told.append
    assert core.schedule.earliest(["pg", "other"]) == 2**62  # nothing due: a hold ends at its wait
    half(core, group="pg")
    assert told == [clock() + 6_000]
    assert core.schedule.earliest(["pg", "other"]) == clock() + 6_000
    half(core, b"second", group="pg")  # due no sooner than the first: nobody is told again
    assert told == [clock() + 6_000]
