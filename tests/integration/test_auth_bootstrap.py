"""``python -m services.common.auth bootstrap`` (issue 30): the files of a real deployment.
Run as an operator runs it (a process), its credentials load in a real name server (the
administrator's token administers, an application's token is refused, none is
unauthenticated), its Secrets are valid Kubernetes objects, and the chart rendered with its
values mounts exactly those Secrets. It never overwrites a directory that has files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import kubernetes_validate
import pytest
import yaml

from services.common.auth.store import CredentialStore
from tests.chart.chart import RELEASE, helm_binary, render
from tests.support.processes import ServiceProcess
from txmq.v1 import admin_pb2, admin_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def run_bootstrap(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.common.auth", "bootstrap", "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bootstrap") / "creds"
    done = run_bootstrap(out, "--release", "prod", "--namespace", "payments", "--app", "orders-app",
                         "--rocketmq-app", "legacy-app")
    assert done.returncode == 0, done.stderr
    assert "tokens/operator.token" in done.stdout
    return out


def test_every_file_is_private_and_the_store_loads_them(made: Path) -> None:
    files = [p for p in made.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"credentials.yaml", "access-keys.yaml", "secrets.yaml", "values-auth.yaml",
                                       "operator.token", "orders-app.token", "broker.token"}
    for path in [made, made / "tokens", *files]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    creds = CredentialStore([str(made / "credentials.yaml"), str(made / "access-keys.yaml")]).current()
    operator = creds.principal_for_token((made / "tokens" / "operator.token").read_text().strip())
    assert operator is not None and operator.name == "operator" and not operator.service
    broker = creds.principal_for_token((made / "tokens" / "broker.token").read_text().strip())
    assert broker is not None and broker.service
    assert creds.principal_for_certificate(["prod-broker"]).name == "broker"
    assert [k.principal for k in creds.access_keys.values()] == ["legacy-app"]
    # Only digests in the store: no token appears in the files the services mount.
    for token_file in (made / "tokens").iterdir():
        token = token_file.read_text().strip()
        assert token not in (made / "credentials.yaml").read_text()


def test_a_name_server_with_the_files_admits_the_administrator_only(made: Path, tmp_path: Path) -> None:
    proc = ServiceProcess("services.nameserver", {
        "TXMQ_AUTH_FILES": str(made / "credentials.yaml"),
        "TXMQ_AUTH_TOKEN_FILE": str(made / "tokens" / "nameserver.token")}, tmp_path, "nameserver")
    proc.start_and_wait(30)
    try:
        with grpc.insecure_channel(proc.address) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)

            def list_topics(token_name: str | None) -> object:
                metadata = [] if token_name is None else [
                    ("authorization", "Bearer " + (made / "tokens" / f"{token_name}.token").read_text().strip())]
                return admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=5, metadata=metadata)

            list_topics("operator")
            for who, code in (("orders-app", grpc.StatusCode.PERMISSION_DENIED),
                              (None, grpc.StatusCode.UNAUTHENTICATED)):
                with pytest.raises(grpc.RpcError) as refused:
                    list_topics(who)
                assert refused.value.code() == code
    finally:
        proc.stop()


def test_the_secrets_are_valid_and_the_chart_mounts_them(made: Path) -> None:
    secrets = list(yaml.safe_load_all((made / "secrets.yaml").read_text()))
    for doc in secrets:
        kubernetes_validate.validate(doc, "1.33.0", strict=True)
        assert doc["metadata"]["namespace"] == "payments"
    names = {d["metadata"]["name"] for d in secrets}
    assert names == {"prod-auth-credentials", "prod-auth-access-keys", "prod-admin-token",
                     *(f"prod-{s}-token" for s in ("nameserver", "broker", "checker", "proxy"))}
    r = render(helm_binary(), [made / "values-auth.yaml"])
    mounted = {v["secret"]["secretName"] for d in r.docs if d["kind"] in ("StatefulSet", "Deployment")
               for v in d["spec"]["template"]["spec"].get("volumes", []) if "secret" in v
               and not v["secret"]["secretName"].endswith("-tls")}
    # Every Secret bootstrap made for the services is mounted (the admin's token is the
    # operator's, not a pod's); the chart's own generated files are read beside them.
    assert names - {"prod-admin-token"} <= mounted, names - mounted
    assert all(n.startswith(f"{RELEASE}-") for n in mounted - names), mounted - names


def test_it_never_overwrites_credentials(made: Path) -> None:
    before = (made / "credentials.yaml").read_text()
    done = run_bootstrap(made)
    assert done.returncode == 2 and "not empty" in done.stderr
    assert (made / "credentials.yaml").read_text() == before
    bad = run_bootstrap(made.parent / "other", "--app", "Bad Name")
    assert bad.returncode == 2 and "DNS label" in bad.stderr
    assert not os.path.exists(made.parent / "other" / "credentials.yaml")
