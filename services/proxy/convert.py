"""Messages between the two protocols: RocketMQ ``apache.rocketmq.v2.Message`` ⇄ txmq
``txmq.v1.Message`` / ``DeliveredMessage``. Pure functions.

What maps to what:

================================  ======================================================
RocketMQ (SystemProperties)       txmq
================================  ======================================================
topic.name, resource_namespace    topic ``<namespace>%<name>`` (every Resource: a
(or the x-mq-namespace header)    namespace qualifies topics and groups; going out it is
                                  split back into resource_namespace and name)
message_id (client-chosen)        message_id (kept as is: the broker deduplicates by it)
message_type NORMAL/TRANSACTION   type NORMAL/TRANSACTION (LITE, PRIORITY refused)
message_type FIFO, message_group  type NORMAL with message_group (the topic must be FIFO);
                                  going out, a message with a group is type FIFO
message_type DELAY,               type NORMAL (or TRANSACTION) with deliver_at_ms; the
delivery_timestamp                Python client (5.1.2) writes the milliseconds into the
                                  seconds field: a value past year 5000 is read as ms
FilterExpression TAG / SQL        filter_type TAG / SQL92 (ReceiveMessage)
tag, keys, user_properties        tag, keys, properties
born_timestamp, born_host         born_timestamp_ms, born_host
orphaned_transaction_recovery_    check_immunity_seconds (first check after this long)
duration
(the topic)                       producer_group of a half message: RocketMQ 5 producers
                                  have no group, so the group is the topic (as RocketMQ's
                                  own proxy does); the proxy serves checks for it.
x-mq-client-id header             producer_client_id (checks prefer that client)
body_encoding GZIP                body inflated on the way in; always IDENTITY going out
================================  ======================================================

Going out every message carries what the clients need (see the protocol notes): IDENTITY
encoding, an MD5 body digest (upper-case hex), a receipt handle and delivery attempt ≥ 1
for deliveries, the original message id and topic.
"""

from __future__ import annotations

import hashlib
import zlib
from google.protobuf import duration_pb2, timestamp_pb2

from txmq.v1 import common_pb2

from txmq.errors import InvalidNameError
from txmq.names import namespace_of, qualify, unqualify, validate_namespace
from txmq.tracing import TRACEPARENT

from .codes import ProxyError, unsupported
from .protocol import Code, definition_pb2

MessageType = definition_pb2.MessageType


def resource_name(resource: definition_pb2.Resource, what: str) -> str:
    """The native name of a topic or group: ``<namespace>%<name>`` in a namespace (the
    client's ``x-mq-namespace`` header fills resources that name none: see
    ``namespaces``). A bad namespace, or a name naming a namespace of its own, is refused
    naming the field."""
    code = Code.ILLEGAL_TOPIC if what == "topic" else Code.ILLEGAL_CONSUMER_GROUP
    if not resource.name:
        raise ProxyError(code, f"{what} name is required")
    try:
        namespace = validate_namespace(resource.resource_namespace, f"{what}.resource_namespace")
        return qualify(namespace, f"{what}.name", resource.name)
    except InvalidNameError as err:
        raise ProxyError(code, err.message) from err


def to_resource(name: str) -> definition_pb2.Resource:
    """A native name as the clients know it: ``ns%orders`` → (namespace ``ns``, ``orders``)."""
    namespace = namespace_of(name)
    return definition_pb2.Resource(resource_namespace=namespace, name=unqualify(namespace, name))


def seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def duration(value: float) -> duration_pb2.Duration:
    whole = int(value)
    return duration_pb2.Duration(seconds=whole, nanos=int(round((value - whole) * 1e9)))


