"""The decision protocol's core (``txmq._decisions``) without a database: the check's
verdict for every outcome of its statements, the block's end for every outcome of the
COMMIT, the sweep, the statements' placeholders and the settings' bounds. (The same flows
against a real PostgreSQL: tests/integration/test_anchored*.py.)"""

from __future__ import annotations

import re
from typing import Any

import pytest

import txmq
from txmq import _decisions as core
from txmq.anchored import Decisions

S = core.DecisionSettings(in_progress_retry_seconds=0.7)
LOCKED = core.DatabaseError(core.LOCK_NOT_AVAILABLE, RuntimeError("lock timeout"))
LOST = core.DatabaseError(None, RuntimeError("connection lost"))


def drive(steps: Any, answers: list[Any]) -> tuple[Any, list[Any]]:
    """Runs a flow, answering its steps in turn (an exception is thrown in); returns its
    value and the steps it took."""
    taken: list[Any] = []
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value, taken
        taken.append(step)
        answer = answers.pop(0)
        value, error = (None, answer) if isinstance(answer, BaseException) else (answer, None)


def check(answers: list[Any], tid: str = "T1") -> tuple[core.Verdict, list[Any]]:
    return drive(core.check(S, "g", "k", tid), answers)


def test_a_fence_inserted_is_rollback():
    verdict, steps = check([[("rollback",)]])
    assert verdict.answer is txmq.LocalTransactionState.ROLLBACK and verdict.source is core.Source.FENCED
    assert "ON CONFLICT" in steps[0].sql and steps[0].params == ("g", "k", "500")


def test_a_held_key_is_in_progress_never_rollback():
    verdict, _ = check([LOCKED])
    assert verdict.answer == txmq.InProgress(retry_after_seconds=0.7) and verdict.source is core.Source.LOCKED


def test_a_commit_row_listing_the_transaction_commits_all_it_lists():
    verdict, steps = check([[], [("commit", ["T1", "T2"])]])
    assert verdict.answer is txmq.LocalTransactionState.COMMIT
    assert verdict.commit_transaction_ids == ("T1", "T2")
    assert steps[1].sql.startswith("SELECT decision, transaction_ids")


def test_a_commit_row_not_listing_the_transaction_rolls_it_back():
    """An attempt given up on (a send moved to another shard) shares the key."""
    verdict, _ = check([[], [("commit", ["T2"])]], tid="T9")
    assert verdict.answer is txmq.LocalTransactionState.ROLLBACK and verdict.source is core.Source.NOT_LISTED


def test_an_earlier_fence_is_rollback():
    verdict, _ = check([[], [("rollback", None)]])
    assert verdict.answer is txmq.LocalTransactionState.ROLLBACK and verdict.source is core.Source.FENCE_FOUND


def test_a_row_gone_between_the_statements_is_fenced_again():
    verdict, steps = check([[], [], [("rollback",)]])
    assert verdict.source is core.Source.FENCED and len(steps) == 3


@pytest.mark.parametrize("answers", [[LOST], [[], LOST], [[], [], [], []]])
def test_a_database_failure_is_unknown(answers):
    verdict, _ = check(answers)
    assert verdict.answer is txmq.LocalTransactionState.UNKNOWN and verdict.source is core.Source.UNAVAILABLE


def test_a_message_without_a_key_is_unknown_without_a_statement():
    verdict, steps = drive(core.check(S, "g", "", "T1"), [])
    assert verdict.source is core.Source.NO_KEY and steps == []


def test_answer_check_acknowledges_a_commit_row_once_the_broker_has_every_half():
    committed = txmq.TransactionState.COMMITTED
    verdict, steps = drive(core.answer_check(S, "g", "k", "T1"),
                           [[], [("commit", ["T1", "T2"])], [(committed, None), (committed, None)], None])
    assert verdict.answer is txmq.LocalTransactionState.COMMIT
    assert steps[2] == core.Ends(txmq.LocalTransactionState.COMMIT, ("T1", "T2"))
    assert steps[3] == core.Acknowledged("k")
    # One half not acknowledged: the row stays.
    _verdict, steps = drive(core.answer_check(S, "g", "k", "T1"),
                            [[], [("commit", ["T1", "T2"])], [(committed, None), (None, RuntimeError())]])
    assert not any(isinstance(s, core.Acknowledged) for s in steps)


