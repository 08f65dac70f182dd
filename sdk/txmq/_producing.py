"""What the sync producers (``_producer``) and the asyncio producers (``aio/_producer``) share
beyond the send steps of ``_sending``, without I/O: their defaults, the options of a
transaction producer, the messages they build, what a local transaction's outcome is,
which transactions are open in this process, who answers a check, and their results.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from ._calling import QueueRoute, positive
from ._checking import InProgress, answer_locally
from ._decisions import Decisions, is_anchored
from ._errors import InvalidFieldError, TransactionStateError
from ._names import in_namespace, validate_group
from ._sending import outcome_of
from ._types import (TRANSACTION_KEY_PROPERTY, LocalTransactionState, Message, SendReceipt, TransactionMessage,
                     TransactionResult, TransactionState, message_to_pb)
from .v1 import broker_pb2, common_pb2

log = logging.getLogger(__name__)

#: The client's own body limit, the brokers' default ``max_body_bytes``.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
HOST = socket.gethostname()


def new_client_id() -> str:
    """``host@pid@random``: unique per producer instance, readable in the checker's logs."""
    return f"{HOST}@{os.getpid()}@{uuid.uuid4().hex[:12]}"


def check_transaction_options(*, namespace: str, producer_group: str, listener: Any, checker: Any,
                              decisions: Any, client_id: str | None, checker_refresh_seconds: float,
                              workers_name: str, workers: object, listener_method_ok: Callable[[Any], bool],
                              listener_problem: Callable[[str], str]) -> None:
    """A transaction producer's own options (sync or asyncio alike), refused with the field
    they name: something must answer checks; a listener has both methods (of the kind
    ``listener_method_ok`` accepts); a checker is callable."""
    validate_group("producer_group", in_namespace(namespace, "producer_group", producer_group))
    if listener is None and checker is None and decisions is None:
        raise InvalidFieldError("listener", "give a listener (send_in_transaction), a checker "
                                "(begin_transaction) or decisions (transaction): something must answer checks")
    if decisions is not None and not isinstance(decisions, Decisions):
        raise InvalidFieldError("decisions", f"must be a txmq.anchored.Decisions, got {type(decisions).__name__}")
    for method in ("execute_local_transaction", "check_local_transaction") if listener is not None else ():
        if not listener_method_ok(getattr(listener, method, None)):
            raise InvalidFieldError("listener", listener_problem(method))
    if checker is not None and not callable(checker):
        raise InvalidFieldError("checker", "must be callable(message) -> LocalTransactionState | InProgress")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise InvalidFieldError(workers_name, f"must be an integer >= 1, got {workers!r}")
    positive("checker_refresh_seconds", checker_refresh_seconds)
    if client_id is not None and not 0 < len(client_id.encode()) <= 255:
        raise InvalidFieldError("client_id", "must be 1-255 bytes")


def transaction_key(key: str | None) -> str:
    """An explicit transaction's key: given (1-255 bytes) or a random one."""
    if key is None:
        return uuid.uuid4().hex
    if not isinstance(key, str) or not 0 < len(key.encode()) <= 255:
        raise InvalidFieldError("key", "must be 1-255 bytes")
    return key


def keyed(message: Message, key: str) -> Message:
    """``message`` stamped with its explicit transaction's key (``transaction_key`` in checks)."""
    return dataclasses.replace(message, properties={**message.properties, TRANSACTION_KEY_PROPERTY: key})


def normal_builder(message: Message) -> Callable[[QueueRoute, str], common_pb2.Message]:
    """``build(queue, message_id)`` of ``message`` as a normal message (born now, here)."""
    def build(route: QueueRoute, message_id: str) -> common_pb2.Message:
        return message_to_pb(message, message_id, route.queue_id, common_pb2.MESSAGE_TYPE_NORMAL,
                             int(time.time() * 1000), HOST)
    return build


def receipt(message: Message, route: QueueRoute, pb: common_pb2.Message,
            response: broker_pb2.SendMessageResponse) -> SendReceipt:
    return SendReceipt(message_id=response.message_id or pb.message_id, topic=message.topic,
                       broker_name=response.broker_name or route.broker_name,
                       queue_id=response.queue_id, queue_offset=response.queue_offset)


def half_message(message: Message, route: QueueRoute, pb: common_pb2.Message,
                 sent: broker_pb2.SendMessageResponse) -> TransactionMessage:
    """The half message as stored, with its transaction id."""
    return TransactionMessage(message=message, message_id=sent.message_id or pb.message_id,
                              transaction_id=sent.transaction_id, broker_name=sent.broker_name or route.broker_name,
                              queue_id=route.queue_id)


def executed(returned: object, error: BaseException | None, transaction_id: str) -> LocalTransactionState:
    """What ``execute_local_transaction`` returned (or raised: ``error``, logged) as the
    decision to send: anything but a LocalTransactionState is UNKNOWN."""
    if error is not None:
        log.error("execute_local_transaction raised for transaction %s: ending it as UNKNOWN", transaction_id,
                  exc_info=error)
        return LocalTransactionState.UNKNOWN
    return outcome_of(returned, transaction_id)


