"""Producers: :class:`Producer` for normal messages and :class:`TransactionProducer` for the
half message + local transaction + EndTransaction protocol (RocketMQ's
``TransactionMQProducer.sendMessageInTransaction``).

Both send on the pipelined Produce stream of the broker they chose (see ``_produce_stream``), so
one producer shared by many threads keeps many sends in flight on one connection.
"""

from __future__ import annotations

import abc
import logging
import math
import time
from typing import Any, Callable, Sequence, overload

from . import _tracing as tracing
from ._anchored import AnchoredTransaction, DecisionStore
from ._calling import QueueRoute, positive
from ._checking import InProgress
from ._checks import CheckResponder
from ._client import Client
from ._decisions import Address, Decisions, end_by_id
from ._errors import InvalidFieldError, NoLeaderError, TxmqError
from ._faults import RoutingStats
from ._global import GlobalTransactionResult, send_global
from ._produce_stream import LINGER_SECONDS
from ._producing import (DEFAULT_MAX_BODY_BYTES, HOST, Ask, ExplicitTransaction, HalfAttempts, OpenTransactions,
                         check_transaction_options, executed, half_message, keyed, new_client_id, normal_builder,
                         receipt, transaction_key, transaction_result, who_answers)
from ._sending import (Pick, Rebind, Request, SenderOptions, Sleep, Step, configure, end_transaction, finished, half_builder,
                       pick_other, pick_queue, run, send_new, validate)
from ._tls import TLS
from ._types import LocalTransactionState, Message, SendReceipt, TransactionMessage, TransactionResult, TransactionState
from .v1 import broker_pb2, common_pb2

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Producer", "Transaction", "TransactionListener", "TransactionProducer",
           "new_client_id"]


class Producer(SenderOptions):
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
        with tracing.send(message, transactional=False) as traced:
            message = traced.inject(message)
            route, pb, response = self._send_new(message.topic, normal_builder(message),
                                                 message_group=message.message_group)
            sent = receipt(message, route, pb, response)
            tracing.sent(traced, message_id=sent.message_id, queue_id=sent.queue_id, broker_name=sent.broker_name)
        return sent

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
            if step.moving:
                return pick_other(self, self._client.route(step.topic), step.exclude)
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
        check_transaction_options(namespace=namespace, producer_group=producer_group, listener=listener,
                                  checker=checker, decisions=decisions, client_id=client_id,
                                  checker_refresh_seconds=checker_refresh_seconds, workers_name="check_threads",
                                  workers=check_threads, listener_method_ok=callable,
                                  listener_problem=lambda method: f"has no method {method}()")
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
        # Half messages of transactions still open in this process: their checks are IN_PROGRESS.
        self._open = OpenTransactions()
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
        transaction never ran), IN_PROGRESS while it is open here, else the decisions table's
        answer (anchored) or the checker's (``_producing.who_answers``)."""
        answer = who_answers(self, message, self.checker is not None)
        if answer is Ask.DECISIONS:
            assert self._decision_store is not None
            return self._decision_store.check(message)
        if answer is Ask.CHECKER:
            assert self.checker is not None
            return self.checker(message)
        return answer

    @overload
    def send_in_transaction(self, message: Message, arg: Any = None) -> TransactionResult: ...

    @overload
    def send_in_transaction(self, message: list[Message] | tuple[Message, ...],
                            arg: Any = None) -> GlobalTransactionResult: ...

    def send_in_transaction(self, message: Message | list[Message] | tuple[Message, ...],
                            arg: Any = None) -> TransactionResult | GlobalTransactionResult:
        """Sends ``message`` as a half message, runs the local transaction, then ends the
        transaction with its outcome.

        Given a list (or tuple) of messages — on one topic or several, on one shard or
        several — sends them as one *multi-message transaction* and returns a
        :class:`txmq.GlobalTransactionResult`: every message becomes visible at the commit
        or none does (see ``txmq._global`` and docs/howto/transactions.md, "Multi-message transactions").
        The listener sees the first message; its ``transaction_id`` is the global
        transaction's id, the one checks ask about.

        1. The half message is stored (invisible), on another shard if the first fails
           (see :class:`Producer`). If that fails the error is raised and the local
           transaction is **not** run.
        2. ``listener.execute_local_transaction(message, arg)`` runs on the calling thread;
           ``message`` is a :class:`TransactionMessage` carrying the transaction id. If it
           raises or returns None the outcome is UNKNOWN (the exception is logged). Until
           step 3 has sent the end, a check of the transaction reaching this producer is
           answered IN_PROGRESS without asking ``check_local_transaction``.
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
            return send_global(self, message, arg, HOST)
        message = self._validate(message)
        with tracing.send(message, transactional=True, client_id=self.client_id) as traced:
            # Open here until its end is sent: a check meanwhile (a local transaction that
            # outlasts transaction_timeout_seconds) is answered IN_PROGRESS, not asked of the
            # listener, whose lookup would find nothing committed yet.
            half, route = self._send_half(traced.inject(message), keep_open=True)
            try:
                tracing.sent(traced, message_id=half.message_id, queue_id=route.queue_id,
                             broker_name=half.broker_name, transaction_id=half.transaction_id)
                local_state, local_error = self._execute(half, arg, traced)
                state, end_error = self._end(route, message.topic, half, local_state, traced)
            finally:
                self._open.discard(half.message_id)
        return transaction_result(half, route, local_state, state, end_error, local_error)

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
                   deadline: float, *, hint: bool = True) -> tuple[TransactionState | None, TxmqError | None]:
        """EndTransaction of a transaction known by its id only, retried until ``deadline``
        (an anchored transaction's hint or a check's answer: on the Produce stream even when
        alone, no caller waits on it). ``hint=False``: a caller waits on it (``end="await"``),
        so it goes as any request, never lingering for one to share its message."""
        def perform(step: Step | Address) -> Any:
            if isinstance(step, Address):
                return self._client.broker_address(step.broker, refresh=step.refresh)
            if type(step) is Request:
                return self._request(step.shard, step.address, step.entry, stream=hint)
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
        key = transaction_key(key)
        self._client.check_open()
        return Transaction(self, key)

    def send(self, message: Message, transaction: "Transaction | None" = None) -> SendReceipt:
        """A normal message, or with ``transaction`` a half message of that transaction
        (invisible until it commits)."""
        if transaction is None:
            return super().send(message)
        if not isinstance(transaction, Transaction) or transaction.producer is not self:
            raise InvalidFieldError("transaction", "must come from this producer's begin_transaction()")
        transaction._check_open()
        message = self._validate(message)
        with tracing.send(message, transactional=True, client_id=self.client_id) as traced:
            half, route = self._send_half(keyed(traced.inject(message), transaction.key), keep_open=True)
            tracing.sent(traced, message_id=half.message_id, queue_id=route.queue_id, broker_name=half.broker_name,
                         transaction_id=half.transaction_id)
        transaction._add(half, route)
        return SendReceipt(message_id=half.message_id, topic=message.topic, broker_name=half.broker_name,
                           queue_id=route.queue_id, queue_offset=-1)

    def _close_transaction(self, halves: list[TransactionMessage]) -> None:
        self._open.discard(*(half.message_id for half in halves))

    def _send_half(self, message: Message, *, keep_open: bool = False) -> tuple[TransactionMessage, QueueRoute]:
        """Stores ``message`` as a half message (see :class:`Producer` for retries), each
        attempt open here while the send runs (:class:`HalfAttempts`); with ``keep_open``
        the stored one stays open."""
        with HalfAttempts(self._open, half_builder(message, self.producer_group, self.client_id, HOST)) as attempts:
            route, pb, sent = self._send_new(message.topic, attempts.build, message_group=message.message_group)
            if keep_open:
                attempts.keep(pb.message_id)
            return half_message(message, route, pb, sent), route

    def _execute(self, half: TransactionMessage, arg: Any,
                 traced: tracing.Operation = tracing.NOOP) -> tuple[LocalTransactionState, Exception | None]:
        """The local transaction's outcome, and the exception it raised (an outcome: UNKNOWN)."""
        assert self.listener is not None
        with tracing.local_transaction(traced, half) as local, local.current():
            try:
                returned = self.listener.execute_local_transaction(half, arg)
            except Exception as exc:  # noqa: BLE001 - the local transaction's failure is an answer: UNKNOWN
                local.fail(exc)
                return executed(None, exc, half.transaction_id), exc
        return executed(returned, None, half.transaction_id), None

    def _end(self, route: QueueRoute, topic: str, half: TransactionMessage, local_state: LocalTransactionState,
             traced: tracing.Operation | None = None) -> tuple[TransactionState | None, TxmqError | None]:
        with tracing.end(traced, half, local_state) as ending:
            state, error = run(end_transaction(self, route, topic, half, local_state, self.producer_group),
                               self._perform)
            tracing.ended(ending, state, error)
        return state, error