def test_a_fence_is_confirmed_on_the_broker_and_kept_when_the_half_rolls_back():
    rolled_back = txmq.TransactionState.ROLLED_BACK
    for ended in [(rolled_back, None), (None, RuntimeError("unreachable"))]:
        verdict, steps = drive(core.answer_check(S, "g", "k", "T1"), [[("rollback",)], [ended]])
        assert verdict.answer is txmq.LocalTransactionState.ROLLBACK and verdict.source is core.Source.FENCED
        assert steps[1] == core.Ends(txmq.LocalTransactionState.ROLLBACK, ("T1",), core.FENCE_CONFIRM_SECONDS)
        assert len(steps) == 2  # nothing deletes the fence


def test_a_stale_check_whose_half_the_broker_committed_takes_its_fence_back():
    """Claimed before the broker held the COMMIT, answered after the COMMIT row's delete: the
    fence names a key that committed; the broker says COMMITTED, the fence goes, the
    answer is COMMIT (a failed delete leaves it for the retention)."""
    committed = txmq.TransactionState.COMMITTED
    for deleted in [None, LOST]:
        verdict, steps = drive(core.answer_check(S, "g", "k", "T1"),
                               [[("rollback",)], [(committed, RuntimeError("already committed"))], deleted])
        assert verdict.answer is txmq.LocalTransactionState.COMMIT and verdict.source is core.Source.STALE
        assert steps[2].sql.startswith("DELETE") and "decision = 'rollback'" in steps[2].sql
        assert steps[2].params == ("g", "k")


def half(tid: str) -> Any:
    return txmq.TransactionMessage(txmq.Message("t", b"x"), "M" + tid, tid, "broker-0", 0)


def test_closing_records_the_halves_and_commits():
    plan = core.Plan(S, "g", key="k")
    closed, steps = drive(core.closing(plan, raised=False), [[(half("T1"), None)], True, None])
    assert closed.outcome is core.Outcome.COMMITTED and [h.transaction_id for h in closed.halves] == ["T1"]
    commit = steps[2]
    assert isinstance(commit, core.Commit) and commit.statement.params == (["T1"], "g", "k")


def test_closing_with_no_half_deletes_the_row_with_the_commit():
    closed, steps = drive(core.closing(core.Plan(S, "g", key="k"), raised=False), [[], True, None])
    assert closed.outcome is core.Outcome.COMMITTED and "(DELETE FROM txmq_decisions" in steps[2].statement.sql


def test_closing_after_a_failed_half_rolls_back_and_rolls_the_others_back_from_the_row():
    boom = txmq.UnavailableError("down")
    closed, steps = drive(core.closing(core.Plan(S, "g"), raised=False),
                          [[(half("T1"), None), (None, boom)], None, None])
    assert closed.outcome is None and closed.error is boom
    assert isinstance(steps[1], core.Rollback)
    assert isinstance(steps[2], core.Settle) and not any(isinstance(s, core.Hint) for s in steps)


def test_after_the_blocks_rollback_its_halves_follow_a_row_the_caller_committed_inside_it():
    """rolled_back: no committed row (the rollback undid it): the halves are rolled back, no
    fence; a row committed inside the block (no halves recorded): they commit; a database
    failure: left to the checks."""
    rollback, commit = txmq.LocalTransactionState.ROLLBACK, txmq.LocalTransactionState.COMMIT
    steps = drive(core.rolled_back(S, "g", "k", ("T1",)), [[], None])[1]
    assert steps[0].sql.startswith("UPDATE") and steps[1] == core.Ends(rollback, ("T1",))
    committed = txmq.TransactionState.COMMITTED
    steps = drive(core.rolled_back(S, "g", "k", ("T1",)), [[("commit",)], [(committed, None)], None])[1]
    assert steps[1] == core.Ends(commit, ("T1",)) and steps[2] == core.Acknowledged("k")
    assert drive(core.rolled_back(S, "g", "k", ("T1",)), [LOST])[1][1:] == []


def test_a_refused_commit_is_rolled_back_and_a_lost_one_unknown_without_hint():
    refused = core.DatabaseError("40001", RuntimeError("serialization"))
    closed, steps = drive(core.closing(core.Plan(S, "g"), raised=False), [[(half("T1"), None)], True, refused, None])
    assert closed.outcome is core.Outcome.ROLLED_BACK and isinstance(steps[-1], core.Hint)
    closed, steps = drive(core.closing(core.Plan(S, "g"), raised=False), [[(half("T1"), None)], True, LOST])
    assert closed.outcome is core.Outcome.UNKNOWN and not any(isinstance(s, core.Hint) for s in steps)


