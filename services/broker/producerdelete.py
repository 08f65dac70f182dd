"""Deleting a producer group's state on this broker (the operator's ``txmq group
delete-producer``), the producer-side twin of ``groupdelete.py``.

What a producer group leaves here for good is its ``counters`` row (pending, discarded),
with the metric series computed from it at each scrape and the labelled counters of its
decisions (``BrokerMetrics.producer_group_gone``), its ``%DISCARD%<group>`` topic, and its
place in ``max_producer_groups_per_principal`` (``quotas.py`` counts the counters rows).
One operation, so one WriteBatch through the normal write path (a replicated shard's
followers apply it like any other write, and a new leader's domain loads what it left):
the counters row, and with ``discard_topic`` the ``%DISCARD%`` topic like a deleted topic
(``Queues.remove_topic``).

**Never a decision lost.** The deletion is refused (``TransactionsOpenError``), ``force`` or
not, while the group has a transaction here that has not ended: PREPARED (its checks and its
producer's EndTransaction need the group), DISCARDED and undecided (an operator or a late
answer of the group may still decide it), or a global transaction coordinated here whose
decision is still being pushed to its participants. A group with none of these holds
nothing a later decision needs: its counters are (0, 0) and the recount of the transaction
table (``fsck``) agrees without the row.

**Live producers** are the ones this broker knows: a half message of the group within
``consumer_session_seconds`` (``Receivers.produced``), or a checker's claim for it (a
producer of the group holds a check stream to that checker) within that time or held here now
(an idle checker's claim waits on the broker up to its ``claim_wait_seconds``, which may be
longer: ``Receivers.holding``). Refused while any is live
(``ProducersLiveError``), unless ``force``: a producer that sends again makes the group anew
(a new counters row, counted by its quota again).

The rows of the group's **ended transactions stay**: they are the record of decisions made
(``GetTransaction`` by id, ``QueryTransactions`` of the group, a repeated EndTransaction
answered with its final state, deduplication of a repeated half send), keyed by sequence
and not by group, and go with retention like every record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from txmq.errors import ProducersLiveError, TransactionsOpenError
from txmq.names import discard_topic, validate_name

from .core import BrokerCore
from .receivers import CheckerClaim
from .store.db import OpWrites

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProducerGroupDeletion:
    counters: bool
    pending: int
    discarded: int
    global_pushes: int
    discard_topic: bool
    discard_topic_deleted: bool
    #: (client id, last half message ms) of its live producers here.
    producers: list[tuple[str, int]]
    checkers: list[CheckerClaim]
    applied: bool

    @property
    def known(self) -> bool:
        return bool(self.counters or self.discard_topic or self.producers or self.checkers)


def global_pushes(core: BrokerCore, group: str) -> int:
    """Global transactions of the group coordinated here whose decision is still being pushed."""
    return sum(1 for gid, _state, _source, _left in core.globals.pushes()
               if core.resolve_global(gid).producer_group == group)


def delete_producer_group_op(core: BrokerCore, group: str, *, dry_run: bool = True, force: bool = False,
                             discard: bool = False, operator: str = "",
                             reason: str = "") -> Callable[[OpWrites], ProducerGroupDeletion]:
    """The deletion (see the module docstring) as an operation; the arguments are checked now."""
    validate_name("producer_group", group)

    def op(w: OpWrites) -> ProducerGroupDeletion:
        now = core.clock()
        counts = core.counters.get(group)
        pending, discarded = (counts[0], counts[1]) if counts is not None else (0, 0)
        pushes = global_pushes(core, group)
        producers = core.receivers.producers_of(group, now)
        checkers = core.receivers.checkers_of(group, now)
        topic = discard_topic(group)
        has_topic = topic in core.queues.topics
        drop_topic = discard and has_topic

        def result(applied: bool) -> ProducerGroupDeletion:
            return ProducerGroupDeletion(counts is not None, pending, discarded, pushes, has_topic, drop_topic,
                                         producers, checkers, applied)
        if dry_run:
            return result(False)
        if pending or discarded or pushes:
            raise TransactionsOpenError(group, core.name, pending, discarded, pushes)
        if (producers or checkers) and not force:
            raise ProducersLiveError(group, sorted({who for who, _at in producers} | {c.checker_id for c in checkers}))
        core.transactions.forget_group(w, group)
        if drop_topic:
            core.queues.remove_topic(w, topic)
            core.consumers.drop_topic(w, topic)
        core.receivers.forget_producers(group)
        w.on_durable(lambda: core.listeners.notify_producer_group_gone(group))
        w.on_durable(lambda: log.warning("producer group deleted", extra={"fields": {
            "producer_group": group, "operator": operator, "reason": reason,
            "forced": bool(producers or checkers), "discard_topic_deleted": drop_topic}}))
        return result(True)
    return op
