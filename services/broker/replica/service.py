"""ReplicationService on the broker's gRPC port: rebuilds (``FetchCheckpoint``) and planned
hand-overs (``TransferLeadership``) — rare, large or one-shot, unlike the replication
stream's frames (``transport.py``)."""

from __future__ import annotations

from typing import Any, AsyncIterator

from txmq.v1 import replication_pb2, replication_pb2_grpc

from .node import ReplicaNode


class ReplicationServicer(replication_pb2_grpc.ReplicationServiceServicer):
    def __init__(self, node: ReplicaNode) -> None:
        self.node = node

    async def FetchCheckpoint(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for chunk in self.node.fetch_checkpoint(request, context):
            yield chunk

    async def TransferLeadership(self, request: Any, context: Any) -> Any:
        previous, log_end = await self.node.transfer(request.shard, request.replica_id)
        return replication_pb2.TransferLeadershipResponse(previous_replica_id=previous, log_end=log_end)
