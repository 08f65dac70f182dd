"""A real etcd (Debian's ``etcd-server``) as a local process, for ``services.local``'s
replicated run and the tests: one member, its own data directory, ephemeral ports learned
from its log, sub-second Raft timings so leases of one second hold. Given a certificate, it
serves clients over TLS and requires theirs (``--client-cert-auth``): ``endpoint`` is then
``https://host:port``."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path


_SERVING = re.compile(r"serving (?:insecure )?client requests on ([0-9.]+:\d+)")


class EtcdProcess:
    def __init__(self, workdir: str | Path, name: str = "etcd", host: str = "127.0.0.1", *,
                 cert_file: str = "", key_file: str = "", ca_file: str = "") -> None:
        self.workdir = Path(workdir)
        #: TLS for clients (all three, or none: plaintext).
        self.tls = (cert_file, key_file, ca_file) if cert_file else None
        #: The address clients dial (a bridge address when replicas run in network namespaces).
        self.host = host
        self.name = name
        self.data_dir = self.workdir / f"{name}.data"
        self.log_path = self.workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    def start(self, timeout: float = 30.0, client_port: int = 0) -> "EtcdProcess":
        """Starts etcd on ``client_port`` (0: any free one; :attr:`endpoint` says which)."""
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: `make test` installs Debian's etcd-server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        since = log.tell()  # a restart appends: look for its own "serving" line
        scheme = "https" if self.tls else "http"
        tls_args: list[str] = []
        if self.tls:
            cert, key, ca = self.tls
            tls_args = ["--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth"]
        self.proc = subprocess.Popen(
            [binary, "--name", self.name, "--data-dir", str(self.data_dir), *tls_args,
             "--listen-client-urls", f"{scheme}://{self.host}:{client_port}",
             "--advertise-client-urls", f"{scheme}://{self.host}:2379",
             "--listen-peer-urls", "http://127.0.0.1:0", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
             "--initial-cluster", f"{self.name}=http://127.0.0.1:2380",
             "--heartbeat-interval", "20", "--election-timeout", "200", "--log-level", "info"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "ETCD_UNSUPPORTED_ARCH": os.uname().machine},
            start_new_session=True)
        log.close()

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n{self.log_tail()}")
            with open(self.log_path, "rb") as fh:
                fh.seek(since)
                match = _SERVING.search(fh.read().decode(errors="replace"))
            if match:
                self.endpoint = f"https://{match.group(1)}" if self.tls else match.group(1)
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not serving after {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, timeout: float = 30.0) -> "EtcdProcess":
        """Stops etcd (SIGTERM) and starts it again with the same data on the same client
        address, so its clients reconnect to it."""
        port = int(self.endpoint.rpartition(":")[2])
        self.stop()
        return self.start(timeout, client_port=port)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def __enter__(self) -> "EtcdProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

