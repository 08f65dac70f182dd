"""The unit tier's one rule, enforced: a test under ``tests/unit`` starts no process.

:func:`no_processes` replaces every way this interpreter can start one (``subprocess``,
``multiprocessing``, ``os.fork``/``posix_spawn``/``system``) with a call that raises
:class:`ProcessInUnitTest` naming what was tried. ``tests/unit/conftest.py`` holds it around
the setup, call and teardown of every unit test, so a module-scoped fixture that shells out
is caught too. Threads, in-process gRPC servers, RocksDB in a temporary directory and
asyncio loops are all fine: what starts a process belongs in ``tests/integration``.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
from typing import Any, Callable, Iterator

__all__ = ["ProcessInUnitTest", "no_processes"]


class ProcessInUnitTest(AssertionError):
    """A unit test (or its fixture) tried to start a process."""


def _refuse(what: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        shown = args[0] if what == "subprocess" and args else what
        raise ProcessInUnitTest(f"tests/unit starts no process, but this test tried ({what}: {shown!r}): "
                                "move it to tests/integration, or test the code in-process")
    return refused


#: (module, attribute, name in the message): every entry point that forks or execs.
_TARGETS = [(subprocess, "_fork_exec", "subprocess"), (_posixsubprocess, "fork_exec", "subprocess"),
            *((os, name, f"os.{name}") for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
              if hasattr(os, name))]


@contextlib.contextmanager
def no_processes() -> Iterator[None]:
    """Within the block, starting a process raises :class:`ProcessInUnitTest`."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in _TARGETS]
    for module, name, what in _TARGETS:
        setattr(module, name, _refuse(what))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
