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

from dataclasses import dataclass
from typing import Callable

from txmq.errors import InvalidFieldError, TransactionNotFoundError, TransactionStateError
from txmq.ids import TransactionId
from txmq.names import GLOBAL_TRANSACTION_PROPERTY

from . import failpoints
from .checks import ChecksPart
from .model import (KIND_HALF, RESOLUTION_UNKNOWN, STATE_COMMITTED, STATE_DISCARDED, STATE_NAMES,
                    STATE_PREPARED, STATE_ROLLED_BACK, SendResult)
from .store import codec, globalcodec
from .store.codec import LogRecord, TxnRow
from .store.db import OpWrites

#: Most participants a global transaction may name.
MAX_PARTICIPANTS = 256
_SOURCES = (codec.SOURCE_CLIENT, codec.SOURCE_CHECK, codec.SOURCE_OPERATOR, codec.SOURCE_BROKER)
#: How G ended, as the metrics name it (``txmq_global_transactions_total{result}``).
OUTCOMES = {STATE_COMMITTED: "committed", STATE_ROLLED_BACK: "rolled_back", STATE_DISCARDED: "discarded"}


@dataclass(frozen=True)
class GlobalStats:
    #: G coordinated here and undecided (PREPARED or DISCARDED).
    open: int
    #: (G, participant) pairs still to be told G's decision or discard.
    pushes_pending: int
    #: Parts stored here waiting for G's decision: PREPARED, DISCARDED (G was discarded).
    parts_prepared: int
    parts_discarded: int
    #: How long the oldest PREPARED part here has waited, and the oldest push (0: none).
    oldest_prepared_part_ms: int
    oldest_push_ms: int


