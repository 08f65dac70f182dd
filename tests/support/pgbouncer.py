"""A private PgBouncer in front of a test's PostgreSQL (Debian's ``pgbouncer``, installed by
``make postgresql``): its configuration in the test's folder, listening on an ephemeral
loopback port (``listen_port = 0``; the port is read from the process's listening socket,
never guessed), stopped by :meth:`PgBouncer.stop`.

Debian's PgBouncer (1.18 on bookworm) predates PgBouncer's support for protocol-level
prepared statements (1.21): in ``transaction`` pool mode a prepared statement lives on one
server connection, and the client's next transaction may run on another, or another
client's on this one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

__all__ = ["PgBouncer", "pgbouncer_binary", "require_pgbouncer"]


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None)


def require_pgbouncer() -> str:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed (make postgresql installs Debian's pgbouncer)")
    return binary


class PgBouncer:
    """PgBouncer in ``pool_mode`` for every database of the PostgreSQL on ``upstream_port``
    (trust authentication, as the test cluster's). ``settings``: more ``[pgbouncer]`` lines
    (``default_pool_size``, ...). :meth:`dsn` rewrites a test database's connection string
    to go through it."""

    def __init__(self, folder: Path, upstream_port: int, pool_mode: str, **settings: object) -> None:
        binary = require_pgbouncer()
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        (folder / "users.txt").write_text('"bench" ""\n')
        lines = {"listen_addr": "127.0.0.1", "listen_port": 0, "unix_socket_dir": "", "auth_type": "trust",
                 "auth_file": folder / "users.txt", "pool_mode": pool_mode, "max_client_conn": 200,
                 "default_pool_size": 20, "ignore_startup_parameters": "extra_float_digits,options",
                 **settings}
        if os.geteuid() == 0:
            lines["user"] = "postgres"  # it refuses to run as root: it reads this file, then drops to that user
        config = folder / "pgbouncer.ini"
        config.write_text(f"[databases]\n* = host=127.0.0.1 port={upstream_port}\n[pgbouncer]\n"
                          + "".join(f"{k} = {v}\n" for k, v in lines.items()))
        self.log = folder / "pgbouncer.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([binary, str(config)], stdout=log, stderr=subprocess.STDOUT)
        self.port = self._listening_port(timeout=30)

    def _listening_port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                ports = [c.laddr.port for c in psutil.Process(self.proc.pid).net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN]
            except psutil.Error:
                ports = []
            if ports:
                return ports[0]
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer not listening within {timeout:g} s:\n{self.log.read_text()}")

    def dsn(self, database_dsn: str) -> str:
        """``database_dsn`` (``host=... port=... user=... dbname=...``) through this PgBouncer."""
        parts = dict(p.split("=", 1) for p in database_dsn.split())
        parts.update(host="127.0.0.1", port=str(self.port))
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
