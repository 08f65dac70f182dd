"""Consumer-group delivery state: per (group, topic, queue) the next offset never delivered
and the deliveries in flight with their invisibility deadlines.

Owned by the thread that owns the store, the broker's event loop (every change is made in
the same operation that persists it); other threads read only what :meth:`ConsumerGroups.positions`
copied there (the metrics' snapshot).
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from .store import codec
from .store.db import OpWrites


@dataclass(slots=True)
class Inflight:
    attempt: int
    deadline_ms: int
    #: The leader epoch that made the delivery (0: unreplicated; see ``ReceiptHandle.epoch``).
    epoch: int = 0


@dataclass(slots=True)
class Cursor:
    """One group's position in one queue.

    On a normal topic every offset below ``next_offset`` was delivered and the in-flight
    ones are all below it. On a FIFO topic a message whose group has a delivery in flight
    is passed over, so ``next_offset`` is the lowest offset not yet delivered (or filtered
    out), in-flight deliveries may lie past it, and ``settled`` holds the offsets past it
    already acknowledged or dead-lettered (stored as in-flight rows with the value
    ``codec.SETTLED_PAST_CURSOR``, dropped as the cursor passes them).
    """

    next_offset: int
    inflight: dict[int, Inflight] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    #: FIFO topics: the group hash of in-flight offsets, filled as the scan needs it.
    group_of: dict[int, int] = field(default_factory=dict)
    #: FIFO topics (in memory only, rebuilt by scanning after a restart): the queue entries
    #: from ``next_offset`` up to ``scanned_to`` passed over because their group had a
    #: delivery in flight, by offset.
    ahead: dict[int, "codec.CqEntry"] = field(default_factory=dict)
    scanned_to: int = 0
    # (deadline_ms, offset); entries whose deadline no longer matches are stale.
    heap: list[tuple[int, int]] = field(default_factory=list)
    #: Deliveries an offset reset revoked, offset → their attempt (stored as in-flight rows
    #: with ``codec.REVOKED_DEADLINE``): the offset's next delivery counts on from it, so a
    #: revoked delivery's receipt handle never names a live delivery (``resets.py``).
    revoked: dict[int, int] = field(default_factory=dict)

    def first_attempt(self, offset: int) -> int:
        """The attempt number of a new delivery of ``offset`` (1, or one past a revoked one)."""
        return self.revoked.pop(offset, 0) + 1

    def track(self, offset: int, attempt: int, deadline_ms: int, epoch: int = 0) -> None:
        self.inflight[offset] = Inflight(attempt, deadline_ms, epoch)
        heapq.heappush(self.heap, (deadline_ms, offset))

    def pop_expired(self, now_ms: int) -> list[tuple[int, Inflight]]:
        """In-flight deliveries whose invisibility ended, oldest deadline first (each once:
        a postponement to the deadline it had leaves two equal heap entries)."""
        out = []
        seen: set[int] = set()
        while self.heap and self.heap[0][0] <= now_ms:
            deadline, offset = heapq.heappop(self.heap)
            entry = self.inflight.get(offset)
            if entry is not None and entry.deadline_ms == deadline and offset not in seen:
                seen.add(offset)
                out.append((offset, entry))
        return out

    def push_back(self, offset: int, entry: Inflight) -> None:
        heapq.heappush(self.heap, (entry.deadline_ms, offset))

    def next_deadline_ms(self) -> int | None:
        while self.heap:
            deadline, offset = self.heap[0]
            entry = self.inflight.get(offset)
            if entry is not None and entry.deadline_ms == deadline:
                return deadline
            heapq.heappop(self.heap)
        return None

    def ack_offset(self) -> int:
        """Everything below this offset is acknowledged (or filtered out) for the group."""
        return min(min(self.inflight), self.next_offset) if self.inflight else self.next_offset


@dataclass(frozen=True, slots=True)
class Position:
    """One group's position in one queue, copied (see :meth:`ConsumerGroups.positions`)."""

    group: str
    topic: str
    queue_id: int
    #: Everything below is acknowledged (or filtered out) for the group.
    ack_offset: int
    next_offset: int
    inflight: int
    #: In-flight deliveries past their first attempt.
    retrying: int


