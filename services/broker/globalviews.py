"""Global transactions read back (see ``globaltx.py``): one G as an operator sees it, the
list of live ones, what the metrics show, and fsck's check of the ``global`` rows. Reads
of :class:`~services.broker.globaltx.GlobalState` and the store; they stage nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from txmq.errors import TransactionNotFoundError
from txmq.ids import TransactionId

from .base import BrokerContext
from .globaltx import GlobalState
from .model import STATE_COMMITTED, STATE_DISCARDED, STATE_NAMES, STATE_PREPARED, STATE_ROLLED_BACK
from .store import globalcodec
from .store.codec import TxnRow


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


class GlobalViews:
    def __init__(self, ctx: BrokerContext, state: GlobalState) -> None:
        self.ctx = ctx
        self.state = state

    def describe_global(self, global_id: str) -> tuple[TxnRow | None, list[str], list[str], list[TxnRow]]:
        """(G's row when coordinated here, its participants when still known, those not yet
        told, every part of G stored here whose row is retained, decided or not)."""
        ctx, state = self.ctx, self.state
        tid = TransactionId.decode(global_id)
        row, participants, pending = None, [], []
        if tid.broker == ctx.name:
            seq = ctx.parse_txn_id(global_id)
            row = ctx.read_txn(seq)
            if row is None:
                raise TransactionNotFoundError(global_id)
            if seq in state.open:
                participants = list(state.open[seq])
            if seq in state.push:
                pending = list(state.push[seq][2])
                participants = participants or pending
        prefix = globalcodec.member_prefix(global_id)
        seqs = {globalcodec.split_part_key(key)[1] for key, _ in ctx.db.scan("global", prefix, prefix[:-1] + b"\x01")}
        seqs.update(state.parts.get(global_id, []))  # parts stored before M rows existed
        parts = [p for p in (ctx.read_txn(s) for s in sorted(seqs)) if p is not None]
        return row, participants, pending, parts

    def list_globals(self, limit: int) -> list[tuple[str, bool, int, list[str]]]:
        """(G id, coordinated here, undecided parts here, participants still to tell)."""
        ctx, state = self.ctx, self.state
        out: dict[str, tuple[str, bool, int, list[str]]] = {}
        for seq in state.open:
            gid = ctx.txn_id(seq)
            out[gid] = (gid, True, len(state.parts.get(gid, [])), [])
        for seq, (_s, _src, left) in state.push.items():
            gid = ctx.txn_id(seq)
            out[gid] = (gid, True, len(state.parts.get(gid, [])), list(left))
        for gid, seqs in state.parts.items():
            if gid not in out:
                out[gid] = (gid, False, len(seqs), [])
        return sorted(out.values())[:limit]

    def global_stats(self) -> GlobalStats:
        """What the metrics show (from the in-memory maps, plus one row read)."""
        state = self.state
        now = self.ctx.clock()
        prepared = [s for s in state.part_of if s not in state.discarded]
        oldest_part = 0
        if prepared:
            row = self.ctx.read_txn(min(prepared))  # seqs grow with time: the oldest part
            oldest_part = max(now - row.prepared_ms, 0) if row is not None else 0
        since = list(state.push_since.values())
        return GlobalStats(open=len(state.open), pushes_pending=sum(len(e[2]) for e in state.push.values()),
                           parts_prepared=len(prepared), parts_discarded=len(state.discarded),
                           oldest_prepared_part_ms=oldest_part,
                           oldest_push_ms=max(now - min(since), 0) if since else 0)

    def global_problems(self) -> list[str]:
        """fsck: every ``global`` row against the transaction rows it belongs to."""
        ctx = self.ctx
        problems = []
        for key, _value in ctx.db.scan("global"):
            kind = key[:1]
            if kind == globalcodec.PART:
                gid, seq = globalcodec.split_part_key(key)
                row = ctx.read_txn(seq)
                if row is None or row.state not in (STATE_PREPARED, STATE_DISCARDED):
                    problems.append(f"part {seq} of global transaction {gid} is indexed as undecided but its row is "
                                    f"{'missing' if row is None else STATE_NAMES[row.state]}")
            elif kind == globalcodec.MEMBER:
                gid, seq = globalcodec.split_part_key(key)
                if ctx.read_txn(seq) is None:
                    problems.append(f"part {seq} of global transaction {gid} is indexed but its row is missing")
            elif kind == globalcodec.OPEN:
                seq = globalcodec.split_seq_key(key)
                row = ctx.read_txn(seq)
                if row is None or row.state in (STATE_COMMITTED, STATE_ROLLED_BACK):
                    problems.append(f"global transaction {ctx.txn_id(seq)} is open but its row is "
                                    f"{'missing' if row is None else STATE_NAMES[row.state]}")
        return problems
