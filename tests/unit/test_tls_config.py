"""TLS settings (services/common/tls.py): refused when they cannot work together or name a
file that cannot be read, with the setting named; a mismatched certificate and key keep a
service from starting; the SDK's TLS option checks its files the same way."""

from __future__ import annotations

import pytest

import txmq
from services.common.config import ConfigError, load_config
from services.common.tls import ServerCertificates
from services.nameserver.config import NameServerConfig
from tests.support.certs import CertificateAuthority


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"))
    return ca, ca.issue("a"), ca.issue("b")


def env(**values: str) -> dict[str, str]:
    return {f"TXMQ_TLS_{k.upper()}": v for k, v in values.items()}


def test_plaintext_is_the_default():
    config = load_config(NameServerConfig, [], {})
    assert (config.tls_cert_file, config.tls_key_file, config.tls_client_auth) == ("", "", "none")


def test_valid_settings_load(pki):
    ca, a, _b = pki
    config = load_config(NameServerConfig, [], env(cert_file=a.cert_file, key_file=a.key_file, ca_file=ca.cert_file,
                                                   client_auth="require"))
    assert config.tls_client_auth == "require"


@pytest.mark.parametrize("settings, field", [
    ({"cert_file": "CERT"}, "tls_key_file"),
    ({"key_file": "KEY"}, "tls_cert_file"),
    ({"cert_file": "CERT", "key_file": "KEY", "client_auth": "require"}, "tls_client_auth"),
    ({"cert_file": "CERT", "key_file": "KEY", "client_auth": "request"}, "tls_client_auth"),
    ({"cert_file": "/nonexistent/cert.pem", "key_file": "KEY"}, "tls_cert_file"),
    ({"cert_file": "CERT", "key_file": "KEY", "ca_file": "/nonexistent/ca.pem"}, "tls_ca_file"),
])
def test_settings_that_cannot_work_are_refused_naming_the_setting(pki, settings, field):
    _ca, a, _b = pki
    files = {"CERT": a.cert_file, "KEY": a.key_file}
    with pytest.raises(ConfigError) as info:
        load_config(NameServerConfig, [], env(**{k: files.get(v, v) for k, v in settings.items()}))
    assert info.value.field == field


def test_a_key_that_is_not_the_certificates_keeps_the_service_from_starting(pki):
    _ca, a, b = pki
    with pytest.raises(ValueError, match="tls_cert_file .* and tls_key_file .*private key"):
        ServerCertificates(a.cert_file, b.key_file, "")


def test_the_sdk_checks_its_tls_files(pki):
    ca, a, _b = pki
    txmq.TLS(ca_file=ca.cert_file, cert_file=a.cert_file, key_file=a.key_file)
    with pytest.raises(txmq.InvalidFieldError, match="both or neither"):
        txmq.TLS(ca_file=ca.cert_file, cert_file=a.cert_file)
    with pytest.raises(txmq.InvalidFieldError, match="tls.ca_file"):
        txmq.TLS(ca_file="/nonexistent/ca.pem")
