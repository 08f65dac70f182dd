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
from .chart import CHART, CHART_OWNED, COMPONENTS, FROM_OTHER, POD_NAMED, SCENARIOS, Rendered, config_class, render

DOCKER = Path(__file__).resolve().parents[2] / "deploy" / "docker"


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
    pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"] for w in r.workloads()}

    def selected(selector: dict[str, str]) -> list[str]:
        return [name for name, labels in pods.items() if selector.items() <= labels.items()]

    for w in r.workloads():
        assert selected(w["spec"]["selector"]["matchLabels"]) == [w["metadata"]["name"]]
    for svc in r.of_kind("Service"):
        assert len(selected(svc["spec"]["selector"])) == 1, svc["metadata"]["name"]
    for pdb in r.of_kind("PodDisruptionBudget"):
        assert len(selected(pdb["spec"]["selector"]["matchLabels"])) == 1, pdb["metadata"]["name"]
    for sm in r.of_kind("ServiceMonitor"):
        scraped = [s for s in r.of_kind("Service")
                   if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        # One Service per component: each pod scraped once.
        assert sorted(s["metadata"]["labels"]["app.kubernetes.io/component"] for s in scraped) == \
            sorted(w["metadata"]["labels"]["app.kubernetes.io/component"] for w in r.workloads())
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
        assert set(ports) == {"grpc", "metrics"}
        assert int(env["TXMQ_PORT"]) == ports["grpc"]
        assert int(env["TXMQ_METRICS_PORT"]) == ports["metrics"]
        assert env["TXMQ_HOST"] == "0.0.0.0"  # reachable on the pod IP and through port-forward


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_probes_are_native_grpc_on_the_health_port(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    for w in r.workloads():
        c = _container(w)
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
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
        # The whole configuration is the chart's: every field has a value in the pod.
        missing = fields - set(env) - {env_name(n) for n in POD_NAMED}
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
            else:
                new = "/tmp/ready.json"
            sets[f"{component}.config.{name}"] = new
    sets["checker.config.answer_timeout_seconds"] = 5.5
    for component in COMPONENTS:
        sets[f"{component}.terminationGracePeriodSeconds"] = 60
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
        config = load_config(config_class(component), [], env={**env, **{env_name(n): "pod" for n in POD_NAMED}})
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
    broker = r.workload("broker")
    headless = r.get("Service", broker["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    env = _env(r, broker)
    assert env["TXMQ_BROKER_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    port = _container(broker)["ports"][0]["containerPort"]
    assert env["TXMQ_ADVERTISE_ADDRESS"] == \
        f"$(TXMQ_BROKER_NAME).{headless['metadata']['name']}.{namespace}.svc.cluster.local:{port}"
    checker = r.workload("checker")
    env = _env(r, checker)
    assert env["TXMQ_CHECKER_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["TXMQ_ADVERTISE_ADDRESS"] == f"$(POD_IP):{_container(checker)['ports'][0]['containerPort']}"
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
        if scenario == "minimal":
            assert "resources" not in c  # empty by default: the user sizes the pods
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
def _dockerfile(component: str) -> list[tuple[str, str]]:
    text = (DOCKER / component / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, rest = line.partition(" ")
            out.append((instr.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_dockerfile_is_pinned_non_root_and_matches_the_chart(rendered: dict[str, Rendered], component: str) -> None:
    instructions = _dockerfile(component)
    froms = [rest for instr, rest in instructions if instr == "FROM"]
    assert froms, "no FROM"
    for image in froms:
        ref = image.split()[0]
        assert ":" in ref and not ref.endswith(":latest"), f"base image {ref} not pinned by tag"
        assert re.search(r":\d+\.\d+\.\d+", ref) or "@sha256:" in ref, f"{ref}: pin a full version"
    users = [rest for instr, rest in instructions if instr == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the image must end as a non-root USER"
    w = rendered["minimal"].workload(component)
    c = _container(w)
    # The image's user is the one the chart runs as (volumes are group-owned by fsGroup).
    assert int(users[-1].split(":")[0]) == _pod_spec(w)["securityContext"]["runAsUser"]
    exposed = {int(p.split("/")[0]) for instr, rest in instructions if instr == "EXPOSE" for p in rest.split()}
    assert exposed == {p["containerPort"] for p in c["ports"]}
    (entrypoint,) = [json.loads(rest) for instr, rest in instructions if instr == "ENTRYPOINT"]
    assert entrypoint == c["command"] == ["python", "-m", COMPONENTS[component][0]]
    assert "CMD" not in {instr for instr, _ in instructions} and "args" not in c
    volumes = [json.loads(rest) for instr, rest in instructions if instr == "VOLUME"]
    if component == "broker":
        mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "data")
        assert [mount] in volumes
    if component == "proxy":
        # The rocketmq-python-client the proxy imports, and the writable HOME it logs under.
        runs = " ".join(rest for instr, rest in instructions if instr == "RUN")
        assert "requirements/proxy.txt" in runs
        home = next(e["value"] for e in c["env"] if e["name"] == "HOME")
        assert [home] in volumes
        envs = " ".join(rest for instr, rest in instructions if instr == "ENV")
        assert f"HOME={home}" in envs


# ---------------------------------------------------------------------------- broken charts
MUTATIONS = {
    "Service targets the wrong port": ("templates/broker/service-headless.yaml", "port: {{ .Values.broker.port }}",
                                       "port: 10912", test_service_ports_reach_container_ports_the_processes_listen_on),
    "containerPort differs from TXMQ_PORT": ("templates/checker/deployment.yaml", "containerPort: {{ $v.port }}",
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


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_a_broken_chart_fails_the_checks(helm_bin: Path, tmp_path: Path, mutation: tuple) -> None:
    from .chart import copy_chart, scenario_file  # noqa: PLC0415

    path, old, new, check = mutation
    chart = copy_chart(tmp_path)
    text = (chart / path).read_text()
    assert old in text, f"{path} no longer contains {old!r}: update the mutation"
    (chart / path).write_text(text.replace(old, new))
    broken = render(helm_bin, [scenario_file("minimal")], chart=chart)
    with pytest.raises(AssertionError):
        check({"minimal": broken}, "minimal")


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
