"""etcd for txmq: the local etcd process (Debian's ``etcd-server``) the local runner and the
tests start, and etcd's own authentication as txmq uses it — the set-up that locks the txmq
keys to the brokers (:func:`setup_auth`, ``python -m services.common.etcd setup-auth``)
and the brokers' password credentials (:class:`EtcdCredentials`).

**Who may touch txmq's keys.** etcd's authentication is on and one role,
``txmq-broker``, may read and write the cluster's prefix (``<etcd_prefix>/``, default
``/txmq/``); only the brokers' users hold it. ``root`` (etcd's superuser role) is kept for
the set-up: with mutual TLS the set-up's own certificate (its common name a user with the
root role, e.g. the etcd members' certificate in the chart), otherwise the ``root`` user's
password. Everyone else — an application's certificate from the same CA included — is
refused (``etcdserver: permission denied``, or ``user name is empty`` without a user).

- **mTLS** (etcd with ``--client-cert-auth``): etcd takes the user name from the client
  certificate's common name; the brokers' users have no password and nothing more to
  configure than their certificates.
- **Passwords** (plaintext etcd: ``services.local``, tests): each broker authenticates
  (``broker.config.etcd_user`` / ``etcd_password_file``) and sends the token etcd gives on
  every call; a token etcd no longer knows (it restarted, or the token expired) is fetched
  again on the next call.

The set-up is idempotent: roles, users and grants already present stay, passwords are set
again to the given ones, and it enables authentication last (before that, etcd refuses
nobody: set it up before any client other than the brokers can reach it).

The process: one member, its own data directory, ephemeral ports learned from its log,
sub-second Raft timings so leases of one second hold. Given a certificate, it serves
clients over TLS and requires theirs (``--client-cert-auth``): ``endpoint`` is then
``https://host:port``. Given an :class:`EtcdAuth`, it is set up at its first start.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import grpc
from aetcd import rpc

from .logs import configure_logging

log = logging.getLogger(__name__)

_SERVING = re.compile(r"serving (?:insecure )?client requests on ([0-9.]+:\d+)")

#: The role that may read and write txmq's prefix; only broker users hold it.
BROKER_ROLE = "txmq-broker"
ROOT = "root"
#: etcd's refusals of a set-up step that is done already.
_EXISTS = ("already exists",)


def prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """The key range of everything under ``<prefix>/`` (key, range_end)."""
    key = prefix.rstrip("/").encode() + b"/"
    return key, key[:-1] + bytes([key[-1] + 1])


@dataclasses.dataclass(frozen=True)
class EtcdAuth:
    """How etcd's authentication is set up for txmq (see the module docstring)."""

    #: The brokers' user names: their certificates' common names (mTLS), or the one
    #: password user all brokers share (``broker_password`` set).
    broker_users: tuple[str, ...]
    #: txmq's key prefix (``broker.config.etcd_prefix``).
    prefix: str = "/txmq"
    role: str = BROKER_ROLE
    #: Password mode: the brokers' password and root's.
    broker_password: str = ""
    root_password: str = ""
    #: mTLS: the common name of the set-up's certificate, given the root role.
    admin_user: str = ""

    def __post_init__(self) -> None:
        if not self.broker_users or not all(self.broker_users):
            raise ValueError("etcd auth needs at least one broker user")
        if bool(self.broker_password) != bool(self.root_password):
            raise ValueError("password mode needs both broker_password and root_password")
        if not self.broker_password and not self.admin_user:
            raise ValueError("mTLS mode needs admin_user: the set-up certificate's common name")
        if self.admin_user in self.broker_users or ROOT in self.broker_users:
            raise ValueError("a broker user is never root")


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    ca_file: str
    cert_file: str
    key_file: str
    #: The name etcd's certificate is checked against when it is not the host dialed
    #: (a sidecar dials 127.0.0.1; the member's certificate names its pod's DNS name).
    server_name: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(Path(self.ca_file).read_bytes(), Path(self.key_file).read_bytes(),
                                            Path(self.cert_file).read_bytes())


