"""Private instances of the peers the benchmarks compare txmq with: PostgreSQL and RabbitMQ
from Debian's packages (``make bench-deps`` installs them), each started on a free loopback
port with its data in a temporary folder, and stopped (and the folder removed) on exit.

PostgreSQL refuses to run as root: as root the instance runs as the ``postgres`` user the
Debian package creates. Both run with their durable defaults (PostgreSQL ``fsync=on``,
``synchronous_commit=on``; RabbitMQ durable queues and persistent messages are the
caller's choice).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ready, proc: subprocess.Popen, log: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready within {timeout:g} s:\n{_tail(log)}")


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path:
        return path
    raise RuntimeError(f"PostgreSQL's {name} not found: run `make bench-deps` (installs Debian's postgresql)")


class PostgresInstance:
    """``initdb`` + ``postgres`` on a free port; ``dsn`` connects as superuser ``bench``."""

    def __init__(self, max_connections: int = 300) -> None:
        self.dir = tempfile.mkdtemp(prefix="txmq-bench-pg-")
        self.port = free_port()
        self.log = os.path.join(self.dir, "postgres.log")
        as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        data = self.data = os.path.join(self.dir, "data")
        subprocess.run([*as_user, _pg_bin("initdb"), "-D", data, "-A", "trust", "-U", "bench", "-E", "UTF8"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.as_user = as_user
        self.max_connections = max_connections
        self._start("w")
        self.dsn = f"host=127.0.0.1 port={self.port} user=bench dbname=postgres"
        _wait("postgres", self._accepts, self.proc, self.log)

    def _start(self, mode: str) -> None:
        with open(self.log, mode) as log:
            if self.as_user:
                user = pwd.getpwnam("postgres")
                os.chown(self.log, user.pw_uid, user.pw_gid)
            self.proc = subprocess.Popen(
                [*self.as_user, _pg_bin("postgres"), "-D", self.data, "-p", str(self.port), "-k", self.dir,
                 "-c", "listen_addresses=127.0.0.1", "-c", f"max_connections={self.max_connections}",
                 "-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "shared_buffers=256MB"],
                stdout=log, stderr=subprocess.STDOUT)

    def restart(self, *, immediate: bool = False) -> None:
        """Stops the server (``immediate``: SIGQUIT, a crash-like stop whose restart runs
        recovery from the WAL; else the fast shutdown) and starts it again on the same port
        and data; returns once it accepts connections."""
        self._shutdown(3 if immediate else 2)
        self._start("a")
        _wait("postgres", self._accepts, self.proc, self.log)

    def _shutdown(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(os.path.join(self.data, "postmaster.pid")) as f:
                    os.kill(int(f.readline()), sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                for p in self.processes():
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
                self.proc.wait(10)

    def _accepts(self) -> bool:
        import psycopg

        try:
            psycopg.connect(self.dsn, connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            return False

    def processes(self) -> list[psutil.Process]:
        """The postmaster and its children (one backend per connection)."""
        try:
            main = psutil.Process(self.proc.pid)
            return [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        # SIGINT to the postmaster (its pid heads postmaster.pid) is the fast shutdown.
        self._shutdown(2)
        shutil.rmtree(self.dir, ignore_errors=True)


class RabbitInstance:
    """A RabbitMQ node of its own (name, ports, data and logs in a temporary folder)."""

    def __init__(self) -> None:
        # The package's own script, not /usr/sbin's wrapper (which switches to the rabbitmq
        # user and its fixed folders).
        server = "/usr/lib/rabbitmq/bin/rabbitmq-server"
        if not os.path.exists(server):
            raise RuntimeError("rabbitmq-server not found: run `make bench-deps` (installs Debian's rabbitmq-server)")
        self.dir = tempfile.mkdtemp(prefix="txmq-bench-rabbit-")
        self.port = free_port()
        self.log = os.path.join(self.dir, "rabbit.log")
        self.node = f"txmqbench{self.port}@localhost"
        env = dict(os.environ, HOME=self.dir, RABBITMQ_NODENAME=self.node, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                   RABBITMQ_NODE_PORT=str(self.port), RABBITMQ_DIST_PORT=str(free_port()),
                   RABBITMQ_MNESIA_BASE=os.path.join(self.dir, "mnesia"),
                   RABBITMQ_LOG_BASE=os.path.join(self.dir, "log"), RABBITMQ_LOGS="-",
                   RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(self.dir, "enabled_plugins"),
                   RABBITMQ_CONFIG_FILE=os.path.join(self.dir, "rabbitmq"),
                   RABBITMQ_PID_FILE=os.path.join(self.dir, "rabbit.pid"),
                   ERL_EPMD_ADDRESS="127.0.0.1")
        with open(os.path.join(self.dir, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        with open(os.path.join(self.dir, "rabbitmq.conf"), "w") as f:
            f.write("loopback_users = none\n")
        self.env = env
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([server], env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        _wait("rabbitmq", self._accepts, self.proc, self.log, timeout=90)

    def _accepts(self) -> bool:
        import pika

        try:
            pika.BlockingConnection(self.parameters()).close()
            return True
        except Exception:  # noqa: BLE001 - not up yet, whatever pika says
            return False

    def parameters(self):  # pika.ConnectionParameters, imported lazily
        import pika

        return pika.ConnectionParameters("127.0.0.1", self.port, connection_attempts=1, socket_timeout=5,
                                         heartbeat=0)

    def processes(self) -> list[psutil.Process]:
        """The node's Erlang VM and its helpers (the script's children)."""
        try:
            main = psutil.Process(self.proc.pid)
            return [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        procs = self.processes()
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        _gone, alive = psutil.wait_procs(procs, timeout=20)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def cpu_snapshot(processes: list[psutil.Process]) -> dict[int, float]:
    """CPU seconds of each live process given (all its threads), by pid.

    From the scheduler's own accounting (``/proc/<pid>/task/*/schedstat``, nanoseconds)
    where the kernel has it: the user + system times of ``/proc/<pid>/stat`` are sampled at
    the timer tick, and a process that runs in bursts shorter than a tick between sleeps (a
    PostgreSQL backend committing a small transaction) is charged close to nothing there."""
    snapshot = {}
    for p in processes:
        try:
            snapshot[p.pid] = _scheduled_seconds(p.pid)
        except OSError:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                snapshot[p.pid] = t.user + t.system
    return snapshot


def _scheduled_seconds(pid: int) -> float:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two snapshots by the processes alive at the second (one
    started in between counts from its start; one gone by then is not counted)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


@contextlib.contextmanager
def started(factory) -> Iterator:
    instance = factory()
    try:
        yield instance
    finally:
        instance.stop()
