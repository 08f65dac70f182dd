"""The compose quick start (deploy/compose/), for real: Debian's docker-compose 1.29 (`make
compose-tools`) brings it up from the built images (`make images-local`) on the private
daemon the image tests use, health checks pass, a transaction goes through it (left
UNKNOWN, committed by the checker container's check), the broker container restarts and the
message is still there (its store on the named volume). Once plaintext, once with TLS and
auth switched on by the override files: a plaintext or anonymous client is refused, the
admin's token and the client certificate tls-init made are accepted.

Every port is a compose variable: the test takes ports the kernel hands out (bound to port 0,
released, then given to compose), as a user picks free ones; containers share the host's
network (the private daemon has no bridge)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest

import txmq
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose"
PRIVATE_SOCKET = "unix:///var/tmp/txmq-docker/docker.sock"
SERVICES = ("nameserver", "broker", "checker", "proxy")
LocalState = txmq.LocalTransactionState


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Compose:
    def __init__(self, workdir: Path, files: tuple[str, ...]) -> None:
        binary = shutil.which("docker-compose")
        if binary is None:
            pytest.fail("docker-compose is not installed: run `make compose-tools` (apt-get install docker-compose)")
        self.binary = binary
        self.project = f"txmqc{uuid.uuid4().hex[:8]}"
        self.files = files
        ports = iter(_free_ports(16))
        self.env = {**os.environ, "DOCKER_HOST": os.environ.get("DOCKER_HOST", PRIVATE_SOCKET),
                    "TXMQ_TLS_DIR": str(workdir / "tls"), "TXMQ_AUTH_DIR": str(workdir / "auth")}
        self.ports: dict[str, int] = {}
        for service in SERVICES:
            for kind in ("", "_METRICS", "_HEALTH"):
                key = f"TXMQ_{service.upper()}{kind}_PORT"
                self.ports[key] = next(ports)
                self.env[key] = str(self.ports[key])
        self.nameserver = f"127.0.0.1:{self.ports['TXMQ_NAMESERVER_PORT']}"

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        cmd = [self.binary, "-p", self.project]
        for f in self.files:
            cmd += ["-f", str(COMPOSE / f)]
        out = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=self.env, cwd=REPO)
        if out.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: exit {out.returncode}\n{out.stdout[-3000:]}"
                                 f"\n{out.stderr[-3000:]}\n{self.logs()}")
        return out

    def logs(self) -> str:
        cmd = [self.binary, "-p", self.project, *sum((["-f", str(COMPOSE / f)] for f in self.files), [])]
        out = subprocess.run([*cmd, "logs", "--tail", "30"], capture_output=True, text=True, timeout=60,
                             env=self.env, cwd=REPO)
        return out.stdout[-6000:]

    def health(self) -> dict[str, str]:
        ids = self.run("ps", "-q").stdout.split()
        docker = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
        out = subprocess.run([docker, "inspect", *ids], capture_output=True, text=True, timeout=60, env=self.env)
        states = {}
        for c in json.loads(out.stdout):
            name = c["Config"]["Labels"]["com.docker.compose.service"]
            states[name] = (c["State"].get("Health") or {}).get("Status") or c["State"]["Status"]
        return states

    def wait_healthy(self) -> None:
        wait_until(lambda: all(self.health().get(s) == "healthy" for s in SERVICES), timeout=120, interval=0.5,
                   message=lambda: f"not every service healthy: {self.health()}\n{self.logs()}")


def _compose(tmp_path: Path, files: tuple[str, ...]) -> Iterator[Compose]:
    c = Compose(tmp_path, files)
    try:
        c.run("up", "-d")
        c.wait_healthy()
        yield c
    finally:
        try:
            c.run("down", "-v", "--remove-orphans", timeout=120)
        finally:
            # tls-init and auth-init write as root into the test's directories.
            shutil.rmtree(tmp_path / "tls", ignore_errors=True)
            shutil.rmtree(tmp_path / "auth", ignore_errors=True)


class Undecided(txmq.TransactionListener):
    """Leaves the transaction UNKNOWN, then answers the checker's check with COMMIT."""

    def __init__(self) -> None:
        self.checked = threading.Event()

    def execute_local_transaction(self, message, arg):
        return LocalState.UNKNOWN

    def check_local_transaction(self, message):
        self.checked.set()
        return LocalState.COMMIT


