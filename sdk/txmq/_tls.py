"""TLS for gRPC channels: the CA bundle to trust and, for mutual TLS, the certificate and key
to present, read from PEM files.

The files are read when a channel is opened and looked at again (at most once every
``RELOAD_CHECK_SECONDS``) whenever a channel is about to be used: when their content
changed on disk (a rotated certificate, a Kubernetes Secret updated in place), the client
opens new channels with the new files. Connections already open keep the session they
negotiated.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import grpc

from ._errors import InvalidFieldError

log = logging.getLogger(__name__)

#: How often a client looks at its TLS files for a change (seconds).
RELOAD_CHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class TLS:
    """TLS settings of a client: ``ca_file`` (PEM bundle of the CAs whose server certificates
    are trusted; empty: the system's roots), ``cert_file`` and ``key_file`` (the client
    certificate and its key, for servers that require mutual TLS; both or neither), and
    ``server_name`` (the name the server certificates must carry when it is not the host
    dialed, e.g. when dialing by IP address)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidFieldError("tls", "cert_file and key_file go together (both or neither)")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                raise InvalidFieldError(f"tls.{name}", f"{path!r} is not a readable file")


class PemFiles:
    """A set of PEM files watched for changes: :meth:`read` gives their contents,
    :meth:`changed` the new contents once they differ from what was last read (by content:
    a file rewritten with the same bytes is no change)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)
        self._digest = b""
        self._stat: tuple[Any, ...] = ()

    def _stats(self) -> tuple[Any, ...]:
        out: list[tuple[int, int, int] | None] = []
        for path in self.paths:
            if not path:
                out.append(None)
                continue
            try:
                st = os.stat(path)
            except OSError:
                out.append(None)
                continue
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def read(self) -> tuple[bytes | None, ...]:
        """The contents (None for an unset path); OSError when a file cannot be read."""
        self._stat = self._stats()
        contents = tuple(_read(p) if p else None for p in self.paths)
        self._digest = _digest(contents)
        return contents

    def forget(self) -> None:
        """The next :meth:`changed` reads the files again and gives what it finds."""
        self._stat = ()
        self._digest = b""

    def changed(self) -> tuple[bytes | None, ...] | None:
        """The new contents when a file changed since the last :meth:`read` or
        :meth:`changed`, else None (also while a file cannot be read: the old contents stay)."""
        stat = self._stats()
        if stat == self._stat:
            return None
        self._stat = stat
        try:
            contents = tuple(_read(p) if p else None for p in self.paths)
        except OSError:
            return None
        digest = _digest(contents)
        if digest == self._digest:
            return None
        self._digest = digest
        return contents


def check_pair(cert_file: str, key_file: str) -> None:
    """Raises ssl.SSLError when the key in ``key_file`` is not the key of the certificate in
    ``cert_file`` (or either is not PEM). Reads the files themselves: no copy of the key."""
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)


def changed_pair(files: PemFiles, cert_index: int, key_index: int) -> tuple[bytes | None, ...] | None:
    """:meth:`PemFiles.changed`, and only when the certificate and key it gives belong
    together (a rotation caught half-written gives None with a warning, and is looked at
    again at the next call)."""
    contents = files.changed()
    if contents is None:
        return None
    cert_file, key_file = files.paths[cert_index], files.paths[key_index]
    if cert_file:
        try:
            check_pair(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            log.warning("TLS files changed but cannot be used; keeping the previous certificate",
                        extra={"fields": {"error": str(exc)[:200]}})
            files.forget()
            return None
        if files.read() != contents:  # changed again while checked: look next time
            files.forget()
            return None
    return contents


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _digest(contents: tuple[bytes | None, ...]) -> bytes:
    h = hashlib.sha256()
    for item in contents:
        h.update(b"-" if item is None else len(item).to_bytes(8, "big") + item)
    return h.digest()


class ChannelTLS:
    """A client's TLS material: credentials for new channels, and a generation number that
    grows when the files change (whoever holds channels opens new ones then). Thread-safe."""

    def __init__(self, tls: TLS) -> None:
        self.tls = tls
        self._files = PemFiles((tls.ca_file, tls.cert_file, tls.key_file))
        self._lock = threading.Lock()
        self._credentials = _channel_credentials(self._files.read())
        self._checked = time.monotonic()
        #: Grows by one each time the files change.
        self.generation = 0

    def current(self) -> int:
        """The generation after looking at the files (at most once a RELOAD_CHECK_SECONDS)."""
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_SECONDS:
            return self.generation
        with self._lock:
            if now - self._checked >= RELOAD_CHECK_SECONDS:
                self._checked = now
                contents = changed_pair(self._files, 1, 2)
                if contents is not None:
                    self._credentials = _channel_credentials(contents)
                    self.generation += 1
        return self.generation

    def options(self) -> tuple[tuple[str, Any], ...]:
        if self.tls.server_name:
            return (("grpc.ssl_target_name_override", self.tls.server_name),)
        return ()

    def sync_channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        return grpc.secure_channel(address, self._credentials, options=(*options, *self.options()))

    def aio_channel(self, address: str, options: Sequence[tuple[str, Any]],
                    interceptors: Sequence[Any] | None = None) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(address, self._credentials, options=(*options, *self.options()),
                                       interceptors=interceptors)


def _channel_credentials(contents: tuple[bytes | None, ...]) -> grpc.ChannelCredentials:
    ca, cert, key = contents
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def sync_channel(address: str, options: Sequence[tuple[str, Any]], tls: ChannelTLS | None) -> grpc.Channel:
    """A sync channel to ``address``: TLS with ``tls``' current files, plaintext without."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    tls.current()
    return tls.sync_channel(address, options)


