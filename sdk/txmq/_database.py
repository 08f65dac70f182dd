"""What the sync and asyncio anchored transactions (``_anchored``, ``aio/_anchored``) share
about the application's database and the crash tests' fail points: which driver a
connection is of, SQLSTATEs, placeholders, and when an acknowledged key's row goes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any, Iterator

from ._decisions import IDLE_IN_TRANSACTION_TIMEOUT, Statement

log = logging.getLogger(__name__)

#: How long the first acknowledged key waits for others before their batched delete. An
#: acknowledged row is garbage: waiting longer only leaves the table a little fuller, and at
#: a few hundred transactions a second 0.5 s makes one DELETE of ~100 rows where 0.05 s
#: made one of ~10 (each statement costs the database and the producer ~100-200 µs).
DELETE_LINGER_SECONDS = 0.5


#: psycopg's ``prepare_threshold`` on the producer's own connections (from a connection
#: string or a factory): never prepared on the server. Behind a PgBouncer in transaction
#: pooling (older than 1.21) a prepared statement stays on the server connection, which
#: other clients' transactions use next: the next client to prepare one there fails
#: ("prepared statement ... already exists") or runs another's statement. The store's
#: statements are small; the server parses them each time.
STORE_PREPARE_THRESHOLD = None


# --- fail points (crash tests only) -------------------------------------------------------

#: ``TXMQ_SDK_FAILPOINT=<step>`` makes the process SIGKILL itself at that step of an
#: anchored transaction (tests/integration/test_anchored_crash.py). Read once at import:
#: unset, :func:`failpoint` is one comparison with an empty string.
FAILPOINT = os.environ.get("TXMQ_SDK_FAILPOINT", "")
FAILPOINTS = ("begin.after", "half.after", "commit.before", "commit.after", "end.inflight", "end.after")


def failpoint(step: str) -> None:
    if FAILPOINT and step == FAILPOINT:
        log.critical("fail point %s reached: killing the process", step)
        os.kill(os.getpid(), signal.SIGKILL)


def failpoint_soon(step: str, seconds: float = 0.001) -> None:
    """Dies ``seconds`` from now when ``step`` is armed (a request then is in flight)."""
    if FAILPOINT and step == FAILPOINT:
        threading.Timer(seconds, failpoint, (step,)).start()


def module_of(obj: Any) -> str:
    return type(obj).__module__.split(".", 1)[0]


def pool_kind(source: Any) -> str | None:
    """``"sync"`` for a psycopg_pool ``ConnectionPool`` (or a subclass), ``"async"`` for an
    ``AsyncConnectionPool``, else None."""
    if module_of(source) != "psycopg_pool":
        return None
    import psycopg_pool

    if isinstance(source, psycopg_pool.AsyncConnectionPool):
        return "async"
    return "sync" if isinstance(source, psycopg_pool.ConnectionPool) else None


def error_code(error: BaseException) -> str | None:
    """The SQLSTATE a psycopg / psycopg2 / SQLAlchemy-wrapped error carries, if any."""
    for e in (error, getattr(error, "orig", None)):  # orig: SQLAlchemy's DBAPIError
        if e is None:
            continue
        code = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if code:
            return str(code)
    return None


def pg_sqlstate(error: BaseException, lost: bool) -> str | None:
    """A psycopg / psycopg2 / SQLAlchemy-wrapped error's SQLSTATE; None when the connection
    was lost; ``"client"`` for an error the server did not send."""
    if lost:
        return None
    if getattr(error, "orig", None) is not None and getattr(error, "connection_invalidated", False):
        return None
    return error_code(error) or "client"


def commit_sqlstate(db: Any, error: BaseException) -> str | None:
    """The SQLSTATE of an error of the caller's commit: ``db.sqlstate(error)`` (None: the
    connection was lost, the outcome unknown), except for a connection the server closed
    saying it ended the session for idling in the transaction, before the COMMIT ran
    (``txmq._decisions.IDLE_IN_TRANSACTION_TIMEOUT``): that one is told."""
    state: str | None = db.sqlstate(error)
    if state is None and error_code(error) == IDLE_IN_TRANSACTION_TIMEOUT:
        return IDLE_IN_TRANSACTION_TIMEOUT
    return state


def named(statement: Statement) -> tuple[str, dict[str, Any]]:
    """``%s`` placeholders as SQLAlchemy ``text()`` binds ``:p0, :p1, ...``."""
    parts = statement.sql.split("%s")
    sql = "".join(p + (f":p{i}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))
    return sql, {f"p{i}": v for i, v in enumerate(statement.params)}


def _bound(conn: Any, statement: Statement) -> str:
    import psycopg  # the psycopg integration's own driver, present when it is in use

    cursor = psycopg.AsyncClientCursor if isinstance(conn, psycopg.AsyncConnection) else psycopg.ClientCursor
    return str(cursor(conn).mogrify(statement.sql, statement.params))


def begin_command(conn: Any) -> str:
    """The BEGIN psycopg itself would send to start a transaction on ``conn``: with the
    connection's isolation level, read-only and deferrable settings (its public attributes,
    None where the server's default applies)."""
    from psycopg import IsolationLevel

    parts = ["BEGIN"]
    if conn.isolation_level is not None:
        parts += ["ISOLATION LEVEL", IsolationLevel(conn.isolation_level).name.replace("_", " ")]
    if conn.read_only is not None:
        parts.append("READ ONLY" if conn.read_only else "READ WRITE")
    if conn.deferrable is not None:
        parts.append("DEFERRABLE" if conn.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


def begin_query(conn: Any, statement: Statement) -> bytes:
    """The connection's BEGIN and ``statement`` as one simple query: one round trip where
    psycopg, on a connection that is not autocommit, sends its BEGIN alone first."""
    return (begin_command(conn) + "; " + _bound(conn, statement)).encode()


def folds_begin(conn: Any) -> bool:
    """Whether the SDK may begin the transaction itself, with its first statement: the
    connection is idle (no transaction, which psycopg would otherwise begin) and not in
    pipeline mode (where statements queue and their results come later)."""
    from psycopg.pq import TransactionStatus

    pgconn = conn.pgconn
    return bool(pgconn.transaction_status == TransactionStatus.IDLE and not pgconn.pipeline_status)


def raise_failed(conn: Any, results: list[Any]) -> None:
    """A failed statement among a simple query's results, raised as psycopg raises it (the
    SQLSTATE's own class, e.g. ``UniqueViolation``)."""
    from psycopg import errors
    from psycopg.pq import ExecStatus

    for result in results:
        if result.status == ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(result, encoding=conn.info.encoding)


def execute_simple(conn: Any, query: bytes) -> None:
    """``query`` sent as it is (the simple query protocol, one round trip) on a psycopg
    ``Connection``, under its lock, past psycopg's cursor: psycopg would start a transaction
    with its own BEGIN first. The connection tracks the transaction's state from the server
    (libpq's status), so its later ``execute``/``commit``/``rollback`` see the transaction."""
    from psycopg import generators

    with conn.lock:
        conn.pgconn.send_query(query)
        results = conn.wait(generators.execute(conn.pgconn))
    raise_failed(conn, results)


def psycopg_under(sa_connection: Any) -> Any | None:
    """The psycopg 3 connection (sync or asyncio) a SQLAlchemy ``Connection`` runs on, or
    None for another driver (psycopg2, asyncpg, ...: their statements go through SQLAlchemy)."""
    driver = sa_connection.connection.driver_connection
    return driver if module_of(driver) == "psycopg" else None


def as_sqlalchemy_error(sa_connection: Any, driver: Any, query: bytes, error: BaseException) -> BaseException:
    """A psycopg error of a statement the SDK sent itself under a SQLAlchemy connection, as
    SQLAlchemy would have raised it (``IntegrityError``, ``OperationalError``, ... with the
    driver's error as ``orig``; ``connection_invalidated`` when the connection was lost), so
    a Session's caller catches what it always catches. Anything else as it is."""
    import psycopg
    from sqlalchemy import exc

    if not isinstance(error, psycopg.Error):
        return error
    return exc.DBAPIError.instance(query.decode(errors="replace"), None, error, psycopg.Error,
                                   connection_invalidated=lost(driver), dialect=sa_connection.dialect)


def session_folds_commit(session: Any) -> bool:
    """Whether the SDK may send a SQLAlchemy ``Session``'s COMMIT itself, with the decision
    row's UPDATE, after flushing it, so that ``Session.commit()`` then finds nothing to send
    (psycopg sends no COMMIT outside a transaction). Not when anything would still reach the
    database inside ``Session.commit()`` and so land after the real COMMIT: a
    ``before_commit`` listener, objects still pending after the flush (a flush listener
    changed them), an open SAVEPOINT (released there), or a two-phase session."""
    return not (session.dispatch.before_commit or session.get_nested_transaction() is not None or session.twophase
                or session.new or session.dirty or session.deleted)


@contextlib.contextmanager
def committed_by(session: Any) -> Iterator[list[bool]]:
    """A list that holds True once ``Session.commit()`` inside the block has committed in
    the database: a listener put first among the session's ``after_commit`` ones (which
    run after the DBAPI commit), so an error of a later one is told from a failed COMMIT."""
    from sqlalchemy import event

    committed: list[bool] = []

    def mark(_session: Any) -> None:
        committed.append(True)

    event.listen(session, "after_commit", mark, insert=True)
    try:
        yield committed
    finally:
        event.remove(session, "after_commit", mark)


def raise_after_commit(db: Any) -> None:
    """Raises what a caller's connection raised after its COMMIT succeeded (a SQLAlchemy
    ``after_commit`` listener; the adapter keeps it as ``error_after_commit``). The caller
    sees it as ``Session.commit()`` would raise it, once the decision is recorded
    (``tx.result`` COMMITTED) and its end sent: never as a failed COMMIT, which would roll
    back the messages of a transaction the database committed."""
    error = getattr(db, "error_after_commit", None)
    if error is not None:
        db.error_after_commit = None
        raise error


def lost(conn: Any) -> bool:
    """Whether a psycopg connection was lost (then a COMMIT's outcome is unknown)."""
    return bool(conn.broken or conn.closed)


def commit_query(conn: Any, statement: Statement) -> bytes:
    """``statement`` and COMMIT as one simple query, for one round trip: its parameters
    bound on the client by psycopg (``ClientCursor.mogrify``, psycopg's own quoting). A
    pipeline would send the two as well, but ends with a second Sync: two round trips, and
    16 system calls against these 4. The server parses the small UPDATE each time instead
    of binding a prepared one."""
    return (_bound(conn, statement) + "; COMMIT").encode()