class GlobalPart(ChecksPart):
    """Begin, parts, the decision hook, apply, resolve."""

    #: Open G on this coordinator (PREPARED or DISCARDED): G's seq → its other participants.
    _g_open: dict[int, list[str]]
    #: Undecided parts stored here: G id → their seqs (G's own first message is not one).
    _g_parts: dict[str, list[int]]
    #: The reverse: a part's seq → its G id.
    _g_part_of: dict[int, str]
    #: Decided G whose participants are not all told: G's seq → (state, source, participants left).
    _g_push: dict[int, tuple[int, int, list[str]]]
    #: Remote G with undecided parts here → when to ask its coordinator (broker clock, ms).
    _g_pull: dict[str, int]
    #: The parts in ``_g_part_of`` that are DISCARDED (G was discarded), not PREPARED.
    _g_discarded: set[int]
    #: Since when each push row has been waiting (broker clock, ms; a restart starts it again).
    _g_push_since: dict[int, int]
    #: Called (once durable) when G coordinated here ends: "committed", "rolled_back", "discarded".
    global_outcome_listeners: list[Callable[[str], None]]
    #: Called (once durable) when a push or a pull may be due: the pump wakes.
    global_listeners: list[Callable[[], None]]

    def _load_globals(self) -> None:
        """At start (every term): the live rows of the ``global`` column family."""
        self._g_open, self._g_parts, self._g_part_of, self._g_push, self._g_pull = {}, {}, {}, {}, {}
        self._g_discarded = set()
        self._g_push_since = {}
        # A restarted participant asks about its parts after the timeout, as a new part would:
        # the coordinator's pushes (resumed from its rows) usually come first. Parts that are
        # all DISCARDED wait for the decision's push (their shard is G's participant).
        now = self.clock()
        pull_at = now + int(self.config.transaction_timeout_seconds * 1000)
        live = list(self.db.scan("global", globalcodec.PART, b"C")) + list(self.db.scan("global", globalcodec.OPEN, b"Q"))
        for key, value in live:  # not the M rows: they hold no live work
            kind = key[:1]
            if kind == globalcodec.OPEN:
                self._g_open[globalcodec.split_seq_key(key)] = globalcodec.decode_participants(value, key)
            elif kind == globalcodec.PUSH:
                self._g_push[globalcodec.split_seq_key(key)] = globalcodec.decode_push(value, key)
                self._g_push_since[globalcodec.split_seq_key(key)] = now
            elif kind == globalcodec.PART:
                gid, seq = globalcodec.split_part_key(key)
                self._g_parts.setdefault(gid, []).append(seq)
                self._g_part_of[seq] = gid
                row = self._read_txn(seq)
                if row is not None and row.state == STATE_DISCARDED:
                    self._g_discarded.add(seq)
                elif TransactionId.decode(gid).broker != self.name:
                    self._g_pull[gid] = pull_at

    def _wake_global(self) -> None:
        for fn in self.global_listeners:
            fn()

    # --- sends -----------------------------------------------------------------------------

    def global_send_op(self, record: LogRecord, *, begin: bool, participants: list[str],
                       global_id: str) -> Callable[[OpWrites], SendResult]:
        """A send (``send_op``), or a half message that begins a global transaction or is a
        further part of one; ``record`` must have passed :meth:`validate_message`."""
        if GLOBAL_TRANSACTION_PROPERTY in record.properties and not (begin or global_id):
            raise InvalidFieldError("properties", f"{GLOBAL_TRANSACTION_PROPERTY} is reserved: the broker sets it")
        if not (begin or global_id):
            if participants:
                raise InvalidFieldError("global_participants", "only with begin_global")
            return self.send_op(record)
        field = "begin_global" if begin else "global_transaction_id"
        if record.kind != KIND_HALF:
            raise InvalidFieldError(field, "only a half message (type TRANSACTION) is part of a global transaction")
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
        others = sorted({p for p in participants if p != self.name})
        local_g = 0
        if global_id:
            tid = TransactionId.decode(global_id)
            if tid.broker == self.name:
                local_g = self.parse_txn_id(global_id)
            record.properties[GLOBAL_TRANSACTION_PROPERTY] = global_id
        send = self.send_op(record)
        timeout_ms = int(self.config.transaction_timeout_seconds * 1000)

        def op(w: OpWrites) -> SendResult:
            failpoints.hit("begin.before" if begin else "part.before")
            repeat = self.db.get("dedup", record.message_id.encode()) is not None
            if local_g and not repeat:
                self._check_local_g(global_id, local_g, record.producer_group)
            seq = self.next_seq
            if begin:
                record.properties[GLOBAL_TRANSACTION_PROPERTY] = self.txn_id(seq)
            result = send(w)
            if result.duplicate or result.state != STATE_PREPARED:
                return result
            if begin:
                w.put("global", globalcodec.open_key(seq), globalcodec.encode_participants(others))
                self._g_open[seq] = others
                w.on_durable(lambda: failpoints.hit("begin.after"))
                return result
            self._unschedule(w, seq)
            w.put("global", globalcodec.part_key(global_id, seq), b"")
            w.put("global", globalcodec.member_key(global_id, seq), b"")
            self._g_parts.setdefault(global_id, []).append(seq)
            self._g_part_of[seq] = global_id
            if not local_g:
                due = self.clock() + timeout_ms
                self._g_pull[global_id] = min(self._g_pull.get(global_id, due), due)
                w.on_durable(self._wake_global)
            w.on_durable(lambda: failpoints.hit("part.after"))
            return result
        return op

    def _check_local_g(self, global_id: str, seq: int, group: str) -> None:
        """A part for a G this broker coordinates: G must exist, be undecided, be of its group."""
        row = self._read_txn(seq)
        if row is None:
            raise TransactionNotFoundError(global_id)
        if seq not in self._g_open:
            if row.state in (STATE_COMMITTED, STATE_ROLLED_BACK):
                raise TransactionStateError(global_id, STATE_NAMES[row.state], "a further part")
            raise InvalidFieldError("global_transaction_id", f"{global_id} does not begin a global transaction")
        if row.state == STATE_DISCARDED:  # its checks are spent: it takes no new part
            raise TransactionStateError(global_id, STATE_NAMES[row.state], "a further part")
        if row.producer_group != group:
            raise InvalidFieldError("producer_group", f"{group!r} is not the group of {global_id}")

    def _unschedule(self, w: OpWrites, seq: int) -> None:
        """A part has no check schedule: takes back the due entry its send staged."""
        for cf, key, value in reversed(w.puts):
            if cf == "txn" and key == codec.txn_key(seq) and value is not None:
                row = codec.decode_txn(value, key)
                w.delete("due", codec.group_time_key(row.producer_group, row.next_due_ms, seq))
                row.next_due_ms = 0
                w.put("txn", key, codec.encode_txn(row))
                return

    # --- the decision ----------------------------------------------------------------------

    def _decide(self, w: OpWrites, row: TxnRow, state: int, source: int, *, operator: str = "",
                reason: str = "") -> None:
        """Every decision passes here; deciding G's row also decides G (the commit point)."""
        is_g = row.seq in self._g_open
        if is_g:
            failpoints.hit("decide.before")
        super()._decide(w, row, state, source, operator=operator, reason=reason)
        if is_g:
            self._decide_global(w, row.seq, state, source)

    def _decide_global(self, w: OpWrites, seq: int, state: int, source: int) -> None:
        gid = self.txn_id(seq)
        others = self._g_open.pop(seq)
        w.delete("global", globalcodec.open_key(seq))
        self._decide_parts(w, gid, state, source)
        # Every participant, also one already told a discard (this row replaces that one).
        self._push_to(w, seq, state, source, others)
        self._global_outcome(w, state)
        w.on_durable(lambda: failpoints.hit("decide.after"))

    def _push_to(self, w: OpWrites, seq: int, state: int, source: int, others: list[str]) -> None:
        if others:
            w.put("global", globalcodec.push_key(seq), globalcodec.encode_push(state, source, others))
            self._g_push[seq] = (state, source, list(others))
            self._g_push_since.setdefault(seq, self.clock())
            w.on_durable(self._wake_global)
        elif seq in self._g_push:
            w.delete("global", globalcodec.push_key(seq))
            del self._g_push[seq]
            self._g_push_since.pop(seq, None)

    def _global_outcome(self, w: OpWrites, state: int) -> None:
        result = OUTCOMES[state]
        w.on_durable(lambda: [fn(result) for fn in self.global_outcome_listeners])

    def discard(self, w: OpWrites, row: TxnRow, reason: str) -> None:
        """Discarding G discards the transaction as a whole: its parts here in the same batch,
        and its other participants' by a push (state DISCARDED)."""
        super().discard(w, row, reason)
        others = self._g_open.get(row.seq)
        if others is None:
            return
        gid = self.txn_id(row.seq)
        self._discard_parts(w, gid, f"global transaction {gid} discarded: {reason}")
        self._push_to(w, row.seq, STATE_DISCARDED, codec.SOURCE_BROKER, others)
        self._global_outcome(w, STATE_DISCARDED)

    def _discard_parts(self, w: OpWrites, gid: str, reason: str) -> int:
        """Discards every PREPARED part of ``gid`` here, in the caller's batch (each to
        ``%DISCARD%<its group>``); they stay parts of G, decided with it later. Their
        shard stops asking: G's decision is pushed to it."""
        discarded = 0
        for seq in self._g_parts.get(gid, []):
            part = self._read_txn(seq)
            if part is not None and part.state == STATE_PREPARED:
                super().discard(w, part, reason)
                self._g_discarded.add(seq)
                discarded += 1
        self._g_pull.pop(gid, None)
        return discarded

    def _decide_parts(self, w: OpWrites, gid: str, state: int, source: int, group: str = "") -> int:
        """Decides every undecided part of ``gid`` here, in the caller's batch (a part of
        another group than ``group``, when given, is rolled back)."""
        decided = 0
        for seq in self._g_parts.pop(gid, []):
            self._g_part_of.pop(seq, None)
            self._g_discarded.discard(seq)
            w.delete("global", globalcodec.part_key(gid, seq))
            part = self._read_txn(seq)
            if part is not None and part.state in (STATE_PREPARED, STATE_DISCARDED):
                target = state if not group or part.producer_group == group else STATE_ROLLED_BACK
                super()._decide(w, part, target, source)
                decided += 1
        self._g_pull.pop(gid, None)
        return decided

    def end_op(self, transaction_id: str, resolution: str, source: int, **kwargs: str,
               ) -> Callable[[OpWrites], object]:
        """EndTransaction, refused for an undecided part of a global transaction (end G)."""
        op = super().end_op(transaction_id, resolution, source, **kwargs)
        seq = self.parse_txn_id(transaction_id)

        def guarded(w: OpWrites) -> object:
            gid = self._g_part_of.get(seq)
            if gid is not None and resolution != RESOLUTION_UNKNOWN:
                raise InvalidFieldError("transaction_id", f"{transaction_id} is a part of global transaction "
                                        f"{gid}: end {gid} instead")
            return op(w)
        return guarded

    # --- participants ----------------------------------------------------------------------

    def apply_global_op(self, global_id: str, state: int, source: int,
                        producer_group: str = "") -> Callable[[OpWrites], int]:
        """G's decision (pushed by its coordinator, or pulled from it) applied to all its
        parts here in one batch; returns how many it decided (0 for a repeat). DISCARDED
        (G was discarded) discards the PREPARED ones instead, and returns how many."""
        if TransactionId.decode(global_id).broker == self.name:
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
        if any(s not in self._g_discarded for s in self._g_parts.get(global_id, ())):
            self._g_pull[global_id] = self.clock() + delay_ms

    def due_pulls(self, now: int) -> list[str]:
        return [gid for gid, due in self._g_pull.items() if due <= now]

    def next_pull_ms(self) -> int | None:
        return min(self._g_pull.values(), default=None)

    # --- the coordinator -------------------------------------------------------------------

    def resolve_global(self, global_id: str) -> TxnRow:
        """G's row, for a participant asking (NOT_FOUND when G is unknown here: never
        stored, or long gone, and then its parts are rolled back)."""
        seq = self.parse_txn_id(global_id)
        row = self._read_txn(seq)
        if row is None:
            raise TransactionNotFoundError(global_id)
        return row

    def resolve_global_op(self, global_id: str, participant: str) -> Callable[[OpWrites], TxnRow]:
        """A participant asks (:meth:`resolve_global`); while G is undecided, a participant
        it did not name becomes one, so G's decision is pushed to it (it stops asking once
        told G was discarded)."""
        seq = self.parse_txn_id(global_id)
        if len(participant.encode()) > 255 or "\x00" in participant:
            raise InvalidFieldError("participant", f"{participant!r} is not a broker name")

        def op(w: OpWrites) -> TxnRow:
            row = self.resolve_global(global_id)
            others = self._g_open.get(seq)
            if others is not None and participant and participant != self.name and participant not in others:
                others = sorted([*others, participant])
                w.put("global", globalcodec.open_key(seq), globalcodec.encode_participants(others))
                self._g_open[seq] = others
            return row
        return op

    def pushes(self) -> list[tuple[str, int, int, list[str]]]:
        """(G id, state, source, participants left) of every decision still to push."""
        return [(self.txn_id(seq), state, source, list(left)) for seq, (state, source, left) in self._g_push.items()]

    def push_done_op(self, global_id: str, shard: str, state: int) -> Callable[[OpWrites], None]:
        """``shard`` acknowledged G's ``state``: it leaves the push row (gone when empty). An
        acknowledged discard leaves a decision pushed since alone."""
        seq = self.parse_txn_id(global_id)

        def op(w: OpWrites) -> None:
            entry = self._g_push.get(seq)
            if entry is None or entry[0] != state or shard not in entry[2]:
                return
            source, left = entry[1], [p for p in entry[2] if p != shard]
            if left:
                w.put("global", globalcodec.push_key(seq), globalcodec.encode_push(state, source, left))
                self._g_push[seq] = (state, source, left)
            else:
                w.delete("global", globalcodec.push_key(seq))
                del self._g_push[seq]
                self._g_push_since.pop(seq, None)
        return op

    # --- queries ---------------------------------------------------------------------------

    def describe_global(self, global_id: str) -> tuple[TxnRow | None, list[str], list[str], list[TxnRow]]:
        """(G's row when coordinated here, its participants when still known, those not yet
        told, every part of G stored here whose row is retained, decided or not)."""
        tid = TransactionId.decode(global_id)
        row, participants, pending = None, [], []
        if tid.broker == self.name:
            seq = self.parse_txn_id(global_id)
            row = self._read_txn(seq)
            if row is None:
                raise TransactionNotFoundError(global_id)
            if seq in self._g_open:
                participants = list(self._g_open[seq])
            if seq in self._g_push:
                pending = list(self._g_push[seq][2])
                participants = participants or pending
        prefix = globalcodec.member_prefix(global_id)
        seqs = {globalcodec.split_part_key(key)[1] for key, _ in self.db.scan("global", prefix, prefix[:-1] + b"\x01")}
        seqs.update(self._g_parts.get(global_id, []))  # parts stored before M rows existed
        parts = [p for p in (self._read_txn(s) for s in sorted(seqs)) if p is not None]
        return row, participants, pending, parts

    def list_globals(self, limit: int) -> list[tuple[str, bool, int, list[str]]]:
        """(G id, coordinated here, undecided parts here, participants still to tell)."""
        out: dict[str, tuple[str, bool, int, list[str]]] = {}
        for seq in self._g_open:
            gid = self.txn_id(seq)
            out[gid] = (gid, True, len(self._g_parts.get(gid, [])), [])
        for seq, (_s, _src, left) in self._g_push.items():
            gid = self.txn_id(seq)
            out[gid] = (gid, True, len(self._g_parts.get(gid, [])), list(left))
        for gid, seqs in self._g_parts.items():
            if gid not in out:
                out[gid] = (gid, False, len(seqs), [])
        return sorted(out.values())[:limit]

    def global_stats(self) -> GlobalStats:
        """What the metrics show (from the in-memory maps, plus one row read)."""
        now = self.clock()
        prepared = [s for s in list(self._g_part_of) if s not in self._g_discarded]
        oldest_part = 0
        if prepared:
            row = self._read_txn(min(prepared))  # seqs grow with time: the oldest part
            oldest_part = max(now - row.prepared_ms, 0) if row is not None else 0
        since = list(self._g_push_since.values())
        return GlobalStats(open=len(self._g_open), pushes_pending=sum(len(e[2]) for e in list(self._g_push.values())),
                           parts_prepared=len(prepared), parts_discarded=len(self._g_discarded),
                           oldest_prepared_part_ms=oldest_part,
                           oldest_push_ms=max(now - min(since), 0) if since else 0)

    def global_problems(self) -> list[str]:
        """fsck: every ``global`` row against the transaction rows it belongs to."""
        problems = []
        for key, _value in self.db.scan("global"):
            kind = key[:1]
            if kind == globalcodec.PART:
                gid, seq = globalcodec.split_part_key(key)
                row = self._read_txn(seq)
                if row is None or row.state not in (STATE_PREPARED, STATE_DISCARDED):
                    problems.append(f"part {seq} of global transaction {gid} is indexed as undecided but its row is "
                                    f"{'missing' if row is None else STATE_NAMES[row.state]}")
            elif kind == globalcodec.MEMBER:
                gid, seq = globalcodec.split_part_key(key)
                if self._read_txn(seq) is None:
                    problems.append(f"part {seq} of global transaction {gid} is indexed but its row is missing")
            elif kind == globalcodec.OPEN:
                seq = globalcodec.split_seq_key(key)
                row = self._read_txn(seq)
                if row is None or row.state in (STATE_COMMITTED, STATE_ROLLED_BACK):
                    problems.append(f"global transaction {self.txn_id(seq)} is open but its row is "
                                    f"{'missing' if row is None else STATE_NAMES[row.state]}")
        return problems
