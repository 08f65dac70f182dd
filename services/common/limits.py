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
  ``max_*_per_connection``: RESOURCE_EXHAUSTED naming the limit (``ConnectionLimitError``).
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
from txmq.errors import ConnectionLimitError, InvalidFieldError, OverloadedError, UndecodableRequestError

from .auth.delegation import ON_BEHALF_OF_HEADER
from .config import MAX_COUNT

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


class ConnectionLimit:
    """At most ``limit`` of something (streams, long polls, pending checks) per connection
    (gRPC peer: address and port, and the principal a service acts for: ``connection_of``);
    ``hold(peer)`` and ``take(peer, n)`` refuse beyond it."""

    def __init__(self, setting: str, limit: int) -> None:
        self.setting = setting
        self.limit = limit
        self.held: dict[str, int] = {}

    def take(self, peer: str, n: int = 1) -> None:
        held = self.held.get(peer, 0)
        if held + n > self.limit:
            raise ConnectionLimitError(self.setting, self.limit, held)
        self.held[peer] = held + n

    def give_back(self, peer: str, n: int = 1) -> None:
        left = self.held.get(peer, 0) - n
        if left > 0:
            self.held[peer] = left
        else:
            self.held.pop(peer, None)

    def available(self, peer: str) -> int:
        return max(self.limit - self.held.get(peer, 0), 0)

    @contextlib.contextmanager
    def hold(self, peer: str) -> Iterator[None]:
        self.take(peer)
        try:
            yield
        finally:
            self.give_back(peer)
