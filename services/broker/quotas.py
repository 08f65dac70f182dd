"""The broker's per-principal quotas (``services.common.auth.quota``): how many consumer
groups, (consumer group, topic) subscriptions and producer groups whose names a principal's
rights cover this broker holds, and the refusal of the operation that would make one more.

Each is counted from what the store holds now (the cursors, the producer groups' counters
rows), per broker: every broker bounds its own store, so the counts survive a restart or a
fail-over with it (a replicated shard's replicas hold the same rows) and nothing is shared
between brokers. The check runs inside the operation, as it applies (the event loop applies
one at a time): two concurrent requests cannot both take the last place.

- a consumer group's first cursor here (a receive, an offset reset): ``subscribe`` or
  ``admin-write`` on the group creates one, so either right makes a group count;
- a producer group's first half message here (``check`` on the group): its counters row is
  kept, with its metric series and its %DISCARD% topic, until the group is deleted
  (``producerdelete.py``; the names are then sorted again from the counters rows).

Counts are cached per principal until the names or the rules change, and follow the names the
principal itself makes: a principal refused at its limit and trying again, or making its names
one by one, costs a dictionary lookup, not a count.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Mapping, Sequence, TypeVar

from txmq.errors import QuotaExceededError

from services.common.auth.acl import ADMIN_WRITE, CHECK, CONSUMER_GROUP, PRODUCER_GROUP, SUBSCRIBE
from services.common.auth.quota import Subject, count_covered, refuse_beyond

from .config import BrokerConfig
from .consumers import GroupNames
from .model import KIND_HALF
from .store.codec import LogRecord
from .store.db import OpWrites

T = TypeVar("T")

#: The actions that create a consumer group's state (a receive; an offset reset).
CONSUMER_ACTIONS = (SUBSCRIBE, ADMIN_WRITE)
#: The action that creates a producer group's (a half message).
PRODUCER_ACTIONS = (CHECK,)


#: The broker's quota settings (``txmq_quota_refusals_total{setting}``).
SETTINGS = ("max_consumer_groups_per_principal", "max_subscriptions_per_principal",
            "max_producer_groups_per_principal")


class Quotas:
    def __init__(self, config: BrokerConfig, names: GroupNames, counters: Mapping[str, Any],
                 removed: Callable[[], int] = lambda: 0, refusals: Mapping[str, Any] | None = None) -> None:
        self.config = config
        #: Setting → its refusals counter (``BaseMetrics.quota_refusals``), if metered.
        self.refusals = refusals or {}
        self.names = names
        #: Producer group → its counters (``Transactions.counters``): rows are deleted only with
        #: their group (``removed``: how many so far), so (removed, their number) versions the
        #: sorted names.
        self.counters = counters
        self.removed = removed
        self._producer_names: list[tuple[str]] = []
        self._producer_removed = 0
        #: (quota, principal) → (names version, the rules counted with, count).
        self._held: dict[tuple[str, str], tuple[int, Any, int]] = {}

    def _count(self, quota: str, version: Any, actions: tuple[str, ...], kind: str,
               names: Sequence[tuple[str, ...]], limit: int) -> Callable[[Subject], int]:
        def count(subject: Subject) -> int:
            cached = self._held.get((quota, subject.principal))
            if cached is not None and cached[0] == version and cached[1] is subject.rules:
                return cached[2]
            held = count_covered(subject, actions, kind, names, limit)
            self._held[(quota, subject.principal)] = (version, subject.rules, held)
            return held
        return count

    def _refuse_beyond(self, subject: Subject, actions: tuple[str, ...], kind: str,
                       names: Sequence[tuple[str, ...]], limit: int, setting: str, plural: str, what: str,
                       count: Callable[[Subject], int]) -> None:
        """``refuse_beyond``, its refusals counted."""
        try:
            refuse_beyond(subject, actions, kind, names, limit, setting, plural, what, count)
        except QuotaExceededError:
            counter = self.refusals.get(setting)
            if counter is not None:
                counter.inc()
            raise

    def _took(self, quota: str, subject: Subject, before: Any, after: Any) -> None:
        """The principal made one more name, the only change from version ``before`` to
        ``after`` (it holds the right that made it, so the name is one it counts): its count
        follows without counting again."""
        cached = self._held.get((quota, subject.principal))
        if cached is not None and cached[0] == before and cached[1] is subject.rules:
            self._held[(quota, subject.principal)] = (after, subject.rules, cached[2] + 1)

    def check_subscription(self, subject: Subject | None, group: str, topic: str) -> None:
        """Refuses ``group``'s first cursor in ``topic`` here beyond the principal's quotas."""
        names = self.names
        if subject is None or names.has_pair(group, topic):
            return
        cfg = self.config
        if not names.has_group(group):
            self._refuse_beyond(subject, CONSUMER_ACTIONS, CONSUMER_GROUP, names.groups,
                          cfg.max_consumer_groups_per_principal, "max_consumer_groups_per_principal",
                          "consumer groups", f"consumer group {group!r}",
                          self._count("groups", names.version, CONSUMER_ACTIONS, CONSUMER_GROUP, names.groups,
                                      cfg.max_consumer_groups_per_principal))
        self._refuse_beyond(subject, CONSUMER_ACTIONS, CONSUMER_GROUP, names.pairs,
                      cfg.max_subscriptions_per_principal, "max_subscriptions_per_principal",
                      "subscriptions (consumer group, topic)",
                      f"a subscription of consumer group {group!r} to topic {topic!r}",
                      self._count("subscriptions", names.version, CONSUMER_ACTIONS, CONSUMER_GROUP, names.pairs,
                                  cfg.max_subscriptions_per_principal))

    def check_producer_group(self, subject: Subject | None, record: LogRecord) -> None:
        """Refuses a half message of a producer group new here beyond the principal's quota."""
        group = record.producer_group
        if subject is None or record.kind != KIND_HALF or group in self.counters:
            return
        removed = self.removed()
        if len(self._producer_names) != len(self.counters) or removed != self._producer_removed:
            # made by calls nobody counts, or deleted
            self._producer_names = sorted((g,) for g in self.counters)
            self._producer_removed = removed
        limit = self.config.max_producer_groups_per_principal
        self._refuse_beyond(subject, PRODUCER_ACTIONS, PRODUCER_GROUP, self._producer_names, limit,
                      "max_producer_groups_per_principal", "producer groups", f"producer group {group!r}",
                      self._count("producer groups", self._producer_version(), PRODUCER_ACTIONS, PRODUCER_GROUP,
                                  self._producer_names, limit))

    def _producer_version(self, more: int = 0) -> tuple[int, int]:
        return (self._producer_removed, len(self._producer_names) + more)

    def subscribing(self, subject: Subject | None, group: str, topic: str,
                    op: Callable[[OpWrites], T]) -> Callable[[OpWrites], T]:
        """``op`` (a receive, an offset reset of ``group`` in ``topic``) checked as it applies."""
        if subject is None:
            return op
        names = self.names

        def checked(w: OpWrites) -> T:
            if names.has_pair(group, topic):
                return op(w)
            new_group, before = not names.has_group(group), names.version
            self.check_subscription(subject, group, topic)
            result = op(w)
            if names.has_pair(group, topic) and names.version == before + 1:
                self._took("subscriptions", subject, before, names.version)
                if new_group:
                    self._took("groups", subject, before, names.version)
            return result
        return checked

    def producing(self, subject: Subject | None, record: LogRecord,
                  op: Callable[[OpWrites], T]) -> Callable[[OpWrites], T]:
        """``op`` (a send of ``record``) checked as it applies."""
        if subject is None or record.kind != KIND_HALF:
            return op
        group = record.producer_group

        def checked(w: OpWrites) -> T:
            if group in self.counters:
                return op(w)
            self.check_producer_group(subject, record)
            before = len(self._producer_names)
            version = self._producer_version()
            result = op(w)
            if group in self.counters and len(self.counters) == before + 1:
                bisect.insort(self._producer_names, (group,))
                self._took("producer groups", subject, version, self._producer_version())
            return result
        return checked
