"""TLS of every service: the server side of the gRPC port, and the TLS material of every
channel the service opens to another one (mutual TLS between services).

Settings (``ServiceConfig``, ``TXMQ_TLS_*``): ``tls_cert_file`` and ``tls_key_file`` turn TLS
on; ``tls_ca_file`` is the CA bundle trusted for peers; ``tls_client_auth`` is ``none`` or
``require`` (a client must present a certificate from ``tls_ca_file``). gRPC's Python server
can only require a client certificate or not ask for one, so there is no "request" mode.

Reloading: the server's credentials are dynamic (``grpc.dynamic_ssl_server_credentials``):
before each new handshake gRPC asks :class:`ServerCertificates` for the configuration, which
looks at the files (a ``stat``) and reads them again when they changed. A new certificate
whose key does not match it (a rotation caught half-written) is refused with a warning and
the previous one stays until the files change again. Channels to other services are
opened with the files' current content, and the pools (``channels.ChannelPool``) open new
channels once the files change.

The client side is process-wide (one service per process): :func:`use_config` installs it
before the service opens any channel; :func:`client_tls` is what ``channels`` reads.
"""

from __future__ import annotations

import logging
import os
import ssl
from typing import Any

import grpc

from txmq.tls import TLS, ChannelTLS, PemFiles, changed_pair, check_pair

from .config import ConfigError, env_name, flag_name

log = logging.getLogger(__name__)

_client: ChannelTLS | None = None


def enabled(config: Any) -> bool:
    return bool(config.tls_cert_file)


def check_tls_settings(config: Any) -> None:
    """Raises :class:`ConfigError` for settings that cannot work together or files that cannot
    be read (checked when the configuration is built, before anything is bound)."""
    def refuse(name: str, problem: str) -> ConfigError:
        return ConfigError(name, f"{env_name(name)} / {flag_name(name)}", getattr(config, name), problem)

    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        name = "tls_key_file" if config.tls_cert_file else "tls_cert_file"
        raise refuse(name, "tls_cert_file and tls_key_file go together (both set, or neither)")
    if (config.tls_ca_file or config.tls_server_name) and not config.tls_cert_file:
        name = "tls_ca_file" if config.tls_ca_file else "tls_server_name"
        raise refuse(name, "TLS is on only with tls_cert_file and tls_key_file (this would be ignored)")
    if config.tls_client_auth == "require" and not (config.tls_cert_file and config.tls_ca_file):
        raise refuse("tls_client_auth", "require needs tls_cert_file, tls_key_file and tls_ca_file")
    for name in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
        path = getattr(config, name)
        if path and not os.access(path, os.R_OK):
            raise refuse(name, "not a readable file")


def client_settings(config: Any) -> TLS | None:
    """The TLS a service dials others with: its own certificate (mutual TLS) and CA bundle."""
    if not enabled(config):
        return None
    return TLS(ca_file=config.tls_ca_file, cert_file=config.tls_cert_file, key_file=config.tls_key_file,
               server_name=config.tls_server_name)


def use_config(config: Any) -> None:
    """Makes ``config``'s TLS the one every channel of this process is opened with (plaintext
    when TLS is off)."""
    global _client
    settings = client_settings(config)
    _client = ChannelTLS(settings) if settings is not None else None


def client_tls() -> ChannelTLS | None:
    """The process's channel TLS (None: plaintext)."""
    return _client


class ServerCertificates:
    """The certificate configuration of the gRPC port, read again when the files change."""

    def __init__(self, cert_file: str, key_file: str, ca_file: str) -> None:
        self._files = PemFiles((cert_file, key_file, ca_file))
        try:
            check_pair(cert_file, key_file)
        except ssl.SSLError as exc:  # at start-up the service does not start
            raise ValueError(f"tls_cert_file ({cert_file}) and tls_key_file ({key_file}): not a PEM certificate "
                             f"and its private key ({exc.reason or exc})") from None
        cert, key, ca = self._files.read()
        assert cert is not None and key is not None
        self.initial = _certificate_configuration(cert, key, ca)
        #: How many times a changed set of files was taken.
        self.reloads = 0

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's certificate_configuration_fetcher: None keeps the current configuration."""
        contents = changed_pair(self._files, 0, 1)
        if contents is None:
            return None
        cert, key, ca = contents
        if cert is None or key is None:
            return None
        self.reloads += 1
        log.info("TLS certificate reloaded", extra={"fields": {"files": list(self._files.paths)}})
        return _certificate_configuration(cert, key, ca)


def server_credentials(config: Any) -> tuple[grpc.ServerCredentials, ServerCertificates] | None:
    """The gRPC port's credentials (None: plaintext)."""
    if not enabled(config):
        return None
    certificates = ServerCertificates(config.tls_cert_file, config.tls_key_file, config.tls_ca_file)
    credentials = grpc.dynamic_ssl_server_credentials(
        certificates.initial, certificates.fetch,
        require_client_authentication=config.tls_client_auth == "require")
    return credentials, certificates


def _certificate_configuration(cert: bytes, key: bytes, ca: bytes | None) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)
