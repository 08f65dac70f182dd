"""The checker's credit per producer group, and what the claims ask the brokers for.

A group's ``capacity`` is the credit its streams announced, its ``free`` credit what of it
no check holds now. The claim loops (``brokers``) ask a broker for no more checks of a group
than its free credit split between the brokers; a group whose free credit is below its
capacity is ``short`` (its claims name that limit), one whose last claim took all it asked
for is ``backlogged`` (more may be due). The dispatcher moves the credit as streams come, take
checks and finish them.
"""

from __future__ import annotations

import collections
from typing import Protocol, Sequence

from txmq.v1 import broker_pb2


class CreditMetrics(Protocol):
    def credit(self, group: str, free: int) -> None: ...


class GroupCredit:
    def __init__(self, metrics: CreditMetrics) -> None:
        self.metrics = metrics
        #: Per group: the credit its streams announced, and what of it is free now.
        self.capacity: dict[str, int] = {}
        self.free: dict[str, int] = {}
        #: Groups whose free credit is below their capacity (the claims name their limit).
        self.short: set[str] = set()
        #: Groups whose last claim took all it asked for (more may be due).
        self.backlogged: set[str] = set()
        self.total_free = 0

    def join(self, group: str, capacity: int, credit: int) -> None:
        """A stream of the group with ``capacity``, ``credit`` of it free."""
        self.capacity[group] = self.capacity.get(group, 0) + capacity
        self.move(group, credit)

    def leave(self, group: str, capacity: int, credit: int, last: bool) -> None:
        """A stream left the group (``last``: its last one, the group is forgotten)."""
        self.capacity[group] -= capacity
        self.move(group, -credit)
        if last:
            self.capacity.pop(group, None)
            self.free.pop(group, None)
            self.short.discard(group)
            self.backlogged.discard(group)

    def move(self, group: str, delta: int) -> bool:
        """The group's free credit changes by ``delta``; True when that raised it to the
        credit that makes a claim for it worth it (its threshold)."""
        before = self.free.get(group, 0)
        free = before + delta
        self.free[group] = free
        self.total_free += delta
        if free < self.capacity.get(group, 0):
            self.short.add(group)
        else:
            self.short.discard(group)
        self.metrics.credit(group, free)
        return before < self._threshold(group) <= free

    def claimable_groups(self) -> list[str]:
        """Groups with free credit now."""
        return sorted(g for g, free in self.free.items() if free > 0)

    def claim_groups(self, shares: int = 1) -> dict[str, int]:
        """Every group served, with its capacity split between ``shares`` claimers (brokers)."""
        return {g: -(-c // shares) for g, c in self.capacity.items() if c > 0}

    def claim_limits(self, shares: int = 1) -> dict[str, int]:
        """The groups whose free credit is below their capacity, with that free credit split
        between ``shares`` claimers: what one claim may take of them."""
        return {g: -(-max(self.free.get(g, 0), 0) // shares) for g in self.short}

    def claimed(self, tasks: Sequence[broker_pb2.CheckTask], limits: dict[str, int], shares: int = 1) -> None:
        """After a claim: a group that got as many checks as it asked for may have more due
        (``backlogged``); one that got fewer has none left."""
        counts = collections.Counter(t.message.producer_group for t in tasks)
        for group in list(self.backlogged):
            if counts[group] == 0:
                self.backlogged.discard(group)
        for group, count in counts.items():
            limit = limits.get(group, -(-self.capacity.get(group, 0) // shares))
            if count >= limit:
                self.backlogged.add(group)
            else:
                self.backlogged.discard(group)

    def backlog_has_credit(self) -> bool:
        """A backlogged group has enough free credit for another claim now."""
        return any(self.free.get(g, 0) >= self._threshold(g) for g in self.backlogged)

    def _threshold(self, group: str) -> int:
        """Free credit that makes a claim for the group worth it: half its capacity."""
        return max(1, self.capacity.get(group, 0) // 2)
