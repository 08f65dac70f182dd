"""The ``txmq`` PySpark data source (``pyspark.sql.datasource``).

Batch read of topics (one row per committed message)::

    spark.read.format("txmq")
        .option("nameserver", "ns-0:9876,ns-1:9876")
        .option("topic", "orders")                 # or "topics": "a,b" or "*" (every user topic)
        .option("startingOffsets", "earliest")     # or JSON {"orders": {"broker-0": {"0": 42}}}
        .option("endingOffsets", "latest")         # same form; exclusive
        .option("startTime", "2026-01-01T00:00:00Z")  # committed_at bounds (ISO-8601 or epoch ms)
        .option("endTime", "...")
        .option("queues", "0,1") .option("brokers", "broker-0")
        .option("includeBody", "true")
        .load()

Partitions: one per (topic, broker, queue), large queues split into ranges of
``maxMessagesPerPartition`` offsets. The offsets are fixed when the query is planned, so a
read is a consistent snapshot of what was committed then. Filters on ``topic``,
``broker``, ``queue``, ``offset`` and ``committed_at`` prune partitions and offset ranges
when ``option("pushFilters", "true")`` is set (PySpark also needs
``spark.sql.python.filterPushdown.enabled=true``; Spark still applies every filter).

Batch read of the transaction table: ``option("table", "transactions")`` (optionally
``producerGroup``, ``state``); each broker's table is split into sequence ranges
(``transactionPartitionsPerBroker``).

Streaming read: ``spark.readStream.format("txmq")`` with ``topic``/``topics``/``topicPattern``,
``startingOffsets`` ("latest", the default as in spark-sql-kafka, "earliest" or JSON),
``maxOffsetsPerTrigger`` and ``failOnDataLoss`` (default true); offsets are per (topic,
broker, queue) in Spark's checkpoint; queues and brokers that appear later are read from
offset 0. See :class:`MessageStreamReader`.

``option("namespace", "staging")`` (every use) reads and writes the topics and groups of
that namespace: ``topic``/``topics``/``producerGroup`` name them without it, ``*`` and
``topicPattern`` cover that namespace's topics alone; the ``topic`` column and offsets
JSON carry the names as stored (``staging%orders``, see ``txmq.names``).

Every use refuses options it does not know (:data:`VALID_OPTIONS`), naming the valid ones.

Streaming write: see :mod:`txmq_pipeline.sink`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, EqualTo, Filter, GreaterThan,
                                    GreaterThanOrEqual, In, InputPartition, LessThan,
                                    LessThanOrEqual)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import StructType

from txmq.errors import TxmqError
from txmq.names import in_namespace, namespace_of, unqualify

from . import _broker
from ._broker import QueueRange

log = logging.getLogger(__name__)

MESSAGE_SCHEMA = (
    "topic STRING, broker STRING, queue INT, offset BIGINT, message_id STRING, "
    "transaction_id STRING, producer_group STRING, keys ARRAY<STRING>, tag STRING, "
    "properties MAP<STRING, STRING>, body BINARY, born_at TIMESTAMP, stored_at TIMESTAMP, "
    "committed_at TIMESTAMP, deliver_at TIMESTAMP"
    ", message_group STRING")

TRANSACTION_SCHEMA = (
    "transaction_id STRING, message_id STRING, broker STRING, producer_group STRING, "
    "producer_client_id STRING, topic STRING, queue INT, state STRING, prepared_at TIMESTAMP, "
    "ended_at TIMESTAMP, resolution_source STRING, checks_delivered INT, checks_answered INT, "
    "next_check_at TIMESTAMP, discard_reason STRING, discarded_at TIMESTAMP, operator STRING, "
    "reason STRING, queue_offset BIGINT, body_size_bytes BIGINT, prepared_at_ms BIGINT, "
    "ended_at_ms BIGINT")

DEFAULT_MAX_MESSAGES_PER_PARTITION = 200_000
DEFAULT_TXN_PARTITIONS_PER_BROKER = 4


class TxmqOptionError(ValueError):
    """An option of the ``txmq`` data source is missing, malformed or unknown."""


class TxmqDataLossError(RuntimeError):
    """Offsets the query needs are gone (retention deleted them) and ``failOnDataLoss``
    is true."""


# ----------------------------------------------------------------------------- the options each use accepts

_TOPICS = ("topic", "topics", "topicPattern", "namespace")
#: Every option per use (names as users write them; Spark matches them case-insensitively).
_TLS = tuple(_broker.TLS_OPTIONS)
VALID_OPTIONS = {
    "read": ("nameserver", *_TLS, "table", *_TOPICS, "startingOffsets", "endingOffsets", "startTime", "endTime",
             "brokers", "queues", "includeBody", "maxMessagesPerPartition", "pushFilters", "failOnDataLoss"),
    "read transactions": ("nameserver", *_TLS, "table", "producerGroup", "state", "transactionPartitionsPerBroker",
                          "namespace"),
    "stream": ("nameserver", *_TLS, "table", *_TOPICS, "startingOffsets", "includeBody", "maxOffsetsPerTrigger",
               "maxMessagesPerTrigger", "failOnDataLoss"),
    "sink": ("nameserver", *_TLS, "topic", "producerGroup", "checkpointLocation", "checkImmunitySeconds", "sinkLogPath",
             "namespace"),
}
#: spark-sql-kafka names a user may bring, and ours.
KAFKA_EQUIVALENTS = {"kafka.bootstrap.servers": "nameserver", "subscribe": "topics", "assign": "startingOffsets",
                     "subscribePattern": "topicPattern", "startingTimestamp": "startTime",
                     "endingTimestamp": "endTime", "minPartitions": "maxMessagesPerPartition"}
#: Options Spark itself adds to a source's or sink's options.
_SPARK_OPTIONS = {"path"}


def check_options(options: dict[str, str], use: str) -> None:
    """Refuses options ``use`` does not know (a typo such as ``startingOffset`` would
    otherwise be ignored without a word), naming the valid ones; then puts the ``topic``,
    ``topics`` and ``producerGroup`` options in the ``namespace`` option's namespace (a
    name that names another namespace is refused)."""
    _check_known(options, use)
    namespace = options.get("namespace") or ""
    try:
        for name, field in (("topic", "topic"), ("topics", "topics"), ("producerGroup", "producerGroup")):
            if options.get(name) and options[name].strip() != "*":
                options[name] = ",".join(in_namespace(namespace, field, v) for v in _csv(options, name))
    except TxmqError as err:
        raise TxmqOptionError(f"option {err.message}") from None


def _check_known(options: dict[str, str], use: str) -> None:
    valid = {name.lower(): name for name in VALID_OPTIONS[use]}
    unknown = sorted(k for k in options if k.lower() not in valid and k.lower() not in _SPARK_OPTIONS)
    if not unknown:
        return
    hints = []
    for name in unknown:
        ours = {k.lower(): v for k, v in KAFKA_EQUIVALENTS.items()}.get(name.lower())
        if ours:
            hints.append(f"{name!r} is spark-sql-kafka's; txmq's is {ours!r}")
    raise TxmqOptionError(
        f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(repr(u) for u in unknown)} for a txmq {use}; "
        f"valid: {', '.join(VALID_OPTIONS[use])}" + (f" ({'; '.join(hints)})" if hints else ""))


# ----------------------------------------------------------------------------- options

def _required(options: dict[str, str], name: str) -> str:
    value = options.get(name)
    if not value:
        raise TxmqOptionError(f"the txmq data source needs option({name!r}, ...)")
    return value


def _bool(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise TxmqOptionError(f"option {name!r} must be true or false, got {value!r}")
    return value.lower() == "true"


def _int(options: dict[str, str], name: str, default: int) -> int:
    value = options.get(name)
    try:
        return default if value is None else int(value)
    except ValueError:
        raise TxmqOptionError(f"option {name!r} must be an integer, got {value!r}") from None


def parse_time_ms(value: str | int | float | dt.datetime | None) -> int | None:
    """Epoch milliseconds from an option or a pushed filter: ``1767225600000``,
    ``"2026-01-01T00:00:00Z"`` (no zone = UTC) or a datetime (naive = local time, as Spark
    hands them)."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise TxmqOptionError(f"not a time (epoch ms or ISO-8601): {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def _csv(options: dict[str, str], name: str) -> list[str]:
    return [v.strip() for v in (options.get(name) or "").split(",") if v.strip()]


def _pattern(options: dict[str, str]) -> re.Pattern[str] | None:
    value = options.get("topicPattern")
    if not value:
        return None
    if _csv(options, "topics") or _csv(options, "topic"):
        raise TxmqOptionError("give one of option('topic'/'topics', ...) and option('topicPattern', ...), not both")
    try:
        return re.compile(value)
    except re.error as exc:
        raise TxmqOptionError(f"option 'topicPattern' is not a regular expression ({exc}): {value!r}") from None


def _topics(options: dict[str, str], client: Any) -> list[str]:
    """The topics to read: ``topic``/``topics`` (``*``: every user topic), or the user
    topics whose whole name matches ``topicPattern`` (looked up again at every trigger of
    a stream, so topics created later join)."""
    pattern = _pattern(options)
    namespace = options.get("namespace") or ""
    if pattern is not None:
        return [t for t in _broker.user_topics(client)
                if (not namespace or namespace_of(t) == namespace) and pattern.fullmatch(unqualify(namespace, t))]
    names = _csv(options, "topics") or _csv(options, "topic")
    if not names:
        raise TxmqOptionError("the txmq data source needs option('topic', ...), option('topics', 'a,b' or '*') "
                              "or option('topicPattern', regex)")
    if names == ["*"]:
        return [t for t in _broker.user_topics(client) if not namespace or namespace_of(t) == namespace]
    return names


def _offsets_option(options: dict[str, str], name: str, keyword: str) -> dict[str, Any] | None:
    """``keyword`` ("earliest"/"latest") → None; JSON ``{topic: {broker: {queue: offset}}}``."""
    value = options.get(name)
    if value is None or value.strip().lower() == keyword:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        raise TxmqOptionError(f"option {name!r} must be {keyword!r} or JSON "
                              f"{{topic: {{broker: {{queue: offset}}}}}}, got {value!r}") from None
    if not isinstance(parsed, dict):
        raise TxmqOptionError(f"option {name!r} must be a JSON object")
    return parsed


def _lookup(offsets: dict[str, Any] | None, topic: str, broker: str, queue: int) -> int | None:
    if offsets is None:
        return None
    value = offsets.get(topic, {}).get(broker, {}).get(str(queue))
    return None if value is None else int(value)


# ----------------------------------------------------------------------------- rows

def message_row(m: Any, include_body: bool) -> tuple:
    msg = m.message
    born = _broker.timestamp(msg.born_timestamp_ms)
    return (m.topic, m.broker_name, m.queue_id, m.queue_offset, msg.message_id,
            m.transaction_id or None, msg.producer_group or None, list(msg.keys), msg.tag or None,
            dict(msg.properties), bytes(msg.body) if include_body else None, born,
            _broker.timestamp(m.stored_at_ms), _broker.timestamp(m.visible_at_ms),
            _broker.timestamp(msg.deliver_at_ms), msg.message_group or None)


def transaction_row(t: Any) -> tuple:
    return (t.transaction_id, t.message_id, t.broker_name, t.producer_group,
            t.producer_client_id or None, t.topic, t.queue_id, _broker.STATE_NAMES.get(t.state, "UNKNOWN"),
            _broker.timestamp(t.prepared_at_ms), _broker.timestamp(t.ended_at_ms),
            _broker.SOURCE_NAMES.get(t.resolution_source), t.checks_delivered, t.checks_answered,
            _broker.timestamp(t.next_check_at_ms), t.discard_reason or None,
            _broker.timestamp(t.discarded_at_ms), t.operator or None, t.reason or None,
            t.queue_offset if t.queue_offset >= 0 else None, t.body_size_bytes, t.prepared_at_ms,
            t.ended_at_ms or None)


# ----------------------------------------------------------------------------- partitions

@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """Offsets [start, end) of one queue; ``min_time_ms``/``max_time_ms`` bound committed_at."""

    range: QueueRange
    min_time_ms: int | None = None
    max_time_ms: int | None = None


@dataclass(frozen=True)
class TransactionPartition(InputPartition):
    broker: str
    address: str
    store_id: int
    first_seq: int
    last_seq: int


def _split(r: QueueRange, size: int) -> list[QueueRange]:
    if size <= 0 or r.end - r.start <= size:
        return [r]
    return [QueueRange(r.topic, r.broker, r.address, r.queue, s, min(s + size, r.end))
            for s in range(r.start, r.end, size)]


def read_partition(nameserver: str, p: QueuePartition, include_body: bool,
                   tls: _broker.TLS | None = None) -> Iterator[tuple]:
    client = _broker.connect(nameserver, tls)
    try:
        r = p.range
        if not r.address:
            r = QueueRange(r.topic, r.broker, client.broker_address(r.broker), r.queue, r.start, r.end)
        for m in _broker.read_queue(client, r):
            if p.min_time_ms is not None and m.visible_at_ms < p.min_time_ms:
                continue
            if p.max_time_ms is not None and m.visible_at_ms >= p.max_time_ms:
                return  # commit order per queue: nothing later is earlier
            yield message_row(m, include_body)
    finally:
        client.close()


# ----------------------------------------------------------------------------- pushed filters

class _Bounds:
    """What pushed filters say about topic/broker/queue/offset/committed_at."""

    def __init__(self) -> None:
        self.sets: dict[str, set[Any]] = {}
        self.offset_low = 0
        self.offset_high: int | None = None  # exclusive
        self.time_low: int | None = None
        self.time_high: int | None = None  # exclusive

    def add(self, f: Filter) -> None:
        column = ".".join(f.attribute) if hasattr(f, "attribute") else ""
        if not hasattr(f, "value"):
            return  # IsNull, IsNotNull, Not, ...: nothing to prune with
        if column in ("topic", "broker", "queue"):
            if isinstance(f, EqualTo):
                values = {f.value}
            elif isinstance(f, In):
                values = set(f.value)
            else:
                return
            self.sets[column] = self.sets[column] & values if column in self.sets else values
        elif column == "offset":
            v = f.value if not isinstance(f, In) else None
            if isinstance(f, EqualTo):
                self.offset_low, self.offset_high = max(self.offset_low, v), self._min(self.offset_high, v + 1)
            elif isinstance(f, GreaterThan):
                self.offset_low = max(self.offset_low, v + 1)
            elif isinstance(f, GreaterThanOrEqual):
                self.offset_low = max(self.offset_low, v)
            elif isinstance(f, LessThan):
                self.offset_high = self._min(self.offset_high, v)
            elif isinstance(f, LessThanOrEqual):
                self.offset_high = self._min(self.offset_high, v + 1)
        elif column == "committed_at" and not isinstance(f, In):
            ms = parse_time_ms(f.value) if isinstance(f.value, dt.datetime) else None
            if ms is None:
                return
            if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
                self.time_low = ms if self.time_low is None else max(self.time_low, ms)
            elif isinstance(f, (LessThan, LessThanOrEqual)):
                # ms precision: keep the boundary millisecond, Spark applies the exact filter.
                self.time_high = self._min(self.time_high, ms + 1)

    @staticmethod
    def _min(a: int | None, b: int) -> int:
        return b if a is None else min(a, b)

    def allows(self, column: str, value: Any) -> bool:
        return column not in self.sets or value in self.sets[column]


# ----------------------------------------------------------------------------- batch readers

class MessageReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.nameserver = _required(options, "nameserver")
        self.tls = _broker.tls_from_options(options)
        self.include_body = _bool(options, "includeBody", True)
        self.bounds = _Bounds()

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        starting = _offsets_option(options, "startingOffsets", "earliest")
        ending = _offsets_option(options, "endingOffsets", "latest")
        queues = {int(q) for q in _csv(options, "queues")}
        brokers = set(_csv(options, "brokers"))
        min_time = parse_time_ms(options.get("startTime"))
        max_time = parse_time_ms(options.get("endTime"))
        b = self.bounds
        if b.time_low is not None:
            min_time = b.time_low if min_time is None else max(min_time, b.time_low)
        if b.time_high is not None:
            max_time = b.time_high if max_time is None else min(max_time, b.time_high)
        size = _int(options, "maxMessagesPerPartition", DEFAULT_MAX_MESSAGES_PER_PARTITION)
        fail_on_data_loss = _bool(options, "failOnDataLoss", True)
        client = _broker.connect(self.nameserver, self.tls)
        try:
            out: list[InputPartition] = []
            for topic in _topics(options, client):
                if not b.allows("topic", topic):
                    continue
                for (broker, queue), (address, low, high) in sorted(_broker.queue_offsets(client, topic).items()):
                    if (queues and queue not in queues) or (brokers and broker not in brokers):
                        continue
                    if not (b.allows("broker", broker) and b.allows("queue", queue)):
                        continue
                    asked = _lookup(starting, topic, broker, queue)
                    if asked is not None and asked < low and fail_on_data_loss:
                        raise TxmqDataLossError(
                            f"startingOffsets asks for {topic}/{broker}/{queue} at {asked}, the oldest retained "
                            f"offset is {low}: messages were deleted. Set option('failOnDataLoss', 'false') "
                            "to read from the oldest retained offset")
                    start = max(low, asked or 0, b.offset_low)
                    end = min([high, *(v for v in (_lookup(ending, topic, broker, queue), b.offset_high)
                                       if v is not None)])
                    if start >= end:
                        continue
                    for r in _split(QueueRange(topic, broker, address, queue, start, end), size):
                        out.append(QueuePartition(r, min_time, max_time))
            return out or [QueuePartition(QueueRange("", "", "", 0, 0, 0))]
        finally:
            client.close()

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, QueuePartition)
        if partition.range.end <= partition.range.start:
            return iter(())
        return read_partition(self.nameserver, partition, self.include_body, self.tls)


