"""Rights revoked while a call holds on, without processes: the pure decisions (which groups a
check stream loses, which topics a RocketMQ client may still be sent the checks of), a
held call decided again only when the credential store reloaded, the checker handing back
what a stream may no longer hold, and the proxy's clients decided again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from services.checker.dispatcher import Dispatcher
from services.checker.standing import Standing, refusal, revoked_groups
from services.common.auth import Caller, CredentialStore, hash_token
from services.common.auth.store import Principal, parse
from services.proxy.clients import ClientKey, ClientRegistry, checkable
from services.proxy.protocol import definition_pb2 as pb
from txmq.errors import InvalidFieldError, PermissionDeniedError, UnauthenticatedError
from txmq.v1 import broker_pb2, common_pb2

from .test_checker_dispatcher import Metrics, Reports, sent_checks, task

UNDELIVERED = broker_pb2.CHECK_OUTCOME_UNDELIVERED


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


# --------------------------------------------------------------------------- pure decisions

def test_the_groups_a_stream_loses_are_those_its_principal_may_no_longer_check():
    rules = parse([("c", acl(("alice", "producer_group:ga", "check"), ("alice", "producer_group:gc", "admin-read")))]).rules
    alice = Principal("alice")
    assert revoked_groups(rules, alice, ("ga", "gb", "gc")) == ("gb", "gc")
    assert revoked_groups(rules, alice, ("ga",)) == ()
    assert revoked_groups(rules, Principal("svc", service=True), ("gb",)) == ()  # a service holds every right
    assert revoked_groups((), Principal("bob"), ("ga", "gb")) == ("ga", "gb")
    error = refusal(alice, ("gb", "gc"))
    assert isinstance(error, PermissionDeniedError)
    assert error.message == "principal 'alice' may not check producer_group 'gb', producer_group 'gc'"


def test_a_rocketmq_client_may_be_sent_the_checks_of_the_topics_it_may_check():
    credentials = parse([("c", acl(("alice", "producer_group:ta", "check"), ("alice", "topic:tb", "publish")))])
    assert checkable(credentials, "alice", ("ta", "tb")) == ("ta",)
    assert checkable(credentials, "svc", ("ta", "tb")) == ("ta", "tb")
    assert checkable(credentials, "gone", ("ta",)) == ()  # removed from the files
    assert checkable(credentials, None, ("ta", "tb")) == ("ta", "tb")  # auth off


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


# --------------------------------------------------------------------------- the checker

@pytest.fixture
def dispatcher():
    reports, metrics = Reports(), Metrics()
    d = Dispatcher(checker_name="c", reporter=reports, answer_timeout_seconds=1.0, lease_seconds=5.0,
                   queue_size=8, metrics=metrics, clock=lambda: 2000.0, monotonic=Clock())
    return d, reports, metrics


def test_a_revoked_group_leaves_the_stream_and_its_checks_go_back(dispatcher):
    d, reports, metrics = dispatcher
    stream = d.subscribe("alice-1", ["ga", "gb"], credit=4)
    other = d.subscribe("bob-1", ["gb"], credit=4)
    d.dispatch("broker-0", [task("A1", "ga"), task("A2", "ga"), task("B1", "gb", client="alice-1")])
    written = stream.pop()  # A1 is written, A2 and B1 still queued
    assert written is not None and written.check.transaction_id == "A1"
    d.received(stream, written.check.check_id)  # started: its unit of check_max is spent
    reports.sent.clear()

    handed_back = d.revoke(stream, ["ga"], refusal(Principal("alice"), ["ga"]))
    assert handed_back == 2
    assert sorted(reports.outcomes()) == [("A1", UNDELIVERED), ("A2", UNDELIVERED)]  # due again at once
    assert ("ga", "revoked") in metrics.results
    assert stream.groups == ("gb",) and not stream.closed
    assert "ga" not in d.membership.by_group and "ga" not in d.credit.capacity
    rest = [stream.pop(), stream.pop(), stream.pop()]
    assert [r.WhichOneof("command") if r else None for r in rest] == ["check", "error", None]
    assert rest[0].check.transaction_id == "B1"  # the group it keeps is still sent
    assert rest[1].error.reason == "PERMISSION_DENIED" and "'ga'" in rest[1].error.message
    # Its answer to A1 is refused (not a check of this stream), and nothing is reported.
    with pytest.raises(Exception, match="not a check outstanding"):
        d.answered(stream, written.check.check_id, common_pb2.CHECK_RESULT_COMMIT, 0.0)
    assert len(reports.sent) == 2
    # ga's next checks go to nobody here.
    d.dispatch("broker-0", [task("A3", "ga")])
    assert reports.outcomes()[-1] == ("A3", UNDELIVERED) and sent_checks(stream) == []

    d.revoke(stream, ["gb"], refusal(Principal("alice"), ["gb"]))
    assert stream.closed and stream.refusal is not None and "'gb'" in stream.refusal.message
    assert reports.outcomes()[-1] == ("B1", UNDELIVERED) and stream.id not in d.streams
    assert d.membership.by_group["gb"] == {other.id: other} and d.credit.capacity == {"gb": 4}
    assert d.revoke(stream, ["gb"], refusal(Principal("alice"), ["gb"])) == 0  # ended: nothing more


def test_the_checker_decides_its_streams_again_when_the_files_are_reloaded(tmp_path, dispatcher):
    d, reports, _ = dispatcher
    files = Files(tmp_path, BOTH)
    standing = Standing(d)
    alice = d.subscribe("alice-1", ["ga", "gx"], credit=2)
    bob = d.subscribe("bob-1", ["gb"], credit=2)
    standing.watch(alice, Caller(Principal("alice"), files.store))
    standing.watch(bob, Caller(Principal("bob"), files.store))
    d.dispatch("broker-0", [task("X1", "gx")])
    standing.revise()
    assert alice.groups == ("ga", "gx") and bob.groups == ("gb",)  # nothing reloaded

    files.write(acl(("alice", "producer_group:ga", "check"), ("bob", "producer_group:gb", "check")))
    standing.revise()
    assert alice.groups == ("ga",) and reports.outcomes() == [("X1", UNDELIVERED)]
    assert bob.groups == ("gb",) and not bob.closed

    files.write(acl(("alice", "producer_group:ga", "check")))
    standing.revise()
    assert bob.closed and isinstance(bob.refusal, PermissionDeniedError) and "'gb'" in bob.refusal.message

    def token_gone(credentials: Any) -> None:
        raise UnauthenticatedError("the bearer token is not known")
    carol = d.subscribe("carol-1", ["ga"], credit=1)
    standing.watch(carol, Caller(Principal("alice"), files.store, recheck=token_gone))
    files.write(acl(("alice", "producer_group:ga", "check"), ("alice", "producer_group:gy", "check")))
    standing.revise()
    assert carol.closed and isinstance(carol.refusal, UnauthenticatedError)
    assert not alice.closed
    standing.forget(alice)
    standing.forget(bob)
    standing.forget(carol)


def test_a_group_granted_again_comes_back_to_the_stream_that_lost_it(tmp_path, dispatcher):
    """alice's stream subscribed ga and gx and lost gx to a revoke; a reload grants gx again:
    the stream serves gx again as at a subscribe — its checks routed to it within its credit,
    its capacity and free credit in gx's sums, its answers taken — without subscribing
    again, and in its subscription's order. A group it never subscribed to is not added
    (alice may check gy too), and a stream that lost its every group stays ended. Failed
    before: the stream stayed without gx until its producer subscribed again."""
    d, reports, metrics = dispatcher
    files = Files(tmp_path, BOTH)
    standing = Standing(d)
    alice = d.subscribe("alice-1", ["gx", "ga"], credit=2)
    lone = d.subscribe("alice-2", ["gx"], credit=2)
    for stream in (alice, lone):
        standing.watch(stream, Caller(Principal("alice"), files.store))
    files.write(acl(("alice", "producer_group:ga", "check")))
    standing.revise()
    assert alice.groups == ("ga",) and set(alice.lost) == {"gx"} and lone.closed
    d.dispatch("broker-0", [task("X1", "gx")])
    assert reports.outcomes()[-1] == ("X1", UNDELIVERED) and sent_checks(alice) == []  # nobody serves gx

    files.write(BOTH)  # gx allowed again (through g*), and gy
    standing.revise()
    assert alice.groups == ("gx", "ga") and alice.lost == {} and d.membership.by_group["gx"] == {alice.id: alice}
    assert (d.credit.capacity["gx"], d.credit.free["gx"]) == (2, 2) and metrics.connected["gx"] == 1
    d.dispatch("broker-0", [task("X2", "gx"), task("X3", "gx"), task("X4", "gx")])
    sent = sent_checks(alice)
    assert [c.transaction_id for c in sent] == ["X2", "X3"]  # its credit, 2, and no more
    assert reports.outcomes()[-1] == ("X4", UNDELIVERED)
    d.answered(alice, sent[0].check_id, common_pb2.CHECK_RESULT_COMMIT, 0.0, producer_group="gx")
    assert reports.outcomes()[-1] == ("X2", broker_pb2.CHECK_OUTCOME_ANSWERED)
    assert lone.closed and lone.id not in d.streams
    assert d.readmit(alice, ["gy"]) == ()  # never subscribed: nothing granted
    standing.forget(alice)


def test_a_stream_watched_after_a_reload_is_decided_at_once(tmp_path, dispatcher):
    """The files reloaded between a subscribe's check and its stream being watched."""
    d, _, _ = dispatcher
    files = Files(tmp_path, BOTH)
    standing = Standing(d)
    first = d.subscribe("bob-0", ["gb"], credit=1)
    standing.watch(first, Caller(Principal("bob"), files.store))
    standing.revise()
    caller = Caller(Principal("alice"), files.store)  # decided under the files as they were
    files.write(acl(("alice", "producer_group:ga", "check")))
    standing.revise()  # another stream's revision saw the new files
    late = d.subscribe("alice-1", ["ga", "gb"], credit=1)
    standing.watch(late, caller)
    assert late.groups == ("ga",)


