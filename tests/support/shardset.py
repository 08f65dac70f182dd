"""The shards of a chaos run (tests/chaos.py): which shards a scheduled fault hits, and what
a run asks of every shard of its cluster.

A schedule entry names its shards after an ``@``, joined by ``+`` in the order the fault
uses them: ``kill-leader@broker-1``, ``kill-pause-leaders@broker-1+broker-0`` (the first
shard's leader killed, the second's paused). An entry without ``@`` hits ``broker-0`` (the
one shard of a single-shard run, whose schedules name no shard) or, for a fault of the
whole cluster (etcd, the name server), no shard at all.

:class:`ShardSet` holds a :class:`~tests.support.cluster.Cluster` (composition: the cluster
starts and stops the processes, the shard set asks them questions) and answers per shard:
its leader, who could succeed a stopped leader, where a topic's queues are, whether its
replicas are in sync, and — once the load has stopped — whether its replicas are equal and
clean and kept the check budget.
"""

from __future__ import annotations

import random
from typing import Sequence

from . import replicas
from .cluster import Cluster
from .processes import ServiceProcess

#: The shard of a single-shard run, and of a schedule entry that names none.
FIRST = "broker-0"


def shard_names(count: int) -> list[str]:
    """The shards a ``Cluster(brokers=count, ...)`` starts, in order."""
    return [f"broker-{i}" for i in range(count)]


def label(fault: str, shards: Sequence[str]) -> str:
    """The schedule entry of ``fault`` against ``shards`` (``fault@a+b``; ``fault`` alone
    when it hits no particular shard)."""
    return f"{fault}@{'+'.join(shards)}" if shards else fault


def parse(entry: str) -> tuple[str, tuple[str, ...]]:
    """``(fault, shards)`` of a schedule entry; an entry without ``@`` hits :data:`FIRST`."""
    fault, _, where = entry.partition("@")
    return fault, tuple(where.split("+")) if where else (FIRST,)


def draw(rnd: random.Random, names: Sequence[str], hits: int) -> tuple[str, ...]:
    """``hits`` distinct shards of ``names`` drawn from ``rnd`` (in the order a fault uses them)."""
    return tuple(rnd.sample(list(names), hits)) if hits > 1 else (rnd.choice(list(names)),)


class ShardSet:
    """Every replicated shard of ``cluster``, asked one at a time."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    @property
    def names(self) -> list[str]:
        return sorted(self.cluster.shards)

    def replicas(self, shard: str) -> list[ServiceProcess]:
        return self.cluster.shards[shard]

    def leader(self, shard: str, timeout: float = 60.0) -> ServiceProcess:
        """``shard``'s leader once every name server routes one (waits up to ``timeout``)."""
        return self.cluster.wait_leaders(timeout, shards=[shard])[shard]

    def successors(self, shard: str, leader: ServiceProcess) -> tuple[list[int], dict[int, str]]:
        """The running replicas of ``shard`` other than ``leader`` that may lead by their own
        registration (named in the in-sync set as they read it from etcd, and complete), and
        what each said."""
        others = {int(p.env["TXMQ_REPLICA_ID"]) for p in self.replicas(shard) if p is not leader and p.running}
        views = {b.replica_id: b for b in self.cluster.list_replicas() if b.name == shard and b.replica_id in others}
        eligible = sorted(r for r, b in views.items()
                          if r in b.replication.in_sync_replicas and b.replication.complete)
        return eligible, {r: f"in-sync {list(b.replication.in_sync_replicas)} complete={b.replication.complete}"
                          for r, b in sorted(views.items())}

    def queues(self, topic: str) -> dict[str, int]:
        """How many queues of ``topic`` each shard holds, as the name server routes it (0 for
        a shard that holds none)."""
        counts = dict.fromkeys(self.names, 0)
        for queue in self.cluster.query_route(topic):
            counts[queue.broker_name] = counts.get(queue.broker_name, 0) + 1
        return counts

    def wait_in_sync(self, timeout: float = 90.0) -> None:
        """Until every shard's replicas are in sync (:func:`replicas.wait_in_sync`), one
        shard after the other, ``timeout`` each."""
        for shard in self.names:
            replicas.wait_in_sync(self.cluster, shard, timeout=timeout)

    def stop_and_compare(self, check_max: int) -> list[str]:
        """Stops every shard's replicas and compares them (equal digests, fsck clean: raises
        otherwise, naming the shard); returns a violation for each shard that sent a
        transaction more than ``check_max`` checks."""
        problems = []
        for shard in self.names:
            try:
                replicas.stop_and_compare(self.cluster, shard)
            except AssertionError as exc:
                raise AssertionError(f"{shard}: {exc}") from None
            spent = max(replicas.max_checks_spent(p) for p in self.replicas(shard))
            if spent > check_max:
                problems.append(f"{shard}: a transaction was sent {spent} checks, above check_max={check_max}")
        return problems

