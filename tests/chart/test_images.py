"""The built container images (deploy/docker/Dockerfile, `make images-local`), for real:
started as containers on the host network with read-only root filesystems (name server,
broker with a volume, checker, proxy), a transaction through them, the broker container
restarted, the message still there; and the chart's image names, commands, ports, user
ids and paths checked against what `docker image inspect` says of the built images.

The engine is the one `DOCKER_HOST` names, else the private daemon tools/images.sh starts
(/var/tmp/txmq-docker/docker.sock). Without images these tests fail (never skip): run
`make images-local` (make test does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import txmq
from tests.support.waiting import wait_until

from .chart import CHART, COMPONENTS, Rendered

# Containers on the private Docker daemon, not heavy (tests/support/lanes.py): they wait
# more than they compute — measured, about 5 s of CPU (every container and docker call)
# for the module.

PRIVATE_SOCKET = "unix:///var/tmp/txmq-docker/docker.sock"
VERSION = next(line.split('"')[1] for line in (CHART / "Chart.yaml").read_text().splitlines()
               if line.startswith("appVersion:"))
UID = 10001
LocalState = txmq.LocalTransactionState


def _docker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DOCKER_HOST", PRIVATE_SOCKET)
    return env


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    binary = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker") or "docker"
    out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout, env=_docker_env())
    if check and out.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return out


def image(component: str) -> str:
    return f"txmq/{component}:{VERSION}"


@pytest.fixture(scope="module")
def inspected() -> dict[str, dict[str, Any]]:
    missing = [c for c in COMPONENTS if docker("image", "inspect", image(c), check=False).returncode != 0]
    assert not missing, f"images not built: {missing} (engine {_docker_env()['DOCKER_HOST']}): run make images-local"
    return {c: json.loads(docker("image", "inspect", image(c)).stdout)[0] for c in COMPONENTS}


# ---------------------------------------------------------------------------- the chart
def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_the_chart_runs_the_built_images_as_they_are_built(rendered: dict[str, Rendered], inspected, component):
    config = inspected[component]["Config"]
    for scenario in ("minimal", "replicated") if "replicated" in rendered else ("minimal",):
        w = rendered[scenario].workload(component)
        c = _container(w)
        pod = w["spec"]["template"]["spec"]
        assert c["image"] == image(component)
        assert c["command"] == config["Entrypoint"] == ["python", "-m", COMPONENTS[component][0]]
        assert not config.get("Cmd") and "args" not in c
        user, group = (int(x) for x in config["User"].split(":"))
        assert (user, group) == (UID, UID) == (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"])
        exposed = {int(p.split("/")[0]) for p in config["ExposedPorts"]}
        if component == "broker" and scenario == "minimal":
            exposed -= {10912}  # the replication stream's port: replicated shards only
        assert {p["containerPort"] for p in c["ports"]} == exposed
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if component == "broker":
            mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "data")
            assert mount in config["Volumes"]
            data_dir = env.get("TXMQ_DATA_DIR") or rendered[scenario].configmap_env(w, c).get("TXMQ_DATA_DIR")
            assert data_dir and data_dir.startswith(mount + "/")
        if component == "proxy":
            assert env["HOME"] in config["Volumes"] and f"HOME={env['HOME']}" in config["Env"]


def test_images_hold_no_compiler_or_pip_and_run_as_the_chart_user(inspected):
    probe = ("import os, shutil, sys; print(os.getuid(), os.getgid(), "
             "[t for t in ('gcc', 'cc', 'c++', 'pip', 'pip3', 'apt-get') if shutil.which(t)], sys.prefix)")
    for component in COMPONENTS:
        out = docker("run", "--rm", "--network", "host", "--read-only", "--entrypoint", "python", image(component),
                     "-c", probe).stdout.split(None, 2)
        assert out[:2] == [str(UID), str(UID)]
        assert out[2].startswith("[] ") or out[2].startswith("['apt-get'] "), out  # Debian's apt, no build tools
        assert "'pip" not in out[2]
    # The checker's resolver (checker.resolver.groups) talks to PostgreSQL: psycopg and the
    # libpq of its binary wheel are in the image.
    out = docker("run", "--rm", "--network", "host", "--read-only", "--entrypoint", "python", image("checker"),
                 "-c", "import psycopg; print(psycopg.pq.__impl__, psycopg.pq.version())").stdout.split()
    assert out[0] == "binary" and int(out[1]) > 0, out


# ---------------------------------------------------------------------------- running them
class Containers:
    """Containers started on the host network, each with a ready-file folder of its own;
    removed at the end whatever happened."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.run_id = uuid.uuid4().hex[:8]
        self.names: list[str] = []

    def start(self, component: str, name: str, env: dict[str, str], volumes: dict[str, str] | None = None,
              tmpfs: tuple[str, ...] = ("/tmp",)) -> dict[str, Any]:
        ready = self.workdir / f"{name}-ready"
        ready.mkdir(exist_ok=True)
        os.chown(ready, UID, UID)
        for f in ready.iterdir():
            f.unlink()
        cname = f"txmq-it-{self.run_id}-{name}"
        args = ["run", "-d", "--name", cname, "--network", "host", "--read-only",
                "-v", f"{ready}:/run/ready"]
        for host, inside in (volumes or {}).items():
            args += ["-v", f"{host}:{inside}"]
        for path in tmpfs:
            args += ["--tmpfs", f"{path}:uid={UID},gid={UID}"]
        full_env = {"TXMQ_HOST": "127.0.0.1", "TXMQ_PORT": "0", "TXMQ_METRICS_PORT": "0",
                    "TXMQ_READY_FILE": "/run/ready/ready.json", "TXMQ_SHUTDOWN_GRACE_SECONDS": "1.0", **env}
        for k, v in full_env.items():
            args += ["-e", f"{k}={v}"]
        if cname not in self.names:
            self.names.append(cname)
        docker(*args, image(component))
        return self.wait_ready(name)

    def wait_ready(self, name: str) -> dict[str, Any]:
        path = self.workdir / f"{name}-ready" / "ready.json"
        cname = f"txmq-it-{self.run_id}-{name}"

        def ready() -> dict[str, Any] | None:
            state = json.loads(docker("inspect", cname).stdout)[0]["State"]
            assert state["Running"] or state["ExitCode"] == 0, f"{name} exited {state['ExitCode']}:\n{self.logs(name)}"
            try:
                return json.loads(path.read_text())
            except (FileNotFoundError, ValueError):
                return None
        return wait_until(ready, timeout=60, interval=0.05, message=lambda: f"{name} not ready:\n{self.logs(name)}")

    def logs(self, name: str) -> str:
        out = docker("logs", "--tail", "40", f"txmq-it-{self.run_id}-{name}", check=False)
        return out.stdout + out.stderr

    def restart(self, name: str) -> dict[str, Any]:
        (self.workdir / f"{name}-ready" / "ready.json").unlink(missing_ok=True)
        docker("restart", "-t", "10", f"txmq-it-{self.run_id}-{name}")
        return self.wait_ready(name)

    def remove_all(self) -> None:
        for cname in reversed(self.names):
            docker("rm", "-f", "-v", cname, check=False)


