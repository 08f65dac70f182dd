"""Anchored transactions for asyncio: the flows of ``txmq._decisions`` awaited on the
caller's ``psycopg.AsyncConnection`` / SQLAlchemy ``AsyncSession`` and on the producer's
own connections (the design of ``txmq._anchored``; read its docstring first)::

    async with producer.transaction(conn) as tx:      # BEGIN; INSERT the COMMIT row
        tx.send(txmq.Message("orders", body))         # the half leaves now (a task)
        await conn.execute("INSERT INTO orders ...")   # overlapping the half's round trip
    tx.result.state                                   # COMMITTED: the database commit decided
    await tx.result.wait_acknowledged()               # the broker has it too
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from typing import Any, Awaitable, Callable, Generator, Protocol, TypeVar

from .. import _decisions as core
from .. import _tracing as tracing
from .._database import (DELETE_LINGER_SECONDS, STORE_PREPARE_THRESHOLD, as_sqlalchemy_error, begin_query,
                         commit_query, commit_sqlstate, committed_by, failpoint, failpoint_soon, folds_begin, lost,
                         module_of, named, pg_sqlstate, pool_kind, psycopg_under, raise_after_commit, raise_failed,
                         session_folds_commit)
from .._checking import InProgress
from .._errors import InvalidFieldError, TransactionStateError, TxmqError
from .._types import LocalTransactionState, Message, TransactionMessage, TransactionState

log = logging.getLogger(__name__)


class AsyncTransactionProducer(Protocol):
    """What an anchored transaction and its store need of ``txmq.aio.AsyncTransactionProducer``
    (read through this protocol: the producer module imports this one)."""
    producer_group: str
    _client: Any
    _decision_store: "AsyncDecisionStore | None"

    def _validate(self, message: Message) -> Message: ...
    async def _send_half(self, message: Message) -> TransactionMessage: ...
    async def _end_by_id(self, transaction_id: str, decision: LocalTransactionState,
                         deadline: float, *, hint: bool = True) -> tuple[TransactionState | None, TxmqError | None]: ...


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class AsyncAnchoredResult:
    """How an anchored transaction ended (see :class:`txmq.anchored.AnchoredResult`);
    :meth:`wait_acknowledged` is a coroutine."""

    transaction_key: str
    state: TransactionState
    messages: tuple[TransactionMessage, ...]
    _acked: asyncio.Event = dataclasses.field(default_factory=asyncio.Event, repr=False)
    _errors: list[TxmqError] = dataclasses.field(default_factory=list, repr=False)

    @property
    def acknowledged(self) -> bool:
        return self._acked.is_set()

    @property
    def end_error(self) -> TxmqError | None:
        return self._errors[0] if self._errors else None

    async def wait_acknowledged(self, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self._acked.wait(), timeout)
        except TimeoutError:
            pass
        return self._acked.is_set()


# --- the caller's connection --------------------------------------------------------------

async def execute_simple(conn: Any, query: bytes) -> None:
    """``txmq._database.execute_simple`` on a psycopg ``AsyncConnection``."""
    from psycopg import generators

    async with conn.lock:
        conn.pgconn.send_query(query)
        results = await conn.wait(generators.execute(conn.pgconn))
    raise_failed(conn, results)


class AsyncPsycopgConnection:
    """A psycopg 3 ``AsyncConnection``."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(self.conn.info.transaction_status != TransactionStatus.IDLE)

    async def execute(self, statement: core.Statement) -> None:
        if folds_begin(self.conn):  # the connection's BEGIN with it: one round trip
            await execute_simple(self.conn, begin_query(self.conn, statement))
        else:
            await self.conn.execute(statement.sql, statement.params)

    async def commit(self, statement: core.Statement | None) -> None:
        conn = self.conn
        try:
            if statement is not None and not conn.pgconn.pipeline_status:
                await execute_simple(conn, commit_query(conn, statement))  # one round trip (txmq._database.commit_query)
                return
            if statement is not None:  # a pipeline takes one statement per query
                await conn.execute(statement.sql, statement.params)
            await (conn.execute("COMMIT") if conn.autocommit else conn.commit())
        except BaseException:
            if statement is not None:
                await rollback_after_error(self)  # a failed statement left the transaction aborted
            raise

    async def rollback(self) -> None:
        if self.conn.autocommit:
            if self.in_transaction():
                await self.conn.execute("ROLLBACK")
        else:
            await self.conn.rollback()

    def sqlstate(self, error: BaseException) -> str | None:
        return pg_sqlstate(error, lost(self.conn))


