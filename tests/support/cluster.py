"""A local txmq cluster of real processes on ephemeral ports: name server(s), broker(s)
and optionally a checker, started in dependency order and torn down in reverse."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import grpc

from txmq.auth import with_token
from txmq.v1 import admin_pb2, admin_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc

from . import netns as _netns
from .certs import Certificate, CertificateAuthority, channel_credentials
from .etcd import EtcdAuth, EtcdProcess, TlsFiles, password_auth
from .processes import ServiceProcess
from .waiting import wait_until

#: Settings every test name server gets unless the test overrides them.
NAMESERVER_DEFAULTS = {
    "TXMQ_AUTO_CREATE_TOPICS": "true",
    "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "TXMQ_SHUTDOWN_GRACE_SECONDS": "1.0",
}
#: Settings every test broker gets unless the test overrides them (a broker pre-sizes its
#: write-ahead log at each start: 64 MiB by default, a write that adds up over a run).
BROKER_DEFAULTS = {
    "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "TXMQ_SHUTDOWN_GRACE_SECONDS": "1.0",
    "TXMQ_WAL_PREFILL_BYTES": str(1024 * 1024),
}
#: Settings of every replica of a replicated test shard (sub-second failover).
REPLICA_DEFAULTS = {
    "TXMQ_LEADER_LEASE_SECONDS": "1",
    "TXMQ_ELECTION_POLL_SECONDS": "0.05",
    "TXMQ_REPLICA_LAG_MAX_SECONDS": "1.0",
    "TXMQ_WAL_PREFILL_BYTES": "0",
    "TXMQ_REPLICATION_PORT": "0",
}
CHECKER_DEFAULTS = {
    "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "TXMQ_SHUTDOWN_GRACE_SECONDS": "1.0",
}
#: Settings every test proxy gets unless the test overrides them (broker limits it must
#: advertise are copied from the brokers' settings, see ``Cluster.start_proxy``).
PROXY_DEFAULTS = {
    "TXMQ_SHUTDOWN_GRACE_SECONDS": "1.0",
    "TXMQ_DIRECTORY_REFRESH_SECONDS": "0.5",
    "TXMQ_ROUTE_TTL_SECONDS": "1.0",
}
#: Broker settings a proxy must mirror (it advertises them to RocketMQ clients).
_PROXY_MIRRORS_BROKER = ("TXMQ_MAX_DELIVERY_ATTEMPTS", "TXMQ_MAX_BODY_BYTES")
RPC_TIMEOUT_SECONDS = 5.0

_CLUSTERS: set["Cluster"] = set()
_CLUSTERS_LOCK = threading.Lock()


def live_clusters() -> list["Cluster"]:
    """Clusters started and not yet stopped (for failure reports and last-resort cleanup)."""
    with _CLUSTERS_LOCK:
        return list(_CLUSTERS)


class Cluster:
    """``nameservers`` name servers, then ``brokers`` brokers (``broker-0``..) registered
    with every name server, then a checker when ``checker=True``.

    The constructor returns once every broker is listed by every name server. On any
    start-up failure the processes already started are stopped and the error (with the
    failing service's log tail) propagates.
    """

    def __init__(self, workdir: str | Path, brokers: int = 1, nameservers: int = 1,
                 broker_env: Mapping[str, str] | None = None,
                 nameserver_env: Mapping[str, str] | None = None,
                 checker: bool = False, checker_env: Mapping[str, str] | None = None,
                 ready_timeout: float = 30.0, proxies: int = 0,
                 proxy_env: Mapping[str, str] | None = None, replication_factor: int = 1,
                 min_insync_replicas: int = 2, netns: bool = False,
                 tls: CertificateAuthority | None = None, token: str | None = None) -> None:
        if nameservers < 1:
            raise ValueError("a cluster needs at least one name server")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ready_timeout = ready_timeout
        self.nameservers: list[ServiceProcess] = []
        self.brokers: list[ServiceProcess] = []
        self.checkers: list[ServiceProcess] = []
        #: RocketMQ 5 compatibility proxies (``proxies=N``), started after the checker.
        self.proxies: list[ServiceProcess] = []
        self._broker_env = dict(broker_env or {})
        self._channels: dict[str, grpc.Channel] = {}
        #: The bearer token of the cluster's own helper calls (a cluster with auth on).
        self.token = token
        self._stopped = False
        self.replication_factor = replication_factor
        self.min_insync_replicas = min_insync_replicas
        #: Replicated shards: etcd, and each shard's replicas by shard name.
        self.etcd: EtcdProcess | None = None
        #: The brokers' etcd credentials (password mode: a cluster without TLS).
        self.etcd_broker_env: dict[str, str] = {}
        self.shards: dict[str, list[ServiceProcess]] = {}
        #: ``netns=True``: every broker replica in a network namespace of its own on one
        #: bridge; etcd, name servers, checkers and proxies listen on the bridge address in
        #: this namespace (see tests/support/netns.py; ``netns.isolated(proc)`` partitions).
        self.network: _netns.Network | None = None
        #: ``tls=ca``: every service (and etcd) gets a certificate of its own from ``ca`` and
        #: requires one from its clients (mutual TLS); the helpers below present "test-admin".
        self.ca = tls
        self.certificates: dict[str, Certificate] = {}
        self.client_certificate = tls.issue("test-admin", directory=self.workdir / "tls") if tls else None
        with _CLUSTERS_LOCK:
            _CLUSTERS.add(self)
        try:
            if netns:
                self.network = _netns.Network()
            for i in range(nameservers):
                name = "nameserver" if nameservers == 1 else f"nameserver-{i}"
                proc = ServiceProcess("services.nameserver", {**NAMESERVER_DEFAULTS, **self._tls_env(name),
                                                              **(nameserver_env or {}), **self._outer_host()},
                                      self.workdir, name)
                self.nameservers.append(proc)
                proc.start()
            for proc in self.nameservers:
                proc.wait_ready(ready_timeout)
            if replication_factor > 1:
                # etcd's own authentication on, txmq's keys for the brokers only (see
                # services/common/etcd.py): their certificates' names with TLS, else a password.
                etcd_tls: dict[str, Any] = {}
                replica_names = tuple(f"broker-{i}-r{r}" for i in range(brokers) for r in range(replication_factor))
                if tls is not None:
                    cert = self.certificates["etcd"] = tls.issue("etcd", directory=self.workdir / "tls")
                    admin = self.certificates["etcd-admin"] = tls.issue("etcd-admin", directory=self.workdir / "tls")
                    etcd_tls = {"cert_file": cert.cert_file, "key_file": cert.key_file, "ca_file": tls.cert_file,
                                "auth": EtcdAuth(replica_names, admin_user="etcd-admin"),
                                "admin_tls": TlsFiles(tls.cert_file, admin.cert_file, admin.key_file)}
                else:
                    etcd_tls = {"auth": password_auth(self.workdir / "etcd-auth")}
                    self.etcd_broker_env = {"TXMQ_ETCD_USER": etcd_tls["auth"].broker_users[0],
                                            "TXMQ_ETCD_PASSWORD_FILE": str(self.workdir / "etcd-auth" /
                                                                           "etcd-broker.password")}
                self.etcd = EtcdProcess(self.workdir, host=self.network.gateway if self.network else "127.0.0.1",
                                        **etcd_tls)
                self.etcd.start(ready_timeout)
            for i in range(brokers):
                shard = f"broker-{i}"
                for r in range(replication_factor):
                    name = shard if replication_factor == 1 else f"{shard}-r{r}"
                    env = {**BROKER_DEFAULTS, **self._tls_env(name),
                           "TXMQ_BROKER_NAME": shard,
                           "TXMQ_DATA_DIR": str(self.workdir / name)}
                    if replication_factor > 1:
                        assert self.etcd is not None
                        env.update({**REPLICA_DEFAULTS, "TXMQ_REPLICATION_FACTOR": str(replication_factor),
                                    "TXMQ_REPLICA_ID": str(r), "TXMQ_MIN_INSYNC_REPLICAS": str(min_insync_replicas),
                                    "TXMQ_ETCD_ENDPOINTS": self.etcd.endpoint, **self.etcd_broker_env})
                    env.update({**(broker_env or {}), "TXMQ_NAMESERVER_ADDRESSES": ",".join(self.nameserver_addresses)})
                    host = self.network.add_host() if self.network else None
                    if host is not None:
                        env["TXMQ_HOST"] = host.address
                    proc = ServiceProcess("services.broker", env, self.workdir, name,
                                          command_prefix=host.exec_prefix if host else ())
                    if host is not None:
                        _netns.attach(proc, host)
                    self.brokers.append(proc)
                    self.shards.setdefault(shard, []).append(proc)
                    proc.start()
            for proc in self.brokers:
                proc.wait_ready(ready_timeout)
            self.wait_brokers_registered()
            if checker:
                self.start_checker(checker_env)
            for _ in range(proxies):
                self.start_proxy(proxy_env)
        except BaseException:
            self.stop()
            raise

    def __repr__(self) -> str:
        return (f"<Cluster {self.workdir} nameservers={[p.address for p in self.nameservers if p.running]} "
                f"brokers={[p.name for p in self.brokers]}>")

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _tls_env(self, name: str) -> dict[str, str]:
        """A certificate for service ``name`` and the settings that make it serve (and dial)
        with mutual TLS; nothing without ``tls``."""
        if self.ca is None:
            return {}
        cert = self.certificates[name] = self.ca.issue(name, directory=self.workdir / "tls")
        return {"TXMQ_TLS_CERT_FILE": cert.cert_file, "TXMQ_TLS_KEY_FILE": cert.key_file,
                "TXMQ_TLS_CA_FILE": self.ca.cert_file, "TXMQ_TLS_CLIENT_AUTH": "require"}

    def client_tls(self) -> Any:
        """The SDK's ``txmq.TLS`` for a client of this cluster (None without TLS)."""
        import txmq
        if self.ca is None or self.client_certificate is None:
            return None
        return txmq.TLS(ca_file=self.ca.cert_file, cert_file=self.client_certificate.cert_file,
                        key_file=self.client_certificate.key_file)

    # ------------------------------------------------------------------ addresses
    def _outer_host(self) -> dict[str, str]:
        """Where services outside the replicas' namespaces listen: the bridge address, so
        replicas in their namespaces reach them (nothing to set without netns)."""
        return {"TXMQ_HOST": self.network.gateway} if self.network else {}

    @property
    def nameserver_address(self) -> str:
        return self.nameservers[0].address

    @property
    def nameserver_addresses(self) -> list[str]:
        return [p.address for p in self.nameservers]

    @property
    def processes(self) -> list[ServiceProcess]:
        return [*self.nameservers, *self.brokers, *self.checkers, *self.proxies]

    def broker(self, i: int) -> ServiceProcess:
        return self.brokers[i]

    # ------------------------------------------------------------------ gRPC helpers
    def channel(self, address: str | None = None) -> grpc.Channel:
        """A cached synchronous channel (default: the first name server)."""
        address = address or self.nameserver_address
        channel = self._channels.get(address)
        if channel is None:
            if self.ca is None or self.client_certificate is None:
                channel = grpc.insecure_channel(address)
            else:
                channel = grpc.secure_channel(address, channel_credentials(self.ca.cert_file, self.client_certificate))
            self._channels[address] = channel = with_token(channel, self.token)
        return channel

    def nameserver_stub(self, address: str | None = None) -> nameserver_pb2_grpc.NameServerServiceStub:
        return nameserver_pb2_grpc.NameServerServiceStub(self.channel(address))

    def admin_stub(self, address: str | None = None) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(self.channel(address))

    def list_brokers(self, nameserver: str | None = None) -> list[nameserver_pb2.BrokerInfo]:
        response = self.nameserver_stub(nameserver).ListBrokers(
            nameserver_pb2.ListBrokersRequest(), timeout=RPC_TIMEOUT_SECONDS)
        return list(response.brokers)

    def query_route(self, topic: str, nameserver: str | None = None) -> list[nameserver_pb2.QueueRoute]:
        response = self.nameserver_stub(nameserver).QueryRoute(
            nameserver_pb2.QueryRouteRequest(topic=topic), timeout=RPC_TIMEOUT_SECONDS)
        return list(response.queues)

    # ------------------------------------------------------------------ waiting
    def wait_brokers_registered(self, timeout: float | None = None,
                                brokers: list[ServiceProcess] | None = None,
                                heartbeat_after_ms: int = 0) -> None:
        """Until every name server lists each of ``brokers`` (default all) at its current
        address, with a heartbeat at or after ``heartbeat_after_ms`` (name server wall clock)."""
        expected = brokers if brokers is not None else self.brokers

        if self.replication_factor > 1:
            self.wait_leaders(timeout)
            return

        def registered() -> bool:
            for ns in self.nameserver_addresses:
                listed = {b.name: b for b in self.list_brokers(ns)}
                for proc in expected:
                    info = listed.get(proc.name)
                    if info is None or info.address != proc.address:
                        return False
                    if heartbeat_after_ms and info.last_heartbeat_ms < heartbeat_after_ms:
                        return False
            return True

        wait_until(registered, timeout or self.ready_timeout, interval=0.05,
                   message=lambda: f"brokers {[p.name for p in expected]} not registered with "
                                   f"every name server {self.nameserver_addresses}\n{self._describe()}",
                   ignore=(grpc.RpcError,))

    def list_replicas(self, nameserver: str | None = None) -> list[nameserver_pb2.BrokerInfo]:
        response = self.nameserver_stub(nameserver).ListBrokers(
            nameserver_pb2.ListBrokersRequest(include_followers=True), timeout=RPC_TIMEOUT_SECONDS)
        return list(response.brokers)

    def leader(self, shard: str = "broker-0") -> ServiceProcess | None:
        """The replica of ``shard`` every name server routes to while its in-sync set can
        acknowledge writes (None while there is none)."""
        found = None
        for ns in self.nameserver_addresses:
            listed = {b.name: b for b in self.list_brokers(ns)}
            info = listed.get(shard)
            if info is None or len(info.replication.in_sync_replicas) < self.min_insync_replicas:
                return None
            match = [p for p in self.shards[shard] if p.running and p.address == info.address]
            if not match or (found is not None and match[0] is not found):
                return None
            found = match[0]
        return found

    def wait_leaders(self, timeout: float | None = None, shards: list[str] | None = None,
                     not_on: ServiceProcess | None = None) -> dict[str, ServiceProcess]:
        """Until every shard has a leader routed by every name server (not ``not_on``)."""
        names = shards or list(self.shards)
        out: dict[str, ServiceProcess] = {}

        def led() -> bool:
            for shard in names:
                proc = self.leader(shard)
                if proc is None or proc is not_on:
                    return False
                out[shard] = proc
            return True
        wait_until(led, timeout or self.ready_timeout, interval=0.05,
                   message=lambda: f"shards {names} have no leader routed\n{self._describe()}",
                   ignore=(grpc.RpcError,))
        return out

    def _describe(self) -> str:
        return "\n".join(f"  {p!r}" for p in self.processes)

    # ------------------------------------------------------------------ topics
    def create_topic(self, topic: str, queue_count: int = 4, timeout: float = 15.0) -> admin_pb2.CreateTopicResponse:
        """Admin.CreateTopic, then waits until every name server routes all its queues."""
        response = self.admin_stub().CreateTopic(
            admin_pb2.CreateTopicRequest(topic=topic, queue_count=queue_count), timeout=RPC_TIMEOUT_SECONDS)
        self.wait_route(topic, queue_count, timeout)
        return response

    def wait_route(self, topic: str, queue_count: int, timeout: float = 15.0) -> None:
        def routed() -> bool:
            return all(len(self.query_route(topic, ns)) >= queue_count for ns in self.nameserver_addresses)

        wait_until(routed, timeout, interval=0.05,
                   message=f"topic {topic!r} not routed with {queue_count} queues on every name server",
                   ignore=(grpc.RpcError,))

    # ------------------------------------------------------------------ checker
    def start_checker(self, env: Mapping[str, str] | None = None) -> ServiceProcess:
        if importlib.util.find_spec("services.checker.__main__") is None:
            raise RuntimeError("services.checker has no __main__ yet: no checker can be started")
        name = f"checker-{len(self.checkers)}"
        proc = ServiceProcess("services.checker",
                              {**CHECKER_DEFAULTS, **self._tls_env(name), "TXMQ_CHECKER_NAME": name, **(env or {}),
                               "TXMQ_NAMESERVER_ADDRESSES": ",".join(self.nameserver_addresses),
                               **self._outer_host()},
                              self.workdir, name)
        self.checkers.append(proc)
        proc.start_and_wait(self.ready_timeout)
        expected = len(self.checkers)

        def registered() -> bool:
            for ns in self.nameserver_addresses:
                response = self.nameserver_stub(ns).ListCheckers(
                    nameserver_pb2.ListCheckersRequest(), timeout=RPC_TIMEOUT_SECONDS)
                if len(response.checkers) < expected:
                    return False
            return True

        wait_until(registered, self.ready_timeout, interval=0.05,
                   message=f"{name} not registered with every name server", ignore=(grpc.RpcError,))
        return proc

    # ------------------------------------------------------------------ proxy
    @property
    def proxy_addresses(self) -> list[str]:
        """``host:port`` of each proxy: the access point of an official RocketMQ client."""
        return [p.address for p in self.proxies]

    def start_proxy(self, env: Mapping[str, str] | None = None) -> ServiceProcess:
        """Starts one more ``python -m services.proxy`` (``proxy-<i>``) and waits until it serves."""
        name = f"proxy-{len(self.proxies)}"
        mirrored = {k: v for k, v in self._broker_env.items() if k in _PROXY_MIRRORS_BROKER}
        proc = ServiceProcess("services.proxy",
                              {**PROXY_DEFAULTS, **mirrored, **self._tls_env(name), "TXMQ_PROXY_NAME": name,
                               **(env or {}),
                               "TXMQ_NAMESERVER_ADDRESSES": ",".join(self.nameserver_addresses),
                               **self._outer_host()},
                              self.workdir, name)
        self.proxies.append(proc)
        proc.start_and_wait(self.ready_timeout)
        return proc

    # ------------------------------------------------------------------ faults
    def kill_broker(self, i: int) -> int | None:
        """SIGKILL broker ``i`` (a crash; its data directory stays)."""
        return self.brokers[i].kill()

    def stop_broker(self, i: int, timeout: float = 15.0) -> int | None:
        """SIGTERM broker ``i`` (a clean shutdown)."""
        return self.brokers[i].stop(timeout)

    def restart_broker(self, i: int, timeout: float | None = None) -> ServiceProcess:
        """(Re)starts broker ``i`` on the same port and data directory, then waits until it
        is ready and has re-registered with every name server."""
        proc = self.brokers[i]
        if proc.running:
            proc.stop()
        started_ms = int(time.time() * 1000)
        proc.restart(timeout or self.ready_timeout)
        self.wait_brokers_registered(timeout, brokers=[proc], heartbeat_after_ms=started_ms)
        return proc

    # ------------------------------------------------------------------ logs and teardown
    def logs(self, n: int = 60, since: Mapping[str, int] | None = None) -> dict[str, str]:
        """Last ``n`` log lines of every service (of what it wrote after the byte offsets
        in ``since``, by service name)."""
        since = since or {}
        return {p.name: p.log_tail(n, since=since.get(p.name, 0)) for p in self.processes}

    def log_offsets(self) -> dict[str, int]:
        return {p.name: p.log_size() for p in self.processes}

    def stop(self, timeout: float = 15.0) -> dict[str, int | None]:
        """Stops proxies, checkers, brokers, then name servers (SIGTERM, SIGKILL after ``timeout``).
        Returns the exit codes by service name. Idempotent."""
        codes: dict[str, int | None] = {}
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        for group in (self.proxies, self.checkers, self.brokers, self.nameservers):
            for proc in group:
                if proc.running:
                    proc.send_term()
            for proc in group:
                codes[proc.name] = proc.stop(timeout)
        if self.etcd is not None:
            self.etcd.stop()
        if self.network is not None:
            self.network.close()
        self._stopped = True
        with _CLUSTERS_LOCK:
            _CLUSTERS.discard(self)
        return codes
