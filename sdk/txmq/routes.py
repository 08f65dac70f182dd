"""The topic routes a client keeps: the last route stands while no name server answers,
and concurrent lookups share one call (see ``txmq._routes``).

The public home of ``txmq._routes`` (what services, the pipeline and tools import)."""

from ._routes import STALE_ROUTE_RETRY_SECONDS, RouteCache, SharedLookups, name_servers_unreachable  # re-exported

__all__ = [
    "STALE_ROUTE_RETRY_SECONDS",
    "RouteCache",
    "SharedLookups",
    "name_servers_unreachable",
]
