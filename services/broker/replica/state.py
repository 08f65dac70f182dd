"""The replica's decisions as a pure state machine: follower progress, the commit point,
in-sync set changes, write admission, election eligibility and role transitions.

Nothing here does I/O, awaits or reads a clock: whatever depends on time takes ``now``
(seconds on a monotonic clock), so tests drive it with a fake one. The driver
(``node.py``) tells it what happened — a follower's session began or ended, an ack came,
etcd answered a round — and carries out what it decides: etcd writes, step-downs,
answers released or failed. It is the split etcd's raft makes between ``raft.go`` (the
algorithm, stepped by messages and ticks) and ``node.go`` (the loop doing the I/O); the
leader's half follows Kafka's ``Partition`` (``maybeIncrementLeaderHW``,
``maybeShrinkIsr``, ``maybeExpandIsr``) with its strict min-ISR rule (KIP-966): the in-sync
set never drops below ``min_insync_replicas`` members, and the commit point never moves
while it has fewer.

- :class:`Leadership`: one term of this replica as leader.
- :class:`Election`: each election round of a replica, as leader or not.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from txmq.errors import NotEnoughReplicasError, NotLeaderError, TxmqError
from txmq.v1 import nameserver_pb2

from ..config import BrokerConfig
from .errors import CommitStalledError, ReplicaNotInSyncError


# --- the shard in etcd (read and written by ``coordination.py``) ----------------------------

@dataclass(frozen=True, slots=True)
class Leader:
    replica: int
    address: str
    #: The leader key's create revision: the leader epoch.
    epoch: int
    lease: int
    #: host:port of its replication stream (``transport.py``).
    replication_address: str = ""


@dataclass(frozen=True, slots=True)
class InSync:
    members: tuple[int, ...]
    #: The key's mod revision (0: the shard was never founded).
    revision: int


@dataclass(frozen=True, slots=True)
class ShardState:
    leader: Leader | None
    isr: InSync
    #: The replica a leader handed its leadership to (None: no hand-over under way).
    handover_to: int | None = None


@dataclass(frozen=True, slots=True)
class Rules:
    """The settings the decisions read."""

    shard: str
    replica_id: int
    replication_factor: int
    min_insync: int
    lag_max_seconds: float
    lease_seconds: float

    @classmethod
    def of(cls, config: BrokerConfig) -> Rules:
        return cls(config.broker_name, config.replica_id, config.replication_factor, config.min_insync_replicas,
                   config.replica_lag_max_seconds, config.leader_lease_seconds)


@dataclass(slots=True)
class Progress:
    """What the leader knows of one follower's session (etcd raft's ``tracker.Progress``)."""

    replica_id: int
    session: int
    connected_at: float
    #: The follower's durable log end, as its last ack said (acks are cumulative).
    durable: int = 0
    connected: bool = True
    #: When it last held everything this leader had written (None: not in this session).
    caught_up_at: float | None = None
    prev_ack_at: float = 0.0
    written_at_prev_ack: int = 0
    #: When its session ended (``connected`` False).
    left_at: float = 0.0

    def caught_up_within(self, now: float, seconds: float) -> bool:
        return self.caught_up_at is not None and now - self.caught_up_at <= seconds


class Leadership:
    """This replica's term as leader of ``epoch``: every follower's progress, the in-sync
    set, the commit point, and what follows from them — which writes are admitted, when
    the set changes, and when what waits above the commit point can no longer be told."""

    def __init__(self, rules: Rules, epoch: int, isr: InSync, commit: int, now: float) -> None:
        self.rules = rules
        self.epoch = epoch
        self.isr = isr
        #: Entries up to here are durable on every in-sync replica: answers up to it may go.
        self.commit = commit
        #: When the term began: its followers get ``lag_max_seconds`` to connect.
        self.since = now
        self.followers: dict[int, Progress] = {}
        #: The replica the leadership is being handed to (every write refused meanwhile).
        self.handing_over: int | None = None
        self._sessions = 0

    # --- follower progress --------------------------------------------------------------

    def connect(self, replica_id: int, now: float, written: int) -> Progress:
        """A session of ``replica_id`` began; a newer one replaces an older one."""
        self._sessions += 1
        progress = Progress(replica_id, self._sessions, now, prev_ack_at=now, written_at_prev_ack=written)
        self.followers[replica_id] = progress
        return progress

    def current(self, progress: Progress) -> bool:
        """Whether ``progress`` is its follower's newest session."""
        return self.followers.get(progress.replica_id) is progress

    def ack(self, progress: Progress, durable: int, written: int, now: float) -> None:
        """The follower holds the log durably up to ``durable``; this leader has written up
        to ``written``. Caught up when it holds all of it, or everything written by its
        previous ack (then since that ack): a follower kept busy by a steady stream of
        writes is not lagging as long as each ack covers what the one before it lacked."""
        progress.durable = max(progress.durable, durable)
        if progress.durable >= written:
            progress.caught_up_at = now
        elif progress.durable >= progress.written_at_prev_ack:
            last = progress.caught_up_at
            progress.caught_up_at = progress.prev_ack_at if last is None else max(last, progress.prev_ack_at)
        progress.prev_ack_at = now
        progress.written_at_prev_ack = written

    def disconnect(self, progress: Progress, now: float) -> bool:
        """The session ended. True when it was the follower's newest (its end counts)."""
        if not self.current(progress):
            return False
        progress.connected = False
        progress.left_at = now
        return True

    # --- the commit point -----------------------------------------------------------------

    def advance_commit(self, local_durable: int) -> bool:
        """Moves the commit point to the smallest durable log end over the in-sync set, this
        replica's own sync (``local_durable``) included, while the set has at least
        ``min_insync`` members. Returns whether it moved."""
        members = self.isr.members
        if len(members) < self.rules.min_insync:
            return False
        point = local_durable
        for r in members:
            if r != self.rules.replica_id:
                progress = self.followers.get(r)
                point = min(point, progress.durable if progress is not None else 0)
        if point <= self.commit:
            return False
        self.commit = point
        return True

    # --- admission ------------------------------------------------------------------------

    def able(self, now: float) -> int:
        """Replicas (this leader included) able to acknowledge a write now: in-sync members
        connected and caught up within ``lag_max_seconds``, and, early in the term, members
        that have not connected yet (a new leader's followers are still on their way)."""
        lag = self.rules.lag_max_seconds
        able = 1
        for r in self.isr.members:
            if r == self.rules.replica_id:
                continue
            progress = self.followers.get(r)
            if progress is None:
                if now - self.since < lag:
                    able += 1
            elif progress.connected and progress.caught_up_within(now, lag):
                able += 1
        return able

    def refuse_write(self, now: float) -> TxmqError | None:
        """Why a write that must be durable is refused now (nothing of it is applied), or
        None: the leadership is being handed over, or fewer than ``min_insync`` replicas
        can acknowledge it."""
        if self.handing_over is not None:
            return NotLeaderError(self.rules.shard, self.rules.replica_id)
        able = self.able(now)
        if able < self.rules.min_insync:
            return NotEnoughReplicasError(self.rules.shard, able, self.rules.min_insync)
        return None

    def gone(self, replica_id: int, now: float) -> bool:
        """Whether an in-sync member has had no session for ``lag_max_seconds`` (it never
        connected in this term, or its session ended)."""
        progress = self.followers.get(replica_id)
        if progress is None:
            return now - self.since >= self.rules.lag_max_seconds
        return not progress.connected and now - progress.left_at >= self.rules.lag_max_seconds

    def stalled(self, now: float) -> bool:
        """Whether the commit point cannot move now: the in-sync set has fewer than
        ``min_insync`` members, or names a member that is gone (it stays named while the
        set could not keep ``min_insync`` members without it). Unlike a slow follower, a
        gone one holds the commit point until it comes back, however long that takes."""
        members = self.isr.members
        if len(members) < self.rules.min_insync:
            return True
        return any(r != self.rules.replica_id and self.gone(r, now) for r in members)

    def refuse_any_write(self, now: float, read_ticket: int, *, capped: bool = False) -> TxmqError | None:
        """Why any write — also one that needs no sync (a receive, an ack) — is refused now,
        or None: the leadership is being handed over (the replica taking over must hold
        the whole log), or the commit point is stalled below ``read_ticket`` (the writes a
        read of the current state depends on). Such a write's answer could never be told,
        and a receive would hold its messages invisible to everyone while it waited —
        unless the reads are ``capped`` at the commit point (the queues show nothing above
        it and such answers wait only for it: ``term.Gate``); a write needing a sync is
        refused by :meth:`refuse_write` then."""
        if self.handing_over is not None:
            return NotLeaderError(self.rules.shard, self.rules.replica_id)
        if read_ticket > self.commit and self.stalled(now) and not capped:
            return NotEnoughReplicasError(self.rules.shard, self.able(now), self.rules.min_insync)
        return None

    def uncommittable(self, now: float) -> TxmqError | None:
        """The error every answer waiting above the commit point fails with now, or None
        while they may still be told (the commit point can move)."""
        if not self.stalled(now):
            return None
        return CommitStalledError(self.rules.shard, self.able(now), self.rules.min_insync)

    # --- the in-sync set ------------------------------------------------------------------

    def wanted_isr(self, now: float) -> tuple[int, ...] | None:
        """The in-sync set this leader should write now, or None to keep it. Drops a member
        whose session ended or that has not been caught up for ``lag_max_seconds`` (one
        that never connected only once the term's first ``lag_max_seconds`` are over),
        never below ``min_insync`` members: a member that may hold the newest acknowledged
        write stays eligible. Adds a connected follower that holds the commit point and was
        caught up within the last half of ``lag_max_seconds`` (at most 1 s)."""
        rules = self.rules
        lag = rules.lag_max_seconds
        members = set(self.isr.members)
        for r in sorted(members - {rules.replica_id}):
            progress = self.followers.get(r)
            if progress is None and now - self.since < lag:
                continue
            lagging = progress is None or not progress.connected or not progress.caught_up_within(now, lag)
            if lagging and len(members) - 1 >= rules.min_insync:
                members.discard(r)
        for r, progress in self.followers.items():
            if (r not in members and progress.connected and progress.durable >= self.commit
                    and progress.caught_up_within(now, min(lag / 2, 1.0))):
                members.add(r)
        if members == set(self.isr.members):
            return None
        return tuple(sorted(members))

    # --- hand-over ------------------------------------------------------------------------

    def refuse_transfer(self, to: int) -> TxmqError | None:
        """Why the leadership cannot be handed to ``to`` now, or None."""
        progress = self.followers.get(to)
        if to not in self.isr.members or progress is None or not progress.connected:
            return ReplicaNotInSyncError(self.rules.shard, to, list(self.isr.members))
        return None

    def holds_log(self, to: int, written: int) -> bool:
        """Whether ``to`` holds the whole log durably and the commit point covers it."""
        progress = self.followers.get(to)
        return progress is not None and progress.durable >= written and self.commit >= written

    # --- sessions and status --------------------------------------------------------------

    def session_refusal(self, shard: str, replica_id: int, epoch: int) -> tuple[grpc.StatusCode, str] | None:
        """Why a follower's session (hello or checkpoint request) is refused, or None."""
        return refuse_session(self.rules, shard, replica_id, epoch, self.epoch)

    def follower_status(self, now: float, written: int) -> list[nameserver_pb2.FollowerStatus]:
        out = []
        for r in range(self.rules.replication_factor):
            if r == self.rules.replica_id:
                continue
            p = self.followers.get(r)
            durable = p.durable if p is not None else 0
            lag_seconds = 0.0
            if p is not None and durable < written:
                lag_seconds = now - (p.caught_up_at if p.caught_up_at is not None else p.connected_at)
            out.append(nameserver_pb2.FollowerStatus(
                replica_id=r, connected=bool(p and p.connected), in_sync=r in self.isr.members,
                durable_lsn=durable, lag_records=max(written - durable, 0), lag_seconds=lag_seconds))
        return out


