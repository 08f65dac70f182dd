"""The replica's driver: its lease, its election rounds, its terms as leader, and the I/O
they need (etcd, the replication stream, timers), around the pure decisions of
:mod:`.state` — etcd raft's ``node.go`` to its ``raft.go``.

Every replica of a shard runs a :class:`ReplicaNode` on the broker's event loop. Each
round (every ``election_poll_seconds``) it reads the shard's state from etcd, asks
:class:`~.state.Election` what to do and does it: follow (:mod:`.following`), campaign,
step down, or — leading — keep the in-sync set and fail what its commit point can no
longer reach. While it leads, a :class:`~.term.Term` serves clients through a bridge
gated by the term's :class:`~.state.Leadership` (:class:`~.term.Gate`), whose commit point
the followers' acks move (:mod:`.shipping`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from txmq.errors import InvalidFieldError, LeadershipLostError, NotLeaderError
from txmq.v1 import nameserver_pb2, replication_pb2

from services.common.etcd import etcd_credentials

from ..config import BrokerConfig
from ..coordination import EtcdUnavailable, ShardCoordinator
from ..store.db import Database
from ..transport import Connection, Refused
from . import rebuild, state
from .following import Following
from .handover import hand_over
from .shipping import Shipper
from .state import Election, InSync, Leader, Leadership, ShardState, View
from .term import Gate, Term

log = logging.getLogger(__name__)

__all__ = ["ReplicaNode", "Term"]


class ReplicaNode:
    def __init__(self, config: BrokerConfig, db: Database, *, address: Callable[[], str],
                 replication_address: Callable[[], str], make_term: Callable[[int], Awaitable[Term]],
                 on_role_change: Callable[[], None] = lambda: None, metrics: Any = None) -> None:
        self.config, self.db, self.metrics = config, db, metrics
        self.shard, self.replica_id = config.broker_name, config.replica_id
        self.address, self.replication_address = address, replication_address
        self.rules = state.Rules.of(config)
        self.election = Election(self.rules)
        self.coord = ShardCoordinator(config.etcd_endpoints, config.etcd_prefix, self.shard, self.replica_id,
                                      credentials=etcd_credentials(config))
        self.shipper = Shipper(config)
        self.following = Following(config, lambda: self.db, self._rebuild)
        self._make_term, self._on_role_change = make_term, on_role_change
        #: This replica's leadership: all three None while it follows.
        self.term: Term | None = None
        self.lead: Leadership | None = None
        self.gate: Gate | None = None
        self.epoch = 0  # the epoch it leads (or last led) in
        self.state = ShardState(None, InSync((), 0))
        self._tasks: list[asyncio.Task[None]] = []
        self._upkeep: set[asyncio.Task[None]] = set()  # in-sync set upkeep after a session ended
        self._stopping = False
        self.leadership_changes = 0
        self.refused_writes = 0
        db.replication.append_listeners.append(self.shipper.appended)

    @property
    def is_leader(self) -> bool:
        return self.term is not None

    @property
    def commit_lsn(self) -> int:
        return self.lead.commit if self.lead is not None else self.db.replication.commit_lsn

    @property
    def messages_shipped(self) -> int:
        return self.shipper.messages_shipped

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.coord.acquire_lease(int(self.config.leader_lease_seconds), self.config.election_poll_seconds)
        self._tasks = [asyncio.create_task(self.coord.hold_lease(self._lease_expired), name="lease"),
                       asyncio.create_task(self._elect(), name="election")]
        log.info("replica started", extra={"fields": {
            "shard": self.shard, "replica_id": self.replica_id, "log_end": self.db.written,
            "member": self.db.replication.is_member, "epochs": self.db.replication.epochs[-3:]}})

    def stopping(self) -> None:
        """The process began to stop: it takes no leadership, and follower sessions it
        closes now are no lagging followers (their end changes no in-sync set)."""
        self._stopping = True

    async def stop(self) -> None:
        self._stopping = True
        tasks = [*self._tasks, *self._upkeep]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.following.stop()
        if self.term is not None:
            epoch = self.epoch
            await self._step_down("stopping")
            with contextlib.suppress(EtcdUnavailable):
                await self.coord.resign(epoch)  # a clean hand-over: no lease to wait out
        with contextlib.suppress(EtcdUnavailable):
            await self.coord.revoke_lease()
        await self.coord.close()

    def serving(self) -> Term:
        """The current leadership, or NotLeaderError naming the leader."""
        if self.term is None:
            leader = self.state.leader
            if leader is not None and leader.replica != self.replica_id:
                raise NotLeaderError(self.shard, self.replica_id, leader.address, leader.replica)
            raise NotLeaderError(self.shard, self.replica_id)
        return self.term

    # --- lease and election ---------------------------------------------------------------

    async def _lease_expired(self) -> None:
        log.warning("lease expired", extra={"fields": {"leader": self.is_leader}})
        await self._step_down("lease expired")

    async def _elect(self) -> None:
        while True:
            try:
                await self._elect_round()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not end the loop
                log.exception("election round failed")
            await asyncio.sleep(self.config.election_poll_seconds)

    async def _elect_round(self) -> None:
        shard: ShardState | None = None
        error = ""
        try:
            shard = self.state = await self.coord.read()
        except EtcdUnavailable as exc:
            error = str(exc)
        view = View(shard, time.monotonic(), self.coord.renewed_at, self.coord.lease_id,
                    self.epoch if self.term is not None else None, self.following.epoch, self.db.replication.is_member,
                    self.db.written, self.following.commit, self._stopping, error)
        for action in self.election.round(view):
            match action:
                case state.StepDown(why):
                    await self._step_down(why)
                case state.MaintainIsr():
                    await self._maintain_isr()
                case state.Resign(epoch):
                    with contextlib.suppress(EtcdUnavailable):
                        await self.coord.resign(epoch)
                case state.Follow(leader):
                    await self.following.start(leader)
                case state.BecomeMember():
                    self.db.replication.set_member(True)
                    log.info("replica is a complete member of its shard", extra={"fields": {"log_end": self.db.written}})
                case state.StopFollowing():
                    await self.following.stop()
                case state.Campaign(isr, members):
                    with contextlib.suppress(EtcdUnavailable):
                        won = await self.coord.campaign(self.address(), self.replication_address(), isr, members)
                        if won is not None:
                            await self._become_leader(won, InSync(tuple(sorted(members)), won))

    async def _become_leader(self, epoch: int, isr: InSync) -> None:
        db = self.db
        if not db.replication.is_member:
            db.replication.set_member(True)  # the founder
        db.replication.begin_epoch(epoch)
        self.epoch = epoch
        started = time.monotonic()
        lead = Leadership(self.rules, epoch, isr, db.replication.commit_lsn, started)
        self.shipper.lead()
        db.read_ticket = db.written  # nothing on disk is shown before it is committed
        term = await self._make_term(epoch)
        gate = Gate(lead, term.bridge, lambda: self.db, on_refused=self._refused,
                    cap_reads=term.core.queues.cap_reads)
        self.term, self.lead, self.gate = term, lead, gate
        self.leadership_changes += 1
        self.state = ShardState(Leader(self.replica_id, self.address(), epoch, self.coord.lease_id,
                                       self.replication_address()), isr)
        log.warning("became leader", extra={"fields": {
            "shard": self.shard, "replica_id": self.replica_id, "epoch": epoch, "in_sync": list(isr.members),
            "log_end": db.written, "commit_lsn": lead.commit, "open_seconds": round(time.monotonic() - started, 3)}})
        gate.advance()
        self._on_role_change()

    def _refused(self) -> None:
        self.refused_writes += 1

    async def _step_down(self, why: str) -> None:
        term, lead = self.term, self.lead
        if term is None or lead is None:
            return
        self.term = self.lead = self.gate = None
        self.leadership_changes += 1
        self.shipper.stop_leading()
        waiting = term.bridge.waiting
        term.bridge.fail_all(LeadershipLostError(self.shard, self.replica_id))
        log.warning("stepped down", extra={"fields": {
            "shard": self.shard, "replica_id": self.replica_id, "epoch": self.epoch, "why": why,
            "waiting_answers_failed": waiting, "commit_lsn": lead.commit, "log_end": self.db.written}})
        try:
            await term.close()
        except Exception:
            log.exception("closing the term failed")
        self._on_role_change()

    async def _maintain_isr(self) -> None:
        lead, gate = self.lead, self.gate
        if lead is None or gate is None:
            return
        gate.tick()
        wanted = lead.wanted_isr(time.monotonic())
        if wanted is None:
            return
        try:
            updated = await self.coord.set_isr(lead.epoch, lead.isr, wanted)
        except EtcdUnavailable:
            return
        if updated is None:
            log.warning("in-sync set change refused by etcd", extra={"fields": {"wanted": list(wanted)}})
        elif self.lead is lead:
            log.warning("in-sync set changed", extra={"fields": {
                "shard": self.shard, "from": list(lead.isr.members), "to": list(updated.members), "epoch": lead.epoch}})
            lead.isr = updated
            self.state = ShardState(self.state.leader, updated)
            gate.advance()
            self._on_role_change()

    # --- the replication stream, rebuilds and hand-overs (leader side) -----------------------

    async def replicate(self, conn: Connection, hello: tuple[str, int, int, int, int, str]) -> None:
        """A follower's session (``transport.ReplicationListener`` authenticated it and read
        its hello): the truncation point, then entries as it acknowledges them."""
        lead, gate = self.lead, self.gate
        refused = state.refuse_session(self.rules, *hello[:3], lead.epoch if lead else None)
        if refused is not None:
            raise Refused(*refused)  # the listener answers it
        assert lead is not None and gate is not None  # a replica not leading refuses every session
        await self.shipper.session(conn, hello, self.db, lead, gate, leading=lambda: self.lead is lead,
                                   on_end=lambda: self._session_ended(lead))

    def _session_ended(self, lead: Leadership) -> None:
        if self.lead is lead and not self._stopping:  # its in-sync set may change now
            upkeep = asyncio.ensure_future(self._maintain_isr())
            self._upkeep.add(upkeep)
            upkeep.add_done_callback(self._upkeep.discard)

    def fetch_checkpoint(self, request: replication_pb2.FetchCheckpointRequest,
                         context: Any) -> AsyncIterator[replication_pb2.FetchCheckpointResponse]:
        def refusal() -> Any:
            return state.refuse_session(self.rules, request.shard, request.replica_id, request.leader_epoch,
                                        self.lead.epoch if self.lead else None)
        return rebuild.serve_checkpoint(self.db, self.config.data_dir, request, context, refusal)

    async def _rebuild(self, leader: Leader) -> None:
        self.db = await rebuild.rebuild_from(self.config, self.db, leader)

    async def transfer(self, shard: str, to: int) -> tuple[int, int]:
        """Hands the leadership to in-sync replica ``to`` (:mod:`.handover`). Returns (this
        replica, the log end)."""
        if shard != self.shard:
            raise InvalidFieldError("shard", f"this is {self.shard!r}, not {shard!r}")
        term, lead = self.serving(), self.lead
        if to == self.replica_id:
            return self.replica_id, self.db.written
        assert lead is not None
        log_end = await hand_over(lead, term, self.db, self.coord, to, leading=lambda: self.lead is lead,
                                  wait_seconds=max(self.config.replica_lag_max_seconds, 1.0),
                                  handover_ttl=max(int(self.config.leader_lease_seconds), 2), step_down=self._step_down)
        return self.replica_id, log_end

    # --- status -----------------------------------------------------------------------------

    def status(self) -> nameserver_pb2.ReplicationStatus:
        out = nameserver_pb2.ReplicationStatus(
            replication_factor=self.config.replication_factor, min_insync_replicas=self.config.min_insync_replicas,
            in_sync_replicas=list(self.state.isr.members), log_end=self.db.written,
            commit_lsn=self.commit_lsn, complete=self.db.replication.is_member)
        if self.lead is not None:
            out.followers.extend(self.lead.follower_status(time.monotonic(), self.db.written))
        return out

    def role(self) -> nameserver_pb2.BrokerRole.ValueType:
        return nameserver_pb2.BROKER_ROLE_LEADER if self.term is not None else nameserver_pb2.BROKER_ROLE_FOLLOWER

    def known_epoch(self) -> int:
        leader = self.state.leader
        return self.epoch if self.term is not None else (leader.epoch if leader else int(self.db.replication.last_epoch))