# ------------------------------------------------------------------ command-line flags

#: The TLS flags of txmq's command-line tools (the CLI, the audit job): (flag, environment
#: variable it defaults to, TLS field, what), named like the services' settings.
CLI_FLAGS = (
    ("--tls-ca", "TXMQ_TLS_CA_FILE", "ca_file", "CA bundle (PEM) to trust: the name servers are dialed with TLS"),
    ("--tls-cert", "TXMQ_TLS_CERT_FILE", "cert_file", "client certificate (PEM) to present, for mutual TLS"),
    ("--tls-key", "TXMQ_TLS_KEY_FILE", "key_file", "key (PEM) of --tls-cert"),
    ("--tls-server-name", "TXMQ_TLS_SERVER_NAME", "server_name",
     "name the server certificates carry when not the host dialed"),
)


def add_tls_arguments(parser: Any) -> None:
    """Adds :data:`CLI_FLAGS` to ``parser`` (a parser or an argument group), left unset when
    not given: a subcommand's parser does not reset what came before, and
    :func:`tls_from_args` falls back to the environment."""
    for flag, variable, field, what in CLI_FLAGS:
        parser.add_argument(flag, default=argparse.SUPPRESS, metavar="NAME" if field == "server_name" else "FILE",
                            help=f"{what} (default ${variable})")


def tls_from_args(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> TLS | None:
    """The TLS the flags (else the environment) ask for; None when no file is named.
    Raises InvalidFieldError naming the flag (and the variable, when the value came from
    there) for a file that cannot be read, or a certificate without its key."""
    values, names = {}, {}
    for flag, variable, field, _what in CLI_FLAGS:
        given = getattr(args, flag[2:].replace("-", "_"), None)
        values[field] = given or env.get(variable) or ""
        names[field] = flag if given else f"{flag} (${variable})" if values[field] else f"{flag} (or ${variable})"
    if not (values["ca_file"] or values["cert_file"] or values["key_file"]):
        return None
    if bool(values["cert_file"]) != bool(values["key_file"]):
        raise InvalidFieldError(names["key_file" if values["cert_file"] else "cert_file"],
                                "missing: --tls-cert and --tls-key go together (both or neither)")
    for field in ("ca_file", "cert_file", "key_file"):
        if values[field] and not os.access(values[field], os.R_OK):
            raise InvalidFieldError(names[field], f"{values[field]!r} is not a readable file")
    return TLS(**values)