def refuse_session(rules: Rules, shard: str, replica_id: int, epoch: int,
                   leading: int | None) -> tuple[grpc.StatusCode, str] | None:
    """Why a session (a follower's hello, a rebuild's checkpoint request) of ``replica_id``
    following ``epoch`` is refused by a replica leading in ``leading`` (None: not leading)."""
    if shard != rules.shard:
        return grpc.StatusCode.INVALID_ARGUMENT, f"this is shard {rules.shard!r}, not {shard!r}"
    if not 0 <= replica_id < rules.replication_factor or replica_id == rules.replica_id:
        return grpc.StatusCode.INVALID_ARGUMENT, (f"replica_id {replica_id} is not another replica of {rules.shard!r} "
                                                  f"(0..{rules.replication_factor - 1}, this is {rules.replica_id})")
    if leading is None or epoch != leading:
        now = f"leads in epoch {leading}" if leading is not None else "does not lead"
        return grpc.StatusCode.FAILED_PRECONDITION, (f"replica {rules.replica_id} does not lead {rules.shard!r} in "
                                                     f"epoch {epoch} (it {now})")
    return None


# --- the election --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StepDown:
    why: str


@dataclass(frozen=True, slots=True)
class MaintainIsr:
    """Leading: keep the in-sync set (and fail what the commit point can no longer reach)."""