# --------------------------------------------------------------------------- the proxy

def test_the_proxy_decides_its_clients_check_topics_again_when_the_files_are_reloaded(tmp_path):
    files = Files(tmp_path, acl(("alice", "producer_group:ta", "check"), ("alice", "producer_group:tb", "check")))
    registry = ClientRegistry(60.0)
    registry.store = files.store
    changed: list[ClientKey] = []
    registry.on_change.append(changed.append)
    alice = ClientKey("alice", "client-1")
    stream = registry.open_stream(alice, "peer-1")
    settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name="ta"), pb.Resource(name="tb")]))
    registry.update_settings(stream, settings)  # auth off in this call: may() allows both
    assert registry.producers() == {alice: ("ta", "tb")}
    registry.revise()
    assert registry.producers() == {alice: ("ta", "tb")}

    files.write(acl(("alice", "producer_group:tb", "check")))
    changed.clear()
    registry.revise()
    assert registry.producers() == {alice: ("tb",)} and changed == [alice]  # its subscriptions follow
    files.write(acl(("alice", "producer_group:ta", "check"), ("alice", "producer_group:tb", "check")))
    changed.clear()
    registry.revise()  # granted again: back from what it published, as at its Settings
    assert registry.producers() == {alice: ("ta", "tb")} and changed == [alice]

    def key_gone(credentials: Any) -> None:
        raise UnauthenticatedError("signed request: access key 'AK' is not known")
    bob = ClientKey("bob", "client-2")
    bobs = registry.open_stream(bob, "peer-2", Caller(Principal("bob"), files.store, recheck=key_gone))
    registry.update_settings(bobs, settings)
    files.write(acl(("alice", "producer_group:tb", "check"), ("bob", "producer_group:ta", "check")))
    registry.revise()
    assert bobs.closed and isinstance(bobs.refusal, UnauthenticatedError)
    assert registry.producers() == {alice: ("tb",)}
    assert not stream.closed


