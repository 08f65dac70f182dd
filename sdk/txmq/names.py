"""Names of topics and groups: the rule they follow, the system topics
(``%HALF%``, ``%DLQ%<group>``, ``%DISCARD%<group>``) and their validation.

The public home of ``txmq._names`` (what services, the pipeline and tools import)."""

from ._names import (  # noqa: F401 - re-exported
    DISCARD_PREFIX,
    DLQ_PREFIX,
    GLOBAL_PARTS_PROPERTY,
    GLOBAL_TRANSACTION_PROPERTY,
    HALF_TOPIC,
    MAX_NAME_LENGTH,
    NAME_RULE,
    SYSTEM_PREFIX,
    discard_topic,
    dlq_topic,
    is_system_topic,
    validate_group,
    validate_name,
    validate_receive_topic,
    validate_send_topic,
)

__all__ = [
    "DISCARD_PREFIX",
    "DLQ_PREFIX",
    "GLOBAL_PARTS_PROPERTY",
    "GLOBAL_TRANSACTION_PROPERTY",
    "HALF_TOPIC",
    "MAX_NAME_LENGTH",
    "NAME_RULE",
    "SYSTEM_PREFIX",
    "discard_topic",
    "dlq_topic",
    "is_system_topic",
    "validate_group",
    "validate_name",
    "validate_receive_topic",
    "validate_send_topic",
]
