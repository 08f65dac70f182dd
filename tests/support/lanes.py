"""How ``make test`` spreads the suite over worker processes (pytest-xdist, ``--dist
loadgroup``) on a machine of two cores, most of whose tests wait (for a check interval, a
lease, a fail-over) rather than compute.

Every test lands in exactly one *work unit*, a set of tests one worker runs in a row:

- **the heavy lane** (``@pytest.mark.heavy``, every test under :data:`HEAVY_DIRECTORIES`
  and every test using a fixture of :data:`HEAVY_FIXTURES`): tests that keep a core busy for long — chaos and fault runs
  against replicated shards, load and burst tests, Spark jobs, the container images. They
  are one unit, so they run one after another on one worker and never overlap each other,
  while the other workers run the wait-bound tests beside them. The unit is sent first: it is
  the longest.
- **a module's unit**: the tests of one module that use a module-, class- or package-scoped
  fixture (a module's own cluster), so that fixture starts once, on one worker.
- **a preset's unit**: the tests (of any module) using one of the shared session clusters
  of :data:`SHARED_FIXTURES` (tests/support/presets.py), so each starts once per run.
- **every other test is a unit of its own**, handed to whichever worker is free.

A test's own ``@pytest.mark.xdist_group(name)`` is left as it is (it overrides all of the
above). Outside xdist (``-n 0``, a plain ``pytest tests/x.py``) nothing here changes a run:
the groups are inert and the order is the collection's.

Order under xdist: the heavy lane first, then modules' and presets' units, then single
tests, the unit tier last (hundreds of tests of milliseconds: they fill the workers' gaps at
the end of a run instead of leaving one worker running a long test alone).
"""

from __future__ import annotations

from typing import Iterable

import pytest

#: The xdist group of the heavy lane.
HEAVY = "heavy"
#: Fixtures that make a test heavy by using them (one JVM per worker at most: Spark).
HEAVY_FIXTURES = frozenset({"spark"})
#: Directories whose every test is heavy: each pipeline test starts Spark (the session's
#: JVM, or a driver of its own as a user runs the audit job: ~15-45 s of CPU each).
HEAVY_DIRECTORIES = ("tests/pipeline/",)
#: Session-scoped shared clusters: the tests using one run on one worker, so it starts once
#: (name → its group; filled by tests/support/presets.py's fixtures).
SHARED_FIXTURES: dict[str, str] = {}
_SHARING_SCOPES = ("module", "class", "package")


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
    """The xdist group this test belongs to (None: a unit of its own)."""
    if item.get_closest_marker("heavy") is not None or item.nodeid.startswith(HEAVY_DIRECTORIES):
        return HEAVY
    names = set(getattr(item, "fixturenames", ()))
    if names & HEAVY_FIXTURES:
        return HEAVY
    path = item.nodeid.split("::", 1)[0]
    if any(scope in _SHARING_SCOPES for _name, scope in _scoped_fixtures(item)):
        return path
    for name in sorted(names):
        if name in SHARED_FIXTURES:
            return SHARED_FIXTURES[name]
    return None


def _rank(item: pytest.Item, group: str | None) -> int:
    if group == HEAVY:
        return 0
    if item.nodeid.startswith("tests/unit/"):
        return 3
    return 1 if group is not None else 2


def assign(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test with its group and sorts the collection into the order above
    (stable: within a rank, the collection's order). Only under xdist."""
    if not is_worker(config):
        return
    ranks: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            ranks[item.nodeid] = _rank(item, "explicit")
            continue
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        ranks[item.nodeid] = _rank(item, group)
    items.sort(key=lambda it: ranks[it.nodeid])
