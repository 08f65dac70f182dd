"""tests/support/cputime.py: a test that computes shows about a core, one that sleeps none,
and the report lists the tests by CPU seconds."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.cputime import Ledger, cpu_seconds


def _run(ledger: Ledger, nodeid: str, body) -> None:
    measuring = ledger.measure(nodeid)
    next(measuring)
    body()
    next(measuring, None)


def _spin(cpu: float) -> None:
    """Computes until it has used ``cpu`` seconds of CPU (however long a loaded machine takes)."""
    end = time.process_time() + cpu
    while time.process_time() < end:
        sum(range(1000))


def test_a_computing_test_shows_its_cpu_and_a_sleeping_one_none(tmp_path: Path) -> None:
    ledger = Ledger(cpu=lambda: cpu_seconds(containers=tmp_path / "absent"))
    _run(ledger, "t::spins", lambda: _spin(0.2))
    _run(ledger, "t::sleeps", lambda: time.sleep(0.3))
    (spun, spun_wall, spun_cpu), (slept, slept_wall, slept_cpu) = ledger.rows
    assert (spun, slept) == ("t::spins", "t::sleeps")
    assert spun_cpu >= 0.2 and spun_wall > 0
    assert slept_wall >= 0.3 and slept_cpu < 0.1


def test_the_report_lists_tests_by_cpu_most_first_with_the_cores_they_kept_busy() -> None:
    ledger = Ledger(rows=[("t::waits", 40.0, 4.0), ("t::chaos", 20.0, 30.0), ("t::instant", 0.0, 0.0)])
    lines = ledger.lines()
    assert [line.split()[-1] for line in lines] == ["t::chaos", "t::waits", "t::instant"]
    assert "1.50 cores" in lines[0] and "0.10 cores" in lines[1] and "0.00 cores" in lines[2]
    assert ledger.lines(limit=1) == lines[:1]


def test_the_containers_count_when_the_daemon_accounts_them(tmp_path: Path) -> None:
    usage = tmp_path / "cpuacct.usage"
    usage.write_text("0\n")
    without = cpu_seconds(containers=usage)
    usage.write_text(f"{int(5e9)}\n")  # the containers took 5 s of CPU meanwhile
    assert cpu_seconds(containers=usage) - without >= 5.0