class AsyncSQLAlchemySession:
    """A SQLAlchemy 2 ``AsyncSession`` (on a PostgreSQL async engine); on psycopg 3 its
    decision row's statements travel as :class:`txmq.anchored.SQLAlchemySession` sends them
    (three round trips)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        #: What ``Session.commit()`` raised after the COMMIT the SDK sent (txmq._database.raise_after_commit).
        self.error_after_commit: BaseException | None = None

    def in_transaction(self) -> bool:
        return bool(self.session.in_transaction())

    async def _send(self, statement: core.Statement, query: Callable[[Any, core.Statement], bytes]) -> bool:
        """``txmq.anchored.SQLAlchemySession._send``, awaited."""
        sa_connection = (await self.session.connection()).sync_connection
        driver = psycopg_under(sa_connection)
        if driver is None or (query is begin_query and not folds_begin(driver)) or driver.pgconn.pipeline_status:
            return False
        sql = query(driver, statement)
        try:
            await execute_simple(driver, sql)
        except BaseException as exc:
            raise as_sqlalchemy_error(sa_connection, driver, sql, exc) from exc
        return True

    async def execute(self, statement: core.Statement) -> None:
        from sqlalchemy import text

        if not await self._send(statement, begin_query):
            sql, params = named(statement)
            await self.session.execute(text(sql), params)

    async def commit(self, statement: core.Statement | None) -> None:
        session = self.session
        try:
            if statement is not None and session.in_transaction():
                await session.flush()  # the caller's pending objects, inside the transaction
                if session_folds_commit(session.sync_session) and await self._send(statement, commit_query):
                    try:
                        await session.commit()  # SQLAlchemy ends its transaction; psycopg has nothing left to send
                    except Exception as exc:  # noqa: BLE001 - its after_commit listeners: the database committed
                        self.error_after_commit = exc
                    return
            if statement is not None:
                await self.execute(statement)
            with committed_by(session.sync_session) as committed:
                try:
                    await session.commit()
                except Exception as exc:
                    if not committed:
                        raise
                    self.error_after_commit = exc  # an after_commit listener's: the database committed
        except BaseException:
            await rollback_after_error(self)  # the Session is usable again (SQLAlchemy wants a rollback first)
            raise

    async def rollback(self) -> None:
        await self.session.rollback()

    def sqlstate(self, error: BaseException) -> str | None:
        return pg_sqlstate(error, False)


async def rollback_after_error(db: Any) -> None:
    """After a statement of the commit failed: the transaction rolled back, so that the
    caller's connection is usable again; the statement's error is the one to report."""
    try:
        await db.rollback()
    except Exception:  # noqa: BLE001 - a lost connection rolls back on the server anyway
        pass


def async_local_connection(conn: Any) -> Any:
    if isinstance(conn, (AsyncPsycopgConnection, AsyncSQLAlchemySession)):
        return conn
    module = module_of(conn)
    if module == "psycopg" and inspect.iscoroutinefunction(getattr(conn, "commit", None)):
        return AsyncPsycopgConnection(conn)
    if module == "sqlalchemy" and inspect.iscoroutinefunction(getattr(conn, "commit", None)):
        return AsyncSQLAlchemySession(conn)
    if all(callable(getattr(conn, m, None)) for m in ("in_transaction", "execute", "commit", "rollback", "sqlstate")):
        return conn
    raise InvalidFieldError("connection", f"a psycopg AsyncConnection or a SQLAlchemy AsyncSession, "
                                          f"got {type(conn).__name__}")


# --- the producer's own connections -------------------------------------------------------

class _AsyncStoreConnection:
    def __init__(self, run: Callable[[core.Statement], Awaitable[list[tuple[Any, ...]]]],
                 close: Callable[[], Awaitable[None]], sqlstate: Callable[[BaseException], str | None]) -> None:
        self.run = run
        self.close = close
        self.sqlstate = sqlstate


def _psycopg_async_store(conn: Any) -> _AsyncStoreConnection:
    conn.prepare_threshold = STORE_PREPARE_THRESHOLD
    async def run(statement: core.Statement) -> list[tuple[Any, ...]]:
        cursor = await conn.execute(statement.sql, statement.params)
        return await cursor.fetchall() if statement.rows else []

    return _AsyncStoreConnection(run, conn.close, lambda e: pg_sqlstate(e, lost(conn)))


def _pooled_async_store(pool: Any) -> _AsyncStoreConnection:
    """``txmq._anchored._pooled_store`` on a psycopg_pool ``AsyncConnectionPool``."""
    async def run(statement: core.Statement) -> list[tuple[Any, ...]]:
        async with pool.connection() as conn:
            cursor = await conn.execute(statement.sql, statement.params, prepare=False)
            return await cursor.fetchall() if statement.rows else []

    async def close() -> None:
        pass

    return _AsyncStoreConnection(run, close, lambda e: pg_sqlstate(e, False))


async def open_async_store_connection(source: Any) -> _AsyncStoreConnection:
    if pool_kind(source) == "async":
        return _pooled_async_store(source)
    if isinstance(source, str):
        import psycopg

        return _psycopg_async_store(await psycopg.AsyncConnection.connect(source, autocommit=True))
    if module_of(source) == "sqlalchemy" and hasattr(source, "connect"):
        from sqlalchemy import text

        conn = await source.connect()
        options = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn = await options if inspect.isawaitable(options) else options

        async def run(statement: core.Statement) -> list[tuple[Any, ...]]:
            sql, params = named(statement)
            result = await conn.execute(text(sql), params)
            return [tuple(r) for r in result.fetchall()] if statement.rows else []

        return _AsyncStoreConnection(run, conn.close, lambda e: pg_sqlstate(
            e, bool(getattr(e, "connection_invalidated", False))))
    if callable(source):
        conn = source()
        if inspect.isawaitable(conn):
            conn = await conn
        if module_of(conn) == "psycopg":
            await conn.set_autocommit(True)
            return _psycopg_async_store(conn)
    raise InvalidFieldError("source", f"a connection string, a SQLAlchemy AsyncEngine, a psycopg_pool "
                                      f"AsyncConnectionPool or a factory of psycopg AsyncConnections, got "
                                      f"{type(source).__name__}")


class AsyncStorePool:
    def __init__(self, source: Any) -> None:
        self.source = source
        self._idle: list[_AsyncStoreConnection] = []
        self._closed = False

    async def run(self, statement: core.Statement) -> list[tuple[Any, ...]]:
        conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                conn = await open_async_store_connection(self.source)
        except InvalidFieldError:
            raise
        except Exception as exc:  # the database is unreachable
            raise core.DatabaseError(None, exc) from exc
        try:
            rows = await conn.run(statement)
        except asyncio.CancelledError:
            await _close_quietly(conn)
            raise
        except Exception as exc:  # classified, then the caller decides
            state = conn.sqlstate(exc)
            if state is None or state == "client":
                await _close_quietly(conn)
            else:
                await self._give_back(conn)
            raise core.DatabaseError(state if state != "client" else None, exc) from exc
        await self._give_back(conn)
        return rows

    async def _give_back(self, conn: _AsyncStoreConnection) -> None:
        if self._closed:
            await _close_quietly(conn)
        else:
            self._idle.append(conn)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close_quietly(conn)


async def _close_quietly(conn: _AsyncStoreConnection) -> None:
    try:
        await conn.close()
    except Exception:  # noqa: BLE001 - it is broken already
        pass


R = TypeVar("R")


async def drive_async(steps: Generator[Any, Any, R], perform: Callable[[Any], Awaitable[Any]]) -> R:
    """Drives a flow of ``txmq._decisions`` with a coroutine ``perform``."""
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
            value = await perform(step)
        except core.DatabaseError as err:
            error = err


async def _wait(event: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass


class AsyncDecisionStore:
    """The asyncio twin of ``txmq._anchored.DecisionStore`` (same flows, awaited)."""

    def __init__(self, producer: "AsyncTransactionProducer", decisions: core.Decisions) -> None:
        self.producer = producer
        self.settings = decisions.settings
        self.group = producer.producer_group
        self.pool = AsyncStorePool(decisions.source)
        self.open_keys: set[str] = set()
        self._acked: list[str] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        #: Background ends and hints (kept referenced until done).
        self.tasks: set[asyncio.Task[Any]] = set()
        self._stopped = False
        #: Set by close(): ends in flight stop retrying (the checks repair what they leave).
        self.closing = False

    def start(self) -> None:
        if self._task is None and not self._stopped:
            self._wake = asyncio.Event()
            self._task = asyncio.ensure_future(self._run())

    def spawn(self, coroutine: Awaitable[Any]) -> "asyncio.Task[Any]":
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def check(self, message: TransactionMessage) -> "LocalTransactionState | InProgress":
        key = core.transaction_key_of(message.properties)
        if key in self.open_keys:
            return InProgress(retry_after_seconds=self.settings.in_progress_retry_seconds)
        verdict = await drive_async(core.answer_check(self.settings, self.group, key, message.transaction_id),
                                    self.perform)
        log.debug("check of %s (key %s): %s (%s)", message.transaction_id, key, verdict.answer, verdict.source.value)
        return verdict.answer

    async def perform(self, step: Any, *, hint: bool = True) -> Any:
        if type(step) is core.Statement:
            return await self.pool.run(step)
        if type(step) is core.Ends:
            deadline = time.monotonic() + step.seconds
            return await asyncio.gather(*(self.producer._end_by_id(t, step.decision, deadline, hint=hint)
                                          for t in step.transaction_ids))
        assert type(step) is core.Acknowledged, step
        self.acknowledged(step.key)
        return None

    def acknowledged(self, key: str) -> None:
        self._acked.append(key)
        if self._wake is not None and len(self._acked) in (1, self.settings.delete_batch):
            self._wake.set()

    async def _run(self) -> None:
        """As the sync store's: idle until a key comes or a sweep is due, then a batch."""
        assert self._wake is not None
        next_sweep = time.monotonic() + self.settings.sweep_interval_seconds
        while True:
            if not self._stopped and not self._acked:
                await _wait(self._wake, max(0.0, next_sweep - time.monotonic()))
                self._wake.clear()
            if not self._stopped and self._acked and len(self._acked) < self.settings.delete_batch:
                await _wait(self._wake, DELETE_LINGER_SECONDS)
            self._wake.clear()
            keys, self._acked = self._acked, []
            if keys:
                await self._delete(keys)
            if self._stopped:
                return
            if time.monotonic() >= next_sweep:
                await drive_async(core.sweep(self.settings, self.group), self.perform)
                next_sweep = time.monotonic() + self.settings.sweep_interval_seconds

    async def _delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), self.settings.delete_batch):
            batch = keys[i:i + self.settings.delete_batch]
            try:
                await self.pool.run(core.delete_acknowledged_statement(self.settings, self.group, batch))
            except core.DatabaseError as err:
                log.warning("cannot delete %d acknowledged decision rows (the sweep repairs them): %s",
                            len(batch), err)

    async def close(self) -> None:
        self._stopped = True
        self.closing = True
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=core.END_RETRY_SECONDS)
        if self._task is not None:
            assert self._wake is not None
            self._wake.set()
            try:
                await asyncio.wait_for(self._task, 10)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing anyway
                self._task.cancel()
        elif self._acked:
            await self._delete(self._acked)
        await self.pool.close()


