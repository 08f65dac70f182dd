"""Names of topics and groups, and the system topics (DESIGN.md, Names and ports)."""

from __future__ import annotations

import re

from ._errors import InvalidNameError, SystemTopicError

MAX_NAME_LENGTH = 127
_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")
NAME_RULE = f"1-{MAX_NAME_LENGTH} characters from [%|a-zA-Z0-9_-]"

SYSTEM_PREFIX = "%"
HALF_TOPIC = "%HALF%"
DLQ_PREFIX = "%DLQ%"
DISCARD_PREFIX = "%DISCARD%"
#: The property the broker stamps on every message of a multi-message (global) transaction:
#: the global transaction's id (the transaction id of its first message). Reserved.
GLOBAL_TRANSACTION_PROPERTY = "__TXMQ_GLOBAL_TRANSACTION_ID"
#: The property the SDK stamps on every message of a global transaction: how many messages
#: it has (a consumer reassembling one waits for that many).
GLOBAL_PARTS_PROPERTY = "__TXMQ_GLOBAL_PARTS"


def validate_name(field: str, value: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_LENGTH or not _NAME.fullmatch(value):
        raise InvalidNameError(field, value if isinstance(value, str) else repr(value), NAME_RULE)
    return value


def validate_group(field: str, value: str) -> str:
    validate_name(field, value)
    if value.startswith(SYSTEM_PREFIX):
        raise InvalidNameError(field, value, "must not start with '%' (reserved for system names)")
    return value


def is_system_topic(topic: str) -> bool:
    return topic.startswith(SYSTEM_PREFIX)


def validate_send_topic(topic: str) -> str:
    """A topic a client may send to: a valid name that is not a system topic."""
    validate_name("topic", topic)
    if is_system_topic(topic):
        raise SystemTopicError(topic)
    return topic


def validate_receive_topic(topic: str) -> str:
    """A topic a consumer may receive from: a user topic, or explicitly a dead-letter or
    discard topic (to re-drive or inspect it); never the half topic."""
    if topic.startswith(DLQ_PREFIX) or topic.startswith(DISCARD_PREFIX):
        rest = topic.split("%", 2)[2]
        validate_group("topic", rest)
        return topic
    validate_send_topic(topic)
    return topic


def dlq_topic(consumer_group: str) -> str:
    return DLQ_PREFIX + consumer_group


def discard_topic(producer_group: str) -> str:
    return DISCARD_PREFIX + producer_group
