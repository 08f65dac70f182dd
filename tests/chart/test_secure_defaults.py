"""A default install comes up secure, and says so (issue 31, the chart half of issue 30):
what the chart generates is what the services read (the credential files parse with the
services' own parser, each token's digest is its principal's, each certificate chains to the
chart's CA and names what it is dialled by), declared topics become a hook Job of CLI calls,
every pod has requests, the production values render, and the release notes are true for
every combination of TLS, auth, proxy, network and registry settings."""

from __future__ import annotations

import base64
import itertools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from services.common.auth.store import hash_token, parse

from .chart import CHART, COMPONENTS, Rendered, helm, render, scenario_file


def _data(secret: dict[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def _secrets(r: Rendered) -> dict[str, dict[str, Any]]:
    return {s["metadata"]["name"]: s for s in r.of_kind("Secret")}


def _openssl(*args: str, stdin: bytes | None = None) -> str:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("openssl is not installed: run `make openssl`")
    out = subprocess.run([binary, *args], input=stdin, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


def test_the_generated_credentials_are_what_the_services_read(helm_bin: Path) -> None:
    r = render(helm_bin)
    secrets = _secrets(r)
    files = [("credentials.yaml", yaml.safe_load(_data(secrets["txmq-auth"], "credentials.yaml"))),
             ("access-keys.yaml", yaml.safe_load(_data(secrets["txmq-proxy-access-keys"], "access-keys.yaml")))]
    credentials = parse(files)  # the services' own parser: it raises on anything they would refuse
    for component in COMPONENTS:
        token = _data(secrets[f"txmq-{component}-token"], "token").decode()
        assert len(token) >= 40
        principal = credentials.principal_for_token(token)
        assert principal is not None and principal.name == component and principal.service
    admin = secrets["txmq-admin"]
    principal = credentials.principal_for_token(_data(admin, "token").decode())
    assert principal is not None and principal.name == "admin" and not principal.service
    # The admin may do everything, through the proxy too (its access key signs).
    (rule,) = [r for r in credentials.rules if r.principal == "admin"]
    assert rule.actions == {"publish", "subscribe", "check", "admin-read", "admin-write"}
    key = credentials.access_keys[_data(admin, "accessKey").decode()]
    assert key.principal == "admin" and key.secret == _data(admin, "secretKey").decode()
    # Only digests in the file every component mounts; the secrets stay in the proxy's file.
    text = _data(secrets["txmq-auth"], "credentials.yaml").decode()
    assert _data(admin, "token").decode() not in text and hash_token(_data(admin, "token").decode()) in text
    assert _data(admin, "secretKey").decode() not in text


def test_the_generated_certificates_chain_to_the_chart_ca_and_name_what_is_dialled(helm_bin: Path,
                                                                                   tmp_path: Path) -> None:
    r = render(helm_bin, [scenario_file("replicated")])  # the bundled etcd's certificate too
    secrets = _secrets(r)
    ca = tmp_path / "ca.crt"
    ca.write_bytes(_data(secrets["txmq-ca"], "tls.crt"))
    assert "CA:TRUE" in _openssl("x509", "-in", str(ca), "-noout", "-text")
    for component in (*COMPONENTS, "etcd", "admin"):
        secret = secrets[f"txmq-{component}-tls"]
        assert secret["type"] == "kubernetes.io/tls"
        assert _data(secret, "ca.crt") == _data(secrets["txmq-ca"], "tls.crt")
        cert = tmp_path / f"{component}.crt"
        cert.write_bytes(_data(secret, "tls.crt"))
        assert f"{cert}: OK" in _openssl("verify", "-CAfile", str(ca), str(cert))
        text = _openssl("x509", "-in", str(cert), "-noout", "-text", "-subject")
        assert "TLS Web Server Authentication, TLS Web Client Authentication" in text, component
        assert f"CN = txmq-{component}" in text or f"CN=txmq-{component}" in text, text
        if component != "admin":
            headless = f"txmq-{component}-headless.txmq-test.svc.cluster.local"
            assert f"DNS:*.{headless}" in text and f"DNS:txmq-{component}.txmq-test.svc" in text, text
        # The key is the certificate's.
        key = _data(secret, "tls.key")
        assert _openssl("pkey", "-pubout", stdin=key) == _openssl("x509", "-noout", "-pubkey", "-in", str(cert))


def test_declared_clients_get_credentials_and_their_rules(rendered: dict[str, Rendered]) -> None:
    r = rendered["clients-topics"]
    secrets = _secrets(r)
    credentials = parse([("credentials.yaml", yaml.safe_load(_data(secrets["txmq-auth"], "credentials.yaml"))),
                         ("access-keys.yaml", yaml.safe_load(_data(secrets["txmq-proxy-access-keys"],
                                                                   "access-keys.yaml")))])
    for name in ("orders", "staging-app"):
        secret = secrets[f"txmq-client-{name}"]
        principal = credentials.principal_for_token(_data(secret, "token").decode())
        assert principal is not None and principal.name == name
        assert credentials.access_keys[_data(secret, "accessKey").decode()].principal == name
        assert credentials.principal_for_certificate([f"txmq-client-{name}"]).name == name
        assert f"txmq-client-{name}-tls" in secrets
    rules = {(rule.principal, str(rule.resource), rule.namespace): rule.actions for rule in credentials.rules}
    assert rules[("orders", "topic:orders", None)] == {"publish", "subscribe"}
    assert rules[("staging-app", "cluster", "staging")] == {"publish", "subscribe", "check"}
    # More names on the proxy's certificate: a DNS name and an address.
    proxy = _data(secrets["txmq-proxy-tls"], "tls.crt")
    text = _openssl("x509", "-noout", "-ext", "subjectAltName", stdin=proxy)
    assert "DNS:mq.example.com" in text and "IP Address:203.0.113.7" in text


def test_declared_topics_are_a_hook_job_of_cli_calls(rendered: dict[str, Rendered]) -> None:
    r = rendered["clients-topics"]
    (job,) = r.of_kind("Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    calls = [c["command"] + c["args"] for c in pod["initContainers"]]
    assert calls == [
        ["python", "-m", "txmq", "topic", "create", "orders", "--type", "normal", "--queues", "8", "--exist-ok"],
        ["python", "-m", "txmq", "topic", "create", "payments", "--type", "fifo", "--queues", "8", "--exist-ok"],
        ["python", "-m", "txmq", "topic", "create", "orders", "--type", "normal", "--queues", "0",
         "--namespace", "staging", "--exist-ok"]]
    broker_image = r.workload("broker")["spec"]["template"]["spec"]["containers"][0]["image"]
    for c in [*pod["initContainers"], *pod["containers"]]:
        assert c["image"] == broker_image  # the broker image carries the CLI
        env = {e["name"]: e for e in c["env"]}
        assert env["TXMQ_NAMESERVER"]["value"] == "txmq-nameserver.txmq-test.svc.cluster.local:9876"
        assert env["TXMQ_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "txmq-admin", "key": "token"}
        assert env["TXMQ_TLS_CERT_FILE"]["value"] == "/etc/txmq/tls/tls.crt"
        assert c["securityContext"]["readOnlyRootFilesystem"] and c["resources"]["requests"]
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}["tls"] == "txmq-admin-tls"
    assert pod["restartPolicy"] == "OnFailure" and job["spec"]["backoffLimit"] >= 1


def test_no_topics_no_job(helm_bin: Path) -> None:
    assert render(helm_bin).of_kind("Job") == []


def test_every_pod_has_requests_by_default(rendered: dict[str, Rendered]) -> None:
    for scenario in ("minimal", "replicated"):
        for w in rendered[scenario].docs:
            if w["kind"] in ("StatefulSet", "Deployment"):
                (c,) = w["spec"]["template"]["spec"]["containers"]
                assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], \
                    w["metadata"]["name"]


def test_the_production_values_render_valid_and_replicated(helm_bin: Path) -> None:
    r = render(helm_bin, [CHART / "values-production.yaml"], sets={"global.imageRegistry": "registry.example.com/acme"})
    for doc in r.docs:
        if doc["kind"] not in ("ServiceMonitor", "PrometheusRule", "Certificate"):
            kubernetes_validate.validate(doc, "1.33.0", strict=True)
    shards = list(r.workloads("broker"))
    assert len(shards) == 3 and all(s["spec"]["replicas"] == 3 for s in shards)
    assert r.of_kind("PrometheusRule") and r.of_kind("ServiceMonitor") and r.of_kind("NetworkPolicy")
    assert all(w["spec"]["template"]["spec"]["containers"][0]["image"].startswith("registry.example.com/acme/txmq/")
               for w in r.workloads())
    assert shards[0]["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]


# ---------------------------------------------------------------------------- NOTES.txt
@pytest.fixture(scope="module")
def notes_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chart whose NOTES.txt is rendered into a ConfigMap (helm prints the
    notes only on install, which needs a cluster): the same template, the same values."""
    chart = tmp_path_factory.mktemp("notes") / "txmq"
    shutil.copytree(CHART, chart)
    (chart / "notes-under-test.txt").write_text((chart / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes-under-test}\ndata:\n  notes: |\n"
        "    {{- tpl (.Files.Get \"notes-under-test.txt\") . | nindent 4 }}\n")
    return chart


def notes(helm_bin: Path, chart: Path, sets: dict[str, str]) -> str:
    args = ["template", "txmq", str(chart), "--namespace", "txmq-test", "--show-only",
            "templates/zz-notes-under-test.yaml"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return yaml.safe_load(helm(helm_bin, *args).stdout)["data"]["notes"]


TLS_MODES = {"generated": {}, "certManager": {"tls.certManager.enabled": "true", "tls.certManager.issuerRef.name": "ca"},
             "secrets": {"tls.autoGenerated.enabled": "false"}, "off": {"tls.enabled": "false"}}
NETWORK = {"closed": {}, "allowExternal": {"networkPolicy.allowExternal": "true"},
           "off": {"networkPolicy.enabled": "false"}}


@pytest.mark.parametrize("tls", TLS_MODES)
def test_the_notes_are_true_for_every_combination(helm_bin: Path, notes_chart: Path, tls: str) -> None:
    combinations = itertools.product((True, False), (True, False), NETWORK)
    for i, (auth, proxy, network) in enumerate(combinations):
        registry = i % 2 == 0  # set and not set, each against half of the others
        sets = {**TLS_MODES[tls], **NETWORK[network], "auth.enabled": str(auth).lower(),
                "proxy.enabled": str(proxy).lower()}
        if registry:
            sets["global.imageRegistry"] = "registry.example.com/acme"
        text = notes(helm_bin, notes_chart, sets)
        where = f"{sets}\n{text}"
        # Where the images come from.
        assert ("pulled from registry.example.com/acme" in text) == registry, where
        assert ("WARNING: no registry is set" in text) == (not registry), where
        # TLS as it is.
        assert ("WARNING: TLS is off" in text) == (tls == "off"), where
        assert ("TLS on every port" in text) == (tls != "off"), where
        assert ("the chart's own CA" in text) == (tls == "generated"), where
        assert ("cert-manager" in text) == (tls == "certManager"), where
        # Auth as it is, and how to read the admin credential.
        assert ("WARNING: authentication is off" in text) == (not auth), where
        assert ("get secret txmq-admin -o jsonpath='{.data.token}'" in text) == auth, where
        # What the network lets in.
        assert ("WARNING: NetworkPolicies are off" in text) == (network == "off"), where
        assert ("WARNING: networkPolicy.allowExternal=true" in text) == (network == "allowExternal"), where
        assert ("labelled\n  txmq-client=true" in text) == (network == "closed"), where
        # The proxy: only when it runs, with what its clients need.
        assert ("RocketMQ 5 clients" in text) == proxy, where
        if proxy:
            assert ("unsigned requests are refused" in text) == auth, where
            assert ("in plaintext" in text) == (tls == "off"), where
            assert ("deployment/txmq-proxy" in text)
        assert "statefulset/txmq-checker" in text and "deployment/txmq-checker" not in text
        assert "plaintext, no credentials" not in text  # what the old notes said whatever the settings
