"""Holding and failing a service process's fsyncs, for durability tests.

``holdsync.c`` beside this file, built with the machine's C compiler and loaded into the
service processes with LD_PRELOAD, makes fdatasync(2) and fsync(2) obey a control
directory: :meth:`SyncGate.hold` makes every sync wait (``held()`` lists the files whose
sync is waiting), :meth:`SyncGate.fail` makes them fail with EIO. The services run their
real code: only the system call is delayed or failed, as a slow or broken disk would.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("holdsync.c")


def build(out_dir: Path) -> Path:
    """Compiles the preload library into ``out_dir``; returns its path."""
    library = out_dir / "holdsync.so"
    compiler = os.environ.get("CC", "cc")
    result = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(library),
                             str(SOURCE), "-ldl"], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"cannot build {SOURCE.name} with {compiler}:\n{result.stderr}")
    return library


class SyncGate:
    """The control directory of the processes started while :meth:`install` is in effect."""

    def __init__(self, library: Path, directory: Path) -> None:
        self.library = library
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every service process started from now on (for the rest of the test) loads the
        gate: ``ServiceProcess`` passes this process's environment on."""
        monkeypatch.setenv("LD_PRELOAD", str(self.library))
        monkeypatch.setenv("HOLDSYNC_DIR", str(self.directory))

    def hold(self) -> None:
        (self.directory / "hold").touch()

    def release(self) -> None:
        (self.directory / "hold").unlink(missing_ok=True)

    def fail(self) -> None:
        (self.directory / "fail").touch()

    def heal(self) -> None:
        (self.directory / "fail").unlink(missing_ok=True)

    def held(self) -> list[str]:
        """The paths of the files whose sync is waiting now."""
        paths = []
        for marker in self.directory.glob("held-*"):
            try:
                paths.append(marker.read_text())
            except FileNotFoundError:
                continue  # that sync went on meanwhile
        return paths

    def holding_wal(self) -> bool:
        """Whether a sync of a RocksDB write-ahead log (``*.log``) is waiting."""
        return any(path.endswith(".log") for path in self.held())
