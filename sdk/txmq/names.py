"""Names of topics and groups: the rule they follow, the system topics
(``%HALF%``, ``%DLQ%<group>``, ``%DISCARD%<group>``) and their validation.

The public home of ``txmq._names`` (what services, the pipeline and tools import)."""

from ._names import (  # noqa: F401 - re-exported
    DISCARD_PREFIX,
    DLQ_PREFIX,
    HALF_TOPIC,
    MAX_NAME_LENGTH,
    MAX_NAMESPACE_LENGTH,
    NAME_RULE,
    NAMESPACE_RULE,
    NAMESPACE_SEPARATOR,
    SYSTEM_PREFIX,
    discard_topic,
    dlq_topic,
    in_namespace,
    is_system_topic,
    namespace_of,
    qualify,
    unqualify,
    validate_group,
    validate_name,
    validate_namespace,
    validate_receive_topic,
    validate_send_topic,
)

__all__ = [
    "DISCARD_PREFIX",
    "DLQ_PREFIX",
    "HALF_TOPIC",
    "MAX_NAME_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "NAME_RULE",
    "NAMESPACE_RULE",
    "NAMESPACE_SEPARATOR",
    "SYSTEM_PREFIX",
    "discard_topic",
    "dlq_topic",
    "in_namespace",
    "is_system_topic",
    "namespace_of",
    "qualify",
    "unqualify",
    "validate_group",
    "validate_name",
    "validate_namespace",
    "validate_receive_topic",
    "validate_send_topic",
]
