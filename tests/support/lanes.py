"""How ``make test`` spreads the suite over worker processes (pytest-xdist, ``--dist
loadgroup``) on a machine of two cores, most of whose tests wait (for a check interval, a
lease, a fail-over) rather than compute.

Every test lands in exactly one *work unit*, a set of tests one worker runs in a row:

- **the heavy lane** (``@pytest.mark.heavy``, every test under :data:`HEAVY_DIRECTORIES`
  and every test using a fixture of :data:`HEAVY_FIXTURES`; see :data:`SPARK` for a second
  lane): tests that keep a core busy for long — chaos and fault runs
  against replicated shards, load and burst tests, Spark jobs, the container images. They
  are one unit, so they run one after another on one worker and never overlap each other,
  while the other workers run the wait-bound tests beside them. The unit is sent first: it is
  the longest.
- **a module's unit**: the tests of one module that use a module-, class- or package-scoped
  fixture (a module's own cluster), so that fixture starts once, on one worker.
- **a preset's unit**: the tests (of any module) using one of the shared session clusters
  of :data:`SHARED_FIXTURES` (tests/support/presets.py), so each starts once per run.
- **every other test is a unit of its own**, handed to whichever worker is free.

A test's own ``@pytest.mark.xdist_group(name)`` puts it in that group instead of all of the
above. Outside xdist (``-n 0``, a plain ``pytest tests/x.py``) nothing here changes a run:
no groups, and the collection's order.

How: each worker computes every test's group while it collects (:func:`assign`, which also
sorts the collection) and writes them to a file of the run; the controller's scheduler
(:class:`LaneScheduling`, xdist's load-by-scope with these groups as the scopes) reads them
when it hands the units out. (xdist's own ``--dist loadgroup`` carries the group in the node
id, which pytest 9.2 no longer lets a plugin change.)

Order under xdist: the heavy lane first, then modules' and presets' units, then single
tests, the unit tier last (hundreds of tests of milliseconds: they fill the workers' gaps at
the end of a run instead of leaving one worker running a long test alone).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

import pytest
from xdist.scheduler.loadscope import LoadScopeScheduling

#: The xdist group of the heavy lane.
HEAVY = "heavy"
#: With ``TXMQ_HEAVY_LANES=2`` (``make test HEAVY_LANES=2``) Spark's tests are a second
#: heavy lane of their own, beside the first (each still one test at a time): on two cores
#: a Spark driver and a chaos run then share the machine. The default is one lane.
SPARK = "heavy-spark"
#: Fixtures that make a test heavy by using them (one JVM per worker at most: Spark).
HEAVY_FIXTURES = frozenset({"spark"})
#: Directories whose every test is heavy: each pipeline test runs Spark jobs (on the
#: session's JVM; two start a driver of their own, as a user runs the audit job).
HEAVY_DIRECTORIES = ("tests/pipeline/",)
#: Session-scoped shared clusters: the tests using one run on one worker, so it starts once
#: (name → its group; filled by tests/support/presets.py's ``shared_cluster``).
SHARED_FIXTURES: dict[str, str] = {}
_SHARING_SCOPES = ("module", "class", "package")
#: The workerinput key naming the run's directory of group files.
_DIR_KEY = "txmq_lanes_dir"


def is_worker(config: pytest.Config) -> bool:
    """True in an xdist worker process (where the groups and the order matter)."""
    return hasattr(config, "workerinput")


def _scoped_fixtures(item: pytest.Item) -> Iterable[tuple[str, str]]:
    """(name, scope) of every fixture in the item's closure."""
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the closure
    if info is None:
        return
    for name, defs in info.name2fixturedefs.items():
        if defs:
            yield name, defs[-1].scope


def group_of(item: pytest.Item) -> str | None:
    """The group this test belongs to (None: a unit of its own)."""
    explicit = item.get_closest_marker("xdist_group")
    if explicit is not None:
        return str(explicit.args[0] if explicit.args else explicit.kwargs.get("name", "default"))
    names = set(getattr(item, "fixturenames", ()))
    if item.nodeid.startswith(HEAVY_DIRECTORIES) or names & HEAVY_FIXTURES:
        return SPARK if heavy_lanes() == 2 else HEAVY
    if item.get_closest_marker("heavy") is not None:
        return HEAVY
    if any(scope in _SHARING_SCOPES for _name, scope in _scoped_fixtures(item)):
        return item.nodeid.split("::", 1)[0]
    for name in sorted(names):
        if name in SHARED_FIXTURES:
            return SHARED_FIXTURES[name]
    return None


def heavy_lanes() -> int:
    """1 (the default) or 2 (``TXMQ_HEAVY_LANES``: Spark's tests a lane of their own)."""
    value = os.environ.get("TXMQ_HEAVY_LANES", "1")
    if value not in ("1", "2"):
        raise pytest.UsageError(f"TXMQ_HEAVY_LANES={value!r}: 1 or 2")
    return int(value)


def _rank(item: pytest.Item, group: str | None) -> int:
    if group in (HEAVY, SPARK):
        return 0
    if item.nodeid.startswith("tests/unit/"):
        return 3
    return 1 if group is not None else 2


def assign(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker: sorts the collection into the order above (stable: within a rank, the
    collection's order) and writes every grouped test's group for the controller."""
    if not is_worker(config):
        return
    groups = {item.nodeid: group_of(item) for item in items}
    items.sort(key=lambda it: _rank(it, groups[it.nodeid]))
    directory = config.workerinput.get(_DIR_KEY)  # type: ignore[attr-defined]
    if directory:
        worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
        path = Path(directory) / f"{worker}.json"
        path.with_suffix(".tmp").write_text(json.dumps({k: v for k, v in groups.items() if v is not None}))
        path.with_suffix(".tmp").replace(path)


# ---------------------------------------------------------------------------- the controller
class LaneScheduling(LoadScopeScheduling):
    """xdist's load-by-scope, a test's scope being its group (:func:`group_of`, as the workers
    wrote it) or, for a test of no group, the test itself."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._directory = Path(config.stash[_DIRECTORY])
        self._groups: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        # Every worker has written its file before it reported its collection, and
        # the scheduler asks for scopes only once all collections are in.
        files = sorted(self._directory.glob("*.json"))
        if not files:
            raise RuntimeError(f"no worker wrote its test groups into {self._directory}")
        groups = [json.loads(f.read_text()) for f in files]
        if any(g != groups[0] for g in groups):
            raise RuntimeError(f"the workers computed different test groups ({[f.name for f in files]})")
        return groups[0]

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = self._load()
        group = self._groups.get(nodeid)
        return f"group:{group}" if group is not None else nodeid


_DIRECTORY = pytest.StashKey[str]()


def configure(config: pytest.Config) -> None:
    """In the controller of a distributed run: the directory the workers' group files go to."""
    distributing = config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))
    if distributing and not is_worker(config):
        config.stash[_DIRECTORY] = tempfile.mkdtemp(prefix="txmq-lanes-")


def configure_node(node: Any) -> None:
    node.workerinput[_DIR_KEY] = node.config.stash[_DIRECTORY]


def make_scheduler(config: pytest.Config, log: Any) -> LaneScheduling | None:
    """The scheduler of ``--dist loadgroup`` (pyproject.toml's default); another ``--dist``
    keeps xdist's own."""
    if config.getvalue("dist") == "loadgroup" and _DIRECTORY in config.stash:
        return LaneScheduling(config, log)
    return None


def unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_DIRECTORY, None)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
