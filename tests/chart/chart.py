"""Rendering the chart with the real helm binary, and reading what it rendered."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "txmq"
SCENARIOS = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
RELEASE = "txmq"
NAMESPACE = "txmq-test"
#: The services the chart runs, with the module each container starts and its config class.
COMPONENTS = {
    "nameserver": ("services.nameserver", "services.nameserver.config", "NameServerConfig"),
    "broker": ("services.broker", "services.broker.config", "BrokerConfig"),
    "checker": ("services.checker", "services.checker.config", "CheckerConfig"),
    "proxy": ("services.proxy", "services.proxy.config", "ProxyConfig"),
}
#: Settings the chart sets itself (names, addresses, ports, paths, the shape of replica
#: groups and their etcd), not from `<component>.config`.
CHART_OWNED = {"host", "port", "metrics_port", "nameserver_addresses", "broker_name", "checker_name",
               "proxy_name", "advertise_address", "data_dir", "replication_factor", "min_insync_replicas",
               "replica_id", "etcd_endpoints", "replication_port", "health_port", "tls_cert_file", "tls_key_file", "tls_ca_file",
               "tls_client_auth", "tls_server_name", "auth_files", "auth_token_file", "auth_reload_seconds",
               "resolver_groups", "expected_brokers"}
#: TLS settings the chart sets only with tls.enabled (and tls_server_name never: pods dial
#: DNS names their peers' certificates carry).
TLS_ONLY = {"health_port", "tls_cert_file", "tls_key_file", "tls_ca_file", "tls_client_auth", "tls_server_name"}
#: Pod names and indexes (the downward API), not settable.
POD_NAMED = {"broker_name", "checker_name", "proxy_name", "replica_id"}
#: Broker settings only replicated shards read: with broker.replicationFactor 1 the chart
#: leaves them out of the pods (so such a release renders as before replication existed).
REPLICATION_ONLY = {"replication_factor", "min_insync_replicas", "replica_id", "etcd_endpoints", "etcd_prefix",
                    "etcd_user", "etcd_password_file",
                    "leader_lease_seconds", "election_poll_seconds", "replica_lag_max_seconds",
                    "replication_batch_bytes", "replication_log_entries", "replication_port"}
#: Settings of a component the chart takes from another component's `config`, so the two
#: always agree: the proxy advertises the brokers' limits to RocketMQ clients.
FROM_OTHER = {"proxy": {"max_body_bytes": "broker", "max_delivery_attempts": "broker"}}
WORKLOAD_KINDS = {"StatefulSet", "Deployment"}


def helm_binary() -> Path:
    from tools.fetch_helm import fetch  # downloads on first use

    return fetch()


def scenario_file(scenario: str) -> Path:
    return CHART / "ci" / f"{scenario}-values.yaml"


class HelmError(AssertionError):
    pass


def helm(helm_bin: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def template_args(values_files: Iterable[Path] = (), sets: dict[str, str] | None = None,
                  kube_version: str | None = None, chart: Path = CHART) -> list[str]:
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
    for f in values_files:
        args += ["-f", str(f)]
    for k, v in (sets or {}).items():
        args += ["--set", f"{k}={v}"]
    if kube_version:
        args += ["--kube-version", kube_version]
    return args


@dataclass
class Rendered:
    docs: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        for d in self.docs:
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
        raise KeyError(f"no {kind} {name!r} rendered; have {[(d['kind'], d['metadata']['name']) for d in self.docs]}")

    def workloads(self, component: str | None = None) -> Iterator[dict[str, Any]]:
        """The txmq workloads (not the bundled etcd), or those of one component (a
        replicated broker has one StatefulSet per shard)."""
        for d in self.docs:
            if d["kind"] in WORKLOAD_KINDS:
                kind = d["metadata"]["labels"].get("app.kubernetes.io/component")
                if (component is None and kind in COMPONENTS) or kind == component:
                    yield d

    def workload(self, component: str) -> dict[str, Any]:
        for d in self.workloads(component):
            return d
        raise KeyError(component)

    def replicated(self) -> bool:
        return any("txmq.io/shard" in w["metadata"]["labels"] for w in self.workloads("broker"))

    def configmap_env(self, workload: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            cm = self.get("ConfigMap", source["configMapRef"]["name"])
            env.update(cm.get("data") or {})
        return env


def render(helm_bin: Path, values_files: Iterable[Path] = (), sets: dict[str, str] | None = None,
           kube_version: str | None = None, chart: Path = CHART) -> Rendered:
    out = helm(helm_bin, *template_args(values_files, sets, kube_version, chart)).stdout
    return Rendered([d for d in yaml.safe_load_all(out) if d])


def render_scenario(helm_bin: Path, scenario: str, **kwargs: Any) -> Rendered:
    return render(helm_bin, [scenario_file(scenario)], **kwargs)


def copy_chart(dest: Path) -> Path:
    """A copy of the chart to break on purpose."""
    target = dest / "txmq"
    shutil.copytree(CHART, target)
    return target


def config_class(component: str) -> type:
    import importlib

    _module, config_module, cls = COMPONENTS[component]
    return getattr(importlib.import_module(config_module), cls)
