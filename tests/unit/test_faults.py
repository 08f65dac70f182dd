"""The routing fault table (txmq.faults), with a controllable clock: which shards new sends
avoid, for how long, the single probe, and the one classification of failures; the topic
routes clients keep (the last one stands while no name server answers); and the shared
route lookups of the asyncio clients."""

from __future__ import annotations

import asyncio

import pytest

from txmq.errors import (BrokerNotFoundError, DeadlineExceededError, InvalidFieldError, LeadershipLostError,
                         NoLeaderError, NotEnoughReplicasError, NotLeaderError, TopicNotFoundError,
                         TransactionStateError, UnavailableError)
from txmq.faults import Abandoned, FaultTable, RetryAction, retry_action
from txmq.routes import STALE_ROUTE_RETRY_SECONDS, RouteCache, SharedLookups


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock: Clock) -> FaultTable:
    return FaultTable(base_avoid_seconds=0.25, max_avoid_seconds=2.0, clock=clock)


QUEUES = ["a0", "a1", "b0", "b1"]


def shard(queue: str) -> str:
    return queue[0]


def chosen(table: FaultTable, starts: range = range(4)) -> list[str]:
    return [table.choose(QUEUES, shard, start) for start in starts]


def test_a_failing_shard_is_skipped_round_robin_goes_on_over_the_others(table: FaultTable) -> None:
    assert chosen(table) == QUEUES
    assert table.failed("b") == 0.25
    assert chosen(table) == ["a0", "a1", "a0", "a0"]
    assert table.stats().avoided == ("b",)


