"""The check schedule: the due index (``due`` column family, keyed (group, due time, seq))
and, per group, the in-memory floor below which it holds no key, so a claim finds the
groups with due work without touching idle ones, and a scan starts past the keys earlier
claims deleted instead of walking their tombstones.

Every insert into the index goes through :meth:`SchedulePart._due_put`, which keeps the
floor below it; the claims in ``checks.py`` move floors up as they take keys.
"""

from __future__ import annotations

import heapq

from .base import BrokerBase
from .store import codec
from .store.codec import TxnRow
from .store.db import OpWrites

#: The due floor of a group with no due key.
NO_DUE_MS = 2**62


class SchedulePart(BrokerBase):
    """The due index and its floors."""

    def _due_put(self, w: OpWrites, group: str, due_ms: int, seq: int) -> None:
        """Every insert into the due index goes here: it keeps the group's floor below it."""
        w.put("due", codec.group_time_key(group, due_ms, seq), b"")
        if (due_ms, seq) < (self._due_floor.get(group, NO_DUE_MS), self._due_floor_seq.get(group, 0)):
            self._set_floor(group, due_ms, seq)

    def _set_floor(self, group: str, floor_ms: int, floor_seq: int = 0) -> None:
        """The group's due floor (no due key below (time, seq)), and its place in the heap
        of floors the claims pop due groups from."""
        self._due_floor[group] = floor_ms
        self._due_floor_seq[group] = floor_seq
        if floor_ms < NO_DUE_MS:
            heap = self._floor_heap
            heapq.heappush(heap, (floor_ms, group))
            if len(heap) > 4 * len(self._due_floor) + 1024:  # superseded entries: rebuild
                heap[:] = [(f, g) for g, f in self._due_floor.items() if f < NO_DUE_MS]
                heapq.heapify(heap)

    def _pop_due_groups(self, now: int) -> list[str]:
        """Groups whose floor has come, taken off the heap (the claim puts each back)."""
        heap, due, seen = self._floor_heap, [], set()
        while heap and heap[0][0] <= now:
            floor_ms, group = heapq.heappop(heap)
            if group not in seen and self._due_floor.get(group) == floor_ms:
                seen.add(group)
                due.append(group)
        return due

    def checks_waiting(self, group: str, now: int, limit: int = 100_000) -> int:
        """Due checks of the group not claimed (waiting for a producer with free credit),
        counted up to ``limit``; nothing is read for a group whose floor lies ahead."""
        floor = self._due_floor.get(group, NO_DUE_MS)
        if floor > now:
            return 0
        count = 0
        start = codec.group_time_key(group, floor, self._due_floor_seq.get(group, 0))
        for _ in self.db.scan("due", start, codec.group_time_key(group, now + 1, 0)):
            count += 1
            if count >= limit:
                break
        return count

    def _load_due_floors(self) -> None:
        """At start: each group's earliest due time (one seek per group with due keys)."""
        start = b""
        while True:
            first = next(iter(self.db.scan("due", start)), None)
            if first is None:
                return
            group, due_ms, seq = codec.split_group_time_key(first[0])
            self._set_floor(group, due_ms, seq)
            start = group.encode() + b"\x01"

    def _reschedule(self, w: OpWrites, row: TxnRow, due_ms: int) -> None:
        w.delete("due", codec.group_time_key(row.producer_group, row.next_due_ms, row.seq))
        row.next_due_ms = due_ms
        self._due_put(w, row.producer_group, due_ms, row.seq)
        w.put("txn", codec.txn_key(row.seq), codec.encode_txn(row))

    def next_check_delay_ms(self, delivered: int) -> int:
        cfg = self.config
        base = cfg.check_interval_seconds * (cfg.check_backoff_multiplier ** max(delivered - 1, 0))
        base = min(base, max(cfg.check_interval_max_seconds, cfg.check_interval_seconds))
        return int(base * (1 + cfg.check_jitter * self._random.random()) * 1000)

    # A query of the check schedule (the due index and its floors), so it stays beside it.
    def oldest_due_ms(self, group: str) -> int | None:
        return self._first_time("due", group, self._due_floor.get(group, NO_DUE_MS))