def _channel(endpoint: str, tls: TlsFiles | None) -> grpc.Channel:
    address = endpoint.removeprefix("https://").removeprefix("http://")
    if endpoint.startswith("https://"):
        if tls is None:
            raise ValueError(f"{endpoint}: TLS needs the set-up's certificate (ca, cert, key)")
        options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
        return grpc.secure_channel(address, tls.credentials(), options=options)
    return grpc.insecure_channel(address)


def _done_already(exc: grpc.RpcError) -> bool:
    return exc.code() == grpc.StatusCode.FAILED_PRECONDITION and any(w in (exc.details() or "") for w in _EXISTS)


def setup_auth(endpoint: str, auth: EtcdAuth, tls: TlsFiles | None = None, timeout: float = 10.0) -> None:
    """Sets etcd at ``endpoint`` up as the module docstring says (idempotent). Raises
    ``grpc.RpcError`` for a refusal it cannot get past (root's password wrong, the
    set-up certificate not a root user once authentication is on). A token etcd refuses
    right after it started (it knows its tokens only once it applied its log) is fetched
    again, until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _setup_auth(endpoint, auth, tls, timeout)
            return
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE) or \
                    time.monotonic() >= deadline:
                raise
        time.sleep(0.1)


def _setup_auth(endpoint: str, auth: EtcdAuth, tls: TlsFiles | None, timeout: float) -> None:
    with _channel(endpoint, tls) as channel:
        stub = rpc.AuthStub(channel)
        metadata: list[tuple[str, str]] = []
        if auth.root_password:
            try:
                token = stub.Authenticate(rpc.AuthenticateRequest(name=ROOT, password=auth.root_password),
                                          timeout=timeout).token
                metadata = [("token", token)]
            except grpc.RpcError as exc:
                # Authentication not enabled yet answers "authentication is not enabled".
                if "not enabled" not in (exc.details() or ""):
                    raise

        def step(call: Callable[..., Any], request: Any) -> None:
            try:
                call(request, timeout=timeout, metadata=metadata)
            except grpc.RpcError as exc:
                if not _done_already(exc):
                    raise

        key, range_end = prefix_range(auth.prefix)
        step(stub.RoleAdd, rpc.AuthRoleAddRequest(name=auth.role))
        step(stub.RoleGrantPermission, rpc.AuthRoleGrantPermissionRequest(name=auth.role, perm=rpc.Permission(
            permType=rpc.Permission.READWRITE, key=key, range_end=range_end)))
        users = [(name, auth.broker_password, auth.role) for name in auth.broker_users]
        users.append((ROOT, auth.root_password, ROOT))
        if auth.admin_user:
            users.append((auth.admin_user, "", ROOT))
        def current(name: str, password: str) -> bool:
            """Whether ``password`` is ``name``'s already (False too while auth is off)."""
            try:
                stub.Authenticate(rpc.AuthenticateRequest(name=name, password=password), timeout=timeout)
                return True
            except grpc.RpcError:
                return False

        for name, password, role in users:
            options = rpc.UserAddOptions(no_password=not password)
            step(stub.UserAdd, rpc.AuthUserAddRequest(name=name, password=password, options=options))
            # Set only when it differs: a change revokes the user's tokens (root's: this one).
            if password and not current(name, password):
                step(stub.UserChangePassword, rpc.AuthUserChangePasswordRequest(name=name, password=password))
            step(stub.UserGrantRole, rpc.AuthUserGrantRoleRequest(user=name, role=role))
        step(stub.AuthEnable, rpc.AuthEnableRequest())
    log.info("etcd authentication set up", extra={"fields": {
        "endpoint": endpoint, "role": auth.role, "prefix": key.decode(), "broker_users": list(auth.broker_users),
        "mode": "password" if auth.broker_password else "mtls"}})


def wait_serving(endpoint: str, tls: TlsFiles | None, timeout: float) -> None:
    """Until etcd at ``endpoint`` answers (any answer: an auth refusal counts)."""
    deadline = time.monotonic() + timeout
    while True:
        with _channel(endpoint, tls) as channel:
            try:
                rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=2.0)
                return
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return
                if time.monotonic() >= deadline:
                    raise
        time.sleep(0.2)


# --- the brokers' password credentials -------------------------------------------------------

