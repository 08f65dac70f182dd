"""Fixtures: real txmq processes on ephemeral ports (see tests/support), unique names, and
service logs attached to the report of a failing test (hidden for passing ones); how
``make test`` spreads the tests over its workers (tests/support/lanes.py)."""

from __future__ import annotations

import itertools
import re
import signal
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support import lanes, machinewatch, netns, presets
from tests.support.cluster import Cluster, live_clusters

#: Sub-second timings every test cluster runs with unless the test asks otherwise
#: (tests/support/presets.py).
TEST_BROKER_ENV = presets.BROKER
#: Lines of each service's log attached to a failing test's report.
LOG_LINES_ON_FAILURE = 80

_OFFSETS = pytest.StashKey[dict[int, dict[str, int]]]()
_MACHINE_WATCH = pytest.StashKey["machinewatch.Watch"]()


# ---------------------------------------------------------------------------- clusters
def _make_cluster(workdir: Path, **kwargs: Any) -> Cluster:
    broker_env = {**TEST_BROKER_ENV, **(kwargs.pop("broker_env", None) or {})}
    return Cluster(workdir, broker_env=broker_env, **kwargs)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One name server and one broker shared by the whole session. Tests using it must not
    depend on state other tests leave: use ``unique_name`` for topics and groups."""
    c = _make_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()


#: test_checks.py's and test_explicit_transactions.py's cluster: checks fast and few.
checks_cluster = presets.shared_cluster("checks_cluster", broker_env=presets.CHECKS_BROKER, checker=True,
                                        checker_env=presets.QUICK_CHECKER)
#: test_check_flow.py's and test_aio_sdk.py's cluster: checks again soon, late answers.
flow_cluster = presets.shared_cluster("flow_cluster", broker_env=presets.FLOW_BROKER, checker=True,
                                      checker_env=presets.FLOW_CHECKER)


@pytest.fixture
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster of its own for one test (it may kill, restart or break it)."""
    c = _make_cluster(tmp_path_factory.mktemp("fresh-cluster"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def fresh_cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Cluster]]:
    """``make(brokers=2, broker_env={...}, nameserver_env={...}, nameservers=2, checker=True)``
    starts a cluster with the session's sub-second timings overridden by ``broker_env``;
    every cluster made is stopped at teardown."""
    made: list[Cluster] = []

    def make(**kwargs: Any) -> Cluster:
        c = _make_cluster(tmp_path_factory.mktemp("cluster"), **kwargs)
        made.append(c)
        return c

    make.clusters = made  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        errors = []
        for c in reversed(made):
            try:
                c.stop()
            except Exception as exc:  # noqa: BLE001 - stop the others, then report
                errors.append(exc)
        if errors:
            raise errors[0]


# ---------------------------------------------------------------------------- names
_INVALID = re.compile(r"[^a-zA-Z0-9_-]+")


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name("orders")`` → ``orders-test_send_commit-3f2a9c1d-1``: valid for topics and
    groups ([a-zA-Z0-9_-], at most 127 characters), unique per call and per test run."""
    test = _INVALID.sub("_", request.node.name)[:60]
    run = uuid.uuid4().hex[:8]
    counter = itertools.count(1)

    def make(prefix: str = "t") -> str:
        prefix = _INVALID.sub("_", prefix)[:40] or "t"
        return f"{prefix}-{test}-{run}-{next(counter)}"

    return make


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    try:
        return (yield)
    finally:
        presets.release(nextitem)  # shared clusters the next test does not use


# ---------------------------------------------------------------------------- logs on failure
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Where each running cluster's logs stand as this test begins; a failure shows what
    # the services wrote from here on (clusters started later show from their start).
    item.stash[_OFFSETS] = {id(c): c.log_offsets() for c in live_clusters()}


def _clusters_of(item: pytest.Item) -> list[Cluster]:
    found: list[Cluster] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, Cluster):
            found.append(value)
        for c in getattr(value, "clusters", None) or ():
            if isinstance(c, Cluster):
                found.append(c)
    if not found:
        # A helper may have built a Cluster directly: show every live one.
        found = live_clusters()
    unique: dict[int, Cluster] = {}
    for c in found:
        unique.setdefault(id(c), c)
    return list(unique.values())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        offsets = item.stash.get(_OFFSETS, {})
        for c in _clusters_of(item):
            for name, text in c.logs(LOG_LINES_ON_FAILURE, since=offsets.get(id(c))).items():
                report.sections.append((f"txmq {name} log ({c.workdir / (name + '.log')})",
                                        text or "(nothing logged)"))
    return report


# ---------------------------------------------------------------------------- workers
# Under xdist (make test): each test's work unit (the heavy lane, its module's, a preset's)
# and the order units are handed out in (tests/support/lanes.py).
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lanes.assign(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    lanes.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return lanes.make_scheduler(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    lanes.unconfigure(config)


# ---------------------------------------------------------------------------- last resorts
def pytest_configure(config: pytest.Config) -> None:
    lanes.configure(config)
    # A SIGTERM (CI cancelling the job) becomes a KeyboardInterrupt, so pytest tears the
    # fixtures down and the service processes are stopped instead of orphaned.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, interrupt)


def pytest_sessionstart(session: pytest.Session) -> None:
    # Network namespaces and links a crashed earlier run left behind (its pid is gone).
    netns.cleanup_leftovers()
    if not hasattr(session.config, "workerinput"):  # the controlling process only
        session.config.stash[_MACHINE_WATCH] = machinewatch.Watch().start()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    watch = config.stash.get(_MACHINE_WATCH, None)
    if watch is not None:
        watch.stop()
        terminalreporter.write_line(watch.summary())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Fixture teardown has run by now; anything still alive was leaked by a test.
    for c in live_clusters():
        try:
            c.stop(timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - reported; the other clusters still get stopped
            print(f"conftest: stopping {c!r} failed: {exc}", file=sys.stderr)
