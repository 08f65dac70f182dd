"""What every service refuses before its own code runs, in one place for all of them (the
shared interceptor, ``interceptors.py``, applies it):

- a list of ids or entries longer than ``MAX_ENTRIES_PER_REQUEST`` (``ENTRY_LIMITS``):
  INVALID_ARGUMENT naming the field and the limit, before anything reads one of them;
- a request body that does not decode, or whose numbers are not numbers (NaN, ±inf) or
  durations out of range: INVALID_ARGUMENT naming the field, and one warning line per
  method at most every ``WARN_INTERVAL_SECONDS`` (a flood of garbage must not become a flood
  of log lines or tracebacks);
- more unary calls in flight than ``max_concurrent_rpcs``: shed at once with a retryable
  RESOURCE_EXHAUSTED (``OverloadedError``) instead of queueing them until gRPC's own
  pending-request cap cancels them (CANCELLED tells a client nothing about whether to retry);
- more open streams, long polls or pending checks on one connection than the service's
  ``max_*_per_connection``: RESOURCE_EXHAUSTED naming the limit (``ConnectionLimitError``);
- with auth on, more of them held by one principal over all its connections than the
  service's ``max_*_per_principal`` (``PrincipalLimitError``), and more of its unary calls in
  flight than ``max_concurrent_rpcs_per_principal``: its fair share of ``max_concurrent_rpcs``,
  refused with the same retryable OVERLOADED as a full server (``PrincipalShares``).

**Per principal.** A principal with valid credentials opens as many connections as it likes:
counted per connection alone, one tenant held 100 connections × 1,000 streams, and its slow
unary calls filled the process-wide ``max_concurrent_rpcs`` so every other tenant was shed.
So, once the auth interceptor knows whom a call is for, it is counted against that principal
too (``PrincipalShares`` for streams and unary calls, every service; ``CallerLimit`` for what
a service counts itself: long polls, pending checks). Whom: the end principal a proxy names in
``x-txmq-on-behalf-of`` (the proxy's calls for a tenant are that tenant's), the authenticated
principal otherwise; a service identity acting as itself is never counted per principal
(``principal_key``): its calls are the fleet's own work (heartbeats, registrations, claims and
reports, route lookups), which grows with the tenants it serves and not with any one of them,
and one identity is shared by every replica of a component (all proxies, all checkers), so a
cap on it would be a cap on the cluster; the per-connection limits and ``max_concurrent_rpcs``
still bound it. With auth off no principal is known (the on-behalf-of header is anyone's to
send): the per-connection limits alone apply, as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from typing import Any, Callable, Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from txmq.client import MAX_ENTRIES_PER_REQUEST
from txmq.errors import (ConnectionLimitError, InvalidFieldError, OverloadedError, PrincipalLimitError, TxmqError,
                         UndecodableRequestError)

from .auth.delegation import ON_BEHALF_OF_HEADER
from .auth.interceptor import CALLER, Caller
from .auth.store import Principal
from .config import MAX_COUNT
from .metrics import BaseMetrics

log = logging.getLogger(__name__)

#: At most one warning line per method and kind of refusal in this many seconds.
WARN_INTERVAL_SECONDS = 10.0
#: The longest duration a request may carry (366 days, as the longest setting).
MAX_REQUEST_SECONDS = 366 * 86400.0
#: google.protobuf.Duration's own range (duration.proto: ±10,000 years).
MAX_DURATION_SECONDS = 315_576_000_000
#: google.protobuf.Timestamp's own range (timestamp.proto: 0001-01-01 to 9999-12-31).
MIN_TIMESTAMP_SECONDS, MAX_TIMESTAMP_SECONDS = -62_135_596_800, 253_402_300_799


class RateLimitedWarning:
    """``warn(key, text)`` logs one WARNING line per ``key`` per ``interval_seconds``; the
    next line says how many were suppressed meanwhile."""

    def __init__(self, logger: logging.Logger, interval_seconds: float = WARN_INTERVAL_SECONDS) -> None:
        self.logger = logger
        self.interval = interval_seconds
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, key: str, text: str) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            text += f" ({suppressed} more like it in the last {self.interval:g} s not logged)"
        self.logger.warning(text)
        return True


_refusals = RateLimitedWarning(log)


# ------------------------------------------------------------------ numbers in requests
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


@functools.cache
def _numeric_plan(descriptor: Descriptor) -> tuple[tuple[str, str, bool, Descriptor | None], ...]:
    """The fields of ``descriptor`` worth visiting: (name, kind, repeated, message type) for
    floating-point fields ("float"), Durations ("duration") and messages or maps that hold
    some ("message"); everything else is skipped without being read."""
    plan: list[tuple[str, str, bool, Descriptor | None]] = []
    for field in descriptor.fields:
        repeated = field.is_repeated
        if field.type in _FLOATS:
            plan.append((field.name, "float", repeated, None))
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
            sub = field.message_type
            if sub.full_name == "google.protobuf.Duration":
                plan.append((field.name, "duration", repeated, None))
            elif sub.full_name == "google.protobuf.Timestamp":
                plan.append((field.name, "timestamp", repeated, None))
            elif sub.GetOptions().map_entry:
                value = sub.fields_by_name["value"]
                if value.type in _FLOATS or (value.type == FieldDescriptor.TYPE_MESSAGE and value.message_type is not None
                                             and _may_hold_numbers(value.message_type)):
                    plan.append((field.name, "map", True, value.message_type))
            elif _may_hold_numbers(sub):
                plan.append((field.name, "message", repeated, sub))
    return tuple(plan)


_VISITING: set[str] = set()


def _may_hold_numbers(descriptor: Descriptor) -> bool:
    if descriptor.full_name in _VISITING:  # recursive types: assume so
        return True
    _VISITING.add(descriptor.full_name)
    try:
        return bool(_numeric_plan(descriptor))
    finally:
        _VISITING.discard(descriptor.full_name)


def _check_float(path: str, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidFieldError(path, f"{value} is not a finite number")
    if path.endswith("_seconds") and not 0 <= value <= MAX_REQUEST_SECONDS:
        raise InvalidFieldError(path, f"{value} is outside 0..{MAX_REQUEST_SECONDS:g} seconds")


def _check_duration(path: str, value: Any) -> None:
    if not (-MAX_DURATION_SECONDS <= value.seconds <= MAX_DURATION_SECONDS and -999_999_999 <= value.nanos <= 999_999_999):
        raise InvalidFieldError(path, f"{value.seconds} s {value.nanos} ns is not a valid Duration")


def _check_timestamp(path: str, value: Any) -> None:
    seconds = value.seconds
    if path.endswith("delivery_timestamp") and MAX_TIMESTAMP_SECONDS < seconds <= MAX_TIMESTAMP_SECONDS * 1000:
        # The official RocketMQ Python client (5.1.x) writes a delay message's delivery time
        # in milliseconds into the seconds field; the proxy reads such a value as ms
        # (services/proxy/convert.py delivery_ms), so it is a valid time here too.
        seconds //= 1000
    if not (MIN_TIMESTAMP_SECONDS <= seconds <= MAX_TIMESTAMP_SECONDS and 0 <= value.nanos <= 999_999_999):
        raise InvalidFieldError(path, f"{value.seconds} s {value.nanos} ns is not a valid Timestamp")


_CHECK_WELL_KNOWN = {"duration": _check_duration, "timestamp": _check_timestamp}


def check_numbers(message: Any, prefix: str = "") -> None:
    """Raises ``InvalidFieldError`` naming the first floating-point field of ``message``
    (nested messages included) that is NaN or infinite, a ``*_seconds`` field outside
    0..366 days, or a Duration or Timestamp outside its range."""
    for name, kind, repeated, sub in _numeric_plan(message.DESCRIPTOR):
        path = prefix + name
        if kind == "float":
            if repeated:
                for i, v in enumerate(getattr(message, name)):
                    _check_float(f"{path}[{i}]", v)
            else:
                _check_float(path, getattr(message, name))
        elif kind == "map":
            for key, v in getattr(message, name).items():
                if sub is None:
                    _check_float(f"{path}[{key!r}]", v)
                else:
                    check_numbers(v, f"{path}[{key!r}].")
        elif repeated:
            for i, item in enumerate(getattr(message, name)):
                if kind in _CHECK_WELL_KNOWN:
                    _CHECK_WELL_KNOWN[kind](f"{path}[{i}]", item)
                else:
                    check_numbers(item, f"{path}[{i}].")
        elif message.HasField(name):
            if kind in _CHECK_WELL_KNOWN:
                _CHECK_WELL_KNOWN[kind](path, getattr(message, name))
            else:
                check_numbers(getattr(message, name), path + ".")


# ------------------------------------------------------------------ entries in requests
#: Request type → (field path, most entries) of the lists a caller fills at will whose entries
#: are each worth work before the handler runs: the auth interceptor resolves every receipt
#: handle and transaction id to its owner and decides a right per entry. Bounded only by the
#: message size, one AckMessages of 85,000 well-formed handles (4.5 MB) took a broker 3.4 s
#: and held another tenant's call as long (answering 16 MB of entries). A check stream's groups are bounded again, tighter, by
#: the checker's ``max_groups_per_stream`` (its upper bound here). Internal lists (a broker's
#: registered topics, a checker's claims) are not limited: only service identities send them.
ENTRY_LIMITS: dict[str, tuple[tuple[tuple[str, ...], int], ...]] = {
    "txmq.v1.AckMessagesRequest": ((("receipt_handles",), MAX_ENTRIES_PER_REQUEST),),
    "txmq.v1.ReceiveMessagesRequest": ((("ack_receipt_handles",), MAX_ENTRIES_PER_REQUEST),),
    "txmq.v1.ProduceRequest": ((("entries",), MAX_ENTRIES_PER_REQUEST),),
    "txmq.v1.CheckTransactionStateRequest": ((("subscribe", "producer_groups"), MAX_COUNT),),
}


def check_entries(message: Any) -> None:
    """Raises ``InvalidFieldError`` naming the first list of ``message`` (``ENTRY_LIMITS``)
    holding more entries than its limit."""
    limits = ENTRY_LIMITS.get(message.DESCRIPTOR.full_name)
    if limits is None:
        return
    for path, limit in limits:
        items = message
        for name in path:
            items = getattr(items, name)
        if len(items) > limit:
            raise InvalidFieldError(".".join(path), f"at most {limit} entries per request, got {len(items)}")


# ------------------------------------------------------------------ request bodies
class Refused:
    """What a guarded unary deserializer returns instead of raising (gRPC would answer
    UNKNOWN and log a traceback): the error to answer with."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def guard_deserializer(deserialize: Callable[[bytes], Any] | None, method: str, *,
                       streaming: bool) -> Callable[[bytes], Any] | None:
    """``deserialize`` that decodes a request and checks its lists (``check_entries``) and its
    numbers (``check_numbers``).
    A refusal is logged (rate-limited) and, for a request read from a stream, raised as the
    ``TxmqError`` (the stream ends with its status); for a unary request returned as
    :class:`Refused` (the interceptor answers it)."""
    if deserialize is None:
        return None

    def refuse(error: Exception) -> Any:
        _refusals.warn(f"{method}:{type(error).__name__}", f"{method}: request refused: {error}")
        if streaming:
            raise error
        return Refused(error)

    def guarded(data: bytes) -> Any:
        try:
            message = deserialize(data)
        except Exception as exc:  # noqa: BLE001 - any decoding failure is the client's
            return refuse(UndecodableRequestError(method, f"{type(exc).__name__}: {str(exc)[:200]}"))
        if hasattr(message, "DESCRIPTOR"):
            try:
                check_entries(message)
                check_numbers(message)
            except InvalidFieldError as exc:
                return refuse(exc)
        return message
    return guarded


