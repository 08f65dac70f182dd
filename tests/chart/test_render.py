"""Layers 1 and 2: `helm lint --strict` and `helm template` for every ci/ scenario, bad
values rejected, and every rendered document valid against the Kubernetes OpenAPI schemas
(oldest and newest supported versions, strict) or, for prometheus-operator kinds, against
their CRDs' required fields."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from .chart import CHART, SCENARIOS, Rendered, helm, render, scenario_file, template_args

#: Chart.yaml's kubeVersion floor and the newest version kubernetes-validate knows.
KUBE_VERSIONS = ["1.25.0", "1.37.0"]
#: Replicated shards take each replica's id from the pod-index label (Kubernetes 1.28+).
REPLICATED_FLOOR = "1.28.0"
REPLICATED_SCENARIOS = {"replicated", "replicated-external-etcd", "cert-manager", "secured"}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "Certificate"}


def test_scenarios_exist() -> None:
    assert {"minimal", "ha-monitoring"} | REPLICATED_SCENARIOS <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", [None, *SCENARIOS])
def test_helm_lint_strict(helm_bin: Path, scenario: str | None) -> None:
    args = ["lint", "--strict", str(CHART)]
    if scenario:
        args += ["-f", str(scenario_file(scenario))]
    helm(helm_bin, *args)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_renders_each_component(rendered: dict[str, Rendered], scenario: str) -> None:
    r = rendered[scenario]
    kinds = {(d["kind"], d["metadata"]["labels"].get("app.kubernetes.io/component")) for d in r.docs}
    assert ("StatefulSet", "nameserver") in kinds
    assert ("StatefulSet", "broker") in kinds
    assert ("StatefulSet", "checker") in kinds
    assert ("Deployment", "proxy") in kinds and ("Service", "proxy") in kinds
    for component in ("nameserver", "broker", "checker", "proxy"):
        assert ("PodDisruptionBudget", component) in kinds
        assert ("ConfigMap", component) in kinds


def test_monitoring_is_off_by_default_and_on_in_ha_scenario(helm_bin: Path, rendered: dict[str, Rendered]) -> None:
    default = render(helm_bin)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert default.of_kind(kind) == []
        assert len(rendered["ha-monitoring"].of_kind(kind)) == 1
    dashboards = [d for d in rendered["ha-monitoring"].of_kind("ConfigMap")
                  if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == 1
    assert not [d for d in default.of_kind("ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]


BAD_VALUES = {
    "negative broker replicas": {"broker.replicaCount": "-1"},
    "negative checker replicas": {"checker.replicaCount": "-2"},
    "no name server": {"nameserver.replicaCount": "0"},
    "unknown flush mode": {"broker.config.flush": "sometimes"},
    "negative timeout": {"broker.config.transaction_timeout_seconds": "-1"},
    "zero heartbeat": {"checker.config.heartbeat_interval_seconds": "0"},
    "lease too long": {"checker.config.lease_seconds": "7200"},
    "timeout beyond a year": {"broker.config.check_interval_seconds": "99999999"},
    "jitter above 1": {"broker.config.check_jitter": "1.5"},
    "answer timeout above lease": {"checker.config.answer_timeout_seconds": "20"},
    "grace longer than termination": {"broker.config.shutdown_grace_seconds": "60"},
    "unknown setting": {"broker.config.no_such_setting": "1"},
    "unknown top-level key": {"brokers.replicaCount": "3"},
    "port out of range": {"broker.port": "70000"},
    "metrics port clashes": {"metrics.port": "10911"},
    "bad log level": {"nameserver.config.log_level": "LOUD"},
    "bad duration": {"metrics.prometheusRule.checkLagFor": "five minutes"},
    "bad volume size": {"broker.persistence.size": "lots"},
    "negative proxy replicas": {"proxy.replicaCount": "-1"},
    "proxy limit set apart from the broker's": {"proxy.config.max_body_bytes": "1024"},
    "proxy backoff multiplier below 1": {"proxy.config.consumer_backoff_multiplier": "0.5"},
    "proxy min invisibility above max": {"proxy.config.min_invisible_duration_seconds": "50000"},
    "proxy message size below body size": {"proxy.config.max_grpc_message_bytes": "4194304"},
    "proxy advertise address without port": {"proxy.advertiseAddress": "mq.example.com"},
    "proxy grace longer than termination": {"proxy.config.shutdown_grace_seconds": "45"},
    "metrics port clashes with the proxy": {"metrics.port": "8081"},
    "proxy pending checks limit 0": {"proxy.config.max_pending_checks_per_connection": "0"},
    "proxy signature skew beyond a day": {"proxy.config.signature_max_skew_seconds": "86401"},
    "broker pending produce entries 0": {"broker.config.max_pending_produce_entries": "0"},
    # Replicated shards.
    "replicated without an etcd": {"broker.replicationFactor": "3"},
    "bundled etcd and endpoints both": {"etcd.endpoints[0]": "etcd:2379", "broker.replicationFactor": "3",
                                        "etcd.enabled": "true"},
    "replication factor above 9": {"broker.replicationFactor": "10", "etcd.enabled": "true"},
    "replication factor 0": {"broker.replicationFactor": "0"},
    "min in-sync above the factor": {"broker.minInsyncReplicas": "4", "broker.replicationFactor": "3",
                                     "etcd.enabled": "true"},
    "pdb below min in-sync": {"broker.pdb.maxUnavailable": "2", "broker.replicationFactor": "3",
                              "etcd.enabled": "true"},
    "fractional leader lease": {"broker.config.leader_lease_seconds": "2.5"},
    "election poll not below the lease": {"broker.config.election_poll_seconds": "4", "broker.replicationFactor": "3",
                                          "etcd.enabled": "true"},
    "etcd endpoint without port": {"etcd.endpoints[0]": "etcd.example.com", "broker.replicationFactor": "3"},
    "even etcd members": {"etcd.replicaCount": "2", "etcd.enabled": "true"},
    "etcd ports clash": {"etcd.peerPort": "2379", "etcd.enabled": "true"},
    "etcd prefix not a path": {"broker.config.etcd_prefix": "txmq"},
    # TLS.
    "cert-manager without an issuer": {"tls.certManager.enabled": "true"},
    "client auth gRPC cannot do": {"tls.clientAuth.broker": "request"},
    "TLS mount not a path": {"tls.mountPath": "tls"},
    "etcd endpoint of another scheme": {"etcd.endpoints[0]": "ftp://etcd:2379", "broker.replicationFactor": "3"},
    # The checker's resolver (anchored transactions).
    "resolver table not an identifier": {"checker.config.resolver_table": "decisions; drop table x"},
    "resolver group without its secret": {"checker.resolver.groups[0].group": "orders"},
    "resolver group of a system name": {"checker.resolver.groups[0].group": "%orders",
                                        "checker.resolver.groups[0].secretName": "dsn"},
    "resolver group named twice": {"checker.resolver.groups[0].group": "orders",
                                   "checker.resolver.groups[0].secretName": "a",
                                   "checker.resolver.groups[1].group": "orders",
                                   "checker.resolver.groups[1].secretName": "b"},
}

#: What the refusal must name (the key that is wrong), when not the first key's last part.
BAD_VALUES_NAMED = {
    "replicated without an etcd": "needs an etcd to elect each shard's leader: add --set etcd.enabled=true",
    "bundled etcd and endpoints both": "etcd.enabled and etcd.endpoints are both set",
    "min in-sync above the factor": "minInsyncReplicas",
    "pdb below min in-sync": "maxUnavailable",
    "election poll not below the lease": "election_poll_seconds",
    "cert-manager without an issuer": "tls.certManager.enabled needs tls.certManager.issuerRef.name",
    "etcd endpoint of another scheme": "etcd.endpoints",
    "resolver group without its secret": "secretName",
    "resolver group named twice": "checker.resolver.groups names orders twice",
}


@pytest.mark.parametrize(("case", "sets"), BAD_VALUES.items(), ids=BAD_VALUES.keys())
def test_bad_values_are_rejected(helm_bin: Path, case: str, sets: dict[str, str]) -> None:
    proc = helm(helm_bin, *template_args(sets=sets), check=False)
    assert proc.returncode != 0, f"helm accepted {sets}"
    if case in BAD_VALUES_NAMED:
        assert BAD_VALUES_NAMED[case] in proc.stderr, proc.stderr
    key = next(iter(sets)).split(".")[-1].split("[")[0]
    assert key.split("_")[0].lower() in (proc.stderr + proc.stdout).lower() or "schema" in proc.stderr.lower(), \
        proc.stderr


def test_schema_is_valid_json_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(values)


# ---------------------------------------------------------------------------- layer 2
def _documents() -> list[tuple[str, str]]:
    return [(s, REPLICATED_FLOOR if s in REPLICATED_SCENARIOS and v == KUBE_VERSIONS[0] else v)
            for s in SCENARIOS for v in KUBE_VERSIONS]


@pytest.mark.parametrize("kube_version", ["1.25.0", "1.27.9"])
def test_replicated_shards_need_the_pod_index_label(helm_bin: Path, kube_version: str) -> None:
    """Below 1.28 no pod carries apps.kubernetes.io/pod-index: the chart says so instead of
    starting replicas without an id."""
    proc = helm(helm_bin, *template_args([scenario_file("replicated")], kube_version=kube_version), check=False)
    assert proc.returncode != 0
    assert "1.28" in proc.stderr and "pod-index" in proc.stderr, proc.stderr


@pytest.mark.parametrize(("scenario", "kube_version"), _documents())
def test_rendered_documents_match_kubernetes_schemas(helm_bin: Path, scenario: str, kube_version: str) -> None:
    r = render(helm_bin, [scenario_file(scenario)], kube_version=kube_version)
    checked = 0
    errors = []
    for doc in r.docs:
        if doc["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
            checked += 1
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not errors, "\n".join(errors)
    assert checked >= 10


def test_validation_catches_a_broken_manifest(helm_bin: Path, rendered: dict[str, Rendered]) -> None:
    """The strict validation is not a no-op: an unknown field and a wrong type fail it."""
    sts = json.loads(json.dumps(rendered["minimal"].workload("broker")))
    sts["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["portName"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSIONS[-1], strict=True)
    svc = json.loads(json.dumps(rendered["minimal"].of_kind("Service")[0]))
    svc["spec"]["ports"][0]["port"] = "ten"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(svc, KUBE_VERSIONS[0], strict=True)


# The required fields of the prometheus-operator CRDs (monitoring.coreos.com/v1, as in the
# operator's CRD manifests), and the shapes the chart relies on.
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_META = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1},
                                                               "namespace": {"type": "string"}}}
CRD_SCHEMAS = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
            "spec": {"type": "object", "required": ["selector", "endpoints"], "properties": {
                "jobLabel": {"type": "string"},
                "namespaceSelector": {"type": "object", "properties": {
                    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}},
                    "additionalProperties": False},
                "selector": {"type": "object", "properties": {
                    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "matchExpressions": {"type": "array"}}, "additionalProperties": False},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "properties": {
                        "port": {"type": "string"}, "path": {"type": "string"},
                        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        "interval": _DURATION, "scrapeTimeout": _DURATION}}}}}}},
    # cert-manager.io/v1 Certificate: the fields cert-manager requires, and the names the
    # services are dialed by.
    "Certificate": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"}, "metadata": _META,
            "spec": {"type": "object", "required": ["secretName", "issuerRef", "dnsNames"], "properties": {
                "secretName": {"type": "string", "minLength": 1},
                "commonName": {"type": "string", "maxLength": 64},
                "dnsNames": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                "duration": _DURATION, "renewBefore": _DURATION,
                "usages": {"type": "array", "items": {"enum": [
                    "server auth", "client auth", "digital signature", "key encipherment"]}},
                "privateKey": {"type": "object", "properties": {
                    "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]}, "size": {"type": "integer"},
                    "rotationPolicy": {"enum": ["Always", "Never"]}}},
                "issuerRef": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "minLength": 1}, "kind": {"type": "string"},
                    "group": {"type": "string"}}, "additionalProperties": False}},
                "additionalProperties": False}}},
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
            "spec": {"type": "object", "properties": {"groups": {"type": "array", "items": {
                "type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"],
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": {"type": "string"}, "record": {"type": "string"},
                            "expr": {"type": ["string", "integer"]}, "for": _DURATION,
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
                        "additionalProperties": False}}}}}}}}},
}


def test_crd_kinds_have_their_required_fields(rendered: dict[str, Rendered]) -> None:
    seen = set()
    for doc in [*rendered["ha-monitoring"].docs, *rendered["cert-manager"].docs]:
        if doc["kind"] in CRD_KINDS:
            jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
            seen.add(doc["kind"])
    assert seen == CRD_KINDS


def test_crd_check_catches_a_rule_without_expr(rendered: dict[str, Rendered]) -> None:
    rule = json.loads(json.dumps(rendered["ha-monitoring"].of_kind("PrometheusRule")[0]))
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, CRD_SCHEMAS["PrometheusRule"])


def test_selectors_carry_no_version_labels(rendered: dict[str, Rendered]) -> None:
    for r in rendered.values():
        for d in r.workloads():
            labels = d["spec"]["selector"]["matchLabels"]
            assert not {"helm.sh/chart", "app.kubernetes.io/version"} & set(labels), d["metadata"]["name"]
            assert re.fullmatch(r"[a-z0-9-]+", d["metadata"]["name"])
