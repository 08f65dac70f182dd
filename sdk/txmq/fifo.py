"""FIFO message groups: the group hash, the queue a group goes to, and the group's rule.

The public home of ``txmq._fifo`` (what services, the pipeline and tools import)."""

from ._fifo import (  # re-exported
    MAX_MESSAGE_GROUP_BYTES,
    group_queue_index,
    group_route,
    message_group_hash,
    validate_message_group,
)

__all__ = ["MAX_MESSAGE_GROUP_BYTES", "group_queue_index", "group_route", "message_group_hash",
           "validate_message_group"]
