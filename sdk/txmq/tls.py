"""TLS material for channels: :class:`TLS` (the files a client names), read again when they
change on disk, the helpers the services share with the SDK to check a certificate and
its key and to open channels with them, and the ``--tls-*`` flags of the command-line tools
(the CLI, the audit job).

The public home of ``txmq._tls`` (what services, the pipeline and tools import)."""

from ._tls import (CLI_FLAGS, TLS, ChannelTLS, PemFiles, add_tls_arguments, changed_pair,  # re-exported
                   check_pair, sync_channel, tls_from_args)

__all__ = ["CLI_FLAGS", "TLS", "ChannelTLS", "PemFiles", "add_tls_arguments", "changed_pair", "check_pair",
           "sync_channel", "tls_from_args"]
