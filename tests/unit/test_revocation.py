"""Rights revoked while a call holds on, without processes: a held call decided again only
when the credential store reloaded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from services.common.auth import Caller, CredentialStore, hash_token
from services.common.auth.store import Principal
from txmq.errors import UnauthenticatedError


def acl(*rules: tuple[str, str, str]) -> dict[str, Any]:
    return {"principals": {"alice": {"tokens": [hash_token("alice-token")]}, "svc": {"service": True},
                           "bob": {}},
            "acl": [{"principal": p, "resource": r, "actions": [a]} for p, r, a in rules]}


BOTH = acl(("alice", "producer_group:ga", "check"), ("alice", "producer_group:g*", "check"),
           ("bob", "producer_group:gb", "check"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Files:
    """A credential file and its store, read again when the clock moves past reload_seconds."""

    def __init__(self, tmp_path: Path, data: dict[str, Any]) -> None:
        self.path = tmp_path / "credentials.json"
        self.clock = Clock()
        self.writes = 0
        self.write(data, advance=False)
        self.store = CredentialStore([str(self.path)], reload_seconds=1.0, clock=self.clock)

    def write(self, data: dict[str, Any], advance: bool = True) -> None:
        self.path.write_text(json.dumps(data))
        self.writes += 1
        os.utime(self.path, ns=(self.writes, self.writes))  # a new mtime within the fs's resolution
        if advance:
            self.clock.now += 1.5


# --------------------------------------------------------------------------- a held call

def test_a_held_call_is_decided_again_only_once_the_store_reloaded(tmp_path):
    files = Files(tmp_path, BOTH)
    decided: list[Any] = []

    def recheck(credentials: Any) -> None:
        decided.append(credentials)
        if credentials.principal_for_token("alice-token") is None:
            raise UnauthenticatedError("the bearer token is not known")

    caller = Caller(Principal("alice"), files.store, files.store.current(), recheck)
    first = caller.current()
    assert caller.current() is first and decided == []  # nothing reloaded: one comparison
    files.write(acl(("alice", "producer_group:ga", "check")))
    second = caller.current()
    assert second is not first and decided == [second]
    assert caller.current() is second and len(decided) == 1
    files.write({"principals": {"alice": {}}})  # alice's token removed
    with pytest.raises(UnauthenticatedError):
        caller.current()
    with pytest.raises(UnauthenticatedError):  # and it stays refused
        caller.current()
