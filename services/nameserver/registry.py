"""The name server's state: brokers and checkers with their last heartbeat, and the topic
routes assembled from broker registrations. Pure domain code: no gRPC, no I/O; time comes
from an injectable clock (seconds since the epoch) so expiry is testable.

Expiry is lazy: every read first drops the brokers and checkers that have been silent for
their expiry time, so a dead broker leaves the routes without a background task.

Routes come from what brokers register (the topics they own and persist). When the Admin
API creates queues on a broker, :meth:`Registry.record_topic_queues` makes them visible at
once; that record survives a registration that was already in flight without the topic,
until a registration lists the queues or the broker expiry time passes.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from txmq.errors import BrokerNotFoundError, InvalidFieldError, NoBrokerError, TopicExistsError
from txmq.names import is_system_topic, validate_name

from .config import MAX_QUEUE_COUNT

Clock = Callable[[], float]

#: Broker names travel inside ids, which hold at most 255 bytes of name.
MAX_MEMBER_NAME_BYTES = 255


@dataclass(frozen=True, slots=True)
class BrokerRecord:
    name: str
    address: str
    #: topic → queue count (queues 0 .. count-1 on this broker).
    topics: Mapping[str, int]
    #: Registry clock, seconds.
    last_heartbeat: float
    #: Replicated shards: which replica, its role (ROLE_*) and the leader epoch it knows;
    #: ``replication`` is what it reports of its shard (opaque here, shown to operators).
    replica_id: int = 0
    role: int = 0
    epoch: int = 0
    replication: Any = None
    #: The shard is draining: routes mark its queues, new topics avoid it.
    draining: bool = False
    #: Its FIFO topics (among ``topics``).
    fifo_topics: frozenset[str] = frozenset()


#: BrokerInfo.role values (nameserver.proto BrokerRole).
ROLE_SINGLE = 0
ROLE_LEADER = 1
ROLE_FOLLOWER = 2


@dataclass(frozen=True, slots=True)
class CheckerRecord:
    name: str
    address: str
    last_heartbeat: float


@dataclass(frozen=True, slots=True)
class QueueRoute:
    broker_name: str
    broker_address: str
    queue_id: int
    draining: bool = False


@dataclass(frozen=True, slots=True)
class QueueShare:
    """One broker's part of a topic creation: it should hold ``queue_count`` queues of the
    topic and holds ``present`` now."""

    broker_name: str
    broker_address: str
    queue_count: int
    present: int

    @property
    def missing(self) -> bool:
        return self.present < self.queue_count


# --- validation and pure decisions ------------------------------------------------------

def validate_member_name(field: str, name: str) -> str:
    if not name:
        raise InvalidFieldError(field, "required")
    if len(name.encode()) > MAX_MEMBER_NAME_BYTES:
        raise InvalidFieldError(field, f"longer than {MAX_MEMBER_NAME_BYTES} bytes")
    if any(ch.isspace() for ch in name):
        raise InvalidFieldError(field, f"{name!r} contains whitespace")
    return name


def validate_address(field: str, address: str) -> str:
    """``host:port`` (``[v6]:port`` for IPv6 literals), port 1-65535."""
    host, sep, port = address.rpartition(":")
    if (not sep or not host or not port.isdigit() or not 0 < int(port) < 65536
            or any(ch.isspace() for ch in address)
            or host.startswith("[") != host.endswith("]")
            or (":" in host and not host.startswith("["))):
        raise InvalidFieldError(field, f"{address!r} is not host:port")
    return address


def resolve_queue_count(requested: int, default: int) -> int:
    """The total queues a CreateTopic asks for: 0 means ``default``."""
    if requested == 0:
        return default
    if not 0 < requested <= MAX_QUEUE_COUNT:
        raise InvalidFieldError("queue_count", f"must be 0 (default) or 1..{MAX_QUEUE_COUNT}, got {requested}")
    return requested


def spread_queues(queue_count: int, broker_names: Iterable[str]) -> list[tuple[str, int]]:
    """``queue_count`` queues dealt round-robin over the brokers sorted by name; brokers
    that get none are left out (8 over a, b, c → 3, 3, 2; 2 over a, b, c → a 1, b 1)."""
    names = sorted(set(broker_names))
    if not names:
        return []
    base, extra = divmod(queue_count, len(names))
    shares = [(name, base + (1 if i < extra else 0)) for i, name in enumerate(names)]
    return [(name, count) for name, count in shares if count > 0]


def should_auto_create(topic: str, *, enabled: bool) -> bool:
    """Whether QueryRoute of a topic no live broker has creates it: only user topics, and
    only when the name server is configured to."""
    return enabled and not is_system_topic(topic)


def registering(uptime_seconds: float, grace_seconds: float, heard: int, expected: int) -> bool:
    """Whether a name server ``uptime_seconds`` old, having heard from ``heard`` of the
    ``expected`` shards (0: unknown), may still hear from one holding a topic it does not
    know: until every expected shard registered, for at most ``grace_seconds``."""
    return expected > 0 and heard < expected and uptime_seconds < grace_seconds


# --- the registry -----------------------------------------------------------------------

class Registry:
    def __init__(self, *, broker_expiry_seconds: float, checker_expiry_seconds: float,
                 clock: Clock = time.time) -> None:
        self.broker_expiry_seconds = broker_expiry_seconds
        self.checker_expiry_seconds = checker_expiry_seconds
        self._clock = clock
        #: The replica serving each shard (a single broker, or its leader).
        self._brokers: dict[str, BrokerRecord] = {}
        #: Every replica of replicated shards, leaders and followers.
        self._replicas: dict[tuple[str, int], BrokerRecord] = {}
        #: Replicated shard → the topics (queue counts) its last leader held: still known
        #: while the shard is between leaders (its followers live, no leader registered).
        self._shard_topics: dict[str, Mapping[str, int]] = {}
        self._checkers: dict[str, CheckerRecord] = {}
        # (broker, topic) → (queue count created through the Admin API, when).
        self._created: dict[tuple[str, str], tuple[int, float]] = {}
        # (broker, topic) created as FIFO through the Admin API (kept through a registration
        # that was in flight without it, like ``_created``).
        self._created_fifo: set[tuple[str, str]] = set()

    def now(self) -> float:
        return self._clock()

    # brokers

    def register_broker(self, name: str, address: str,
                        topics: Iterable[tuple[str, int]] = (), *, replica_id: int = 0, role: int = ROLE_SINGLE,
                        epoch: int = 0, replication: Any = None, draining: bool = False,
                        fifo_topics: Iterable[str] = ()) -> BrokerRecord:
        """Registers or refreshes a broker (its heartbeat) with the topics it holds now. A
        replica of a replicated shard serves the shard while it is the leader with the
        highest epoch registered; a follower is listed but never routed to."""
        validate_member_name("broker.name", name)
        if role not in (ROLE_SINGLE, ROLE_LEADER, ROLE_FOLLOWER):
            raise InvalidFieldError("broker.role", f"unknown role {role}")
        if role == ROLE_SINGLE and replica_id:
            raise InvalidFieldError("broker.replica_id", "set only with a role (replicated shards)")
        validate_address("broker.address", address)
        held: dict[str, int] = {}
        for topic, count in topics:
            validate_name("broker.topics.topic", topic)
            if topic in held:
                raise InvalidFieldError("broker.topics", f"topic {topic!r} listed twice")
            if not 0 <= count <= MAX_QUEUE_COUNT:
                raise InvalidFieldError("broker.topics.queue_count",
                                        f"topic {topic!r}: must be 0..{MAX_QUEUE_COUNT}, got {count}")
            if count > 0:
                held[topic] = count
        now = self.now()
        for (broker, topic), (count, created_at) in list(self._created.items()):
            if broker != name:
                continue
            if held.get(topic, 0) >= count or now - created_at >= self.broker_expiry_seconds:
                del self._created[(broker, topic)]
            else:
                held[topic] = count
        reported = {t for t in fifo_topics if t in held}
        self._created_fifo -= {(name, t) for t in reported}
        fifo = frozenset(reported | {t for b, t in self._created_fifo if b == name and t in held})
        record = BrokerRecord(name, address, held, now, replica_id, role, epoch, replication, draining, fifo)
        if role == ROLE_SINGLE:
            self._brokers[name] = record
            return record
        self._replicas[(name, replica_id)] = record
        serving = self._brokers.get(name)
        if role == ROLE_LEADER:
            if serving is None or serving.replica_id == replica_id or serving.epoch <= epoch:
                self._brokers[name] = record
                self._shard_topics[name] = held
        elif serving is not None and serving.replica_id == replica_id:
            del self._brokers[name]  # it stepped down: serve a leader still registered, if any
            self._promote(name)
        return record

    def _promote(self, name: str) -> None:
        leaders = [r for (n, _i), r in self._replicas.items() if n == name and r.role == ROLE_LEADER]
        if leaders:
            self._brokers[name] = max(leaders, key=lambda r: (r.epoch, r.last_heartbeat))

    def unregister_broker(self, name: str, replica_id: int = 0) -> bool:
        """Removes a broker (a replica) at once; False if it was not registered (not an error)."""
        replica = self._replicas.pop((name, replica_id), None)
        serving = self._brokers.get(name)
        if serving is None or serving.replica_id != replica_id:
            return replica is not None
        self._forget_created(name)
        del self._brokers[name]
        self._promote(name)
        return True

    def all_replicas(self) -> list[BrokerRecord]:
        """Every live broker and replica (followers too), by name then replica id."""
        self._expire()
        out = {(b.name, b.replica_id): b for b in self._brokers.values()}
        out.update(self._replicas)
        return [out[k] for k in sorted(out)]

    def shards_heard(self) -> int:
        """The shards whose topics this name server knows now: a broker or a shard's leader
        registered, or a replicated shard between leaders whose last leader's topics are
        kept (a shard heard from only by its followers is not: its topics are unknown)."""
        self._expire()
        return len(set(self._brokers) | set(self._shard_topics))

    def live_brokers(self) -> list[BrokerRecord]:
        """Live brokers sorted by name."""
        self._expire()
        return sorted(self._brokers.values(), key=lambda b: b.name)

    def live_broker(self, name: str) -> BrokerRecord:
        self._expire()
        record = self._brokers.get(name)
        if record is None:
            raise BrokerNotFoundError(name)
        return record

    def live_broker_count(self) -> int:
        """Safe to call from another thread (the /metrics scrape): reads, never expires."""
        now = self.now()
        return sum(1 for b in list(self._brokers.values())
                   if now - b.last_heartbeat < self.broker_expiry_seconds)

    # checkers

    def register_checker(self, name: str, address: str) -> CheckerRecord:
        validate_member_name("checker.name", name)
        validate_address("checker.address", address)
        record = CheckerRecord(name, address, self.now())
        self._checkers[name] = record
        return record

    def unregister_checker(self, name: str) -> bool:
        return self._checkers.pop(name, None) is not None

    def live_checkers(self) -> list[CheckerRecord]:
        self._expire()
        return sorted(self._checkers.values(), key=lambda c: c.name)

    def live_checker_count(self) -> int:
        now = self.now()
        return sum(1 for c in list(self._checkers.values())
                   if now - c.last_heartbeat < self.checker_expiry_seconds)

    # topics and routes

    def route(self, topic: str) -> list[QueueRoute]:
        """The queues of ``topic`` on live brokers, by broker name then queue id; empty when
        no live broker holds it."""
        return [QueueRoute(b.name, b.address, queue_id, b.draining)
                for b in self.live_brokers()
                for queue_id in range(b.topics.get(topic, 0))]

    def leaderless_shards(self, topic: str) -> list[str]:
        """The replicated shards holding ``topic`` that are between leaders: replicas of
        theirs are live but none leads (the leader died, stepped down or left, its successor
        has not registered yet). A shard holds the topic as its last leader registered it,
        or as a live replica reports it. Sorted; empty for unreplicated brokers, which leave
        the routes when they expire."""
        self._expire()
        out = []
        for shard in sorted({name for name, _r in self._replicas} - set(self._brokers)):
            if topic in self._shard_topics.get(shard, {}) or any(
                    topic in r.topics for (name, _r), r in self._replicas.items() if name == shard):
                out.append(shard)
        return out

    def is_fifo(self, topic: str) -> bool:
        """Whether ``topic`` is FIFO (as the live brokers holding it say)."""
        return any(topic in b.fifo_topics for b in self.live_brokers())

    def topics(self) -> list[tuple[str, list[tuple[str, int]]]]:
        """Every topic a live broker holds, sorted, with (broker, queue count) by broker name."""
        out: dict[str, list[tuple[str, int]]] = {}
        for broker in self.live_brokers():
            for topic, count in broker.topics.items():
                out.setdefault(topic, []).append((broker.name, count))
        return sorted(out.items())

    def plan_topic(self, topic: str, queue_count: int) -> list[QueueShare]:
        """How ``queue_count`` queues of ``topic`` spread over the live brokers. Raises
        TopicExistsError when live brokers already hold at least that many (so a retry of a
        partly failed creation completes it), NoBrokerError when no broker is live."""
        live = self.live_brokers()
        if sum(b.topics.get(topic, 0) for b in live) >= queue_count:
            raise TopicExistsError(topic)
        live = [b for b in live if not b.draining]  # a draining shard takes no new queues
        if not live:
            raise NoBrokerError(f"cannot create topic {topic!r}")
        by_name = {b.name: b for b in live}
        return [QueueShare(name, by_name[name].address, count, by_name[name].topics.get(topic, 0))
                for name, count in spread_queues(queue_count, by_name)]

    def record_topic_queues(self, broker_name: str, topic: str, queue_count: int, *, fifo: bool = False) -> None:
        """A broker confirmed it holds ``queue_count`` queues of ``topic``: route them now,
        before its next heartbeat lists them."""
        record = self._brokers.get(broker_name)
        if record is None or queue_count <= 0:
            return
        if fifo and topic not in record.fifo_topics:
            self._created_fifo.add((broker_name, topic))
            record = self._brokers[broker_name] = dataclasses.replace(
                record, fifo_topics=record.fifo_topics | {topic})
        if record.topics.get(topic, 0) >= queue_count:
            return
        self._created[(broker_name, topic)] = (queue_count, self.now())
        self._brokers[broker_name] = dataclasses.replace(record, topics={**record.topics, topic: queue_count})
        if record.role == ROLE_LEADER:
            self._shard_topics[broker_name] = {**self._shard_topics.get(broker_name, {}), topic: queue_count}

    def forget_topic_queues(self, broker_name: str, topic: str) -> None:
        """A broker deleted its queues of ``topic``: stop routing them now, before its next
        heartbeat stops listing them."""
        self._created.pop((broker_name, topic), None)
        self._created_fifo.discard((broker_name, topic))
        if topic in self._shard_topics.get(broker_name, {}):
            self._shard_topics[broker_name] = {t: n for t, n in self._shard_topics[broker_name].items() if t != topic}
        for key, record in [(k, r) for k, r in list(self._replicas.items()) if k[0] == broker_name]:
            self._replicas[key] = dataclasses.replace(
                record, topics={t: n for t, n in record.topics.items() if t != topic})
        single = self._brokers.get(broker_name)
        if single is not None and topic in single.topics:
            self._brokers[broker_name] = dataclasses.replace(
                single, topics={t: n for t, n in single.topics.items() if t != topic})

    # expiry

    def _expire(self) -> None:
        now = self.now()
        for name, broker in list(self._brokers.items()):
            if now - broker.last_heartbeat >= self.broker_expiry_seconds:
                del self._brokers[name]
                self._forget_created(name)
        for key, replica in list(self._replicas.items()):
            if now - replica.last_heartbeat >= self.broker_expiry_seconds:
                del self._replicas[key]
        for shard in set(self._shard_topics) - {name for name, _r in self._replicas} - set(self._brokers):
            del self._shard_topics[shard]  # no replica of it left: the shard is gone, not between leaders
        for name, checker in list(self._checkers.items()):
            if now - checker.last_heartbeat >= self.checker_expiry_seconds:
                del self._checkers[name]

    def _forget_created(self, broker_name: str) -> None:
        for key in [k for k in self._created if k[0] == broker_name]:
            del self._created[key]
