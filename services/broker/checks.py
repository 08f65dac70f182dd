"""Transaction checks: claiming due checks for the checkers (fairly across producer
groups, within each group's capacity, under a lease and a claim token) and applying their
reports — delivered (one unit of ``check_max`` spent), answered (a decision, UNKNOWN or
IN_PROGRESS), undelivered (due again, nothing spent) — including late answers, which
still decide a transaction nobody decided yet.

A claim's cost follows due work, not the number of groups: only groups whose floor (see
``schedule.py``) has come are touched, and a checker's claim session names its groups
only when they change.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

from txmq.errors import InvalidFieldError, StaleClaimError, TransactionNotFoundError, TransactionStateError, TxmqError
from txmq.names import validate_group

from .base import BrokerContext
from .model import (RESOLUTION_COMMIT, RESOLUTION_ROLLBACK, STATE_COMMITTED, STATE_DISCARDED, STATE_NAMES,
                    STATE_PREPARED, STATE_ROLLED_BACK, CheckAnswer, CheckOutcome)
from .schedule import NO_DUE_MS, CheckSchedule
from .store import codec
from .store.codec import TxnRow
from .store.db import OpWrites
from .transactions import Transactions

OUTCOME_DELIVERED = CheckOutcome.DELIVERED
OUTCOME_ANSWERED = CheckOutcome.ANSWERED
OUTCOME_UNDELIVERED = CheckOutcome.UNDELIVERED
CHECK_COMMIT = CheckAnswer.COMMIT
CHECK_ROLLBACK = CheckAnswer.ROLLBACK
CHECK_UNKNOWN = CheckAnswer.UNKNOWN
CHECK_IN_PROGRESS = CheckAnswer.IN_PROGRESS
CHECK_RESULTS = tuple(CheckAnswer)


@dataclass(slots=True, frozen=True)
class CheckReport:
    """What became of one claimed check (broker.proto CheckReport)."""

    transaction_id: str
    claim_token: str
    outcome: int
    result: int = 0
    retry_after_seconds: float = 0.0
    answer_timeout_seconds: float = 0.0
    #: The answering producer's group; a late answer without a claim token must name it.
    producer_group: str = ""


@dataclass(slots=True, frozen=True)
class ClaimedCheck:
    row: TxnRow
    due_ms: int
    attempt: int


@dataclass(slots=True)
class ClaimBatch:
    checks: list[ClaimedCheck]
    #: A served group has more due than this claim took (claim again at once).
    more_due: bool = False
    #: The session's groups are not known at this version: nothing claimed, send them.
    groups_needed: bool = False


@dataclass(slots=True)
class ClaimSession:
    """A checker's claim session: its groups and their capacity, at a version."""

    version: int
    groups: dict[str, int]


#: Claim sessions kept (the least recently used is forgotten; its checker sends its groups again).
MAX_CLAIM_SESSIONS = 1024
#: Most groups one claim session may name.
MAX_SESSION_GROUPS = 100_000