def _consume(nameserver: str, topic: str, group: str, want: str, **client) -> None:
    got: set[str] = set()
    with txmq.SimpleConsumer(nameserver, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5, **client) as consumer:
        def arrived() -> bool:
            for m in consumer.receive(max_messages=16, invisible_duration_seconds=30):
                got.add(m.message_id)
                consumer.ack(m)
            return want in got
        wait_until(arrived, timeout=60, interval=0.01, message=lambda: f"got {got}, want {want}",
                   ignore=(txmq.UnavailableError, txmq.TopicNotFoundError))


def _transaction_survives_a_broker_restart(c: Compose, **client) -> None:
    topic = f"orders-{c.project}"
    listener = Undecided()
    with txmq.TransactionProducer(c.nameserver, producer_group=f"pg-{c.project}", listener=listener,
                                  **client) as producer:
        wait_until(lambda: len(producer.connected_checkers()) == 1, timeout=30,
                   message=lambda: f"producer not connected to the checker\n{c.logs()}")
        result = producer.send_in_transaction(txmq.Message(topic, b"through compose"))
        assert result.state == txmq.TransactionState.PREPARED
        # Left UNKNOWN: the checker container asks the producer, which commits.
        _consume(c.nameserver, topic, f"cg1-{c.project}", result.message_id, **client)
    assert listener.checked.is_set()
    c.run("restart", "broker")
    c.wait_healthy()
    _consume(c.nameserver, topic, f"cg2-{c.project}", result.message_id, **client)


@pytest.fixture
def plaintext(tmp_path: Path) -> Iterator[Compose]:
    yield from _compose(tmp_path, ("compose.yaml",))


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Compose]:
    yield from _compose(tmp_path, ("compose.yaml", "tls.yaml", "auth.yaml"))


@pytest.mark.timeout(900)  # compose up, a check, a container restart, compose down
def test_the_quick_start_carries_a_transaction_and_keeps_it_across_a_broker_restart(plaintext: Compose) -> None:
    _transaction_survives_a_broker_restart(plaintext)


@pytest.mark.timeout(900)
def test_tls_and_auth_switched_on_refuse_strangers_and_serve_the_admin(secured: Compose, tmp_path: Path) -> None:
    tls_dir, auth_dir = tmp_path / "tls", tmp_path / "auth"
    tls = txmq.TLS(ca_file=str(tls_dir / "ca.crt"), cert_file=str(tls_dir / "client.crt"),
                   key_file=str(tls_dir / "client.key"))
    token = (auth_dir / "admin.token").read_text().strip()
    # A plaintext client is refused at the TLS handshake; one with the certificate but no
    # token is refused by authentication.
    with txmq.Admin(secured.nameserver, request_timeout_seconds=5) as plain, pytest.raises(txmq.TxmqError):
        plain.list_topics()
    # (30 s for the handshake and the call: on a loaded machine 5 s ran out before the
    # server's TLS handshake, an UnavailableError instead of the refusal.)
    with txmq.Admin(secured.nameserver, tls=tls, request_timeout_seconds=30) as anonymous, \
            pytest.raises(txmq.UnauthenticatedError):
        anonymous.list_topics()
    with txmq.Admin(secured.nameserver, tls=tls, token=token, request_timeout_seconds=30) as admin:
        admin.list_topics()
    _transaction_survives_a_broker_restart(secured, tls=tls, token=token)
    # The credentials survive the restarts (kept, not made again).
    assert (auth_dir / "admin.token").read_text().strip() == token
