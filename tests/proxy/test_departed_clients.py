"""The clients the proxy remembers after they left, on real services with auth on.

A departed client (every Telemetry stream ended) is remembered by its topics for
client_idle_expiry_seconds (600 s), so that one coming back is checked at once, before its
next Settings. Client ids are the clients' choice: one principal opening each stream under a
new id grew the proxy's memory by one client per id for ten minutes, and nothing showed it.
Now at most max_departed_clients_per_principal stay per principal (the least recently departed
is forgotten first), and ``txmq_proxy_clients{state}`` on the proxy's /metrics counts them."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from services.proxy.protocol import Code, definition_pb2 as pb, service_pb2 as spb, service_pb2_grpc
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.ownership import secured_cluster, signed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0
#: The proxy's max_departed_clients_per_principal here.
LIMIT = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with secured_cluster(tmp_path, proxy_env={"TXMQ_MAX_DEPARTED_CLIENTS_PER_PRINCIPAL": str(LIMIT)}) as cluster:
        for topic in ("ra", "rb"):
            cluster.create_topic(topic, queue_count=1)
        yield cluster


def _leave_after_settings(rmq: service_pb2_grpc.MessagingServiceStub, who: str, client_id: str, topic: str) -> None:
    """A producer's Telemetry stream: its Settings publish ``topic``; it leaves once answered."""
    settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)]))

    def requests() -> Iterator[spb.TelemetryCommand]:
        yield spb.TelemetryCommand(settings=settings)
        time.sleep(RPC_TIMEOUT)  # open until the reply came (the call is cancelled then)

    call = rmq.Telemetry(requests(), timeout=RPC_TIMEOUT, metadata=signed(who, client_id))
    try:
        for reply in call:
            assert reply.status.code == Code.OK, reply.status
            if reply.HasField("settings"):
                return
        raise AssertionError("the Telemetry stream ended without a reply")
    finally:
        call.cancel()


class _Back:
    """A client coming back: a Telemetry stream that sends no Settings, open until closed."""

    def __init__(self, rmq: service_pb2_grpc.MessagingServiceStub, who: str, client_id: str) -> None:
        self._done = threading.Event()

        def requests() -> Iterator[spb.TelemetryCommand]:
            self._done.wait(120)
            return
            yield  # a generator that sends nothing

        self._call = rmq.Telemetry(requests(), timeout=150, metadata=signed(who, client_id))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for _ in self._call:
                pass
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._done.set()
        self._call.cancel()
        self._reader.join(30)


def _remembered(cluster: Cluster, state: str) -> float:
    return metric_sum(cluster.proxies[0].metrics_port, "txmq_proxy_clients", {"state": state})


def _subscribed(cluster: Cluster, group: str) -> float:
    """The proxy's check subscriptions for ``group`` at the checker (one per producer client)."""
    return metric_sum(cluster.checkers[0].metrics_port, "txmq_producers_connected", {"group": group})


def test_a_principal_cycling_client_ids_forgets_only_its_own_least_recent(cluster: Cluster) -> None:
    """rmb's producer leaves first; then rma opens and leaves streams under 3 × LIMIT new client
    ids. The proxy remembers LIMIT of rma's and rmb's one (a limit over all principals would have
    forgotten rmb's, the least recently departed of all): rmb's producer, back without Settings,
    is subscribed for its checks at once."""
    channel = grpc.insecure_channel(cluster.proxy_addresses[0])
    rmq = service_pb2_grpc.MessagingServiceStub(channel)
    back: _Back | None = None
    try:
        _leave_after_settings(rmq, "rmb", "rmb-1", "rb")
        for i in range(3 * LIMIT):
            _leave_after_settings(rmq, "rma", f"rma-{i}", "ra")
        wait_until(lambda: _remembered(cluster, "departed") == LIMIT + 1 and _remembered(cluster, "live") == 0, 30,
                   message=f"the proxy does not show {LIMIT} of rma's departed clients and rmb's one "
                           f"(departed={_remembered(cluster, 'departed')})")
        assert _subscribed(cluster, "rb") == 0
        back = _Back(rmq, "rmb", "rmb-1")
        wait_until(lambda: _subscribed(cluster, "rb") == 1, 30,
                   message="rmb's departed producer was forgotten: back without Settings, it is not checked")
        assert _remembered(cluster, "departed") == LIMIT, "rmb's client came back: rma's LIMIT stay departed"
    finally:
        if back is not None:
            back.close()
        channel.close()


def test_the_most_recent_departed_client_is_still_checked_at_once(cluster: Cluster) -> None:
    """What the departed record is for: rma's most recent producer of the 3 × LIMIT it cycled,
    back without Settings, is subscribed for its checks at once (its topics were kept); its
    first, forgotten, back the same way is not (until it sends Settings), and only LIMIT of its
    clients were ever remembered."""
    channel = grpc.insecure_channel(cluster.proxy_addresses[0])
    rmq = service_pb2_grpc.MessagingServiceStub(channel)
    back: list[_Back] = []
    last = f"rma-{3 * LIMIT - 1}"
    try:
        for i in range(3 * LIMIT):
            _leave_after_settings(rmq, "rma", f"rma-{i}", "ra")
        wait_until(lambda: _remembered(cluster, "departed") == LIMIT, 30,
                   message=f"rma's departed clients: {_remembered(cluster, 'departed')}, not its last {LIMIT}")
        back.append(_Back(rmq, "rma", "rma-0"))
        back.append(_Back(rmq, "rma", last))
        wait_until(lambda: _subscribed(cluster, "ra") >= 1, 30,
                   message=f"{last}, rma's most recent client, was forgotten: back without Settings, not checked")
        wait_until(lambda: (_remembered(cluster, "live"), _remembered(cluster, "departed")) == (2, LIMIT - 1), 30,
                   message="the proxy does not show the clients back as live")
        time.sleep(1.0)  # two of the proxy's directory refreshes: rma-0's subscription, if any, is made
        assert _subscribed(cluster, "ra") == 1, "rma-0, its least recently departed, was remembered"
    finally:
        for client in back:
            client.close()
        channel.close()
