"""Every shell and Python block of README.md and docs/ runs, so none can rot (the
convention: docs/writing-docs.md). Python blocks and shell blocks share one small cluster (a
name server, a broker, a checker; its address in $TXMQ_NAMESERVER, which the blocks use);
a block marked `background` (`make run`) runs in a network namespace of its own, so the fixed
ports it binds never meet another test's, until the line it names, then gets Ctrl-C.
Also: links between the pages (and the READMEs of deploy/, pipeline/ and protos/)
resolve, headings for their #fragments too, and the README stays a front door."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.postgres import PostgresInstance, fresh_database
from tests.support.waiting import wait_until

from .blocks import REPO, Block, blocks, every_block, pages

BLOCKS = every_block()
RUNNABLE = [b for b in BLOCKS if b.kind]
#: The only blocks that may be skipped, each with its reason.
MAY_SKIP = {"README.md"}


@pytest.fixture(scope="session")
def docs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster the blocks talk to (a RocketMQ proxy too, in $TXMQ_PROXY): short check
    timings, so that a block's undecided transaction is checked within a second or two."""
    timings = {"TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1", "TXMQ_CHECK_INTERVAL_SECONDS": "1"}
    c = Cluster(tmp_path_factory.mktemp("docs-cluster"), checker=True, broker_env=timings, proxies=1)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def docs_database() -> Iterator[str]:
    """A PostgreSQL database the blocks may write to (anchored transactions), in
    $TXMQ_DECISIONS_DSN."""
    instance = PostgresInstance(max_connections=50)
    try:
        yield fresh_database(instance, "docs")
    finally:
        instance.stop()


def _env(cluster: Cluster | None, tmp: Path, dsn: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp)
    if cluster is not None:
        env["TXMQ_NAMESERVER"] = cluster.nameserver_address
        env["TXMQ_PROXY"] = cluster.proxy_addresses[0]
    if dsn:
        env["TXMQ_DECISIONS_DSN"] = dsn
    return env


def _run_background(block: Block, tmp: Path) -> None:
    """Starts the block in a network namespace of its own, waits for its `until` line,
    sends Ctrl-C (SIGINT to its process group) and expects a clean stop."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("a background block runs in a network namespace: needs root and ip (make netns-tools)")
    until = re.compile(block.options["until"])
    name = f"txmq-{os.getpid()}-{800 + int(uuid.uuid4().int % 100)}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True, capture_output=True)
        env = {**_env(None, tmp), "DATA_DIR": str(tmp / "data")}
        proc = subprocess.Popen(["ip", "netns", "exec", name, "bash", "-euo", "pipefail", "-c", block.code],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        assert proc.stdout is not None
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(
            line.decode(errors="replace") for line in iter(proc.stdout.readline, b"")), daemon=True)
        reader.start()
        try:
            wait_until(lambda: any(until.search(line) for line in list(output)) or proc.poll() is not None,
                       timeout=float(block.options.get("timeout") or 180), interval=0.2,
                       message=lambda: f"{block.id}: no {until.pattern!r}:\n{''.join(output)[-4000:]}")
            assert proc.poll() is None, \
                f"{block.id} exited {proc.returncode} before {until.pattern!r}:\n{''.join(output)[-4000:]}"
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
            reader.join(timeout=10)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode in (0, 130, -signal.SIGINT), \
            f"{block.id} stopped with {proc.returncode}:\n{''.join(output)[-4000:]}"
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=pytest.mark.timeout(
    int(float(b.options.get("timeout") or 60)) + 120)) for b in RUNNABLE])
def test_the_block_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if "skip" in block.options:
        assert block.options["skip"], f"{block.id}: a skipped block says why (skip=\"...\")"
        assert str(block.path.relative_to(REPO)) in MAY_SKIP, f"{block.id}: only {MAY_SKIP} may skip a block"
        pytest.skip(block.options["skip"])
    if "background" in block.options:
        _run_background(block, tmp_path)
        return
    cluster = request.getfixturevalue("docs_cluster")
    dsn = request.getfixturevalue("docs_database") if "TXMQ_DECISIONS_DSN" in block.code else ""
    timeout = float(block.options.get("timeout") or 60)
    if block.kind == "python":
        args, stdin = [sys.executable, "-"], block.code
    else:
        args, stdin = ["bash", "-euo", "pipefail", "-c", block.code], ""
    proc = subprocess.run(args, input=stdin, cwd=REPO, env=_env(cluster, tmp_path, dsn), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (f"{block.id} ({block.language}) exited {proc.returncode}:\n{block.code}\n"
                                  f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def test_blocks_are_found_and_every_block_says_what_it_is() -> None:
    assert len(RUNNABLE) >= 20, [b.id for b in RUNNABLE]
    untagged = [b.id for b in BLOCKS if not b.language]
    assert not untagged, f"blocks without a language (```text for an illustration): {untagged}"


def test_the_readme_is_a_front_door() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 210
    first = blocks(REPO / "README.md")[0]
    # The two commands, exactly (.ci/run calls make test).
    assert [line.split("#")[0].strip() for line in first.code.splitlines()] == ["make run", "make test"]
    for needed in ("pip install ./sdk", "docs/README.md"):
        assert needed in text, needed


_LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s#]*)(?:#([^)\s]*))?\)")
_FENCED = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1", re.S | re.M)
#: Pages outside docs/ whose links are checked too (their blocks are not run).
OTHER_PAGES = ["deploy/docker/README.md", "deploy/helm/txmq/README.md", "pipeline/README.md",
               "protos/STATUS.md", "protos/txmq/v1/DECISIONS.md"]


def _anchors(page: Path) -> set[str]:
    """The fragments GitHub gives the page's headings (lower case, punctuation dropped,
    spaces as hyphens)."""
    found = set()
    for line in _FENCED.sub("", page.read_text()).splitlines():
        if m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return found


def test_links_between_pages_resolve() -> None:
    broken = []
    for doc in [*pages(), *(REPO / p for p in OTHER_PAGES)]:
        for target, fragment in _LINK.findall(_FENCED.sub("", doc.read_text())):
            dest = doc.parent / target if target else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
            elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
                broken.append(f"{doc.relative_to(REPO)} -> {target}#{fragment}: no such heading")
    assert not broken, broken
