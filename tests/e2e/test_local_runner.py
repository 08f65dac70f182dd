"""`make run` as a user runs it: `python -m services.local` starts every service as its own
process, runs the transactional demo and stops cleanly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_SECONDS = 120


def _run_local(data_dir: Path, *flags: str, env_extra: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")} | (env_extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.local", "--data-dir", str(data_dir), "--ports", "auto", *flags],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the runner stop its services; kill it only if that fails too.
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"services.local did not finish within {RUN_TIMEOUT_SECONDS}s\n"
                    f"stdout:\n{out}\nstderr:\n{err}\n{_service_logs(data_dir)}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _service_logs(data_dir: Path) -> str:
    return "\n".join(f"--- {log.name} ---\n{log.read_text(errors='replace')[-6000:]}"
                     for log in sorted(data_dir.glob("*.log")))


def _services_started_in(data_dir: Path) -> list[psutil.Process]:
    """Service processes still alive that the runner started for ``data_dir``."""
    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = p.info["cmdline"] or []
            environ = p.info["environ"] or {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "-m" in cmdline and environ.get("TXMQ_READY_FILE", "").startswith(str(data_dir)):
            found.append(p)
    return found


@pytest.mark.timeout(RUN_TIMEOUT_SECONDS + 60)
def test_demo_consumes_exactly_the_committed_message_and_stops_cleanly(tmp_path):
    data_dir = tmp_path / "data"

    result = _run_local(data_dir, "--exit-after-demo")

    context = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{_service_logs(data_dir)}"
    assert result.returncode == 0, context
    out = result.stdout
    # The three outcomes as the producer saw them.
    assert re.search(r"^demo: sent order-1: local transaction COMMIT -> COMMITTED\b", out, re.M), context
    assert re.search(r"^demo: sent order-2: local transaction ROLLBACK -> ROLLED_BACK\b", out, re.M), context
    assert re.search(r"^demo: sent order-3: local transaction UNKNOWN -> PREPARED\b", out, re.M), context
    # The UNKNOWN one is resolved by the checker's check a few seconds later.
    assert re.search(r"^demo: the checker asked about order-3 \d+\.\d+s after it was sent \(check \d+\): "
                     r"the local transaction says COMMIT$", out, re.M), context
    assert re.search(r"^demo: order-3 resolved by the check: PREPARED -> COMMITTED\b", out, re.M), context
    # The consumer: the committed messages, once each, and nothing else.
    consumed = re.findall(r"^demo: consumed (\S+?):", out, re.M)
    assert sorted(consumed) == ["order-1", "order-3"], context
    assert "FAILED" not in out, context
    assert "order-2 (run" not in out, context
    # Every service was stopped with SIGTERM and exited cleanly, and none is left behind.
    stopped = dict(re.findall(r"^txmq local: stopped (\S+) \(exit code (-?\d+)\)", out, re.M))
    assert stopped.get("nameserver") == "0" and stopped.get("broker-0") == "0", context
    # The RocketMQ proxy ran beside them (make run gives the official clients an endpoint).
    assert re.search(r"^txmq local: RocketMQ 5 clients: endpoints 127\.0\.0\.1:\d+", out, re.M), context
    assert stopped.get("proxy") == "0", context
    assert _services_started_in(data_dir) == []
    assert (data_dir / "broker-0").is_dir()


@pytest.mark.timeout(90)
def test_sigterm_stops_every_service_and_exits_zero(tmp_path):
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.local", "--data-dir", str(data_dir), "--ports", "auto", "--no-demo"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the runner says when it is up; read until then
            lines.append(line)
            if line.startswith("services are running:"):
                break
        assert lines and lines[-1].startswith("services are running:"), "".join(lines)
        children = _services_started_in(data_dir)
        assert {c.pid for c in children}, "no service processes found"
        proc.terminate()
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    output = "".join(lines) + rest
    assert proc.returncode == 0, output
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert alive == [], output


@pytest.mark.timeout(RUN_TIMEOUT_SECONDS + 60)
def test_replicated_run_serves_the_demo_from_a_shard_of_three_replicas(tmp_path):
    data_dir = tmp_path / "data"
    result = _run_local(data_dir, "--exit-after-demo", "--replication-factor", "3")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{_service_logs(data_dir)}"
    assert "demo: ok: the consumer received the committed messages only" in result.stdout
    assert re.search(r"broker-0-r\d .*\(leader\)", result.stdout), result.stdout
    for r in range(3):
        assert (data_dir / f"broker-0-r{r}").is_dir() and f"stopped broker-0-r{r} (exit code 0)" in result.stdout, \
            f"{result.stdout}\n{_service_logs(data_dir)}"
    assert (data_dir / "etcd.log").exists()
    assert _services_started_in(data_dir) == []
    # Open and loopback-only, says the banner; etcd's authentication on (issue 30): started
    # again over the run's data, etcd refuses a client without the brokers' password.
    assert "127.0.0.1 only" in result.stdout and "OPEN: no authentication" in result.stdout
    assert "etcd authentication on" in result.stdout
    _etcd_keeps_its_authentication(data_dir)


def _etcd_keeps_its_authentication(data_dir: Path) -> None:
    import grpc
    from aetcd import rpc

    from services.common.etcd import EtcdProcess

    passwords = data_dir / "etcd-auth"
    assert all(p.stat().st_mode & 0o077 == 0 for p in passwords.iterdir())
    etcd = EtcdProcess(data_dir).start()
    try:
        with grpc.insecure_channel(etcd.endpoint) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                rpc.KVStub(channel).Put(rpc.PutRequest(key=b"/txmq/shards/broker-0/leader", value=b"{}"), timeout=10)
            assert "user name is empty" in (refused.value.details() or "")
            token = rpc.AuthStub(channel).Authenticate(rpc.AuthenticateRequest(
                name="txmq-broker", password=(passwords / "etcd-broker.password").read_text().strip()),
                timeout=10).token
            found = rpc.KVStub(channel).Range(rpc.RangeRequest(key=b"/txmq/shards/broker-0/isr"), timeout=10,
                                              metadata=[("token", token)]).kvs
            assert found, "the shard's in-sync set is under the brokers' prefix"
    finally:
        etcd.stop()


@pytest.mark.timeout(RUN_TIMEOUT_SECONDS + 60)
def test_with_tls_settings_every_service_serves_tls_and_the_demo_runs_over_it(tmp_path):
    """docs/howto/tls-auth.md: TXMQ_TLS_* exported before `make run` turn TLS (mutual) on."""
    from tests.support.certs import CertificateAuthority

    ca = CertificateAuthority(tmp_path / "pki")
    cert = ca.issue("local")
    data_dir = tmp_path / "data"
    result = _run_local(data_dir, "--exit-after-demo", env_extra={
        "TXMQ_TLS_CERT_FILE": cert.cert_file, "TXMQ_TLS_KEY_FILE": cert.key_file,
        "TXMQ_TLS_CA_FILE": ca.cert_file, "TXMQ_TLS_CLIENT_AUTH": "require"})
    context = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{_service_logs(data_dir)}"
    assert result.returncode == 0, context
    # order-3 (UNKNOWN) is committed by the checker's check, over mutual TLS too.
    assert sorted(re.findall(r"^demo: consumed (\S+?):", result.stdout, re.M)) == ["order-1", "order-3"], context
    serving = [line for log in data_dir.glob("*.log") for line in log.read_text().splitlines()
               if '"msg": "serving"' in line]
    assert len(serving) >= 3 and all('"tls": true' in line for line in serving), serving