def test_closing_refuses_a_transaction_ended_inside_the_block_and_settles_its_halves_from_the_row():
    with pytest.raises(txmq.InvalidFieldError, match="ended inside"):
        drive(core.closing(core.Plan(S, "g"), raised=False), [[(half("T1"), None)], False, None])


def test_a_commit_statement_that_finds_no_row_of_this_transaction_is_the_block_ended_inside():
    """A commit or rollback inside the block, then a new transaction: the statement before
    the COMMIT raises (ROW_GONE), the new transaction is rolled back, the row decides."""
    gone = core.DatabaseError(core.ROW_GONE, RuntimeError(f'invalid input syntax: "0{core.ROW_GONE_MARK}"'))
    closed, steps = drive(core.closing(core.Plan(S, "g"), raised=False), [[(half("T1"), None)], True, gone, None])
    assert closed.outcome is core.Outcome.ROLLED_BACK and isinstance(closed.error, txmq.InvalidFieldError)
    assert isinstance(steps[-1], core.Settle) and not any(isinstance(s, core.Hint) for s in steps)
    assert "xmin = pg_current_xact_id()::xid" in steps[2].statement.sql


def test_a_session_the_server_ended_for_idling_is_rolled_back_and_settled_from_the_row():
    """25P03 (the server's FATAL for idle_in_transaction_session_timeout, raised before a
    COMMIT it read could run): the transaction open on the connection rolled back, but it is
    not the decision's when the caller committed inside the block, so the row decides
    (Settle), never a blind ROLLBACK hint."""
    idle = core.DatabaseError(core.IDLE_IN_TRANSACTION_TIMEOUT, RuntimeError("idle-in-transaction timeout"))
    closed, steps = drive(core.closing(core.Plan(S, "g"), raised=False), [[(half("T1"), None)], True, idle, None])
    assert closed.outcome is core.Outcome.ROLLED_BACK and closed.error is idle.cause
    assert isinstance(steps[-1], core.Settle) and not any(isinstance(s, core.Hint) for s in steps)


class _ServerError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


class _LostConnection:
    """A caller's connection (txmq.anchored.LocalConnection) that was lost."""

    def sqlstate(self, error: BaseException) -> str | None:
        return None


def test_only_the_idle_in_transaction_timeout_of_a_lost_connection_is_told():
    """A lost connection's outcome is unknown (None), except 25P03. PostgreSQL 17's
    transaction_timeout (25P04) can fire after the commit is durable: unknown."""
    from txmq._database import commit_sqlstate

    assert commit_sqlstate(_LostConnection(), _ServerError("25P03")) == core.IDLE_IN_TRANSACTION_TIMEOUT
    assert commit_sqlstate(_LostConnection(), _ServerError("25P04")) is None
    assert commit_sqlstate(_LostConnection(), _ServerError("57P01")) is None  # admin shutdown: unknown
    assert commit_sqlstate(_LostConnection(), RuntimeError("EOF")) is None


def settle(answers: list[Any], ids: tuple[str, ...] = ("T1", "T2")) -> list[Any]:
    return drive(core.settle(S, "g", "k", ids), answers)[1]


def test_settle_commits_every_half_of_a_row_the_caller_committed_then_deletes_it():
    committed = txmq.TransactionState.COMMITTED
    steps = settle([[("commit",)], [(committed, None), (committed, None)], None])
    assert steps[0].sql.startswith("UPDATE") and "transaction_ids IS NULL" in steps[0].sql
    assert steps[1] == core.Ends(txmq.LocalTransactionState.COMMIT, ("T1", "T2"))
    assert steps[2] == core.Acknowledged("k")
    assert settle([[("commit",)], [], None], ids=())[-1] == core.Acknowledged("k")  # no half: the row goes


def test_settle_fences_a_row_the_caller_rolled_back_and_rolls_its_halves_back():
    steps = settle([[], [("rollback",)], []])
    assert "ON CONFLICT" in steps[1].sql and steps[2] == core.Ends(txmq.LocalTransactionState.ROLLBACK, ("T1", "T2"))
    assert settle([[]], ids=()) == settle([[]], ids=())[:1]  # nothing sent: no fence
    assert len(settle([LOST])) == 1  # the database failed: left to the checks


