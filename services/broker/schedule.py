"""The check schedule: the due index (``due`` column family, keyed (group, due time, seq))
and, per group, the in-memory floor below which it holds no key, so a claim finds the
groups with due work without touching idle ones, and a scan starts past the keys earlier
claims deleted instead of walking their tombstones.

Every insert into the index goes through :meth:`CheckSchedule.put`, which keeps the floor
below it; the claims (``checks.py``) move floors up as they take keys.
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable

from .base import BrokerContext, first_time
from .store import codec
from .store.codec import TxnRow
from .store.db import Database, OpWrites

#: The due floor of a group with no due key.
NO_DUE_MS = 2**62
#: Due checks counted per group at most (a metrics scrape counts them).
MAX_WAITING_COUNTED = 100_000


class CheckSchedule:
    """The due index and its floors."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        #: Per group, (time, seq) below which the due index holds no key. The seq matters
        #: for a burst whose keys share one due time: the claims start past the ones they
        #: took, not at their tombstones.
        self.floors: dict[str, tuple[int, int]] = {}
        #: The floors as a heap, so a claim finds the groups with due work without looking
        #: at idle ones (superseded entries are skipped, and dropped now and then).
        self._heap: list[tuple[int, str]] = []
        #: Told the new floor whenever one is lowered (a key may fall due sooner than the
        #: claims held on the broker expect: ``ClaimWaits.lowered``).
        self.on_lowered: Callable[[int], None] | None = None
        self._load()

    def _load(self) -> None:
        """Each group's earliest due time (one seek per group with due keys)."""
        start = b""
        while True:
            first = next(iter(self.ctx.db.scan("due", start)), None)
            if first is None:
                return
            group, due_ms, seq = codec.split_group_time_key(first[0])
            self.set_floor(group, due_ms, seq)
            start = group.encode() + b"\x01"

    # --- the index -------------------------------------------------------------------------

    def put(self, w: OpWrites, group: str, due_ms: int, seq: int) -> None:
        """Every insert into the due index goes here: it keeps the group's floor below it."""
        w.put("due", codec.group_time_key(group, due_ms, seq), b"")
        if (due_ms, seq) < self.floor(group):
            self.set_floor(group, due_ms, seq)
            if self.on_lowered is not None:
                self.on_lowered(due_ms)

    def remove(self, w: OpWrites, row: TxnRow) -> None:
        """Stages the removal of the row's due key (the floor stays: it is a lower bound)."""
        w.delete("due", codec.group_time_key(row.producer_group, row.next_due_ms, row.seq))

    def reschedule(self, w: OpWrites, row: TxnRow, due_ms: int) -> None:
        """The row is due next at ``due_ms`` (its key moves, its row is staged)."""
        self.remove(w, row)
        row.next_due_ms = due_ms
        self.put(w, row.producer_group, due_ms, row.seq)
        w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))

    def next_check_delay_ms(self, delivered: int) -> int:
        cfg = self.ctx.config
        base = cfg.check_interval_seconds * (cfg.check_backoff_multiplier ** max(delivered - 1, 0))
        base = min(base, max(cfg.check_interval_max_seconds, cfg.check_interval_seconds))
        return int(base * (1 + cfg.check_jitter * self.ctx.random.random()) * 1000)

    # --- floors ----------------------------------------------------------------------------

    def floor(self, group: str) -> tuple[int, int]:
        return self.floors.get(group, (NO_DUE_MS, 0))

    def set_floor(self, group: str, floor_ms: int, floor_seq: int = 0) -> None:
        """The group's due floor (no due key below (time, seq)), and its place in the heap
        of floors the claims pop due groups from."""
        self.floors[group] = (floor_ms, floor_seq)
        if floor_ms < NO_DUE_MS:
            heap = self._heap
            heapq.heappush(heap, (floor_ms, group))
            if len(heap) > 4 * len(self.floors) + 1024:  # superseded entries: rebuild
                heap[:] = [(f, g) for g, (f, _s) in self.floors.items() if f < NO_DUE_MS]
                heapq.heapify(heap)

    def earliest(self, groups: Iterable[str]) -> int:
        """The earliest floor of ``groups``: none of them has a key due before it
        (``NO_DUE_MS`` when none has a due key)."""
        return min((self.floor(g)[0] for g in groups), default=NO_DUE_MS)

    def pop_due_groups(self, now: int) -> list[str]:
        """Groups whose floor has come, taken off the heap (the claim puts each back)."""
        heap, due, seen = self._heap, [], set()
        while heap and heap[0][0] <= now:
            floor_ms, group = heapq.heappop(heap)
            if group not in seen and self.floors.get(group, (None, 0))[0] == floor_ms:
                seen.add(group)
                due.append(group)
        return due

    # --- queries ---------------------------------------------------------------------------

    def checks_waiting(self, group: str, now: int, limit: int = MAX_WAITING_COUNTED) -> int:
        """Due checks of the group not claimed (waiting for a producer with free credit),
        counted up to ``limit``; nothing is read for a group whose floor lies ahead."""
        return count_due(self.ctx.db, group, self.floor(group), now, limit)

    def oldest_due_ms(self, group: str) -> int | None:
        return first_time(self.ctx.db, "due", group, self.floor(group)[0])


def count_due(db: Database, group: str, floor: tuple[int, int], now: int, limit: int = MAX_WAITING_COUNTED) -> int:
    """Keys of the group's due index from ``floor`` up to ``now``, counted up to ``limit``
    (a read only: metrics call it on their own thread with a floor from a snapshot)."""
    if floor[0] > now:
        return 0
    count = 0
    for _ in db.scan("due", codec.group_time_key(group, *floor), codec.group_time_key(group, now + 1, 0)):
        count += 1
        if count >= limit:
            break
    return count
