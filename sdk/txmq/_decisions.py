"""The decision protocol of anchored transactions, without I/O (the protocol itself is
specified in ``protos/txmq/v1/DECISIONS.md``; read that first).

An anchored transaction keeps its decision in the application's own PostgreSQL database:
one row per transaction in a *decisions table*, keyed by (producer group, transaction
key). The key is made by the SDK before anything is sent and stamped on every half
message of the transaction (``TRANSACTION_KEY_PROPERTY``), so it stays the same when a
send moves to another shard with a new message id.

- The local transaction's **first** statement inserts the row ``decision = 'commit'``;
  only then is a half message sent. Just before the local COMMIT the row records the
  broker transaction ids of the halves it commits. The database commit *is* the decision.
- A check resolves a transaction by inserting ``decision = 'rollback'`` for the same key
  under a lock timeout (``fence``): a conflict means the row is committed (read it:
  COMMIT when it lists the checked transaction id, ROLLBACK for a half it does not list,
  an attempt given up on); a lock timeout means the local transaction still holds the key
  (IN_PROGRESS); an insert fences the key (ROLLBACK, and a local transaction that tries
  to insert it later fails on the key).
- A COMMIT row is deleted once the broker acknowledged the COMMIT of every half it lists;
  a ROLLBACK (fence) row after ``fence_retention_seconds``.

This module says which statement to run and what its outcome means, as generators of
steps (the pattern of ``txmq._sending``): the sync driver (``txmq._anchored``) performs
them blocking, the asyncio one (``txmq.aio._anchored``) awaiting. Statements use ``%s``
placeholders (psycopg's and DB-API's ``format`` style); an adapter rewrites them for
another style (:func:`placeholders`).
"""

from __future__ import annotations

import enum
import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Generator, Sequence

from ._checking import InProgress
from ._errors import InvalidFieldError, TransactionStateError, TxmqError
from ._faults import RetryAction, retry_action
from ._ids import TransactionId
from ._sending import Request, Sleep
from ._types import (RESOLUTION_TO_PB, TRANSACTION_KEY_PROPERTY, LocalTransactionState, TransactionState,
                     state_from_name, state_from_pb)
from .v1 import broker_pb2, common_pb2

#: The property that marks a half message of an anchored transaction (its value: the
#: protocol version). A check of a message carrying it is answered from the decisions table.
ANCHOR_PROPERTY = "__TXMQ_ANCHOR"
PROTOCOL_VERSION = "1"
DEFAULT_TABLE = "txmq_decisions"
COMMIT, ROLLBACK = "commit", "rollback"

DAY = 86400.0
#: SQLSTATEs the protocol reads (PostgreSQL's error codes).
UNIQUE_VIOLATION = "23505"
LOCK_NOT_AVAILABLE = "55P03"
QUERY_CANCELED = "57014"  # statement_timeout
#: The server ended the session for idling in a transaction (the FATAL of
#: ``idle_in_transaction_session_timeout``). PostgreSQL raises it only while it waits for the
#: next command or for one it has read but not begun (postgres.c disables the timeout once a
#: command is read and catches a last-moment expiry before the command runs): a COMMIT sent
#: then never ran. Not so PostgreSQL 17's ``transaction_timeout`` (25P04): its interrupt can
#: be pending while CommitTransaction holds interrupts and be raised after the commit is
#: durable, so a lost connection with 25P04 stays an unknown outcome.
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")


def new_key() -> str:
    """A transaction key: 32 hex digits, random (never reused, so a fence never meets a
    later transaction)."""
    return uuid.uuid4().hex


def validate_table(table: str) -> str:
    """A table name put into SQL as an identifier: ``name`` or ``schema.name``, letters,
    digits and underscores (no quoting games)."""
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise InvalidFieldError("table", f"must be a plain identifier or schema.identifier, got {table!r}")
    return table


