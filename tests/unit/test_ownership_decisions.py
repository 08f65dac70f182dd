"""The pure decisions of services/common/auth: what an id names (``ownership.decide``) and
whom a call is for (``delegation.effective_principal``), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.auth import hash_token
from services.common.auth.delegation import (ON_BEHALF_OF_HEADER, act_for, effective_principal, on_behalf_metadata,
                                             reset)
from services.common.auth.ownership import Owned, decide
from services.common.auth.store import Principal, parse
from txmq.errors import InvalidFieldError, PermissionDeniedError, UnauthenticatedError

CREDENTIALS = parse([("credentials.yaml", {
    "principals": {"alice": {"tokens": [hash_token("a")]}, "bob": {}, "proxy": {"service": True}},
    "acl": [
        {"principal": "alice", "resource": "producer_group:ga", "actions": ["check"]},
        {"principal": "alice", "resource": "topic:ta", "actions": ["subscribe"]},
        {"principal": "alice", "resource": "topic:shared-*", "actions": ["subscribe"]},
        {"principal": "bob", "resource": "producer_group:gb", "actions": ["check"]},
    ]})])
ALICE, BOB, PROXY = (CREDENTIALS.principals[n] for n in ("alice", "bob", "proxy"))


def txn(recorded: str, named: str) -> Owned:
    return Owned("check", "producer_group", recorded, named, "producer_group", "T" + "x" * 40, "transaction id")


def handle(recorded: str, named: str) -> Owned:
    return Owned("subscribe", "topic", recorded, named, "topic", "Rhandle", "receipt handle")


ALLOWED = None
DENIED = PermissionDeniedError
MISMATCH = InvalidFieldError


@pytest.mark.parametrize(("principal", "owned", "outcome"), [
    # Her own transaction, named or (as a service might) not.
    (ALICE, [txn("ga", "ga")], ALLOWED),
    (ALICE, [txn("ga", "")], ALLOWED),
    # Another group's transaction: refused whatever she names (her group, its group, none).
    (ALICE, [txn("gb", "ga")], DENIED),
    (ALICE, [txn("gb", "gb")], DENIED),
    (ALICE, [txn("gb", "")], DENIED),
    # A receipt handle of a topic she may not read, named as one she may read, or not named.
    (ALICE, [handle("tb", "ta")], DENIED),
    (ALICE, [handle("tb", "")], DENIED),
    (ALICE, [handle("ta", "ta")], ALLOWED),
    (ALICE, [handle("shared-1", "shared-1")], ALLOWED),
    # Allowed on both, but the name is not what the id names: refused too.
    (ALICE, [handle("shared-1", "shared-2")], DENIED),
    # One refused among several refuses the request.
    (ALICE, [handle("ta", "ta"), handle("tb", "ta")], DENIED),
    (BOB, [txn("gb", "gb")], ALLOWED),
    (BOB, [txn("ga", "gb")], DENIED),
    # A service identity holds every right, but may not name what an id is not.
    (PROXY, [txn("gb", "")], ALLOWED),
    (PROXY, [txn("gb", "gb")], ALLOWED),
    (PROXY, [txn("gb", "ga")], DENIED),
    # Auth off: nobody to authorize; a mismatch is still refused (INVALID_ARGUMENT).
    (None, [txn("gb", "")], ALLOWED),
    (None, [txn("gb", "gb")], ALLOWED),
    (None, [txn("gb", "ga")], MISMATCH),
    (None, [], ALLOWED),
])
def test_ownership_decisions(principal: Principal | None, owned: list[Owned], outcome: Any) -> None:
    refusal = decide(CREDENTIALS.rules, principal, owned)
    if outcome is ALLOWED:
        assert refusal is None
    else:
        assert isinstance(refusal, outcome), refusal


def test_a_refusal_names_principal_action_and_the_resource_the_id_belongs_to() -> None:
    """... to a caller allowed on that resource, or who named it; never another's."""
    refusal = decide(CREDENTIALS.rules, ALICE, [handle("shared-1", "shared-2")])
    assert isinstance(refusal, PermissionDeniedError)
    assert (refusal.principal, refusal.action) == ("alice", "subscribe")
    assert "topic 'shared-1'" in refusal.resource and "'shared-2' named in topic" in refusal.resource
    refusal = decide(CREDENTIALS.rules, ALICE, [txn("gb", "gb")])
    assert isinstance(refusal, PermissionDeniedError) and "producer_group 'gb'" in refusal.resource


@pytest.mark.parametrize(("owned", "hidden", "said"), [
    (txn("gb", "ga"), "'gb'", "the producer_group of transaction id"),
    (txn("gb", ""), "'gb'", "producer_group left empty"),
    (handle("tb", "ta"), "'tb'", "not 'ta' named in topic"),
    (handle("tb", ""), "'tb'", "the topic of receipt handle"),
])
def test_a_refusal_never_names_a_resource_the_caller_holds_no_right_on(owned: Owned, hidden: str, said: str) -> None:
    refusal = decide(CREDENTIALS.rules, ALICE, [owned])
    assert isinstance(refusal, PermissionDeniedError)
    assert hidden not in refusal.message and hidden not in refusal.resource, refusal.message
    assert said in refusal.message, refusal.message


@pytest.mark.parametrize(("authenticated", "header", "outcome"), [
    (ALICE, None, "alice"),
    (PROXY, None, "proxy"),                         # a service acting as itself
    (PROXY, "alice", "alice"),                      # ... or for an end principal
    (PROXY, "b%C3%A9", UnauthenticatedError),       # one its files do not know (percent-encoded "bé")
    (ALICE, "bob", PermissionDeniedError),          # only service identities act for others
    (ALICE, "alice", PermissionDeniedError),        # ... even for themselves: never ignored
])
def test_whom_a_call_is_for(authenticated: Principal, header: str | None, outcome: Any) -> None:
    metadata = {} if header is None else {ON_BEHALF_OF_HEADER: header}
    if isinstance(outcome, str):
        assert effective_principal(CREDENTIALS, authenticated, metadata).name == outcome
    else:
        with pytest.raises(outcome):
            effective_principal(CREDENTIALS, authenticated, metadata)


def test_a_lookup_that_may_create_a_topic_names_whom_it_is_for():
    """The proxy's auto-creating route lookups carry the principal they are for (the name
    server counts the topic against its quota); while it acts for itself, nothing."""
    assert on_behalf_metadata() == []
    token = act_for("ops team/ü")
    try:
        assert on_behalf_metadata() == [(ON_BEHALF_OF_HEADER, "ops%20team%2F%C3%BC")]
    finally:
        reset(token)
    assert on_behalf_metadata() == []
