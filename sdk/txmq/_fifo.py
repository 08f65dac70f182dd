"""FIFO message groups: the one hash every party uses for a message group (the client's
queue choice, the broker's queue entries, the proxy), and the group's validation."""

from __future__ import annotations

import hashlib

from ._errors import InvalidFieldError

#: The most bytes a message group may have.
MAX_MESSAGE_GROUP_BYTES = 255


def message_group_hash(message_group: str) -> int:
    """A stable 64-bit hash of a message group (the same in every process and release),
    never 0; '' (no group) → 0."""
    if not message_group:
        return 0
    digest = hashlib.blake2b(message_group.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def group_queue_index(message_group: str, queue_count: int) -> int:
    """The index, among a FIFO topic's ``queue_count`` routed queues (ordered as the route
    lists them), of the queue every message of ``message_group`` goes to."""
    return message_group_hash(message_group) % queue_count


def validate_message_group(message_group: str, *, fifo: bool, topic: str) -> str:
    """A FIFO topic's messages need a group of 1-255 bytes; a normal topic's have none."""
    if fifo and not message_group:
        raise InvalidFieldError("message_group", f"topic {topic!r} is FIFO: every message needs a message group")
    if not fifo and message_group:
        raise InvalidFieldError("message_group", f"topic {topic!r} is not FIFO: a message group needs a FIFO topic")
    if len(message_group.encode()) > MAX_MESSAGE_GROUP_BYTES:
        raise InvalidFieldError("message_group", f"longer than {MAX_MESSAGE_GROUP_BYTES} bytes")
    return message_group
