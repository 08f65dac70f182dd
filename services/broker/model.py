"""The broker domain's named values and the results its operations return.

States, sources, resolutions and message kinds are named types here rather than integers
that happen to equal the proto enum numbers: the store keeps their values (one byte each,
see ``store/codec.py``, which takes them from here so nothing on disk changes), and the
service maps them to and from the proto enums explicitly, in one place (``service.py``).

This module imports nothing of the broker, so every other part may import it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: The most bytes one message key may have.
MAX_KEY_BYTES = 1024


class TxnState(enum.IntEnum):
    """Where a transaction is in its state machine (stored as one byte)."""

    PREPARED = 1
    COMMITTED = 2
    ROLLED_BACK = 3
    #: Its checks were spent without a decision: the message went to %DISCARD%<group>;
    #: it can still be decided.
    DISCARDED = 4


class Source(enum.IntEnum):
    """Who decided a transaction (stored as one byte)."""

    NONE = 0
    CLIENT = 1
    CHECK = 2
    OPERATOR = 3
    #: The broker itself (a discard).
    BROKER = 4


class Resolution(enum.StrEnum):
    """What an EndTransaction asks for (its value is the name, as errors print it)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class CheckOutcome(enum.IntEnum):
    """What became of a claimed check, as its checker reports it."""

    #: A producer took the check: one unit of check_max is spent.
    DELIVERED = 1
    #: The producer answered (with a :class:`CheckAnswer`).
    ANSWERED = 2
    #: Nobody took it: nothing is spent and it is due again at once.
    UNDELIVERED = 3


class CheckAnswer(enum.IntEnum):
    """A producer's answer to a check."""

    COMMIT = 1
    ROLLBACK = 2
    #: It does not know: the check stays spent.
    UNKNOWN = 3
    #: Its local transaction still runs: ask again later, spending nothing.
    IN_PROGRESS = 4


class MessageKind(enum.IntEnum):
    """A commit-log record's kind (stored as one byte)."""

    NORMAL = 1
    #: A transaction's half message: in no queue until it is committed.
    HALF = 2


# The names the rest of the broker (and its tools and tests) have always used.
STATE_PREPARED = TxnState.PREPARED
STATE_COMMITTED = TxnState.COMMITTED
STATE_ROLLED_BACK = TxnState.ROLLED_BACK
STATE_DISCARDED = TxnState.DISCARDED
STATE_NAMES: dict[int, str] = {s: s.name for s in TxnState}  # looked up by stored bytes

SOURCE_NONE = Source.NONE
SOURCE_CLIENT = Source.CLIENT
SOURCE_CHECK = Source.CHECK
SOURCE_OPERATOR = Source.OPERATOR
SOURCE_BROKER = Source.BROKER

RESOLUTION_COMMIT = Resolution.COMMIT
RESOLUTION_ROLLBACK = Resolution.ROLLBACK
RESOLUTION_UNKNOWN = Resolution.UNKNOWN

KIND_NORMAL = MessageKind.NORMAL
KIND_HALF = MessageKind.HALF


@dataclass(slots=True, frozen=True)
class SendResult:
    message_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str = ""
    #: The transaction's state; 0 for a normal message (no transaction).
    state: int = 0
    duplicate: bool = False


@dataclass(slots=True, frozen=True)
class EndResult:
    transaction_id: str
    state: int
    source: int
    ended_ms: int
    queue_offset: int


@dataclass(slots=True, frozen=True)
class Delivery:
    topic: str
    queue_id: int
    offset: int
    log_seq: int
    attempt: int
    deadline_ms: int
    visible_ms: int
    receipt_handle: str


@dataclass(slots=True, frozen=True)
class ReceiveResult:
    deliveries: list[Delivery]
    # When the earliest in-flight delivery of the polled queues becomes visible again.
    next_deadline_ms: int | None
