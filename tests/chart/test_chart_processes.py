"""Layer 4: the chart starts what it claims. Render a scenario, take every container's
command and environment exactly as rendered (ConfigMap `envFrom`, then `env` with the
downward API and `$(VAR)` expansion as the kubelet does), and start one local process per
pod that the workloads would create.

The only rewrites, each what Kubernetes would provide:
- every pod gets its own loopback address (127.a.b.N, a random /16 per run), standing for
  its pod IP: `status.podIP` resolves to it, `TXMQ_HOST=0.0.0.0` binds it, and the DNS
  names of Services and of pods behind headless Services resolve to it. Ports stay as
  rendered, so the ports the chart declares are the ports that must answer;
- `metadata.name` is the pod name the workload would give (`<statefulset>-<ordinal>`,
  `<deployment>-local<N>`);
- paths (the broker's data directory, the proxy's HOME, the TLS Secret's mount) move under
  a temporary directory, and `python` is this virtualenv's interpreter;
- with TLS on (the chart's default), each component's Secret holds a certificate made here
  by a test CA for every pod IP (what cert-manager would issue for the pods' DNS names),
  and the test's own calls present a client certificate from that CA.

Then it waits for the probes the chart declares (native gRPC: grpc.health.v1 Check on the
declared port and service), runs a transaction end to end with the txmq SDK (undecided,
committed by a check through a checker at its advertised pod IP, consumed through a broker
at its advertised pod DNS name), asks the proxy Service what RocketMQ 5 clients ask first
(QueryRoute for that topic: the proxy reaches the name servers the chart gave it) and stops
every pod with SIGTERM, as the kubelet does,
expecting a clean exit within terminationGracePeriodSeconds.

A replicated render (broker.replicationFactor 3, the bundled etcd) boots the same way: the
etcd StatefulSet's pods run Debian's etcd (`make etcd`) with the rendered environment (the
static initial cluster of pod DNS names, listening on each pod's address), the broker
replicas take their replica id from the pod index label and register their own pod DNS
names; a leader must be elected, carry a transaction, and be replaced when it dies.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import txmq
from services.common.process import port_is_free
from tests.support.certs import CertificateAuthority, channel_credentials
from tests.support.etcd import EtcdProcess
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, admin_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc

from .chart import NAMESPACE, REPO, WORKLOAD_KINDS, Rendered, render, scenario_file

#: Every rendered pod booted as a process (replicated shards, etcd): the heavy lane
#: (tests/support/lanes.py).
pytestmark = pytest.mark.heavy

LocalState = txmq.LocalTransactionState
#: Settings naming a file of the TLS Secret (the services' and the bundled etcd's).
_TLS_FILES = {"TXMQ_TLS_CERT_FILE", "TXMQ_TLS_KEY_FILE", "TXMQ_TLS_CA_FILE",
              *(p + f for p in ("ETCD_", "ETCD_PEER_") for f in ("CERT_FILE", "KEY_FILE", "TRUSTED_CA_FILE"))}
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class Pod:
    name: str
    component: str
    ip: str
    workload: dict[str, Any]
    container: dict[str, Any]
    #: The StatefulSet pod index (apps.kubernetes.io/pod-index), None for a Deployment's pod.
    index: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def log_tail(self, n: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


class LocalPods:
    """The pods of one rendered release as local processes."""

    def __init__(self, r: Rendered, workdir: Path, external: dict[str, str] | None = None) -> None:
        self.r = r
        self.workdir = workdir
        #: host:port of services outside the release (an existing etcd) -> where they run here.
        self.external = dict(external or {})
        prefix = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        self.pods: list[Pod] = []
        self.dns: dict[str, str] = {}
        n = 1
        for w in [d for d in r.docs if d["kind"] in WORKLOAD_KINDS]:  # the bundled etcd too
            component = w["metadata"]["labels"]["app.kubernetes.io/component"]
            (container,) = w["spec"]["template"]["spec"]["containers"]
            for i in range(w["spec"]["replicas"]):
                stateful = w["kind"] == "StatefulSet"
                suffix = str(i) if stateful else f"local{i}"
                pod = Pod(f"{w['metadata']['name']}-{suffix}", component, f"{prefix}.{n}", w, container,
                          i if stateful else None)
                n += 1
                self.pods.append(pod)
                if w["kind"] == "StatefulSet":
                    self.dns[f"{pod.name}.{w['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"] = pod.ip
        for svc in r.of_kind("Service"):
            if svc["spec"].get("clusterIP") == "None":
                continue
            backends = [p for p in self.pods
                        if svc["spec"]["selector"].items() <= p.workload["spec"]["template"]["metadata"]["labels"].items()]
            self.dns[f"{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local"] = backends[0].ip
        #: TLS (a pod mounts a Secret named "tls"): the test CA, certificates by component.
        self.ca: CertificateAuthority | None = None
        self.certificates: dict[str, Any] = {}
        if any(v["name"] == "tls" and "secret" in v for p in self.pods for v in p.workload["spec"]["template"]["spec"].get("volumes", [])):
            self.ca = CertificateAuthority(workdir / "pki")
            sans = ("DNS:localhost", *(f"IP:{p.ip}" for p in self.pods))
            for component in {p.component for p in self.pods} | {"test-client"}:
                self.certificates[component] = self.ca.issue(component, sans=sans, directory=workdir / "pki" / component)
        for pod in self.pods:
            pod.env = self._environment(pod)

    # -------------------------------------------------------------- what the kubelet does
    def _field(self, pod: Pod, path: str) -> str:
        fields = {"metadata.name": pod.name, "status.podIP": pod.ip, "metadata.namespace": NAMESPACE}
        if pod.index is not None:  # the StatefulSet controller's label (Kubernetes 1.28+)
            fields["metadata.labels['apps.kubernetes.io/pod-index']"] = str(pod.index)
        return fields[path]

    def _environment(self, pod: Pod) -> dict[str, str]:
        env = dict(self.r.configmap_env(pod.workload, pod.container))
        for item in pod.container.get("env", []):
            if "value" in item:
                env[item["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
            else:
                env[item["name"]] = self._field(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
        return {k: self._rewrite(pod, k, v) for k, v in env.items()}

    def _rewrite(self, pod: Pod, name: str, value: str) -> str:
        if name == "TXMQ_HOST":
            assert value == "0.0.0.0"
            return pod.ip
        if name.startswith("ETCD_LISTEN_"):  # etcd binds every address of the pod: its pod IP
            assert re.fullmatch(r"https?://0\.0\.0\.0:\d+", value), f"{name}={value}"
            return value.replace("0.0.0.0", pod.ip)
        for endpoint, local in self.external.items():
            value = re.sub(rf"(?<![\w.-]){re.escape(endpoint)}(?![\w.-])", local, value)
        for host, ip in self.dns.items():
            value = re.sub(rf"(?<![\w.-]){re.escape(host)}(?=:)", ip, value)
        assert ".svc." not in value, f"{pod.name}: {name}={value} names a host no Service provides"
        if name in ("TXMQ_DATA_DIR", "ETCD_DATA_DIR"):
            mounts = {m["mountPath"] for m in pod.container["volumeMounts"]}
            assert any(value.startswith(m.rstrip("/") + "/") for m in mounts), f"{value} is on no volume"
            value = str(self.workdir / pod.name / value.lstrip("/"))
        if name in _TLS_FILES:  # the Secret's file, as the kubelet mounts it
            (volume,) = [v for v in pod.workload["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
            (mount,) = [m["mountPath"] for m in pod.container["volumeMounts"] if m["name"] == "tls"]
            assert value.startswith(mount.rstrip("/") + "/"), f"{name}={value} is not on the TLS Secret's mount"
            assert self.ca is not None and volume["secret"]["secretName"]
            key = value[len(mount.rstrip("/")) + 1:]
            cert = self.certificates[pod.component]
            source = {"tls.crt": cert.cert_file, "tls.key": cert.key_file, "ca.crt": self.ca.cert_file}[key]
            value = str(self.workdir / pod.name / value.lstrip("/"))
            Path(value).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, value)
        if name == "HOME":
            assert value in {m["mountPath"] for m in pod.container["volumeMounts"]}, f"HOME={value} is on no volume"
            value = str(self.workdir / pod.name / value.lstrip("/"))
            Path(value).mkdir(parents=True, exist_ok=True)  # the emptyDir, created with the pod
        return value

    # -------------------------------------------------------------- processes
    def start(self) -> None:
        for pod in self.pods:
            for port in pod.container["ports"]:
                if not port_is_free(port["containerPort"], pod.ip):
                    pytest.fail(f"{pod.ip}:{port['containerPort']} is taken: something listens on 0.0.0.0 there")
        # As Kubernetes does with podManagementPolicy Parallel: every pod at once.
        for pod in self.pods:
            command = list(pod.container["command"]) + list(pod.container.get("args", []))
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TXMQ_", "ETCD_"))}
            if pod.component == "etcd":
                # The official image's binary; here Debian's etcd-server (`make etcd`).
                assert command[0] == "/usr/local/bin/etcd", command
                binary = shutil.which("etcd")
                if binary is None:
                    pytest.fail("etcd is not installed: run `make etcd` (apt-get install etcd-server)")
                command[0] = binary
                env["ETCD_UNSUPPORTED_ARCH"] = os.uname().machine
            else:
                assert command[0] == "python"
                command[0] = sys.executable
            cwd = self.workdir / pod.name
            cwd.mkdir(parents=True, exist_ok=True)
            env.update(pod.env)
            env["PYTHONPATH"] = str(REPO)
            pod.log_path = cwd / "container.log"
            with open(pod.log_path, "wb") as log:
                pod.proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_probes(self) -> None:
        for pod in self.pods:
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = pod.container[kind]
                deadline = probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10)
                if "httpGet" in probe:
                    port = probe["httpGet"]["port"]
                    if isinstance(port, str):  # a named container port
                        port = next(p["containerPort"] for p in pod.container["ports"] if p["name"] == port)
                    target = f"http://{pod.ip}:{port}{probe['httpGet'].get('path', '/')}"
                else:
                    target = f"{pod.ip}:{probe['grpc']['port']}"

                def serving() -> bool:
                    if pod.proc is not None and pod.proc.poll() is not None:
                        raise AssertionError(f"{pod.name} exited with {pod.proc.returncode}\n{pod.log_tail()}")
                    if "httpGet" in probe:  # the kubelet's rule: a status in 200..399 passes
                        try:
                            with urllib.request.urlopen(target, timeout=probe.get("timeoutSeconds", 1)) as r:
                                return 200 <= r.status < 400
                        except OSError:
                            return False
                    with grpc.insecure_channel(target) as channel:
                        response = health_pb2_grpc.HealthStub(channel).Check(
                            health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                            timeout=probe.get("timeoutSeconds", 1))
                    return response.status == health_pb2.HealthCheckResponse.SERVING

                wait_until(serving, min(deadline, 60), interval=0.1, ignore=(grpc.RpcError,),
                           message=lambda: f"{pod.name} {kind} on {target} never passed\n{pod.log_tail()}")

    def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for pod in self.pods:
            if pod.proc is not None and pod.proc.poll() is None:
                pod.proc.send_signal(signal.SIGTERM)
        for pod in self.pods:
            if pod.proc is None:
                continue
            grace = pod.workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            try:
                codes[pod.name] = pod.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pod.proc.kill()
                pod.proc.wait()
                codes[pod.name] = None  # the kubelet would have killed it
        return codes

    def channel(self, target: str) -> grpc.Channel:
        """A channel as a client of the release: TLS with the test client's certificate
        when the chart turned TLS on, plaintext otherwise."""
        if self.ca is None:
            return grpc.insecure_channel(target)
        return grpc.secure_channel(target, channel_credentials(self.ca.cert_file, self.certificates["test-client"]))

    def client_tls(self) -> txmq.TLS | None:
        if self.ca is None:
            return None
        cert = self.certificates["test-client"]
        return txmq.TLS(ca_file=self.ca.cert_file, cert_file=cert.cert_file, key_file=cert.key_file)

    def of(self, component: str) -> list[Pod]:
        return [p for p in self.pods if p.component == component]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log_tail()}" for p in self.pods)


SCENARIOS = {"minimal": lambda: [scenario_file("minimal")], "defaults": lambda: [],
             "plaintext": lambda: [scenario_file("plaintext")]}


@pytest.fixture(params=list(SCENARIOS))
def pods(request: pytest.FixtureRequest, helm_bin: Path, tmp_path: Path) -> Iterator[LocalPods]:
    r = render(helm_bin, SCENARIOS[request.param]())
    local = LocalPods(r, tmp_path)
    try:
        local.start()
        yield local
    finally:
        codes = local.stop()
        local.exit_codes = codes  # type: ignore[attr-defined]


def _service_address(pods: LocalPods, component: str) -> str:
    """host:port of a component's client Service (not the headless one), as pods resolve it."""
    (svc,) = [s for s in pods.r.of_kind("Service") if s["spec"].get("clusterIP") != "None"
              and s["spec"]["selector"].get("app.kubernetes.io/component") == component]
    return f"{pods.dns[svc['metadata']['name'] + '.' + NAMESPACE + '.svc.cluster.local']}:{svc['spec']['ports'][0]['port']}"