class GroupNames:
    """The groups with a cursor here and their (group, topic) pairs, each as a sorted list of
    tuples (what a per-principal quota counts: ``quotas.py``); ``version`` moves with either."""

    def __init__(self) -> None:
        self.groups: list[tuple[str]] = []
        self.pairs: list[tuple[str, str]] = []
        self.version = 0
        self._queues: dict[tuple[str, str], int] = {}
        self._pairs_of: dict[str, int] = {}

    def rebuild(self, keys: "list[tuple[str, str, int]]") -> None:
        self._queues = {}
        for group, topic, _q in keys:
            self._queues[(group, topic)] = self._queues.get((group, topic), 0) + 1
        self._pairs_of = {}
        for group, _topic in self._queues:
            self._pairs_of[group] = self._pairs_of.get(group, 0) + 1
        self.pairs = sorted(self._queues)
        self.groups = sorted((g,) for g in self._pairs_of)
        self.version += 1

    def has_group(self, group: str) -> bool:
        return group in self._pairs_of

    def has_pair(self, group: str, topic: str) -> bool:
        return (group, topic) in self._queues

    def added(self, group: str, topic: str) -> None:
        """A cursor of (group, topic) in one more queue."""
        n = self._queues.get((group, topic), 0)
        self._queues[(group, topic)] = n + 1
        if n:
            return
        bisect.insort(self.pairs, (group, topic))
        self.version += 1
        pairs = self._pairs_of.get(group, 0)
        self._pairs_of[group] = pairs + 1
        if not pairs:
            bisect.insort(self.groups, (group,))

    def removed(self, group: str, topic: str) -> None:
        n = self._queues.get((group, topic), 0) - 1
        if n > 0:
            self._queues[(group, topic)] = n
            return
        if n < 0:
            return
        del self._queues[(group, topic)]
        del self.pairs[bisect.bisect_left(self.pairs, (group, topic))]
        self.version += 1
        pairs = self._pairs_of[group] - 1
        if pairs:
            self._pairs_of[group] = pairs
        else:
            del self._pairs_of[group]
            del self.groups[bisect.bisect_left(self.groups, (group,))]


class ConsumerGroups:
    def __init__(self) -> None:
        self.cursors: dict[tuple[str, str, int], Cursor] = {}
        #: The groups and (group, topic) pairs of ``cursors``, sorted (kept by :meth:`add`,
        #: :meth:`remove` and :meth:`drop_topic`, the only places a key comes or goes).
        self.names = GroupNames()

    def load(self, rows: list[tuple[bytes, bytes]], inflight: list[tuple[bytes, bytes]]) -> None:
        for key, value in rows:
            group, topic, queue_id = codec.split_consumer_key(key)
            self.cursors[(group, topic, queue_id)] = Cursor(codec.decode_u64(value, "consumer cursor", key))
        for key, value in inflight:
            group, topic, queue_id, offset = codec.split_inflight_key(key)
            attempt, deadline, epoch = codec.decode_inflight(value, key)
            cursor = self.cursors.get((group, topic, queue_id))
            if cursor is None:
                cursor = self.cursors[(group, topic, queue_id)] = Cursor(offset + 1)
            if (attempt, deadline) == codec.SETTLED_PAST_CURSOR:
                cursor.settled.add(offset)
            elif deadline == codec.REVOKED_DEADLINE:
                cursor.revoked[offset] = attempt
            else:
                cursor.track(offset, attempt, deadline, epoch)
        self.names.rebuild(list(self.cursors))

    def add(self, group: str, topic: str, queue_id: int, cursor: Cursor) -> None:
        """A new cursor (a group's first read of a queue)."""
        self.cursors[(group, topic, queue_id)] = cursor
        self.names.added(group, topic)

    def remove(self, key: tuple[str, str, int]) -> Cursor:
        """Forgets one cursor (its group's deletion: ``groupdelete.py`` stages its rows)."""
        cursor = self.cursors.pop(key)
        self.names.removed(key[0], key[1])
        return cursor

    def get(self, group: str, topic: str, queue_id: int) -> Cursor | None:
        return self.cursors.get((group, topic, queue_id))

    def groups_of(self, topic: str, queue_id: int) -> list[Cursor]:
        return [c for (g, t, q), c in self.cursors.items() if t == topic and q == queue_id]

    def groups_in(self, topic: str) -> list[str]:
        """The groups with a cursor in ``topic``."""
        return sorted({g for (g, t, _q) in self.cursors if t == topic})

    def snapshot(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, queue, ack offset) of every cursor."""
        return [(g, t, q, c.ack_offset()) for (g, t, q), c in self.cursors.items()]

    def positions(self) -> list[Position]:
        """Every cursor's position, in (group, topic, queue) order (on the event loop: what
        another thread may read)."""
        return [Position(g, t, q, c.ack_offset(), c.next_offset, len(c.inflight),
                         sum(1 for e in c.inflight.values() if e.attempt > 1))
                for (g, t, q), c in sorted(self.cursors.items())]

    def drop_topic(self, w: OpWrites, topic: str) -> list[str]:
        """Stages the removal of every group's cursor and in-flight deliveries in ``topic``;
        returns the groups that had one."""
        groups = set()
        for group, t, q in [key for key in self.cursors if key[1] == topic]:
            cursor = self.cursors.pop((group, t, q))
            self.names.removed(group, t)
            w.delete("consumers", codec.consumer_key(group, topic, q))
            for offset in {*cursor.inflight, *cursor.settled, *cursor.revoked}:
                w.delete("inflight", codec.inflight_key(group, topic, q, offset))
            groups.add(group)
        return sorted(groups)
