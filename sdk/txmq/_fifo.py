"""FIFO message groups: the one hash every party uses for a message group (the client's
queue choice, the broker's queue entries, the proxy), and the group's validation."""

from __future__ import annotations

import hashlib
from typing import Callable, Hashable, Sequence, TypeVar

from ._errors import InvalidFieldError

T = TypeVar("T")

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


def group_route(known: Sequence[T] | None, routes: Sequence[T], key: Callable[[T], Hashable]) -> Sequence[T]:
    """The queues a FIFO topic's groups are placed over: ``routes`` (the current route), or
    ``known`` (the largest route seen before) while the current one only lacks some of its
    queues, as when a failed shard's registration expired: a group's queue must not change
    because its shard is down (its sends wait for it instead)."""
    if known is not None and len(routes) < len(known) and {key(r) for r in routes} <= {key(r) for r in known}:
        return known
    return routes


def validate_message_group(message_group: str, *, fifo: bool, topic: str) -> str:
    """A FIFO topic's messages need a group of 1-255 bytes; a normal topic's have none."""
    if fifo and not message_group:
        raise InvalidFieldError("message_group", f"topic {topic!r} is FIFO: every message needs a message group")
    if not fifo and message_group:
        raise InvalidFieldError("message_group", f"topic {topic!r} is not FIFO: a message group needs a FIFO topic")
    if len(message_group.encode()) > MAX_MESSAGE_GROUP_BYTES:
        raise InvalidFieldError("message_group", f"longer than {MAX_MESSAGE_GROUP_BYTES} bytes")
    return message_group