def transaction_result(half: TransactionMessage, route: QueueRoute, local_state: LocalTransactionState,
                       state: TransactionState | None, end_error: Any, local_error: BaseException | None = None,
                       ) -> TransactionResult:
    return TransactionResult(message_id=half.message_id, transaction_id=half.transaction_id,
                             local_state=local_state, state=state, topic=half.topic, broker_name=half.broker_name,
                             queue_id=route.queue_id, end_error=end_error, local_error=local_error)


class OpenTransactions:
    """The half messages of transactions still open in this process (halves being sent,
    explicit transactions, a listener's local transaction until its end is sent,
    multi-message ones being sent): a check of one is answered IN_PROGRESS here. Thread-safe."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._ids

    def add(self, message_id: str) -> None:
        with self._lock:
            self._ids.add(message_id)

    def discard(self, *message_ids: str) -> None:
        with self._lock:
            self._ids.difference_update(message_ids)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._ids))


class HalfAttempts:
    """The attempts of one half message's send, each open here (``OpenTransactions``) from
    the moment it is built until the send ends. An attempt stored with its answer lost is
    sent again with the same id when it stays on its shard, and a check of it may arrive
    meanwhile (the first check comes ``transaction_timeout_seconds`` after the store; a
    send's retries can last longer). Asked of the listener or the decisions table, it would
    find no local transaction and answer ROLLBACK; the retry would then find the half still
    PREPARED, the answer not yet applied, and the caller, told a success, would commit a
    message that answer rolls back. Open here, it is answered IN_PROGRESS instead. An
    attempt the send moved away from or gave up on is abandoned (answered ROLLBACK, which
    ``answer_locally`` tells first)."""

    def __init__(self, open_here: OpenTransactions, build: Callable[[QueueRoute, str], common_pb2.Message]) -> None:
        self._open = open_here
        self._build = build
        self._ids: list[str] = []
        self._kept = ""

    def build(self, route: QueueRoute, message_id: str) -> common_pb2.Message:
        """``build`` for ``send_new``: the attempt is open here before it is sent."""
        pb = self._build(route, message_id)
        self._open.add(message_id)
        self._ids.append(message_id)
        return pb

    def keep(self, message_id: str) -> None:
        """The stored half stays open when the send ends (until its transaction ends: no
        moment between the send and its transaction when a check of it would not be
        answered IN_PROGRESS)."""
        self._kept = message_id

    def close(self) -> None:
        """The send ended: every attempt is closed here but the one kept."""
        self._open.discard(*(message_id for message_id in self._ids if message_id != self._kept))

    def __enter__(self) -> "HalfAttempts":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Ask(enum.Enum):
    """Who answers a check the producer cannot answer by itself."""
    DECISIONS = "the group's decisions table"
    CHECKER = "the checker (or the listener's check_local_transaction)"


def who_answers(producer: Any, message: TransactionMessage, has_checker: bool,
                ) -> "LocalTransactionState | InProgress | Ask":
    """A transaction producer's answer to a check (sync or asyncio alike), or whom to ask:
    ROLLBACK for an orphan of an attempt it gave up on; IN_PROGRESS while the transaction is
    open here; the decisions table for an anchored transaction; else its checker; UNKNOWN
    (logged) when it has none."""
    local = answer_locally(message, producer._abandoned, producer._open, producer.open_transaction_retry_seconds)
    if local is not None:
        return local
    if producer._decision_store is not None and is_anchored(message.properties):
        return Ask.DECISIONS
    if not has_checker:
        log.warning("check of transaction %s: not an anchored transaction and this producer has no "
                    "listener or checker: UNKNOWN", message.transaction_id)
        return LocalTransactionState.UNKNOWN
    return Ask.CHECKER


class ExplicitTransaction:
    """An explicit transaction's state (``begin_transaction``), sync or asyncio alike: its
    key, the half messages sent so far, and whether it ended. Not thread-safe (nor is a
    transaction meant for sharing between threads)."""

    def __init__(self, key: str) -> None:
        #: Stamped on each message (``message.transaction_key`` in checks).
        self.key = key
        self.halves: list[tuple[TransactionMessage, QueueRoute]] = []
        self.ended: LocalTransactionState | None = None

    def check_open(self) -> None:
        """Refuses a further send, commit or rollback once it ended."""
        if self.ended is not None:
            from_state = "COMMITTED" if self.ended is LocalTransactionState.COMMIT else "ROLLED_BACK"
            raise TransactionStateError(self.key, from_state, "a further send, commit or rollback")

    def end(self, decision: LocalTransactionState) -> list[tuple[TransactionMessage, QueueRoute]]:
        """Ends it with ``decision``: the halves to end."""
        self.check_open()
        self.ended = decision
        return list(self.halves)

    def on_exit(self, failed: bool) -> LocalTransactionState | None:
        """The decision a ``with`` block's end makes: COMMIT, ROLLBACK when it raised, none
        when it was ended inside the block."""
        if self.ended is not None:
            return None
        return LocalTransactionState.ROLLBACK if failed else LocalTransactionState.COMMIT