def _seconds(name: str, value: float | None, *, optional: bool = False, lowest: float = 0.001) -> float | None:
    if value is None and optional:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < lowest:
        raise InvalidFieldError(name, f"must be a number of seconds >= {lowest:g}"
                                      f"{' or None' if optional else ''}, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class DecisionSettings:
    """How a producer uses its decisions table (see :class:`txmq.anchored.Decisions`)."""

    table: str = DEFAULT_TABLE
    #: How long a check waits for a local transaction holding the key before answering
    #: IN_PROGRESS.
    check_lock_timeout_seconds: float = 0.5
    #: The retry-after of an IN_PROGRESS answer.
    in_progress_retry_seconds: float = 5.0
    #: Bounds the database itself puts on the local transaction (``SET LOCAL`` in its first
    #: statement; None leaves the session's own): a transaction idle this long is ended by
    #: the server (the session is closed), a statement running this long is cancelled.
    #: PostgreSQL before 17 has no bound on a transaction's total life.
    idle_in_transaction_timeout_seconds: float | None = 60.0
    statement_timeout_seconds: float | None = 300.0
    #: How long a fence (a ROLLBACK row written by a check) is kept. Longer than any check
    #: window and than the bounds above; a fence only stops a local transaction that
    #: inserts its key after the check, which this SDK never does (it inserts first).
    fence_retention_seconds: float = 7 * DAY
    #: A COMMIT row still present this long after its transaction began is repaired by any
    #: instance of the group: its halves are committed on the broker (idempotent), then
    #: it is deleted (a producer that died between the COMMIT's acknowledgement and the
    #: delete, or during the end).
    repair_after_seconds: float = 30.0
    #: How often the sweeper looks for fences past retention and COMMIT rows to repair.
    sweep_interval_seconds: float = 10.0
    #: Most keys one DELETE of acknowledged COMMIT rows names.
    delete_batch: int = 500

    def __post_init__(self) -> None:
        validate_table(self.table)
        _seconds("check_lock_timeout_seconds", self.check_lock_timeout_seconds)
        _seconds("in_progress_retry_seconds", self.in_progress_retry_seconds)
        _seconds("idle_in_transaction_timeout_seconds", self.idle_in_transaction_timeout_seconds, optional=True)
        _seconds("statement_timeout_seconds", self.statement_timeout_seconds, optional=True)
        _seconds("fence_retention_seconds", self.fence_retention_seconds)
        _seconds("repair_after_seconds", self.repair_after_seconds)
        _seconds("sweep_interval_seconds", self.sweep_interval_seconds)
        if not isinstance(self.delete_batch, int) or not 1 <= self.delete_batch <= 10_000:
            raise InvalidFieldError("delete_batch", f"must be an integer in 1..10000, got {self.delete_batch!r}")
        bounds = [b for b in (self.idle_in_transaction_timeout_seconds, self.statement_timeout_seconds) if b]
        if bounds and self.fence_retention_seconds <= max(bounds):
            raise InvalidFieldError("fence_retention_seconds",
                                    f"must exceed the local transaction's bounds ({max(bounds):g} s), got "
                                    f"{self.fence_retention_seconds:g}")


# --- the schema ---------------------------------------------------------------------------

def schema_sql(table: str = DEFAULT_TABLE) -> str:
    """The migration that creates the decisions table (``txmq db init`` runs it; it is
    idempotent). ``transaction_ids``: on a COMMIT row, the broker transaction ids of the
    half messages the transaction commits (recorded just before the local COMMIT)."""
    t = validate_table(table)
    return (f"CREATE TABLE IF NOT EXISTS {t} (\n"
            f"    producer_group  text        NOT NULL,\n"
            f"    transaction_key text        NOT NULL,\n"
            f"    decision        text        NOT NULL CHECK (decision IN ('commit', 'rollback')),\n"
            f"    transaction_ids text[],\n"
            f"    decided_at      timestamptz NOT NULL DEFAULT now(),\n"
            f"    PRIMARY KEY (producer_group, transaction_key)\n"
            f");\n")


def resolver_grants_sql(table: str, role: str) -> str:
    """What a role needs to answer checks and clean up from the table, and nothing else
    (a checker's resolver, or a producer's own connection for checks)."""
    t = validate_table(table)
    validate_table(role)
    return f"GRANT SELECT, INSERT, DELETE ON {t} TO {role};\n"


# --- statements ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement with ``%s`` placeholders; ``rows``: whether it returns rows."""

    sql: str
    params: tuple[Any, ...] = ()
    rows: bool = False


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def begin_statement(settings: DecisionSettings, group: str, key: str) -> Statement:
    """The local transaction's first statement: its COMMIT row, holding the key's lock
    until the transaction ends; and the bounds the server puts on the transaction (local
    to it: ``set_config(..., true)``), with ``synchronous_commit`` on (the commit is the
    decision, so it must be durable before anyone is told)."""
    configs = ["set_config('synchronous_commit', 'on', true)"]
    params: list[Any] = []
    if settings.idle_in_transaction_timeout_seconds is not None:
        configs.append("set_config('idle_in_transaction_session_timeout', %s, true)")
        params.append(_ms(settings.idle_in_transaction_timeout_seconds))
    if settings.statement_timeout_seconds is not None:
        configs.append("set_config('statement_timeout', %s, true)")
        params.append(_ms(settings.statement_timeout_seconds))
    # Placeholders in the text's order: group and key, then the bounds.
    return Statement(f"INSERT INTO {settings.table} (producer_group, transaction_key, decision) "
                     f"SELECT %s, %s, 'commit' FROM (SELECT {', '.join(configs)}) AS bounds",
                     (group, key, *params))


#: The text of the error the statements before the local COMMIT raise when the decision row
#: is not the one this transaction inserted (the caller committed or rolled back inside the
#: block and went on in a new transaction): their COMMIT then never runs.
ROW_GONE_MARK = " decision rows inserted by this transaction: it ended inside the anchored block"
#: Its SQLSTATE (invalid_text_representation: the cast that raises it).
ROW_GONE = "22P02"


def _this_transactions_row(change: str, group: str, key: str, params: tuple[Any, ...] = ()) -> Statement:
    """``change`` (an UPDATE's SET or a DELETE) of the key's COMMIT row *as this transaction
    inserted it* (``xmin``: PostgreSQL 13 or later), failing when there is none: a row
    committed or rolled back inside the block is not this transaction's, and its COMMIT is
    then not the decision. The cast of the count raises only when it runs (ELSE of a count,
    not a constant the planner would fold)."""
    where = ("WHERE producer_group = %s AND transaction_key = %s AND decision = 'commit' "
             "AND xmin = pg_current_xact_id()::xid")
    return Statement(f"WITH mine AS ({change} {where} RETURNING 1) "
                     f"SELECT CASE count(*) WHEN 1 THEN NULL ELSE (count(*) || '{ROW_GONE_MARK}')::int END FROM mine",
                     (*params, group, key))


def record_statement(settings: DecisionSettings, group: str, key: str, transaction_ids: Sequence[str]) -> Statement:
    """Just before the local COMMIT: the transaction ids of the halves it commits (raising
    :data:`ROW_GONE` when the row is not this transaction's)."""
    return _this_transactions_row(f"UPDATE {settings.table} SET transaction_ids = %s", group, key,
                                  (list(transaction_ids),))


def forget_statement(settings: DecisionSettings, group: str, key: str) -> Statement:
    """A transaction that sent no message: its row goes with its own commit (raising
    :data:`ROW_GONE` as :func:`record_statement` does)."""
    return _this_transactions_row(f"DELETE FROM {settings.table}", group, key)


def adopt_statement(settings: DecisionSettings, group: str, key: str, transaction_ids: Sequence[str]) -> Statement:
    """After the caller's transaction ended inside the block, on the producer's own
    connection: a COMMIT row the caller committed (without its halves) records them.
    Returns a row when it did."""
    return Statement(f"UPDATE {settings.table} SET transaction_ids = %s "
                     f"FROM (SELECT set_config('lock_timeout', %s, true)) AS bounds "
                     f"WHERE producer_group = %s AND transaction_key = %s AND decision = 'commit' "
                     f"AND transaction_ids IS NULL RETURNING decision",
                     (list(transaction_ids), _ms(settings.check_lock_timeout_seconds), group, key), rows=True)


def fence_statement(settings: DecisionSettings, group: str, key: str) -> Statement:
    """A check's first statement, in a transaction of its own (autocommit): insert the
    ROLLBACK row unless the key exists, waiting at most the lock timeout for a local
    transaction holding it. Returns a row only when it inserted."""
    return Statement(f"INSERT INTO {settings.table} (producer_group, transaction_key, decision) "
                     f"SELECT %s, %s, 'rollback' FROM (SELECT set_config('lock_timeout', %s, true), "
                     f"set_config('synchronous_commit', 'on', true)) AS bounds "
                     f"ON CONFLICT (producer_group, transaction_key) DO NOTHING RETURNING decision",
                     (group, key, _ms(settings.check_lock_timeout_seconds)), rows=True)


def read_statement(settings: DecisionSettings, group: str, key: str) -> Statement:
    """After a conflict, in a statement of its own (a fresh snapshot sees the row that the
    fence waited for)."""
    return Statement(f"SELECT decision, transaction_ids FROM {settings.table} "
                     f"WHERE producer_group = %s AND transaction_key = %s", (group, key), rows=True)


def unfence_statement(settings: DecisionSettings, group: str, key: str) -> Statement:
    """The fence a stale check inserted, deleted again (:func:`confirm_fence`)."""
    return Statement(f"DELETE FROM {settings.table} WHERE producer_group = %s AND transaction_key = %s "
                     f"AND decision = 'rollback'", (group, key))


def delete_acknowledged_statement(settings: DecisionSettings, group: str, keys: Sequence[str]) -> Statement:
    """COMMIT rows whose every half the broker acknowledged COMMITTED."""
    return Statement(f"DELETE FROM {settings.table} WHERE producer_group = %s AND decision = 'commit' "
                     f"AND transaction_key = ANY(%s)", (group, list(keys)))


def sweep_fences_statement(settings: DecisionSettings, group: str) -> Statement:
    """Fences past their retention, and COMMIT rows that list no halves (a caller's commit
    inside the block, its producer gone before it recorded them: their checks read the
    row, so nothing else deletes it), at most 10,000 a sweep."""
    return Statement(f"DELETE FROM {settings.table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {settings.table} "
                     f"WHERE producer_group = %s AND (decision = 'rollback' OR transaction_ids IS NULL) "
                     f"AND decided_at < now() - make_interval(secs => %s) LIMIT 10000))",
                     (group, settings.fence_retention_seconds))


def lingering_statement(settings: DecisionSettings, group: str, limit: int = 1000) -> Statement:
    """COMMIT rows older than ``repair_after_seconds``: their halves' COMMIT was never
    acknowledged here (or their delete was lost)."""
    return Statement(f"SELECT transaction_key, transaction_ids FROM {settings.table} "
                     f"WHERE producer_group = %s AND decision = 'commit' "
                     f"AND decided_at < now() - make_interval(secs => %s) ORDER BY decided_at LIMIT %s",
                     (group, settings.repair_after_seconds, limit), rows=True)


def count_statement(table: str) -> Statement:
    """Rows per group and decision, with the oldest (``txmq db status``)."""
    t = validate_table(table)
    return Statement(f"SELECT producer_group, decision, count(*), "
                     f"extract(epoch FROM now() - min(decided_at))::float8 FROM {t} "
                     f"GROUP BY producer_group, decision ORDER BY 1, 2", rows=True)


def placeholders(sql: str, paramstyle: str) -> str:
    """``sql`` (``%s`` placeholders) in a DB-API ``paramstyle``: format/pyformat as is,
    qmark ``?``, numeric ``:1``, dollar ``$1`` (the statements here hold no other ``%``,
    ``?``, ``:`` digit or ``$`` digit)."""
    if paramstyle in ("format", "pyformat"):
        return sql
    parts = sql.split("%s")
    if paramstyle == "qmark":
        return "?".join(parts)
    if paramstyle in ("numeric", "dollar"):
        mark = ":" if paramstyle == "numeric" else "$"
        return "".join(p + (f"{mark}{i + 1}" if i < len(parts) - 1 else "") for i, p in enumerate(parts))
    raise InvalidFieldError("paramstyle", f"must be format, pyformat, qmark, numeric or dollar, got {paramstyle!r}")


# --- a check ------------------------------------------------------------------------------

class DatabaseError(Exception):
    """A statement failed: its SQLSTATE (None when the driver gave none: the connection was
    lost, a client-side error). Drivers raise this into the generators."""

    def __init__(self, sqlstate: str | None, cause: BaseException) -> None:
        super().__init__(f"{sqlstate or 'no SQLSTATE'}: {cause}")
        self.sqlstate = sqlstate
        self.cause = cause


class Source(enum.Enum):
    """Why a check answered as it did (logs, metrics, tests)."""

    COMMITTED = "committed"        # the COMMIT row lists the transaction
    NOT_LISTED = "not_listed"      # a COMMIT row that does not list it: an attempt given up on
    FENCED = "fenced"              # the check inserted the fence
    STALE = "stale"                # its fence met a half the broker had committed: the fence went again
    FENCE_FOUND = "fence_found"    # a fence from an earlier check
    LOCKED = "locked"              # the local transaction holds the key
    UNAVAILABLE = "unavailable"    # the database failed: ask again
    NO_KEY = "no_key"              # the message carries no transaction key


@dataclass(frozen=True, slots=True)
class Verdict:
    """A check's answer, why, and the halves to commit on the broker before the COMMIT row
    may be deleted (the row's ``transaction_ids``; empty otherwise)."""

    answer: "LocalTransactionState | InProgress"
    source: Source
    key: str = ""
    commit_transaction_ids: tuple[str, ...] = ()
    #: False for a COMMIT row that lists no halves (``transaction_ids`` NULL): the checked
    #: half commits, and the row stays for the checks of the others (swept after the
    #: fence retention).
    lists_halves: bool = True


Steps = Generator[Statement, Any, Verdict]


def transaction_key_of(properties: Any) -> str:
    return properties.get(TRANSACTION_KEY_PROPERTY, "") if properties else ""


def is_anchored(properties: Any) -> bool:
    return bool(properties) and ANCHOR_PROPERTY in properties


def check(settings: DecisionSettings, group: str, key: str, transaction_id: str) -> Steps:
    """The check of ``transaction_id`` (a half of the anchored transaction ``key`` of
    ``group``): yields statements (each in a transaction of its own), receives their rows
    (a list of tuples) or has a :class:`DatabaseError` thrown in; returns the verdict."""
    if not key:
        return Verdict(LocalTransactionState.UNKNOWN, Source.NO_KEY)
    retry = InProgress(retry_after_seconds=settings.in_progress_retry_seconds)
    for _attempt in range(2):
        try:
            inserted = yield fence_statement(settings, group, key)
        except DatabaseError as err:
            if err.sqlstate == LOCK_NOT_AVAILABLE:
                return Verdict(retry, Source.LOCKED, key)
            return Verdict(LocalTransactionState.UNKNOWN, Source.UNAVAILABLE, key)
        if inserted:
            return Verdict(LocalTransactionState.ROLLBACK, Source.FENCED, key)
        try:
            rows = yield read_statement(settings, group, key)
        except DatabaseError:
            return Verdict(LocalTransactionState.UNKNOWN, Source.UNAVAILABLE, key)
        if not rows:
            # Deleted between the two statements: a COMMIT row whose halves the broker
            # acknowledged (this check is stale), or a fence past retention. Once more.
            continue
        decision, transaction_ids = rows[0][0], rows[0][1]
        return verdict_of_row(key, transaction_id, decision, transaction_ids)
    return Verdict(LocalTransactionState.UNKNOWN, Source.UNAVAILABLE, key)


def verdict_of_row(key: str, transaction_id: str, decision: str, transaction_ids: Sequence[str] | None) -> Verdict:
    """What a committed row says about ``transaction_id``."""
    if decision == ROLLBACK:
        return Verdict(LocalTransactionState.ROLLBACK, Source.FENCE_FOUND, key)
    if transaction_ids is None:
        return Verdict(LocalTransactionState.COMMIT, Source.COMMITTED, key, (transaction_id,), lists_halves=False)
    listed = tuple(transaction_ids)
    if transaction_id in listed:
        return Verdict(LocalTransactionState.COMMIT, Source.COMMITTED, key, listed)
    return Verdict(LocalTransactionState.ROLLBACK, Source.NOT_LISTED, key, listed)


# --- a transaction ------------------------------------------------------------------------

class Commit:
    """Perform: ``statement`` (None: none) then COMMIT; a failed ``statement`` rolls the
    transaction back. Raises :class:`DatabaseError`; sends back nothing."""

    __slots__ = ("statement",)

    def __init__(self, statement: Statement | None) -> None:
        self.statement = statement


class Rollback:
    """Perform: ROLLBACK (errors are swallowed: a lost connection rolls back anyway)."""

    __slots__ = ()


class Outcome(enum.Enum):
    """How a local transaction ended, as far as the producer can tell."""

    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    #: The COMMIT's answer was lost (the connection broke): the check decides, from the row.
    UNKNOWN = "unknown"


@dataclass(slots=True)
class Plan:
    """The producer's side of one anchored transaction: its key, and the transaction ids of
    the halves stored so far."""

    settings: DecisionSettings
    group: str
    key: str = field(default_factory=new_key)
    transaction_ids: list[str] = field(default_factory=list)

    def properties(self, properties: Any) -> dict[str, str]:
        """A half message's properties: the user's, plus the key and the anchor mark."""
        for reserved in (TRANSACTION_KEY_PROPERTY, ANCHOR_PROPERTY):
            if reserved in properties:
                raise InvalidFieldError("properties", f"{reserved} is reserved for anchored transactions")
        return {**properties, TRANSACTION_KEY_PROPERTY: self.key, ANCHOR_PROPERTY: PROTOCOL_VERSION}

    def begin(self) -> Statement:
        return begin_statement(self.settings, self.group, self.key)

    def finish(self) -> Generator[Commit, None, Outcome]:
        """The commit: the row records the halves (or goes, with none), then COMMIT.
        Returns COMMITTED, or UNKNOWN when the connection broke on the way (a DatabaseError
        without SQLSTATE), or raises the DatabaseError of a refused commit (rolled back; a
        lost connection carries a SQLSTATE only for :data:`IDLE_IN_TRANSACTION_TIMEOUT`)."""
        statement = (record_statement(self.settings, self.group, self.key, self.transaction_ids)
                     if self.transaction_ids else forget_statement(self.settings, self.group, self.key))
        try:
            yield Commit(statement)
        except DatabaseError as err:
            if err.sqlstate is None:
                return Outcome.UNKNOWN
            raise
        return Outcome.COMMITTED


# --- ends by transaction id ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Address:
    """Perform: the address of broker ``broker`` (asked again when ``refresh``)."""

    broker: str
    refresh: bool = False


#: How long a background EndTransaction (a hint: the decision is already in the database)
#: is retried before it is left to the check.
END_RETRY_SECONDS = 30.0


def end_by_id(transaction_id: str, decision: LocalTransactionState, producer_group: str,
              deadline: float, clock: Any, backoff_seconds: float = 0.1
              ) -> Generator[Address | Request | Sleep, Any, tuple[TransactionState | None, TxmqError | None]]:
    """EndTransaction of ``transaction_id`` with ``decision`` on the shard its id names,
    retried there on transient errors until ``deadline`` (``clock()``: time.monotonic).
    Steps: :class:`Address`, ``_sending.Request`` and ``_sending.Sleep``. Returns (the
    broker's state or None, the error or None); never raises."""
    broker = TransactionId.decode(transaction_id).broker
    entry = broker_pb2.ProduceEntry(end_transaction=broker_pb2.EndTransactionRequest(
        transaction_id=transaction_id, resolution=RESOLUTION_TO_PB[decision],
        source=common_pb2.TRANSACTION_SOURCE_CLIENT, producer_group=producer_group))
    attempt = 1
    address = None
    error: TxmqError | None = None
    while True:
        try:
            if address is None:
                address = yield Address(broker, attempt > 1)
            request = broker_pb2.ProduceEntry()
            request.CopyFrom(entry)
            response = yield Request(broker, address, request, False)
            return state_from_pb(response.end_transaction.state), None
        except TransactionStateError as err:
            return state_from_name(getattr(err, "state", None)), err
        except TxmqError as err:
            error = err
            if retry_action(err, bound=True) is RetryAction.FAIL:
                return None, err
        pause = min(backoff_seconds * 2 ** (attempt - 1), 2.0)
        if clock() + pause >= deadline:
            return None, error
        yield Sleep(pause)
        address = None
        attempt += 1


# --- settings and results the user sees ---------------------------------------------------

class Decisions:
    """Where a producer group keeps its decisions, and how the producer uses them: pass it
    as ``decisions=`` to :class:`txmq.TransactionProducer` (or the asyncio one).

    ``source`` gives the producer connections of its own to the same database, for checks
    and cleanup (never the caller's): a libpq connection string (psycopg 3), a SQLAlchemy
    ``Engine`` (``AsyncEngine`` for asyncio), a psycopg_pool ``ConnectionPool``
    (``AsyncConnectionPool``; each statement borrows a connection and gives it back), or a
    callable returning a new connection (a psycopg connection, or for the sync producer any
    PostgreSQL DB-API connection; an asyncio producer's callable may be a coroutine function
    returning a psycopg ``AsyncConnection``), which the producer keeps and closes. The table
    must exist (``txmq db init``). The other options are :class:`DecisionSettings`'.
    """

    def __init__(self, source: Any, *, table: str = DEFAULT_TABLE, **settings: Any) -> None:
        if source is None or (isinstance(source, str) and not source.strip()):
            raise InvalidFieldError("source", "a connection string, an engine or a connection factory is required")
        owner = getattr(source, "__self__", None)
        if owner is not None and type(owner).__module__.split(".", 1)[0] == "psycopg_pool":
            # The producer keeps a factory's connections and closes them: never given back.
            raise InvalidFieldError("source", "pass the pool itself (Decisions(pool)), not one of its methods: the "
                                              "producer keeps and closes a factory's connections, the pool would "
                                              "count them out forever")
        self.source = source
        self.settings = DecisionSettings(table=table, **settings)

    def __repr__(self) -> str:  # never the connection string: it may hold a password
        return f"Decisions(table={self.settings.table!r}, source={type(self.source).__name__})"


# --- the flows the drivers run ------------------------------------------------------------
# Steps besides a Statement (run it in a transaction of its own on the producer's
# connection; rows back) and Commit / Rollback (on the caller's connection):

class AwaitHalves:
    """Perform: wait until every half sent in the block is stored or failed; send back a
    list of (TransactionMessage or None, error or None) in the order sent."""

    __slots__ = ()


class InTransaction:
    """Perform: whether the caller's connection is still inside its transaction."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Hint:
    """Perform: EndTransaction(``decision``) of each transaction id in the background,
    without waiting (a hint: the decision is already taken)."""

    decision: LocalTransactionState
    transaction_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Ends:
    """Perform: EndTransaction(``decision``) of each transaction id (concurrently where the
    driver can), retried for ``seconds``; send back their (state, error) pairs (state None:
    not ended)."""

    decision: LocalTransactionState
    transaction_ids: tuple[str, ...]
    seconds: float = END_RETRY_SECONDS


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """Perform: queue ``key``'s COMMIT row for the next batched delete."""

    key: str


@dataclass(frozen=True, slots=True)
class Closed:
    """How a block ended: ``outcome`` None when it rolled back before any COMMIT (the
    block raised or a half failed: ``error``); the halves stored."""

    outcome: Outcome | None
    halves: tuple[Any, ...]
    error: BaseException | None = None


def closing(plan: Plan, raised: bool) -> Generator[Any, Any, Closed]:
    """The end of an anchored block: wait for the halves; if the block raised or a half
    failed, roll back and hint ROLLBACK for the halves stored; else record the halves and
    COMMIT (the decision). A refused COMMIT is a rollback (hinted); a lost one is UNKNOWN
    (no hint: the check decides from the row)."""
    results = yield AwaitHalves()
    stored = tuple(h for h, e in results if h is not None)
    error = next((e for _h, e in results if e is not None), None)
    ids = tuple(h.transaction_id for h in stored)
    if raised or error is not None:
        yield Rollback()
        if ids:
            yield Settle(rolled_back(plan.settings, plan.group, plan.key, ids))
        return Closed(None, stored, error)
    if not (yield InTransaction()):
        yield Settle(settle(plan.settings, plan.group, plan.key, ids))
        raise ended_inside_the_block(len(ids))
    plan.transaction_ids = list(ids)
    steps = plan.finish()
    commit = next(steps)
    try:
        yield commit
    except DatabaseError as err:
        try:
            steps.throw(err)
        except StopIteration:  # the answer to COMMIT was lost: the row decides, by the checks
            return Closed(Outcome.UNKNOWN, stored, err.cause)
        except DatabaseError:
            if err.sqlstate == ROW_GONE and ROW_GONE_MARK in str(err.cause):
                # Committed or rolled back inside the block, then a new transaction: that
                # one is rolled back (the commit statement refused it), the row decides.
                yield Settle(settle(plan.settings, plan.group, plan.key, ids))
                return Closed(Outcome.ROLLED_BACK, stored, ended_inside_the_block(len(ids), err.cause))
            if err.sqlstate == IDLE_IN_TRANSACTION_TIMEOUT:
                # The server ended the session before the COMMIT ran: the transaction open on
                # the connection rolled back. It is the decision's unless the caller committed
                # inside the block and went on (then the row is committed): the row decides.
                yield Settle(settle(plan.settings, plan.group, plan.key, ids))
                return Closed(Outcome.ROLLED_BACK, stored, err.cause)
            if ids:
                yield Hint(LocalTransactionState.ROLLBACK, ids)
            return Closed(Outcome.ROLLED_BACK, stored, err.cause)
    return Closed(Outcome.COMMITTED, stored)


def ended_inside_the_block(halves: int, cause: BaseException | None = None) -> InvalidFieldError:
    """The error of a block whose transaction the caller ended inside it."""
    error = InvalidFieldError("connection", f"its transaction ended inside the anchored block (a commit or "
                                            f"rollback there): its {halves} message(s) follow the decision row, "
                                            f"committed if the caller committed it, else rolled back")
    error.__cause__ = cause
    return error


@dataclass(frozen=True, slots=True)
class Settle:
    """Perform: drive ``steps`` (:func:`settle`: statements on the producer's own
    connections, ends, acknowledged) in the background, nobody waiting on it."""

    steps: Generator[Any, Any, None]


def settle(settings: DecisionSettings, group: str, key: str, transaction_ids: Sequence[str]) -> Generator[Any, Any, None]:
    """After the caller's transaction ended inside the block: what the decision row says,
    made so on the broker for every half. Committed by the caller (without its halves): it
    records them and they commit, then it goes (else the check of one half would delete it
    and the checks of the others fence the key; with no half, nothing else would delete
    it). Rolled back: the key is fenced and the halves rolled back. A database failure
    leaves them to the checks."""
    try:
        adopted = yield adopt_statement(settings, group, key, transaction_ids)
        if adopted:
            yield from acknowledge(key, transaction_ids)
            return
        if not transaction_ids:
            return  # rolled back with nothing sent: nothing to decide
        fenced = yield fence_statement(settings, group, key)
        if not fenced:
            rows = yield read_statement(settings, group, key)
            if not rows or rows[0][0] != ROLLBACK:
                return  # not for this flow to guess: the checks read the row
    except DatabaseError:
        return
    yield Ends(LocalTransactionState.ROLLBACK, tuple(transaction_ids))


def rolled_back(settings: DecisionSettings, group: str, key: str,
                transaction_ids: Sequence[str]) -> Generator[Any, Any, None]:
    """After the block's own rollback (it raised, a half failed, it was cancelled): its
    halves rolled back on the broker — unless the caller committed the decision row inside
    the block, which the rollback then did not undo: they follow the row, committed (a
    ROLLBACK for them would lose the messages of a committed transaction). A row not found
    committed never commits (the SDK sends no COMMIT after its rollback), so no fence is
    needed; a database failure leaves the halves to the checks."""
    try:
        adopted = yield adopt_statement(settings, group, key, transaction_ids)
    except DatabaseError:
        return
    if adopted:
        yield from acknowledge(key, transaction_ids)
    else:
        yield Ends(LocalTransactionState.ROLLBACK, tuple(transaction_ids))


def acknowledge(key: str, transaction_ids: Sequence[str]) -> Generator[Any, Any, tuple[bool, list[Any]]]:
    """After the local COMMIT (or a check or sweep that found a COMMIT row): commit every
    half on the broker; once all are COMMITTED there, the row may go. Returns (acknowledged,
    the errors of the ends that failed)."""
    results = yield Ends(LocalTransactionState.COMMIT, tuple(transaction_ids))
    acked = all(state is TransactionState.COMMITTED for state, _e in results)
    if acked:
        yield Acknowledged(key)
    return acked, [e for _s, e in results if e is not None]


def answer_check(settings: DecisionSettings, group: str, key: str, transaction_id: str
                 ) -> Generator[Any, Any, Verdict]:
    """A check (:func:`check`), then for a COMMIT row its halves committed on the broker
    and the row queued for deletion; for a fence it inserted, the fence confirmed
    (:func:`confirm_fence`)."""
    verdict = yield from check(settings, group, key, transaction_id)
    if verdict.commit_transaction_ids and not verdict.lists_halves:
        # Deleting it would leave the checks of its other halves to fence the key.
        yield Ends(LocalTransactionState.COMMIT, verdict.commit_transaction_ids)
    elif verdict.commit_transaction_ids:
        yield from acknowledge(key, verdict.commit_transaction_ids)
    elif verdict.source is Source.FENCED:
        verdict = yield from confirm_fence(settings, group, key, transaction_id, verdict)
    return verdict


#: How long a check retries the EndTransaction that confirms its fence (it answers the
#: check with ROLLBACK anyway when the broker does not answer in time).
FENCE_CONFIRM_SECONDS = 2.0


def confirm_fence(settings: DecisionSettings, group: str, key: str, transaction_id: str,
                  fenced: Verdict) -> Generator[Any, Any, Verdict]:
    """After a check inserted a fence: the checked half rolled back on the broker (what the
    answer says anyway). A check may be stale — claimed before the broker held the COMMIT,
    answered after the COMMIT row's delete — and its fence then names a key whose local
    transaction committed: the broker answers COMMITTED, the fence goes again (that key's
    only local transaction has committed; none can ever try it again) and the answer is
    COMMIT. Otherwise the fence stays (kept for the retention)."""
    results = yield Ends(LocalTransactionState.ROLLBACK, (transaction_id,), FENCE_CONFIRM_SECONDS)
    if not results or results[0][0] is not TransactionState.COMMITTED:
        return fenced
    try:
        yield unfence_statement(settings, group, key)
    except DatabaseError:
        pass  # the fence stays for its retention: harmless, the key is never used again
    return Verdict(LocalTransactionState.COMMIT, Source.STALE, key)


def sweep(settings: DecisionSettings, group: str) -> Generator[Any, Any, int]:
    """Fences past retention go; COMMIT rows older than ``repair_after_seconds`` are
    acknowledged again (their halves committed: idempotent) and go. Returns how many COMMIT
    rows it repaired; a database failure ends the sweep (the next one tries again)."""
    repaired = 0
    try:
        yield sweep_fences_statement(settings, group)
        rows = yield lingering_statement(settings, group)
    except DatabaseError:
        return repaired
    for key, transaction_ids in rows:
        if transaction_ids is None:
            continue  # written by a client that does not record its halves: left to the checks
        acked, _errors = yield from acknowledge(key, transaction_ids)
        repaired += acked
    return repaired
