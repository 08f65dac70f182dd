"""What the sync and asyncio anchored transactions (``_anchored``, ``aio/_anchored``) share
about the application's database and the crash tests' fail points: which driver a
connection is of, SQLSTATEs, placeholders, and when an acknowledged key's row goes."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from ._decisions import Statement

log = logging.getLogger(__name__)

#: How long the first acknowledged key waits for others before their batched delete. An
#: acknowledged row is garbage: waiting longer only leaves the table a little fuller, and at
#: a few hundred transactions a second 0.5 s makes one DELETE of ~100 rows where 0.05 s
#: made one of ~10 (each statement costs the database and the producer ~100-200 µs).
DELETE_LINGER_SECONDS = 0.5


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


def pg_sqlstate(error: BaseException, lost: bool) -> str | None:
    """A psycopg / psycopg2 / SQLAlchemy-wrapped error's SQLSTATE; None when the connection
    was lost; ``"client"`` for an error the server did not send."""
    if lost:
        return None
    orig = getattr(error, "orig", None)  # SQLAlchemy's DBAPIError
    if orig is not None and getattr(error, "connection_invalidated", False):
        return None
    for e in (error, orig):
        if e is None:
            continue
        code = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if code:
            return str(code)
    return "client"


def named(statement: Statement) -> tuple[str, dict[str, Any]]:
    """``%s`` placeholders as SQLAlchemy ``text()`` binds ``:p0, :p1, ...``."""
    parts = statement.sql.split("%s")
    sql = "".join(p + (f":p{i}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))
    return sql, {f"p{i}": v for i, v in enumerate(statement.params)}


def _bound(conn: Any, statement: Statement) -> str:
    import psycopg  # the psycopg integration's own driver, present when it is in use

    cursor = psycopg.AsyncClientCursor if isinstance(conn, psycopg.AsyncConnection) else psycopg.ClientCursor
    return str(cursor(conn).mogrify(statement.sql, statement.params))


def begin_query(conn: Any, statement: Statement) -> bytes:
    """BEGIN and ``statement`` as one simple query, for one round trip, on an autocommit
    connection (where the SDK itself begins; a connection that is not autocommit has
    psycopg send its own BEGIN, with the connection's isolation level, first)."""
    return ("BEGIN; " + _bound(conn, statement)).encode()


def commit_query(conn: Any, statement: Statement) -> bytes:
    """``statement`` and COMMIT as one simple query, for one round trip: its parameters
    bound on the client by psycopg (``ClientCursor.mogrify``, psycopg's own quoting). A
    pipeline would send the two as well, but ends with a second Sync: two round trips, and
    16 system calls against these 4. The server parses the small UPDATE each time instead
    of binding a prepared one."""
    return (_bound(conn, statement) + "; COMMIT").encode()