class Transaction:
    """An explicit transaction of a :class:`TransactionProducer` (see
    :meth:`TransactionProducer.begin_transaction`). Its messages are half messages until
    :meth:`commit` or :meth:`rollback` ends them all. Not for sharing between threads."""

    def __init__(self, producer: TransactionProducer, key: str) -> None:
        self.producer = producer
        self._state = ExplicitTransaction(key)
        #: Stamped on each message (``message.transaction_key`` in checks).
        self.key = key

    @property
    def messages(self) -> list[TransactionMessage]:
        """The half messages sent so far, with their transaction ids."""
        return [h for h, _r in self._state.halves]

    def _check_open(self) -> None:
        self._state.check_open()

    def _add(self, half: TransactionMessage, route: QueueRoute) -> None:
        self._state.halves.append((half, route))

    def commit(self) -> list[TransactionResult]:
        """Makes every message of the transaction visible. A message whose EndTransaction
        could not be delivered has ``state`` None (and ``end_error``): it stays PREPARED
        and the checker resolves it by asking the group (the record of ``key`` decides)."""
        return self._end(LocalTransactionState.COMMIT)

    def rollback(self) -> list[TransactionResult]:
        """Discards every message of the transaction (none is ever delivered)."""
        return self._end(LocalTransactionState.ROLLBACK)

    def _end(self, decision: LocalTransactionState) -> list[TransactionResult]:
        halves = self._state.end(decision)
        results = []
        try:
            for half, route in halves:
                state, error = self.producer._end(route, half.topic, half, decision)
                results.append(transaction_result(half, route, decision, state, error))
        finally:
            self.producer._close_transaction(self.messages)
        return results

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        decision = self._state.on_exit(exc_type is not None)
        if decision is not None:
            self._end(decision)
