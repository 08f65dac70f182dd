"""The unit tier's rule holds (tests/unit/conftest.py, tests/support/purity.py): every way of
starting a process fails here, naming where such a test belongs."""

from __future__ import annotations

import multiprocessing
import os
import subprocess

import pytest

from tests.support.purity import ProcessInUnitTest


def test_subprocess_is_refused_naming_the_command_and_the_integration_tier():
    with pytest.raises(ProcessInUnitTest, match=r"\['true'\].*tests/integration"):
        subprocess.run(["true"], check=True)
    with pytest.raises(ProcessInUnitTest):
        subprocess.check_output(["echo", "hi"])
    with pytest.raises(ProcessInUnitTest, match="os.system"):
        os.system("true")
    with pytest.raises(ProcessInUnitTest, match="os.posix_spawn"):
        os.posix_spawn("/bin/true", ["true"], {})


def test_multiprocessing_is_refused():
    for method in ("spawn", "fork"):
        process = multiprocessing.get_context(method).Process(target=print)
        with pytest.raises(ProcessInUnitTest):
            process.start()


def test_fork_is_refused():
    try:
        pid = os.fork()
    except ProcessInUnitTest:
        return
    if pid == 0:  # the guard failed: the child leaves at once, the parent fails the test
        os._exit(0)
    os.waitpid(pid, 0)
    pytest.fail("os.fork started a process in the unit tier")