@pytest.fixture
def containers(tmp_path: Path, inspected) -> Iterator[Containers]:
    c = Containers(tmp_path)
    try:
        yield c
    finally:
        c.remove_all()


class Undecided(txmq.TransactionListener):
    """Leaves the transaction UNKNOWN, then answers the checker's check with COMMIT."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
        return LocalState.UNKNOWN

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        self.checked.append(message.transaction_id)
        return LocalState.COMMIT


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status
        except grpc.RpcError:
            return False
    return status == health_pb2.HealthCheckResponse.SERVING


def _consume(nameserver: str, topic: str, group: str, want: set[str]) -> set[str]:
    got: set[str] = set()
    with txmq.SimpleConsumer(nameserver, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as consumer:
        def arrived() -> bool:
            for m in consumer.receive(max_messages=16, invisible_duration_seconds=30):
                got.add(m.message_id)
                consumer.ack(m)
            return want <= got
        wait_until(arrived, timeout=60, interval=0.01, message=lambda: f"got {got}, want {want}",
                   ignore=(txmq.UnavailableError, txmq.TopicNotFoundError))
    return got


def test_containers_carry_a_transaction_and_the_broker_keeps_it_across_a_restart(containers: Containers,
                                                                                 tmp_path: Path):
    ns = containers.start("nameserver", "ns", {"TXMQ_AUTO_CREATE_TOPICS": "true",
                                               "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.5"})
    nameserver = f"127.0.0.1:{ns['port']}"
    store = tmp_path / "broker-volume"
    store.mkdir()
    os.chown(store, UID, UID)
    broker_env = {"TXMQ_BROKER_NAME": "broker-0", "TXMQ_DATA_DIR": "/var/lib/txmq/store",
                  "TXMQ_NAMESERVER_ADDRESSES": nameserver, "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.5",
                  "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.5", "TXMQ_CHECK_INTERVAL_SECONDS": "0.5"}
    broker = containers.start("broker", "broker", broker_env, volumes={str(store): "/var/lib/txmq"})
    checker = containers.start("checker", "checker", {"TXMQ_NAMESERVER_ADDRESSES": nameserver,
                                                      "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.5"})
    proxy = containers.start("proxy", "proxy", {"TXMQ_NAMESERVER_ADDRESSES": nameserver},
                             tmpfs=("/tmp", "/home/txmq"))
    for info in (ns, broker, checker, proxy):
        assert _serving(f"127.0.0.1:{info['port']}")

    topic, group = f"orders-{containers.run_id}", f"pg-{containers.run_id}"
    listener = Undecided()
    with txmq.TransactionProducer(nameserver, producer_group=group, listener=listener) as producer:
        result = wait_until(lambda: producer.send_in_transaction(txmq.Message(topic, b"through the images")),
                            timeout=30, ignore=(txmq.UnavailableError, txmq.NoBrokerError))
        # Left UNKNOWN by the producer: the checker container asks it and commits.
        consumed = _consume(nameserver, topic, f"cg1-{containers.run_id}", {result.message_id})
    assert result.transaction_id in listener.checked
    assert consumed == {result.message_id}

    containers.restart("broker")
    assert _consume(nameserver, topic, f"cg2-{containers.run_id}", {result.message_id}) == {result.message_id}
    assert any(p.is_file() for p in (store / "store").iterdir())  # the store is on the volume
