"""The local etcd process (services/common/etcd.py), for tests."""

from services.common.etcd import EtcdProcess

__all__ = ["EtcdProcess"]
