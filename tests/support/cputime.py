"""How much CPU each test takes, to tell a heavy test from one that only waits
(docs/testing.md, "Mark what keeps a core busy"): a pytest plugin, off unless asked for::

    .venv/bin/python -m pytest -p tests.support.cputime tests/chart/test_images.py

After the run it prints every test's CPU seconds — this process's, every process it started
and reaped (services, etcd, a Spark driver run as a user) and the containers of the private
Docker daemon (its ``cpuacct`` cgroup) — beside its wall time, and their ratio: the cores
it kept busy. Run it without ``-n`` (each worker would count its own tests, and nothing
reaches the controller) and on a quiet machine (a loaded one stretches the wall time,
not the CPU). A process still running when a test ends is counted when it is reaped: a
module's shared cluster lands on the test after which it stops; and a grandchild its parent
never waits for is not counted at all (the JVM of a Spark driver run as a user runs it, the
session's JVM until the session ends): Spark's tests are heavy by rule, not by this count.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

#: Where the private Docker daemon (tools/images.sh) accounts its containers' CPU.
CONTAINERS_CPUACCT = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")


def cpu_seconds(containers: Path = CONTAINERS_CPUACCT) -> float:
    """CPU seconds so far of this process, of the processes it reaped and of the containers."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    try:
        total += int(containers.read_text()) / 1e9
    except (OSError, ValueError):
        pass  # no such daemon here
    return total


@dataclass
class Ledger:
    """Every measured test: (node id, wall seconds, CPU seconds)."""

    cpu: Callable[[], float] = cpu_seconds
    clock: Callable[[], float] = time.monotonic
    rows: list[tuple[str, float, float]] = field(default_factory=list)

    def measure(self, nodeid: str) -> Iterator[None]:
        wall, cpu = self.clock(), self.cpu()
        try:
            yield
        finally:
            self.rows.append((nodeid, self.clock() - wall, self.cpu() - cpu))

    def lines(self, limit: int | None = None) -> list[str]:
        """The tests by CPU seconds, most first."""
        ordered = sorted(self.rows, key=lambda r: r[2], reverse=True)[:limit]
        return [f"{cpu:8.2f}s cpu {wall:8.2f}s wall {cpu / wall if wall > 0 else 0.0:5.2f} cores  {nodeid}"
                for nodeid, wall, cpu in ordered]


_LEDGER = pytest.StashKey[Ledger]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LEDGER] = Ledger()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    measuring = item.config.stash[_LEDGER].measure(item.nodeid)
    next(measuring)
    try:
        return (yield)
    finally:
        next(measuring, None)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    ledger = config.stash.get(_LEDGER, None)
    if ledger is None or not ledger.rows:
        return
    terminalreporter.write_sep("=", "CPU per test (tests/support/cputime.py): this process, what it reaped, "
                                    "the containers")
    for line in ledger.lines():
        terminalreporter.write_line(line)
