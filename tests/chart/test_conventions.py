"""The conventions SREs expect of a chart (bitnami, prometheus-community): extra env,
envFrom, volumes, mounts, sidecars and init containers on every component; the global
image registry, image digests and numeric tags; an existing claim for the broker; HPAs for
the proxy and checker; ServiceMonitor relabelings; the proxy LoadBalancer's source ranges;
every alert with a runbook_url into the chart README, and the consumer/disk alerts. Each
value rendered, validated against the Kubernetes schemas, and refused when malformed."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from .chart import CHART, COMPONENTS, Rendered, helm, render, template_args

KUBE_VERSION = "1.37.0"
CA = {
    "extraEnv": [{"name": "SSL_CERT_FILE", "value": "/etc/ca/ca.crt"}],
    "extraEnvFrom": [{"secretRef": {"name": "extra-settings"}}],
    "extraVolumes": [{"name": "ca", "configMap": {"name": "ca-bundle"}}],
    "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ca", "readOnly": True}],
    "sidecars": [{"name": "shipper", "image": "busybox:1.36"}],
    "initContainers": [{"name": "wait", "image": "busybox:1.36", "command": ["true"]}],
}
TXMQ_COMPONENTS = ["nameserver", "broker", "checker", "proxy"]


def render_values(helm_bin: Path, tmp_path: Path, values: dict, **kwargs) -> Rendered:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    return render(helm_bin, [f], kube_version=KUBE_VERSION, **kwargs)


def validate(r: Rendered) -> None:
    errors = []
    for doc in r.docs:
        if doc["kind"] in {"ServiceMonitor", "PrometheusRule"}:
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert not errors, "\n".join(errors)


def pod(w: dict) -> dict:
    return w["spec"]["template"]["spec"]


def test_extra_env_volumes_sidecars_and_init_containers_reach_every_component(helm_bin, tmp_path):
    r = render_values(helm_bin, tmp_path, {c: CA for c in TXMQ_COMPONENTS})
    validate(r)
    for component in TXMQ_COMPONENTS:
        spec = pod(r.workload(component))
        main = spec["containers"][0]
        assert main["name"] == component
        assert {"name": "SSL_CERT_FILE", "value": "/etc/ca/ca.crt"} in main["env"]
        assert {"secretRef": {"name": "extra-settings"}} in main["envFrom"]
        assert "configMapRef" in main["envFrom"][0]  # the chart's own settings stay first
        assert {"name": "ca", "mountPath": "/etc/ca", "readOnly": True} in main["volumeMounts"]
        assert {"name": "ca", "configMap": {"name": "ca-bundle"}} in spec["volumes"]
        assert [c["name"] for c in spec["containers"]] == [component, "shipper"]
        assert [c["name"] for c in spec["initContainers"]] == ["wait"]
    # Off by default: nothing injected.
    plain = render(helm_bin, kube_version=KUBE_VERSION)
    for component in TXMQ_COMPONENTS:
        spec = pod(plain.workload(component))
        assert "initContainers" not in spec and len(spec["containers"]) == 1


def test_image_registry_digest_and_numeric_tag(helm_bin, tmp_path):
    digest = "sha256:" + "ab" * 32
    r = render_values(helm_bin, tmp_path, {"global": {"imageRegistry": "mirror.example/acme"},
                                           "image": {"registry": "ignored.example"},
                                           "broker": {"image": {"digest": digest}}})
    images = {c: pod(r.workload(c))["containers"][0]["image"] for c in TXMQ_COMPONENTS}
    assert images["broker"] == f"mirror.example/acme/txmq/broker@{digest}"
    assert images["checker"] == "mirror.example/acme/txmq/checker:0.1.0"
    # --set broker.image.tag=9 parses as a number: accepted, rendered as the tag "9".
    numeric = render(helm_bin, sets={"broker.image.tag": "9"}, kube_version=KUBE_VERSION)
    assert pod(numeric.workload("broker"))["containers"][0]["image"] == "txmq/broker:9"
    bad = helm(helm_bin, *template_args(sets={"broker.image.digest": "latest"}), check=False)
    assert bad.returncode != 0 and "digest" in bad.stderr


def test_broker_existing_claim(helm_bin, tmp_path):
    r = render_values(helm_bin, tmp_path, {"broker": {"replicaCount": 1, "persistence": {"existingClaim": "mine"}}})
    validate(r)
    sts = r.workload("broker")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "mine"}} in pod(sts)["volumes"]
    refused = helm(helm_bin, *template_args(sets={"broker.persistence.existingClaim": "mine",
                                                  "broker.replicaCount": "2"}), check=False)
    assert refused.returncode != 0 and "existingClaim" in refused.stderr


@pytest.mark.parametrize("component", ["proxy", "checker"])
def test_autoscaling_of_the_stateless_components(helm_bin, tmp_path, component):
    r = render_values(helm_bin, tmp_path, {component: {"autoscaling": {
        "enabled": True, "minReplicas": 3, "maxReplicas": 7, "targetMemoryUtilizationPercentage": 80}}})
    validate(r)
    [hpa] = r.of_kind("HorizontalPodAutoscaler")
    deployment = r.workload(component)
    assert "replicas" not in deployment["spec"]  # the HPA owns it
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": deployment["kind"],
                                             "name": deployment["metadata"]["name"]}
    assert deployment["kind"] == {"checker": "StatefulSet", "proxy": "Deployment"}[component]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 7)
    assert {m["resource"]["name"]: m["resource"]["target"]["averageUtilization"]
            for m in hpa["spec"]["metrics"]} == {"cpu": 75, "memory": 80}
    assert render(helm_bin, kube_version=KUBE_VERSION).of_kind("HorizontalPodAutoscaler") == []
    bad = helm(helm_bin, *template_args(sets={f"{component}.autoscaling.minReplicas": "0"}), check=False)
    assert bad.returncode != 0


def test_service_monitor_relabelings(helm_bin, tmp_path):
    relabel = [{"targetLabel": "cluster", "replacement": "eu-1"}]
    drop = [{"action": "drop", "sourceLabels": ["__name__"], "regex": "go_.*"}]
    r = render_values(helm_bin, tmp_path, {"metrics": {"serviceMonitor": {
        "enabled": True, "relabelings": relabel, "metricRelabelings": drop}}})
    [endpoint] = r.of_kind("ServiceMonitor")[0]["spec"]["endpoints"]
    assert endpoint["relabelings"] == relabel and endpoint["metricRelabelings"] == drop
    replicated = render_values(helm_bin, tmp_path, {"etcd": {"enabled": True}, "broker": {"replicationFactor": 3},
                                                    "metrics": {"serviceMonitor": {"enabled": True,
                                                                                   "relabelings": relabel}}})
    [endpoint] = replicated.of_kind("ServiceMonitor")[0]["spec"]["endpoints"]
    assert [x.get("targetLabel") for x in endpoint["relabelings"]] == ["shard", "cluster"]


def test_proxy_load_balancer_source_ranges(helm_bin, tmp_path):
    r = render_values(helm_bin, tmp_path, {"proxy": {"service": {"type": "LoadBalancer",
                                                                 "loadBalancerSourceRanges": ["10.0.0.0/8"]}}})
    validate(r)
    service = next(s for s in r.of_kind("Service") if s["spec"].get("type") == "LoadBalancer")
    assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    bad = helm(helm_bin, *template_args(sets={"proxy.service.loadBalancerSourceRanges[0]": "everyone"}), check=False)
    assert bad.returncode != 0


def test_every_alert_has_a_runbook_section_in_the_readme(helm_bin, tmp_path):
    r = render_values(helm_bin, tmp_path, {"metrics": {"prometheusRule": {"enabled": True}},
                                           "etcd": {"enabled": True}, "broker": {"replicationFactor": 3}})
    rules = [rule for g in r.of_kind("PrometheusRule")[0]["spec"]["groups"] for rule in g["rules"]]
    names = {rule["alert"] for rule in rules}
    assert {"TxmqConsumerLagHigh", "TxmqDeadLetters", "TxmqBrokerDiskLow"} <= names
    readme = (CHART / "README.md").read_text()
    anchors = {re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
               for h in re.findall(r"^#+ (.+)$", readme, re.M)}
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url.endswith("README.md#" + rule["alert"].lower()), url
        assert rule["alert"].lower() in anchors, f"README.md has no runbook section for {rule['alert']}"
    assert {"txmq_consumer_lag_seconds", "txmq_dead_letters", "txmq_disk_free_bytes"} <= {
        m for rule in rules for m in re.findall(r"txmq_[a-z_]+", rule["expr"])}


def test_components_listed_are_the_ones_tested():
    assert set(TXMQ_COMPONENTS) == set(COMPONENTS)
