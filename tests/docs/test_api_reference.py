"""The SDK's API reference (``make docs``: tools/apidocs.py, pdoc) builds from the
docstrings without a warning, with a page per public module, both flavours documented."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "apidocs.py"


def _apidocs():
    spec = importlib.util.spec_from_file_location("apidocs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_builds_without_warnings(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "api")], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr
    pages = {p.relative_to(tmp_path / "api").as_posix() for p in (tmp_path / "api").rglob("*.html")}
    assert {"txmq.html", "txmq/aio.html", "txmq/anchored.html", "txmq/errors.html"} <= pages
    aio = (tmp_path / "api" / "txmq" / "aio.html").read_text()
    for name in ("AsyncTransactionProducer", "AsyncTransaction", "AsyncPushConsumer", "AsyncAdmin",
                 "AsyncSimpleConsumer", "begin_transaction"):
        assert name in aio, name
    assert "send_in_transaction" in (tmp_path / "api" / "txmq.html").read_text()


def test_a_warning_fails_the_build(tmp_path, monkeypatch):
    (tmp_path / "brokendoc.py").write_text(textwrap.dedent('''
        """A module whose annotation names nothing pdoc can resolve."""
        from __future__ import annotations

        def f(x: NoSuchType) -> None:
            """Takes an x."""
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = _apidocs().build(tmp_path / "out", ("brokendoc",))
    assert problems and "NoSuchType" in " ".join(problems)