def test_a_commit_row_that_lists_no_halves_commits_the_checked_one_and_stays():
    """Deleted after one half's check, the checks of the others would fence the key."""
    committed = txmq.TransactionState.COMMITTED
    verdict, steps = drive(core.answer_check(S, "g", "k", "T1"), [[], [("commit", None)], [(committed, None)]])
    assert verdict.answer is txmq.LocalTransactionState.COMMIT
    assert steps[-1] == core.Ends(txmq.LocalTransactionState.COMMIT, ("T1",))
    assert "transaction_ids IS NULL" in core.sweep_fences_statement(S, "g").sql  # swept after the retention


def test_the_sweep_repairs_only_rows_that_list_their_halves():
    committed = txmq.TransactionState.COMMITTED
    repaired, steps = drive(core.sweep(S, "g"), [None, [("k1", ["T1"]), ("k2", None)], [(committed, None)], None])
    assert repaired == 1 and steps[-1] == core.Acknowledged("k1")
    assert drive(core.sweep(S, "g"), [LOST])[0] == 0


def test_the_begin_statement_bounds_the_transaction_and_sets_durable_commit():
    st = core.begin_statement(S, "g", "k")
    assert st.params == ("g", "k", "60000", "300000")
    assert "'synchronous_commit', 'on', true" in st.sql and "idle_in_transaction_session_timeout" in st.sql
    unbounded = core.DecisionSettings(idle_in_transaction_timeout_seconds=None, statement_timeout_seconds=None)
    assert core.begin_statement(unbounded, "g", "k").params == ("g", "k")


def test_placeholders():
    sql = "SELECT %s, %s"
    assert core.placeholders(sql, "format") == sql
    assert core.placeholders(sql, "qmark") == "SELECT ?, ?"
    assert core.placeholders(sql, "numeric") == "SELECT :1, :2"
    assert core.placeholders(sql, "dollar") == "SELECT $1, $2"
    with pytest.raises(txmq.InvalidFieldError, match="paramstyle"):
        core.placeholders(sql, "named")


@pytest.mark.parametrize("options, field", [
    ({"table": "x; DROP TABLE y"}, "table"),
    ({"check_lock_timeout_seconds": 0}, "check_lock_timeout_seconds"),
    ({"fence_retention_seconds": 100.0}, "fence_retention_seconds"),  # not longer than the statement bound
    ({"delete_batch": 0}, "delete_batch"),
    ({"in_progress_retry_seconds": float("nan")}, "in_progress_retry_seconds"),
])
def test_settings_refuse_bad_values(options, field):
    with pytest.raises(txmq.InvalidFieldError) as info:
        Decisions("dbname=x", **options)
    assert info.value.field == field


def test_the_key_and_anchor_properties_are_reserved_and_stamped():
    plan = core.Plan(S, "g", key="abc")
    assert plan.properties({"a": "1"}) == {"a": "1", txmq._types.TRANSACTION_KEY_PROPERTY: "abc",
                                           core.ANCHOR_PROPERTY: core.PROTOCOL_VERSION}
    with pytest.raises(txmq.InvalidFieldError, match="reserved"):
        plan.properties({core.ANCHOR_PROPERTY: "1"})


def test_decisions_never_shows_its_connection_string():
    assert "secret" not in repr(Decisions("host=db password=secret"))
    with pytest.raises(txmq.InvalidFieldError, match="source"):
        Decisions("  ")


def test_the_anchored_exports():
    import txmq.anchored

    assert sorted(txmq.anchored.__all__) == sorted([
        "ANCHOR_PROPERTY", "DEFAULT_TABLE", "AnchoredResult", "AnchoredTransaction", "AsyncAnchoredResult",
        "AsyncPsycopgConnection", "AsyncSQLAlchemySession", "DBAPIConnection", "DecisionSettings", "Decisions",
        "LocalConnection", "PsycopgConnection", "SQLAlchemySession", "resolver_grants_sql", "schema_sql"])


@pytest.mark.parametrize("version, shown", [(120015, "12.15"), (90624, "9.6")])
def test_db_init_refuses_a_server_older_than_13_naming_its_version(version, shown):
    from txmq._db_cli import require_server_version

    with pytest.raises(txmq.InvalidFieldError, match=rf"PostgreSQL {re.escape(shown)}; .*13 or later") as err:
        require_server_version(version)
    assert err.value.field == "dsn"
    require_server_version(130000)
    require_server_version(150004)
