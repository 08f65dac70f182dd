"""The chart's security objects: the generated credential file (and the operator's beside
it) mounted into every component, access keys into the proxy alone, a NetworkPolicy per
component that is closed by default, and the sentences refusing values that cannot work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .chart import COMPONENTS, Rendered, helm, render, template_args


def container(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]["containers"][0]


def env_of(workload: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(workload).get("env", [])}


def secrets_of(workload: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["secret"]["secretName"] for v in workload["spec"]["template"]["spec"]["volumes"]
            if "secret" in v}


GENERATED = "/etc/txmq/auth/generated/credentials.yaml"
GENERATED_KEYS = "/etc/txmq/auth/generated-access-keys/access-keys.yaml"


def test_auth_is_on_by_default_with_generated_credentials(helm_bin: Path) -> None:
    chart = render(helm_bin)
    for component in COMPONENTS:
        for workload in chart.workloads(component):
            env = env_of(workload)
            files = env["TXMQ_AUTH_FILES"].split(",")
            secrets = secrets_of(workload)
            assert files == [GENERATED, *([GENERATED_KEYS] if component == "proxy" else [])], component
            assert secrets["auth-generated"] == "txmq-auth"
            assert secrets["auth-token"] == f"txmq-{component}-token"
            assert env["TXMQ_AUTH_TOKEN_FILE"] == "/etc/txmq/auth/token/token"
            if component == "proxy":
                assert secrets["auth-generated-access-keys"] == "txmq-proxy-access-keys"
            else:
                assert not any("access-keys" in n for n in secrets), component
    # Every Secret a pod mounts is rendered by the chart (nothing waits for a Secret nobody made).
    rendered_secrets = {s["metadata"]["name"] for s in chart.of_kind("Secret")}
    for workload in chart.workloads():
        assert set(secrets_of(workload).values()) <= rendered_secrets, workload["metadata"]["name"]


def test_the_operators_files_are_read_beside_the_generated_ones(rendered: dict[str, Rendered]) -> None:
    chart = rendered["secured"]
    for component in COMPONENTS:
        for workload in chart.workloads(component):
            env = env_of(workload)
            files = env["TXMQ_AUTH_FILES"].split(",")
            secrets = secrets_of(workload)
            assert files[:2] == [GENERATED, "/etc/txmq/auth/credentials/credentials.yaml"]
            assert secrets["auth-credentials"] == "txmq-credentials"
            assert secrets["auth-token"] == f"txmq-token-{component}"  # the operator's token
            mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
            # Whole directories, read-only: a Secret update reaches the pod (subPath would not).
            assert all("subPath" not in m and m.get("readOnly") for n, m in mounts.items() if n.startswith("auth-"))
            if component == "proxy":
                assert files[2:] == [GENERATED_KEYS, "/etc/txmq/auth/access-keys/access-keys.yaml"]
                assert secrets["auth-access-keys"] == "txmq-access-keys"
            else:
                assert len(files) == 2 and "auth-access-keys" not in secrets
    # The operator's tokens replace the generated ones: none is rendered for them.
    names = {s["metadata"]["name"] for s in chart.of_kind("Secret")}
    assert not any(n.endswith("-token") for n in names), names


def test_auth_off_is_an_explicit_value(helm_bin: Path) -> None:
    chart = render(helm_bin, sets={"auth.enabled": "false"})
    for workload in chart.workloads():
        env = env_of(workload)
        assert env["TXMQ_AUTH_FILES"] == "" and env["TXMQ_AUTH_TOKEN_FILE"] == ""
        assert not any(n.startswith("auth-") for n in secrets_of(workload))
    assert not [s for s in chart.of_kind("Secret") if s["metadata"]["name"] in ("txmq-auth", "txmq-admin")]


REFUSED = {
    "a token of yours without credentials": (
        {"auth.serviceTokens.secretNames.broker": "mine"},
        "auth.serviceTokens.secretNames.broker names a token of yours, but its principal"),
    "a client named like a service": ({"auth.clients[0].name": "broker"},
                                      'auth.clients[0].name "broker" is already a service identity'),
    "two clients of one name": ({"auth.clients[0].name": "orders", "auth.clients[1].name": "orders"},
                                'auth.clients[1].name "orders" is already auth.clients[0]'),
    "the admin named like a service": ({"auth.admin.name": "proxy"}, 'auth.admin.name "proxy" is the name of'),
    "a Secret of yours beside generated certificates": (
        {"tls.secretNames.broker": "my-broker-tls"},
        "tls.secretNames.broker (my-broker-tls) names a Secret of yours while tls.autoGenerated.enabled"),
    "a topic declared twice": ({"topics[0].name": "orders", "topics[1].name": "orders"},
                               'topics[1]: topic "orders" is declared twice (also topics[0])'),
}


@pytest.mark.parametrize(("sets", "sentence"), REFUSED.values(), ids=REFUSED.keys())
def test_values_that_cannot_work_are_refused_with_a_sentence(helm_bin: Path, sets: dict[str, str],
                                                            sentence: str) -> None:
    proc = helm(helm_bin, *template_args(sets=sets), check=False)
    assert proc.returncode != 0 and sentence in proc.stderr, proc.stderr
    assert "schema" not in proc.stderr.lower()  # a sentence, not a JSON-schema error


def _policies(chart: Rendered) -> dict[str, dict[str, Any]]:
    return {p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p
            for p in chart.of_kind("NetworkPolicy")}


OWN_PODS = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "txmq", "app.kubernetes.io/instance": "txmq"}}}
CLIENT_PODS = {"podSelector": {"matchLabels": {"txmq-client": "true"}}}


def test_network_policies_are_closed_by_default(helm_bin: Path) -> None:
    chart = render(helm_bin)
    policies = _policies(chart)
    assert set(policies) == set(COMPONENTS)
    for component, policy in policies.items():
        client_rule, metrics_rule = policy["spec"]["ingress"]
        # txmq's own pods and this namespace's pods labelled txmq-client=true: nothing else.
        assert client_rule["from"] == [OWN_PODS, CLIENT_PODS], component
        assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}]


def test_a_network_policy_per_component(rendered: dict[str, Rendered]) -> None:
    chart = rendered["secured"]
    policies = _policies(chart)
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
        # Clients as configured, plus txmq's own pods and the labelled client pods.
        assert client_rule["from"] == [OWN_PODS, CLIENT_PODS,
                                       {"namespaceSelector": {"matchLabels": {"txmq-client": "true"}}}]
        assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}]
    etcd = policies["etcd"]["spec"]["ingress"]
    client, peer, _metrics = etcd
    assert client["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "broker"
    assert peer["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "etcd"


def test_opening_the_client_ports_is_an_explicit_value(helm_bin: Path) -> None:
    for policy in render(helm_bin, sets={"networkPolicy.allowExternal": "true"}).of_kind("NetworkPolicy"):
        client_rule, metrics_rule = policy["spec"]["ingress"]
        assert "from" not in client_rule  # from anywhere
        assert metrics_rule["from"]  # /metrics stays restricted


def test_network_policies_can_be_turned_off(helm_bin: Path) -> None:
    assert render(helm_bin, sets={"networkPolicy.enabled": "false"}).of_kind("NetworkPolicy") == []
