"""Certificates for the TLS tests, made with the openssl command line (a CA, and certificates
it signs for services and clients: EC P-256, valid for localhost and 127.0.0.1, usable as
server and client certificates).

    ca = CertificateAuthority(tmp_path / "pki")
    server = ca.issue("broker")                # .cert_file, .key_file, .serial
    expired = ca.issue("late", expired=True)
"""

from __future__ import annotations

import itertools
import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

#: Every certificate's names: what the tests dial.
DEFAULT_SANS = ("DNS:localhost", "IP:127.0.0.1")

_serials = itertools.count(1000)


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise RuntimeError("openssl is not installed (Debian's openssl package)")
    subprocess.run([binary, *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Certificate:
    name: str
    cert_file: str
    key_file: str
    serial: int


class CertificateAuthority:
    def __init__(self, directory: str | Path, name: str = "txmq-test-ca") -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.key_file = str(self.dir / f"{name}.key")
        self.cert_file = str(self.dir / f"{name}.crt")
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", self.key_file, "-out", self.cert_file, "-days", "2", "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def issue(self, name: str, *, sans: tuple[str, ...] = DEFAULT_SANS, expired: bool = False,
              directory: str | Path | None = None) -> Certificate:
        """A certificate for ``name`` (its CN) signed by this CA; ``expired``: its validity
        ended yesterday. Written as ``<name>.crt`` / ``<name>.key`` in ``directory``."""
        out = Path(directory) if directory is not None else self.dir
        out.mkdir(parents=True, exist_ok=True)
        key, csr, cert, ext = (str(out / f"{name}.{s}") for s in ("key", "csr", "crt", "ext"))
        serial = next(_serials)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        Path(ext).write_text(f"subjectAltName={','.join(sans)}\n"
                             "extendedKeyUsage=serverAuth,clientAuth\n"
                             "keyUsage=critical,digitalSignature\n")
        _openssl("x509", "-req", "-in", csr, "-CA", self.cert_file, "-CAkey", self.key_file,
                 "-set_serial", str(serial), "-out", cert, "-days", "-1" if expired else "1", "-extfile", ext)
        return Certificate(name, cert, key, serial)


def channel_credentials(ca_file: str, cert: Certificate | None = None) -> "grpc.ChannelCredentials":
    """gRPC credentials trusting ``ca_file`` and presenting ``cert`` (None: no client certificate)."""
    import grpc

    ca = Path(ca_file).read_bytes()
    if cert is None:
        return grpc.ssl_channel_credentials(ca)
    return grpc.ssl_channel_credentials(ca, Path(cert.key_file).read_bytes(), Path(cert.cert_file).read_bytes())


def install(cert: Certificate, cert_file: str | Path, key_file: str | Path) -> None:
    """Writes ``cert`` over the files a service reads (key first, then the certificate, each
    replaced at once, as a Secret update would)."""
    for source, target in ((cert.key_file, key_file), (cert.cert_file, cert_file)):
        tmp = Path(f"{target}.new")
        shutil.copyfile(source, tmp)
        tmp.replace(target)


def served_serial(address: str, ca_file: str, client: Certificate | None = None, timeout: float = 5.0) -> int:
    """The serial number of the certificate a TLS server presents in a new handshake."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["h2"])
    if client is not None:
        context.load_cert_chain(client.cert_file, client.key_file)
    with socket.create_connection((host, int(port)), timeout=timeout) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    pem = ssl.DER_cert_to_PEM_cert(der)
    out = subprocess.run(["openssl", "x509", "-noout", "-serial"], input=pem.encode(), check=True,
                         capture_output=True).stdout.decode()
    return int(out.strip().split("=", 1)[1], 16)
