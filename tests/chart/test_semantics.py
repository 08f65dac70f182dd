"""Layer 3: what the rendered objects mean. Selectors select the pods, Service ports reach
containerPorts that the settings make the processes listen on, probes hit the health port,
every variable the chart sets is a setting the service reads, and every setting the service
reads can be set from values."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.config import env_name
from .chart import (CHART, CHART_OWNED, COMPONENTS, TLS_ONLY, FROM_OTHER, NAMESPACE, POD_NAMED, REPLICATION_ONLY, SCENARIOS,
                    Rendered, config_class, render, scenario_file)

def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = _pod_spec(workload)["containers"]
    return container


def _env(r: Rendered, workload: dict[str, Any]) -> dict[str, Any]:
    """TXMQ_* and helper variables as the pod sees them (ConfigMap first, env overrides)."""
    c = _container(workload)
    env: dict[str, Any] = dict(r.configmap_env(workload, c))
    for item in c.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_selectors_match_pod_labels(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    every = [d for d in r.docs if d["kind"] in ("StatefulSet", "Deployment")]  # the bundled etcd too
    pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"] for w in every}

    def selected(selector: dict[str, str]) -> list[str]:
        return [name for name, labels in pods.items() if selector.items() <= labels.items()]

    def component(names: list[str]) -> set[str]:
        return {pods[n]["app.kubernetes.io/component"] for n in names}

    for w in every:
        assert selected(w["spec"]["selector"]["matchLabels"]) == [w["metadata"]["name"]]
    for svc in r.of_kind("Service"):
        # One component's pods (a replicated broker's: every shard's StatefulSet).
        chosen = selected(svc["spec"]["selector"])
        assert len(component(chosen)) == 1, svc["metadata"]["name"]
        assert len(chosen) == (len(list(r.workloads("broker"))) if component(chosen) == {"broker"} else 1)
    for pdb in r.of_kind("PodDisruptionBudget"):
        assert len(selected(pdb["spec"]["selector"]["matchLabels"])) == 1, pdb["metadata"]["name"]
    for sm in r.of_kind("ServiceMonitor"):
        scraped = [s for s in r.of_kind("Service")
                   if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        # One Service per component: each pod scraped once.
        assert sorted(s["metadata"]["labels"]["app.kubernetes.io/component"] for s in scraped) == \
            sorted({labels["app.kubernetes.io/component"] for labels in pods.values()})
        for s in scraped:
            assert {p["name"] for p in s["spec"]["ports"]} >= {e["port"] for e in sm["spec"]["endpoints"]}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_service_ports_reach_container_ports_the_processes_listen_on(rendered: dict[str, Rendered],
                                                                      scenario: str) -> None:
    r = rendered[scenario]
    for svc in r.of_kind("Service"):
        component = svc["spec"]["selector"]["app.kubernetes.io/component"]
        w = r.workload(component)
        ports = {p["name"]: p["containerPort"] for p in _container(w)["ports"]}
        for p in svc["spec"]["ports"]:
            target = p["targetPort"]
            assert target in ports, f"{svc['metadata']['name']} targets {target!r}, container has {ports}"
            assert p["port"] == ports[target], f"{svc['metadata']['name']}:{p['name']}"
    for w in r.workloads():
        env = _env(r, w)
        ports = {p["name"]: p["containerPort"] for p in _container(w)["ports"]}
        # With TLS on, the plaintext health-only port the probes use (TXMQ_HEALTH_PORT); a
        # replicated broker's replication stream (TXMQ_REPLICATION_PORT).
        replicated = int(env.get("TXMQ_REPLICATION_FACTOR", "1")) > 1
        assert set(ports) == {"grpc", "metrics"} | ({"health"} if "TXMQ_HEALTH_PORT" in env else set()) \
            | ({"replication"} if replicated else set())
        if "TXMQ_HEALTH_PORT" in env:
            assert int(env["TXMQ_HEALTH_PORT"]) == ports["health"]
        if replicated:
            assert int(env["TXMQ_REPLICATION_PORT"]) == ports["replication"]
        assert int(env["TXMQ_PORT"]) == ports["grpc"]
        assert int(env["TXMQ_METRICS_PORT"]) == ports["metrics"]
        assert env["TXMQ_HOST"] == "0.0.0.0"  # reachable on the pod IP and through port-forward


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_probes_are_native_grpc_on_the_health_port(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    for w in r.workloads():
        c = _container(w)
        # The kubelet's gRPC probes cannot speak TLS: with TLS on, the health-only port.
        name = "health" if "TXMQ_TLS_CERT_FILE" in _env(r, w) else "grpc"
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == name)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c[kind]
            assert set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, kind
            assert probe["grpc"]["port"] == grpc_port
            assert probe["grpc"].get("service", "") == ""  # the overall status the servers set


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_variable_is_a_setting_the_service_reads(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    for w in r.workloads():
        component = w["metadata"]["labels"]["app.kubernetes.io/component"]
        fields = {env_name(f.name) for f in dataclasses.fields(config_class(component))}
        c = _container(w)
        env = _env(r, w)
        names = [e["name"] for e in c.get("env", [])]
        empty_dirs = {v["name"] for v in _pod_spec(w).get("volumes", []) if "emptyDir" in v}
        for name, value in env.items():
            if name.startswith("TXMQ_"):
                assert name in fields, f"{component}: {name} is not a setting of {config_class(component).__name__}"
            elif name == "HOME":
                # A writable HOME (the proxy's rocketmq package logs under it): an emptyDir.
                mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
                assert mounts.get(value) in empty_dirs, f"{component}: HOME={value} is not an emptyDir mount"
            else:
                # Helper variables only carry downward-API values into TXMQ_* values.
                assert isinstance(value, dict) and "fieldRef" in value, name
                users = [e for e in c["env"] if f"$({name})" in e.get("value", "")]
                assert users, f"{component}: {name} is set but never used"
                for user in users:
                    assert names.index(name) < names.index(user["name"]), f"$({name}) used before it is defined"
        # The settings a pod needs to find its peers and itself.
        assert {"TXMQ_HOST", "TXMQ_PORT", "TXMQ_METRICS_PORT"} <= set(env)
        if component != "nameserver":
            assert "TXMQ_NAMESERVER_ADDRESSES" in env and "TXMQ_ADVERTISE_ADDRESS" in env
        # The whole configuration is the chart's: every field has a value in the pod (the
        # replication settings only in replicated shards, which must have every one).
        unset = {env_name(n) for n in POD_NAMED - {"replica_id"}} | {env_name("tls_server_name")}
        if not any(v["name"] == "tls" and "secret" in v for v in _pod_spec(w).get("volumes", [])):  # TLS off
            unset |= {env_name(n) for n in TLS_ONLY}
            assert not set(env) & {env_name(n) for n in TLS_ONLY}, "TLS settings with tls.enabled false"
        if component == "broker" and not r.replicated():
            unset |= {env_name(n) for n in REPLICATION_ONLY}
            assert not set(env) & {env_name(n) for n in REPLICATION_ONLY}, "replication settings in a lone broker"
        missing = fields - set(env) - unset
        assert not missing, f"{component}: not set by the chart: {sorted(missing)}"


def test_every_setting_can_be_set_from_values(helm_bin: Path, tmp_path: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    sets: dict[str, Any] = {}
    for component in COMPONENTS:
        cls = config_class(component)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        settable = set(schema["properties"][component]["properties"]["config"]["properties"])
        inherited = set(FROM_OTHER.get(component, {}))
        assert settable | (CHART_OWNED & set(fields)) | inherited == set(fields), component
        assert not settable & CHART_OWNED and not settable & inherited
        # values.yaml carries the service's own defaults, so the chart changes nothing silently.
        for name in settable:
            default = fields[name].default
            assert values[component]["config"][name] == default, f"{component}.config.{name}"
        # A changed value reaches the pod as the service would parse it.
        for name in settable:
            default = fields[name].default
            if isinstance(default, bool):
                new = not default
            elif isinstance(default, (int, float)):
                new = default + 1 if name not in ("check_jitter",) else 0.5
            elif name == "log_level":
                new = "DEBUG"
            elif name == "flush":
                new = "async"
            elif name == "resolver_table":
                new = "ops.decisions"
            else:
                new = "/tmp/ready.json"
            sets[f"{component}.config.{name}"] = new
    sets["checker.config.answer_timeout_seconds"] = 5.5
    for component in COMPONENTS:
        sets[f"{component}.terminationGracePeriodSeconds"] = 60
    # Replicated shards, so the replication settings reach the pods too.
    sets.update({"broker.replicationFactor": 3, "broker.minInsyncReplicas": 3, "broker.pdb.maxUnavailable": 0,
                 "etcd.endpoints": ["etcd-a:2379", "etcd-b:2379"]})
    # TLS (on by default): the Secret's files, here where this test can make them readable.
    mount = tmp_path / "tls"
    mount.mkdir()
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (mount / name).write_text("PEM\n")
    sets.update({"tls.mountPath": str(mount), "tls.clientAuth.proxy": "require", "tls.healthPort": 9499})
    tree: dict[str, Any] = {}
    for key, value in sets.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    values_file = tmp_path / "every-setting.yaml"
    values_file.write_text(yaml.safe_dump(tree))
    r = render(helm_bin, [values_file])
    from services.common.config import load_config  # noqa: PLC0415

    for component in COMPONENTS:
        w = r.workload(component)
        env = {k: v for k, v in _env(r, w).items() if isinstance(v, str) and "$(" not in v}
        pod = {env_name(n): "pod" for n in POD_NAMED - {"replica_id"}} | {env_name("replica_id"): "2"}
        config = load_config(config_class(component), [], env={**env, **pod})
        if component == "broker":  # the chart-owned shape of the replica group
            assert (config.replication_factor, config.min_insync_replicas, config.etcd_endpoints) == \
                (3, 3, ("etcd-a:2379", "etcd-b:2379"))
        assert (config.tls_cert_file, config.tls_key_file, config.tls_ca_file) == \
            tuple(str(mount / n) for n in ("tls.crt", "tls.key", "ca.crt"))
        assert (config.tls_client_auth, config.health_port) == ("require", 9499)
        # Settings taken from another component arrive with that component's value.
        expected = {f"{component}.config.{name}": sets[f"{source}.config.{name}"]
                    for name, source in FROM_OTHER.get(component, {}).items()}
        for key, value in [*sets.items(), *expected.items()]:
            if key.startswith(f"{component}.config."):
                name = key.split(".", 2)[2]
                got = getattr(config, name)
                assert got == value and type(got) is type(value) or (
                    isinstance(got, float) and got == value), f"{key}: set {value!r}, the service reads {got!r}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_peers_are_addressed_through_the_headless_services(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    ns_sts = r.workload("nameserver")
    ns_headless = r.get("Service", ns_sts["spec"]["serviceName"])
    assert ns_headless["spec"]["clusterIP"] == "None" and ns_headless["spec"]["publishNotReadyAddresses"]
    namespace = ns_sts["metadata"]["namespace"]
    ns_port = _container(ns_sts)["ports"][0]["containerPort"]
    expected = [f"{ns_sts['metadata']['name']}-{i}.{ns_headless['metadata']['name']}.{namespace}.svc.cluster.local:"
                f"{ns_port}" for i in range(ns_sts["spec"]["replicas"])]
    for component in sorted(set(COMPONENTS) - {"nameserver"}):
        env = _env(r, r.workload(component))
        assert env["TXMQ_NAMESERVER_ADDRESSES"].split(",") == expected
    for broker in r.workloads("broker"):
        headless = r.get("Service", broker["spec"]["serviceName"])
        assert headless["spec"]["clusterIP"] == "None"
        env = _env(r, broker)
        port = _container(broker)["ports"][0]["containerPort"]
        if r.replicated():
            # Every replica of a shard has the shard's name, and its own address (pod DNS).
            assert env["TXMQ_BROKER_NAME"] == broker["metadata"]["name"]
            assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            assert env["TXMQ_ADVERTISE_ADDRESS"] == \
                f"$(POD_NAME).{headless['metadata']['name']}.{namespace}.svc.cluster.local:{port}"
        else:
            assert env["TXMQ_BROKER_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            assert env["TXMQ_ADVERTISE_ADDRESS"] == \
                f"$(TXMQ_BROKER_NAME).{headless['metadata']['name']}.{namespace}.svc.cluster.local:{port}"
    # Checkers too: producers dial them, and with TLS a certificate names a pod's DNS name,
    # never its IP (which no certificate issued at install can know).
    checker = r.workload("checker")
    headless = r.get("Service", checker["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    env = _env(r, checker)
    assert env["TXMQ_CHECKER_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "POD_IP" not in env
    assert env["TXMQ_ADVERTISE_ADDRESS"] == \
        f"$(TXMQ_CHECKER_NAME).{headless['metadata']['name']}.{namespace}.svc.cluster.local:" \
        f"{_container(checker)['ports'][0]['containerPort']}"
    env = _env(r, r.workload("proxy"))
    assert env["TXMQ_PROXY_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Routes name the access point each client dialled: the proxy Service.
    assert env["TXMQ_ADVERTISE_ADDRESS"] == ""


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_proxy_is_reached_through_its_service_and_advertises_the_brokers_limits(
        rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    proxy = r.workload("proxy")
    assert proxy["kind"] == "Deployment"
    c = _container(proxy)
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    (client,) = [s for s in r.of_kind("Service") if s["metadata"]["labels"]["app.kubernetes.io/component"] == "proxy"
                 and s["spec"].get("clusterIP") != "None"]
    assert client["spec"]["type"] == "ClusterIP"
    assert [(p["name"], p["port"], p["targetPort"]) for p in client["spec"]["ports"]] == [("grpc", 8081, "grpc")]
    assert port == 8081  # RocketMQ's proxy port: a client's default access point
    env, broker_env = _env(r, proxy), _env(r, r.workload("broker"))
    for name in FROM_OTHER["proxy"]:
        assert env[env_name(name)] == broker_env[env_name(name)], name
    # The rocketmq package's log directory: a writable HOME on an emptyDir.
    home = env["HOME"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert home in mounts, f"HOME={home} is on the read-only root filesystem"
    volumes = {v["name"]: v for v in _pod_spec(proxy)["volumes"]}
    assert volumes.get(mounts[home]["name"]) == {"name": mounts[home]["name"], "emptyDir": {}}
    assert not mounts[home].get("readOnly")


def test_the_proxy_can_be_disabled(helm_bin: Path) -> None:
    r = render(helm_bin, sets={"proxy.enabled": "false"})
    assert not [d for d in r.docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "proxy"]
    assert {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in r.workloads()} == \
        {"nameserver", "broker", "checker"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_broker_data_is_on_its_volume(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    broker = r.workload("broker")
    c = _container(broker)
    data_dir = _env(r, broker)["TXMQ_DATA_DIR"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert data_dir.startswith(mounts["data"].rstrip("/") + "/")
    claims = [t["metadata"]["name"] for t in broker["spec"].get("volumeClaimTemplates", [])]
    volumes = {v["name"]: v for v in _pod_spec(broker)["volumes"]}
    assert ("data" in claims) != ("data" in volumes), "data must be exactly one of a PVC template or a volume"
    if scenario == "ha-monitoring":
        assert claims == ["data"]
    for w in r.workloads():
        mounted = {m["name"] for m in _container(w)["volumeMounts"]}
        available = set(volumes if w is broker else {v["name"] for v in _pod_spec(w)["volumes"]}) | set(
            t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", []))
        assert mounted <= available, w["metadata"]["name"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pods_are_locked_down(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    for w in r.workloads():
        spec = _pod_spec(w)
        c = _container(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}
        # Requests by default (a preset), so no pod is BestEffort (evicted first).
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], w["metadata"]["name"]
        if scenario == "minimal":  # the preset's memory limit
            assert c["resources"]["limits"]["memory"], w["metadata"]["name"]
        grace = float(_env(r, w)["TXMQ_SHUTDOWN_GRACE_SECONDS"])
        assert grace < spec["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pdbs_leave_a_majority(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    for pdb in r.of_kind("PodDisruptionBudget"):
        assert pdb["spec"].get("maxUnavailable") == 1


def test_scaling_changes_replicas_and_name_server_list(helm_bin: Path) -> None:
    r = render(helm_bin, sets={"broker.replicaCount": "5", "checker.replicaCount": "4",
                                "nameserver.replicaCount": "3", "proxy.replicaCount": "6"})
    assert r.workload("broker")["spec"]["replicas"] == 5
    assert r.workload("checker")["spec"]["replicas"] == 4
    assert r.workload("proxy")["spec"]["replicas"] == 6
    for component in ("broker", "checker", "proxy"):
        assert len(_env(r, r.workload(component))["TXMQ_NAMESERVER_ADDRESSES"].split(",")) == 3


# ---------------------------------------------------------------------------- images
# The chart's image names, commands, ports, user ids and paths are checked against the
# built images themselves (docker image inspect) in tests/chart/test_images.py.


# ---------------------------------------------------------------------------- broken charts
MUTATIONS = {
    "Service targets the wrong port": ("templates/broker/service-headless.yaml", "port: {{ .Values.broker.port }}",
                                       "port: 10912", test_service_ports_reach_container_ports_the_processes_listen_on),
    "containerPort differs from TXMQ_PORT": ("templates/checker/statefulset.yaml", "containerPort: {{ $v.port }}",
                                             "containerPort: 10000",
                                             test_service_ports_reach_container_ports_the_processes_listen_on),
    "variable the service does not read": ("templates/broker/statefulset.yaml", "- name: TXMQ_DATA_DIR",
                                           "- name: TXMQ_DATA_DIRECTORY", test_every_variable_is_a_setting_the_service_reads),
    "setting missing": ("templates/_helpers.tpl", 'TXMQ_HOST: "0.0.0.0"', 'UNUSED_HOST: "0.0.0.0"',
                        test_every_variable_is_a_setting_the_service_reads),
    "probe on the metrics port": ("templates/_helpers.tpl", "port: {{ $port }}", "port: 9400",
                                  test_probes_are_native_grpc_on_the_health_port),
    "proxy limit not the broker's": ("templates/proxy/configmap.yaml", ".Values.broker.config.max_delivery_attempts",
                                     "32", test_proxy_is_reached_through_its_service_and_advertises_the_brokers_limits),
    "proxy Service on the wrong port": ("templates/proxy/service.yaml", "port: {{ .Values.proxy.port }}",
                                        "port: 9876", test_service_ports_reach_container_ports_the_processes_listen_on),
    "proxy HOME on the read-only root": ("templates/proxy/deployment.yaml", "value: {{ $v.homeMountPath | quote }}",
                                         'value: "/home/nobody"',
                                         test_proxy_is_reached_through_its_service_and_advertises_the_brokers_limits),
    "selector misses the component": ("templates/nameserver/service.yaml",
                                      '{{- include "txmq.selectorLabels" $ctx | nindent 4 }}',
                                      '{{- include "txmq.selectorLabels" (dict "root" .) | nindent 4 }}',
                                      test_selectors_match_pod_labels),
}


def _fails_when_broken(helm_bin: Path, tmp_path: Path, mutation: tuple, scenario: str) -> None:
    """Replace ``old`` by ``new`` in a copy of the chart: ``check`` must fail on its render."""
    from .chart import copy_chart  # noqa: PLC0415

    path, old, new, check = mutation
    chart = copy_chart(tmp_path)
    text = (chart / path).read_text()
    assert old in text, f"{path} no longer contains {old!r}: update the mutation"
    (chart / path).write_text(text.replace(old, new))
    broken = render(helm_bin, [scenario_file(scenario)], chart=chart)
    with pytest.raises(AssertionError):
        check({scenario: broken}, scenario)


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_a_broken_chart_fails_the_checks(helm_bin: Path, tmp_path: Path, mutation: tuple) -> None:
    _fails_when_broken(helm_bin, tmp_path, mutation, "minimal")


# ---------------------------------------------------------------------------- replicated shards
REPLICATED = ["replicated", "replicated-external-etcd"]
POD_INDEX = {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}


def _values(scenario: str) -> dict[str, Any]:
    """values.yaml under the scenario's values (deep-merged, as helm does)."""
    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out
    return merge(yaml.safe_load((CHART / "values.yaml").read_text()),
                 yaml.safe_load(scenario_file(scenario).read_text()))


