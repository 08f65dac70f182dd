"""Names of topics and groups, the system topics (DESIGN.md, Names and ports), and
namespaces.

A namespace isolates resources (RocketMQ's convention, kept on the wire): the topic
``orders`` of namespace ``staging`` is the name ``staging%orders`` everywhere a name
travels or is stored, and a system topic of a namespaced group keeps the namespace after
its prefix (``%DLQ%staging%billing``). A user name holds at most one namespace, itself a
valid namespace: ``a%b%c`` or ``a b%orders`` are refused, so a name cannot smuggle a
second namespace. Clients take ``namespace=`` and qualify the names they are given with
:func:`qualify` (the one helper every client uses), which refuses a name that names a
namespace itself, and show names without it (:func:`unqualify`).
"""

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

#: Separates a namespace from the name in it: ``<namespace>%<name>``.
NAMESPACE_SEPARATOR = "%"
MAX_NAMESPACE_LENGTH = 64
_NAMESPACE = re.compile(r"[a-zA-Z0-9_-]+")
NAMESPACE_RULE = f"1-{MAX_NAMESPACE_LENGTH} characters from [a-zA-Z0-9_-]"
_GROUP_TOPICS = (DLQ_PREFIX, DISCARD_PREFIX)


def validate_name(field: str, value: str) -> str:
    """A name as it travels: ``name`` or ``<namespace>%<name>``, or a system name (``%...``)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_LENGTH or not _NAME.fullmatch(value):
        raise InvalidNameError(field, value if isinstance(value, str) else repr(value), NAME_RULE)
    if not value.startswith(SYSTEM_PREFIX):
        namespace, sep, bare = value.rpartition(NAMESPACE_SEPARATOR)
        if sep and (not bare or not _is_namespace(namespace)):
            raise InvalidNameError(field, value, "a name holds at most one namespace: <namespace>%<name>, "
                                                 f"the namespace {NAMESPACE_RULE}")
    return value


def _is_namespace(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAMESPACE_LENGTH and bool(_NAMESPACE.fullmatch(value))


def validate_namespace(value: str, field: str = "namespace") -> str:
    """A namespace: "" (none) or 1-64 characters from [a-zA-Z0-9_-]."""
    if value == "":
        return value
    if not _is_namespace(value):
        raise InvalidNameError(field, value if isinstance(value, str) else repr(value), NAMESPACE_RULE)
    return value


def _split_system(name: str) -> tuple[str, str]:
    """``%DLQ%rest`` → (``%DLQ%``, ``rest``); any other name → ("", name)."""
    prefix = next((p for p in _GROUP_TOPICS if name.startswith(p)), "")
    return prefix, name[len(prefix):]


def namespace_of(name: str) -> str:
    """The namespace a name as it travels belongs to ("" for none); a dead-letter or
    discard topic belongs to its group's (``%DLQ%ns%g`` → ``ns``)."""
    _, rest = _split_system(name)
    if rest.startswith(SYSTEM_PREFIX):
        return ""
    namespace, sep, _ = rest.rpartition(NAMESPACE_SEPARATOR)
    return namespace if sep else ""


def qualify(namespace: str, field: str, name: str) -> str:
    """``name`` as it travels in ``namespace``: ``orders`` → ``ns%orders``, ``%DLQ%g`` →
    ``%DLQ%ns%g``; unchanged without a namespace. In a namespace a name must not name one
    itself (``other%orders`` is refused with InvalidNameError naming ``field``)."""
    if not namespace:
        return name
    if not isinstance(name, str):
        raise InvalidNameError(field, repr(name), NAME_RULE)
    prefix, bare = _split_system(name)
    if NAMESPACE_SEPARATOR in bare:
        raise InvalidNameError(field, name, f"must not contain '%' in namespace {namespace!r}: a name "
                                            "cannot name a namespace (set the client's namespace instead)")
    return validate_name(field, prefix + namespace + NAMESPACE_SEPARATOR + bare)


def in_namespace(namespace: str, field: str, name: str) -> str:
    """What a client given ``namespace=`` sends for ``name``: the namespace validated
    (InvalidNameError naming ``namespace``), then ``name`` qualified; "" stays ""."""
    validate_namespace(namespace)
    return qualify(namespace, field, name) if name else name


def unqualify(namespace: str, name: str) -> str:
    """The inverse of :func:`qualify`; a name of another namespace is returned as is."""
    if not namespace:
        return name
    prefix, rest = _split_system(name)
    head = namespace + NAMESPACE_SEPARATOR
    return prefix + rest[len(head):] if rest.startswith(head) else name


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