# ------------------------------------------------------------------ load and connections
class Admission:
    """Counts unary calls in flight; ``admit()`` refuses one beyond ``limit``."""

    def __init__(self, limit: int, setting: str = "max_concurrent_rpcs") -> None:
        self.limit = limit
        self.setting = setting
        self.in_flight = 0
        self.shed = 0

    def enter(self) -> None:
        if self.in_flight >= self.limit:
            self.shed += 1
            raise OverloadedError(self.setting, self.limit)
        self.in_flight += 1

    def exit(self) -> None:
        self.in_flight -= 1


def connection_of(context: Any, *, verified: bool) -> str:
    """What a per-connection limit counts a call against: its connection (gRPC peer), and for
    a service's call made for an end principal (the proxy's, naming it in
    ``x-txmq-on-behalf-of``) that principal too. A proxy carries every tenant's long polls and
    check subscriptions over one connection per service: counted by the connection alone, one
    tenant filled it and the service refused every other tenant's calls through that proxy.

    ``verified``: the header is one the auth interceptor checks (auth on: it refuses the header
    from anyone but a service identity, as the call starts). With auth off anyone may send it,
    so it is not read: a client naming a new principal on every call would escape the limit."""
    peer = context.peer()
    if not verified:
        return peer
    for key, value in context.invocation_metadata() or ():
        if key == ON_BEHALF_OF_HEADER:
            return f"{peer} for {value if isinstance(value, str) else value.decode(errors='replace')}"
    return peer


