"""Authorizing what an id names: the second half of every authorization decision.

The policy table (``policy``) checks the names a request carries — the producer group of an
EndTransaction, the topic and consumer group of an Ack. A request that carries an id (a
transaction id, a receipt handle) acts on what that id names *in the store*, which need not
be what the caller named. So the service resolves each id to the resource it belongs to in
its store (the broker: ``services/broker/ownership.py``) and hands it here as an
:class:`Owned`; :func:`decide` then requires, for each:

- that a name the caller supplied for it is the recorded one (a mismatch is refused, even
  for a caller allowed on both: the request says something that is not so), and
- that the caller holds the action on the recorded resource, whatever the request named or
  left empty: an empty field never skips the test. Service identities hold every right.

A refusal names the recorded resource only to a caller holding the action on it (or that
named it itself): a captured id never tells its holder another tenant's group or topic.

The policy table names each RPC's ids (``policy.IdRef``); the interceptor has the service
resolve them (its ``Resolve``) and applies the decision, for the principal the call is for
(possibly the end principal a proxy acts for: ``delegation``), in the same chain and at the
same moment as the policy's own checks. The decision is a pure function of the ACL, the
principal and the resolved resources (tested table-driven in
``tests/unit/test_ownership_decisions.py``).

With auth off there is no interceptor: the services' operations refuse a name that is not
what the id names themselves (INVALID_ARGUMENT); :func:`decide` with no principal says the
same.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from txmq.errors import InvalidFieldError, PermissionDeniedError, TxmqError

from .acl import Rule, allows, describe
from .policy import IdRef
from .store import Principal

#: Characters of an id quoted in a refusal.
_ID_CHARS = 24


@dataclasses.dataclass(frozen=True)
class Owned:
    """One resource an id of a request resolves to, and what the request named for it."""

    #: The action the request needs on it (``check``, ``subscribe``).
    action: str
    #: ``producer_group``, ``topic`` or ``consumer_group``.
    kind: str
    #: Its name as the store records it.
    recorded: str
    #: What the request named for it ("" when it named nothing).
    named: str
    #: The request field that names it.
    field: str
    #: The id, as the request carried it.
    id_text: str
    #: What kind of id (``transaction id``, ``receipt handle``).
    id_kind: str


def _id(owned: Owned) -> str:
    text = owned.id_text if len(owned.id_text) <= _ID_CHARS else owned.id_text[:_ID_CHARS] + "..."
    return f"{owned.id_kind} {text}"


def decide(rules: tuple[Rule, ...], principal: Principal | None, owned: Sequence[Owned]) -> TxmqError | None:
    """None when ``principal`` may do what the request asks on every resource its ids name;
    else the refusal (PermissionDeniedError; with auth off, ``principal`` None, an
    InvalidFieldError for a mismatch)."""
    for o in owned:
        resource = describe(o.kind, o.recorded)
        allowed = principal is None or principal.service or allows(rules, principal.name, o.action, o.kind,
                                                                   o.recorded)
        if o.named and o.named != o.recorded:
            if principal is None:
                return InvalidFieldError(o.field, f"{o.named!r} is not the {o.kind} of {_id(o)} ({o.recorded!r})")
            if not allowed:  # never name a resource the caller holds no right on
                return PermissionDeniedError(principal.name, o.action,
                                             f"the {o.kind} of {_id(o)}: not {o.named!r} named in {o.field}")
            return PermissionDeniedError(principal.name, o.action,
                                         f"{resource}: {_id(o)} belongs to it, not to {o.named!r} named in {o.field}")
        if not allowed:
            assert principal is not None  # allowed when None
            return PermissionDeniedError(principal.name, o.action, f"{resource} ({_id(o)} belongs to it)" if o.named
                                         else f"the {o.kind} of {_id(o)} (named by no field: {o.field} left empty)")
    return None


#: The service's lookup: what an id of a request names in its store (None: nothing to
#: authorize — an id it did not issue, or naming nothing, which the request itself refuses).
Resolve = Callable[[IdRef], "Owned | None"]


def authorize_ids(rules: tuple[Rule, ...], principal: Principal, refs: Sequence[IdRef], resolve: Resolve) -> None:
    """Raises the refusal of :func:`decide` for the ids ``refs`` of a request, resolved."""
    owned = [o for o in (resolve(ref) for ref in refs) if o is not None]
    refusal = decide(rules, principal, owned)
    if refusal is not None:
        raise refusal