@dataclass(frozen=True, slots=True)
class Resign:
    """Delete this replica's own leader key left from before a restart (no lease to wait out)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Follow:
    leader: Leader


@dataclass(frozen=True, slots=True)
class BecomeMember:
    """A rebuilt (or new) replica holds its leader's commit point and is in the set: complete."""


@dataclass(frozen=True, slots=True)
class StopFollowing:
    pass


@dataclass(frozen=True, slots=True)
class Campaign:
    """Take the leadership if the in-sync set is still ``isr``, writing ``members`` as the set."""

    isr: InSync
    members: tuple[int, ...]


Action = StepDown | MaintainIsr | Resign | Follow | BecomeMember | StopFollowing | Campaign


@dataclass(frozen=True, slots=True)
class View:
    """What a replica knows at one election round."""

    #: The shard's state in etcd; None when etcd did not answer (``etcd_error`` says why).
    state: ShardState | None
    now: float
    #: When the lease was last renewed, and its id.
    lease_ok_at: float
    lease_id: int
    #: The epoch it leads in, or None.
    leading: int | None
    #: The epoch of the leader it follows, or None.
    following: int | None
    #: Whether its store is a complete copy (``ReplicationLog.is_member``), and its log end.
    member: bool
    written: int
    #: The commit point its leader last sent it (0: none yet in this session).
    follow_commit: int = 0
    #: The process is stopping: it takes no leadership.
    stopping: bool = False
    etcd_error: str = ""


