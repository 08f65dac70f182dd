"""Starting and stopping service processes from outside: the local runner
(``python -m services.local``) and the test fixtures build on :class:`ServiceProcess`.

A service is started as ``python -m <module>`` with its configuration in ``TXMQ_*``
variables. It is *ready* once it has written its ready file (``TXMQ_READY_FILE``,
``{"port", "metrics_port", "health_port", "pid"}``, see ``runtime.write_ready_file``): the port is
learned from the server, never guessed. Its stdout and stderr go to ``<workdir>/<name>.log``,
appended across restarts.

This module imports nothing beyond the standard library, so tooling can use it without
pulling in gRPC or pytest.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

ENV_PREFIX = "TXMQ_"
DEFAULT_HOST = "127.0.0.1"
#: The directory that holds the ``services`` package: put on PYTHONPATH of every child so
#: ``python -m services.x`` resolves to this checkout even without an editable install.
_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])



def child_pythonpath(inherited: str) -> str:
    """A child's PYTHONPATH: this checkout first, then the parent's entries made absolute. The
    child runs in its work directory, where a relative entry (``PYTHONPATH=sdk:.``, as the
    tests are run) named nothing: the child then imported the ``txmq`` of whichever checkout
    the virtualenv's editable install points at, not this one's."""
    entries = [_SOURCE_ROOT] + [os.path.abspath(p) for p in inherited.split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(entries))


#: Processes started and not yet reaped; killed at interpreter exit as a last resort.
_LIVE: set["ServiceProcess"] = set()
_LIVE_LOCK = threading.Lock()


class ServiceError(RuntimeError):
    """A service process failed to start or to become ready; the message ends with its log tail."""

    def __init__(self, name: str, problem: str, log_tail: str) -> None:
        super().__init__(f"{name}: {problem}\n--- last lines of the {name} log ---\n{log_tail}")
        self.name = name
        self.problem = problem
        self.log_tail = log_tail


class PortInUseError(ServiceError):
    """The (pinned or fixed) port a service must bind is taken."""

    def __init__(self, name: str, port: int, log_tail: str = "") -> None:
        super().__init__(name, f"port {port} is already in use", log_tail)
        self.port = port


def port_is_free(port: int, host: str = DEFAULT_HOST) -> bool:
    """Whether ``host:port`` can be bound now (with SO_REUSEADDR, as gRPC binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _kill_leftovers() -> None:
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for proc in leftovers:
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 - interpreter exit: kill what we can
            pass


atexit.register(_kill_leftovers)


class ServiceProcess:
    """One service process: ``sys.executable -m <module>`` with ``TXMQ_*`` configuration.

    ``env`` holds the service's own ``TXMQ_*`` settings; inherited ``TXMQ_*`` variables are
    dropped so a developer's shell cannot change what a test runs. Unless given, the service
    binds ``127.0.0.1``, an ephemeral gRPC port and an ephemeral metrics port.

    ``restart()`` keeps the environment (so a broker keeps its data directory) and pins
    the gRPC port to the one the first start got, so clients and name servers keep the
    address.

    ``command_prefix`` runs the service under a wrapper, e.g. ``["ip", "netns", "exec", NS]``
    to start it inside a network namespace (the wrapper must exec the service, so the pid
    is the service's own); ``TXMQ_HOST`` then names an address of that namespace.
    """

    def __init__(self, module: str, env: Mapping[str, str] | None,
                 workdir: str | os.PathLike[str], name: str, *,
                 python: str = sys.executable, command_prefix: Sequence[str] = ()) -> None:
        self.module = module
        self.command_prefix = list(command_prefix)
        self.name = name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.log_path = self.workdir / f"{name}.log"
        self.ready_path = self.workdir / f"{name}.ready.json"
        self.env: dict[str, str] = {
            "TXMQ_HOST": DEFAULT_HOST,
            "TXMQ_PORT": "0",
            "TXMQ_METRICS_PORT": "0",
            **{k: str(v) for k, v in (env or {}).items()},
            "TXMQ_READY_FILE": str(self.ready_path),
        }
        bad = [k for k in self.env if not k.startswith(ENV_PREFIX)]
        if bad:
            raise ValueError(f"{name}: only {ENV_PREFIX}* settings may be given, got {bad}")
        self.host = self.env["TXMQ_HOST"]
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0  # where the current start's output begins in the log
        self._ready: dict[str, Any] | None = None
        self._starts = 0

    # ------------------------------------------------------------------ state
    def __repr__(self) -> str:
        state = "running" if self.running else f"exited {self.returncode}" if self._proc else "not started"
        return f"<ServiceProcess {self.name} {self.module} pid={self.pid} port={self._port_or_none()} {state}>"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    @property
    def ready_info(self) -> dict[str, Any]:
        if self._ready is None:
            raise RuntimeError(f"{self.name} is not ready (call start() and wait_ready())")
        return self._ready

    def _port_or_none(self) -> int | None:
        return self._ready["port"] if self._ready else None

    @property
    def port(self) -> int:
        return int(self.ready_info["port"])

    @property
    def metrics_port(self) -> int:
        return int(self.ready_info["metrics_port"])

    @property
    def address(self) -> str:
        """``host:port`` clients dial (``127.0.0.1:<port>`` unless the host was set)."""
        host = DEFAULT_HOST if self.host in ("", "0.0.0.0") else self.host
        return f"{host}:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "ServiceProcess":
        """Launches the process (returns at once; call :meth:`wait_ready`)."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self._reap()
        self._ready = None
        try:
            self.ready_path.unlink()
        except FileNotFoundError:
            pass
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = child_pythonpath(os.environ.get("PYTHONPATH", ""))
        self._log = open(self.log_path, "ab")
        self._starts += 1
        banner = (f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {self.name} "
                  f"(python -m {self.module}, start #{self._starts}, port {self.env['TXMQ_PORT']}) ---\n")
        self._log.write(banner.encode())
        self._log.flush()
        self._log_offset = self._log.tell()
        self._proc = subprocess.Popen(
            [*self.command_prefix, self.python, "-m", self.module], env=env, cwd=self.workdir,
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            # Its own process group: a Ctrl-C in the terminal reaches only the parent, which
            # then stops the services in order.
            start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        """Waits for the ready file this start wrote; fails at once if the process exits."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} was never started")
        deadline = time.monotonic() + timeout
        while True:
            info = self._read_ready_file()
            if info is not None:
                self._ready = info
                return info
            code = self._proc.poll()
            if code is not None:
                self._reap()
                raise ServiceError(self.name, f"exited with code {code} before it was ready",
                                   self.log_tail(40, since_start=True))
            if time.monotonic() >= deadline:
                raise ServiceError(self.name, f"not ready after {timeout:.1f}s (pid {self.pid} still running)",
                                   self.log_tail(40, since_start=True))
            time.sleep(0.02)

    def _read_ready_file(self) -> dict[str, Any] | None:
        try:
            info = json.loads(self.ready_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None  # not written yet (it is replaced atomically, but be lenient)
        if info.get("pid") != self.pid:
            return None  # a stale file from an earlier run
        return info

    def start_and_wait(self, timeout: float = 30.0) -> dict[str, Any]:
        self.start()
        return self.wait_ready(timeout)

    def send_term(self) -> None:
        """SIGTERM without waiting (to stop several services at once; then :meth:`stop`)."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code (negative:
        the signal that ended it), or None if it was never started."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self.send_term()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reap()
        return self._proc.returncode

    def kill(self) -> int | None:
        """SIGKILL (a crash) and reap."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass
            self._proc.wait()
        self._reap()
        return self._proc.returncode

    def pause(self) -> None:
        """SIGSTOP: the process stops running but keeps its sockets (a long GC pause, a
        frozen VM); :meth:`resume` continues it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 30.0, stop_timeout: float = 15.0) -> dict[str, Any]:
        """Stops the process if it still runs (SIGTERM), then starts it again with the same
        environment and the same gRPC port, and waits until it is ready.

        The port may be briefly unavailable; the start is retried until ``timeout``."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} was never started")
        pinned = self._pinned_port()
        if self.running:
            self.stop(stop_timeout)
        if pinned:
            self.env["TXMQ_PORT"] = str(pinned)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            # (Under a command prefix the address may not exist here: rely on the bind retry.)
            if pinned and not self.command_prefix and not port_is_free(pinned, self.host or DEFAULT_HOST):
                if remaining <= 0:
                    raise PortInUseError(self.name, pinned, self.log_tail(20))
                time.sleep(0.05)
                continue
            self.start()
            try:
                return self.wait_ready(max(remaining, 1.0))
            except ServiceError as exc:
                # Lost a race for the port between the check and the bind: try again.
                if (pinned and time.monotonic() < deadline and not self.running
                        and _looks_like_bind_failure(exc.log_tail)):
                    time.sleep(0.05)
                    continue
                raise

    def _pinned_port(self) -> int | None:
        configured = int(self.env.get("TXMQ_PORT", "0") or 0)
        if configured:
            return configured
        if self._ready is not None:
            return int(self._ready["port"])
        return None

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None

    # ------------------------------------------------------------------ logs
    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_text(self, since: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(since)
                return fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 50, *, since: int | None = None, since_start: bool = False) -> str:
        """The last ``n`` lines of the log (of everything since byte offset ``since``, or of
        the current start only)."""
        offset = self._log_offset if since_start else (since or 0)
        lines = self.log_text(offset).splitlines()
        return "\n".join(lines[-n:]) if n > 0 else ""


def _looks_like_bind_failure(text: str) -> bool:
    """Whether a start's log says it lost its port: gRPC's own words, or the services'
    (``services.common.server.check_port_free``: "port N on HOST is already in use")."""
    lowered = text.lower()
    return "bind" in lowered or "already in use" in lowered
