"""The proxy's departed clients, without processes: which of a principal's departed clients are
forgotten beyond ``max_departed_clients_per_principal`` (the pure decision), and the registry
keeping at most that many per principal, never another principal's, never a live one; and its
live clients held to ``max_live_clients_per_principal``."""

from __future__ import annotations

import pytest

from services.common.auth import Caller
from services.common.auth.store import Principal
from services.proxy.clients import ClientKey, ClientRegistry, forgotten
from services.proxy.protocol import definition_pb2 as pb
from txmq.errors import PrincipalLimitError


def keys(principal: str, n: int) -> list[ClientKey]:
    return [ClientKey(principal, f"{principal}-{i}") for i in range(n)]


def test_at_most_the_limit_stay_and_the_least_recently_departed_go() -> None:
    departed = keys("a", 5)
    assert forgotten(departed, 5) == []
    assert forgotten(departed, 10) == []
    assert forgotten(departed, 3) == departed[:2]
    assert forgotten(departed, 1) == departed[:4]
    assert forgotten([], 1) == []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def producer(registry: ClientRegistry, key: ClientKey, topic: str = "ra") -> None:
    """A client that sent Settings publishing ``topic`` on one stream, then left."""
    stream = registry.open_stream(key)
    registry.update_settings(stream, pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name=topic)])))
    registry.close_stream(stream)


def test_a_principal_cycling_client_ids_keeps_only_its_most_recent_departed() -> None:
    registry = ClientRegistry(600.0, monotonic=Clock(), max_departed_per_principal=3)
    other = ClientKey("b", "b-0")
    producer(registry, other, "rb")  # departed first: a registry-wide limit would forget it first
    cycled = keys("a", 10)
    for key in cycled:
        producer(registry, key)
    assert registry.counts() == (0, 4)
    assert set(registry.clients) == {other, *cycled[-3:]}
    # The most recent comes back without Settings: its topics were kept, so it is a producer at once.
    registry.open_stream(cycled[-1])
    assert registry.producers() == {cycled[-1]: ("ra",)}
    assert registry.counts() == (1, 3)


def test_a_client_departing_again_is_the_most_recent_and_live_ones_are_never_forgotten() -> None:
    registry = ClientRegistry(600.0, monotonic=Clock(), max_departed_per_principal=2)
    first, second, third = keys("a", 3)
    live = registry.open_stream(ClientKey("a", "live"))
    producer(registry, first)
    producer(registry, second)
    producer(registry, first)  # back and gone again: now the most recently departed
    producer(registry, third)
    assert set(registry.clients) == {live.key, first, third}
    assert registry.counts() == (1, 2)


def test_departed_clients_expire_and_a_settings_read_after_the_stream_ended_keeps_nothing() -> None:
    clock = Clock()
    registry = ClientRegistry(600.0, monotonic=clock, max_departed_per_principal=5)
    early, late = ClientKey("a", "early"), ClientKey("a", "late")
    producer(registry, early)
    clock.now = 300.0
    producer(registry, late)
    clock.now = 650.0
    registry.sweep()
    assert set(registry.clients) == {late} and registry.counts() == (0, 1)
    clock.now = 950.0
    registry.sweep()
    assert registry.clients == {} and registry.counts() == (0, 0)
    # A Settings its reader took after the stream ended (credentials revoked) brings nothing back.
    stream = registry.open_stream(early)
    registry.close_stream(stream)
    clock.now = 2000.0
    registry.sweep()
    registry.update_settings(stream, pb.Settings(client_type=pb.PRODUCER))
    assert registry.clients == {} and registry.counts() == (0, 0)


def _caller(name: str, service: bool = False) -> Caller:
    return Caller(Principal(name, service=service), store=None, credentials=object())  # type: ignore[arg-type]


def test_live_clients_are_capped_per_principal_and_a_refused_one_leaves_nothing_behind() -> None:
    """``max_live_clients_per_principal``: a stream that would make one more live client of a
    principal is refused with nothing remembered; a live client's second stream is not one more;
    a client whose last stream ended gives its place back; other principals, service identities
    and auth off (no caller) are not held to it."""
    registry = ClientRegistry(600.0, monotonic=Clock(), max_live_per_principal=2)
    alice = _caller("alice")
    first = registry.open_stream(ClientKey("alice", "a-0"), "ipv4:10.0.0.1:1", alice)
    registry.open_stream(ClientKey("alice", "a-1"), "ipv4:10.0.0.1:2", alice)  # another connection
    registry.open_stream(ClientKey("alice", "a-1"), "ipv4:10.0.0.1:3", alice)  # the same client again
    with pytest.raises(PrincipalLimitError, match="max_live_clients_per_principal=2"):
        registry.open_stream(ClientKey("alice", "a-2"), "ipv4:10.0.0.1:4", alice)
    assert ClientKey("alice", "a-2") not in registry.clients and registry.counts() == (2, 0)
    registry.open_stream(ClientKey("bob", "b-0"), "ipv4:10.0.0.2:1", _caller("bob"))
    for i in range(3):
        registry.open_stream(ClientKey("proxy", f"p-{i}"), "ipv4:10.0.0.3:1", _caller("proxy", service=True))
        registry.open_stream(ClientKey(None, f"open-{i}"), "ipv4:10.0.0.4:1")
    registry.close_stream(first)  # a-0 departs: its place is free
    registry.open_stream(ClientKey("alice", "a-2"), "ipv4:10.0.0.1:4", alice)
    with pytest.raises(PrincipalLimitError):  # a-0 coming back is one more again
        registry.open_stream(ClientKey("alice", "a-0"), "ipv4:10.0.0.1:5", alice)
    assert registry.live.held == {"alice": 2, "bob": 1}
