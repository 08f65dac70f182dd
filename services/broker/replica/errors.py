"""The errors a replica's decisions answer with (beside the SDK's own, ``txmq.errors``)."""

from __future__ import annotations

from txmq.errors import FailedPreconditionError, NotEnoughReplicasError, UnavailableError


class ReplicaNotInSyncError(FailedPreconditionError):
    """``txmq broker elect`` named a replica that cannot take the leadership now."""

    reason = "REPLICA_NOT_IN_SYNC"

    def __init__(self, shard: str, replica_id: int, in_sync: list[int]) -> None:
        super().__init__(f"replica {replica_id} of {shard!r} is not in sync with its leader (in-sync set "
                         f"{in_sync}): it cannot take the leadership now", shard=shard, replica_id=replica_id,
                         in_sync=in_sync)


class CommitStalledError(NotEnoughReplicasError):
    """An answer waited for the commit point, which cannot reach it now: an in-sync replica
    it needs has been gone for ``replica_lag_max_seconds`` and the set cannot drop it (it
    keeps ``min_insync_replicas`` members). Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND: a
    write was applied here but is on fewer replicas than required, its outcome unknown
    until they return (retry with the same ids: they deduplicate); a read is never shown
    what is not committed. The client sees NOT_ENOUGH_REPLICAS (UNAVAILABLE, retryable)."""

    def __init__(self, shard: str, in_sync: int, required: int) -> None:
        UnavailableError.__init__(
            self, f"{shard!r} cannot commit what this answer waits for: {in_sync} in-sync replicas able to "
                  f"acknowledge, fewer than min_insync_replicas={required}; what it wrote is on fewer replicas "
                  "than required (outcome unknown until they return) and nothing uncommitted is shown: "
                  "retry with the same ids",
            shard=shard, in_sync=in_sync, required=required)
