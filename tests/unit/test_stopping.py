"""A service loop woken just before its stop still stops: the cancellation that ends it is
never swallowed (Python 3.11's ``asyncio.wait_for`` returned the woken wait's result
instead, so ``stop()`` awaited a loop that ran on; a replicated broker's leader, whose
step-down wakes its heartbeat, hung in its stop until it was killed). Real loops: the
heartbeat, the timer pump and the global transactions' pump, no name server to call."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from services.broker.config import BrokerConfig
from services.broker.globalpump import GlobalPump
from services.broker.timers import TimerPump
from services.common.aio import Deadline, step_within, wait_event
from services.common.registration import Heartbeat

#: Loop passes between the wake and the stop: the race window is one or two passes wide.
PASSES = range(6)


async def _stops(start: Callable[[], Awaitable[Any]], wake: Callable[[], None],
                 stop: Callable[[], Awaitable[Any]], passes: int) -> bool:
    await start()
    await asyncio.sleep(0.01)  # the loop waits for its wake-up
    wake()
    for _ in range(passes):
        await asyncio.sleep(0)
    stopping = asyncio.ensure_future(stop())
    done, _ = await asyncio.wait([stopping], timeout=2.0)
    if not done:
        stopping.cancel()
    return bool(done)


@pytest.mark.parametrize("passes", PASSES)
def test_a_heartbeat_kicked_just_before_its_stop_stops(passes: int) -> None:
    async def scenario() -> bool:
        beat = Heartbeat((), 30.0, register=None, unregister=None)  # type: ignore[arg-type]
        return await _stops(beat.start, beat.kick, beat.stop, passes)
    assert asyncio.run(scenario()), f"Heartbeat.stop() hung when kicked {passes} loop passes before it"


@pytest.mark.parametrize("passes", PASSES)
def test_the_timer_and_global_pumps_woken_just_before_their_stop_stop(passes: int) -> None:
    async def scenario() -> list[bool]:
        timers = TimerPump(lambda: None)
        pump = GlobalPump(BrokerConfig(), lambda: None, None)
        return [await _stops(timers.start, timers.wake, timers.stop, passes),
                await _stops(pump.start, pump.wake, pump.stop, passes)]
    assert asyncio.run(scenario()) == [True, True], f"a pump's stop hung when woken {passes} passes before it"


def test_wait_event_answers_set_timeout_and_cancel() -> None:
    async def scenario() -> None:
        event = asyncio.Event()
        assert await wait_event(event, 0.01) is False
        event.set()
        assert await wait_event(event, 0.01) is True
        event.clear()
        waiter = asyncio.ensure_future(wait_event(event, None))
        await asyncio.sleep(0)
        event.set()
        waiter.cancel()  # the event and the cancellation in the same pass: the cancellation wins
        with pytest.raises(asyncio.CancelledError):
            await waiter
    asyncio.run(scenario())


def test_a_stop_step_past_its_deadline_is_cancelled_and_the_stop_goes_on() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        cancelled = asyncio.Event()

        async def hangs() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()
        late = await step_within("a hanging step", 0.05, hangs())
        quick = await step_within("a quick step", 1.0, asyncio.sleep(0))
        return late, quick, cancelled.is_set()
    assert asyncio.run(scenario()) == (False, True, True)


def test_stop_steps_sharing_a_deadline_end_by_it_whatever_their_own_bounds() -> None:
    """Each step runs for at most its own bound and at most what is left of the stop's
    deadline: three hanging steps of 5 s each end together within the 0.3 s deadline."""
    import time

    async def scenario() -> tuple[list[bool], float]:
        deadline = Deadline(0.3)
        started = time.monotonic()
        done = [await step_within(f"hangs {i}", 5.0, asyncio.Event().wait(), deadline) for i in range(3)]
        return done, time.monotonic() - started
    done, took = asyncio.run(scenario())
    assert done == [False, False, False]
    assert took < 2.0, took


@pytest.mark.parametrize("passes", PASSES)
def test_a_long_poll_woken_just_before_its_cancellation_ends(tmp_path, passes: int) -> None:
    """A receive's long poll cancelled (the server's stop ends its calls) in the same loop
    pass as a message wakes it raises CancelledError: it does not poll on behind the stop,
    delivering messages to a caller that is gone."""
    from services.broker.bridge import StoreBridge
    from services.broker.store.db import Database

    async def scenario() -> bool:
        db = Database(str(tmp_path / f"store{passes}"), sync=False)
        try:
            bridge = StoreBridge(db, asyncio.get_running_loop(), on_fatal=lambda exc: None)
            poll = asyncio.ensure_future(bridge.wait_visible("t", bridge.version("t"), 30.0))
            await asyncio.sleep(0.01)  # it waits
            bridge.note_visible("t")
            for _ in range(passes):
                await asyncio.sleep(0)
            if poll.done():
                return True  # it returned before the cancellation: nothing to lose
            poll.cancel()
            try:
                await poll
            except asyncio.CancelledError:
                return True
            return False  # it returned as if woken: the caller polls on
        finally:
            db.close()
    assert asyncio.run(scenario()), f"a long poll woken {passes} passes before its cancellation lost it"


def test_a_brokers_stop_budget_adds_up_under_a_supervisors_15_s() -> None:
    """The stop's deadline and the exit's stall limit end a process before a supervisor's
    SIGKILL, and a broker's stop steps fit in the deadline with time left for a gRPC grace."""
    from services.broker import server as broker_server
    from services.common.runtime import EXIT_STALL_SECONDS, STOP_SECONDS, SUPERVISOR_STOP_SECONDS

    assert STOP_SECONDS + EXIT_STALL_SECONDS < SUPERVISOR_STOP_SECONDS
    steps = broker_server.STOP_STEP_SECONDS + broker_server.STOP_REPLICA_SECONDS + broker_server.STOP_HEARTBEAT_SECONDS
    assert steps + 1.0 <= STOP_SECONDS  # at least a second of grace for calls in flight
