"""The bundled etcd's authentication (issue 30): a replicated render with TLS (the default)
carries the Job that sets etcd's auth up at install and upgrade, for the brokers' certificate
names and the prefix the brokers use; booted as a process against a real etcd with mutual
TLS — the rendered command with only the endpoint and the Secret's mount rewritten, as the
pod would run it — it leaves txmq's keys to the brokers' certificate: an application's
certificate from the same CA is refused. With TLS off no Job renders (there is no
certificate to take users from)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from aetcd import rpc

from tests.support.certs import CertificateAuthority, channel_credentials
from tests.support.etcd import EtcdProcess

from .chart import REPO, render, scenario_file

pytestmark = pytest.mark.timeout(120)


def auth_job(r) -> dict:
    jobs = [d for d in r.docs if d["kind"] == "Job"
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == "etcd-auth"]
    assert len(jobs) <= 1
    return jobs[0] if jobs else {}


def test_the_rendered_job_locks_txmqs_keys_to_the_brokers(helm_bin: Path, tmp_path: Path) -> None:
    r = render(helm_bin, [scenario_file("replicated")])
    job = auth_job(r)
    assert job, "no etcd auth Job in the replicated render"
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"post-install", "post-upgrade"}
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = list(container["command"])
    assert command[:4] == ["python", "-m", "services.common.etcd", "setup-auth"]
    args = dict(zip(command[4::2], command[5::2]))
    broker = next(r.workloads("broker"))
    broker_env = r.configmap_env(broker, broker["spec"]["template"]["spec"]["containers"][0])
    assert args["--prefix"] == broker_env["TXMQ_ETCD_PREFIX"]
    assert args["--broker-user"] == "txmq-broker" and args["--admin-user"] == "txmq-etcd"  # cert-manager's CNs
    assert args["--endpoint"].startswith("https://")
    # Its pods may reach etcd's client port: the NetworkPolicy admits them beside the brokers.
    (policy,) = [d for d in r.docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "txmq-etcd"]
    client = policy["spec"]["ingress"][0]["from"]
    assert {"etcd-auth", "broker"} <= {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in client}

    # Boot it: etcd with the members' certificate, the Job's command against it.
    ca = CertificateAuthority(tmp_path / "pki")
    member, broker_cert, app = (ca.issue(n) for n in (args["--admin-user"], args["--broker-user"], "orders-app"))
    etcd = EtcdProcess(tmp_path / "etcd", cert_file=member.cert_file, key_file=member.key_file,
                       ca_file=ca.cert_file).start()
    try:
        mount = container["volumeMounts"][0]["mountPath"]
        files = {f"{mount}/ca.crt": ca.cert_file, f"{mount}/tls.crt": member.cert_file,
                 f"{mount}/tls.key": member.key_file}
        local = [sys.executable] + [files.get(a, a) for a in command[1:]]
        local[local.index("--endpoint") + 1] = etcd.endpoint
        done = subprocess.run(local, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        again = subprocess.run(local, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr  # idempotent: every upgrade runs it again

        address = etcd.endpoint.removeprefix("https://")
        key = (args["--prefix"].rstrip("/") + "/shards/txmq-broker-0/leader").encode()
        with grpc.secure_channel(address, channel_credentials(ca.cert_file, broker_cert)) as ch:
            rpc.KVStub(ch).Put(rpc.PutRequest(key=key, value=b"{}"), timeout=5)
        with grpc.secure_channel(address, channel_credentials(ca.cert_file, app)) as ch:
            with pytest.raises(grpc.RpcError) as refused:
                rpc.KVStub(ch).Put(rpc.PutRequest(key=key, value=b"{}"), timeout=5)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as refused:
                rpc.KVStub(ch).Range(rpc.RangeRequest(key=key), timeout=5)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        etcd.stop()


def test_no_job_without_tls_or_without_the_bundled_etcd(helm_bin: Path) -> None:
    assert not auth_job(render(helm_bin, [scenario_file("replicated")], sets={"tls.enabled": "false"}))
    assert not auth_job(render(helm_bin, [scenario_file("replicated-external-etcd")]))
    assert not auth_job(render(helm_bin, [scenario_file("replicated")], sets={"etcd.auth.enabled": "false"}))
