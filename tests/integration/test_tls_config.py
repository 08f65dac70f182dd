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
    ({"ca_file": "CERT"}, "tls_ca_file"),
    ({"server_name": "localhost"}, "tls_server_name"),
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


def test_the_tools_tls_flags_fall_back_to_the_environment_and_name_what_is_wrong(pki):
    """The CLI's and the audit job's --tls-* flags: a flag wins over its TXMQ_TLS_* variable,
    and a file that cannot be read or a certificate without its key is refused naming the
    flag (and the variable when the value came from there)."""
    import argparse

    from txmq.tls import add_tls_arguments, tls_from_args

    ca, a, b = pki
    parser = argparse.ArgumentParser()
    add_tls_arguments(parser)
    assert tls_from_args(parser.parse_args([]), {}) is None
    variables = env(ca_file=ca.cert_file, cert_file=a.cert_file, key_file=a.key_file, server_name="localhost")
    assert tls_from_args(parser.parse_args([]), variables) == txmq.TLS(ca.cert_file, a.cert_file, a.key_file,
                                                                        "localhost")
    flags = parser.parse_args(["--tls-cert", b.cert_file, "--tls-key", b.key_file])
    assert tls_from_args(flags, variables) == txmq.TLS(ca.cert_file, b.cert_file, b.key_file, "localhost")
    with pytest.raises(txmq.InvalidFieldError, match=r"^--tls-ca: '/nonexistent/ca.pem' is not a readable file"):
        tls_from_args(parser.parse_args(["--tls-ca", "/nonexistent/ca.pem"]), {})
    with pytest.raises(txmq.InvalidFieldError, match=r"^--tls-ca \(\$TXMQ_TLS_CA_FILE\): '/nonexistent/ca.pem'"):
        tls_from_args(parser.parse_args([]), env(ca_file="/nonexistent/ca.pem"))
    with pytest.raises(txmq.InvalidFieldError, match=r"^--tls-key \(or \$TXMQ_TLS_KEY_FILE\): missing"):
        tls_from_args(parser.parse_args(["--tls-cert", a.cert_file]), {})
