"""Validation of what a client sends, before any operation runs: a message's fields
against the broker's limits, and a consumer's tag filter.

Pure functions of their arguments (the configuration and the topics are handed in), so
every part of the broker and its tools can use them; a refusal raises the ``TxmqError``
naming the field and the limit.
"""

from __future__ import annotations

import re
from typing import Mapping

from txmq.errors import (InvalidFieldError, InvalidIdError, MessageTooLargeError, PropertiesTooLargeError,
                          QueueNotFoundError, TopicNotFoundError, WrongBrokerError)
from txmq.fifo import validate_message_group
from txmq.ids import MessageId
from txmq.names import validate_group, validate_send_topic

from .config import BrokerConfig
from .model import KIND_HALF, MAX_KEY_BYTES
from .store.codec import LogRecord

#: A message id the client chose (not one of ours): 1-128 of these characters.
_FOREIGN_ID = re.compile(r"[A-Za-z0-9_.:=+/-]{1,128}")


def validate_message(r: LogRecord, config: BrokerConfig, topics: Mapping[str, int], broker_name: str,
                     now_ms: int = 0, *, fifo: bool = False) -> LogRecord:
    """Checks a message to send to ``broker_name`` (whose topics are ``topics``: name →
    queue count) and gives it a message id when it has none; returns it. A delay becomes
    a delivery time from ``now_ms`` (the broker's clock), and a delivery time not in the
    future becomes 0 (at once)."""
    cfg = config
    validate_send_topic(r.topic)
    count = topics.get(r.topic)
    if count is None:
        raise TopicNotFoundError(r.topic)
    if not 0 <= r.queue_id < count:
        raise QueueNotFoundError(r.topic, r.queue_id)
    validate_message_group(r.message_group, fifo=fifo, topic=r.topic)
    if len(r.body) > cfg.max_body_bytes:
        raise MessageTooLargeError(len(r.body), cfg.max_body_bytes)
    if len(r.tag.encode()) > cfg.max_tag_bytes:
        raise PropertiesTooLargeError("tag bytes", len(r.tag.encode()), cfg.max_tag_bytes)
    if "||" in r.tag or r.tag.strip() != r.tag:
        raise InvalidFieldError("tag", "must not contain '||' or surrounding spaces")
    if len(r.keys) > cfg.max_keys:
        raise PropertiesTooLargeError("key count", len(r.keys), cfg.max_keys)
    for key in r.keys:
        if len(key.encode()) > MAX_KEY_BYTES:
            raise PropertiesTooLargeError("key bytes", len(key.encode()), MAX_KEY_BYTES)
    if len(r.properties) > cfg.max_properties:
        raise PropertiesTooLargeError("property count", len(r.properties), cfg.max_properties)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in r.properties.items())
    if size > cfg.max_properties_bytes:
        raise PropertiesTooLargeError("properties bytes", size, cfg.max_properties_bytes)
    if any(not k or len(k.encode()) > 0xFFFF for k in r.properties):
        raise InvalidFieldError("properties", "property names must be 1-65535 bytes")
    if r.message_id:
        if MessageId.looks_like(r.message_id):
            mid = MessageId.decode(r.message_id)
            if mid.broker != broker_name:
                raise WrongBrokerError("message id", r.message_id, mid.broker, broker_name)
        elif not _FOREIGN_ID.fullmatch(r.message_id):
            raise InvalidIdError("message id", r.message_id, "use 1-128 characters [A-Za-z0-9_.:=+/-]")
    else:
        r.message_id = MessageId.new(broker_name, r.queue_id).encode()
    if r.kind == KIND_HALF:
        validate_group("producer_group", r.producer_group)
        if len(r.producer_client_id.encode()) > 255:
            raise InvalidFieldError("producer_client_id", "longer than 255 bytes")
        if not 0 <= r.check_immunity_seconds <= cfg.max_transaction_lifetime_seconds:
            raise InvalidFieldError(
                "check_immunity_seconds",
                f"{r.check_immunity_seconds} is outside 0..max_transaction_lifetime_seconds="
                f"{cfg.max_transaction_lifetime_seconds}")
    if r.born_ms < 0:
        raise InvalidFieldError("born_timestamp_ms", f"{r.born_ms} is negative (milliseconds since the epoch)")
    if len(r.born_host.encode()) > 255:
        raise InvalidFieldError("born_host", "longer than 255 bytes")
    _delivery_time(r, cfg, now_ms)
    return r


def _delivery_time(r: LogRecord, cfg: BrokerConfig, now_ms: int) -> None:
    limit_ms = int(cfg.max_delivery_delay_seconds * 1000)
    if r.delay_seconds and r.deliver_at_ms:
        raise InvalidFieldError("deliver_at_ms/delay_seconds", "set one of them, not both")
    if r.delay_seconds:
        if not 0 < r.delay_seconds <= cfg.max_delivery_delay_seconds:
            raise InvalidFieldError("delay_seconds", f"{r.delay_seconds} is outside (0, max_delivery_delay_seconds="
                                                     f"{cfg.max_delivery_delay_seconds:g}]")
        r.deliver_at_ms = now_ms + max(int(r.delay_seconds * 1000), 1)
        r.delay_seconds = 0.0
    elif r.deliver_at_ms:
        if r.deliver_at_ms < 0:
            raise InvalidFieldError("deliver_at_ms", f"{r.deliver_at_ms} is negative")
        if r.deliver_at_ms - now_ms > limit_ms:
            raise InvalidFieldError("deliver_at_ms", f"{r.deliver_at_ms} is {(r.deliver_at_ms - now_ms) / 1000:g} s "
                                                     f"ahead, beyond max_delivery_delay_seconds="
                                                     f"{cfg.max_delivery_delay_seconds:g}")
        if r.deliver_at_ms <= now_ms:
            r.deliver_at_ms = 0  # due already: delivered at once


def parse_tag_filter(expression: str) -> frozenset[str] | None:
    """``"*"`` or empty → None (everything); ``"A || B"`` → {"A", "B"}."""
    text = (expression or "").strip()
    if text in ("", "*"):
        return None
    tags = frozenset(part.strip() for part in text.split("||"))
    if not tags or any(not t for t in tags):
        raise InvalidFieldError("filter_expression", f"{expression!r} is not '*' or 'TagA || TagB'")
    return tags