#: How long fetching a token may take: etcd checks the password with bcrypt and commits the
#: token through Raft, which on a loaded machine takes longer than a coordinator's calls may
#: (each of those keeps its own timeout, counted once the token is there).
AUTHENTICATE_TIMEOUT_SECONDS = 10.0


class EtcdCredentials:
    """A broker's etcd user and password (read from ``password_file``, again when it
    changes), and the token etcd gives for them, fetched on first use and again after etcd
    refused it."""

    def __init__(self, user: str, password_file: str) -> None:
        self.user = user
        self.password_file = password_file
        self._token = ""
        self._lock = asyncio.Lock()
        self.read_password()  # raises OSError/ValueError at start-up: the broker does not start

    def read_password(self) -> str:
        with open(self.password_file, encoding="utf-8") as handle:
            password = handle.read().strip()
        if not password:
            raise ValueError(f"{self.password_file}: the etcd password file is empty")
        return password

    async def token(self, channel: grpc.aio.Channel, timeout: float) -> str:
        if self._token:
            return self._token
        async with self._lock:
            if not self._token:
                reply = await rpc.AuthStub(channel).Authenticate(
                    rpc.AuthenticateRequest(name=self.user, password=self.read_password()),
                    timeout=max(timeout, AUTHENTICATE_TIMEOUT_SECONDS))
                self._token = reply.token
        return self._token

    def forget(self, token: str) -> None:
        """etcd refused ``token``: the next call authenticates again."""
        if self._token == token:
            self._token = ""


class _TokenAuth:
    """asyncio client interceptors putting etcd's ``token`` on every call but Authenticate;
    a call refused for its token (UNAUTHENTICATED) makes the next one authenticate again."""

    def __init__(self, credentials: EtcdCredentials, channel: Callable[[], grpc.aio.Channel], timeout: float) -> None:
        self.credentials = credentials
        self.channel = channel
        self.timeout = timeout

    async def _details(self, details: Any) -> tuple[Any, str]:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method.endswith("/Authenticate"):
            return details, ""
        token = await self.credentials.token(self.channel(), self.timeout)
        metadata = [(k, v) for k, v in (details.metadata or ()) if k != "token"]
        metadata.append(("token", token))
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                          details.wait_for_ready), token


class _TokenUnaryUnary(_TokenAuth, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        new, token = await self._details(details)
        call = await continuation(new, request)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                self.credentials.forget(token)
            raise
        return call


class _TokenStreamStream(_TokenAuth, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        new, _token = await self._details(details)
        return await continuation(new, request_iterator)


def etcd_credentials(config: Any) -> EtcdCredentials | None:
    """A broker's password credentials (None with mTLS: the certificate is the user)."""
    if not getattr(config, "etcd_user", ""):
        return None
    return EtcdCredentials(config.etcd_user, config.etcd_password_file)


def token_interceptors(credentials: EtcdCredentials, channel: Callable[[], grpc.aio.Channel],
                       timeout: float) -> list[Any]:
    """The interceptors of a channel to etcd authenticating with ``credentials``
    (``channel``: the channel itself, for the Authenticate call)."""
    return [_TokenUnaryUnary(credentials, channel, timeout), _TokenStreamStream(credentials, channel, timeout)]


# --- the local process -----------------------------------------------------------------------

class EtcdProcess:
    def __init__(self, workdir: str | Path, name: str = "etcd", host: str = "127.0.0.1", *,
                 cert_file: str = "", key_file: str = "", ca_file: str = "",
                 auth: EtcdAuth | None = None, admin_tls: TlsFiles | None = None) -> None:
        self.workdir = Path(workdir)
        #: TLS for clients (all three, or none: plaintext).
        self.tls = (cert_file, key_file, ca_file) if cert_file else None
        #: etcd's authentication, set up at the first start (None: off).
        self.auth = auth
        #: With TLS and auth: the set-up's certificate (its common name is auth.admin_user).
        self.admin_tls = admin_tls
        #: The address clients dial (a bridge address when replicas run in network namespaces).
        self.host = host
        self.name = name
        self.data_dir = self.workdir / f"{name}.data"
        self.log_path = self.workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    def start(self, timeout: float = 30.0, client_port: int = 0) -> "EtcdProcess":
        """Starts etcd on ``client_port`` (0: any free one; :attr:`endpoint` says which),
        and sets its authentication up (``auth``)."""
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: `make test` installs Debian's etcd-server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")
        since = log_file.tell()  # a restart appends: look for its own "serving" line
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
             "--heartbeat-interval", "20", "--election-timeout", "200", "--log-level", "info",
             # Passwords here are 24 random bytes: bcrypt's work factor buys nothing, and
             # costs every Authenticate CPU on machines the tests share.
             "--bcrypt-cost", "4"],
            stdout=log_file, stderr=subprocess.STDOUT,
            env={**os.environ, "ETCD_UNSUPPORTED_ARCH": os.uname().machine}, start_new_session=True)
        log_file.close()

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n{self.log_tail()}")
            with open(self.log_path, "rb") as fh:
                fh.seek(since)
                match = _SERVING.search(fh.read().decode(errors="replace"))
            if match:
                self.endpoint = f"https://{match.group(1)}" if self.tls else match.group(1)
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not serving after {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.05)
        if self.auth is not None:
            try:
                wait_serving(self.endpoint, self.admin_tls, max(deadline - time.monotonic(), 1.0))
                setup_auth(self.endpoint, self.auth, self.admin_tls)
            except BaseException:
                self.stop()
                raise
        return self

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


