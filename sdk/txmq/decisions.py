"""The decision protocol of anchored transactions without I/O (protos/txmq/v1/DECISIONS.md),
public for the services that run it themselves (the checker's resolver) and for drivers
outside the SDK: the statements, the check's algorithm, the sweep, as generators of steps
(see ``txmq._decisions``), and the asyncio runner with a pool of the caller's connections.

The public home of ``txmq._decisions`` (applications use ``txmq.anchored``)."""

from ._decisions import (  # re-exported
    ANCHOR_PROPERTY,
    DEFAULT_TABLE,
    Acknowledged,
    DatabaseError,
    DecisionSettings,
    Ends,
    Source,
    Statement,
    Verdict,
    answer_check,
    check,
    delete_acknowledged_statement,
    is_anchored,
    sweep,
    transaction_key_of,
    validate_table,
)
from .aio._anchored import AsyncStorePool  # re-exported
from .aio._anchored import drive_async  # re-exported

__all__ = [
    "ANCHOR_PROPERTY",
    "DEFAULT_TABLE",
    "Acknowledged",
    "AsyncStorePool",
    "DatabaseError",
    "DecisionSettings",
    "Ends",
    "Source",
    "Statement",
    "Verdict",
    "answer_check",
    "check",
    "delete_acknowledged_statement",
    "drive_async",
    "is_anchored",
    "sweep",
    "transaction_key_of",
    "validate_table",
]
