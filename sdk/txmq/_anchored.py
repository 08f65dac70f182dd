"""Anchored transactions for the sync SDK: the decision protocol of ``txmq._decisions``
driven on the caller's database connection and on the producer's own ones.

    with producer.transaction(conn) as tx:      # BEGIN; INSERT the COMMIT row (first statement)
        tx.send(txmq.Message("orders", body))   # the half message leaves now, in the background
        conn.execute("INSERT INTO orders ...")  # the caller's work, overlapping the half's round trip
    # on exit: wait for the halves' durable acknowledgement, record their ids, COMMIT (the
    # decision), then EndTransaction(COMMIT) in the background; tx.result says COMMITTED.

Adapters turn a driver's connection into the few calls the protocol needs
(:class:`LocalConnection` for the caller's, :class:`StoreConnection` for the producer's):
psycopg 3 ``Connection``, SQLAlchemy 2 ``Session``, and any PostgreSQL DB-API connection
(:class:`DBAPIConnection`). psycopg and SQLAlchemy are imported only when used.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Generator, Protocol, TypeVar, cast

from . import _decisions as core
from . import _tracing as tracing
from ._checking import InProgress
from ._database import (DELETE_LINGER_SECONDS, STORE_PREPARE_THRESHOLD, as_sqlalchemy_error, begin_query, commit_query,
                        commit_sqlstate, committed_by, execute_simple, failpoint, failpoint_soon, folds_begin, lost,
                        module_of, named, pg_sqlstate, pool_kind, psycopg_under, raise_after_commit, session_folds_commit)
from ._errors import InvalidFieldError, TransactionStateError, TxmqError
from ._types import LocalTransactionState, Message, TransactionMessage, TransactionState

log = logging.getLogger(__name__)


class TransactionProducer(Protocol):
    """What an anchored transaction and its store need of ``txmq.TransactionProducer``
    (read through this protocol: the producer module imports this one)."""
    producer_group: str
    _client: Any
    _decision_store: "DecisionStore | None"

    def _validate(self, message: Message) -> Message: ...
    def _send_half(self, message: Message) -> tuple[TransactionMessage, Any]: ...
    def _end_by_id(self, transaction_id: str, decision: LocalTransactionState,
                   deadline: float, *, hint: bool = True) -> tuple[TransactionState | None, TxmqError | None]: ...

# --- results ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class AnchoredResult:
    """How an anchored transaction ended. ``state`` is the decision, taken by the database
    commit: COMMITTED (the broker makes the messages visible once its EndTransaction, or a
    check, reaches it) — the broker's acknowledgement of that is :attr:`acknowledged` /
    :meth:`wait_acknowledged`. ``end_error``: why the background EndTransaction gave up
    (the check then commits the messages from the decision row)."""

    transaction_key: str
    state: TransactionState
    messages: tuple[TransactionMessage, ...]
    _acked: threading.Event = dataclasses.field(default_factory=threading.Event, repr=False)
    _errors: list[TxmqError] = dataclasses.field(default_factory=list, repr=False)

    @property
    def acknowledged(self) -> bool:
        """Whether the broker acknowledged the COMMIT of every message."""
        return self._acked.is_set()

    @property
    def end_error(self) -> TxmqError | None:
        return self._errors[0] if self._errors else None

    def wait_acknowledged(self, timeout: float | None = None) -> bool:
        """Waits (at most ``timeout`` seconds) for :attr:`acknowledged`; returns it."""
        return self._acked.wait(timeout)


# --- the caller's connection --------------------------------------------------------------

class LocalConnection(Protocol):
    """The caller's connection as an anchored transaction uses it (the documented
    interface for other drivers; :class:`DBAPIConnection` covers PostgreSQL DB-API ones).

    ``execute`` runs a statement in the current transaction (beginning one if none);
    ``commit`` runs ``statement`` (when given) then COMMIT; ``rollback`` ends the
    transaction. ``sqlstate(error)`` is the SQLSTATE of an error one of them raised, or
    None when the connection was lost (then a COMMIT's outcome is unknown)."""

    def in_transaction(self) -> bool: ...
    def execute(self, statement: core.Statement) -> None: ...
    def commit(self, statement: core.Statement | None) -> None: ...
    def rollback(self) -> None: ...
    def sqlstate(self, error: BaseException) -> str | None: ...


class PsycopgConnection:
    """A psycopg 3 ``Connection`` (autocommit or not). Its own ``prepare_threshold`` applies
    (None for a server behind a transaction-pooling PgBouncer)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(self.conn.info.transaction_status != TransactionStatus.IDLE)

    def execute(self, statement: core.Statement) -> None:
        if folds_begin(self.conn):  # the connection's BEGIN with it: one round trip
            execute_simple(self.conn, begin_query(self.conn, statement))
        else:
            self.conn.execute(statement.sql, statement.params)

    def commit(self, statement: core.Statement | None) -> None:
        conn = self.conn
        try:
            if statement is not None and not conn.pgconn.pipeline_status:
                execute_simple(conn, commit_query(conn, statement))  # one round trip (txmq._database.commit_query)
                return
            if statement is not None:  # a pipeline takes one statement per query
                conn.execute(statement.sql, statement.params)
            conn.execute("COMMIT") if conn.autocommit else conn.commit()
        except BaseException:
            if statement is not None:
                rollback_after_error(self)  # a failed statement left the transaction aborted
            raise

    def rollback(self) -> None:
        if self.conn.autocommit:
            if self.in_transaction():
                self.conn.execute("ROLLBACK")
        else:
            self.conn.rollback()

    def sqlstate(self, error: BaseException) -> str | None:
        return pg_sqlstate(error, lost(self.conn))


class SQLAlchemySession:
    """A SQLAlchemy 2 ``Session`` (on a PostgreSQL engine). On psycopg 3 the decision row's
    statements travel as on a psycopg ``Connection``: the connection's BEGIN with the INSERT,
    the UPDATE with the COMMIT (after the Session's flush; ``Session.commit()`` then finds
    nothing left to send), three round trips where the Session's own statements make five
    (see ``txmq._database.session_folds_commit`` for when the COMMIT stays the Session's).
    Other drivers go through the Session's ``execute`` and ``commit``."""

    def __init__(self, session: Any) -> None:
        self.session = session
        #: What ``Session.commit()`` raised after the COMMIT the SDK sent (txmq._database.raise_after_commit).
        self.error_after_commit: BaseException | None = None

    def in_transaction(self) -> bool:
        return bool(self.session.in_transaction())

    def _send(self, statement: core.Statement, query: Callable[[Any, core.Statement], bytes]) -> bool:
        """``statement`` as ``query`` builds it, straight to the psycopg connection of the
        Session's transaction (which this begins in the Session, sending nothing); False
        when that is not psycopg, in pipeline mode, or (for the first statement) already
        inside a transaction."""
        sa_connection = self.session.connection()
        driver = psycopg_under(sa_connection)
        if driver is None or (query is begin_query and not folds_begin(driver)) or driver.pgconn.pipeline_status:
            return False
        sql = query(driver, statement)
        try:
            execute_simple(driver, sql)
        except BaseException as exc:
            raise as_sqlalchemy_error(sa_connection, driver, sql, exc) from exc
        return True

    def execute(self, statement: core.Statement) -> None:
        from sqlalchemy import text

        if not self._send(statement, begin_query):
            sql, params = named(statement)
            self.session.execute(text(sql), params)

    def commit(self, statement: core.Statement | None) -> None:
        session = self.session
        try:
            if statement is not None and session.in_transaction():
                session.flush()  # the caller's pending objects, inside the transaction
                if session_folds_commit(session) and self._send(statement, commit_query):
                    try:
                        session.commit()  # SQLAlchemy ends its transaction; psycopg has nothing left to send
                    except Exception as exc:  # noqa: BLE001 - its after_commit listeners: the database committed
                        self.error_after_commit = exc
                    return
            if statement is not None:
                self.execute(statement)
            with committed_by(session) as committed:
                try:
                    session.commit()
                except Exception as exc:
                    if not committed:
                        raise
                    self.error_after_commit = exc  # an after_commit listener's: the database committed
        except BaseException:
            rollback_after_error(self)  # the Session is usable again (SQLAlchemy wants a rollback first)
            raise

    def rollback(self) -> None:
        self.session.rollback()

    def sqlstate(self, error: BaseException) -> str | None:
        return pg_sqlstate(error, False)


class DBAPIConnection:
    """Any PostgreSQL DB-API 2.0 (PEP 249) connection: statements through ``cursor()``,
    ``commit()`` and ``rollback()``; ``paramstyle`` its module's (format, pyformat, qmark,
    numeric, or dollar for ``$1``). DB-API cannot tell whether a transaction is open:
    ``in_transaction`` (a callable) can; without it the caller vouches that none is when
    the block begins, and the adapter counts the one it began as open until it ends it. An
    error's SQLSTATE is read from ``error.sqlstate`` or ``error.pgcode`` unless
    ``sqlstate`` (a callable) says; ``lost(error)`` says whether the connection was lost."""

    def __init__(self, conn: Any, *, paramstyle: str = "format",
                 in_transaction: Callable[[], bool] | None = None,
                 sqlstate: Callable[[BaseException], str | None] | None = None,
                 lost: Callable[[BaseException], bool] | None = None) -> None:
        core.placeholders("", paramstyle)  # validates it
        self.conn = conn
        self.paramstyle = paramstyle
        self._in_transaction = in_transaction
        self._sqlstate = sqlstate
        self._lost = lost
        self._open = False

    def in_transaction(self) -> bool:
        return bool(self._in_transaction()) if self._in_transaction is not None else self._open

    def run(self, statement: core.Statement) -> list[tuple[Any, ...]]:
        cursor = self.conn.cursor()
        try:
            cursor.execute(core.placeholders(statement.sql, self.paramstyle), statement.params)
            return [tuple(r) for r in cursor.fetchall()] if statement.rows else []
        finally:
            cursor.close()

    def execute(self, statement: core.Statement) -> None:
        self._open = True  # DB-API begins a transaction at the first statement
        self.run(statement)

    def commit(self, statement: core.Statement | None) -> None:
        try:
            if statement is not None:
                self.run(statement)
            self.conn.commit()
        except BaseException:
            if statement is not None:
                rollback_after_error(self)  # a failed statement left the transaction aborted
            raise
        finally:
            self._open = False

    def rollback(self) -> None:
        self._open = False
        self.conn.rollback()

    def sqlstate(self, error: BaseException) -> str | None:
        if self._sqlstate is not None:
            return self._sqlstate(error)
        lost = self._lost(error) if self._lost is not None else bool(getattr(self.conn, "closed", False))
        return pg_sqlstate(error, lost)


def rollback_after_error(db: LocalConnection) -> None:
    """After a statement of the commit failed: the transaction rolled back, so that the
    caller's connection is usable again; the statement's error is the one to report."""
    try:
        db.rollback()
    except Exception:  # noqa: BLE001 - a lost connection rolls back on the server anyway
        pass


def local_connection(conn: Any) -> LocalConnection:
    """The adapter of a caller's connection (psycopg, SQLAlchemy, or one already adapted)."""
    if isinstance(conn, (PsycopgConnection, SQLAlchemySession, DBAPIConnection)):
        return conn
    module = module_of(conn)
    if module == "psycopg" and hasattr(conn, "pipeline") and not _is_coroutine_api(conn):
        return PsycopgConnection(conn)
    if module == "sqlalchemy" and hasattr(conn, "in_transaction") and hasattr(conn, "commit"):
        return SQLAlchemySession(conn)
    if all(callable(getattr(conn, m, None)) for m in ("in_transaction", "execute", "commit", "rollback", "sqlstate")):
        return cast(LocalConnection, conn)  # already a LocalConnection
    raise InvalidFieldError("connection", f"a psycopg Connection, a SQLAlchemy Session or a "
                                          f"txmq.anchored.DBAPIConnection, got {type(conn).__name__}")


def _is_coroutine_api(conn: Any) -> bool:
    return inspect.iscoroutinefunction(getattr(conn, "commit", None))


# --- the producer's own connections -------------------------------------------------------

class StoreConnection:
    """A connection of the producer's own, each statement in a transaction of its own."""

    def __init__(self, run: Callable[[core.Statement], list[tuple[Any, ...]]], close: Callable[[], None],
                 sqlstate: Callable[[BaseException], str | None]) -> None:
        self.run = run
        self.close = close
        self.sqlstate = sqlstate


def _psycopg_store(conn: Any) -> StoreConnection:
    conn.autocommit = True
    conn.prepare_threshold = STORE_PREPARE_THRESHOLD

    def run(statement: core.Statement) -> list[tuple[Any, ...]]:
        cursor = conn.execute(statement.sql, statement.params)
        return cursor.fetchall() if statement.rows else []

    return StoreConnection(run, conn.close, lambda e: pg_sqlstate(e, lost(conn)))


def _pooled_store(pool: Any) -> StoreConnection:
    """Statements on connections a psycopg_pool ``ConnectionPool`` lends for each one (its
    own transaction, committed as the pool's context ends; given back at once). Never
    prepared on the server; the pool's connections are otherwise as the pool makes them."""
    def run(statement: core.Statement) -> list[tuple[Any, ...]]:
        with pool.connection() as conn:
            cursor = conn.execute(statement.sql, statement.params, prepare=False)
            return cursor.fetchall() if statement.rows else []

    # No SQLSTATE (a lost connection, the pool's timeout): the pool replaces what broke.
    return StoreConnection(run, lambda: None, lambda e: pg_sqlstate(e, False))


def open_store_connection(source: Any) -> StoreConnection:
    """A new connection from a :class:`txmq.anchored.Decisions` source."""
    if isinstance(source, str):
        import psycopg

        return _psycopg_store(psycopg.connect(source, autocommit=True))
    if pool_kind(source) == "sync":
        return _pooled_store(source)
    if module_of(source) == "sqlalchemy" and hasattr(source, "connect"):
        from sqlalchemy import text

        conn = source.connect().execution_options(isolation_level="AUTOCOMMIT")

        def run(statement: core.Statement) -> list[tuple[Any, ...]]:
            sql, params = named(statement)
            result = conn.execute(text(sql), params)
            return [tuple(r) for r in result.fetchall()] if statement.rows else []

        return StoreConnection(run, conn.close, lambda e: pg_sqlstate(e, bool(getattr(e, "connection_invalidated",
                                                                                   False))))
    if callable(source):
        conn = source()
        if module_of(conn) == "psycopg":
            return _psycopg_store(conn)
        dbapi = conn if isinstance(conn, DBAPIConnection) else DBAPIConnection(conn)

        def run_dbapi(statement: core.Statement) -> list[tuple[Any, ...]]:
            try:
                rows = dbapi.run(statement)
                dbapi.conn.commit()
                return rows
            except BaseException:
                try:
                    dbapi.conn.rollback()
                except Exception:  # noqa: BLE001 - the first error is the one to report
                    pass
                raise

        return StoreConnection(run_dbapi, dbapi.conn.close, dbapi.sqlstate)
    raise InvalidFieldError("source", f"a connection string, a SQLAlchemy Engine, a psycopg_pool ConnectionPool or "
                                      f"a connection factory, got {type(source).__name__}")


class _Pool:
    """The producer's own connections, opened when needed and kept while they work."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._idle: list[StoreConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def run(self, statement: core.Statement) -> list[tuple[Any, ...]]:
        """Runs ``statement`` on an idle connection (a new one if none); a failure raises
        :class:`core.DatabaseError` and drops the connection when it was lost."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                conn = open_store_connection(self.source)
        except Exception as exc:  # the database is unreachable
            raise core.DatabaseError(None, exc) from exc
        try:
            rows = conn.run(statement)
        except Exception as exc:  # classified, then the caller decides
            state = conn.sqlstate(exc)
            if state is None or state == "client":
                self._discard(conn)
            else:
                self._give_back(conn)
            raise core.DatabaseError(state if state != "client" else None, exc) from exc
        self._give_back(conn)
        return rows

    def _give_back(self, conn: StoreConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        self._discard(conn)

    @staticmethod
    def _discard(conn: StoreConnection) -> None:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - it is broken already
            pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            self._discard(conn)


# --- the store: checks, ends, deletes, sweeps ---------------------------------------------

class DecisionStore:
    """A producer's side of its group's decisions table: answers checks from it, ends the
    halves a COMMIT row lists, deletes COMMIT rows once acknowledged (in batches) and
    sweeps (fences past retention; COMMIT rows left behind, repaired)."""

    def __init__(self, producer: "TransactionProducer", decisions: core.Decisions) -> None:
        self.producer = producer
        self.settings = decisions.settings
        self.group = producer.producer_group
        self.pool = _Pool(decisions.source)
        self._acked: list[str] = []
        self._wake = threading.Condition()
        self._stop = False
        #: Keys of anchored transactions open in this process (checks: IN_PROGRESS here).
        self.open_keys: set[str] = set()
        #: Halves and ends in the background (threads made as needed, up to this many).
        self.ends = ThreadPoolExecutor(max_workers=32, thread_name_prefix="txmq-anchored")
        #: Set by close(): ends in flight stop retrying (the checks repair what they leave).
        self.closing = False
        self._thread = threading.Thread(target=self._run, name="txmq-decisions", daemon=True)
        self._thread.start()

    # checks
    def check(self, message: TransactionMessage) -> "LocalTransactionState | InProgress":
        key = core.transaction_key_of(message.properties)
        if key in self.open_keys:
            return InProgress(retry_after_seconds=self.settings.in_progress_retry_seconds)
        verdict = drive(core.answer_check(self.settings, self.group, key, message.transaction_id), self.perform)
        log.debug("check of %s (key %s): %s (%s)", message.transaction_id, key, verdict.answer, verdict.source.value)
        return verdict.answer

    def perform(self, step: Any, *, hint: bool = True) -> Any:
        """One step of the store's flows (``core.answer_check``, ``acknowledge``, ``sweep``),
        blocking; ``hint``: its ends are hints nobody waits on (not an ``end="await"``)."""
        if type(step) is core.Statement:
            return self.pool.run(step)
        if type(step) is core.Ends:
            deadline = time.monotonic() + step.seconds
            return [self.producer._end_by_id(t, step.decision, deadline, hint=hint)
                    for t in step.transaction_ids]
        assert type(step) is core.Acknowledged, step
        self.acknowledged(step.key)
        return None

    # deletes
    def acknowledged(self, key: str) -> None:
        with self._wake:
            self._acked.append(key)
            if len(self._acked) in (1, self.settings.delete_batch):
                self._wake.notify()

    def _run(self) -> None:
        """Idle until a key is acknowledged or the next sweep is due; then gathers keys for
        ``DELETE_LINGER_SECONDS`` (or a full batch) and deletes them in one statement."""
        next_sweep = time.monotonic() + self.settings.sweep_interval_seconds
        while True:
            with self._wake:
                if not self._stop and not self._acked:
                    self._wake.wait(max(0.0, next_sweep - time.monotonic()))
                if not self._stop and self._acked and len(self._acked) < self.settings.delete_batch:
                    self._wake.wait(DELETE_LINGER_SECONDS)
                keys, self._acked = self._acked, []
                stop = self._stop
            if keys:
                self._delete(keys)
            if stop:
                return
            if time.monotonic() >= next_sweep:
                drive(core.sweep(self.settings, self.group), self.perform)
                next_sweep = time.monotonic() + self.settings.sweep_interval_seconds

    def _delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), self.settings.delete_batch):
            batch = keys[i:i + self.settings.delete_batch]
            try:
                self.pool.run(core.delete_acknowledged_statement(self.settings, self.group, batch))
            except core.DatabaseError as err:
                # Left for the sweeper: it commits their halves again (idempotent) and deletes them.
                log.warning("cannot delete %d acknowledged decision rows (the sweep repairs them): %s",
                            len(batch), err)

    def close(self) -> None:
        """Lets the ends in flight finish without retrying (their rows are deleted), then stops."""
        self.closing = True
        self.ends.shutdown(wait=True)
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=10)
        self.pool.close()


