"""Which shards new sends avoid: the fault table every client shares (the SDK's producers
and consumers, the RocketMQ proxy's routing, the Spark sink), the retry decisions after an
error, and the back-off on an overloaded service.

The public home of ``txmq._faults`` (what services, the pipeline and tools import)."""

from ._faults import (  # re-exported
    ABANDONED_KEEP_SECONDS,
    FAULT_ROUTE_REFRESH_SECONDS,
    OVERLOAD_RETRIES,
    Abandoned,
    FaultTable,
    OverloadBackoff,
    RetryAction,
    RoutingStats,
    ShardStats,
    overload_backoff_seconds,
    retry_action,
)

__all__ = [
    "ABANDONED_KEEP_SECONDS",
    "FAULT_ROUTE_REFRESH_SECONDS",
    "OVERLOAD_RETRIES",
    "Abandoned",
    "FaultTable",
    "OverloadBackoff",
    "RetryAction",
    "RoutingStats",
    "ShardStats",
    "overload_backoff_seconds",
    "retry_action",
]