#: Makes the refusal of a limit: (setting, limit, key, held) → the error.
Refusal = Callable[[str, int, str, int], TxmqError]


class KeyedLimit:
    """At most ``limit`` of something per key (a connection, a principal); ``take(key, n)``
    refuses beyond it with the error ``refusal`` makes, counted in ``refused`` (a metric's
    child: ``txmq_quota_refusals_total{setting}``), and ``hold(key)`` takes one for a block."""

    __slots__ = ("setting", "limit", "held", "_refusal", "refused")

    def __init__(self, setting: str, limit: int, refusal: Refusal, refused: Any = None) -> None:
        self.setting = setting
        self.limit = limit
        self.held: dict[str, int] = {}
        self._refusal = refusal
        self.refused = refused

    def take(self, key: str, n: int = 1) -> None:
        held = self.held.get(key, 0)
        if held + n > self.limit:
            if self.refused is not None:
                self.refused.inc()
            raise self._refusal(self.setting, self.limit, key, held)
        self.held[key] = held + n

    def give_back(self, key: str, n: int = 1) -> None:
        left = self.held.get(key, 0) - n
        if left > 0:
            self.held[key] = left
        else:
            self.held.pop(key, None)

    def available(self, key: str) -> int:
        return max(self.limit - self.held.get(key, 0), 0)

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        self.take(key)
        try:
            yield
        finally:
            self.give_back(key)