def password_auth(directory: str | Path, broker_user: str = "txmq-broker", prefix: str = "/txmq") -> EtcdAuth:
    """Password-mode auth for a local etcd: root's and the brokers' passwords made once and
    kept in ``directory`` (``etcd-root.password``, ``etcd-broker.password``, mode 0600), so a
    restart over the same data authenticates with them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    def kept(name: str) -> str:
        path = directory / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(24) + "\n")
        return path.read_text().strip()

    return EtcdAuth((broker_user,), prefix=prefix, broker_password=kept("etcd-broker.password"),
                    root_password=kept("etcd-root.password"))


# --- python -m services.common.etcd ------------------------------------------------------------

def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.common.etcd", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup-auth", help="lock txmq's keys in etcd to the brokers (idempotent)")
    setup.add_argument("--endpoint", required=True, help="host:port (plaintext) or https://host:port")
    setup.add_argument("--prefix", default="/txmq", help="txmq's key prefix (broker etcd_prefix; default /txmq)")
    setup.add_argument("--broker-user", action="append", required=True,
                       help="a broker's etcd user: its certificate's common name (mTLS), or the brokers' "
                            "password user (repeatable)")
    setup.add_argument("--broker-password-file", default="", help="password mode: the brokers' password")
    setup.add_argument("--root-password-file", default="", help="password mode: root's password")
    setup.add_argument("--admin-user", default="", help="mTLS: the common name of --cert-file (given the root role)")
    setup.add_argument("--ca-file", default="")
    setup.add_argument("--cert-file", default="")
    setup.add_argument("--key-file", default="")
    setup.add_argument("--server-name", default="",
                       help="the name etcd's certificate is checked against (default: the endpoint's host)")
    setup.add_argument("--wait-seconds", type=float, default=120.0, help="wait this long for etcd to answer")
    return parser.parse_args(argv)


def _read(path: str) -> str:
    return Path(path).read_text().strip() if path else ""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    configure_logging("etcd-auth")
    try:
        auth = EtcdAuth(tuple(args.broker_user), prefix=args.prefix,
                        broker_password=_read(args.broker_password_file),
                        root_password=_read(args.root_password_file), admin_user=args.admin_user)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"setup-auth: {exc}\n")
        return 2
    tls = TlsFiles(args.ca_file, args.cert_file, args.key_file, args.server_name) if args.cert_file else None

    def apply() -> None:
        wait_serving(args.endpoint, tls, args.wait_seconds)
        setup_auth(args.endpoint, auth, tls)

    try:
        apply()
    except grpc.RpcError as exc:
        sys.stderr.write(f"setup-auth: etcd refused: {exc.code().name}: {exc.details()}\n")
        return 1
    sys.stdout.write(f"etcd at {args.endpoint}: authentication on; {BROKER_ROLE!r} on {args.prefix.rstrip('/')}/ "
                     f"for {', '.join(args.broker_user)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
