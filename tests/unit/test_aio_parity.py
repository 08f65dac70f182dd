"""Every sync class of the SDK against its asyncio twin: the same public methods, each with
the same keyword options (names, kinds, defaults, types — a type read with the sync names
mapped to their asyncio twins), the constructors too. A difference fails the test unless
it is listed in ``DIFFERENCES`` with its reason; a listed difference that went away fails
it too, so the list stays true."""

from __future__ import annotations

import inspect
import re

import pytest
import txmq
import txmq.aio
import txmq.anchored
from txmq.aio._anchored import AsyncAnchoredTransaction  # returned by AsyncTransactionProducer.transaction()

PAIRS = [
    (txmq.Producer, txmq.aio.AsyncProducer),
    (txmq.TransactionProducer, txmq.aio.AsyncTransactionProducer),
    (txmq.Transaction, txmq.aio.AsyncTransaction),
    (txmq.TransactionListener, txmq.aio.AsyncTransactionListener),
    (txmq.SimpleConsumer, txmq.aio.AsyncSimpleConsumer),
    (txmq.PushConsumer, txmq.aio.AsyncPushConsumer),
    (txmq.Admin, txmq.aio.AsyncAdmin),
    (txmq.anchored.AnchoredTransaction, AsyncAnchoredTransaction),
]
#: Sync names as their asyncio twins name them, for reading types.
TWINS = {s.__name__: a.__name__ for s, a in PAIRS} | {"AnchoredResult": "AsyncAnchoredResult"}
#: Library types of the same meaning in the two flavours.
SAME_TYPES = {"Iterator": "AsyncIterator", "grpc.Channel": "grpc.aio.Channel", "Future": "asyncio.Task"}
#: Protocol methods and their asyncio counterparts.
DUNDERS = {"__enter__": "__aenter__", "__exit__": "__aexit__", "__iter__": "__aiter__"}

#: (class, member, what) → why the flavours differ there. ``what`` is "method" (only one
#: flavour has it) or the option's name.
DIFFERENCES = {
    ("Producer", "__init__", "linger_seconds"):
        "the sync Produce stream lingers for the threads an answer woke; the asyncio stream batches "
        "what the event loop queued in one turn, with nothing to wait for",
    ("TransactionProducer", "__init__", "linger_seconds"): "as Producer's",
    ("TransactionProducer", "__init__", "check_threads"):
        "threads vs coroutines: the asyncio producer's check_concurrency (default 16, cheap coroutines) "
        "bounds the checks it runs at once",
    ("TransactionProducer", "__init__", "check_concurrency"): "check_threads' twin",
    ("TransactionProducer", "__init__", "checker"):
        "the asyncio checker may be a coroutine function (or a plain one, run on the loop)",
    ("PushConsumer", "__init__", "consume_threads"):
        "threads vs coroutines: consume_concurrency bounds the listeners running at once",
    ("PushConsumer", "__init__", "consume_concurrency"): "consume_threads' twin",
    ("PushConsumer", "__init__", "listener"): "the asyncio listener may be a coroutine function",
    ("AsyncProducer", "stream_stats", "method"):
        "the asyncio Produce stream's batching counters (the sync stream's are its own object's)",
    ("AsyncTransactionProducer", "stream_stats", "method"): "as AsyncProducer's",
    ("AsyncTransactionProducer", "start", "method"):
        "checks are answered from the event loop that will use the producer, so they start inside it "
        "(``async with`` calls start); the sync producer starts its threads when it is made",
}


def _members(cls: type) -> dict[str, object]:
    out = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") and name not in (*DUNDERS, *DUNDERS.values(), "__init__"):
            continue
        if callable(member) or isinstance(inspect.getattr_static(cls, name), property):
            out[name] = member
    return out


def _type(annotation: object) -> str:
    """An annotation as text, sync names read as their asyncio twins, ``Awaitable[...]`` and
    the quotes of forward references dropped."""
    if annotation is inspect.Parameter.empty:
        return ""
    text = str(annotation).replace('"', "").replace("'", "")
    for sync, aio in TWINS.items():
        text = re.sub(rf"\b{sync}\b", aio, text)
    for sync, aio in SAME_TYPES.items():
        text = re.sub(rf"(?<![.\w]){re.escape(sync)}\b", aio, text)
    return text


def differences(sync: type, aio: type) -> dict[tuple[str, str, str], str]:
    found: dict[tuple[str, str, str], str] = {}
    ours, theirs = _members(sync), _members(aio)
    names = {DUNDERS.get(n, n) for n in ours}
    for name in sorted(names ^ set(theirs)):
        owner = sync.__name__ if name in ours or name in DUNDERS else aio.__name__
        found[(owner, name, "method")] = "only in one flavour"
    for name in sorted(set(ours)):
        twin = DUNDERS.get(name, name)
        if twin not in theirs or name in DUNDERS:
            continue
        a, b = ours[name], theirs[twin]
        if isinstance(inspect.getattr_static(sync, name), property):
            continue
        sa, sb = inspect.signature(a), inspect.signature(b)  # type: ignore[arg-type]
        pa, pb = dict(sa.parameters), dict(sb.parameters)
        for option in sorted(set(pa) | set(pb)):
            if option not in pa or option not in pb:
                found[(sync.__name__, name, option)] = "only in one flavour"
                continue
            x, y = pa[option], pb[option]
            if (x.kind, x.default) != (y.kind, y.default) or _type(x.annotation) != _type(y.annotation):
                found[(sync.__name__, name, option)] = (
                    f"{x.kind.name} {x.default!r} {_type(x.annotation)} vs {y.kind.name} {y.default!r} "
                    f"{_type(y.annotation)}")
        if name != "__init__" and _type(sa.return_annotation) != _type(sb.return_annotation):
            found[(sync.__name__, name, "return")] = f"{_type(sa.return_annotation)} vs {_type(sb.return_annotation)}"
    return found


@pytest.mark.parametrize("sync, aio", PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_the_asyncio_twin_has_the_same_methods_and_options(sync, aio):
    found = differences(sync, aio)
    listed = {k for k in DIFFERENCES if k[0] in (sync.__name__, aio.__name__)}
    unexplained = {k: v for k, v in found.items() if k not in DIFFERENCES}
    assert unexplained == {}
    assert listed <= set(found), f"listed but no longer different: {listed - set(found)}"


@pytest.mark.parametrize("sync, aio", PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_every_asyncio_method_of_io_is_a_coroutine(sync, aio):
    """What waits on the network is awaited: a sync method doing I/O has a coroutine twin
    (an anchored transaction's ``send`` returns at once in both flavours: the half message
    goes in the background, a Future or a Task)."""
    for name in _members(sync):
        twin = getattr(aio, DUNDERS.get(name, name), None)
        if twin is None or name in ("__init__", "in_scope", "routing_stats", "connected_checkers", "ack_later",
                                    "begin_transaction", "transaction", "channel_to", "messages", "__iter__") \
                or (sync, name) == (txmq.anchored.AnchoredTransaction, "send") \
                or isinstance(inspect.getattr_static(sync, name), property):
            continue
        assert inspect.iscoroutinefunction(twin), f"{aio.__name__}.{twin.__name__} is not a coroutine function"


def test_the_comparison_catches_a_difference():
    class Sync:
        def send(self, message: str, *, timeout_seconds: float = 1.0) -> int: ...

        def close(self) -> None: ...

    class Async:
        async def send(self, message: str, *, timeout_seconds: float = 2.0) -> int: ...

    found = differences(Sync, Async)
    assert set(found) == {("Sync", "send", "timeout_seconds"), ("Sync", "close", "method")}
