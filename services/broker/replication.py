"""The replica of a replicated shard, by the names the broker's server builds it with. The
code lives in ``replica/`` (its ``__init__`` and docs/replication.md map which file owns
what); this module keeps the names where the server and tools import them."""

from .replica.errors import ReplicaNotInSyncError
from .replica.node import ReplicaNode
from .replica.term import Term
from .replica.service import ReplicationServicer

__all__ = ["ReplicaNode", "ReplicaNotInSyncError", "ReplicationServicer", "Term"]