class Election:
    """One replica's side of the election: every round, from what etcd says and what the
    replica is, the actions to take, in order."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        #: The last leader seen (the one a campaign drops from the in-sync set).
        self.last_leader: int | None = None

    def round(self, view: View) -> list[Action]:
        rules, state = self.rules, view.state
        lease_age = view.now - view.lease_ok_at
        if state is None:
            if view.leading is not None and lease_age > rules.lease_seconds:
                return [StepDown(f"etcd unreachable for {lease_age:.1f} s: {view.etcd_error}")]
            return []
        if view.leading is not None:
            if state.leader is None or state.leader.epoch != view.leading:
                return [StepDown("the leader key is no longer this replica's")]
            if lease_age > rules.lease_seconds:
                return [StepDown(f"lease not renewed for {lease_age:.1f} s")]
            return [MaintainIsr()]
        leader = state.leader
        if leader is not None:
            if leader.replica == rules.replica_id:
                # The key names this replica, which does not lead: a key of an earlier
                # process (another lease), a campaign whose answer was lost, or a leader
                # that stepped down while etcd was down and kept its key (etcd restores
                # leases on restart). Following itself would hold the shard leaderless for
                # as long as its lease is renewed: give the key up, then campaign.
                return [Resign(leader.epoch)]
            self.last_leader = leader.replica
            if view.following != leader.epoch:
                return [Follow(leader)]  # a new session: its commit point is not known yet
            if (not view.member and rules.replica_id in state.isr.members
                    and view.follow_commit and view.written >= view.follow_commit):
                return [BecomeMember()]
            return []
        if view.stopping or not self.eligible(state, view.member, view.written):
            return [StopFollowing()]
        return [StopFollowing(), Campaign(state.isr, self.campaign_members(state))]

    def eligible(self, state: ShardState, member: bool, written: int) -> bool:
        """Whether this replica may campaign: the leader handed the shard to no other
        replica, and it is a complete member of the in-sync set — or the shard was never
        founded and its store holds no other data of it (etcd lost its keys: a store with
        data must have been a member)."""
        if state.handover_to is not None and state.handover_to != self.rules.replica_id:
            return False
        if state.isr.revision == 0:
            return member or written == 0
        return self.rules.replica_id in state.isr.members and member

    def campaign_members(self, state: ShardState) -> tuple[int, ...]:
        """The in-sync set a campaign writes: {itself} when founding, else the set without
        the last leader while ``min_insync`` members remain (it may be gone)."""
        if state.isr.revision == 0:
            return (self.rules.replica_id,)
        members = state.isr.members
        old = self.last_leader
        if old is not None and old != self.rules.replica_id and old in members \
                and len(members) - 1 >= self.rules.min_insync:
            members = tuple(m for m in members if m != old)
        return members
