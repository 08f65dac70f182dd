"""How fast this machine's CPU runs Python now, printed beside every benchmark's table.

The shared virtual machines these benchmarks run on do not always get the same CPU, and
the guest does not see it (no steal time): in one session the same benchmark on an idle
machine ran txmq at a third of the rate measured in an earlier session, PostgreSQL at
about half. txmq's services are Python and its peers (PostgreSQL, RabbitMQ) are not, so a
slow CPU lowers txmq's ratios as well as the absolute rates. This number, taken as the
table is printed, says what kind of machine a table came from: compare tables only when
it is alike."""

from __future__ import annotations

import os
import time

LOOP_ITERATIONS = 2_000_000


def python_loop_ns(rounds: int = 3) -> float:
    """Nanoseconds per iteration of ``x += i`` in a for loop, the fastest of ``rounds``."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        x = 0
        for i in range(LOOP_ITERATIONS):
            x += i
        best = min(best, time.perf_counter() - started)
    return best / LOOP_ITERATIONS * 1e9


def describe() -> str:
    """One line for a benchmark's header."""
    return f"{os.cpu_count()} CPUs, a Python loop iteration {python_loop_ns():.0f} ns now"