def test_the_interval_doubles_with_each_failure_in_a_row_up_to_the_cap(table: FaultTable) -> None:
    assert [table.failed("b") for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    table.succeeded("b", 0.002)
    assert table.failed("b") == 0.25  # a success starts over


def test_one_probe_once_the_interval_is_over_then_traffic_again_if_it_answers(table: FaultTable,
                                                                             clock: Clock) -> None:
    table.failed("b")
    clock.now += 0.3
    assert table.choose(QUEUES, shard, 2) == "b0"  # the probe
    assert chosen(table) == ["a0", "a1", "a0", "a0"]  # the others wait for its answer
    table.succeeded("b", 0.001)
    assert chosen(table) == QUEUES
    assert table.stats().avoided == ()


def test_a_failed_probe_doubles_the_interval(table: FaultTable, clock: Clock) -> None:
    table.failed("b")
    clock.now += 0.3
    assert table.choose(QUEUES, shard, 2) == "b0"
    assert table.failed("b") == 0.5
    clock.now += 0.3
    assert chosen(table) == ["a0", "a1", "a0", "a0"]
    clock.now += 0.3
    assert table.choose(QUEUES, shard, 3) == "b1"


def test_a_probe_that_never_answers_is_replaced_after_the_longest_interval(table: FaultTable,
                                                                          clock: Clock) -> None:
    table.failed("b")
    clock.now += 0.3
    assert table.choose(QUEUES, shard, 2) == "b0"
    clock.now += 2.1
    assert table.choose(QUEUES, shard, 2) == "b0"


def test_with_every_shard_avoided_the_one_back_soonest_is_used(table: FaultTable) -> None:
    table.failed("a")
    table.failed("a")
    table.failed("b")
    assert chosen(table) == ["b0", "b0", "b0", "b1"]


def test_excluded_shards_are_last_resorts(table: FaultTable) -> None:
    assert table.choose(QUEUES, shard, 0, exclude={"a"}) == "b0"
    table.failed("b")
    assert table.choose(QUEUES, shard, 0, exclude={"a"}) == "b0"  # nothing else: avoided, not refused
    with pytest.raises(ValueError):
        table.choose([], shard)


def test_stats_count_reroutes_failures_and_send_latency(table: FaultTable) -> None:
    table.succeeded("a", 0.010)
    table.succeeded("a", 0.020)
    table.succeeded("a")  # an answer without a latency sample (EndTransaction, a refusal)
    table.failed("b")
    table.rerouted()
    stats = table.stats()
    assert stats.rerouted == 1 and stats.avoided == ("b",)
    a, b = stats.shards
    assert (a.shard, a.successes, a.failures, a.avoided) == ("a", 2, 0, False)
    assert a.latency_seconds_sum == pytest.approx(0.030)
    assert 0.010 < a.latency_seconds < 0.020
    assert (b.shard, b.consecutive_failures, b.failures, b.avoided) == ("b", 1, 1, True)


def test_retry_action_is_the_one_classification() -> None:
    assert retry_action(UnavailableError("down"), bound=False) is RetryAction.ELSEWHERE
    assert retry_action(DeadlineExceededError("late"), bound=False) is RetryAction.ELSEWHERE
    assert retry_action(UnavailableError("down"), bound=True) is RetryAction.SAME_SHARD
    assert retry_action(BrokerNotFoundError("b"), bound=True) is RetryAction.SAME_SHARD
    assert retry_action(BrokerNotFoundError("b"), bound=False) is RetryAction.FAIL
    assert retry_action(InvalidFieldError("f", "bad"), bound=False) is RetryAction.FAIL
    assert retry_action(TransactionStateError("t", "COMMITTED", "ROLLBACK"), bound=True) is RetryAction.FAIL
    # Replicated shards: a follower asked, or the outcome unknown, stay on the shard with
    # the same ids; a refusal that applied nothing may go elsewhere.
    assert retry_action(NotLeaderError("b", 1, "h:1", 0), bound=False) is RetryAction.SAME_SHARD
    assert retry_action(LeadershipLostError("b", 0), bound=False) is RetryAction.SAME_SHARD
    assert retry_action(NotEnoughReplicasError("b", 1, 2), bound=False) is RetryAction.ELSEWHERE
    assert retry_action(NotEnoughReplicasError("b", 1, 2), bound=True) is RetryAction.SAME_SHARD


def test_abandoned_attempts_are_kept_for_a_while_and_bounded(clock: Clock) -> None:
    abandoned: Abandoned[str] = Abandoned(keep_seconds=10.0, most=3, clock=clock)
    for key in ("m1", "m2", "m3", "m4"):
        abandoned.add(key)
    assert "m1" not in abandoned and {"m2", "m3", "m4"} == {k for k in ("m2", "m3", "m4") if k in abandoned}
    abandoned.discard("m2")
    assert "m2" not in abandoned and len(abandoned) == 2
    clock.now += 11.0
    abandoned.add("m5")
    assert len(abandoned) == 1 and "m5" in abandoned


class Lookup:
    """A name server's QueryRoute held open until ``answer`` is set: counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.answer: asyncio.Future[object] | None = None

    async def __call__(self) -> object:
        self.calls += 1
        self.answer = asyncio.get_running_loop().create_future()
        return await self.answer


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_concurrent_lookups_of_a_key_share_one_call_and_its_value() -> None:
    async def scenario() -> None:
        lookups, fetch = SharedLookups[str, object](), Lookup()
        other = Lookup()
        waiting = [asyncio.ensure_future(lookups.run("orders", fetch)) for _ in range(50)]
        elsewhere = asyncio.ensure_future(lookups.run("payments", other))
        await _settle()
        assert fetch.calls == 1 and other.calls == 1  # one call per key
        assert fetch.answer is not None and other.answer is not None
        fetch.answer.set_result(("route",))
        other.answer.set_result(("other",))
        assert await asyncio.gather(*waiting) == [("route",)] * 50
        assert await elsewhere == ("other",)
        # Done: the next lookup asks again (caching is the caller's business).
        again = asyncio.ensure_future(lookups.run("orders", fetch))
        await _settle()
        assert fetch.calls == 2
        fetch.answer.set_result(("new",))
        assert await again == ("new",)
    asyncio.run(scenario())


def test_a_failed_lookup_fails_every_lookup_waiting_for_it() -> None:
    async def scenario() -> None:
        lookups, fetch = SharedLookups[str, object](), Lookup()
        waiting = [asyncio.ensure_future(lookups.run("orders", fetch)) for _ in range(5)]
        await _settle()
        assert fetch.answer is not None
        fetch.answer.set_exception(DeadlineExceededError("no answer"))
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        assert fetch.calls == 1 and all(isinstance(o, DeadlineExceededError) for o in outcomes), outcomes
    asyncio.run(scenario())


def test_a_cancelled_lookup_hands_the_call_to_one_waiting_for_it() -> None:
    """The caller whose lookup runs the call is cancelled (its client went away): those
    waiting for it are not; one of them calls again and the others share that call."""
    async def scenario() -> None:
        lookups, fetch = SharedLookups[str, object](), Lookup()
        first = asyncio.ensure_future(lookups.run("orders", fetch))
        await _settle()
        waiting = [asyncio.ensure_future(lookups.run("orders", fetch)) for _ in range(3)]
        await _settle()
        first.cancel()
        await _settle()
        assert first.cancelled() and not any(w.done() for w in waiting)
        assert fetch.calls == 2
        assert fetch.answer is not None
        fetch.answer.set_result(("route",))
        assert await asyncio.gather(*waiting) == [("route",)] * 3
        # A waiting lookup cancelled leaves the call and the others alone.
        runner = asyncio.ensure_future(lookups.run("orders", fetch))
        await _settle()
        quitter = asyncio.ensure_future(lookups.run("orders", fetch))
        await _settle()
        quitter.cancel()
        await _settle()
        fetch.answer.set_result(("later",))
        assert await runner == ("later",) and quitter.cancelled() and fetch.calls == 3
    asyncio.run(scenario())


@pytest.fixture
def routes(clock: Clock, table: FaultTable) -> RouteCache[str]:
    return RouteCache(table, clock=clock)


def test_a_route_serves_for_its_ttl_and_sooner_asked_again_while_a_shard_is_avoided(
        routes: RouteCache[str], clock: Clock, table: FaultTable) -> None:
    assert routes.fresh("orders", 30.0) is None
    routes.store("orders", "r1", clock.now)
    clock.now += 29.0
    assert routes.fresh("orders", 30.0) == "r1"
    table.failed("broker-1")  # a shard avoided: routes are asked again each second at least
    assert routes.fresh("orders", 30.0) is None
    clock.now += 2.0
    assert routes.fresh("orders", 30.0) is None and routes.current("orders") == "r1"


def test_an_invalidated_route_is_asked_again_but_not_served_meanwhile(routes: RouteCache[str], clock: Clock) -> None:
    routes.store("orders", "r1", clock.now)
    routes.invalidate("orders")
    assert routes.fresh("orders", 30.0) is None
    assert routes.current("orders") is None  # a caller waits for the lookup under way
    routes.invalidate("unknown")  # nothing to mark
    assert routes.current("unknown") is None


@pytest.mark.parametrize("error", [UnavailableError("connection refused"), DeadlineExceededError("no answer")])
def test_while_no_name_server_answers_the_last_route_stands_and_is_asked_again_later(
        routes: RouteCache[str], clock: Clock, error: Exception) -> None:
    routes.store("orders", "r1", clock.now)
    routes.invalidate("orders")  # even one a broker's error made suspect: it is all there is
    clock.now += 60.0
    assert routes.fallback("orders", error) == "r1"
    # Served without asking until the retry is due ...
    clock.now += STALE_ROUTE_RETRY_SECONDS - 0.1
    assert routes.fresh("orders", 30.0) == "r1"
    clock.now += 0.2
    assert routes.fresh("orders", 30.0) is None
    # ... and again after the next failed lookup; a lookup answered replaces it.
    assert routes.fallback("orders", error) == "r1"
    routes.store("orders", "r2", clock.now)
    assert routes.fresh("orders", 30.0) == "r2"


@pytest.mark.parametrize("error", [NoLeaderError("orders", ["broker-0"]), TopicNotFoundError("orders"),
                                   InvalidFieldError("topic", "bad")])
def test_an_answer_about_the_topic_is_never_covered_by_the_last_route(routes: RouteCache[str], clock: Clock,
                                                                      error: Exception) -> None:
    routes.store("orders", "r1", clock.now)
    assert routes.fallback("orders", error) is None
    assert routes.fallback("payments", UnavailableError("down")) is None  # never had a route
    routes.forget("orders")  # not found: nothing stale stands for it
    assert routes.fallback("orders", UnavailableError("down")) is None and len(routes) == 0