def _per_connection(setting: str, limit: int, key: str, held: int) -> TxmqError:
    return ConnectionLimitError(setting, limit, held)


def _per_principal(setting: str, limit: int, key: str, held: int) -> TxmqError:
    return PrincipalLimitError(setting, limit, key, held)


def _fair_share(setting: str, limit: int, key: str, held: int) -> TxmqError:
    return OverloadedError(setting, limit, key)


class ConnectionLimit(KeyedLimit):
    """At most ``limit`` of something (streams, long polls, pending checks) per connection
    (gRPC peer: address and port, and the principal a service acts for: ``connection_of``);
    ``hold(peer)`` and ``take(peer, n)`` refuse beyond it (``ConnectionLimitError``)."""

    __slots__ = ()

    def __init__(self, setting: str, limit: int) -> None:
        super().__init__(setting, limit, _per_connection)


class PrincipalLimit(KeyedLimit):
    """At most ``limit`` of something per principal, all its connections together (keyed by
    the principal's name: ``principal_key``); refused with ``PrincipalLimitError``, or with
    ``fair_share`` the retryable ``OverloadedError`` (unary calls in flight, which end soon)."""

    __slots__ = ()

    def __init__(self, setting: str, limit: int, refused: Any = None, *, fair_share: bool = False) -> None:
        super().__init__(setting, limit, _fair_share if fair_share else _per_principal, refused)


def principal_key(caller: Caller | None) -> str | None:
    """Whom a per-principal limit counts the call being served against: its principal (the
    end principal of a service's call made for one); None — not counted — with auth off, for
    an open method, or for a service identity acting as itself (see the module's docstring)."""
    if caller is None or caller.principal.service:
        return None
    return caller.principal.name


