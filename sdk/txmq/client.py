"""The low-level client the SDK's producers and consumers are built on (as temporalio's
``service.py`` is): name servers with failover, the route cache, one gRPC channel per
broker and the error mapping of every call. For services, the pipeline and tools that
speak the ``txmq.v1`` stubs directly; applications use the producers and consumers."""

from ._calling import CHANNEL_OPTIONS, MAX_ENTRIES_PER_REQUEST, QueueRoute, parse_nameservers  # re-exported
from ._client import Client

__all__ = ["CHANNEL_OPTIONS", "MAX_ENTRIES_PER_REQUEST", "Client", "QueueRoute", "parse_nameservers"]
