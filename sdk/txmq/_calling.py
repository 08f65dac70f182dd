"""What the sync client (``_client``) and the asyncio client (``aio/_client``) decide alike,
without I/O: the values and limits they share, the name servers' failover, the calls bound
to a shard and the brokers' addresses, in the manner of ``_sending`` (a call is a
generator of steps the client performs, blocking or awaiting, and sends the result back)::

    NameServers.steps(method, request)  yields NameServerCall(address, method, request)
    bound_steps(faults, shard)           yields BrokerAddress(shard, refresh), BoundCall(address), Wait

(``_sending.run`` and ``run_async`` drive them.)
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any, Generator, Iterable, Sequence

from ._errors import BrokerNotFoundError, ClientClosedError, InvalidFieldError, TxmqError
from ._faults import FaultTable, OverloadBackoff, RetryAction, retry_action

#: gRPC message size limit both ways; above the brokers' largest body (4 MiB by default).
MAX_GRPC_MESSAGE_BYTES = 16 * 1024 * 1024

#: Most entries a native request's list of ids or entries may carry: the receipt handles of an
#: AckMessages (and those a ReceiveMessages carries), the entries of one Produce stream message.
#: Services refuse more (INVALID_ARGUMENT naming the field) before reading any, since the auth
#: interceptor resolves every id a request carries; the SDK splits its own lists to fit.
MAX_ENTRIES_PER_REQUEST = 1024

#: How long one connection attempt may take (see CHANNEL_OPTIONS).
CONNECT_TIMEOUT_MS = 2_000

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    # Reconnect within about a second of a peer coming back (gRPC's default backoff grows
    # to 120 s, which would turn a broker restart or a failover into minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # gRPC's *minimum connect timeout*, despite its name: how long one connection attempt
    # may take up to the peer's HTTP/2 SETTINGS frame. At 100 ms a loaded machine failed
    # calls ("timed out before receiving SETTINGS frame": at a load of 22 on 2 cores, 2 % of
    # fresh connects took longer, the slowest 0.31 s); a dead peer still refuses at once,
    # and a blackholed one fails a call within this, under the SDK's 3 s send timeout.
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
)

#: Attempts of a call bound to its shard (:func:`bound_steps`), the first retry after
#: BOUND_BACKOFF_SECONDS, doubling.
BOUND_ATTEMPTS = 3
BOUND_BACKOFF_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class QueueRoute:
    """One queue of a topic: the broker holding it and its id there."""

    broker_name: str
    broker_address: str
    queue_id: int
    #: The broker is draining: consumers still read the queue, new sends go elsewhere.
    draining: bool = False


def parse_nameservers(nameservers: str | Sequence[str]) -> tuple[str, ...]:
    """``"h1:9876,h2:9876"`` or ``["h1:9876", "h2:9876"]`` → a tuple of addresses."""
    if isinstance(nameservers, str):
        items = nameservers.replace(";", ",").split(",")
    else:
        items = list(nameservers)
    addresses = tuple(a.strip() for a in items if isinstance(a, str) and a.strip())
    if not addresses:
        raise InvalidFieldError("nameservers", "at least one host:port is required")
    return addresses


def positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not value > 0:
        raise InvalidFieldError(name, f"must be a positive number, got {value!r}")
    return float(value)


def routes_of(response: Any) -> tuple[QueueRoute, ...]:
    """A QueryRoute answer's queues."""
    return tuple(QueueRoute(q.broker_name, q.broker_address, q.queue_id, q.draining) for q in response.queues)


# --- steps --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NameServerCall:
    """Perform: ``method`` (a NameServerService method's name) with ``request`` on the name
    server at ``address``."""
    address: str
    method: str
    request: Any


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """Perform: the address of broker ``shard`` (asked of a name server again when
    ``refresh``)."""
    shard: str
    refresh: bool


@dataclass(frozen=True, slots=True)
class Wait:
    """Perform: wait ``seconds``."""
    seconds: float


@dataclass(frozen=True, slots=True)
class BoundCall:
    """Perform: the bound call on the broker at ``address``."""
    address: str


Steps = Generator[Any, Any, Any]


class NameServers:
    """The name server list, tried in turn from the last one that answered (a client starts
    at a random one, so clients spread over them)."""

    def __init__(self, nameservers: str | Sequence[str]) -> None:
        self.addresses = parse_nameservers(nameservers)
        self._index = random.randrange(len(self.addresses))

    def steps(self, method: str, request: Any) -> Steps:
        """One NameServerService call: transient errors move to the next name server, other
        errors are the answer; every one failing raises the last error."""
        count = len(self.addresses)
        start = self._index
        error: TxmqError | None = None
        for i in range(count):
            index = (start + i) % count
            try:
                response = yield NameServerCall(self.addresses[index], method, request)
            except TxmqError as err:
                if not err.retryable:
                    raise
                error = err
                continue
            self._index = index
            return response
        assert error is not None
        raise error


def bound_steps(faults: FaultTable, shard: str) -> Steps:
    """A unary call bound to ``shard`` by an id (an ack, an invisibility change): retried on
    that shard with backoff while it fails transiently or the name servers do not list it
    (``_faults.retry_action``), asking its address again before each retry; an overloaded
    broker (nothing applied) is asked again after its pause; recorded in the fault table."""
    attempt = 1
    overload = OverloadBackoff()
    while True:
        try:
            address = yield BrokerAddress(shard, attempt > 1)
            response = yield BoundCall(address)
        except ClientClosedError:
            raise
        except TxmqError as err:
            pause = overload.delay(err)
            if pause is not None:  # nothing applied: the same request again, later
                yield Wait(pause)
                continue
            if err.retryable:
                faults.failed(shard)
            if retry_action(err, bound=True) is RetryAction.FAIL or attempt >= BOUND_ATTEMPTS:
                raise
            yield Wait(BOUND_BACKOFF_SECONDS * 2 ** (attempt - 1))
            attempt += 1
            continue
        faults.succeeded(shard)
        return response


class BrokerAddresses:
    """Broker name → address, learnt from routes and from ListBrokers. Thread-safe."""

    def __init__(self) -> None:
        self._addresses: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, broker_name: str) -> str | None:
        return self._addresses.get(broker_name)

    def learn(self, routes: Iterable[QueueRoute]) -> None:
        with self._lock:
            for r in routes:
                self._addresses[r.broker_name] = r.broker_address

    def listed(self, response: Any, broker_name: str) -> str:
        """A ListBrokers answer: every broker's address learnt; ``broker_name``'s returned,
        or BrokerNotFoundError when it is not listed (and forgotten)."""
        live: dict[str, str] = {broker.name: broker.address for broker in response.brokers}
        with self._lock:
            self._addresses.update(live)
            if broker_name not in live:
                self._addresses.pop(broker_name, None)
        if broker_name not in live:
            raise BrokerNotFoundError(broker_name)
        return live[broker_name]
