"""The follower's backoff between failed replication sessions (services/broker/replica/following.py):
the pure pause, and a Following that starts no new session to a leader epoch that keeps
failing them before its pause is over, while a new leader is followed at once."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.broker.config import BrokerConfig
from services.broker.replica.following import RETRY_MAX_SECONDS, Following, backs_off, retry_after
from services.broker.replica.state import Leader
from services.broker.store import replog
from services.broker.transport import Refused

POLL = 0.05


def test_no_failure_retries_at_once_and_failures_double_up_to_the_cap() -> None:
    assert retry_after(0, 100.0, first=POLL) == 100.0
    middle = [retry_after(n, 100.0, first=POLL, jitter=0.5) - 100.0 for n in range(1, 12)]
    assert middle[:4] == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert middle[-1] == RETRY_MAX_SECONDS and max(middle) == RETRY_MAX_SECONDS
    assert all(a <= b for a, b in zip(middle, middle[1:]))
    assert retry_after(10**6, 0.0, first=POLL, most=3.0, jitter=0.99) == 3.0  # no overflow, capped


def test_the_jitter_spreads_a_pause_from_half_to_one_and_a_half_times_its_step() -> None:
    assert retry_after(3, 0.0, first=1.0, jitter=0.0) == pytest.approx(2.0)
    assert retry_after(3, 0.0, first=1.0, jitter=0.999) == pytest.approx(5.996)
    assert retry_after(3, 0.0, first=1.0, most=4.0, jitter=0.999) == 4.0


def test_a_leader_not_leading_its_epoch_yet_or_out_of_reach_is_no_reason_to_back_off() -> None:
    """A new leader refuses sessions until its term is open (FAILED_PRECONDITION), and a
    leader out of reach (crashed, partitioned away) answers nothing: its followers retry at
    every round, so neither a fail-over nor the rejoin after a healed partition is delayed.
    A refusal of this replica, or a stream that is not the protocol, counts."""
    assert not backs_off(Refused(grpc.StatusCode.FAILED_PRECONDITION, "replica 0 does not lead 'broker-0' in epoch 9"))
    for error in (ConnectionRefusedError(111, "refused"), ConnectionResetError(104, "reset"), TimeoutError(),
                  EOFError()):
        assert not backs_off(error), error
    for error in (Refused(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not known"),
                  Refused(grpc.StatusCode.PERMISSION_DENIED, "not a service identity"),
                  replog.FrameError("a frame of 4 GiB")):
        assert backs_off(error), error


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failing_leader_is_followed_again_only_after_its_pause_and_a_new_one_at_once() -> None:
    """A leader advertising no replication address fails every session at once (as a
    refusing one does): the election round asks to follow it every poll, and a session is
    started only once the pause is over; another leader (a new epoch) is followed at once."""
    clock = Clock()
    config = BrokerConfig(election_poll_seconds=POLL, replication_factor=3, replica_id=1)

    def no_rebuild(_leader: Leader) -> None:
        raise AssertionError("no rebuild here")
    following = Following(config, lambda: None, no_rebuild, clock=clock, jitter=lambda: 0.5)  # type: ignore[arg-type]
    refusing = Leader(0, "127.0.0.1:1", epoch=7, lease=1)

    async def rounds(leader: Leader, count: int, step: float) -> int:
        """``count`` election rounds ``step`` apart asking to follow ``leader``: sessions started."""
        started = 0
        for _ in range(count):
            before = following.failures
            await following.start(leader)
            if following.leader is not None or following.failures != before:
                started += 1
            await asyncio.sleep(0)  # the session runs (and fails)
            await asyncio.sleep(0)
            clock.now += step
        return started

    async def run() -> None:
        started = await rounds(refusing, 200, POLL)  # 10 s of rounds
        assert following.failures == started
        assert 7 <= started <= 10, started  # 0.05, 0.1, 0.2 … s apart, not 200
        assert following.waiting(refusing)
        fresh = Leader(2, "127.0.0.1:2", epoch=8, lease=2)
        assert await rounds(fresh, 1, 0.0) == 1 and following.failures == 1  # at once, counted anew
        await following.stop()

    asyncio.run(run())
