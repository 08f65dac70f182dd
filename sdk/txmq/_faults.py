"""Routing around a failing shard: the fault table every client keeps (RocketMQ's
``sendLatencyFaultEnable``, Kafka's "send only to partitions with a live leader").

One implementation, used by the SDK's producers and consumers, the RocketMQ proxy's routing
for the official clients and the Spark sink. Per shard (a broker name, the name inside
every id) it keeps the recent failures and the send latency:

- a shard whose call failed with a retryable error (:func:`retry_action` says
  ``ELSEWHERE``) is **avoided** for new sends for an interval that doubles with each failure
  in a row (``base_avoid_seconds`` … ``max_avoid_seconds``);
- once the interval is over, **one** send is let through as a probe while the others still
  avoid it; the probe's success clears the shard's record, its failure doubles the interval;
- when every candidate is avoided, the one whose interval ends first is used anyway: a
  send is never refused because every shard had failed once; but a send that failed moves
  only to a usable shard (:meth:`FaultTable.choose_usable`), else it stays on its own and
  waits for it there.

What an id binds to a shard (EndTransaction, check answers, acks, receipt handles) never
consults the table: it is retried on its shard (:func:`retry_action` says ``SAME_SHARD``).

Thread-safe; the asyncio proxy calls it from its loop (no await inside).
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Sequence, TypeVar

from ._errors import BrokerNotFoundError, LeadershipLostError, NotLeaderError, OverloadedError, TxmqError

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: First avoidance of a shard after a failure; doubled at each failure in a row ...
BASE_AVOID_SECONDS = 0.25
#: ... up to this. A shard that comes back takes traffic again at most this long (plus a
#: route refresh) after it does.
MAX_AVOID_SECONDS = 2.0
#: While a shard is avoided, cached routes are asked again this often at least, so a broker
#: the name servers dropped or list again is followed within about a second.
FAULT_ROUTE_REFRESH_SECONDS = 1.0
#: Weight of the newest sample in a shard's latency average.
LATENCY_EWMA_WEIGHT = 0.2
#: Half messages given up on after a failed attempt are remembered this long, at most this
#: many (newest kept): a check about one of them is answered ROLLBACK by the client.
ABANDONED_KEEP_SECONDS = 24 * 3600.0
ABANDONED_MAX = 100_000


class RetryAction(enum.Enum):
    """What to do with a request that failed."""

    #: Nothing a retry can change (bad input, a refusal): the error is the answer.
    FAIL = "fail"
    #: Transient, and nothing was acknowledged: a new send may go to another shard (with new
    #: ids) and this shard is avoided for a while.
    ELSEWHERE = "elsewhere"
    #: Transient, but the request must stay on its shard (same ids): refresh the route and
    #: retry there with backoff. (Where a "not leader" refusal naming the leader will go.)
    SAME_SHARD = "same_shard"


#: Refusals by an overloaded server (``OverloadedError``: nothing applied) one request
#: retries, with :func:`overload_backoff_seconds` before each; they do not count against the
#: caller's attempts.
OVERLOAD_RETRIES = 12


def overload_backoff_seconds(retry: int) -> float:
    """The pause before the ``retry``-th retry of a request an overloaded server refused:
    50 ms doubling up to 2 s, with jitter (0.5-1.5x) so a refused burst comes back spread."""
    pause: float = min(0.05 * 2 ** (retry - 1), 2.0) * (0.5 + random.random())
    return pause


class OverloadBackoff:
    """One request's OVERLOADED refusals: ``delay(error)`` is the pause before sending it
    again, or None when ``error`` is not such a refusal or :data:`OVERLOAD_RETRIES` are spent."""

    __slots__ = ("retries",)

    def __init__(self) -> None:
        self.retries = 0

    def delay(self, error: TxmqError) -> float | None:
        if not isinstance(error, OverloadedError) or self.retries >= OVERLOAD_RETRIES:
            return None
        self.retries += 1
        return overload_backoff_seconds(self.retries)


def retry_action(error: TxmqError, *, bound: bool) -> RetryAction:
    """The one classification of failures for every client: ``bound`` requests (an id names
    their shard: EndTransaction, answers, acks, receipt handles; or a send that must keep its
    message id) retry on their shard; unbound sends go elsewhere. For a bound request a
    shard the name servers no longer list is down, not gone: it is retried too.

    A replicated shard's NOT_LEADER (a follower was asked) and LEADERSHIP_LOST (the outcome
    is unknown: only the same id on the same shard is safe) are SAME_SHARD whether bound or
    not: the request keeps its ids (so does an OVERLOADED refusal: the shard is up, only busy;
    callers retry it after :func:`overload_backoff_seconds` without spending an attempt), and the callers (``Producer._send_new``,
    ``Client.call_bound``, the proxy's ``Relay``) ask the route again before retrying."""
    if isinstance(error, (NotLeaderError, LeadershipLostError, OverloadedError)):
        return RetryAction.SAME_SHARD
    if bound and isinstance(error, BrokerNotFoundError):
        return RetryAction.SAME_SHARD
    if not error.retryable:
        return RetryAction.FAIL
    return RetryAction.SAME_SHARD if bound else RetryAction.ELSEWHERE


@dataclass(frozen=True, slots=True)
class ShardStats:
    """One shard as a client sees it."""

    shard: str
    #: Whether new sends avoid it now.
    avoided: bool
    #: Failures in a row (0 once a call succeeded).
    consecutive_failures: int
    #: Sends answered (those whose latency is recorded) and calls failed, since the client
    #: started.
    successes: int
    failures: int
    #: Average send latency (exponentially weighted), seconds; 0 before the first success.
    latency_seconds: float
    #: Sum of the latencies of the successful calls, seconds (with ``successes``: the mean).
    latency_seconds_sum: float


@dataclass(frozen=True, slots=True)
class RoutingStats:
    """A client's routing counters (``Producer.routing_stats()``)."""

    #: Sends that failed on one shard and were sent again to another.
    rerouted: int
    #: Shards new sends avoid now, by name.
    avoided: tuple[str, ...]
    shards: tuple[ShardStats, ...]


class _Shard:
    __slots__ = ("consecutive", "avoid_until", "probe_until", "successes", "failures", "latency",
                 "latency_sum")

    def __init__(self) -> None:
        self.consecutive = 0
        self.avoid_until = 0.0
        # While a probe is in flight (until it answers, or this time passes) no other send
        # goes to the shard.
        self.probe_until = 0.0
        self.successes = 0
        self.failures = 0
        self.latency = 0.0
        self.latency_sum = 0.0


class FaultTable:
    """Per shard recent failures and latency; which shards new sends avoid."""

    def __init__(self, *, base_avoid_seconds: float = BASE_AVOID_SECONDS,
                 max_avoid_seconds: float = MAX_AVOID_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < base_avoid_seconds <= max_avoid_seconds:
            raise ValueError("need 0 < base_avoid_seconds <= max_avoid_seconds")
        self.base_avoid_seconds = base_avoid_seconds
        self.max_avoid_seconds = max_avoid_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._shards: dict[str, _Shard] = {}
        self._rerouted = 0

    # --- recording ----------------------------------------------------------------------

    def succeeded(self, shard: str, latency_seconds: float | None = None) -> None:
        """A call to ``shard`` was answered (whatever the answer's status, the shard is up);
        ``latency_seconds``: a send's, recorded in the shard's latency."""
        with self._lock:
            s = self._shards.get(shard)
            if s is None:
                s = self._shards[shard] = _Shard()
            s.consecutive = 0
            s.avoid_until = s.probe_until = 0.0
            if latency_seconds is None:
                return
            s.successes += 1
            s.latency_sum += latency_seconds
            s.latency = latency_seconds if s.successes == 1 else (
                s.latency + LATENCY_EWMA_WEIGHT * (latency_seconds - s.latency))

    def failed(self, shard: str) -> float:
        """A call to ``shard`` failed with a retryable error: new sends avoid it. Returns how
        long for."""
        with self._lock:
            s = self._shards.get(shard)
            if s is None:
                s = self._shards[shard] = _Shard()
            s.consecutive += 1
            s.failures += 1
            interval: float = min(self.base_avoid_seconds * 2 ** min(s.consecutive - 1, 30), self.max_avoid_seconds)
            s.avoid_until = self._clock() + interval
            s.probe_until = 0.0
            return interval

    def rerouted(self) -> None:
        """A send failed on one shard and goes to another."""
        with self._lock:
            self._rerouted += 1

    # --- choosing -----------------------------------------------------------------------

    def _usable_locked(self, shard: str, now: float) -> bool:
        s = self._shards.get(shard)
        if s is None or s.consecutive == 0:
            return True
        if now < s.avoid_until or now < s.probe_until:
            return False
        # The interval is over: this send is the probe; the others wait for its answer.
        s.probe_until = now + self.max_avoid_seconds
        return True

    def usable(self, shard: str) -> bool:
        """Whether a new request may go to ``shard`` now (a due probe is claimed for it)."""
        with self._lock:
            return self._usable_locked(shard, self._clock())

    def avoided(self, shard: str) -> bool:
        """Whether new sends avoid ``shard`` now (a due probe counts as avoided: read-only)."""
        with self._lock:
            s = self._shards.get(shard)
            return s is not None and s.consecutive > 0

    def choose(self, candidates: Sequence[T], shard_of: Callable[[T], str], start: int = 0,
               exclude: frozenset[str] | set[str] = frozenset()) -> T:
        """The first candidate from ``start`` on (wrapping round) whose shard is usable and
        not in ``exclude``; a shard due for a probe is claimed for this send. If none is
        usable, the candidate whose shard's avoidance ends first (outside ``exclude`` if
        possible). ``candidates`` must not be empty."""
        n = len(candidates)
        if n == 0:
            raise ValueError("no candidates")
        with self._lock:
            found = self._choose_usable_locked(candidates, shard_of, start, exclude)
            if found is not None:
                return found

            def rank(i: int) -> tuple[bool, float, int]:
                shard = shard_of(candidates[(start + i) % n])
                s = self._shards.get(shard)
                return (shard in exclude, s.avoid_until if s is not None else 0.0, i)
            return candidates[(start + min(range(n), key=rank)) % n]

    def choose_usable(self, candidates: Sequence[T], shard_of: Callable[[T], str], start: int = 0,
                      exclude: frozenset[str] | set[str] = frozenset()) -> T | None:
        """As :meth:`choose`, but None when no candidate outside ``exclude`` is usable: where
        a send that failed may move (when every shard is failing at once, moving would only
        spend its attempts on shards known to fail, without a pause)."""
        with self._lock:
            return self._choose_usable_locked(candidates, shard_of, start, exclude)

    def _choose_usable_locked(self, candidates: Sequence[T], shard_of: Callable[[T], str], start: int,
                              exclude: frozenset[str] | set[str]) -> T | None:
        now = self._clock()
        n = len(candidates)
        for i in range(n):
            candidate = candidates[(start + i) % n]
            shard = shard_of(candidate)
            if shard not in exclude and self._usable_locked(shard, now):
                return candidate
        return None

    def any_avoided(self) -> bool:
        """Whether some shard has failed and not yet succeeded since (routes are refreshed
        more often meanwhile)."""
        with self._lock:
            return any(s.consecutive > 0 for s in self._shards.values())

    # --- reading ------------------------------------------------------------------------

    def stats(self) -> RoutingStats:
        with self._lock:
            shards = tuple(
                ShardStats(shard=name, avoided=s.consecutive > 0, consecutive_failures=s.consecutive,
                           successes=s.successes, failures=s.failures, latency_seconds=s.latency,
                           latency_seconds_sum=s.latency_sum)
                for name, s in sorted(self._shards.items()))
            return RoutingStats(rerouted=self._rerouted,
                                avoided=tuple(s.shard for s in shards if s.avoided), shards=shards)


class Abandoned(Generic[K]):
    """Half message attempts a client gave up on (the send moved to another shard, or
    failed): the broker may have stored one before its answer was lost, an orphan whose
    local transaction never ran, so the client answers its check ROLLBACK. Keyed by what
    names the attempt (the SDK: the message id, which names its shard; the proxy: shard
    and the client's message id). Kept in memory only. Thread-safe."""

    def __init__(self, keep_seconds: float = ABANDONED_KEEP_SECONDS, most: int = ABANDONED_MAX,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._keep = keep_seconds
        self._most = most
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[K, float] = OrderedDict()

    def add(self, key: K) -> None:
        now = self._clock()
        with self._lock:
            self._keys[key] = now
            self._keys.move_to_end(key)
            while self._keys and (len(self._keys) > self._most
                                  or next(iter(self._keys.values())) < now - self._keep):
                self._keys.popitem(last=False)

    def discard(self, key: K) -> None:
        """The attempt turned out to be the one used (a retry with the same id succeeded)."""
        with self._lock:
            self._keys.pop(key, None)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)
