"""Secure by default (issue 30): a service started with no settings binds loopback only —
its gRPC and /metrics ports refuse connections on a non-loopback address of the machine (the
address of a bridge this test makes), while a service told to bind every interface
(TXMQ_HOST=0.0.0.0) answers there. Before, every service bound 0.0.0.0 with no auth and no
TLS: an anonymous plaintext RegisterBroker from the network re-pointed a topic."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support import netns
from tests.support.waiting import wait_until
from txmq.v1 import nameserver_pb2, nameserver_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def outside_address() -> Iterator[str]:
    """A non-loopback address of this machine (the bridge address of a test network)."""
    network = netns.Network()
    try:
        yield network.gateway
    finally:
        network.close()


class Started:
    def __init__(self, module: str, workdir: Path, **settings: str) -> None:
        ready = workdir / f"{module}.ready"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
        env.update({"TXMQ_PORT": "0", "TXMQ_METRICS_PORT": "0", "TXMQ_READY_FILE": str(ready),
                    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                    **settings})
        self.log = open(workdir / f"{module}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", module], env=env, cwd=workdir, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: ready.exists() or self.proc.poll() is not None, 30, message=f"{module} not ready")
        assert self.proc.poll() is None, (workdir / f"{module}.log").read_text()
        info = json.loads(ready.read_text())
        self.port, self.metrics_port = info["port"], info["metrics_port"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def test_a_service_with_defaults_refuses_connections_on_a_non_loopback_address(
        tmp_path: Path, outside_address: str) -> None:
    nameserver = Started("services.nameserver", tmp_path)
    (tmp_path / "exposed").mkdir()
    exposed = Started("services.nameserver", tmp_path / "exposed", TXMQ_HOST="0.0.0.0")
    try:
        # Defaults: loopback only.
        assert health(f"127.0.0.1:{nameserver.port}") == health_pb2.HealthCheckResponse.SERVING
        assert not reachable(outside_address, nameserver.port)
        assert not reachable(outside_address, nameserver.metrics_port)
        with grpc.insecure_channel(f"{outside_address}:{nameserver.port}") as channel:
            with pytest.raises(grpc.RpcError) as refused:
                nameserver_pb2_grpc.NameServerServiceStub(channel).RegisterBroker(
                    nameserver_pb2.RegisterBrokerRequest(broker=nameserver_pb2.BrokerInfo(
                        name="rogue", address="10.0.0.66:10911")), timeout=3)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # The control: told to bind every interface, the same service answers there.
        assert reachable(outside_address, exposed.port)
        assert health(f"{outside_address}:{exposed.port}") == health_pb2.HealthCheckResponse.SERVING
        with urllib.request.urlopen(f"http://{outside_address}:{exposed.metrics_port}/metrics", timeout=5) as r:
            assert r.status == 200
    finally:
        nameserver.stop()
        exposed.stop()


def test_a_broker_with_defaults_is_loopback_only_too(tmp_path: Path, outside_address: str) -> None:
    nameserver = Started("services.nameserver", tmp_path)
    broker = Started("services.broker", tmp_path, TXMQ_DATA_DIR=str(tmp_path / "store"),
                     TXMQ_NAMESERVER_ADDRESSES=f"127.0.0.1:{nameserver.port}")
    try:
        assert health(f"127.0.0.1:{broker.port}") == health_pb2.HealthCheckResponse.SERVING
        assert not reachable(outside_address, broker.port)
        assert not reachable(outside_address, broker.metrics_port)
    finally:
        broker.stop()
        nameserver.stop()


def test_the_local_runner_says_it_is_open_and_loopback_only() -> None:
    from services.local import security_banner

    (line,) = security_banner({}, with_etcd=False)
    assert "127.0.0.1 only" in line and "OPEN: no authentication" in line and "plaintext" in line
    secured = security_banner({"TXMQ_AUTH_FILES": "/c.yaml", "TXMQ_TLS_CERT_FILE": "/t.crt"}, with_etcd=True)
    assert "authentication on" in secured[0] and "TLS on" in secured[0] and "etcd authentication on" in secured[1]
