"""The replica's driver: its lease, its election rounds, its terms as leader, and the I/O
they need (etcd, the replication stream, timers), around the pure decisions of
:mod:`.state` — etcd raft's ``node.go`` to its ``raft.go``.

Every replica of a shard runs a :class:`ReplicaNode` on the broker's event loop. Each
round (every ``election_poll_seconds``) it reads the shard's state from etcd, asks
:class:`~.state.Election` what to do and does it: follow (:mod:`.following`), campaign,
step down, or — leading — keep the in-sync set and fail what the commit point can no
longer reach. While it leads, a :class:`Term` (domain, bridge, servicer over the store)
serves clients: the bridge asks :class:`~.state.Leadership` before every write and waits
for its commit point, which the followers' acks (:mod:`.shipping`) move.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from txmq.errors import InvalidFieldError, LeadershipLostError, NotEnoughReplicasError, NotLeaderError, TxmqError
from txmq.v1 import nameserver_pb2, replication_pb2

from ..config import BrokerConfig
from ..coordination import EtcdUnavailable, ShardCoordinator
from ..store import replog
from ..store.db import Database
from ..transport import Connection, Refused
from . import rebuild, state
from .errors import ReplicaNotInSyncError
from .following import Following
from .shipping import Shipper
from .state import Election, InSync, Leader, Leadership, Progress, ShardState, View

log = logging.getLogger(__name__)


@dataclass
class Term:
    """One leadership: the domain, the bridge and the servicer serving clients in it."""

    epoch: int
    servicer: Any
    bridge: Any
    core: Any
    close: Callable[[], Awaitable[None]] = field(default=lambda: asyncio.sleep(0))


class ReplicaNode:
    def __init__(self, config: BrokerConfig, db: Database, *, address: Callable[[], str],
                 replication_address: Callable[[], str], make_term: Callable[[int], Awaitable[Term]],
                 on_role_change: Callable[[], None] = lambda: None, metrics: Any = None) -> None:
        self.config = config
        self.db = db
        self.shard = config.broker_name
        self.replica_id = config.replica_id
        self.address = address
        self.replication_address = replication_address
        self.metrics = metrics
        self.rules = state.Rules.of(config)
        self.election = Election(self.rules)
        self.coord = ShardCoordinator(config.etcd_endpoints, config.etcd_prefix, self.shard, self.replica_id)
        self.shipper = Shipper(config)
        self.following = Following(config, lambda: self.db, self._rebuild)
        self._make_term = make_term
        self._on_role_change = on_role_change
        #: This replica's leadership (both None while it follows).
        self.term: Term | None = None
        self.lead: Leadership | None = None
        #: The epoch it leads (or last led) in.
        self.epoch = 0
        self.state = ShardState(None, InSync((), 0))
        self._lease_ok_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        #: In-sync set upkeep started by a follower's session ending (cancelled by stop).
        self._upkeep: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.leadership_changes = 0
        self.refused_writes = 0
        db.append_listeners.append(self.shipper.appended)

    @property
    def is_leader(self) -> bool:
        return self.term is not None

    @property
    def commit_lsn(self) -> int:
        return self.lead.commit if self.lead is not None else self.db.commit_lsn

    @property
    def messages_shipped(self) -> int:
        return self.shipper.messages_shipped

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        while True:
            try:
                await self.coord.grant_lease(int(self.config.leader_lease_seconds))
                break
            except EtcdUnavailable as exc:
                log.warning("etcd unreachable, retrying", extra={"fields": {"error": str(exc)[:200]}})
                await asyncio.sleep(self.config.election_poll_seconds)
        self._lease_ok_at = time.monotonic()
        self._tasks = [asyncio.create_task(self._keep_lease(), name="lease"),
                       asyncio.create_task(self._elect(), name="election")]
        log.info("replica started", extra={"fields": {
            "shard": self.shard, "replica_id": self.replica_id, "log_end": self.db.written,
            "member": self.db.is_member, "epochs": self.db.epochs[-3:]}})

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

    # --- serving --------------------------------------------------------------------------

    def serving(self) -> Term:
        """The current leadership, or NotLeaderError naming the leader."""
        if self.term is None:
            leader = self.state.leader
            if leader is not None and leader.replica != self.replica_id:
                raise NotLeaderError(self.shard, self.replica_id, leader.address, leader.replica)
            raise NotLeaderError(self.shard, self.replica_id)
        return self.term

    def _refuse(self, refusal: TxmqError | None) -> None:
        if refusal is not None:
            if isinstance(refusal, NotEnoughReplicasError):
                self.refused_writes += 1
            raise refusal

    def _advance(self) -> None:
        """The commit point may move (an ack, a local sync, a new in-sync set)."""
        lead, term = self.lead, self.term
        if lead is not None and term is not None and lead.advance_commit(term.bridge.durable):
            self.db.note_commit(lead.commit)
            term.bridge.release()

    # --- lease and election ---------------------------------------------------------------

    async def _keep_lease(self) -> None:
        ttl = int(self.config.leader_lease_seconds)
        while True:
            await asyncio.sleep(max(ttl / 3, 0.1))
            try:
                left = await self.coord.keep_alive()
            except EtcdUnavailable as exc:
                log.warning("lease renewal failed", extra={"fields": {"error": str(exc)[:200]}})
                continue
            if left > 0:
                self._lease_ok_at = time.monotonic()
                continue
            log.warning("lease expired", extra={"fields": {"leader": self.is_leader}})
            await self._step_down("lease expired")
            with contextlib.suppress(EtcdUnavailable):
                await self.coord.grant_lease(ttl)
                self._lease_ok_at = time.monotonic()

    async def _elect(self) -> None:
        while True:
            try:
                await self._elect_round()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad round must not end the loop
                log.exception("election round failed")
            await asyncio.sleep(self.config.election_poll_seconds)

    async def _elect_round(self) -> None:
        shard: ShardState | None = None
        error = ""
        try:
            shard = self.state = await self.coord.read()
        except EtcdUnavailable as exc:
            error = str(exc)
        view = View(shard, time.monotonic(), self._lease_ok_at, self.coord.lease_id,
                    self.epoch if self.term is not None else None, self.following.epoch, self.db.is_member,
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
                    self.db.set_member(True)
                    log.info("replica is a complete member of its shard", extra={"fields": {"log_end": self.db.written}})
                case state.StopFollowing():
                    await self.following.stop()
                case state.Campaign(isr, members):
                    await self._campaign(isr, members)

    async def _campaign(self, isr: InSync, members: tuple[int, ...]) -> None:
        try:
            epoch = await self.coord.campaign(self.address(), self.replication_address(), isr, members)
        except EtcdUnavailable:
            return
        if epoch is not None:
            await self._become_leader(epoch, InSync(tuple(sorted(members)), epoch))

    async def _become_leader(self, epoch: int, isr: InSync) -> None:
        db = self.db
        if not db.is_member:
            db.set_member(True)  # the founder
        db.begin_epoch(epoch)
        self.epoch = epoch
        started = time.monotonic()
        lead = Leadership(self.rules, epoch, isr, db.commit_lsn, started)
        self.shipper.lead()
        db.read_ticket = db.written  # nothing on disk is shown before it is committed
        term = await self._make_term(epoch)
        bridge = term.bridge
        bridge.commit_gate = lambda: lead.commit
        bridge.write_guard = lambda: self._refuse(lead.refuse_write(time.monotonic()))
        bridge.handover_guard = lambda: self._refuse(lead.refuse_any_write(time.monotonic(), self.db.read_ticket))
        bridge.sync_listeners.append(lambda _durable: self._advance())
        self.term, self.lead = term, lead
        self.leadership_changes += 1
        self.state = ShardState(Leader(self.replica_id, self.address(), epoch, self.coord.lease_id,
                                       self.replication_address()), isr)
        log.warning("became leader", extra={"fields": {
            "shard": self.shard, "replica_id": self.replica_id, "epoch": epoch, "in_sync": list(isr.members),
            "log_end": db.written, "commit_lsn": lead.commit, "open_seconds": round(time.monotonic() - started, 3)}})
        self._advance()
        self._on_role_change()

    async def _step_down(self, why: str) -> None:
        term, lead = self.term, self.lead
        if term is None or lead is None:
            return
        self.term = self.lead = None
        self.leadership_changes += 1
        self.shipper.stop_leading()
        waiting = term.bridge.waiting
        term.bridge.fail_all(LeadershipLostError(self.shard, self.replica_id))
        log.warning("stepped down", extra={"fields": {
            "shard": self.shard, "replica_id": self.replica_id, "epoch": self.epoch, "why": why,
            "waiting_answers_failed": waiting, "commit_lsn": lead.commit, "log_end": self.db.written}})
        try:
            await term.close()
        except Exception:  # noqa: BLE001
            log.exception("closing the term failed")
        self._on_role_change()

    # --- the in-sync set (leader) -----------------------------------------------------------

    async def _maintain_isr(self) -> None:
        lead, term = self.lead, self.term
        if lead is None or term is None:
            return
        stalled = lead.uncommittable(time.monotonic())
        if stalled is not None:
            term.bridge.fail_waiting(stalled, above=lead.commit)
        wanted = lead.wanted_isr(time.monotonic())
        if wanted is None:
            return
        try:
            updated = await self.coord.set_isr(lead.epoch, lead.isr, wanted)
        except EtcdUnavailable:
            return
        if updated is None:
            log.warning("in-sync set change refused by etcd", extra={"fields": {"wanted": list(wanted)}})
            return
        if self.lead is not lead:
            return
        log.warning("in-sync set changed", extra={"fields": {
            "shard": self.shard, "from": list(lead.isr.members), "to": list(updated.members), "epoch": lead.epoch}})
        lead.isr = updated
        self.state = ShardState(self.state.leader, updated)
        self._advance()
        self._on_role_change()

    # --- the replication stream and rebuilds (leader side) ----------------------------------

    async def replicate(self, conn: Connection, hello: tuple[str, int, int, int, int, str]) -> None:
        """A follower's session (``transport.ReplicationListener`` authenticated it and read
        its hello): the truncation point, then entries as it acknowledges them."""
        shard, replica_id, hello_epoch, log_end, last_epoch, _token = hello
        lead, db = self.lead, self.db
        refused = state.refuse_session(self.rules, shard, replica_id, hello_epoch, lead.epoch if lead else None)
        if refused is not None:
            raise Refused(*refused)  # the listener answers it
        assert lead is not None
        end_epoch, end = replog.epoch_end(db.epochs, last_epoch, db.written)
        truncate_to = min(log_end, end) if log_end else 0
        progress = lead.connect(replica_id, time.monotonic(), db.written)
        log.info("follower connected", extra={"fields": {
            "replica_id": replica_id, "log_end": log_end, "last_epoch": last_epoch,
            "truncate_to": truncate_to, "epoch": lead.epoch, "peer": conn.peer()}})
        try:
            await self.shipper.serve(conn, db, lead, progress, truncate_to, end_epoch,
                                     serving=lambda: self.lead is lead and lead.current(progress),
                                     on_ack=self._acked)
        finally:
            if lead.disconnect(progress, time.monotonic()) and self.lead is lead and not self._stopping:
                upkeep = asyncio.ensure_future(self._maintain_isr())
                self._upkeep.add(upkeep)
                upkeep.add_done_callback(self._upkeep.discard)
            log.info("follower disconnected", extra={"fields": {"replica_id": replica_id, "durable": progress.durable}})

    def _acked(self, progress: Progress, durable: int) -> None:
        if self.lead is not None:
            self.lead.ack(progress, durable, self.db.written, time.monotonic())
            self._advance()

    def fetch_checkpoint(self, request: replication_pb2.FetchCheckpointRequest,
                         context: Any) -> AsyncIterator[replication_pb2.FetchCheckpointResponse]:
        def refusal() -> Any:
            lead = self.lead
            return state.refuse_session(self.rules, request.shard, request.replica_id, request.leader_epoch,
                                        lead.epoch if lead else None)
        return rebuild.serve_checkpoint(self.db, self.config.data_dir, request, context, refusal)

    async def _rebuild(self, leader: Leader) -> None:
        self.db = await rebuild.rebuild_from(self.config, self.db, leader)

    # --- hand-over --------------------------------------------------------------------------

    async def transfer(self, shard: str, to: int) -> tuple[int, int]:
        """Hands the leadership to in-sync replica ``to``: refuses new writes, waits until
        ``to`` holds the whole log, then deletes the leader key naming ``to`` as the
        replica to campaign, and steps down. Returns (this replica, the log end)."""
        if shard != self.shard:
            raise InvalidFieldError("shard", f"this is {self.shard!r}, not {shard!r}")
        term, lead = self.serving(), self.lead
        assert lead is not None
        if to == self.replica_id:
            return self.replica_id, self.db.written
        self._refuse(lead.refuse_transfer(to))
        lead.handing_over = to  # from now on every write is refused
        try:
            deadline = time.monotonic() + max(self.config.replica_lag_max_seconds, 1.0)
            # The log may end in writes that needed no sync (receives, acks): nothing syncs
            # them while writes are refused, and the commit point waits for this replica's
            # own sync too. Ask for one.
            term.bridge.when_durable(self.db.written, lambda: None)
            while not lead.holds_log(to, self.db.written):
                if time.monotonic() > deadline or self.lead is not lead or lead.refuse_transfer(to) is not None:
                    raise ReplicaNotInSyncError(self.shard, to, list(lead.isr.members))
                await asyncio.sleep(0.01)
            log_end = self.db.written
            if not await self.coord.hand_over(lead.epoch, to, max(int(self.config.leader_lease_seconds), 2)):
                raise ReplicaNotInSyncError(self.shard, to, list(lead.isr.members))
            await self._step_down(f"leadership handed to replica {to}")
            return self.replica_id, log_end
        finally:
            lead.handing_over = None

    # --- status -----------------------------------------------------------------------------

    def status(self) -> nameserver_pb2.ReplicationStatus:
        lead = self.lead
        out = nameserver_pb2.ReplicationStatus(
            replication_factor=self.config.replication_factor, min_insync_replicas=self.config.min_insync_replicas,
            in_sync_replicas=list(self.state.isr.members), log_end=self.db.written,
            commit_lsn=self.commit_lsn, complete=self.db.is_member)
        if lead is not None:
            out.followers.extend(lead.follower_status(time.monotonic(), self.db.written))
        return out

    def role(self) -> int:
        return nameserver_pb2.BROKER_ROLE_LEADER if self.term is not None else nameserver_pb2.BROKER_ROLE_FOLLOWER

    def known_epoch(self) -> int:
        leader = self.state.leader
        return self.epoch if self.term is not None else (leader.epoch if leader else self.db.last_epoch)