def test_a_revoked_stream_writes_none_of_the_checks_it_queued(dispatcher):
    """The checker's writer decides again before each write: once a group is revoked, its
    queued checks are gone from the stream's outbox, not written later."""
    d, _, _ = dispatcher
    stream = d.subscribe("alice-1", ["ga"], credit=4)
    d.dispatch("broker-0", [task("A1", "ga"), task("A2", "ga")])
    d.revoke(stream, ["ga"], refusal(Principal("alice"), ["ga"]))
    assert stream.pop() is None and stream.closed
    assert isinstance(stream.refusal, PermissionDeniedError)


def test_an_answer_naming_a_group_the_stream_lost_is_refused_with_the_revoke(dispatcher):
    """The answer is the checker's to refuse in band (the stream policy lets a group the
    stream subscribed through, ``Need.in_band``): PERMISSION_DENIED as the stream was told,
    late or not, and nothing reported; an answer naming another group than its check's is
    refused too, and the group the stream keeps is still answered."""
    d, reports, metrics = dispatcher
    stream = d.subscribe("alice-1", ["ga", "gb"], credit=4)
    d.dispatch("broker-0", [task("A1", "ga"), task("B1", "gb")])
    a1, b1 = (stream.pop().check for _ in range(2))
    told = refusal(Principal("alice"), ["ga"])
    d.revoke(stream, ["ga"], told)
    reports.sent.clear()
    for transaction_id in ("", "A1"):
        with pytest.raises(PermissionDeniedError) as refused:
            d.answered(stream, a1.check_id, common_pb2.CHECK_RESULT_COMMIT, 0.0, transaction_id=transaction_id,
                       broker_name="broker-0", producer_group="ga")
        assert refused.value is told
        # Counted as what it is, under the group it named (before: "invalid", under gb).
        d.refused(stream, a1.check_id, refused.value, answer=True, producer_group="ga")
    assert metrics.refused == [("ga", "revoked"), ("ga", "revoked")]
    with pytest.raises(InvalidFieldError, match="not the group of check") as wrong:
        d.answered(stream, b1.check_id, common_pb2.CHECK_RESULT_COMMIT, 0.0, producer_group="ga")
    d.refused(stream, b1.check_id, wrong.value, answer=True, producer_group="ga")
    assert metrics.refused[-1] == ("gb", "invalid")
    assert reports.sent == []
    d.answered(stream, b1.check_id, common_pb2.CHECK_RESULT_COMMIT, 0.0, producer_group="gb")
    assert reports.outcomes()[-1] == ("B1", broker_pb2.CHECK_OUTCOME_ANSWERED)
