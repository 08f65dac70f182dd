"""A replica of a replicated shard: who leads, shipping the log, the in-sync set, failover.

Every replica of a shard runs a :class:`ReplicaNode` on the broker's event loop. The
design (docs/replication.md) in short:

- **Leadership** is an etcd key under this replica's lease (``coordination.py``); its
  create revision is the epoch. Only the leader serves clients (:meth:`serving` raises
  ``NotLeaderError`` naming the leader on the others). Only a member of the in-sync set
  with a complete store may campaign.
- **The log.** Every write batch the leader applies is also an entry of the replication
  log with an undo record (``store/db.py`` ``_append``); followers apply the very same
  batches with the very same code, so replicas hold equal state. Each shipped entry
  carries the leader's undo record, which a follower stores as it comes instead of reading
  the keys' before-images itself: replicas are equal at every lsn, so they are the same
  (an entry at or below the frame's commit point travels without one).
- **Acknowledgement.** An answer waits until its writes are durable on the leader *and* on
  every member of the in-sync set (the commit point, :attr:`commit_lsn`), and a write that
  must not be lost is refused up front while fewer than ``min_insync_replicas`` replicas
  can acknowledge it (:meth:`write_guard`).
- **In-sync set.** The leader drops a follower that is disconnected or lags more than
  ``replica_lag_max_seconds`` (never below ``min_insync_replicas`` members, so every
  replica that may hold the newest acknowledged write stays eligible) and adds it back once
  caught up, by compare-and-swap in etcd conditioned on its own epoch.
- **Fencing.** A follower follows the epoch etcd names and a leader serves a follower only
  in its own epoch, so a deposed leader (paused, partitioned) cannot get the acks of the
  replica that replaced it: it commits nothing. When it learns (lease gone, key changed) it
  steps down: waiting answers fail with ``LeadershipLostError``, and as a follower it takes
  back its unacknowledged tail (Kafka's leader-epoch truncation, with undo records).
- **Rebuild.** A replica whose log cannot continue the leader's (new, wiped, too far
  behind) copies a RocksDB checkpoint streamed by the leader, then follows.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from txmq.errors import (FailedPreconditionError, InvalidFieldError, LeadershipLostError, NotEnoughReplicasError,
                          NotLeaderError)
from txmq.v1 import nameserver_pb2, replication_pb2, replication_pb2_grpc

from services.common.auth import TokenFile
from services.common.channels import open_channel
from services.common.etcd import etcd_credentials

from .config import BrokerConfig
from .coordination import EtcdUnavailable, InSync, Leader, ShardCoordinator, ShardState
from .store import replog
from .store.checkpoint import StoreCheckpoint, flush_for_checkpoint
from .store.db import CannotTruncateError, Database
from .transport import Connection, Refused, connect

log = logging.getLogger(__name__)

#: Largest FetchCheckpoint message a rebuilding follower accepts.
MAX_CHECKPOINT_MESSAGE_BYTES = 64 * 1024 * 1024
#: Recent entries kept in memory for shipping (older ones are read back from the store).
TAIL_BYTES = 16 * 1024 * 1024
CHECKPOINT_CHUNK = 1024 * 1024
#: Replication messages a leader has in flight to one follower (sent, not yet covered by
#: the follower's durable position). One, as on the Produce stream: what is written while
#: the follower appends, syncs and acknowledges a message travels in the next, so each of
#: its syncs and acks covers more entries under load. Measured (README "Replication
#: performance"): 2 or 4 sent 20-30 % more messages per transaction for no more throughput
#: where the replicas share the CPUs; each message costs a gRPC write and read on both
#: sides, which is most of a replica's CPU per transaction.
SHIP_WINDOW = 1


@dataclass
class FollowerState:
    """What the leader knows of one follower."""

    replica_id: int
    connected: bool = False
    durable: int = 0
    caught_up_at: float = 0.0
    prev_ack_at: float = 0.0
    written_at_prev_ack: int = 0
    session: int = 0


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
                 on_role_change: Callable[[], None] = lambda: None,
                 metrics: Any = None) -> None:
        self.config = config
        self.db = db
        self.shard = config.broker_name
        self.replica_id = config.replica_id
        self.address = address
        self.replication_address = replication_address
        #: The bearer token a follower presents in its hello (auth on without mTLS).
        self._token = TokenFile(config.auth_token_file, config.auth_reload_seconds) if config.auth_token_file else None
        self._make_term = make_term
        self._on_role_change = on_role_change
        self.metrics = metrics
        self.coord = ShardCoordinator(config.etcd_endpoints, config.etcd_prefix, self.shard, self.replica_id,
                                      credentials=etcd_credentials(config))
        self.term: Term | None = None
        self.epoch = 0
        self.state = ShardState(None, InSync((), 0))
        self.isr = InSync((), 0)
        self.followers: dict[int, FollowerState] = {}
        self.commit_lsn = 0
        self._leader_since = 0.0
        self._last_leader: int | None = None
        self._lease_ok_at = 0.0
        self._following: Leader | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._follow_commit = 0
        self._last_session_error: tuple[int, str] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: In-sync set upkeep started by a follower's session ending (cancelled by stop).
        self._upkeep: set[asyncio.Task[None]] = set()
        #: (lsn, entry, undo record) of the newest entries, as the store wrote them.
        self._tail: collections.deque[tuple[int, bytes, bytes]] = collections.deque()
        self._tail_bytes = 0
        #: Every shipping session's wake-up (a step-down or a newer session wakes them all).
        self._wake: set[asyncio.Event] = set()
        #: The sessions waiting for new entries with room to send them: only these are
        #: woken by a write (one whose message is in flight waits for its ack, which wakes it).
        self._hungry: set[asyncio.Event] = set()
        self._sessions = 0
        self._stopping = False
        self._handing_over: int | None = None
        self.leadership_changes = 0
        self.refused_writes = 0
        #: Replication stream messages with entries this replica shipped as leader.
        self.messages_shipped = 0
        db.append_listeners.append(self._appended)

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.term is not None

    async def start(self) -> None:
        ttl = int(self.config.leader_lease_seconds)
        while True:
            try:
                await self.coord.grant_lease(ttl)
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
        """The process began to stop: follower sessions it closes now are no lagging
        followers, so their end changes no in-sync set (they stay eligible to take over)."""
        self._stopping = True

    async def stop(self) -> None:
        self._stopping = True
        tasks = [*self._tasks, *self._upkeep]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._stop_following()
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
        term = self.term
        if term is None:
            leader = self.state.leader
            if leader is not None and leader.replica != self.replica_id:
                raise NotLeaderError(self.shard, self.replica_id, leader.address, leader.replica)
            raise NotLeaderError(self.shard, self.replica_id)
        return term

    def write_guard(self) -> None:
        """Refuses a write that must be durable while fewer than ``min_insync_replicas``
        replicas (this leader included) can acknowledge it now, or while the leadership is
        being handed over."""
        if self._handing_over is not None:
            raise NotLeaderError(self.shard, self.replica_id)
        able = self._able_replicas()
        if able < self.config.min_insync_replicas:
            self.refused_writes += 1
            raise NotEnoughReplicasError(self.shard, able, self.config.min_insync_replicas)

    def handover_guard(self) -> None:
        """Refuses every write while the leadership is being handed over: receives and
        acks too (they need no sync, but while consumers poll they would keep the log's end
        moving, and the replica taking over never held all of it)."""
        if self._handing_over is not None:
            raise NotLeaderError(self.shard, self.replica_id)

    def _able_replicas(self) -> int:
        now = time.monotonic()
        able = 1
        for r in self.isr.members:
            if r == self.replica_id:
                continue
            f = self.followers.get(r)
            if f is None and now - self._leader_since < self.config.replica_lag_max_seconds:
                able += 1  # a new leader's followers are still connecting: writes wait for them
            elif f is not None and f.connected and now - f.caught_up_at <= self.config.replica_lag_max_seconds:
                able += 1
        return able

    def commit_point(self) -> int:
        return self.commit_lsn

    # --- lease and election ---------------------------------------------------------------

    async def _keep_lease(self) -> None:
        ttl = int(self.config.leader_lease_seconds)
        every = max(ttl / 3, 0.1)
        while True:
            await asyncio.sleep(every)
            try:
                left = await self.coord.keep_alive()
            except EtcdUnavailable as exc:
                log.warning("lease renewal failed", extra={"fields": {"error": str(exc)[:200]}})
                continue
            if left > 0:
                self._lease_ok_at = time.monotonic()
                continue
            log.warning("lease expired", extra={"fields": {"leader": self.is_leader}})
            if self.term is not None:
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
        lease_age = time.monotonic() - self._lease_ok_at
        try:
            state = await self.coord.read()
        except EtcdUnavailable as exc:
            if self.term is not None and lease_age > self.config.leader_lease_seconds:
                await self._step_down(f"etcd unreachable for {lease_age:.1f} s: {exc}")
            return
        self.state = state
        if self.term is not None:
            if state.leader is None or state.leader.epoch != self.epoch:
                await self._step_down("the leader key is no longer this replica's")
                return
            if lease_age > self.config.leader_lease_seconds:
                await self._step_down(f"lease not renewed for {lease_age:.1f} s")
                return
            await self._maintain_isr()
            return
        leader = state.leader
        if leader is not None:
            if leader.replica == self.replica_id and leader.lease != self.coord.lease_id:
                # Our own key from before a restart: give it up now rather than wait out its lease.
                with contextlib.suppress(EtcdUnavailable):
                    await self.coord.resign(leader.epoch)
                return
            self._last_leader = leader.replica
            if self._following is None or self._following.epoch != leader.epoch:
                await self._start_following(leader)
            if (not self.db.is_member and self.replica_id in state.isr.members
                    and self._follow_commit and self.db.written >= self._follow_commit):
                self.db.set_member(True)
                log.info("replica is a complete member of its shard", extra={"fields": {"log_end": self.db.written}})
            return
        await self._stop_following()
        await self._campaign(state)

    def _eligible(self, state: ShardState) -> bool:
        if state.handover_to is not None and state.handover_to != self.replica_id:
            return False  # the leader handed the shard to another replica: let it take over
        if state.isr.revision == 0:
            # Founding: a shard never started. A replica holding data of it must have been a
            # member (etcd lost its keys); a fresh store may found an empty shard.
            return self.db.is_member or self.db.written == 0
        return self.replica_id in state.isr.members and self.db.is_member

    async def _campaign(self, state: ShardState) -> None:
        if not self._eligible(state):
            return
        if state.isr.revision == 0:
            members: tuple[int, ...] = (self.replica_id,)
        else:
            members = state.isr.members
            old = self._last_leader
            if old is not None and old != self.replica_id and old in members \
                    and len(members) - 1 >= self.config.min_insync_replicas:
                members = tuple(m for m in members if m != old)
        try:
            epoch = await self.coord.campaign(self.address(), self.replication_address(), state.isr, members)
        except EtcdUnavailable:
            return
        if epoch is None:
            return
        await self._become_leader(epoch, InSync(tuple(sorted(members)), epoch))

    async def _become_leader(self, epoch: int, isr: InSync) -> None:
        if not self.db.is_member:
            self.db.set_member(True)  # the founder
        self.db.begin_epoch(epoch)
        self.epoch = epoch
        self.isr = isr
        self.followers = {}
        self._clear_tail()
        self.commit_lsn = self.db.commit_lsn
        self._leader_since = time.monotonic()
        self.db.read_ticket = self.db.written  # nothing on disk is shown before it is committed
        started = time.monotonic()
        term = await self._make_term(epoch)
        term.bridge.commit_gate = self.commit_point
        term.bridge.write_guard = self.write_guard
        term.bridge.handover_guard = self.handover_guard
        term.bridge.sync_listeners.append(lambda _durable: self._recompute_commit())
        self.term = term
        self.leadership_changes += 1
        self.state = ShardState(Leader(self.replica_id, self.address(), epoch, self.coord.lease_id,
                                         self.replication_address()), isr)
        log.warning("became leader", extra={"fields": {
            "shard": self.shard, "replica_id": self.replica_id, "epoch": epoch, "in_sync": list(isr.members),
            "log_end": self.db.written, "commit_lsn": self.commit_lsn,
            "open_seconds": round(time.monotonic() - started, 3)}})
        self._recompute_commit()
        self._on_role_change()

    async def _step_down(self, why: str) -> None:
        term = self.term
        if term is None:
            return
        self.term = None
        self.leadership_changes += 1
        self._clear_tail()  # a truncation may rewrite these lsns before this replica leads again
        waiting = term.bridge.waiting
        term.bridge.fail_all(LeadershipLostError(self.shard, self.replica_id))
        for event in list(self._wake):
            event.set()
        log.warning("stepped down", extra={"fields": {
            "shard": self.shard, "replica_id": self.replica_id, "epoch": self.epoch, "why": why,
            "waiting_answers_failed": waiting, "commit_lsn": self.commit_lsn, "log_end": self.db.written}})
        try:
            await term.close()
        except Exception:  # noqa: BLE001
            log.exception("closing the term failed")
        self._on_role_change()

    async def transfer(self, shard: str, to: int) -> tuple[int, int]:
        """Hands the leadership to in-sync replica ``to``: refuses new writes, waits until
        ``to`` holds the whole log, then deletes the leader key naming ``to`` as the
        replica to campaign, and steps down. Returns (this replica, the log end)."""
        if shard != self.shard:
            raise InvalidFieldError("shard", f"this is {self.shard!r}, not {shard!r}")
        if self.term is None:
            self.serving()  # raises NotLeaderError naming the leader
        if to == self.replica_id:
            return self.replica_id, self.db.written
        f = self.followers.get(to)
        if to not in self.isr.members or f is None or not f.connected:
            raise ReplicaNotInSyncError(self.shard, to, list(self.isr.members))
        epoch = self.epoch
        self._handing_over = to  # from now on every write is refused (handover_guard)
        try:
            deadline = time.monotonic() + max(self.config.replica_lag_max_seconds, 1.0)
            # The log may end in writes that needed no sync (receives, acks): nothing syncs
            # them while writes are refused, and the commit point waits for this replica's
            # own sync too. Ask for one.
            assert self.term is not None
            self.term.bridge.when_durable(self.db.written, lambda: None)
            while f.durable < self.db.written or self.commit_lsn < self.db.written:
                if time.monotonic() > deadline or self.term is None or not f.connected:
                    raise ReplicaNotInSyncError(self.shard, to, list(self.isr.members))
                await asyncio.sleep(0.01)
            log_end = self.db.written
            ttl = max(int(self.config.leader_lease_seconds), 2)
            if not await self.coord.hand_over(epoch, to, ttl):
                raise ReplicaNotInSyncError(self.shard, to, list(self.isr.members))
            await self._step_down(f"leadership handed to replica {to}")
            return self.replica_id, log_end
        finally:
            self._handing_over = None

    # --- the commit point and the in-sync set (leader) ----------------------------------

    def _recompute_commit(self) -> None:
        term = self.term
        if term is None:
            return
        members = self.isr.members
        if len(members) < self.config.min_insync_replicas:
            return
        point = term.bridge.durable
        for r in members:
            if r != self.replica_id:
                f = self.followers.get(r)
                point = min(point, f.durable if f is not None else 0)
        if point > self.commit_lsn:
            self.commit_lsn = point
            self.db.note_commit(point)
            term.bridge.release()

    async def _maintain_isr(self) -> None:
        now = time.monotonic()
        cfg = self.config
        members = set(self.isr.members)
        for r in sorted(members - {self.replica_id}):
            f = self.followers.get(r)
            if f is None and now - self._leader_since < cfg.replica_lag_max_seconds:
                continue  # a new leader gives its followers time to connect
            lagging = f is None or not f.connected or now - f.caught_up_at > cfg.replica_lag_max_seconds
            if lagging and len(members) - 1 >= cfg.min_insync_replicas:
                members.discard(r)
        for r, f in self.followers.items():
            if (r not in members and f.connected and f.durable >= self.commit_lsn
                    and now - f.caught_up_at <= min(cfg.replica_lag_max_seconds / 2, 1.0)):
                members.add(r)
        if members == set(self.isr.members):
            return
        try:
            updated = await self.coord.set_isr(self.epoch, self.isr, tuple(sorted(members)))
        except EtcdUnavailable:
            return
        if updated is None:
            log.warning("in-sync set change refused by etcd", extra={"fields": {"wanted": sorted(members)}})
            return
        log.warning("in-sync set changed", extra={"fields": {
            "shard": self.shard, "from": list(self.isr.members), "to": list(updated.members), "epoch": self.epoch}})
        self.isr = updated
        self.state = ShardState(self.state.leader, updated)
        self._recompute_commit()
        self._on_role_change()

    def _on_ack(self, f: FollowerState, durable: int) -> None:
        now = time.monotonic()
        if durable > f.durable:
            f.durable = durable
        written = self.db.written
        if f.durable >= written:
            f.caught_up_at = now
        elif f.durable >= f.written_at_prev_ack:
            f.caught_up_at = max(f.caught_up_at, f.prev_ack_at)
        f.prev_ack_at = now
        f.written_at_prev_ack = written
        self._recompute_commit()

    # --- shipping (leader side of Replicate) --------------------------------------------

    def _appended(self, entries: list[tuple[int, bytes, bytes]]) -> None:
        if self.term is None:
            return
        tail = self._tail
        for entry in entries:
            if tail and tail[-1][0] != entry[0] - 1:
                tail.clear()
                self._tail_bytes = 0
            tail.append(entry)
            self._tail_bytes += len(entry[1]) + len(entry[2])
        while self._tail_bytes > TAIL_BYTES and tail:
            _lsn, data, undo = tail.popleft()
            self._tail_bytes -= len(data) + len(undo)
        hungry = self._hungry
        if hungry:
            for event in hungry:
                event.set()
            hungry.clear()

    def _clear_tail(self) -> None:
        self._tail.clear()
        self._tail_bytes = 0

    def _entries_from(self, first: int) -> list[tuple[int, bytes, bytes]]:
        limit = self.config.replication_batch_bytes
        tail = self._tail
        if tail and tail[0][0] <= first <= tail[-1][0]:
            out = []
            size = 0
            i = first - tail[0][0]
            while i < len(tail) and size < limit:
                entry = tail[i]
                out.append(entry)
                size += len(entry[1]) + len(entry[2])
                i += 1
            return out
        return self.db.read_entries(first, limit)

    def _check_session(self, shard: str, replica_id: int, epoch: int) -> None:
        if shard != self.shard:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"this is shard {self.shard!r}, not {shard!r}")
        if not 0 <= replica_id < self.config.replication_factor or replica_id == self.replica_id:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"replica_id {replica_id} is not another replica of "
                          f"{self.shard!r} (0..{self.config.replication_factor - 1}, this is {self.replica_id})")
        if self.term is None or epoch != self.epoch:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                          f"replica {self.replica_id} does not lead {self.shard!r} in epoch {epoch} "
                          f"(it {'leads in epoch ' + str(self.epoch) if self.term else 'does not lead'})")

    async def replicate(self, conn: Connection, hello: tuple[str, int, int, int, int, str]) -> None:
        """A follower's session (``transport.ReplicationListener`` authenticated it and read
        its hello): the truncation point, then entries as it acknowledges them."""
        shard, replica_id, hello_epoch, log_end, last_epoch, _token = hello
        self._check_session(shard, replica_id, hello_epoch)  # Refused: the listener answers it
        epoch = self.epoch
        db = self.db
        end_epoch, end = replog.epoch_end(db.epochs, last_epoch, db.written)
        truncate_to = min(log_end, end) if log_end else 0
        self._sessions += 1
        session = self._sessions
        f = FollowerState(replica_id, connected=True, durable=0, session=session,
                          prev_ack_at=time.monotonic(), written_at_prev_ack=db.written)
        self.followers[replica_id] = f
        wake = asyncio.Event()
        for event in list(self._wake):
            event.set()  # an older session of this replica sees it is replaced
        self._wake.add(wake)
        log.info("follower connected", extra={"fields": {
            "replica_id": replica_id, "log_end": log_end, "last_epoch": last_epoch,
            "truncate_to": truncate_to, "epoch": epoch, "peer": conn.peer()}})

        # At most SHIP_WINDOW messages of entries in flight, acknowledged cumulatively (the
        # follower reports its durable log end).
        acked = truncate_to  # where the follower's log ends once it has truncated
        next_lsn = truncate_to + 1
        in_flight: collections.deque[int] = collections.deque()  # each message's last lsn

        async def acks() -> None:
            nonlocal acked
            while True:
                kind, body = await conn.read()
                if kind != replog.ACK:
                    raise replog.FrameError(f"a follower sends acks, not {replog.KIND_NAMES.get(kind, kind)}")
                durable = replog.decode_ack(body)
                if durable > next_lsn - 1:
                    # Durable past what this session shipped: no follower can be; taking it
                    # would move the commit point over entries a replica may not hold.
                    raise replog.FrameError(f"ack of lsn {durable}, beyond the last shipped ({next_lsn - 1})")
                acked = max(acked, durable)
                if self.followers.get(f.replica_id) is f:
                    self._on_ack(f, durable)
                wake.set()

        reader: asyncio.Task[None] | None = None
        ticker: asyncio.Task[None] | None = None
        idle = self.config.election_poll_seconds
        try:
            if truncate_to + 1 < db.replog_first and truncate_to < db.written:
                conn.send(replog.encode_checkpoint_needed(epoch, self.commit_lsn))
                await conn.drain()
                return
            conn.send(replog.encode_start(epoch, self.commit_lsn, truncate_to, end_epoch))
            reader = asyncio.ensure_future(acks())
            reader.add_done_callback(lambda _: wake.set())
            ticker = asyncio.ensure_future(_tick(wake, idle / 2))
            loop = asyncio.get_running_loop()
            last_sent = loop.time()
            # A newer session of the same replica (it reconnected) replaces this one.
            while self.term is not None and self.epoch == epoch and not reader.done() \
                    and self.followers.get(replica_id) is f:
                while in_flight and in_flight[0] <= acked:
                    in_flight.popleft()
                if next_lsn <= db.written and len(in_flight) < SHIP_WINDOW:
                    entries = self._entries_from(next_lsn)
                    if not entries or entries[0][0] != next_lsn:
                        conn.send(replog.encode_checkpoint_needed(epoch, self.commit_lsn))
                        await conn.drain()
                        return
                    commit = self.commit_lsn
                    if entries[0][0] <= commit:
                        # A follower catching up: committed entries need no undo record.
                        entries = [(lsn, data, b"" if lsn <= commit else undo) for lsn, data, undo in entries]
                    conn.send(replog.encode_entries(epoch, commit, entries))
                    await conn.drain()
                    next_lsn = entries[-1][0] + 1
                    in_flight.append(entries[-1][0])
                    self.messages_shipped += 1
                    last_sent = loop.time()
                    continue
                if loop.time() - last_sent >= idle:
                    # Nothing sent for a while: a heartbeat, so the follower knows its leader
                    # is alive, with the commit point. A new commit point alone is not worth
                    # a message of its own (under load that doubled the messages): it
                    # travels with the next entries, or with this heartbeat once writes pause.
                    conn.send(replog.encode_heartbeat(epoch, self.commit_lsn))
                    await conn.drain()
                    last_sent = loop.time()
                    continue
                wake.clear()
                if len(in_flight) < SHIP_WINDOW:
                    self._hungry.add(wake)
                await wake.wait()  # new entries, an ack, the ticker, or the session's end
                self._hungry.discard(wake)
            if reader.done() and not reader.cancelled():
                error = reader.exception()
                if isinstance(error, replog.FrameError):
                    raise error  # the listener refuses it (INVALID_ARGUMENT)
        finally:
            self._wake.discard(wake)
            self._hungry.discard(wake)
            for task in (reader, ticker):
                if task is not None:
                    task.cancel()
            if self.followers.get(f.replica_id) is f:
                f.connected = False
                if self.term is not None and not self._stopping:
                    upkeep = asyncio.ensure_future(self._maintain_isr())
                    self._upkeep.add(upkeep)
                    upkeep.add_done_callback(self._upkeep.discard)
            log.info("follower disconnected", extra={"fields": {"replica_id": f.replica_id, "durable": f.durable}})

    async def fetch_checkpoint(self, request: replication_pb2.FetchCheckpointRequest,
                               context: Any) -> AsyncIterator[replication_pb2.FetchCheckpointResponse]:
        try:
            self._check_session(request.shard, request.replica_id, request.leader_epoch)
            await flush_for_checkpoint(self.db)
            self._check_session(request.shard, request.replica_id, request.leader_epoch)  # it may have ended meanwhile
        except Refused as refused:
            await context.abort(refused.code, refused.message)
        checkpoint = StoreCheckpoint(self.db, self.config.data_dir, chunk_bytes=CHECKPOINT_CHUNK)
        log.info("checkpoint for a follower", extra={"fields": {"replica_id": request.replica_id,
                                                                "log_end": checkpoint.log_end}})
        try:
            first = True
            async for name, size, data in checkpoint.chunks():
                yield replication_pb2.FetchCheckpointResponse(
                    file_name=name, file_size=size, data=data, log_end=checkpoint.log_end if first else 0)
                first = False
        finally:
            checkpoint.remove()

    # --- following ------------------------------------------------------------------------

    async def _start_following(self, leader: Leader) -> None:
        await self._stop_following()
        self._following = leader
        self._follow_commit = 0
        self._follow_task = asyncio.create_task(self._follow(leader), name="follow")

    async def _stop_following(self) -> None:
        task, self._follow_task = self._follow_task, None
        self._following = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _follow(self, leader: Leader) -> None:
        conn: Connection | None = None
        try:
            if not leader.replication_address:
                raise Refused(grpc.StatusCode.UNAVAILABLE, "the leader advertises no replication address")
            conn = await connect(leader.replication_address, max(self.config.leader_lease_seconds, 1.0))
            db = self.db
            token = self._token.token() if self._token is not None else ""
            conn.send(replog.encode_hello(self.shard, self.replica_id, leader.epoch, db.written, db.last_epoch,
                                          token))
            kind, body = await conn.read()
            epoch, commit, truncate_to, _ = replog.decode_leader(kind, body)
            if kind == replog.CHECKPOINT:
                await conn.close()
                await self._rebuild(leader)
                return
            if kind != replog.START:
                raise RuntimeError(f"the leader's first answer is a {replog.KIND_NAMES[kind]}, not a start")
            # Entries of epochs the leader never knew are not its own, even below its answer.
            target = replog.follower_truncation(db.epochs, db.written, truncate_to, replog.start_end_epoch(body))
            try:
                db.truncate(target)
            except CannotTruncateError as exc:
                log.warning("cannot take back the log: rebuilding", extra={"fields": {"why": str(exc)}})
                await conn.close()
                await self._rebuild(leader)
                return
            if target < db.written:
                raise RuntimeError(f"log end {db.written} after truncating to {target}")
            if target < truncate_to:
                # The leader ships from its own answer on: a new session tells it where this log ends now.
                log.warning("log taken back past the leader's answer: epochs it never knew", extra={"fields": {
                    "truncate_to": target, "leader_answer": truncate_to, "epochs": db.epochs}})
                return
            conn.send(replog.encode_ack(db.written))
            beat = asyncio.ensure_future(self._heartbeat(conn))
            try:
                while True:
                    kind, body = await conn.read()
                    epoch, commit, _, entries = replog.decode_leader(kind, body)
                    if epoch != leader.epoch:
                        break
                    if kind == replog.ENTRIES:
                        db.append_entries(entries, commit)
                        if db.sync:
                            db.sync_wal()
                        conn.send(replog.encode_ack(db.written))
                        await conn.drain()
                    elif kind == replog.CHECKPOINT:
                        await conn.close()
                        await self._rebuild(leader)
                        return
                    elif kind != replog.HEARTBEAT:
                        raise replog.FrameError(f"a {replog.KIND_NAMES[kind]} in the middle of a session")
                    self._follow_commit = max(self._follow_commit, commit)
                    db.note_commit(commit)
            finally:
                beat.cancel()
        except asyncio.CancelledError:
            raise
        except (Refused, OSError, EOFError, asyncio.TimeoutError, replog.FrameError) as exc:
            kind_of = exc.code.name if isinstance(exc, Refused) else type(exc).__name__
            if (leader.epoch, kind_of) != self._last_session_error:
                # Once per leader and kind: a dead leader is retried every poll until etcd moves on.
                self._last_session_error = (leader.epoch, kind_of)
                log.info("replication session ended", extra={"fields": {
                    "leader": leader.replication_address or leader.address, "epoch": leader.epoch,
                    "code": kind_of, "error": str(exc)[:300]}})
        except Exception:  # noqa: BLE001 - the election loop starts a new session
            log.exception("replication session failed")
        finally:
            if conn is not None:
                await conn.close()
            if self._following is leader:
                self._following = None  # the next election round follows again

    async def _heartbeat(self, conn: Connection) -> None:
        while True:
            await asyncio.sleep(self.config.election_poll_seconds)
            conn.send(replog.encode_ack(self.db.written))
            await conn.drain()

    async def _rebuild(self, leader: Leader) -> None:
        """Replaces this replica's store with a checkpoint of the leader's (over gRPC: a
        rebuild is rare and its chunks are large)."""
        channel = open_channel(leader.address, MAX_CHECKPOINT_MESSAGE_BYTES)
        try:
            await self._fetch_checkpoint(replication_pb2_grpc.ReplicationServiceStub(channel), leader)
        finally:
            await channel.close()

    async def _fetch_checkpoint(self, stub: replication_pb2_grpc.ReplicationServiceStub, leader: Leader) -> None:
        data_dir = self.config.data_dir.rstrip("/")
        staging = data_dir + ".rebuild"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        started = time.monotonic()
        log_end = 0
        total = 0
        fh = None
        try:
            async for chunk in stub.FetchCheckpoint(replication_pb2.FetchCheckpointRequest(
                    shard=self.shard, replica_id=self.replica_id, leader_epoch=leader.epoch)):
                if chunk.log_end:
                    log_end = chunk.log_end
                if chunk.file_name:
                    if fh is not None:
                        await asyncio.to_thread(_close_synced, fh)  # an fsync: off the event loop
                    if "/" in chunk.file_name or chunk.file_name in (".", ".."):
                        raise RuntimeError(f"bad checkpoint file name {chunk.file_name!r}")
                    fh = open(os.path.join(staging, chunk.file_name), "wb")
                if fh is None:
                    raise RuntimeError("checkpoint data before a file name")
                fh.write(chunk.data)
                total += len(chunk.data)
            if fh is not None:
                await asyncio.to_thread(_close_synced, fh)
                fh = None
            await asyncio.to_thread(_sync_dir, staging)
        except BaseException:
            if fh is not None:
                fh.close()
            shutil.rmtree(staging, ignore_errors=True)
            raise
        old = self.db
        reopen = old.reopen_args()
        old.close()
        trash = data_dir + ".old"
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(data_dir, trash)
        os.rename(staging, data_dir)
        _sync_dir(os.path.dirname(os.path.abspath(data_dir)))
        shutil.rmtree(trash, ignore_errors=True)
        db = Database(data_dir, **reopen)
        db.set_member(False)  # a member again once its leader counts it in sync
        db.append_listeners.extend(old.append_listeners)
        self.db = db
        self._on_db_replaced(db)
        log.warning("rebuilt from the leader's checkpoint", extra={"fields": {
            "log_end": log_end, "bytes": total, "seconds": round(time.monotonic() - started, 3)}})

    #: Called with the new store after a rebuild (the server re-points what holds the old one).
    _on_db_replaced: Callable[[Database], None] = staticmethod(lambda db: None)  # type: ignore[assignment]

    # --- status ---------------------------------------------------------------------------

    def status(self) -> nameserver_pb2.ReplicationStatus:
        now = time.monotonic()
        out = nameserver_pb2.ReplicationStatus(
            replication_factor=self.config.replication_factor, min_insync_replicas=self.config.min_insync_replicas,
            in_sync_replicas=list(self.state.isr.members), log_end=self.db.written,
            commit_lsn=self.commit_lsn if self.term is not None else self.db.commit_lsn,
            complete=self.db.is_member)
        if self.term is not None:
            written = self.db.written
            for r in range(self.config.replication_factor):
                if r == self.replica_id:
                    continue
                f = self.followers.get(r)
                out.followers.append(nameserver_pb2.FollowerStatus(
                    replica_id=r, connected=bool(f and f.connected), in_sync=r in self.isr.members,
                    durable_lsn=f.durable if f else 0, lag_records=max(written - (f.durable if f else 0), 0),
                    lag_seconds=(now - f.caught_up_at) if f and f.durable < written else 0.0))
        return out

    def role(self) -> int:
        return nameserver_pb2.BROKER_ROLE_LEADER if self.term is not None else nameserver_pb2.BROKER_ROLE_FOLLOWER

    def known_epoch(self) -> int:
        leader = self.state.leader
        return self.epoch if self.term is not None else (leader.epoch if leader else self.db.last_epoch)


class ReplicaNotInSyncError(FailedPreconditionError):
    reason = "REPLICA_NOT_IN_SYNC"

    def __init__(self, shard: str, replica_id: int, in_sync: list[int]) -> None:
        super().__init__(f"replica {replica_id} of {shard!r} is not in sync with its leader (in-sync set "
                         f"{in_sync}): it cannot take the leadership now", shard=shard, replica_id=replica_id,
                         in_sync=in_sync)


class ReplicationServicer(replication_pb2_grpc.ReplicationServiceServicer):
    def __init__(self, node: ReplicaNode) -> None:
        self.node = node

    async def FetchCheckpoint(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for chunk in self.node.fetch_checkpoint(request, context):
            yield chunk

    async def TransferLeadership(self, request: Any, context: Any) -> Any:
        previous, log_end = await self.node.transfer(request.shard, request.replica_id)
        return replication_pb2.TransferLeadershipResponse(previous_replica_id=previous, log_end=log_end)


async def _tick(event: asyncio.Event, every: float) -> None:
    """Sets ``event`` every ``every`` seconds (a shipping loop's heartbeat clock: one timer
    per session rather than one per wait)."""
    while True:
        await asyncio.sleep(every)
        event.set()


def _close_synced(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
