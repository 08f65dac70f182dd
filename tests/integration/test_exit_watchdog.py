"""The exit watchdog (services.common.runtime._exit_within) in real processes: a stop that
never ends, or a thread that outlives it, still ends the process (moved from
tests/unit/test_stopping.py: the unit tier starts no process)."""

from __future__ import annotations


def _exits(lines: list[str]) -> tuple[int, str]:
    """Runs ``lines`` as a real process (which arms the exit watchdog); its exit status and
    stderr, which it must reach well within the 30 s given."""
    import subprocess
    import sys
    import time

    code = "".join(f"{line}\n" for line in ["import threading, time",
                                             "from services.common.runtime import _exit_within", *lines])
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert time.monotonic() - started < 20
    return out.returncode, out.stderr


def test_a_stop_that_blocks_its_event_loop_still_ends_the_process_with_status_1():
    """The watchdog armed at the SIGTERM: a stop that never ends (a synchronous call no
    deadline of the loop can cut) is ended, status 1 (the stop did not finish), with every
    thread's stack on stderr."""
    code, stderr = _exits(["_exit_within(0.3, threading.Event())  # never set: the stop does not finish",
                           "time.sleep(60)  # the stop, blocking the main thread"])
    assert code == 1, stderr
    assert "stop did not finish in time" in stderr
    assert 'File "<string>", line 4' in stderr  # the blocked main thread's stack


def test_a_stopped_service_exits_even_when_a_thread_outlives_the_stop():
    """A real process whose non-daemon thread never ends (as a helper stuck past the stop
    would) still exits, code 0, within the stall limit, with every thread's stack on stderr."""
    code, stderr = _exits(["threading.Thread(target=time.sleep, args=(60,), name='stuck').start()",
                           "_exit_within(0.3)"])
    assert code == 0, stderr
    assert "exit stalled after the stop" in stderr
    assert stderr.count("Thread 0x") >= 2  # the watchdog's own and the stuck one's stacks