class AsyncAnchoredTransaction:
    """One anchored transaction on an asyncio connection (``async with`` only)."""

    def __init__(self, producer: "AsyncTransactionProducer", conn: Any, end: str) -> None:
        if end not in ("hint", "await"):
            raise InvalidFieldError("end", f"must be 'hint' or 'await', got {end!r}")
        store = producer._decision_store
        if store is None:
            raise InvalidFieldError("decisions", "producer.transaction() needs a producer made with decisions=")
        self.producer = producer
        self.store = store
        self.db = async_local_connection(conn)
        self.end = end
        self.plan = core.Plan(store.settings, producer.producer_group)
        self._halves: list[asyncio.Task[TransactionMessage]] = []
        self._entered = False
        self._done = False
        self._committing = False
        self.result: AsyncAnchoredResult | None = None

    @property
    def key(self) -> str:
        return self.plan.key

    async def __aenter__(self) -> "AsyncAnchoredTransaction":
        if self._entered:
            raise InvalidFieldError("transaction", "already entered")
        self.producer._client.check_open()
        if self.db.in_transaction():
            raise InvalidFieldError("connection", "is inside a transaction: an anchored transaction must be the "
                                                  "outermost one (its COMMIT is the decision); commit or roll back first")
        self._entered = True
        self.store.start()
        self.store.open_keys.add(self.plan.key)
        try:
            await self.db.execute(self.plan.begin())
        except BaseException:
            self.store.open_keys.discard(self.plan.key)
            await self._rollback_quietly()
            raise
        failpoint("begin.after")
        return self

    def send(self, message: Message) -> "asyncio.Task[TransactionMessage]":
        """Sends ``message`` as a half message now (a task); the block's end awaits it."""
        if not self._entered or self._done:
            raise InvalidFieldError("transaction", "send() belongs inside the `async with` block")
        message = self.producer._validate(message)
        traced = tracing.send(message, transactional=True)
        message = traced.inject(message)
        keyed = dataclasses.replace(message, properties=self.plan.properties(message.properties))
        task = asyncio.ensure_future(self._send_half(keyed, traced))
        self._halves.append(task)
        return task

    async def _send_half(self, message: Message, traced: tracing.Operation) -> TransactionMessage:
        with traced:
            half = await self.producer._send_half(message)
            tracing.sent(traced, message_id=half.message_id, queue_id=half.queue_id, broker_name=half.broker_name,
                         transaction_id=half.transaction_id)
        failpoint("half.after")
        return half

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._done = True
        try:
            if exc_type is not None:
                await drive_async(core.closing(self.plan, raised=True), self.perform)
                return
            await self._commit()
        except asyncio.CancelledError:
            # Cancelled (asyncio.timeout, wait_for, a task group) before the COMMIT, waiting
            # for the halves: the transaction must not stay open on the caller's connection,
            # where what the caller does next would commit the decision row. (During the
            # COMMIT the adapter ended it; the checks decide from the table.)
            await asyncio.shield(self._abandon())
            raise
        finally:
            self.store.open_keys.discard(self.plan.key)

    async def _abandon(self) -> None:
        """After a cancellation at the block's end: rolled back, and the halves already
        stored rolled back too (a hint; the checks fence the rest). Not once the COMMIT was
        sent: its outcome may be unknown, only the row can tell."""
        if not self._committing and self.db.in_transaction():
            await self._rollback_quietly()
            stored = [t.result().transaction_id for t in self._halves
                      if t.done() and not t.cancelled() and t.exception() is None]
            if stored:  # rolled back on the broker, unless the caller committed the row inside the block
                self.store.spawn(drive_async(core.rolled_back(self.store.settings, self.plan.group, self.plan.key,
                                                              stored), self.store.perform))

    async def perform(self, step: Any) -> Any:
        kind = type(step)
        if kind is core.AwaitHalves:
            results = await asyncio.gather(*self._halves, return_exceptions=True)
            return [(None, r) if isinstance(r, BaseException) else (r, None) for r in results]
        if kind is core.Commit:
            failpoint("commit.before")
            self._committing = True
            try:
                await self.db.commit(step.statement)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise core.DatabaseError(commit_sqlstate(self.db, exc), exc) from exc
            return None
        if kind is core.Rollback:
            await self._rollback_quietly()
            return None
        if kind is core.InTransaction:
            return self.db.in_transaction()
        if kind is core.Settle:
            self.store.spawn(drive_async(step.steps, self.store.perform))
            return None
        assert kind is core.Hint, step
        deadline = time.monotonic() + core.END_RETRY_SECONDS
        for transaction_id in step.transaction_ids:
            self.store.spawn(self.producer._end_by_id(transaction_id, step.decision, deadline))
        return None

    async def _rollback_quietly(self) -> None:
        try:
            await self.db.rollback()
        except Exception as err:  # noqa: BLE001 - a lost connection rolls back on the server anyway
            log.debug("rollback of anchored transaction %s failed: %s", self.plan.key, err)

    async def _commit(self) -> None:
        closed = await drive_async(core.closing(self.plan, raised=False), self.perform)
        if closed.outcome is not core.Outcome.COMMITTED:  # rolled back, before or at COMMIT, or UNKNOWN
            error = closed.error
            assert error is not None  # every other ending carries its error (core.closing)
            if closed.outcome is core.Outcome.UNKNOWN:
                log.warning("anchored transaction %s: the COMMIT's answer was lost; the checks decide its "
                            "%d message(s) from the decisions table", self.plan.key, len(closed.halves))
            raise error
        failpoint("commit.after")
        self.result = result = AsyncAnchoredResult(self.plan.key, TransactionState.COMMITTED, closed.halves)
        if closed.halves:
            ending = self.store.spawn(self._end_committed(result))
            if self.end == "await":
                await ending
        else:
            result._acked.set()
        raise_after_commit(self.db)

    async def _end_committed(self, result: AsyncAnchoredResult) -> None:
        acked, errors = await drive_async(core.acknowledge(result.transaction_key,
                                                           [h.transaction_id for h in result.messages]),
                                          self._perform_end)
        result._errors.extend(errors)
        for error in errors:
            if isinstance(error, TransactionStateError):
                log.error("anchored transaction %s committed in the database but the broker refused its "
                          "COMMIT: %s", result.transaction_key, error)
        if acked:
            result._acked.set()

    async def _perform_end(self, step: Any) -> Any:
        if type(step) is core.Ends:
            failpoint_soon("end.inflight")
        elif type(step) is core.Acknowledged:
            failpoint("end.after")
        return await self.store.perform(step, hint=self.end == "hint")  # "await": the caller waits on it
