"""Self-describing identifiers: message ids, transaction ids and receipt handles name
the broker (shard) that holds them and carry a checksum, so any service routes them
without shared state.

The public home of ``txmq._ids`` (what services, the pipeline and tools import)."""

from ._ids import (  # re-exported
    MessageId,
    ReceiptHandle,
    TransactionId,
)

__all__ = [
    "MessageId",
    "ReceiptHandle",
    "TransactionId",
]