def _expand(value: str, env: dict[str, Any], pod: str) -> str:
    """$(VAR) as the kubelet expands it, for a pod named ``pod``."""
    return re.sub(r"\$\((\w+)\)", lambda m: pod if env.get(m.group(1)) == {"fieldRef": {"fieldPath": "metadata.name"}}
                  else str(env[m.group(1)]), value)


def test_unreplicated_release_keeps_its_layout(helm_bin: Path, rendered: dict[str, Rendered]) -> None:
    """replicationFactor 1 (the default): one broker StatefulSet, its pods the shards, no
    etcd, no replication setting, rule or relabeling: what releases rendered before."""
    for r in (render(helm_bin), rendered["minimal"], rendered["ha-monitoring"]):
        (sts,) = r.workloads("broker")
        assert sts["metadata"]["name"] == "txmq-broker" and not r.replicated()
        assert [p["metadata"]["name"] for p in r.of_kind("PodDisruptionBudget")
                if p["metadata"]["labels"]["app.kubernetes.io/component"] == "broker"] == ["txmq-broker"]
        assert not [d for d in r.docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "etcd"]
        env = _env(r, sts)
        assert not {k for k in env if "ETCD" in k or "REPLICA" in k or "INSYNC" in k or "LEADER" in k}
    r = rendered["ha-monitoring"]
    (sm,) = r.of_kind("ServiceMonitor")
    assert "relabelings" not in sm["spec"]["endpoints"][0]
    (rule,) = r.of_kind("PrometheusRule")
    assert "txmq.replication" not in {g["name"] for g in rule["spec"]["groups"]}


