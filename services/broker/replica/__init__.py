"""A replica of a replicated shard (docs/replication.md; its code map names each file's job).

- ``state.py``: the decisions, pure (no asyncio, no I/O, no clock reads): follower
  progress, the commit point, the in-sync set, write admission, eligibility, role changes.
- ``node.py``: the driver doing their I/O — the lease, election rounds, terms as leader.
- ``term.py``: a leadership as clients see it, its bridge gated by the decisions.
- ``shipping.py`` / ``following.py``: the replication stream's leader and follower sides.
- ``rebuild.py``: a replica copying its leader's checkpoint; ``handover.py``: a planned
  hand-over; ``service.py``: the gRPC ReplicationService (rebuilds, hand-overs);
  ``errors.py``: the errors they answer with.
"""