class Claims:
    """Claims and reports."""

    def __init__(self, ctx: BrokerContext, schedule: CheckSchedule, transactions: Transactions) -> None:
        self.ctx = ctx
        self.schedule = schedule
        self.transactions = transactions
        #: Claim sessions by id, the least recently used first.
        self._sessions: collections.OrderedDict[str, ClaimSession] = collections.OrderedDict()
        #: The turn that orders the groups of a claim (one more every claim).
        self._turn = 0

    def session_groups(self, session_id: str) -> dict[str, int]:
        """The groups (and capacity) a claim session holds now (empty: none known)."""
        session = self._sessions.get(session_id)
        return dict(session.groups) if session is not None else {}

    def claim_op(self, groups: Iterable[str], max_checks: int, lease_seconds: float,
                 ) -> Callable[[OpWrites], list[ClaimedCheck]]:
        """A claim without a session: ``groups`` named in full, each up to ``max_checks``."""
        groups = set(groups)
        for g in groups:
            validate_group("producer_groups", g)
        self._validate_claim(max_checks, lease_seconds)
        batch = self._claim({g: max_checks for g in groups}, {}, max_checks, lease_seconds)
        return lambda w: batch(w).checks

    def session_claim_op(self, session_id: str, groups_version: int, groups: Mapping[str, int] | None,
                         limits: Mapping[str, int], max_checks: int, lease_seconds: float,
                         ) -> Callable[[OpWrites], ClaimBatch]:
        """A claim in a session (broker.proto ClaimChecksRequest): ``groups`` (group →
        capacity) only when the checker's list changed; without it the session's list at
        ``groups_version`` is used, or the batch asks for it (``groups_needed``)."""
        if not session_id or len(session_id) > 128:
            raise InvalidFieldError("session_id", "1 to 128 characters")
        self._validate_claim(max_checks, lease_seconds)
        if groups is not None:
            if len(groups) > MAX_SESSION_GROUPS:
                raise InvalidFieldError("groups", f"at most {MAX_SESSION_GROUPS} groups, got {len(groups)}")
            for g, capacity in groups.items():
                validate_group("groups", g)
                if capacity < 0:
                    raise InvalidFieldError("groups", f"capacity of {g!r} is negative: {capacity}")
        for g, limit in limits.items():
            if limit < 0:
                raise InvalidFieldError("limits", f"limit of {g!r} is negative: {limit}")
        sessions = self._sessions
        if groups is not None:
            sessions[session_id] = ClaimSession(groups_version, dict(groups))
            while len(sessions) > MAX_CLAIM_SESSIONS:
                sessions.popitem(last=False)
        session = sessions.get(session_id)
        if session is None or session.version != groups_version:
            return lambda w: ClaimBatch([], groups_needed=True)
        sessions.move_to_end(session_id)
        return self._claim(session.groups, limits, max_checks, lease_seconds)

    @staticmethod
    def _validate_claim(max_checks: int, lease_seconds: float) -> None:
        if max_checks <= 0:
            raise InvalidFieldError("max_checks", "must be positive")
        if not 0 < lease_seconds <= 3600:
            raise InvalidFieldError("lease_seconds", f"{lease_seconds} is outside (0, 3600]")

    def _claim(self, capacity: Mapping[str, int], limits: Mapping[str, int], max_checks: int,
               lease_seconds: float) -> Callable[[OpWrites], ClaimBatch]:
        """Claims due checks of the groups in ``capacity``, each at most its limit (its
        capacity unless ``limits`` names it), sharing ``max_checks`` fairly: the groups with
        due work, in an order that turns by one every claim, each get an equal share of what
        the groups before them left. Only groups whose earliest due time has come are
        touched (the floors kept in memory), so a claim costs nothing per idle group."""
        lease_ms = int(lease_seconds * 1000)

        def op(w: OpWrites) -> ClaimBatch:
            schedule = self.schedule
            now = self.ctx.clock()
            batch = ClaimBatch([])
            scans: list[tuple[str, int, Iterator[ClaimedCheck]]] = []
            floors: dict[str, tuple[int, int]] = {}
            for group in schedule.pop_due_groups(now):
                limit = min(limits.get(group, capacity.get(group, 0)), capacity.get(group, 0))
                if limit > 0:
                    # Set here: a scan the batch fills up before never runs a line.
                    floors[group] = schedule.floor(group)
                    scans.append((group, limit, self._claim_group(w, group, now, lease_ms, floors)))
                else:  # due, but not served here (or no capacity now): it stays due
                    schedule.set_floor(group, *schedule.floor(group))
            if scans:
                turn = self._turn % len(scans)
                scans = scans[turn:] + scans[:turn]
            self._turn += 1
            # Round-robin: one check from each group in turn, so every group with due work
            # gets an equal share of the batch, up to its limit.
            taken: dict[str, int] = {}
            active = scans
            while active and len(batch.checks) < max_checks:
                still = []
                for group, limit, scan in active:
                    if len(batch.checks) >= max_checks:
                        still.append((group, limit, scan))
                        continue
                    check = next(scan, None)
                    if check is None:
                        continue
                    batch.checks.append(check)
                    taken[group] = taken.get(group, 0) + 1
                    if taken[group] < limit:
                        still.append((group, limit, scan))
                active = still
            for group, limit, _scan in scans:
                floor = floors[group]
                if taken.get(group):
                    floor = min(floor, (now + lease_ms, 0))  # the leases staged, due at now + lease
                schedule.set_floor(group, *floor)
                if floors[group][0] <= now and taken.get(group, 0) < limit:
                    batch.more_due = True  # the batch was full before this group's limit
            return batch
        return op

    def _claim_group(self, w: OpWrites, group: str, now: int, lease_ms: int,
                     floors: dict[str, tuple[int, int]]) -> Iterator[ClaimedCheck]:
        """Claims the group's due checks one by one, oldest first, as they are pulled;
        ``floors[group]`` (where the scan starts) is kept at a (time, seq) below every due
        key not yet claimed."""
        # Start at the group's floor, not its prefix: the claimed keys before it are
        # deleted, and a scan from the prefix would walk their tombstones every time (a
        # claim's cost must grow with due work, never with work already done).
        start = codec.group_time_key(group, *floors[group])
        for key, _ in self.ctx.db.scan("due", start, group.encode() + b"\x01"):
            _g, due_ms, seq = codec.split_group_time_key(key)
            if due_ms > now:
                floors[group] = (due_ms, seq)
                return  # the earliest key left (the scan sees no key this batch staged)
            floors[group] = (due_ms, seq + 1)
            row = self.ctx.read_txn(seq)
            if row is None or row.state != STATE_PREPARED or row.next_due_ms != due_ms:
                w.delete("due", key)  # stale index entry
                continue
            spent = self._spent(row, now)
            if spent:
                self.transactions.discard(w, row, spent)
                continue
            row.next_due_ms = now + lease_ms
            row.claim_token = os.urandom(8).hex()
            w.delete("due", key)
            self.schedule.put(w, group, row.next_due_ms, seq)
            w.put("txn", codec.txn_key(seq), codec.encode_txn(row))
            yield ClaimedCheck(row, due_ms, row.checks_delivered + 1)
        floors[group] = (NO_DUE_MS, 0)

    def _spent(self, row: TxnRow, now: int) -> str:
        """Why a PREPARED transaction must be discarded now ('' when it must not)."""
        cfg = self.ctx.config
        if now >= row.prepared_ms + int(cfg.max_transaction_lifetime_seconds * 1000):
            return (f"max_transaction_lifetime_seconds={cfg.max_transaction_lifetime_seconds:g} exceeded "
                    f"without a decision")
        if row.checks_delivered >= cfg.check_max:
            return (f"check budget spent: {row.checks_delivered} checks received by the group "
                    f"(check_max={cfg.check_max}), none decided")
        return ""

    def report_op(self, reports: list[CheckReport],
                  ) -> Callable[[OpWrites], list[tuple[Exception | None, int, bool]]]:
        """Outcomes of claimed checks (see broker.proto CheckOutcome): per report (the
        refusal or None, the transaction's state after it, whether it was a late answer)."""
        parsed: list[int | Exception] = []
        for r in reports:
            try:
                if r.outcome not in (OUTCOME_DELIVERED, OUTCOME_ANSWERED, OUTCOME_UNDELIVERED):
                    raise InvalidFieldError("outcome", "must be DELIVERED, ANSWERED or UNDELIVERED")
                if r.outcome == OUTCOME_ANSWERED and r.result not in CHECK_RESULTS:
                    raise InvalidFieldError("result", "must be COMMIT, ROLLBACK, UNKNOWN or IN_PROGRESS")
                if r.retry_after_seconds < 0 or r.answer_timeout_seconds < 0:
                    raise InvalidFieldError("retry_after_seconds", "must not be negative")
                parsed.append(self.ctx.parse_txn_id(r.transaction_id))
            except Exception as exc:  # noqa: BLE001 - reported per entry
                parsed.append(exc)

        def op(w: OpWrites) -> list[tuple[Exception | None, int, bool]]:
            now = self.ctx.clock()
            rows: dict[int, TxnRow | None] = {}
            out: list[tuple[Exception | None, int, bool]] = []
            for r, seq in zip(reports, parsed):
                if isinstance(seq, Exception):
                    out.append((seq, 0, False))
                    continue
                if seq not in rows:
                    rows[seq] = self.ctx.read_txn(seq)
                row = rows[seq]
                try:
                    if row is None:
                        raise TransactionNotFoundError(r.transaction_id)
                    late = self._apply_report(w, row, r, now)
                    out.append((None, row.state, late))
                except TxmqError as exc:
                    out.append((exc, row.state if row is not None else 0, False))
            return out
        return op

    def _apply_report(self, w: OpWrites, row: TxnRow, r: CheckReport, now: int) -> bool:
        """Applies one report; True when it was a late answer (not on the current claim)
        that decided the transaction."""
        if r.producer_group and r.producer_group != row.producer_group:
            raise InvalidFieldError("producer_group", f"{r.producer_group!r} is not the group of "
                                                      f"{self.ctx.txn_id(row.seq)}")
        if not r.claim_token or r.claim_token != row.claim_token:
            if r.outcome != OUTCOME_ANSWERED:
                raise StaleClaimError(self.ctx.txn_id(row.seq), "not the transaction's current claim (never sent, "
                                      "superseded by a later claim, or the transaction was decided)")
            return self._late_answer(w, row, r)
        cfg = self.ctx.config
        transactions, schedule = self.transactions, self.schedule
        if r.outcome == OUTCOME_ANSWERED:
            row.checks_answered += 1
            if r.result in (CHECK_COMMIT, CHECK_ROLLBACK):
                if row.state in (STATE_PREPARED, STATE_DISCARDED):
                    transactions.decide(w, row, STATE_COMMITTED if r.result == CHECK_COMMIT else STATE_ROLLED_BACK,
                                        codec.SOURCE_CHECK)
                return False
            if row.state != STATE_PREPARED:
                w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
                return False
            if r.result == CHECK_IN_PROGRESS:
                row.checks_delivered = max(row.checks_delivered - 1, 0)  # IN_PROGRESS spends nothing
                end = row.prepared_ms + int(cfg.max_transaction_lifetime_seconds * 1000)
                retry_ms = int(max(r.retry_after_seconds, 0.001) * 1000)
                row.in_progress_until_ms = min(now + retry_ms, end)
                schedule.reschedule(w, row, row.in_progress_until_ms)
                return False
            row.unknown_answers += 1
            spent = self._spent(row, now)
            if spent:
                transactions.discard(w, row, spent)
            else:
                w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))
            return False
        if row.state != STATE_PREPARED:
            raise StaleClaimError(self.ctx.txn_id(row.seq), f"the transaction is {STATE_NAMES[row.state]}")
        if r.outcome == OUTCOME_DELIVERED:
            row.checks_delivered += 1
            answer_ms = int(r.answer_timeout_seconds * 1000)
            if row.checks_delivered >= cfg.check_max:
                wait_ms = answer_ms or int(cfg.check_interval_seconds * 1000)
                schedule.reschedule(w, row, now + max(wait_ms, 1))
            else:
                # Never due again before the answer may still come: a new claim would
                # make that answer stale.
                schedule.reschedule(w, row, now + max(schedule.next_check_delay_ms(row.checks_delivered), answer_ms))
        else:  # UNDELIVERED: nobody took it, nothing spent; due again now
            row.claim_token = ""
            schedule.reschedule(w, row, now)
        return False

    def _late_answer(self, w: OpWrites, row: TxnRow, r: CheckReport) -> bool:
        """An answer on a claim that is no longer current (the answer timeout passed, the
        check was claimed again, the checker restarted) or on none (it reached another
        checker). COMMIT/ROLLBACK decide a transaction nobody decided yet, and are accepted
        as they are by one decided the same way; one decided otherwise refuses them. Nothing
        is spent; a late UNKNOWN or IN_PROGRESS changes nothing. True when it decided."""
        # Not on a current claim: the group the answering stream serves is the only proof
        # it is the transaction's, so it must be named, and be the transaction's.
        if not r.producer_group:
            raise InvalidFieldError("producer_group", "an answer not on the current claim must name the "
                                                      "transaction's group")
        if r.producer_group != row.producer_group:
            raise InvalidFieldError("producer_group", f"{r.producer_group!r} is not the group of "
                                                      f"{self.ctx.txn_id(row.seq)}")
        if r.result not in (CHECK_COMMIT, CHECK_ROLLBACK):
            return False
        target = STATE_COMMITTED if r.result == CHECK_COMMIT else STATE_ROLLED_BACK
        if row.state in (STATE_PREPARED, STATE_DISCARDED):
            row.checks_answered += 1
            self.transactions.decide(w, row, target, codec.SOURCE_CHECK)
            return True
        if row.state != target:
            raise TransactionStateError(self.ctx.txn_id(row.seq), STATE_NAMES[row.state],
                                        RESOLUTION_COMMIT if r.result == CHECK_COMMIT else RESOLUTION_ROLLBACK)
        return False
