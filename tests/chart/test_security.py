"""The chart's security objects: credentials and ACLs from Secrets (tokens to every
component, access keys to the proxy alone), a NetworkPolicy per component, and values that
turn auth on without its Secrets refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .chart import COMPONENTS, Rendered, helm, render, template_args


def container(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]["containers"][0]


def env_of(workload: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(workload).get("env", [])}


def secrets_of(workload: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["secret"]["secretName"] for v in workload["spec"]["template"]["spec"]["volumes"]
            if "secret" in v}


def test_auth_mounts_credentials_everywhere_and_access_keys_in_the_proxy_only(
        rendered: dict[str, Rendered]) -> None:
    chart = rendered["secured"]
    for component in COMPONENTS:
        for workload in chart.workloads(component):
            env = env_of(workload)
            files = env["TXMQ_AUTH_FILES"].split(",")
            assert files[0] == "/etc/txmq/auth/credentials/credentials.yaml"
            assert env["TXMQ_AUTH_TOKEN_FILE"] == "/etc/txmq/auth/token/token"
            secrets = secrets_of(workload)
            assert secrets["auth-credentials"] == "txmq-credentials"
            assert secrets["auth-token"] == f"txmq-token-{component}"
            mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
            # Whole directories, read-only: a Secret update reaches the pod (subPath would not).
            assert all("subPath" not in m and m.get("readOnly") for n, m in mounts.items() if n.startswith("auth-"))
            if component == "proxy":
                assert files[1:] == ["/etc/txmq/auth/access-keys/access-keys.yaml"]
                assert secrets["auth-access-keys"] == "txmq-access-keys"
            else:
                assert len(files) == 1 and "auth-access-keys" not in secrets


def test_auth_is_off_by_default(rendered: dict[str, Rendered]) -> None:
    for workload in rendered["minimal"].workloads():
        env = env_of(workload)
        assert env["TXMQ_AUTH_FILES"] == "" and env["TXMQ_AUTH_TOKEN_FILE"] == ""
        assert not any(n.startswith("auth-") for n in secrets_of(workload))


def test_auth_without_its_secrets_is_refused(helm_bin: Path) -> None:
    proc = helm(helm_bin, *template_args(sets={"auth.enabled": "true"}), check=False)
    assert proc.returncode != 0 and "secretName" in proc.stderr, proc.stderr


def test_a_network_policy_per_component(rendered: dict[str, Rendered]) -> None:
    chart = rendered["secured"]
    policies = {p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p
                for p in chart.of_kind("NetworkPolicy")}
    assert set(policies) == {*COMPONENTS, "etcd"}
    for component in COMPONENTS:
        rules = policies[component]["spec"]["ingress"]
        grpc_port = container(chart.workload(component))["ports"][0]["containerPort"]
        client_rule, metrics_rule, *replication = rules
        assert [p["port"] for p in client_rule["ports"]] == [grpc_port]
        ports = {p["name"]: p["containerPort"] for p in container(chart.workload(component))["ports"]}
        if "replication" in ports:
            # A replicated shard's replication stream: from brokers alone.
            (rule,) = replication
            assert [p["port"] for p in rule["ports"]] == [ports["replication"]]
            assert [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]] \
                == ["broker"]
        else:
            assert replication == []
        # Clients as configured, plus txmq's own pods; nothing else on any other port.
        assert {"namespaceSelector": {"matchLabels": {"txmq-client": "true"}}} in client_rule["from"]
        assert any("podSelector" in peer for peer in client_rule["from"])
        assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}]
    etcd = policies["etcd"]["spec"]["ingress"]
    client, peer, _metrics = etcd
    assert client["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "broker"
    assert peer["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "etcd"


def test_network_policies_can_be_turned_off(helm_bin: Path) -> None:
    assert render(helm_bin, sets={"networkPolicy.enabled": "false"}).of_kind("NetworkPolicy") == []
