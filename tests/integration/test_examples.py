"""Every example in examples/ run as a user runs it (``python examples/X.py --nameserver``)
against real processes; each exits 0 only when what it claims held (see its docstring).
``transaction_producer.py`` and ``simple_consumer.py`` are run by test_sdk_flows.py,
``anchored_orders.py`` by test_anchored_integrations.py (it needs PostgreSQL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import txmq

from services.common.auth.store import hash_token
from tests.support import presets
from tests.support.certs import CertificateAuthority
from tests.support.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
#: Run elsewhere (see the module docstring), or here with a cluster of their own.
ELSEWHERE = {"transaction_producer.py", "simple_consumer.py", "anchored_orders.py", "tls_token.py",
             "offset_reset.py"}
PLAIN = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_") and p.name not in ELSEWHERE)


@pytest.fixture
def checked(checks_cluster: Cluster) -> Cluster:
    """test_checks.py's shared cluster (tests/conftest.py): each example has its own topic."""
    return checks_cluster


def run_example(name: str, nameserver: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TXMQ_NAMESERVER": nameserver}
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_there_are_at_least_ten_examples_in_both_flavours():
    names = [p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")]
    assert len(names) >= 10
    assert sum(n.startswith("aio_") for n in names) >= 3


@pytest.mark.parametrize("name", PLAIN)
def test_example_runs(checked, unique_name, name):
    done = run_example(name, checked.nameserver_address, "--topic", unique_name("ex"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip()


def test_offset_reset_example(checked, unique_name):
    """Written for the offset reset of issue 32 item 1 (the ops branch): until this SDK has
    ``Admin.reset_offsets`` it says so and exits 2."""
    done = run_example("offset_reset.py", checked.nameserver_address, "--topic", unique_name("ex"))
    expected = 0 if hasattr(txmq.Admin, "reset_offsets") else 2
    assert done.returncode == expected, done.stdout + done.stderr


# --- TLS and a bearer token -------------------------------------------------------------------

TOKENS = {name: f"token-of-{name}-0123456789abcdef" for name in ("nameserver", "broker", "checker", "operator",
                                                                  "shop")}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    """TLS on every link (servers asking no client certificate) and bearer tokens: the
    services' own, the operator's, and ``shop``'s, allowed its topic and groups alone."""
    workdir = tmp_path_factory.mktemp("examples-tls")
    pki = CertificateAuthority(workdir / "pki")
    creds = workdir / "credentials.json"
    services = ("nameserver", "broker", "checker")
    creds.write_text(json.dumps({
        "principals": {name: {"service": name in services, "tokens": [hash_token(token)]}
                       for name, token in TOKENS.items()},
        "acl": [
            {"principal": "operator", "resource": "cluster", "actions": ["admin-read", "admin-write", "subscribe"]},
            {"principal": "shop", "resource": "topic:shop-orders", "actions": ["publish", "subscribe", "admin-write"]},
            {"principal": "shop", "resource": "producer_group:shop", "actions": ["check"]},
            {"principal": "shop", "resource": "consumer_group:shop-consumer", "actions": ["subscribe"]},
        ]}))
    env = {}
    for service in services:
        token_file = workdir / f"{service}.token"
        token_file.write_text(TOKENS[service] + "\n")
        env[service] = {"TXMQ_AUTH_FILES": str(creds), "TXMQ_AUTH_TOKEN_FILE": str(token_file),
                        "TXMQ_TLS_CLIENT_AUTH": "none"}
    (workdir / "shop.token").write_text(TOKENS["shop"] + "\n")
    c = Cluster(workdir, nameserver_env=env["nameserver"], broker_env={**presets.BROKER, **env["broker"]},
                checker=True, checker_env={**presets.CHECKER, **env["checker"]}, tls=pki, token=TOKENS["operator"])
    try:
        yield c, workdir
    finally:
        c.stop()


@pytest.mark.parametrize("flavour", [[], ["--asyncio"]], ids=["sync", "asyncio"])
def test_tls_token_example(secured, flavour):
    cluster, workdir = secured
    assert cluster.ca is not None
    args = ["--topic", "shop-orders", "--group", "shop", "--ca-file", str(cluster.ca.cert_file),
            "--token-file", str(workdir / "shop.token"), *flavour]
    done = run_example("tls_token.py", cluster.nameserver_address, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    # The same without the token is refused: the example's success is the token's.
    (workdir / "nobody.token").write_text("a-token-nobody-has-0123456789\n")
    refused = run_example("tls_token.py", cluster.nameserver_address,
                          *[a if a != str(workdir / "shop.token") else str(workdir / "nobody.token") for a in args])
    assert refused.returncode != 0 and "UnauthenticatedError" in refused.stderr, refused.stderr[-2000:]
