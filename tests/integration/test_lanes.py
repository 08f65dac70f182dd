"""How ``make test`` spreads tests over workers (tests/support/lanes.py), shown on a suite of
its own run with pytest-xdist as ``make test`` runs ours: heavy tests one after another on
one worker, a module's fixture and a shared preset's cluster set up once, every test run
once, and nothing changed without ``-n``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CONFTEST = '''
from typing import Any

import pytest

from tests.support import lanes

lanes.SHARED_FIXTURES["shared"] = "preset-shared"


def pytest_configure(config):
    lanes.configure(config)


def pytest_collection_modifyitems(config, items):
    lanes.assign(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    lanes.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return lanes.make_scheduler(config, log)


def pytest_unconfigure(config):
    lanes.unconfigure(config)


def _write(test, event):
    """Appends one JSON line (test, event, worker, time) to the run's log."""
    import json, os, time
    with open(os.environ["LANES_LOG"], "a") as fh:
        fh.write(json.dumps({"test": test, "event": event, "time": time.monotonic(),
                             "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}) + "\\n")


@pytest.fixture(scope="session")
def shared(request):
    _write(request.node.nodeid, "shared-setup")
    return "shared"


@pytest.fixture(scope="session")
def spark():
    return "a JVM"


@pytest.fixture
def record(request):
    return lambda event: _write(request.node.nodeid, event)
'''

HEAVY = '''
import time
import pytest

pytestmark = pytest.mark.heavy


@pytest.mark.parametrize("i", range(4))
def test_heavy(record, i):
    record("start")
    time.sleep(0.3)
    record("end")
'''

MODULE = '''
import pytest


@pytest.fixture(scope="module")
def module_cluster(request):
    from conftest import _write
    _write(request.node.nodeid, "module-setup")
    return object()


@pytest.mark.parametrize("i", range(5))
def test_reads_the_module_cluster(module_cluster, record, i):
    record("run")
'''

PRESET = '''
import pytest


@pytest.mark.parametrize("i", range(3))
def test_a(shared, record, i):
    record("run")
'''

PRESET_TOO = '''
def test_b(shared, record):
    record("run")
'''

SPARK = '''
import time
import pytest


@pytest.mark.parametrize("i", range(2))
def test_spark(spark, record, i):
    record("start")
    time.sleep(0.3)
    record("end")
'''

SINGLES = '''
import time
import pytest


@pytest.mark.parametrize("i", range(8))
def test_single(record, i):
    record("run")
    time.sleep(0.1)
'''


def _suite(root: Path) -> None:
    (root / "t").mkdir()
    for name, text in {"conftest.py": CONFTEST, "test_heavy.py": HEAVY, "test_module.py": MODULE,
                       "test_preset.py": PRESET, "test_preset_too.py": PRESET_TOO, "test_singles.py": SINGLES, "test_spark.py": SPARK}.items():
        (root / "t" / name).write_text(textwrap.dedent(text))
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    heavy: the heavy lane\n"
                                     "addopts = -p no:cacheprovider --dist loadgroup --no-loadscope-reorder\n")


def _run(root: Path, *args: str, lanes: str = "1") -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    log = root / f"log-{len(list(root.glob('log-*')))}.jsonl"
    # The inner run's own options only (not those of the run that runs this test).
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH", "TXMQ_"))},
           "PYTHONPATH": str(REPO), "LANES_LOG": str(log), "TXMQ_HEAVY_LANES": lanes}
    out = subprocess.run([sys.executable, "-m", "pytest", "t", "-q", *args], cwd=root, env=env,
                         capture_output=True, text=True, timeout=180)
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return out, events


def _spans(events: list[dict], marker: str) -> list[tuple[float, float]]:
    mine = [e for e in events if marker in e["test"]]
    return sorted((s["time"], e["time"]) for s in mine if s["event"] == "start"
                  for e in mine if e["event"] == "end" and e["test"] == s["test"])


def _one_at_a_time(spans: list[tuple[float, float]]) -> bool:
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.timeout(240)
def test_heavy_tests_never_overlap_and_shared_fixtures_start_once_on_workers(tmp_path: Path) -> None:
    _suite(tmp_path)
    out, events = _run(tmp_path, "-n", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "23 passed" in out.stdout, out.stdout

    heavy = [e for e in events if "test_heavy" in e["test"] or "test_spark" in e["test"]]
    assert len({e["worker"] for e in heavy}) == 1, heavy  # one lane, Spark's tests in it
    spans = sorted(_spans(events, "test_heavy") + _spans(events, "test_spark"))
    assert len(spans) == 6 and _one_at_a_time(spans), spans

    assert [e["event"] for e in events].count("module-setup") == 1
    assert len({e["worker"] for e in events if "test_module.py" in e["test"]}) == 1
    assert [e["event"] for e in events].count("shared-setup") == 1
    assert len({e["worker"] for e in events if "test_preset" in e["test"]}) == 1

    ran = [e["test"] for e in events if e["event"] in ("run", "start")]
    assert len(ran) == len(set(ran)) == 23  # each test once
    # The heavy lane is handed out first: its worker runs nothing before it.
    lane = heavy[0]["worker"]
    first = min((e for e in events if e["worker"] == lane), key=lambda e: e["time"])
    assert "test_heavy" in first["test"], first


def test_without_workers_nothing_changes(tmp_path: Path) -> None:
    _suite(tmp_path)
    out, events = _run(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "23 passed" in out.stdout
    order = [e["test"].split("::")[0] for e in events if e["event"] in ("run", "start")]
    # The collection's order (files alphabetically), not the heavy lane first.
    assert order == sorted(order), order
    assert {e["worker"] for e in events} == {"main"}


@pytest.mark.timeout(240)
def test_two_heavy_lanes_put_spark_beside_the_rest_each_one_at_a_time(tmp_path: Path) -> None:
    _suite(tmp_path)
    out, events = _run(tmp_path, "-n", "3", lanes="2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "23 passed" in out.stdout, out.stdout
    heavy_workers = {e["worker"] for e in events if "test_heavy" in e["test"]}
    spark_workers = {e["worker"] for e in events if "test_spark" in e["test"]}
    assert len(heavy_workers) == len(spark_workers) == 1 and heavy_workers != spark_workers, events
    assert _one_at_a_time(_spans(events, "test_heavy")) and _one_at_a_time(_spans(events, "test_spark"))
