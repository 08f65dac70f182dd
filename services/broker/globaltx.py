"""Multi-message (global) transactions: the broker's side of the commit protocol in
docs/features-design.md ("Multi-message transactions across shards").

A global transaction ``G`` is the transaction of its first message: that half message is
sent with ``begin_global`` to the *coordinator* shard, and ``G`` is its transaction id (so
it names the coordinator and carries a checksum, like every id). Its row is an ordinary
transaction row with an ordinary check schedule: checks, ``check_max``, discard and
operator decisions act on ``G`` exactly as on one message. Further messages are half
messages sent with ``global_transaction_id = G`` (to any shard, the coordinator included):
*parts*, stored PREPARED with no check schedule of their own (the producer is never asked
about a part, only about ``G``), and refused a decision of their own.

- **Commit point**: the batch that decides ``G``'s row (EndTransaction(G), a check answer,
  an operator). The same batch decides every part of ``G`` stored on the coordinator and,
  when ``G`` named other participants, writes a *push row*: the participants still to tell.
- **Pushes**: the leader's :class:`~services.broker.globalpump.GlobalPump` sends
  ApplyGlobalTransaction to each participant until it answers, then removes it from the
  push row (a new leader, or a restarted broker, finds the row and goes on).
- **Apply**: a participant decides all its parts of ``G`` in one batch (so they become
  visible together, consecutive in each queue); a repeat finds none and answers 0.
- **Pull**: a participant whose parts of ``G`` are still PREPARED
  ``transaction_timeout_seconds`` after they were stored asks the coordinator
  (ResolveGlobalTransaction, naming itself: the coordinator adds it to ``G``'s participants
  so a later decision is pushed to it): decided → applied; discarded → its parts are
  discarded and it stops asking; PREPARED → asked again every ``check_interval_seconds``;
  ``G`` unknown to its coordinator → rolled back.
- **Discard** acts on the whole transaction: the batch that discards ``G`` (check budget
  or lifetime spent) discards its parts on the coordinator and writes a push row with state
  DISCARDED, so each participant discards its parts to ``%DISCARD%<group>`` on its own
  shard. Discarded parts keep their ``B`` rows: a later decision of ``G`` (an operator's
  ``txmq txn resolve G``, a late answer) is pushed to every participant again and decides
  every part, discarded or not.

Rows live in the ``global`` column family (``store/globalcodec.py``), written in the same
batch as the transaction rows they belong to; they hold only live state (open ``G``,
pushes due, undecided parts) and are deleted as it ends. The in-memory maps mirror them
and are rebuilt from them when a term starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from txmq.errors import InvalidFieldError, TransactionNotFoundError, TransactionStateError
from txmq.ids import TransactionId
from txmq.names import GLOBAL_TRANSACTION_PROPERTY

from . import failpoints
from .base import BrokerContext
from .model import (KIND_HALF, RESOLUTION_UNKNOWN, STATE_COMMITTED, STATE_DISCARDED, STATE_NAMES,
                    STATE_PREPARED, STATE_ROLLED_BACK, SendResult)
from .sends import Sends
from .store import codec, globalcodec
from .store.codec import LogRecord, TxnRow
from .store.db import OpWrites
from .transactions import Transactions

#: Most participants a global transaction may name.
MAX_PARTICIPANTS = 256
_SOURCES = (codec.SOURCE_CLIENT, codec.SOURCE_CHECK, codec.SOURCE_OPERATOR, codec.SOURCE_BROKER)
#: How G ended, as the metrics name it (``txmq_global_transactions_total{result}``).
OUTCOMES: dict[int, str] = {STATE_COMMITTED: "committed", STATE_ROLLED_BACK: "rolled_back", STATE_DISCARDED: "discarded"}


@dataclass
class GlobalState:
    """The live global-transaction work on this broker, mirroring the ``global`` rows (kept
    by :class:`Globals`, read by ``globalviews.py``)."""

    #: Open G on this coordinator (PREPARED or DISCARDED): G's seq → its other participants.
    open: dict[int, list[str]] = field(default_factory=dict)
    #: Undecided parts stored here: G id → their seqs (G's own first message is not one).
    parts: dict[str, list[int]] = field(default_factory=dict)
    #: The reverse: a part's seq → its G id.
    part_of: dict[int, str] = field(default_factory=dict)
    #: Decided G whose participants are not all told: G's seq → (state, source, participants left).
    push: dict[int, tuple[int, int, list[str]]] = field(default_factory=dict)
    #: Remote G with undecided parts here → when to ask its coordinator (broker clock, ms).
    pull: dict[str, int] = field(default_factory=dict)
    #: The parts in ``part_of`` that are DISCARDED (G was discarded), not PREPARED.
    discarded: set[int] = field(default_factory=set)
    #: Since when each push row has been waiting (broker clock, ms; a restart starts it again).
    push_since: dict[int, int] = field(default_factory=dict)


class Globals:
    """Begin, parts, the decision and discard hooks, apply, resolve, pushes and pulls."""

    def __init__(self, ctx: BrokerContext, transactions: Transactions, sends: Sends) -> None:
        self.ctx = ctx
        self.transactions = transactions
        self.sends = sends
        self.state = GlobalState()
        self._load()
        transactions.on_decide.append(self._decided)
        transactions.on_discard.append(self._discarded)
        transactions.end_guards.append(self._guard_end)

    def _load(self) -> None:
        """At start (every term): the live rows of the ``global`` column family."""
        ctx, state = self.ctx, self.state
        # A restarted participant asks about its parts after the timeout, as a new part would:
        # the coordinator's pushes (resumed from its rows) usually come first. Parts that are
        # all DISCARDED wait for the decision's push (their shard is G's participant).
        now = ctx.clock()
        pull_at = now + int(ctx.config.transaction_timeout_seconds * 1000)
        live = list(ctx.db.scan("global", globalcodec.PART, b"C")) + list(ctx.db.scan("global", globalcodec.OPEN, b"Q"))
        for key, value in live:  # not the M rows: they hold no live work
            kind = key[:1]
            if kind == globalcodec.OPEN:
                state.open[globalcodec.split_seq_key(key)] = globalcodec.decode_participants(value, key)
            elif kind == globalcodec.PUSH:
                state.push[globalcodec.split_seq_key(key)] = globalcodec.decode_push(value, key)
                state.push_since[globalcodec.split_seq_key(key)] = now
            elif kind == globalcodec.PART:
                gid, seq = globalcodec.split_part_key(key)
                state.parts.setdefault(gid, []).append(seq)
                state.part_of[seq] = gid
                row = ctx.read_txn(seq)
                if row is not None and row.state == STATE_DISCARDED:
                    state.discarded.add(seq)
                elif TransactionId.decode(gid).broker != ctx.name:
                    state.pull[gid] = pull_at

    # --- sends -----------------------------------------------------------------------------

    def global_send_op(self, record: LogRecord, *, begin: bool, participants: list[str],
                       global_id: str) -> Callable[[OpWrites], SendResult]:
        """A send (``Sends.send_op``), or a half message that begins a global transaction or
        is a further part of one; ``record`` must have passed ``validate_message``."""
        ctx, state = self.ctx, self.state
        if GLOBAL_TRANSACTION_PROPERTY in record.properties and not (begin or global_id):
            raise InvalidFieldError("properties", f"{GLOBAL_TRANSACTION_PROPERTY} is reserved: the broker sets it")
        if not (begin or global_id):
            if participants:
                raise InvalidFieldError("global_participants", "only with begin_global")
            return self.sends.send_op(record)
        field_name = "begin_global" if begin else "global_transaction_id"
        if record.kind != KIND_HALF:
            raise InvalidFieldError(field_name, "only a half message (type TRANSACTION) is part of a global "
                                    "transaction")
        if begin and global_id:
            raise InvalidFieldError("global_transaction_id", "the first message of a global transaction has "
                                    "none: its own transaction id becomes the global transaction's")
        if participants and not begin:
            raise InvalidFieldError("global_participants", "only with begin_global")
        if len(participants) > MAX_PARTICIPANTS:
            raise InvalidFieldError("global_participants", f"at most {MAX_PARTICIPANTS}, got {len(participants)}")
        for shard in participants:
            if not 0 < len(shard.encode()) <= 255 or "\x00" in shard:
                raise InvalidFieldError("global_participants", f"{shard!r} is not a broker name")
        others = sorted({p for p in participants if p != ctx.name})
        local_g = 0
        if global_id:
            tid = TransactionId.decode(global_id)
            if tid.broker == ctx.name:
                local_g = ctx.parse_txn_id(global_id)
            record.properties[GLOBAL_TRANSACTION_PROPERTY] = global_id
        # A part has no check schedule of its own: the producer is asked about G only.
        send = self.sends.send_op(record, checked=begin)
        timeout_ms = int(ctx.config.transaction_timeout_seconds * 1000)

        def op(w: OpWrites) -> SendResult:
            failpoints.hit("begin.before" if begin else "part.before")
            repeat = ctx.db.get("dedup", record.message_id.encode()) is not None
            if local_g and not repeat:
                self._check_local_g(global_id, local_g, record.producer_group)
            seq = ctx.sequence.next  # the one the send takes
            if begin:
                record.properties[GLOBAL_TRANSACTION_PROPERTY] = ctx.txn_id(seq)
            result = send(w)
            if result.duplicate or result.state != STATE_PREPARED:
                return result
            if begin:
                w.put("global", globalcodec.open_key(seq), globalcodec.encode_participants(others))
                state.open[seq] = others
                w.on_durable(lambda: failpoints.hit("begin.after"))
                return result
            w.put("global", globalcodec.part_key(global_id, seq), b"")
            w.put("global", globalcodec.member_key(global_id, seq), b"")
            state.parts.setdefault(global_id, []).append(seq)
            state.part_of[seq] = global_id
            if not local_g:
                due = ctx.clock() + timeout_ms
                state.pull[global_id] = min(state.pull.get(global_id, due), due)
                w.on_durable(ctx.listeners.notify_global_due)
            w.on_durable(lambda: failpoints.hit("part.after"))
            return result
        return op

    def _check_local_g(self, global_id: str, seq: int, group: str) -> None:
        """A part for a G this broker coordinates: G must exist, be undecided, be of its group."""
        row = self.ctx.read_txn(seq)
        if row is None:
            raise TransactionNotFoundError(global_id)
        if seq not in self.state.open:
            if row.state in (STATE_COMMITTED, STATE_ROLLED_BACK):
                raise TransactionStateError(global_id, STATE_NAMES[row.state], "a further part")
            raise InvalidFieldError("global_transaction_id", f"{global_id} does not begin a global transaction")
        if row.state == STATE_DISCARDED:  # its checks are spent: it takes no new part
            raise TransactionStateError(global_id, STATE_NAMES[row.state], "a further part")
        if row.producer_group != group:
            raise InvalidFieldError("producer_group", f"{group!r} is not the group of {global_id}")

    # --- the hooks on every decision, discard and EndTransaction ------------------------------

    def _decided(self, w: OpWrites, row: TxnRow, _was: int, source: int) -> None:
        """Deciding G's row also decides G (the commit point): its parts here in the same
        batch, and a push row for its other participants."""
        seq = row.seq
        if seq not in self.state.open:
            return
        failpoints.hit("decide.before")  # nothing of the batch is written yet
        others = self.state.open.pop(seq)
        w.delete("global", globalcodec.open_key(seq))
        self._decide_parts(w, self.ctx.txn_id(seq), row.state, source)
        # Every participant, also one already told a discard (this row replaces that one).
        self._push_to(w, seq, row.state, source, others)
        self._outcome(w, row.state)
        w.on_durable(lambda: failpoints.hit("decide.after"))

    def _discarded(self, w: OpWrites, row: TxnRow, reason: str) -> None:
        """Discarding G discards the transaction as a whole: its parts here in the same batch,
        and its other participants' by a push (state DISCARDED)."""
        others = self.state.open.get(row.seq)
        if others is None:
            return
        gid = self.ctx.txn_id(row.seq)
        self._discard_parts(w, gid, f"global transaction {gid} discarded: {reason}")
        self._push_to(w, row.seq, STATE_DISCARDED, codec.SOURCE_BROKER, others)
        self._outcome(w, STATE_DISCARDED)

    def _guard_end(self, transaction_id: str, seq: int, resolution: str) -> None:
        """EndTransaction is refused for an undecided part of a global transaction (end G)."""
        gid = self.state.part_of.get(seq)
        if gid is not None and resolution != RESOLUTION_UNKNOWN:
            raise InvalidFieldError("transaction_id", f"{transaction_id} is a part of global transaction "
                                    f"{gid}: end {gid} instead")

    def _push_to(self, w: OpWrites, seq: int, state: int, source: int, others: list[str]) -> None:
        pushes = self.state
        if others:
            w.put("global", globalcodec.push_key(seq), globalcodec.encode_push(state, source, others))
            pushes.push[seq] = (state, source, list(others))
            pushes.push_since.setdefault(seq, self.ctx.clock())
            w.on_durable(self.ctx.listeners.notify_global_due)
        elif seq in pushes.push:
            w.delete("global", globalcodec.push_key(seq))
            del pushes.push[seq]
            pushes.push_since.pop(seq, None)

    def _outcome(self, w: OpWrites, state: int) -> None:
        result = OUTCOMES[state]
        w.on_durable(lambda: self.ctx.listeners.notify_global_outcome(result))

    def _discard_parts(self, w: OpWrites, gid: str, reason: str) -> int:
        """Discards every PREPARED part of ``gid`` here, in the caller's batch (each to
        ``%DISCARD%<its group>``); they stay parts of G, decided with it later. Their
        shard stops asking: G's decision is pushed to it."""
        state = self.state
        discarded = 0
        for seq in state.parts.get(gid, []):
            part = self.ctx.read_txn(seq)
            if part is not None and part.state == STATE_PREPARED:
                self.transactions.discard(w, part, reason)
                state.discarded.add(seq)
                discarded += 1
        state.pull.pop(gid, None)
        return discarded

    def _decide_parts(self, w: OpWrites, gid: str, target_state: int, source: int, group: str = "") -> int:
        """Decides every undecided part of ``gid`` here, in the caller's batch (a part of
        another group than ``group``, when given, is rolled back)."""
        state = self.state
        decided = 0
        for seq in state.parts.pop(gid, []):
            state.part_of.pop(seq, None)
            state.discarded.discard(seq)
            w.delete("global", globalcodec.part_key(gid, seq))
            part = self.ctx.read_txn(seq)
            if part is not None and part.state in (STATE_PREPARED, STATE_DISCARDED):
                target = target_state if not group or part.producer_group == group else STATE_ROLLED_BACK
                self.transactions.decide(w, part, target, source)
                decided += 1
        state.pull.pop(gid, None)
        return decided

    # --- participants ----------------------------------------------------------------------

    def apply_global_op(self, global_id: str, state: int, source: int,
                        producer_group: str = "") -> Callable[[OpWrites], int]:
        """G's decision (pushed by its coordinator, or pulled from it) applied to all its
        parts here in one batch; returns how many it decided (0 for a repeat). DISCARDED
        (G was discarded) discards the PREPARED ones instead, and returns how many."""
        if TransactionId.decode(global_id).broker == self.ctx.name:
            raise InvalidFieldError("global_transaction_id", f"{global_id} is coordinated here: end it instead")
        if state not in (STATE_COMMITTED, STATE_ROLLED_BACK, STATE_DISCARDED):
            raise InvalidFieldError("state", "must be COMMITTED, ROLLED_BACK or DISCARDED")
        if source not in _SOURCES:
            raise InvalidFieldError("source", "must be CLIENT, CHECK, OPERATOR or BROKER")

        def op(w: OpWrites) -> int:
            failpoints.hit("apply.before")
            if state == STATE_DISCARDED:
                decided = self._discard_parts(w, global_id, f"global transaction {global_id} was discarded "
                                                            f"by its coordinator")
            else:
                decided = self._decide_parts(w, global_id, state, source, producer_group)
            w.on_durable(lambda: failpoints.hit("apply.after"))
            return decided
        return op

    def pull_later(self, global_id: str, delay_ms: int) -> None:
        """Asks G's coordinator again after ``delay_ms`` (G undecided, or the ask failed)."""
        state = self.state
        if any(s not in state.discarded for s in state.parts.get(global_id, ())):
            state.pull[global_id] = self.ctx.clock() + delay_ms

    def due_pulls(self, now: int) -> list[str]:
        return [gid for gid, due in self.state.pull.items() if due <= now]

    def next_pull_ms(self) -> int | None:
        return min(self.state.pull.values(), default=None)

    # --- the coordinator -------------------------------------------------------------------

    def resolve_global(self, global_id: str) -> TxnRow:
        """G's row, for a participant asking (NOT_FOUND when G is unknown here: never
        stored, or long gone, and then its parts are rolled back)."""
        row = self.ctx.read_txn(self.ctx.parse_txn_id(global_id))
        if row is None:
            raise TransactionNotFoundError(global_id)
        return row

    def resolve_global_op(self, global_id: str, participant: str) -> Callable[[OpWrites], TxnRow]:
        """A participant asks (:meth:`resolve_global`); while G is undecided, a participant
        it did not name becomes one, so G's decision is pushed to it (it stops asking once
        told G was discarded)."""
        seq = self.ctx.parse_txn_id(global_id)
        if len(participant.encode()) > 255 or "\x00" in participant:
            raise InvalidFieldError("participant", f"{participant!r} is not a broker name")

        def op(w: OpWrites) -> TxnRow:
            row = self.resolve_global(global_id)
            others = self.state.open.get(seq)
            if others is not None and participant and participant != self.ctx.name and participant not in others:
                others = sorted([*others, participant])
                w.put("global", globalcodec.open_key(seq), globalcodec.encode_participants(others))
                self.state.open[seq] = others
            return row
        return op

    def pushes(self) -> list[tuple[str, int, int, list[str]]]:
        """(G id, state, source, participants left) of every decision still to push."""
        return [(self.ctx.txn_id(seq), state, source, list(left))
                for seq, (state, source, left) in self.state.push.items()]

    def push_done_op(self, global_id: str, shard: str, state: int) -> Callable[[OpWrites], None]:
        """``shard`` acknowledged G's ``state``: it leaves the push row (gone when empty). An
        acknowledged discard leaves a decision pushed since alone."""
        seq = self.ctx.parse_txn_id(global_id)
        pushes = self.state

        def op(w: OpWrites) -> None:
            entry = pushes.push.get(seq)
            if entry is None or entry[0] != state or shard not in entry[2]:
                return
            source, left = entry[1], [p for p in entry[2] if p != shard]
            if left:
                w.put("global", globalcodec.push_key(seq), globalcodec.encode_push(state, source, left))
                pushes.push[seq] = (state, source, left)
            else:
                w.delete("global", globalcodec.push_key(seq))
                del pushes.push[seq]
                pushes.push_since.pop(seq, None)
        return op
