"""The local etcd process and its authentication (services/common/etcd.py), for tests:
``tests/support/cluster.py`` starts every replicated cluster's etcd with authentication on
(txmq's keys for the brokers only)."""

from services.common.etcd import EtcdAuth, EtcdProcess, TlsFiles, password_auth, setup_auth

__all__ = ["EtcdAuth", "EtcdProcess", "TlsFiles", "password_auth", "setup_auth"]
