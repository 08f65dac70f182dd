"""The unit tier's guard (tests/support/purity.py) is scoped: outside the block every way of
starting a process works again, so the integration tier (and the next test) is unaffected."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.purity import ProcessInUnitTest, no_processes


def test_processes_start_again_once_the_guard_is_left():
    with no_processes():
        with pytest.raises(ProcessInUnitTest):
            subprocess.run(["true"], check=True)
    assert subprocess.run(["echo", "ok"], capture_output=True, text=True, check=True).stdout == "ok\n"
    assert os.system("true") == 0
    pid = os.posix_spawn("/bin/true", ["true"], {})
    assert os.waitpid(pid, 0)[1] == 0
