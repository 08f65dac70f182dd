"""Running third-party clients (the official RocketMQ clients, a generated Node.js client)
as subprocesses: JSON lines on stdout become events a test waits on with deadlines.
Every process has a hard timeout and is killed at teardown."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping


HERE = Path(__file__).resolve().parent
NODE_DIR = HERE / "node"
PYTHON_CLIENT = HERE / "clients" / "rmq_python.py"

Event = dict[str, Any]
#: Environment variables of a client process on top of the test's (a value of None removes
#: the test's own), as a user sets them: e.g. the CA a client trusts.
Environment = Mapping[str, str | None]


def node_ready() -> str | None:
    """Why the Node.js tests cannot run (None when they can)."""
    if shutil.which("node") is None:
        return "node is not installed (make proxy-deps)"
    if not (NODE_DIR / "node_modules" / "rocketmq-client-nodejs").is_dir():
        return "tests/proxy/node/node_modules is missing (make proxy-deps)"
    return None


class ClientProcess:
    """One client subprocess. ``events`` grows as it prints; ``stderr`` is kept for reports."""

    def __init__(self, argv: list[str], *, home: Path, name: str, timeout: float = 90.0,
                 cwd: Path | None = None, env: Environment | None = None) -> None:
        self.name = name
        self.argv = argv
        self.timeout = timeout
        self.events: list[Event] = []
        self.lines: list[str] = []
        self._cond = threading.Condition()
        home.mkdir(parents=True, exist_ok=True)
        environ = {k: v for k, v in {**os.environ, **(env or {})}.items()
                   if v is not None and not k.startswith("TXMQ_")}
        environ.update(HOME=str(home), PYTHONUNBUFFERED="1")
        self.stderr_path = home / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env=environ, cwd=str(cwd or HERE), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()
        self._killer = threading.Timer(timeout, self.kill)
        self._killer.daemon = True
        self._killer.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._cond:
                self.lines.append(line)
                if line.startswith("{"):
                    try:
                        self.events.append(json.loads(line))
                    except ValueError:
                        pass
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def of(self, event: str) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.get("event") == event]

    def wait(self, predicate: Callable[["ClientProcess"], Any], timeout: float, what: str) -> Any:
        """Waits until ``predicate(self)`` is truthy; fails (with the client's output) when
        the deadline passes or the process exits first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(self)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{self.name}: {what} (after {timeout:.0f}s, exit code "
                                         f"{self.proc.poll()})\n{self.describe()}")
                self._cond.wait(min(left, 0.2))

    def wait_event(self, event: str, count: int = 1, timeout: float = 60.0) -> list[Event]:
        return self.wait(lambda c: len(c.of(event)) >= count and c.of(event), timeout,
                         f"expected {count} {event!r} event(s)")

    def finish(self, timeout: float = 30.0, close_stdin: bool = True) -> int:
        """Ends its input (clients waiting on stdin shut down) and waits for the exit."""
        if close_stdin and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout:.0f}s\n{self.describe()}") from None
        self._reader.join(5)
        return code

    def expect_success(self, timeout: float = 60.0) -> None:
        code = self.finish(timeout)
        assert code == 0, f"{self.name} exited with {code}\n{self.describe()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self._killer.cancel()
        self.kill()
        self._stderr.close()

    def describe(self, lines: int = 40) -> str:
        try:
            err = self.stderr_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            err = []
        with self._cond:
            out = self.lines[-lines:]
        return ("--- stdout ---\n" + "\n".join(out) + "\n--- stderr ---\n" + "\n".join(err))


class Clients:
    """Starts client processes for one test and reaps them all at teardown. A client's
    ``env`` is its ``Environment``; its scenario's arguments are the other keywords."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.started: list[ClientProcess] = []

    def python(self, scenario: str, timeout: float = 90.0, env: Environment | None = None,
               **args: Any) -> ClientProcess:
        return self._start([sys.executable, str(PYTHON_CLIENT), scenario, json.dumps(args)],
                           f"py-{scenario}-{len(self.started)}", timeout, env=env)

    def node(self, script: str, scenario: str, timeout: float = 90.0, env: Environment | None = None,
             **args: Any) -> ClientProcess:
        return self._start(["node", str(NODE_DIR / script), scenario, json.dumps(args)],
                           f"node-{scenario}-{len(self.started)}", timeout, cwd=NODE_DIR, env=env)

    def _start(self, argv: list[str], name: str, timeout: float, cwd: Path | None = None,
               env: Environment | None = None) -> ClientProcess:
        client = ClientProcess(argv, home=self.home, name=name, timeout=timeout, cwd=cwd, env=env)
        self.started.append(client)
        return client

    def close(self) -> None:
        for client in self.started:
            client.close()

    def logs(self) -> str:
        """What the clients wrote to their own logs (under their HOME's logs/) so far."""
        return "".join(p.read_text(errors="replace") for p in sorted((self.home / "logs").rglob("*")) if p.is_file())

    def report(self) -> str:
        return "\n".join(f"=== {c.name} ===\n{c.describe()}" for c in self.started)


def assert_delivered_at_their_time(sender: ClientProcess, consumer: ClientProcess) -> None:
    """Every body the sender sent with a ``due_ms`` was received (once per body) no earlier,
    carrying that delivery timestamp."""
    due = {e["body"]: e["due_ms"] for e in sender.of("sent")}
    received = consumer.of("received")
    assert sorted(m["body"] for m in received) == sorted(due)
    for m in received:
        assert m["received_ms"] >= due[m["body"]], (m, due)
        assert m["delivery_timestamp"] == due[m["body"]]
