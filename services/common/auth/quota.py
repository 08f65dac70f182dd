"""Per-principal quotas on state a principal creates by naming something new: a consumer
group, a group's subscription to a topic, a producer group, a topic. A prefix right
(``consumer_group:tenant-a.*``) lets a principal make up names without end, and each name
costs the service that keeps it (cursors and rows in a broker's store, a counters row and
metric series per producer group, a topic's queues on every broker and its routes).

**What is counted.** Neither the broker's store nor the name server records who made a
group or a topic, so a quota counts the names of that kind **its rights cover** that exist
on the service now: the names it could have made (with one of the actions that create one
— ``actions`` — held on them). The N+1-th new name is refused; a name that exists keeps
working, whoever made it. Counting what the store holds needs no new record, survives
restarts and fail-overs as the store does, and two principals of one tenant holding the
same prefix share its quota.

**Who is not counted.** A service identity acting as itself (internal calls: the services'
own work), a call with auth off, and a principal holding a creating action on *every* name
of the kind (a ``cluster`` rule, or ``<kind>:*``, without a namespace): such a principal is
trusted over every tenant's names already, and counted it would be limited by every other
tenant's names.

Counting reads the names in the ranges the principal's rules cover (``names`` sorted), and
stops at the limit: its cost follows the principal's own names, never the others'.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Callable, Sequence

from txmq.errors import QuotaExceededError
from txmq.names import NAMESPACE_SEPARATOR, SYSTEM_PREFIX

from .acl import CLUSTER, Rule
from .interceptor import CALLER

#: Above every character a name may hold (``txmq.names.NAME_RULE``: ASCII).
_TOP = "\U0010ffff"


@dataclasses.dataclass(frozen=True)
class Subject:
    """The principal a quota is counted for, and the rules that say what its rights cover."""

    principal: str
    rules: tuple[Rule, ...]


def caller_subject() -> Subject | None:
    """The caller of the call being served, as quotas count it (None: not counted — auth off,
    or a service identity acting as itself; a proxy's call for a principal is that principal's)."""
    caller = CALLER.get()
    if caller is None or caller.principal.service:
        return None
    return Subject(caller.principal.name, caller.store.current().rules)


def relayed_subject(name: str) -> Subject | None:
    """The principal ``name`` a service identity's call relays (the name server's offset reset
    names its operator, the authenticated principal): counted as that principal's own call.
    None when the caller is not a service identity, or ``name`` is no end principal known here."""
    caller = CALLER.get()
    if caller is None or not caller.principal.service:
        return None
    credentials = caller.store.current()
    principal = credentials.principals.get(name)
    if principal is None or principal.service:
        return None
    return Subject(principal.name, credentials.rules)


def _creating(subject: Subject, actions: tuple[str, ...]) -> list[Rule]:
    return [r for r in subject.rules if r.principal == subject.principal and r.actions.intersection(actions)]


def unlimited(subject: Subject, actions: tuple[str, ...], kind: str) -> bool:
    """Whether a rule gives the principal one of ``actions`` on every name of ``kind``."""
    return any(r.namespace is None and (r.resource.kind == CLUSTER or (
        r.resource.kind == kind and r.resource.prefix and not r.resource.name)) for r in _creating(subject, actions))


def _scan_range(rule: Rule, kind: str) -> tuple[str, bool] | None:
    """Where the names ``rule`` covers lie: (a prefix every one starts with, False) or (the
    one name, True); None when it covers none of ``kind``."""
    resource = rule.resource
    if resource.kind != CLUSTER and resource.kind != kind:
        return None
    head = rule.namespace + NAMESPACE_SEPARATOR if rule.namespace else ""
    if resource.kind == CLUSTER:
        return (head, False) if rule.namespace is not None else ("", False)
    return head + resource.name, not resource.prefix


def count_covered(subject: Subject, actions: tuple[str, ...], kind: str, names: Sequence[tuple[str, ...]],
                  limit: int) -> int:
    """How many of ``names`` (sorted tuples whose first element is a name of ``kind``: a
    group, or (group, topic)) the principal's rules give one of ``actions`` on, counted up to
    ``limit``. System names (``%...``) are never counted."""
    seen: set[int] = set()
    for rule in _creating(subject, actions):
        found = _scan_range(rule, kind)
        if found is None:
            continue
        start, exact = found
        lo = bisect.bisect_left(names, (start,))
        hi = bisect.bisect_left(names, (start + ("\0" if exact else _TOP),), lo)
        for i in range(lo, hi):
            name = names[i][0]
            if i in seen or name.startswith(SYSTEM_PREFIX) or not rule.covers(kind, name):
                continue
            seen.add(i)
            if len(seen) >= limit:
                return len(seen)
    return len(seen)


def refuse_beyond(subject: Subject | None, actions: tuple[str, ...], kind: str, names: Sequence[tuple[str, ...]],
                  limit: int, setting: str, plural: str, what: str,
                  count: Callable[[Subject], int] | None = None) -> None:
    """Raises ``QuotaExceededError`` when ``subject``'s rights cover ``limit`` of ``names``
    already (``count``: how the caller counts them, a cache of :func:`count_covered`). Call
    it only for a name that does not exist yet: one that does is never refused."""
    if subject is None or unlimited(subject, actions, kind):
        return
    held = count(subject) if count is not None else count_covered(subject, actions, kind, names, limit)
    if held >= limit:
        raise QuotaExceededError(setting, limit, subject.principal, plural, what)
