"""docs/anchored-transactions.md runs as written: its ``sh`` and ``python`` blocks, in
order, against a live txmq (``$TXMQ_NAMESERVER``) and a PostgreSQL database
(``$TXMQ_DECISIONS_DSN``), each block a process of its own that must exit 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_anchored import checked, pg  # noqa: F401 - fixtures
from tests.support.postgres import fresh_database

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "anchored-transactions.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
pytestmark = pytest.mark.timeout(240)


def blocks() -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in BLOCK.findall(PAGE.read_text()) if lang in ("sh", "bash", "python")]


def test_the_page_has_runnable_blocks():
    kinds = [lang for lang, _ in blocks()]
    assert kinds.count("python") >= 5 and kinds.count("sh") >= 2


def test_every_block_runs_as_written(checked, pg, tmp_path):
    env = {**os.environ, "TXMQ_NAMESERVER": checked.nameserver_address, "TXMQ_DECISIONS_DSN": fresh_database(pg),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    for i, (lang, body) in enumerate(blocks()):
        script = tmp_path / f"block{i}.{'py' if lang == 'python' else 'sh'}"
        script.write_text(body)
        argv = [sys.executable, str(script)] if lang == "python" else ["bash", "-euo", "pipefail", str(script)]
        done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"block {i} ({lang}):\n{body}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
