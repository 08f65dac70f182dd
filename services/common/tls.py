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


log = logging.getLogger(__name__)

_client: ChannelTLS | None = None


def enabled(config: Any) -> bool:
    return bool(config.tls_cert_file)


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


# --- TLS of a plain TCP port (the brokers' replication stream) -----------------------------


class StreamServerTLS:
    """Server-side TLS of a port that is not gRPC's (``services/broker/transport.py``): the
    same files, the same client-certificate rule (``tls_client_auth``) and the same
    reloading as the gRPC port — :meth:`context` is asked at each new handshake, looks at the
    files and takes changed ones (refusing, with a warning, a key that does not match its
    certificate)."""

    def __init__(self, config: Any) -> None:
        self._cert_file, self._key_file, self._ca_file = config.tls_cert_file, config.tls_key_file, config.tls_ca_file
        self._require = config.tls_client_auth == "require"
        self._files = PemFiles((self._cert_file, self._key_file, self._ca_file))
        self._files.read()
        self._context = self._build()
        #: How many times a changed set of files was taken.
        self.reloads = 0

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._cert_file, self._key_file)
        if self._ca_file:
            context.load_verify_locations(cafile=self._ca_file)
        context.verify_mode = ssl.CERT_REQUIRED if self._require else ssl.CERT_NONE
        return context

    def listening_context(self) -> ssl.SSLContext:
        """The context to listen with: each handshake switches (the SNI callback, which
        OpenSSL calls for every ClientHello, with or without a server name) to
        :meth:`context`, so a new connection gets the files' current certificate and CAs."""
        context = self._build()

        def current(ssl_object: Any, _server_name: str | None, _context: ssl.SSLContext) -> None:
            ssl_object.context = self.context()
        context.sni_callback = current
        return context

    def context(self) -> ssl.SSLContext:
        if changed_pair(self._files, 0, 1) is not None:
            try:
                self._context = self._build()
            except (OSError, ssl.SSLError) as exc:
                log.warning("TLS files changed but cannot be used; keeping the previous certificate",
                            extra={"fields": {"error": str(exc)[:200]}})
                self._files.forget()
            else:
                self.reloads += 1
                log.info("TLS certificate reloaded", extra={"fields": {"files": list(self._files.paths)}})
        return self._context


def stream_server_tls(config: Any) -> StreamServerTLS | None:
    return StreamServerTLS(config) if enabled(config) else None


_stream_client: tuple[ChannelTLS, int, ssl.SSLContext] | None = None


def stream_client_context() -> tuple[ssl.SSLContext, str] | None:
    """The process's client TLS for a plain TCP connection (None: plaintext): an SSL context
    presenting its certificate and trusting its CA bundle, built again when the files changed
    (as the gRPC channels are), and the name to check the server's certificate against
    ('' : the host dialed)."""
    global _stream_client
    material = _client
    if material is None:
        return None
    generation = material.current()
    cached = _stream_client
    if cached is None or cached[0] is not material or cached[1] != generation:
        files = material.tls
        context = ssl.create_default_context(cafile=files.ca_file or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if files.cert_file:
            context.load_cert_chain(files.cert_file, files.key_file)
        cached = _stream_client = (material, generation, context)
    return cached[2], material.tls.server_name


def peer_certificate_names(ssl_object: Any) -> list[str]:
    """The names of a verified peer certificate — its common name, then its subject
    alternative names — as gRPC's auth context gives them (``x509_common_name``,
    ``x509_subject_alternative_name``); empty without one."""
    if ssl_object is None:
        return []
    cert = ssl_object.getpeercert()
    if not cert:
        return []
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    names.extend(value for _kind, value in cert.get("subjectAltName", ()))
    return names