def _checked_transaction(pods: LocalPods, nameserver: str, topic: str, unique_name: Any,
                         body: bytes = b"through the chart") -> None:
    """A transaction left undecided, committed by a check through the checkers, consumed."""
    checkers = pods.of("checker")
    group, consumers = unique_name("producers"), unique_name("consumers")
    checked = threading.Event()

    class Listener(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            return LocalState.UNKNOWN  # leave it to a check

        def check_local_transaction(self, message):
            checked.set()
            return LocalState.COMMIT

    # The chart's transaction timeout is 6 s by default: the check comes through the checker.
    with txmq.TransactionProducer(nameserver, producer_group=group, listener=Listener(),
                                  checker_refresh_seconds=0.5, tls=pods.client_tls()) as producer:
        wait_until(lambda: len(producer.connected_checkers()) == len(checkers), 20,
                   message=lambda: f"producer not connected to every checker\n{pods.logs()}")
        result = producer.send_in_transaction(txmq.Message(topic, body))
        assert result.state == txmq.TransactionState.PREPARED
        received: list[bytes] = []
        with txmq.SimpleConsumer(nameserver, consumer_group=consumers, subscriptions={topic: "*"},
                                 await_duration_seconds=0.5, tls=pods.client_tls()) as consumer:
            def consumed() -> bool:
                for m in consumer.receive(16):
                    received.append(m.body)
                    consumer.ack(m)
                return bool(received)

            wait_until(consumed, 40, interval=0.05,
                       message=lambda: f"the checked transaction was never delivered\n{pods.logs()}")
    assert checked.is_set()
    assert received == [body]


def test_rendered_pods_start_pass_their_probes_and_run_a_transaction(pods: LocalPods, unique_name) -> None:
    pods.wait_probes()
    nameserver = _service_address(pods, "nameserver")
    brokers, checkers, nameservers = pods.of("broker"), pods.of("checker"), pods.of("nameserver")
    assert pods.of("proxy"), "the chart runs the RocketMQ proxy by default"

    # Every broker and checker registered with every name server, at its advertised address.
    def registered() -> bool:
        for ns in nameservers:
            with pods.channel(f"{ns.ip}:{ns.env['TXMQ_PORT']}") as channel:
                stub = nameserver_pb2_grpc.NameServerServiceStub(channel)
                listed = {b.name: b.address for b in stub.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=5).brokers}
                checkers_listed = stub.ListCheckers(nameserver_pb2.ListCheckersRequest(), timeout=5).checkers
            if listed != {b.name: f"{b.ip}:{b.env['TXMQ_PORT']}" for b in brokers}:
                return False
            if len(checkers_listed) != len(checkers):
                return False
        return True

    wait_until(registered, 30, interval=0.1, ignore=(grpc.RpcError,),
               message=lambda: f"not every broker/checker registered with every name server\n{pods.logs()}")

    if pods.ca is not None:  # TLS on (the default): a plaintext client is refused on every gRPC port
        for pod in [*nameservers, *brokers, *checkers]:
            with grpc.insecure_channel(f"{pod.ip}:{pod.env['TXMQ_PORT']}") as channel:
                with pytest.raises(grpc.RpcError) as info:
                    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, pod.name

    topic = unique_name("orders")
    with pods.channel(nameserver) as channel:
        admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(
            admin_pb2.CreateTopicRequest(topic=topic, queue_count=2 * len(brokers)), timeout=10)
    _checked_transaction(pods, nameserver, topic, unique_name)


    # The proxy Service, as a RocketMQ 5 client uses it (its configured endpoint): every
    # replica serves MessagingService, and a route query reaches the name servers the chart
    # configured. Sending through the proxy is tests/proxy's job.
    from services.proxy.protocol import SERVICE_NAME, Code, definition_pb2, service_pb2, service_pb2_grpc  # noqa: PLC0415

    for proxy in pods.of("proxy"):
        with pods.channel(f"{proxy.ip}:{proxy.env['TXMQ_PORT']}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING, proxy.name
    endpoint = _service_address(pods, "proxy")
    host, _, port = endpoint.rpartition(":")
    with pods.channel(endpoint) as channel:
        route = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(service_pb2.QueryRouteRequest(
            topic=definition_pb2.Resource(name=topic),
            endpoints=definition_pb2.Endpoints(scheme=definition_pb2.IPv4, addresses=[
                definition_pb2.Address(host=host, port=int(port))])), timeout=10)
    assert route.status.code == Code.OK, route.status
    assert len(route.message_queues) == 2 * len(brokers)
    assert {q.broker.name for q in route.message_queues} == {b.name for b in brokers}
    # Routes send the client back to the address it dialled: the Service.
    assert {(a.host, a.port) for q in route.message_queues for a in q.broker.endpoints.addresses} == \
        {(host, int(port))}

    codes = pods.stop()
    assert all(code == 0 for code in codes.values()), f"unclean exits {codes}\n{pods.logs()}"


# ---------------------------------------------------------------------------- replicated shards
#: A replicated scenario down to one shard and one pod of the rest, volumes as emptyDirs:
#: ci/replicated-values.yaml (3 replicas, min in-sync 2, the bundled 3-member etcd, leader
#: lease 5 s), and ci/replicated-external-etcd-values.yaml (3 replicas, etcd.endpoints:
#: here one Debian etcd process, tests/support/etcd.py, stands for that existing cluster).
REPLICATED_LOCAL = {"nameserver.replicaCount": "1", "broker.replicaCount": "1", "checker.replicaCount": "1",
                    "proxy.enabled": "false", "broker.persistence.enabled": "false",
                    "etcd.persistence.enabled": "false"}


@pytest.fixture(params=["replicated", "replicated-external-etcd"])
def replicated_pods(request: pytest.FixtureRequest, helm_bin: Path, tmp_path: Path) -> Iterator[LocalPods]:
    r = render(helm_bin, [scenario_file(request.param)], sets=REPLICATED_LOCAL)
    etcd = None
    external: dict[str, str] = {}
    if not any(w["metadata"]["labels"]["app.kubernetes.io/component"] == "etcd"
               for w in r.docs if w["kind"] in WORKLOAD_KINDS):
        etcd = EtcdProcess(tmp_path / "existing-etcd").start()
        rendered = r.configmap_env(r.workload("broker"), r.workload("broker")["spec"]["template"]["spec"]["containers"][0])
        external = {endpoint: etcd.endpoint for endpoint in rendered["TXMQ_ETCD_ENDPOINTS"].split(",")}
    local = LocalPods(r, tmp_path, external)
    try:
        local.start()
        yield local
    finally:
        local.stop()
        if etcd is not None:
            etcd.stop()


def test_a_rendered_replicated_shard_elects_a_leader_carries_transactions_and_fails_over(
        replicated_pods: LocalPods, unique_name) -> None:
    pods = replicated_pods
    replicas, etcd, (ns,) = pods.of("broker"), pods.of("etcd"), pods.of("nameserver")
    assert len(replicas) == 3 and len(etcd) in (0, 3)
    pods.wait_probes()  # etcd's /health passes once its three members formed a cluster
    shard = replicas[0].env["TXMQ_BROKER_NAME"]
    assert shard == "txmq-broker-0" and {p.env["TXMQ_BROKER_NAME"] for p in replicas} == {shard}
    assert [p.env["TXMQ_REPLICA_ID"] for p in replicas] == ["0", "1", "2"]  # from the pod index
    # Each replica advertises its own pod (DNS name, resolved to its pod IP here).
    by_address = {p.env["TXMQ_ADVERTISE_ADDRESS"]: p for p in replicas}
    assert set(by_address) == {f"{p.ip}:{p.env['TXMQ_PORT']}" for p in replicas}
    endpoints = replicas[0].env["TXMQ_ETCD_ENDPOINTS"].split(",")
    if etcd:  # every member of the bundled etcd, as each advertises itself
        assert sorted(endpoints) == sorted(p.env["ETCD_ADVERTISE_CLIENT_URLS"].removeprefix("http://") for p in etcd)
    else:  # etcd.endpoints, all of them
        assert len(endpoints) == 3 and set(endpoints) == set(pods.external.values())
    nameserver = f"{ns.ip}:{ns.env['TXMQ_PORT']}"
    min_insync = int(replicas[0].env["TXMQ_MIN_INSYNC_REPLICAS"])
    lag_max = float(replicas[0].env["TXMQ_REPLICA_LAG_MAX_SECONDS"])

    def routed_leader(above_epoch: int = 0) -> tuple[Pod, int] | None:
        """The live replica the name server routes the shard to, as leader of an in-sync
        set that can acknowledge writes (None while there is none)."""
        with pods.channel(nameserver) as channel:
            stub = nameserver_pb2_grpc.NameServerServiceStub(channel)
            routed = {b.name: b for b in stub.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=5).brokers}
            every = stub.ListBrokers(nameserver_pb2.ListBrokersRequest(include_followers=True), timeout=5).brokers
        for b in every:  # every replica registered under the shard, with the id of its pod
            assert b.name == shard and by_address[b.address].env["TXMQ_REPLICA_ID"] == str(b.replica_id), b
        info = routed.get(shard)
        if info is None or info.role != nameserver_pb2.BROKER_ROLE_LEADER or info.leader_epoch <= above_epoch:
            return None
        pod = by_address[info.address]
        if pod.proc is None or pod.proc.poll() is not None:
            return None
        # Able to acknowledge: itself and enough connected, caught-up in-sync followers.
        able = 1 + sum(1 for f in info.replication.followers if f.connected and f.in_sync and f.lag_seconds < lag_max)
        return (pod, info.leader_epoch) if able >= min_insync else None

    def registered_all() -> bool:
        with pods.channel(nameserver) as channel:
            listed = nameserver_pb2_grpc.NameServerServiceStub(channel).ListBrokers(
                nameserver_pb2.ListBrokersRequest(include_followers=True), timeout=5).brokers
        return sorted(b.replica_id for b in listed) == [0, 1, 2]

    wait_until(registered_all, 30, interval=0.1, ignore=(grpc.RpcError,),
               message=lambda: f"not every replica registered\n{pods.logs()}")
    found = wait_until(routed_leader, 30, interval=0.1, ignore=(grpc.RpcError,),
                       message=lambda: f"no leader elected\n{pods.logs()}")
    leader, epoch = found

    topic = unique_name("orders")
    with pods.channel(nameserver) as channel:
        admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(
            admin_pb2.CreateTopicRequest(topic=topic, queue_count=2), timeout=10)
    _checked_transaction(pods, nameserver, topic, unique_name, b"replicated")

    # The leader's node dies: an in-sync follower takes over with a higher epoch (after
    # the leader's lease, leader_lease_seconds) and serves writes with the other follower.
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait()
    successor, new_epoch = wait_until(lambda: routed_leader(epoch), 60, interval=0.1, ignore=(grpc.RpcError,),
                                      message=lambda: f"no leader after {leader.name} died\n{pods.logs()}")
    assert successor is not leader and new_epoch > epoch
    topic = unique_name("after-failover")
    with pods.channel(nameserver) as channel:
        admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(
            admin_pb2.CreateTopicRequest(topic=topic, queue_count=2), timeout=10)
    _checked_transaction(pods, nameserver, topic, unique_name, b"after fail-over")

    codes = pods.stop()
    codes.pop(leader.name)  # killed on purpose
    # etcd stops gracefully on SIGTERM and then re-raises it: it exits "killed by SIGTERM".
    clean = {p.name: (0, -signal.SIGTERM) if p.component == "etcd" else (0,) for p in pods.pods}
    unclean = {name: code for name, code in codes.items() if code not in clean[name]}
    assert not unclean, f"unclean exits {unclean}\n{pods.logs()}"