@pytest.mark.parametrize("scenario", REPLICATED)
def test_each_shard_is_a_replica_group(rendered: dict[str, Rendered], scenario: str) -> None:
    r, values = rendered[scenario], _values(scenario)
    rf, shards = values["broker"]["replicationFactor"], values["broker"]["replicaCount"]
    sets = list(r.workloads("broker"))
    assert [w["metadata"]["name"] for w in sets] == [f"txmq-broker-{i}" for i in range(shards)]
    addresses = set()
    for sts in sets:
        shard = sts["metadata"]["name"]
        assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == rf
        assert sts["spec"]["template"]["metadata"]["labels"]["txmq.io/shard"] == shard
        env = _env(r, sts)
        # Replica id = pod index (the StatefulSet controller's label), name = the shard.
        assert env["TXMQ_REPLICA_ID"] == POD_INDEX and env["TXMQ_BROKER_NAME"] == shard
        assert env["TXMQ_REPLICATION_FACTOR"] == str(rf)
        assert env["TXMQ_MIN_INSYNC_REPLICAS"] == str(values["broker"]["minInsyncReplicas"])
        assert env["TXMQ_LEADER_LEASE_SECONDS"] == str(int(values["broker"]["config"]["leader_lease_seconds"]))
        for i in range(rf):
            addresses.add(_expand(env["TXMQ_ADVERTISE_ADDRESS"], env, f"{shard}-{i}"))
        # Every replica its own volume: a claim per pod.
        assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert len(addresses) == rf * shards, "every replica registers its own address"
    # The etcd the replicas use.
    endpoints = _env(r, sets[0])["TXMQ_ETCD_ENDPOINTS"].split(",")
    if values["etcd"]["enabled"]:
        (etcd,) = list(r.workloads("etcd"))
        etcd_env = _env(r, etcd)
        assert endpoints == [_expand(etcd_env["ETCD_ADVERTISE_CLIENT_URLS"], etcd_env, f"txmq-etcd-{i}")
                             .removeprefix("http://") for i in range(etcd["spec"]["replicas"])]
    else:
        assert endpoints == values["etcd"]["endpoints"]
        assert not list(r.workloads("etcd"))