class PushdownMessageReader(MessageReader):
    """A MessageReader that prunes with pushed filters (``option("pushFilters", "true")``)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            self.bounds.add(f)
            yield f  # Spark still evaluates it: the pruning is coarse (ms, whole ranges)


class TransactionReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.nameserver = _required(options, "nameserver")
        self.tls = _broker.tls_from_options(options)
        self.producer_group = options.get("producerGroup") or ""
        state = (options.get("state") or "").upper()
        if state and state not in _broker.STATE_VALUES:
            raise TxmqOptionError(f"option 'state' must be one of {sorted(_broker.STATE_VALUES)}, got {state!r}")
        self.state = _broker.STATE_VALUES.get(state, 0)

    def partitions(self) -> Sequence[InputPartition]:
        per_broker = max(1, _int(self.options, "transactionPartitionsPerBroker", DEFAULT_TXN_PARTITIONS_PER_BROKER))
        client = _broker.connect(self.nameserver, self.tls)
        try:
            out: list[InputPartition] = []
            for broker in _broker.list_brokers(client):
                found = _broker.store_id_and_sequences(client, broker.address)
                if found is None:
                    continue
                store_id, first, last = found
                step = max(1, -(-(last - first + 1) // per_broker))
                for low in range(first, last + 1, step):
                    out.append(TransactionPartition(broker.name, broker.address, store_id, low,
                                                    min(low + step - 1, last)))
            return out or [TransactionPartition("", "", 0, 1, 0)]
        finally:
            client.close()

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, TransactionPartition)
        if partition.last_seq < partition.first_seq:
            return
        client = _broker.connect(self.nameserver, self.tls)
        try:
            for t in _broker.read_transactions(client, partition.broker, partition.address, partition.store_id,
                                               partition.first_seq, partition.last_seq,
                                               self.producer_group, self.state):
                yield transaction_row(t)
        finally:
            client.close()


# ----------------------------------------------------------------------------- streaming read

class MessageStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: ``{topic: {broker: {queue: next offset}}}``.

    - ``startingOffsets``: ``latest`` (default, as Kafka), ``earliest``, or JSON
      ``{topic: {broker: {queue: offset}}}`` (queues it leaves out start at ``latest``);
      only for a query without a checkpoint, which otherwise says where to resume.
    - ``maxOffsetsPerTrigger`` (alias ``maxMessagesPerTrigger``): at most this many
      messages per micro-batch, shared across queues in proportion to their backlog.
    - ``failOnDataLoss`` (default true): fail the query when retention deleted offsets it
      has not read yet (or a queue that appeared later no longer starts at 0); false skips
      to the oldest retained offset with a warning.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.nameserver = _required(options, "nameserver")
        self.tls = _broker.tls_from_options(options)
        self.include_body = _bool(options, "includeBody", True)
        value = (options.get("startingOffsets") or "latest").strip()
        self.starting = value.lower() if value.lower() in ("earliest", "latest") else "json"
        self.starting_json = _offsets_option(options, "startingOffsets", "latest") if self.starting == "json" else None
        self.fail_on_data_loss = _bool(options, "failOnDataLoss", True)
        limit = options.get("maxOffsetsPerTrigger") or options.get("maxMessagesPerTrigger")
        self.max_per_trigger = _int({"maxOffsetsPerTrigger": limit}, "maxOffsetsPerTrigger", 0) if limit else None
        if self.max_per_trigger is not None and self.max_per_trigger <= 0:
            raise TxmqOptionError(f"option 'maxOffsetsPerTrigger' must be a positive integer, got {limit!r}")
        _pattern(options)  # a malformed pattern fails at start, not at the first trigger
        self._client: Any = None
        self._available_now: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def _connected(self) -> Any:
        if self._client is None:
            self._client = _broker.connect(self.nameserver, self.tls)
        return self._client

    def _bounds(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(topic, broker, queue) → (oldest retained offset, next offset)."""
        client = self._connected()
        out: dict[tuple[str, str, str], tuple[int, int]] = {}
        for topic in _topics(self.options, client):
            try:
                found = _broker.queue_offsets(client, topic)
            except _broker.TxmqError:
                found = {}
            for (broker, queue), (_address, low, high) in found.items():
                out[(topic, broker, str(queue))] = (low, high)
        return out

    def initialOffset(self) -> dict[str, Any]:
        offsets: dict[str, Any] = {}
        for (topic, broker, queue), (low, high) in self._bounds().items():
            chosen = _lookup(self.starting_json, topic, broker, int(queue))
            if chosen is None:
                chosen = low if self.starting == "earliest" else high
            elif chosen < low:
                self._data_loss(f"startingOffsets asks for {topic}/{broker}/{queue} at {chosen}, "
                                f"the oldest retained offset is {low}")
            offsets.setdefault(topic, {}).setdefault(broker, {})[queue] = max(min(chosen, high), low)
        return offsets

    def _data_loss(self, what: str) -> None:
        if self.fail_on_data_loss:
            raise TxmqDataLossError(f"{what}: messages were deleted before this query read them. Set "
                                    "option('failOnDataLoss', 'false') to skip to the oldest retained offset")
        log.warning("%s; skipping to the oldest retained offset (failOnDataLoss=false)", what)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {f"{t}\0{b}\0{q}": high for (t, b, q), (_low, high) in self._bounds().items()}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        start = start or {}
        bounds = self._bounds()
        begin: dict[tuple[str, str, str], int] = {}
        target: dict[tuple[str, str, str], int] = {}
        for key, (low, high) in bounds.items():
            topic, broker, queue = key
            known = _lookup(start, topic, broker, int(queue))
            if known is None:
                known = 0  # a queue that appeared later: from its start
                if low > 0:
                    self._data_loss(f"new queue {topic}/{broker}/{queue} starts at offset {low}, not 0")
            elif known < low:
                self._data_loss(f"{topic}/{broker}/{queue} needs offset {known}, the oldest retained is {low}")
            if not self.fail_on_data_loss:
                known = max(known, low)
            if self._available_now is not None:
                high = min(high, self._available_now.get("\0".join(key), 0))
            begin[key], target[key] = known, max(known, high)
        if isinstance(limit, ReadMaxRows):
            target = _share(begin, target, limit.max_rows)
        merged: dict[str, Any] = json.loads(json.dumps(start))
        for (topic, broker, queue), end in target.items():
            known = merged.setdefault(topic, {}).setdefault(broker, {})
            known[queue] = max(int(known.get(queue, 0)), end)
        return merged

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for topic, brokers in sorted(end.items()):
            for broker, queues in sorted(brokers.items()):
                for queue, high in sorted(queues.items(), key=lambda kv: int(kv[0])):
                    low = _lookup(start, topic, broker, int(queue)) or 0  # new queue: from its oldest
                    if int(high) > low:
                        out.append(QueuePartition(QueueRange(topic, broker, "", int(queue), low, int(high))))
        return out

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, QueuePartition)
        return read_partition(self.nameserver, partition, self.include_body, self.tls)

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _share(begin: dict[Any, int], target: dict[Any, int], budget: int) -> dict[Any, int]:
    """Ends that read at most ``budget`` messages in all, each queue getting a share in
    proportion to its backlog (as spark-sql-kafka's maxOffsetsPerTrigger); what rounding
    leaves goes to the largest backlogs first."""
    backlog = {k: target[k] - begin[k] for k in target}
    total = sum(backlog.values())
    if total <= budget:
        return target
    take = {k: budget * n // total for k, n in backlog.items()}
    left = budget - sum(take.values())
    for k in sorted(backlog, key=lambda k: (-(backlog[k] - take[k]), k)):
        if left <= 0:
            break
        if take[k] < backlog[k]:
            take[k] += 1
            left -= 1
    return {k: begin[k] + take[k] for k in target}


# ----------------------------------------------------------------------------- the source

class TxmqDataSource(DataSource):
    """``format("txmq")``: see the module documentation for the options."""

    @classmethod
    def name(cls) -> str:
        return "txmq"

    def _table(self) -> str:
        table = (self.options.get("table") or "messages").lower()
        if table not in ("messages", "transactions"):
            raise TxmqOptionError(f"option 'table' must be 'messages' or 'transactions', got {table!r}")
        return table

    def schema(self) -> str:
        return TRANSACTION_SCHEMA if self._table() == "transactions" else MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self.options.copy()
        if self._table() == "transactions":
            check_options(options, "read transactions")
            return TransactionReader(options)
        check_options(options, "read")
        if _bool(options, "pushFilters", False):
            return PushdownMessageReader(options)
        return MessageReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self._table() != "messages":
            raise TxmqOptionError("streaming reads are of topics only (table 'messages')")
        options = self.options.copy()
        check_options(options, "stream")
        return MessageStreamReader(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import TxmqStreamWriter
        options = self.options.copy()
        check_options(options, "sink")
        return TxmqStreamWriter(options, schema)
