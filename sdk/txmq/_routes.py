"""The topic routes a client keeps (the SDK's clients, sync and asyncio, and the RocketMQ
proxy): each topic's queues as the name servers last gave them.

- A route is used for ``ttl`` seconds after it was fetched (at most
  ``FAULT_ROUTE_REFRESH_SECONDS`` while the fault table avoids a shard), then asked again.
- A route invalidated after an error (:meth:`RouteCache.invalidate`) is asked again at its
  next use, but kept: it may still be needed (below).
- **When no name server answers** (every one unreachable, timed out or overloaded: the
  error says nothing about the topic) **the last route stands**: sends and receives go on
  against the brokers, which need no name server, and the lookup is tried again every
  ``STALE_ROUTE_RETRY_SECONDS``. RocketMQ's clients behave the same way (a failed route
  update keeps the old one): the name servers are not on the data path, and restarting
  them all (an upgrade, a lost node in a one-name-server install) must not stop traffic.
  An error about the topic itself (not found, no leader) is the answer, as before.

Concurrent lookups of one topic share one call (threads through
:meth:`RouteCache.lookup_blocking`, coroutines through :meth:`RouteCache.lookup`): a burst
of sends (a service starting, a route gone stale under load) asks the name servers once;
callers holding a route use it meanwhile.

The entries are read and written with single-entry dict operations (atomic under the GIL);
the threads' lookups in flight are kept under a lock; the asyncio callers use one loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

from ._errors import NoLeaderError, TxmqError
from ._faults import FAULT_ROUTE_REFRESH_SECONDS, FaultTable

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: While no name server answers, how often a topic's route is asked again (its last route
#: serves meanwhile).
STALE_ROUTE_RETRY_SECONDS = 2.0


def name_servers_unreachable(error: TxmqError) -> bool:
    """Whether a failed route lookup says only that no name server answered (retryable),
    not something about the topic (NoLeaderError is retryable but is the topic's state)."""
    return error.retryable and not isinstance(error, NoLeaderError)


class _Entry(Generic[R]):
    __slots__ = ("routes", "fetched", "retry_at")

    def __init__(self, routes: R, fetched: float) -> None:
        self.routes = routes
        # When it was fetched (clock time); -inf once invalidated.
        self.fetched = fetched
        # Until when it serves without asking (no name server answered the last lookup).
        self.retry_at = 0.0


class _Flight(Generic[R]):
    """A blocking lookup in flight: the threads of the same key wait for its outcome."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: R | None = None
        self.error: BaseException | None = None

    def outcome(self) -> R:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


class RouteCache(Generic[R]):
    """Topic → its last route, with the rules above."""

    def __init__(self, faults: FaultTable, clock: Callable[[], float] = time.monotonic) -> None:
        self._faults = faults
        self._clock = clock
        self._entries: dict[str, _Entry[R]] = {}
        self._lookups: SharedLookups[Hashable, R] = SharedLookups()
        self._lock = threading.Lock()
        self._blocking: dict[Hashable, _Flight[R]] = {}

    def lookup_blocking(self, topic: str, ttl: float, fetch: Callable[[], R], *,
                        key: Hashable = None, refresh: bool = False) -> R:
        """:meth:`lookup` for threads: ``fetch`` blocks; the threads arriving while it runs
        use the current route, or wait for its outcome (its own call has a timeout)."""
        key = topic if key is None else key
        if not refresh:
            cached = self.fresh(topic, ttl)
            if cached is not None:
                return cached
        with self._lock:
            flight = self._blocking.get(key)
            running = flight is not None
            if not running:
                flight = self._blocking[key] = _Flight()
        assert flight is not None
        if running:
            current = None if refresh else self.current(topic)
            return current if current is not None else flight.outcome()
        try:
            flight.value = fetch()
        except TxmqError as err:
            stale = None if refresh else self.fallback(topic, err)
            if stale is None:
                flight.error = err
                raise
            flight.value = stale
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._blocking[key]
            flight.done.set()
        return flight.value

    async def lookup(self, topic: str, ttl: float, fetch: Callable[[], Awaitable[R]], *,
                     key: Hashable = None, refresh: bool = False) -> R:
        """The route of ``topic`` for an asyncio caller: the fresh one; else, while another
        caller's lookup (of the same ``key``, default the topic) is under way, the current
        one; else the outcome of one lookup shared by the callers of ``key`` (``fetch``
        asks the name servers and stores what they answer), or the last route when no name
        server answers. ``refresh``: ask now, and raise rather than fall back."""
        key = topic if key is None else key
        if not refresh:
            cached = self.fresh(topic, ttl)
            if cached is None and self._lookups.running(key):
                cached = self.current(topic)
            if cached is not None:
                return cached
        try:
            return await self._lookups.run(key, fetch)
        except TxmqError as err:
            stale = None if refresh else self.fallback(topic, err)
            if stale is None:
                raise
            return stale

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def fresh(self, topic: str, ttl: float) -> R | None:
        """The topic's route if it is used without asking: fetched less than ``ttl`` ago and
        not invalidated, or any while no name server answers (until the next retry)."""
        entry = self._entries.get(topic)
        if entry is None:
            return None
        now = self._clock()
        if now < entry.retry_at:
            return entry.routes
        if ttl > FAULT_ROUTE_REFRESH_SECONDS and self._faults.any_avoided():
            ttl = FAULT_ROUTE_REFRESH_SECONDS
        return entry.routes if now - entry.fetched < ttl else None

    def current(self, topic: str) -> R | None:
        """The route a caller uses while another one's lookup of the topic is under way
        (instead of waiting for it): the last one, unless it was invalidated."""
        entry = self._entries.get(topic)
        return entry.routes if entry is not None and entry.fetched > -math.inf else None

    def store(self, topic: str, routes: R, fetched: float) -> None:
        """A route a name server answered, fetched at ``fetched`` (clock time, taken
        before the lookup)."""
        self._entries[topic] = _Entry(routes, fetched)

    def forget(self, topic: str) -> None:
        """The topic has no route (not found): nothing stale may stand for it."""
        self._entries.pop(topic, None)

    def invalidate(self, topic: str) -> None:
        """Ask again at the next use (after an error); kept for a name-server outage."""
        entry = self._entries.get(topic)
        if entry is not None:
            entry.fetched = -math.inf

    def fallback(self, topic: str, error: TxmqError) -> R | None:
        """After the lookup of ``topic`` failed with ``error``: its last route when no name
        server answered (it then serves for ``STALE_ROUTE_RETRY_SECONDS`` without asking),
        else None (raise ``error``)."""
        entry = self._entries.get(topic)
        if entry is None or not name_servers_unreachable(error):
            return None
        now = self._clock()
        if now >= entry.retry_at:
            log.warning("no name server answers (%s): topic %s keeps its last route, asked again in %.0f s",
                        error, topic, STALE_ROUTE_RETRY_SECONDS)
            entry.retry_at = now + STALE_ROUTE_RETRY_SECONDS
        return entry.routes


class SharedLookups(Generic[K, T]):
    """Concurrent asyncio lookups of the same key (a topic's route) share one call: the
    first runs it, the others await its outcome, value or error. Without it a burst of
    sends on a client with no route yet (a service starting, a route gone stale under load)
    queues one name-server call per send, and on a busy machine some of them time out.
    A lookup cancelled while others wait for it hands the call to one of them."""

    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Future[T]] = {}

    def running(self, key: K) -> bool:
        """Whether a lookup of ``key`` is under way."""
        return key in self._flights

    async def run(self, key: K, fetch: Callable[[], Awaitable[T]]) -> T:
        while (flight := self._flights.get(key)) is not None:
            try:
                return await asyncio.shield(flight)
            except asyncio.CancelledError:
                if not flight.cancelled():
                    raise  # this lookup itself was cancelled
        flight = self._flights[key] = asyncio.get_running_loop().create_future()
        try:
            value = await fetch()
        except asyncio.CancelledError:
            flight.cancel()  # the waiting lookups try again themselves
            raise
        except BaseException as exc:
            flight.set_exception(exc)
            flight.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            del self._flights[key]
        flight.set_result(value)
        return value