def timestamp_ms(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def md5_digest(body: bytes) -> definition_pb2.Digest:
    return definition_pb2.Digest(type=definition_pb2.MD5, checksum=hashlib.md5(body).hexdigest().upper())


def inflate(body: bytes, max_bytes: int | None = None) -> bytes:
    """A GZIP-encoded body (the clients use gzip or zlib framing), inflated to at most
    ``max_bytes`` + 1 bytes: a small body that inflates to gigabytes (a zip bomb) is
    stopped there, not held in memory."""
    try:
        inflater = zlib.decompressobj(47)  # 32 + 15: detect gzip or zlib headers
        out = inflater.decompress(body, (max_bytes + 1) if max_bytes is not None else 0)
        if max_bytes is None or len(out) <= max_bytes:
            out += inflater.flush()
        return out
    except zlib.error as exc:
        raise ProxyError(Code.MESSAGE_CORRUPTED, f"body is marked GZIP but does not inflate: {exc}") from None


def to_native(message: definition_pb2.Message, *, client_id: str, max_body_bytes: int) -> common_pb2.Message:
    """A message a RocketMQ producer sends, as the txmq broker stores it (queue not chosen yet)."""
    topic = resource_name(message.topic, "topic")
    sp = message.system_properties
    kind = sp.message_type
    if kind in (MessageType.MESSAGE_TYPE_UNSPECIFIED, MessageType.NORMAL, MessageType.DELAY, MessageType.FIFO):
        native_type = common_pb2.MESSAGE_TYPE_NORMAL
    elif kind == MessageType.TRANSACTION:
        native_type = common_pb2.MESSAGE_TYPE_TRANSACTION
    else:
        known = kind in MessageType.values()  # a value no enum entry names (a newer or a corrupt client)
        raise unsupported(f"message type {MessageType.Name(kind) if known else kind}")
    deliver_at_ms = delivery_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else 0
    if kind == MessageType.DELAY and deliver_at_ms <= 0:
        raise ProxyError(Code.ILLEGAL_DELIVERY_TIME, "a DELAY message needs a delivery_timestamp")
    message_group = sp.message_group if sp.HasField("message_group") else ""
    if kind == MessageType.FIFO and not message_group:
        raise ProxyError(Code.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message_group")
    body = message.body
    if sp.body_encoding == definition_pb2.GZIP:
        body = inflate(body, max_body_bytes)
    if not body:
        raise ProxyError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > max_body_bytes:
        raise ProxyError(Code.MESSAGE_BODY_TOO_LARGE,
                         f"message body is {len(body)} bytes, above the limit max_body_bytes={max_body_bytes}")
    properties = dict(message.user_properties)
    if sp.HasField("trace_context") and sp.trace_context and TRACEPARENT not in properties:
        properties[TRACEPARENT] = sp.trace_context  # W3C trace context: the SDK's property
    native = common_pb2.Message(
        topic=topic, body=body, tag=sp.tag if sp.HasField("tag") else "", keys=list(sp.keys),
        properties=properties, message_id=sp.message_id, type=native_type,
        born_timestamp_ms=sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000,
        born_host=sp.born_host, deliver_at_ms=max(deliver_at_ms, 0), message_group=message_group)
    if native_type == common_pb2.MESSAGE_TYPE_TRANSACTION:
        native.producer_group = topic
        native.producer_client_id = client_id
        if sp.HasField("orphaned_transaction_recovery_duration"):
            native.check_immunity_seconds = max(seconds(sp.orphaned_transaction_recovery_duration), 0.0)
    return native


#: A delivery_timestamp whose seconds field is past this (year 5138) holds milliseconds.
_SECONDS_THAT_ARE_MS = 10**11


def delivery_ms(ts: timestamp_pb2.Timestamp) -> int:
    """A delivery timestamp in ms since the epoch (see _SECONDS_THAT_ARE_MS)."""
    if ts.seconds >= _SECONDS_THAT_ARE_MS:
        return ts.seconds
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def _base(topic: str, m: common_pb2.Message, message_type: int) -> definition_pb2.Message:
    out = definition_pb2.Message(topic=to_resource(topic), body=m.body,
                                 user_properties=dict(m.properties))
    sp = out.system_properties
    if m.tag:
        sp.tag = m.tag
    sp.keys.extend(m.keys)
    sp.message_id = m.message_id
    sp.body_digest.CopyFrom(md5_digest(m.body))
    sp.body_encoding = definition_pb2.IDENTITY
    sp.message_type = message_type
    sp.born_timestamp.CopyFrom(timestamp_ms(m.born_timestamp_ms))
    sp.born_host = m.born_host
    sp.queue_id = m.queue_id
    if m.deliver_at_ms:
        sp.delivery_timestamp.CopyFrom(timestamp_ms(m.deliver_at_ms))
        if message_type == MessageType.NORMAL:
            sp.message_type = MessageType.DELAY
    if m.message_group:
        sp.message_group = m.message_group
        if message_type == MessageType.NORMAL:
            sp.message_type = MessageType.FIFO
    if m.properties.get(TRACEPARENT):
        sp.trace_context = m.properties[TRACEPARENT]  # the official clients continue the trace from it
    return out


def delivered_to_rmq(d: common_pb2.DeliveredMessage, now_ms: int) -> definition_pb2.Message:
    """A delivery (ReceiveMessage). ``topic`` is the topic it was received from (a
    ``%DLQ%`` topic when read from there): the client acknowledges with it."""
    out = _base(d.topic, d.message, MessageType.NORMAL)
    sp = out.system_properties
    sp.queue_id = d.queue_id
    sp.queue_offset = d.queue_offset
    sp.store_timestamp.CopyFrom(timestamp_ms(d.stored_at_ms))
    sp.store_host = d.broker_name
    sp.receipt_handle = d.receipt_handle
    sp.delivery_attempt = max(d.delivery_attempt, 1)
    if d.invisible_until_ms:
        sp.invisible_duration.CopyFrom(duration(max(d.invisible_until_ms - now_ms, 0) / 1000))
    return out


def check_to_rmq(m: common_pb2.Message) -> definition_pb2.Message:
    """The half message of a check (RecoverOrphanedTransactionCommand)."""
    return _base(m.topic, m, MessageType.TRANSACTION)


def validate_filter(expression: definition_pb2.FilterExpression) -> tuple[str, bool]:
    """The filter for the broker and whether it is SQL92 (else a tag filter, "*" or
    "A || B"). The broker parses a SQL92 expression; its INVALID_ARGUMENT (naming the
    column) comes back as ILLEGAL_FILTER_EXPRESSION."""
    if expression.type == definition_pb2.SQL:
        if not expression.expression.strip():
            raise ProxyError(Code.ILLEGAL_FILTER_EXPRESSION, "the SQL92 filter expression is empty")
        return expression.expression, True
    return expression.expression.strip() or "*", False


def publishing_topics(settings: definition_pb2.Settings) -> tuple[str, ...]:
    if settings.WhichOneof("pub_sub") != "publishing":
        return ()
    names = []
    for t in settings.publishing.topics:
        try:
            names.append(resource_name(t, "topic"))
        except ProxyError:
            continue  # a bad name is refused when it is sent to
    return tuple(dict.fromkeys(names))


def backoff_delays(initial: float, multiplier: float, maximum: float, attempts: int) -> list[float]:
    """Delay before each redelivery: initial × multiplier^(n-1), capped."""
    out, delay = [], initial
    for _ in range(max(attempts, 1)):
        out.append(min(delay, maximum))
        delay *= multiplier
    return out
