"""Service processes for tests: the generic :class:`ServiceProcess` (also used by
``python -m services.local``), re-exported with test conveniences."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from services.common.process import PortInUseError, ServiceError, ServiceProcess, port_is_free

from .waiting import WaitTimeout, wait_until

__all__ = ["PortInUseError", "ServiceError", "ServiceProcess", "WaitTimeout", "port_is_free",
           "start_service", "wait_until"]


def start_service(module: str, workdir: str | Path, name: str,
                  env: Mapping[str, str] | None = None, timeout: float = 30.0) -> ServiceProcess:
    """Starts ``python -m <module>`` and waits for its ready file; on failure the process
    is stopped and the error carries its log tail."""
    proc = ServiceProcess(module, env, workdir=workdir, name=name)
    try:
        proc.start_and_wait(timeout)
    except BaseException:
        proc.kill()
        raise
    return proc