@pytest.mark.parametrize("scenario", REPLICATED)
def test_replicas_of_a_shard_spread_over_nodes_and_a_drain_keeps_min_insync(
        rendered: dict[str, Rendered], scenario: str) -> None:
    r, values = rendered[scenario], _values(scenario)
    hard = values["broker"]["podAntiAffinityPreset"] == "hard"
    pdbs = {p["metadata"]["name"]: p for p in r.of_kind("PodDisruptionBudget")}
    for sts in r.workloads("broker"):
        shard = sts["metadata"]["name"]
        own = sts["spec"]["template"]["metadata"]["labels"]
        others = [w["spec"]["template"]["metadata"]["labels"] for w in r.workloads("broker") if w is not sts]
        anti = _pod_spec(sts)["affinity"]["podAntiAffinity"]
        if hard:
            (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        else:
            (weighted,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
            term = weighted["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        # Against this shard's replicas only: two shards may share a node.
        selector = term["labelSelector"]["matchLabels"]
        assert selector.items() <= own.items() and not any(selector.items() <= o.items() for o in others)
        if values["broker"]["replicaTopologySpread"]["enabled"]:
            (spread,) = _pod_spec(sts)["topologySpreadConstraints"]
            assert spread["topologyKey"] == values["broker"]["replicaTopologySpread"]["topologyKey"]
            assert spread["labelSelector"]["matchLabels"] == selector
        # A budget per shard: a drain leaves minInsyncReplicas of it running.
        pdb = pdbs[shard]
        assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
        assert sts["spec"]["replicas"] - pdb["spec"]["maxUnavailable"] >= values["broker"]["minInsyncReplicas"]


def test_bundled_etcd_is_a_three_member_cluster(rendered: dict[str, Rendered]) -> None:
    r = rendered["replicated"]
    (etcd,) = list(r.workloads("etcd"))
    assert etcd["kind"] == "StatefulSet" and etcd["spec"]["replicas"] == 3
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"
    c = _container(etcd)
    repository, tag = c["image"].rsplit(":", 1)
    assert repository in ("gcr.io/etcd-development/etcd", "quay.io/coreos/etcd")
    assert re.fullmatch(r"v3\.\d+\.\d+", tag), f"{c['image']}: pin an etcd release"
    env = _env(r, etcd)
    headless = r.get("Service", etcd["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == ports
    domain = f"{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    members = [f"txmq-etcd-{i}" for i in range(3)]
    # The static initial cluster names every member at the peer URL it advertises; clients
    # and peers speak TLS (tls.enabled, the default) and must present certificates.
    s = "https"
    assert env["ETCD_INITIAL_CLUSTER"] == ",".join(f"{m}={s}://{m}.{domain}:{ports['peer']}" for m in members)
    for m in members:
        assert _expand(env["ETCD_NAME"], env, m) == m
        assert _expand(env["ETCD_INITIAL_ADVERTISE_PEER_URLS"], env, m) == f"{s}://{m}.{domain}:{ports['peer']}"
        assert _expand(env["ETCD_ADVERTISE_CLIENT_URLS"], env, m) == f"{s}://{m}.{domain}:{ports['client']}"
    assert env["ETCD_LISTEN_CLIENT_URLS"] == f"{s}://0.0.0.0:{ports['client']}"
    assert env["ETCD_LISTEN_PEER_URLS"] == f"{s}://0.0.0.0:{ports['peer']}"
    mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "tls")
    for prefix in ("ETCD_", "ETCD_PEER_"):
        assert (env[prefix + "CERT_FILE"], env[prefix + "KEY_FILE"], env[prefix + "TRUSTED_CA_FILE"]) == \
            (f"{mount}/tls.crt", f"{mount}/tls.key", f"{mount}/ca.crt")
        assert env[prefix + "CLIENT_CERT_AUTH"] == "true"
    brokers = r.configmap_env(r.workload("broker"), _container(r.workload("broker")))
    assert brokers["TXMQ_ETCD_ENDPOINTS"].split(",") == [f"https://{m}.{domain}:{ports['client']}" for m in members]
    assert env["ETCD_LISTEN_METRICS_URLS"] == f"http://0.0.0.0:{ports['metrics']}"
    # Data on a claim per member; probes on the health endpoint (liveness: this member only).
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert env["ETCD_DATA_DIR"].startswith(mounts["data"] + "/")
    assert [t["metadata"]["name"] for t in etcd["spec"]["volumeClaimTemplates"]] == ["data"]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[kind]["httpGet"]["port"] == "metrics" and c[kind]["httpGet"]["path"].startswith("/health")
    assert c["livenessProbe"]["httpGet"]["path"] == "/health?serializable=true"
    assert c["securityContext"]["readOnlyRootFilesystem"] and _pod_spec(etcd)["securityContext"]["runAsNonRoot"]
    pdb = r.get("PodDisruptionBudget", "txmq-etcd")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": etcd["spec"]["selector"]}
    # Scraped replicas carry their shard: the replication alerts and panels group by it.
    (sm,) = r.of_kind("ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_label_txmq_io_shard"], "targetLabel": "shard"}]


REPLICATED_MUTATIONS = {
    "replica id from the pod name": ("templates/broker/statefulset.yaml",
                                     "fieldPath: metadata.labels['apps.kubernetes.io/pod-index']",
                                     "fieldPath: metadata.name", test_each_shard_is_a_replica_group),
    "replicas share one advertised address": ("templates/broker/statefulset.yaml", 'value: "$(POD_NAME).',
                                              'value: "$(TXMQ_BROKER_NAME).', test_each_shard_is_a_replica_group),
    "anti-affinity across every shard": ("templates/_helpers.tpl", "{{- if .shard }}\ntxmq.io/shard",
                                         "{{- if false }}\ntxmq.io/shard",
                                         test_replicas_of_a_shard_spread_over_nodes_and_a_drain_keeps_min_insync),
    "a member missing from the initial cluster": ("templates/etcd/statefulset.yaml",
                                                  "until (int $v.replicaCount)", "until 2",
                                                  lambda r, _s: test_bundled_etcd_is_a_three_member_cluster(r)),
}


@pytest.mark.parametrize("mutation", REPLICATED_MUTATIONS.values(), ids=REPLICATED_MUTATIONS.keys())
def test_a_broken_replicated_chart_fails_the_checks(helm_bin: Path, tmp_path: Path, mutation: tuple) -> None:
    _fails_when_broken(helm_bin, tmp_path, mutation, "replicated")


def test_schema_ranges_are_the_services_declared_ranges() -> None:
    """Every setting under `<component>.config` is held by the schema to the range its
    dataclass declares (services/common/config.py `seconds`, `count`, ...), so helm refuses
    at install exactly what the service would refuse at start."""
    from tools.chart_schema import declared_schema  # noqa: PLC0415

    schema = json.loads((CHART / "values.schema.json").read_text())
    differing = []
    for component in COMPONENTS:
        cls = config_class(component)
        settable = schema["properties"][component]["properties"]["config"]["properties"]
        for name, prop in settable.items():
            declared = declared_schema(cls, name)
            if declared is None:
                assert prop.get("type") in ("boolean", "string") and "enum" not in prop, \
                    f"{component}.config.{name}: the chart limits it but {cls.__name__} declares nothing"
            elif prop != declared:
                differing.append(f"{component}.config.{name}: chart {prop}, {cls.__name__} {declared}")
    assert not differing, "run python -m tools.chart_schema:\n" + "\n".join(differing)


def test_resolver_groups_read_their_connection_string_from_a_mounted_secret(helm_bin: Path) -> None:
    """checker.resolver.groups: each group's libpq connection string is a Secret's key
    mounted read-only as a file (never an environment value), and TXMQ_RESOLVER_GROUPS names
    that file for that group, as CheckerConfig parses it."""
    from services.common.config import load_config  # noqa: PLC0415
    r = render(helm_bin, sets={"checker.resolver.groups[0].group": "orders",
                               "checker.resolver.groups[0].secretName": "orders-dsn",
                               "checker.resolver.groups[1].group": "billing",
                               "checker.resolver.groups[1].secretName": "billing-db",
                               "checker.resolver.groups[1].key": "url",
                               "checker.config.resolver_table": "ops.decisions"})
    w = r.workload("checker")
    c = _container(w)
    env = _env(r, w)
    fixed = {k: v for k, v in env.items() if k.startswith("TXMQ_") and isinstance(v, str) and "$(" not in v
             and not k.startswith("TXMQ_TLS_") and not k.startswith("TXMQ_AUTH_")}  # files only the pod has
    config = load_config(config_class("checker"), env={**fixed, "TXMQ_CHECKER_NAME": "txmq-checker-0"})
    assert config.resolver_table == "ops.decisions"
    volumes = {v["name"]: v for v in _pod_spec(w)["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    seen = {}
    for entry in config.resolver_groups:
        group, _, path = entry.partition("=")
        directory, _, filename = path.rpartition("/")
        mount = mounts[directory]
        assert mount["readOnly"] is True
        secret = volumes[mount["name"]]["secret"]
        assert secret["defaultMode"] == 0o400
        (item,) = secret["items"]
        assert item["path"] == filename
        seen[group] = (secret["secretName"], item["key"])
    assert seen == {"orders": ("orders-dsn", "dsn"), "billing": ("billing-db", "url")}
    assert not any("dsn" in str(e.get("valueFrom", "")).lower() for e in c.get("env", [])), "a DSN in the environment"
    # No groups: no resolver volumes, and the variable says so.
    default = render(helm_bin)
    w = default.workload("checker")
    assert _env(default, w)["TXMQ_RESOLVER_GROUPS"] == ""
    assert not [v for v in _pod_spec(w)["volumes"] if v["name"].startswith("resolver-")]
