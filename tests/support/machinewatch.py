"""What the machine had left while the suite ran: the most tasks (threads) alive at once,
from /proc/loadavg, and the least memory available, from /proc/meminfo, sampled once a
second by the controlling pytest process and printed in the terminal summary.

Why: a CI run once failed on `pthread_create failed: Resource temporarily unavailable` (a
Python process's gRPC thread and the JVM it started, together) with nothing else printed;
the next run that fails so says how many tasks and how much memory there were.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

INTERVAL_SECONDS = 1.0


@dataclass
class Peak:
    tasks: int = 0
    tasks_at: str = ""
    least_available_mib: float = float("inf")
    least_available_at: str = ""


def _tasks() -> int:
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[1])


def _available_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Watch:
    def __init__(self) -> None:
        self.peak = Peak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-watch", daemon=True)

    def start(self) -> "Watch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                tasks, available = _tasks(), _available_mib()
            except (OSError, ValueError, IndexError):
                return
            now = time.strftime("%H:%M:%S")
            if tasks > self.peak.tasks:
                self.peak.tasks, self.peak.tasks_at = tasks, now
            if available < self.peak.least_available_mib:
                self.peak.least_available_mib, self.peak.least_available_at = available, now
            self._stop.wait(INTERVAL_SECONDS)

    def summary(self) -> str:
        p = self.peak
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = f.read().strip()
        return (f"machine: at most {p.tasks} tasks alive at once ({p.tasks_at}; pid_max {pid_max}), "
                f"least memory available {p.least_available_mib:,.0f} MiB ({p.least_available_at})")