R = TypeVar("R")


def drive(steps: Generator[Any, Any, R], perform: Callable[[Any], Any]) -> R:
    """Drives a flow of ``txmq._decisions`` with a blocking ``perform``; a DatabaseError
    it raises is thrown into the flow."""
    value: Any = None
    error: core.DatabaseError | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            outcome: R = done.value
            return outcome
        value = error = None
        try:
            value = perform(step)
        except core.DatabaseError as err:
            error = err


# --- the transaction ----------------------------------------------------------------------

class AnchoredTransaction:
    """One anchored transaction on the caller's connection (see the module docstring and
    :meth:`txmq.TransactionProducer.transaction`). Not for sharing between threads."""

    def __init__(self, producer: "TransactionProducer", conn: Any, end: str) -> None:
        if end not in ("hint", "await"):
            raise InvalidFieldError("end", f"must be 'hint' or 'await', got {end!r}")
        store = producer._decision_store
        if store is None:
            raise InvalidFieldError("decisions", "producer.transaction() needs a producer made with decisions=")
        self.producer = producer
        self.store = store
        self.db = local_connection(conn)
        self.end = end
        self.plan = core.Plan(store.settings, producer.producer_group)
        self._halves: list[Future[Any]] = []
        self._entered = False
        self._done = False
        #: Set when the block ends: the decision and the broker's acknowledgement.
        self.result: AnchoredResult | None = None

    @property
    def key(self) -> str:
        """The transaction key (stamped on every message; the decision row's key)."""
        return self.plan.key

    def __enter__(self) -> "AnchoredTransaction":
        if self._entered:
            raise InvalidFieldError("transaction", "already entered")
        self.producer._client.check_open()
        if self.db.in_transaction():
            raise InvalidFieldError("connection", "is inside a transaction: an anchored transaction must be the "
                                                  "outermost one (its COMMIT is the decision); commit or roll back first")
        self._entered = True
        self.store.open_keys.add(self.plan.key)
        try:
            self.db.execute(self.plan.begin())
        except BaseException:
            self.store.open_keys.discard(self.plan.key)
            self._rollback_quietly()
            raise
        failpoint("begin.after")
        return self

    def send(self, message: Message) -> "Future[TransactionMessage]":
        """Sends ``message`` as a half message of this transaction, in the background; the
        block's end waits for its durable acknowledgement (a failure rolls the local
        transaction back and is raised there). Returns a future of the stored half."""
        if not self._entered or self._done:
            raise InvalidFieldError("transaction", "send() belongs inside the `with` block")
        message = self.producer._validate(message)
        traced = tracing.send(message, transactional=True)
        message = traced.inject(message)
        keyed = dataclasses.replace(message, properties=self.plan.properties(message.properties))
        future = self.store.ends.submit(self._send_half, keyed, traced)
        self._halves.append(future)
        return future

    def _send_half(self, message: Message, traced: tracing.Operation) -> TransactionMessage:
        with traced:
            half, route = self.producer._send_half(message)
            tracing.sent(traced, message_id=half.message_id, queue_id=route.queue_id, broker_name=half.broker_name,
                         transaction_id=half.transaction_id)
        failpoint("half.after")
        return half

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._done = True
        try:
            if exc_type is not None:
                self._abort()
                return
            self._commit()
        finally:
            self.store.open_keys.discard(self.plan.key)


    def perform(self, step: Any) -> Any:
        """One step of ``core.closing`` on the caller's connection, blocking."""
        kind = type(step)
        if kind is core.AwaitHalves:
            return [_outcome(f) for f in self._halves]
        if kind is core.Commit:
            failpoint("commit.before")
            try:
                self.db.commit(step.statement)
            except Exception as exc:
                raise core.DatabaseError(commit_sqlstate(self.db, exc), exc) from exc
            return None
        if kind is core.Rollback:
            self._rollback_quietly()
            return None
        if kind is core.InTransaction:
            return self.db.in_transaction()
        if kind is core.Settle:
            try:
                self.store.ends.submit(drive, step.steps, self.store.perform)
            except RuntimeError:
                pass  # shutting down: the checks decide
            return None
        assert kind is core.Hint, step
        for transaction_id in step.transaction_ids:
            try:
                self.store.ends.submit(self._end_quietly, transaction_id, step.decision)
            except RuntimeError:
                pass  # shutting down: the check decides
        return None

    def _abort(self) -> None:
        drive(core.closing(self.plan, raised=True), self.perform)

    def _end_quietly(self, transaction_id: str, decision: LocalTransactionState) -> None:
        self.producer._end_by_id(transaction_id, decision, time.monotonic() + core.END_RETRY_SECONDS)

    def _rollback_quietly(self) -> None:
        try:
            self.db.rollback()
        except Exception as err:  # noqa: BLE001 - a lost connection rolls back on the server anyway
            log.debug("rollback of anchored transaction %s failed: %s", self.plan.key, err)

    def _commit(self) -> None:
        closed = drive(core.closing(self.plan, raised=False), self.perform)
        if closed.outcome is not core.Outcome.COMMITTED:  # rolled back, before or at COMMIT, or UNKNOWN
            error = closed.error
            assert error is not None  # every other ending carries its error (core.closing)
            if closed.outcome is core.Outcome.UNKNOWN:
                log.warning("anchored transaction %s: the COMMIT's answer was lost; the checks decide its "
                            "%d message(s) from the decisions table", self.plan.key, len(closed.halves))
            raise error
        failpoint("commit.after")
        self.result = result = AnchoredResult(self.plan.key, TransactionState.COMMITTED, closed.halves)
        if closed.halves:
            ending = self.store.ends.submit(self._end_committed, result)
            if self.end == "await":
                ending.result()
        else:
            result._acked.set()
        raise_after_commit(self.db)

    def _end_committed(self, result: AnchoredResult) -> None:
        acked, errors = drive(core.acknowledge(result.transaction_key,
                                               [h.transaction_id for h in result.messages]), self._perform_end)
        result._errors.extend(errors)
        for error in errors:
            if isinstance(error, TransactionStateError):
                log.error("anchored transaction %s committed in the database but the broker refused its "
                          "COMMIT: %s", result.transaction_key, error)
        if acked:
            result._acked.set()

    def _perform_end(self, step: Any) -> Any:
        if type(step) is core.Ends:
            failpoint_soon("end.inflight")
        elif type(step) is core.Acknowledged:
            failpoint("end.after")
        return self.store.perform(step, hint=self.end == "hint")  # "await": the caller waits on it


def _outcome(future: "Future[TransactionMessage]") -> tuple[Any, BaseException | None]:
    try:
        return future.result(), None
    except BaseException as exc:  # noqa: BLE001 - the first failure is raised by the caller
        return None, exc
