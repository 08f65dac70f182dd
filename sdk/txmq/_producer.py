"""Producers: :class:`Producer` for normal messages and :class:`TransactionProducer` for the
half message + local transaction + EndTransaction protocol (RocketMQ's
``TransactionMQProducer.sendMessageInTransaction``).

Both send on the pipelined Produce stream of the broker they chose (see ``_produce_stream``), so
one producer shared by many threads keeps many sends in flight on one connection.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Sequence

from ._anchored import AnchoredTransaction, DecisionStore
from ._checks import CheckResponder, InProgress
from ._decisions import Address, Decisions, end_by_id, is_anchored
from ._global import GlobalTransactionResult, send_global
from ._tls import TLS
from ._client import Client, QueueRoute, positive
from ._errors import InvalidFieldError, NoLeaderError, TransactionStateError, TxmqError
from ._faults import RoutingStats
from ._names import in_namespace, validate_group
from ._produce_stream import LINGER_SECONDS
from ._sending import (Pick, Rebind, Request, Sleep, Step, configure, end_transaction, finished, half_builder,
                       outcome_of, pick_queue, run, send_new, validate)
from ._types import (TRANSACTION_KEY_PROPERTY, LocalTransactionState, Message, SendReceipt, TransactionMessage,
                     TransactionResult, TransactionState, message_to_pb)
from .v1 import broker_pb2, common_pb2

log = logging.getLogger(__name__)

#: The client's own body limit, the brokers' default ``max_body_bytes``.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
_HOST = socket.gethostname()


def new_client_id() -> str:
    """``host@pid@random``: unique per producer instance, readable in the checker's logs."""
    return f"{_HOST}@{os.getpid()}@{uuid.uuid4().hex[:12]}"


