"""Draining a shard under load from the official RocketMQ 5 Python client through the
proxy: the proxy follows the route's draining mark (new sends go to the other shard, the
queues are advertised read-only), no call fails, the drained shard's pending transactions
are decided, and every commit is delivered once."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Callable

import grpc
import pytest

from services.proxy.protocol import definition_pb2, service_pb2, service_pb2_grpc

from tests.support.failover import drain, pending
from tests.support.metrics import metric
from tests.support.waiting import wait_until

from .conftest import CHECKER_ENV, PROXY_ENV
from .support import Clients

pytestmark = pytest.mark.timeout(240)


def test_the_proxy_follows_a_drained_shard(fresh_cluster_factory, clients: Clients,
                                           unique_name: Callable[[str], str]) -> None:
    cluster = fresh_cluster_factory(brokers=2, checker=True, checker_env=CHECKER_ENV, proxies=1, proxy_env=PROXY_ENV)
    topic = unique_name("orders")
    cluster.create_topic(topic, 4)
    proxy = cluster.proxies[0]
    load = clients.python("commit_load", timeout=220, endpoints=proxy.address, topic=topic, threads=2,
                          local_seconds=0.02)
    load.wait_event("started", timeout=60)

    def sent_to(shard: str) -> float:
        return metric(proxy.metrics_port, "txmq_proxy_shard_send_seconds_count", {"shard": shard}) or 0.0
    wait_until(lambda: sent_to("broker-1") >= 20, 60, message="no load on broker-1")

    def txmq_drain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, "--json",
                               "broker", "drain", "broker-1", *args], capture_output=True, text=True, timeout=90)
    out = txmq_drain()
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["draining"] and not json.loads(out.stdout)["empty"]
    # RocketMQ clients asking the proxy for routes see broker-1's queues read-only.
    def permissions() -> dict[str, set[int]]:
        with grpc.insecure_channel(proxy.address) as channel:
            response = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
                service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), timeout=10)
        out: dict[str, set[int]] = {}
        for q in response.message_queues:
            out.setdefault(q.broker.name, set()).add(q.permission)
        return out
    wait_until(lambda: permissions() == {"broker-0": {definition_pb2.READ_WRITE}, "broker-1": {definition_pb2.READ}},
               10, message=lambda: f"permissions {permissions()}")
    # Once the proxy's route knows (route_ttl_seconds), nothing more goes to broker-1.
    wait_until(lambda: len(load.of("committed")) > 0, 10)
    settled = sent_to("broker-1")
    rerouted = metric(proxy.metrics_port, "txmq_proxy_sends_rerouted_total") or 0.0
    committed_then = len(load.of("committed"))
    wait_until(lambda: len(load.of("committed")) >= committed_then + 200, 60, message="the load stalled")
    assert sent_to("broker-1") == settled
    # Chosen from the route: no send was tried on broker-1 (and refused) any more.
    assert (metric(proxy.metrics_port, "txmq_proxy_sends_rerouted_total") or 0.0) == rerouted
    assert load.proc.stdin is not None
    load.proc.stdin.write(b"stop\n")
    load.proc.stdin.flush()
    load.wait_event("stopped", timeout=60)
    assert load.of("failed") == [], f"calls failed to the application: {load.of('failed')[:3]}"
    expected = {e["body"].encode() for e in load.of("committed")}
    bodies = drain(cluster, topic, unique_name("audit"), expected, timeout=60)
    assert len(bodies) == len(set(bodies)) and set(bodies) == expected
    wait_until(lambda: not pending(cluster, topic), 20,
               message=lambda: f"transactions left pending: {pending(cluster, topic)[:3]}")
    load.expect_success(60)
    # Consumed and decided: broker-1 is empty and may be removed.
    out = txmq_drain("--wait", "30s")
    assert out.returncode == 0 and json.loads(out.stdout)["empty"], out.stderr
