"""TLS material for channels: :class:`TLS` (the files a client names), read again when they
change on disk, and the helpers the services share with the SDK to check a certificate and
its key and to open channels with them.

The public home of ``txmq._tls`` (what services, the pipeline and tools import)."""

from ._tls import TLS, ChannelTLS, PemFiles, changed_pair, check_pair, sync_channel  # noqa: F401 - re-exported

__all__ = ["TLS", "ChannelTLS", "PemFiles", "changed_pair", "check_pair", "sync_channel"]
