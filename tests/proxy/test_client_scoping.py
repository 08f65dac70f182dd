"""Client ids are chosen by the clients, so the proxy keeps its clients by client id *and*
principal (issue 30): a principal naming another's client id opens a client of its own — it
is offered none of the other's checks, and its NotifyClientTermination ends none of the
other's check subscriptions or renewals."""

from __future__ import annotations

from services.proxy.clients import ClientKey, ClientRegistry
from services.proxy.protocol import definition_pb2 as pb


def settings(*topics: str) -> pb.Settings:
    return pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name=t) for t in topics]))


def test_the_same_client_id_under_two_principals_is_two_clients() -> None:
    registry = ClientRegistry(idle_expiry_seconds=60)
    changed: list[ClientKey] = []
    gone: list[ClientKey] = []
    registry.on_change.append(changed.append)
    registry.on_gone.append(gone.append)
    alice, mallory = ClientKey("alice", "client-1"), ClientKey("mallory", "client-1")
    a = registry.open_stream(alice, "peer-a")
    registry.update_settings(a, settings("orders"))  # auth off here: may() allows
    m = registry.open_stream(mallory, "peer-m")  # the newest stream of "client-1"
    assert registry.stream_for(alice, "orders") is a  # alice's checks never go to mallory's stream
    assert registry.stream_for(mallory, "orders") is None  # mallory publishes nothing: no checks at all
    registry.terminate(mallory)
    assert registry.producers() == {alice: ("orders",)}  # alice's subscriptions stand
    assert gone == [mallory]
    registry.close_stream(m)
    assert registry.stream_for(alice, "orders") is a