class CallerLimit:
    """One thing a call holds while it runs — a long poll, a check stream's pending checks —
    limited per connection (``per_connection``) and, with auth on, per principal over all its
    connections (``per_principal``; None: per connection only). ``take(context, n)`` returns
    what ``give_back`` returns; nothing is held after a refusal."""

    __slots__ = ("per_connection", "per_principal")

    def __init__(self, per_connection: ConnectionLimit, per_principal: PrincipalLimit | None = None) -> None:
        self.per_connection = per_connection
        self.per_principal = per_principal

    def take(self, context: Any, n: int = 1) -> tuple[str, str | None]:
        caller = CALLER.get()
        if caller is None:  # auth off: the connection alone, as before
            peer = context.peer()
            self.per_connection.take(peer, n)
            return peer, None
        peer = connection_of(context, verified=True)
        self.per_connection.take(peer, n)
        principal = principal_key(caller) if self.per_principal is not None else None
        if principal is not None:
            try:
                self.per_principal.take(principal, n)  # type: ignore[union-attr]  # not None: checked above
            except TxmqError:
                self.per_connection.give_back(peer, n)
                raise
        return peer, principal

    def give_back(self, held: tuple[str, str | None], n: int = 1) -> None:
        peer, principal = held
        self.per_connection.give_back(peer, n)
        if principal is not None:
            self.per_principal.give_back(principal, n)  # type: ignore[union-attr]  # taken: not None

    @contextlib.contextmanager
    def hold(self, context: Any) -> Iterator[None]:
        if CALLER.get() is None:  # auth off: the connection alone, as before (nothing more per call)
            peer = context.peer()
            self.per_connection.take(peer)
            try:
                yield
            finally:
                self.per_connection.give_back(peer)
            return
        held = self.take(context)
        try:
            yield
        finally:
            self.give_back(held)


def caller_limit(config: Any, metrics: BaseMetrics, per_connection: str, per_principal: str) -> CallerLimit:
    """The :class:`CallerLimit` of two settings of ``config``, named (``max_long_polls_per_connection``,
    ``max_long_polls_per_principal``); its refusals per principal are counted in ``metrics``."""
    return CallerLimit(ConnectionLimit(per_connection, getattr(config, per_connection)),
                       PrincipalLimit(per_principal, getattr(config, per_principal),
                                      metrics.quota_refusals((per_principal,))[per_principal]))


def quiet_method(full_method: str) -> bool:
    """Health and reflection: decoded and mapped like the rest, neither limited nor timed."""
    method = full_method.rsplit("/", 1)[-1]
    return method == "Check" or method == "Watch" or "ServerReflection" in full_method


class PrincipalShares:
    """What one principal's calls may hold of this service at once, all its connections
    together: open streams (``streams``: ``max_streams_per_principal``) and unary calls in
    flight (``unary``: ``max_concurrent_rpcs_per_principal``; ``unmetered`` methods, the long
    polls, are the service's own to count: ``CallerLimit``). The auth interceptor counts a call
    once it knows whom it is for (:meth:`admit`) and gives it back when the call ends."""

    __slots__ = ("streams", "unary", "unmetered", "_plans")

    def __init__(self, streams: PrincipalLimit, unary: PrincipalLimit, unmetered: frozenset[str] = frozenset()) -> None:
        self.streams = streams
        self.unary = unary
        self.unmetered = unmetered
        #: (full method, streaming) → the limit its calls count against (None: none).
        self._plans: dict[tuple[str, bool], PrincipalLimit | None] = {}

    def limit_for(self, full_method: str, streaming: bool) -> PrincipalLimit | None:
        """The limit a call of ``full_method`` counts against (decided once per method)."""
        key = (full_method, streaming)
        try:
            return self._plans[key]
        except KeyError:
            plan = None if quiet_method(full_method) else self.streams if streaming else (
                None if full_method.rsplit("/", 1)[-1] in self.unmetered else self.unary)
            self._plans[key] = plan
            return plan

    def admit(self, full_method: str, streaming: bool, principal: Principal) -> PrincipalLimit | None:
        """Counts a call of ``principal`` (raises the refusal); returns the limit to give it
        back to (``give_back(principal.name)``), None when it is not counted."""
        if principal.service:
            return None
        limit = self.limit_for(full_method, streaming)
        if limit is not None:
            limit.take(principal.name)
        return limit