class Producer:
    """Sends normal messages. Thread-safe; share one per process and close it (or use it as
    a context manager).

    A send picks a queue of the topic round-robin, skipping the shards (brokers) that failed
    lately (the client's fault table, see ``txmq._faults``: a failing shard is avoided for
    a growing interval, then probed by one send before it takes traffic again), and creates
    the message id, which names that broker and queue. A transient failure
    (``err.retryable``: the broker or the connection unavailable, no answer in time) is
    retried, up to ``max_attempts`` attempts in all: on a queue of **another** shard with a
    new message id when one is usable (nothing was acknowledged, so the send is free to
    move), else on the same shard with the same id, which the broker deduplicates. The
    topic's route is asked again at the first such failure. ``send_timeout_seconds``
    bounds each attempt, and how long a send waits for its topic's route while the name
    servers answer none (a fail-over under way, or none reachable and no earlier route of
    the topic to use: the last route known is used while no name server answers).

    An attempt that failed may still have been stored (its answer was lost). A normal
    message moved to another shard may then exist twice, as in RocketMQ (consumers see
    at-least-once delivery anyway). A half message left behind is an orphan nobody
    commits: the transaction producer remembers the message ids it gave up on and answers
    that orphan's check ROLLBACK itself (see :class:`TransactionProducer`).

    Threads sharing a producer share one Produce stream per broker: under load their
    requests travel together, one stream message in flight at a time, and after an answer
    the next message waits up to ``linger_seconds`` for the threads that answer woke (0:
    never wait). An idle producer's request leaves at once.
    """

    def __init__(self, nameservers: str | Sequence[str], *, producer_group: str = "",
                 send_timeout_seconds: float = 3.0, max_attempts: int = 3,
                 retry_backoff_seconds: float = 0.1, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 request_timeout_seconds: float = 3.0, route_refresh_seconds: float = 30.0,
                 linger_seconds: float = LINGER_SECONDS, tls: TLS | None = None, token: str | None = None,
                 namespace: str = "") -> None:
        configure(self, producer_group=producer_group, send_timeout_seconds=send_timeout_seconds,
                  max_attempts=max_attempts, retry_backoff_seconds=retry_backoff_seconds, max_body_bytes=max_body_bytes,
                  namespace=namespace)
        if not isinstance(linger_seconds, (int, float)) or not 0 <= linger_seconds <= 1:
            raise InvalidFieldError("linger_seconds", f"must be between 0 and 1 second, got {linger_seconds!r}")
        self._client = Client(nameservers, request_timeout_seconds=request_timeout_seconds,
                              route_refresh_seconds=route_refresh_seconds, what="producer",
                              linger_seconds=float(linger_seconds), tls=tls, token=token)

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connections; sends still in flight fail with ClientClosedError."""
        self._client.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def routing_stats(self) -> RoutingStats:
        """The fault table's counters: sends rerouted to another shard, shards avoided now,
        and per shard its failures and send latency."""
        return self._client.faults.stats()

    # --- sending --------------------------------------------------------------------------

    def send(self, message: Message) -> SendReceipt:
        """Stores a normal message, visible to consumers at once. Raises the TxmqError the
        broker (or the client's own validation) refused it with."""
        message = self._validate(message)
        route, pb, response = self._send_new(message.topic, lambda route, message_id: message_to_pb(
            message, message_id, route.queue_id, common_pb2.MESSAGE_TYPE_NORMAL, int(time.time() * 1000), _HOST),
            message_group=message.message_group)
        return SendReceipt(message_id=response.message_id or pb.message_id, topic=message.topic,
                           broker_name=response.broker_name or route.broker_name,
                           queue_id=response.queue_id, queue_offset=response.queue_offset)

    def _validate(self, message: Message) -> Message:
        """What the broker would refuse anyway, refused before a round trip, with the same
        error; returns the message as it is sent (its topic in the producer's namespace)."""
        return validate(self, message)

    def _pick_queue(self, topic: str, exclude: frozenset[str] | set[str] = frozenset(),
                    message_group: str = "") -> QueueRoute:
        """The next queue round-robin whose shard the fault table does not avoid (and not in
        ``exclude``: the shards this send failed on). Queues of draining shards only when
        the topic has no other. A message group's queue is fixed (``_sending.pick_queue``)."""
        return pick_queue(self, self._client.route(topic), topic, exclude, message_group)

    def _rebind(self, topic: str, route: QueueRoute, address: str) -> str:
        """The current address of the broker a send is bound to (it may have moved)."""
        self._client.invalidate_route(topic)
        try:
            self._client.route(topic, refresh=True)
            return self._client.broker_address(route.broker_name)
        except NoLeaderError:
            raise  # the shard is between leaders: the send waits for one (``_sending.rebind``)
        except TxmqError as err:
            log.debug("cannot refresh the route of %s: %s", topic, err)
            return address

    def _request(self, shard: str, address: str, entry: broker_pb2.ProduceEntry,
                 *, send: bool = False, stream: bool = False) -> broker_pb2.ProduceResult:
        """One request on the Produce stream of ``address``, recorded in the fault table:
        a transient failure counts against ``shard``, any answer clears it (a send's
        latency is recorded too)."""
        started = time.monotonic()
        try:
            result = self._client.produce_stream(address).request(entry, self.send_timeout_seconds, stream=stream)
        except TxmqError as err:
            finished(self._client.faults, shard, err)
            raise
        finished(self._client.faults, shard, None, time.monotonic() - started if send else None)
        return result

    def _perform(self, step: Step) -> Any:
        """One step of a send (see ``_sending``), blocking."""
        if type(step) is Request:
            return self._request(step.shard, step.address, step.entry, send=step.send)
        if type(step) is Pick:
            return self._pick_queue(step.topic, step.exclude, step.message_group)
        if type(step) is Sleep:
            time.sleep(step.seconds)
            return None
        assert type(step) is Rebind
        return self._rebind(step.topic, step.route, step.address)

    def _send_new(self, topic: str, build: Callable[[QueueRoute, str], common_pb2.Message],
                  message_group: str = "") -> tuple[QueueRoute, common_pb2.Message, broker_pb2.SendMessageResponse]:
        """Sends a new message built by ``build(queue, message_id)`` on a queue the fault
        table picks; a transient failure moves it to another shard with a new id, or, with
        no other shard usable, retries it on the same one with the same id (see the class
        docstring, and ``_sending.send_new``). Returns the queue and message it was stored
        as, and the answer."""
        return run(send_new(self, topic, build, message_group), self._perform)


class TransactionListener(abc.ABC):
    """The application's side of a transaction (RocketMQ's ``TransactionListener``).

    ``execute_local_transaction`` runs the local transaction after the half message is
    stored; ``check_local_transaction`` answers the checker's question about a transaction
    nobody decided (the producer crashed, the EndTransaction was lost, or the answer was
    UNKNOWN). Record the local transaction's outcome under ``message.transaction_id`` (or
    your own business key in the message) so the check can find it.
    """

    @abc.abstractmethod
    def execute_local_transaction(self, message: TransactionMessage, arg: Any) -> LocalTransactionState:
        """Runs the local transaction. Returning None or raising counts as UNKNOWN."""

    @abc.abstractmethod
    def check_local_transaction(self, message: TransactionMessage) -> "LocalTransactionState | InProgress":
        """The state of the local transaction of ``message``, for the checker.

        Called on the producer's check worker pool (``check_threads`` threads), for any
        transaction of the group, not only those this instance sent (after a crash another
        instance answers). ``message`` is a :class:`txmq.CheckMessage` (a
        TransactionMessage plus the check's ``attempt``). Return COMMIT or ROLLBACK to
        decide; UNKNOWN (or None, or raise) to be asked again later, which spends one of
        the broker's ``check_max`` checks; or ``txmq.InProgress(retry_after_seconds=...)``
        when the local transaction is still running, which spends nothing and defers the
        next check (up to the broker's ``max_transaction_lifetime_seconds``).
        """


class TransactionProducer(Producer):
    """Sends messages in transactions: half message, local transaction, EndTransaction.

    ``producer_group`` names the group whose live producers answer checks;
    ``client_id`` names this instance (checks prefer the instance that sent the half
    message). Also sends normal messages with :meth:`send`.

    Checks: the producer opens a ``CheckTransactionState`` stream to every checker the
    name servers list (listed again every ``checker_refresh_seconds``, following checkers
    joining and leaving; a failed stream is opened again with backoff), takes no more
    checks than its ``check_threads`` threads can start soon (flow control), and answers
    each with ``listener.check_local_transaction`` on that pool; a check counts as received
    when a thread starts it. ``answer_checks=False`` makes an instance that only sends
    (its group's other instances answer). :meth:`close` unsubscribes: checks this instance
    has not started go to another instance at once.

    Orphans of a moved send: when a half message's attempt fails and the send moves to
    another shard (or fails), the attempt may have been stored before its answer was lost.
    Its local transaction never ran, so this instance answers that orphan's check ROLLBACK
    itself, without asking the listener (it remembers the message ids it gave up on, in
    memory, for 24 hours: ``txmq._faults.ABANDONED_KEEP_SECONDS``). If the process is gone by then, the check goes
    to another instance of the group and the listener decides: record the local
    transaction under ``message.transaction_id`` and answer by it, and the orphan (a
    transaction id no local transaction used) is rolled back; answering by a business key
    would commit it as a second copy of the message.

    Anchored transactions (``decisions=txmq.anchored.Decisions(...)``, then
    :meth:`transaction`): the decision is the database commit and checks are answered from
    the group's decisions table, with no listener (docs/anchored-transactions.md).
    """

    def __init__(self, nameservers: str | Sequence[str], *, producer_group: str,
                 listener: TransactionListener | None = None,
                 checker: "Callable[[TransactionMessage], LocalTransactionState | InProgress] | None" = None,
                 client_id: str | None = None,
                 send_timeout_seconds: float = 3.0, max_attempts: int = 3,
                 retry_backoff_seconds: float = 0.1, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 request_timeout_seconds: float = 3.0, route_refresh_seconds: float = 30.0,
                 answer_checks: bool = True, check_threads: int = 4,
                 checker_refresh_seconds: float = 5.0, linger_seconds: float = LINGER_SECONDS,
                 tls: TLS | None = None, token: str | None = None,
                 open_transaction_retry_seconds: float = 5.0, namespace: str = "",
                 decisions: "Decisions | None" = None) -> None:
        validate_group("producer_group", in_namespace(namespace, "producer_group", producer_group))
        if listener is None and checker is None and decisions is None:
            raise InvalidFieldError("listener", "give a listener (send_in_transaction), a checker "
                                    "(begin_transaction) or decisions (transaction): something must answer checks")
        if decisions is not None and not isinstance(decisions, Decisions):
            raise InvalidFieldError("decisions", f"must be a txmq.anchored.Decisions, got {type(decisions).__name__}")
        if listener is not None:
            for method in ("execute_local_transaction", "check_local_transaction"):
                if not callable(getattr(listener, method, None)):
                    raise InvalidFieldError("listener", f"has no method {method}()")
        if checker is not None and not callable(checker):
            raise InvalidFieldError("checker", "must be callable(message) -> LocalTransactionState | InProgress")
        if not isinstance(check_threads, int) or check_threads < 1:
            raise InvalidFieldError("check_threads", f"must be an integer >= 1, got {check_threads!r}")
        positive("checker_refresh_seconds", checker_refresh_seconds)
        if client_id is not None and not 0 < len(client_id.encode()) <= 255:
            raise InvalidFieldError("client_id", "must be 1-255 bytes")
        super().__init__(nameservers, producer_group=producer_group,
                         send_timeout_seconds=send_timeout_seconds, max_attempts=max_attempts,
                         retry_backoff_seconds=retry_backoff_seconds, max_body_bytes=max_body_bytes,
                         request_timeout_seconds=request_timeout_seconds,
                         route_refresh_seconds=route_refresh_seconds, linger_seconds=linger_seconds, tls=tls, token=token,
                         namespace=namespace)
        self.listener = listener
        self.checker = (checker if checker is not None else listener.check_local_transaction if listener is not None
                        else None)
        self.open_transaction_retry_seconds = positive("open_transaction_retry_seconds",
                                                       open_transaction_retry_seconds)
        self.client_id = client_id or new_client_id()
        # Half messages of explicit transactions still open in this process: message id → key.
        self._open: dict[str, str] = {}
        self._open_lock = threading.Lock()
        self._checks: CheckResponder | None = None
        #: Anchored transactions (``transaction()``): the group's decisions table.
        self._decision_store = DecisionStore(self, decisions) if decisions is not None else None
        if answer_checks:
            self._checks = CheckResponder(self._client, producer_group=self.producer_group,
                                          client_id=self.client_id, check=self._check_local_transaction,
                                          check_threads=check_threads,
                                          refresh_seconds=float(checker_refresh_seconds))
            self._checks.start()

    def __enter__(self) -> "TransactionProducer":
        return self

    def close(self) -> None:
        """Unsubscribes from the checkers, then closes the connections."""
        if self._checks is not None:
            self._checks.close()
        if self._decision_store is not None:
            self._decision_store.close()
        super().close()

    def connected_checkers(self) -> list[str]:
        """Names of the checkers whose stream is open and subscribed now (empty with
        ``answer_checks=False``)."""
        return self._checks.connected if self._checks is not None else []

    def _check_local_transaction(self, message: TransactionMessage) -> "LocalTransactionState | InProgress":
        """A check: ROLLBACK for an orphan of an attempt this producer gave up on (its local
        transaction never ran), else the listener's answer."""
        if message.message_id in self._abandoned:
            log.info("check of transaction %s: its half message %s was an attempt given up on, "
                     "the local transaction never ran: ROLLBACK", message.transaction_id, message.message_id)
            return LocalTransactionState.ROLLBACK
        with self._open_lock:
            still_open = message.message_id in self._open
        if still_open:
            # Its explicit transaction is still running here: neither commit nor rollback yet.
            return InProgress(retry_after_seconds=self.open_transaction_retry_seconds)
        if self._decision_store is not None and is_anchored(message.properties):
            return self._decision_store.check(message)
        if self.checker is None:
            log.warning("check of transaction %s: not an anchored transaction and this producer has no "
                        "listener or checker: UNKNOWN", message.transaction_id)
            return LocalTransactionState.UNKNOWN
        return self.checker(message)

    def send_in_transaction(self, message: "Message | Sequence[Message]",
                            arg: Any = None) -> "TransactionResult | GlobalTransactionResult":
        """Sends ``message`` as a half message, runs the local transaction, then ends the
        transaction with its outcome.

        Given a list (or tuple) of messages — on one topic or several, on one shard or
        several — sends them as one *multi-message transaction* and returns a
        :class:`txmq.GlobalTransactionResult`: every message becomes visible at the commit
        or none does (see ``txmq._global`` and the README, "Multi-message transactions").
        The listener sees the first message; its ``transaction_id`` is the global
        transaction's id, the one checks ask about.

        1. The half message is stored (invisible), on another shard if the first fails
           (see :class:`Producer`). If that fails the error is raised and the local
           transaction is **not** run.
        2. ``listener.execute_local_transaction(message, arg)`` runs on the calling thread;
           ``message`` is a :class:`TransactionMessage` carrying the transaction id. If it
           raises or returns None the outcome is UNKNOWN (the exception is logged).
        3. EndTransaction (COMMIT, ROLLBACK or UNKNOWN, source CLIENT), retried on transient
           errors. ``result.state`` is the broker's state after it (PREPARED after UNKNOWN).
           If it still fails after ``max_attempts``, this method does **not** raise: the
           transaction stays PREPARED and the checker resolves it later by asking the group;
           ``result.state`` is None and ``result.end_error`` says why (a warning is logged).
           If the transaction was already decided otherwise (the first decision wins),
           ``result.state`` is that decision and ``result.end_error`` the refusal.
        """
        if self.listener is None:
            raise InvalidFieldError("listener", "send_in_transaction needs a TransactionListener; "
                                    "with only a checker use begin_transaction()")
        if isinstance(message, (list, tuple)):
            return send_global(self, message, arg, _HOST)
        message = self._validate(message)
        half, route = self._send_half(message)
        local_state = self._execute(half, arg)
        state, end_error = self._end(route, message.topic, half, local_state)
        return TransactionResult(message_id=half.message_id, transaction_id=half.transaction_id,
                                 local_state=local_state, state=state, topic=message.topic,
                                 broker_name=half.broker_name, queue_id=route.queue_id, end_error=end_error)

    # --- anchored transactions ------------------------------------------------------------

    def transaction(self, connection: Any, *, end: str = "hint") -> AnchoredTransaction:
        """An anchored transaction on ``connection`` (a psycopg ``Connection``, a SQLAlchemy
        ``Session``, or a :class:`txmq.anchored.DBAPIConnection`), whose decision is its
        database commit (the producer needs ``decisions=``)::

            with producer.transaction(conn) as tx:
                tx.send(txmq.Message("orders", body))
                conn.execute("INSERT INTO orders ...")
            tx.result.state          # COMMITTED: decided by the database commit
            tx.result.acknowledged   # the broker has the COMMIT too (wait_acknowledged())

        The block begins the connection's transaction, whose first statement inserts the
        decision row; each ``tx.send`` sends a half message at once, in the background;
        the block's end waits for the halves to be stored, records their ids in the row,
        and commits. Then EndTransaction(COMMIT) goes without making the caller wait
        (``end="await"`` waits for it); a lost one is repaired from the row by a check.
        A half that fails rolls the local transaction back and is raised; the block
        raising rolls it back. Checks are answered from the decisions table by any
        instance of the group (docs/anchored-transactions.md)."""
        return AnchoredTransaction(self, connection, end)

    def _end_by_id(self, transaction_id: str, decision: LocalTransactionState,
                   deadline: float) -> tuple[TransactionState | None, TxmqError | None]:
        """EndTransaction of a transaction known by its id only, retried until ``deadline``
        (an anchored transaction's hint or a check's answer: on the Produce stream even when
        alone, no caller waits on it)."""
        def perform(step: Step) -> Any:
            if type(step) is Address:
                return self._client.broker_address(step.broker, refresh=step.refresh)
            if type(step) is Request:
                return self._request(step.shard, step.address, step.entry, stream=True)
            return self._perform(step)

        store = self._decision_store

        def clock() -> float:  # once the producer is closing, no more retries
            return math.inf if store is not None and store.closing else time.monotonic()

        return run(end_by_id(transaction_id, decision, self.producer_group, deadline, clock,
                             self.retry_backoff_seconds), perform)

    # --- the explicit form ----------------------------------------------------------------

    def begin_transaction(self, *, key: str | None = None) -> "Transaction":
        """Starts an explicit transaction (Kafka's and RocketMQ 5's form)::

            tx = producer.begin_transaction(key=order_id)
            producer.send(txmq.Message("orders", body), tx)    # half message: invisible
            db.commit_order(order_id)                           # your local transaction
            tx.commit()                                         # or tx.rollback()

        or ``with producer.begin_transaction(key=...) as tx:`` (commit at the end of the
        block, rollback if it raises).

        ``key`` (default: a random one) is stamped on every message of the transaction
        (``message.transaction_key`` in a check): record it in the same local database
        transaction as your work, so that the ``checker`` a check reaches — in this process
        or, after this process died mid-transaction, in another instance of the group —
        answers COMMIT when the record exists and ROLLBACK when it does not. While the
        transaction is open in this process, checks of its messages are answered
        IN_PROGRESS here without asking the checker (the broker prefers the instance that
        sent a half message, and retries after ``open_transaction_retry_seconds``).
        """
        if key is None:
            key = uuid.uuid4().hex
        if not isinstance(key, str) or not 0 < len(key.encode()) <= 255:
            raise InvalidFieldError("key", "must be 1-255 bytes")
        self._client.check_open()
        return Transaction(self, key)

    def send(self, message: Message, transaction: "Transaction | None" = None) -> SendReceipt:  # type: ignore[override]
        """A normal message, or with ``transaction`` a half message of that transaction
        (invisible until it commits)."""
        if transaction is None:
            return super().send(message)
        if not isinstance(transaction, Transaction) or transaction.producer is not self:
            raise InvalidFieldError("transaction", "must come from this producer's begin_transaction()")
        transaction._check_open()
        message = self._validate(message)
        keyed = dataclasses.replace(message, properties={**message.properties,
                                                         TRANSACTION_KEY_PROPERTY: transaction.key})
        half, route = self._send_half(keyed)
        with self._open_lock:
            self._open[half.message_id] = transaction.key
        transaction._add(half, route)  # noqa: SLF001
        return SendReceipt(message_id=half.message_id, topic=message.topic, broker_name=half.broker_name,
                           queue_id=route.queue_id, queue_offset=-1)

    def _close_transaction(self, halves: list[TransactionMessage]) -> None:
        with self._open_lock:
            for half in halves:
                self._open.pop(half.message_id, None)

    def _send_half(self, message: Message) -> tuple[TransactionMessage, QueueRoute]:
        """Stores ``message`` as a half message (see :class:`Producer` for retries)."""
        route, pb, sent = self._send_new(message.topic, half_builder(message, self.producer_group,
                                                                     self.client_id, _HOST),
                                         message_group=message.message_group)
        half = TransactionMessage(message=message, message_id=sent.message_id or pb.message_id,
                                  transaction_id=sent.transaction_id, broker_name=sent.broker_name or route.broker_name,
                                  queue_id=route.queue_id)
        return half, route

    def _execute(self, half: TransactionMessage, arg: Any) -> LocalTransactionState:
        try:
            state = self.listener.execute_local_transaction(half, arg)
        except Exception:  # noqa: BLE001 - the local transaction's failure is an answer: UNKNOWN
            log.exception("execute_local_transaction raised for transaction %s: ending it as UNKNOWN",
                          half.transaction_id)
            return LocalTransactionState.UNKNOWN
        return outcome_of(state, half.transaction_id)

    def _end(self, route: QueueRoute, topic: str, half: TransactionMessage,
             local_state: LocalTransactionState) -> tuple[TransactionState | None, TxmqError | None]:
        return run(end_transaction(self, route, topic, half, local_state, self.producer_group), self._perform)


class Transaction:
    """An explicit transaction of a :class:`TransactionProducer` (see
    :meth:`TransactionProducer.begin_transaction`). Its messages are half messages until
    :meth:`commit` or :meth:`rollback` ends them all. Not for sharing between threads."""

    def __init__(self, producer: TransactionProducer, key: str) -> None:
        self.producer = producer
        #: Stamped on each message (``message.transaction_key`` in checks).
        self.key = key
        self._halves: list[tuple[TransactionMessage, QueueRoute]] = []
        self._ended: LocalTransactionState | None = None

    @property
    def messages(self) -> list[TransactionMessage]:
        """The half messages sent so far, with their transaction ids."""
        return [h for h, _r in self._halves]

    def _check_open(self) -> None:
        if self._ended is not None:
            raise TransactionStateError(self.key, "COMMITTED" if self._ended is LocalTransactionState.COMMIT
                                        else "ROLLED_BACK", "a further send, commit or rollback")

    def _add(self, half: TransactionMessage, route: QueueRoute) -> None:
        self._halves.append((half, route))

    def commit(self) -> list[TransactionResult]:
        """Makes every message of the transaction visible. A message whose EndTransaction
        could not be delivered has ``state`` None (and ``end_error``): it stays PREPARED
        and the checker resolves it by asking the group (the record of ``key`` decides)."""
        return self._end(LocalTransactionState.COMMIT)

    def rollback(self) -> list[TransactionResult]:
        """Discards every message of the transaction (none is ever delivered)."""
        return self._end(LocalTransactionState.ROLLBACK)

    def _end(self, decision: LocalTransactionState) -> list[TransactionResult]:
        self._check_open()
        self._ended = decision
        results = []
        try:
            for half, route in self._halves:
                state, error = self.producer._end(route, half.topic, half, decision)  # noqa: SLF001
                results.append(TransactionResult(message_id=half.message_id, transaction_id=half.transaction_id,
                                                 local_state=decision, state=state, topic=half.topic,
                                                 broker_name=half.broker_name, queue_id=route.queue_id,
                                                 end_error=error))
        finally:
            self.producer._close_transaction(self.messages)  # noqa: SLF001
        return results

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._ended is not None:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()
