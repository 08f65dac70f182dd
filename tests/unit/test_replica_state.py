"""The replica's decisions (services/broker/replica/state.py) with a fake clock: the commit
point, the in-sync set shrinking and growing, admission, fencing, eligibility and every
election round's actions — what otherwise needs six processes and etcd to see."""

from __future__ import annotations

from dataclasses import replace

import grpc
import pytest

from services.broker.replica import state
from services.broker.replica.errors import CommitStalledError, ReplicaNotInSyncError
from services.broker.replica.state import (BecomeMember, Campaign, Election, Follow, InSync, Leader, Leadership,
                                           MaintainIsr, Resign, Rules, ShardState, StepDown, StopFollowing, View)
from txmq.errors import NotEnoughReplicasError, NotLeaderError

LAG = 1.0  # replica_lag_max_seconds
T0 = 1000.0  # the fake clock's start (seconds)


def rules(replica_id: int = 0, rf: int = 3, min_insync: int = 2) -> Rules:
    return Rules("broker-0", replica_id, rf, min_insync, LAG, 1.0)


def leading(members: tuple[int, ...] = (0, 1, 2), *, me: int = 0, min_insync: int = 2, commit: int = 0,
            rf: int = 3) -> Leadership:
    return Leadership(rules(me, rf, min_insync), epoch=7, isr=InSync(members, 5), commit=commit, now=T0)


def caught_up(lead: Leadership, replica_id: int, durable: int, written: int, at: float) -> state.Progress:
    """A session of ``replica_id`` that has acknowledged ``durable`` at ``at``."""
    progress = lead.connect(replica_id, at, written)
    lead.ack(progress, durable, written, at)
    return progress


# --- the commit point ---------------------------------------------------------------------------

@pytest.mark.parametrize("members, min_insync, local, durables, expected", [
    ((0, 1, 2), 2, 10, {1: 8, 2: 9}, 8),          # the smallest over the set
    ((0, 1, 2), 2, 6, {1: 8, 2: 9}, 6),           # the leader's own sync counts
    ((0, 1), 2, 10, {1: 10, 2: 3}, 10),           # a follower outside the set holds nothing back
    ((0, 1, 2), 2, 10, {1: 9}, 0),                # a member with no session yet: nothing moves
    ((0,), 2, 10, {}, 0),                         # fewer members than min_insync: never moves
    ((0,), 1, 10, {}, 10),                        # min_insync 1: the leader alone
])
def test_the_commit_point_is_the_smallest_durable_end_over_the_in_sync_set(members, min_insync, local, durables,
                                                                            expected):
    lead = leading(members, min_insync=min_insync)
    for r, durable in durables.items():
        caught_up(lead, r, durable, written=local, at=T0)
    assert lead.advance_commit(local) is (expected > 0)
    assert lead.commit == expected


def test_the_commit_point_never_moves_back():
    lead = leading((0, 1), commit=12)
    caught_up(lead, 1, 9, written=15, at=T0)
    assert not lead.advance_commit(15) and lead.commit == 12


# --- follower progress and the in-sync set ----------------------------------------------------------

def test_a_follower_acked_everything_written_by_its_previous_ack_is_caught_up_since_then():
    lead = leading()
    p = lead.connect(1, T0, written=10)
    lead.ack(p, 10, written=14, now=T0 + 0.5)  # behind the log end, but it holds all of ack time's
    assert p.caught_up_at == T0  # ... as of its previous ack (the session's start)
    lead.ack(p, 12, written=20, now=T0 + 0.9)  # misses some of what the previous ack saw written
    assert p.caught_up_at == T0
    lead.ack(p, 20, written=20, now=T0 + 1.2)
    assert p.caught_up_at == T0 + 1.2


def test_a_newer_session_replaces_the_older_and_only_the_newer_ones_end_counts():
    lead = leading()
    old = lead.connect(1, T0, 0)
    new = lead.connect(1, T0 + 0.1, 0)
    assert not lead.current(old) and lead.current(new)
    assert lead.disconnect(old, T0 + 0.2) is False and new.connected
    assert lead.disconnect(new, T0 + 0.3) is True and not new.connected


@pytest.mark.parametrize("case, members, min_insync, sessions, at, expected", [
    # sessions: replica -> (connected, acked everything at) ; None: never connected
    ("a lagging follower goes", (0, 1, 2), 2, {1: (True, T0), 2: (True, T0 + 1.5)}, T0 + 1.6, (0, 2)),
    ("a disconnected follower goes at once", (0, 1, 2), 2, {1: (False, T0 + 1.5), 2: (True, T0 + 1.5)},
     T0 + 1.6, (0, 2)),
    ("never below min_insync", (0, 1), 2, {1: (False, T0)}, T0 + 5, None),
    ("the second of two laggards stays", (0, 1, 2), 2, {1: (True, T0), 2: (True, T0)}, T0 + 2, (0, 2)),
    ("a new leader waits for its followers to connect", (0, 1, 2), 2, {1: (True, T0 + 0.5)}, T0 + 0.9, None),
    ("then drops one that never came", (0, 1, 2), 2, {1: (True, T0 + 1.0)}, T0 + 1.1, (0, 1)),
    ("a caught-up follower joins", (0, 1), 2, {1: (True, T0 + 2), 2: (True, T0 + 2)}, T0 + 2.3, (0, 1, 2)),
    ("not one caught up too long ago", (0, 1), 2, {1: (True, T0 + 2), 2: (True, T0 + 2)}, T0 + 2.6, None),
    ("nor a disconnected one", (0, 1), 2, {1: (True, T0 + 2), 2: (False, T0 + 2)}, T0 + 2.1, None),
])
def test_the_in_sync_set_drops_laggards_and_the_gone_never_below_min_and_takes_back_the_caught_up(
        case, members, min_insync, sessions, at, expected):
    lead = leading(members, min_insync=min_insync)
    for r, (connected, acked_at) in sessions.items():
        p = caught_up(lead, r, 10, written=10, at=acked_at)
        if not connected:
            lead.disconnect(p, acked_at)
    assert lead.wanted_isr(at) == expected, case


def test_a_follower_that_does_not_hold_the_commit_point_does_not_join():
    lead = leading((0, 1), commit=10)
    caught_up(lead, 1, 10, written=10, at=T0)
    p = lead.connect(2, T0, 10)
    lead.ack(p, 9, written=9, now=T0 + 0.1)  # caught up with what was written then, below the commit
    assert lead.wanted_isr(T0 + 0.2) is None


# --- admission --------------------------------------------------------------------------------

@pytest.mark.parametrize("case, sessions, at, able", [
    ("a new leader counts followers still connecting", {}, T0 + 0.5, 3),
    ("... for lag_max only", {}, T0 + LAG, 1),
    ("a connected follower caught up within lag_max", {1: (True, T0 + 1.0)}, T0 + 1.8, 2),
    ("not one caught up longer ago", {1: (True, T0 + 0.5)}, T0 + 1.8, 1),
    ("not a disconnected one", {1: (False, T0 + 1.5)}, T0 + 1.6, 1),
])
def test_replicas_able_to_acknowledge(case, sessions, at, able):
    lead = leading((0, 1, 2))
    for r, (connected, acked_at) in sessions.items():
        p = caught_up(lead, r, 10, written=10, at=acked_at)
        if not connected:
            lead.disconnect(p, acked_at)
    assert lead.able(at) == able, case


def test_a_write_is_refused_while_too_few_can_acknowledge_or_during_a_hand_over():
    lead = leading((0, 1, 2))
    caught_up(lead, 1, 10, written=10, at=T0 + 1)
    assert lead.refuse_write(T0 + 1.5) is None
    refused = lead.refuse_write(T0 + 2.5)  # replica 1 last caught up 1.5 s ago, 2 never came
    assert isinstance(refused, NotEnoughReplicasError) and (refused.in_sync, refused.required) == (1, 2)
    lead.handing_over = 1
    assert isinstance(lead.refuse_write(T0 + 1.5), NotLeaderError)
    assert isinstance(lead.refuse_any_write(T0 + 1.5, read_ticket=0), NotLeaderError)


def test_a_hand_over_needs_a_connected_in_sync_target_holding_the_whole_log():
    lead = leading((0, 1), commit=10)
    p = caught_up(lead, 1, 10, written=12, at=T0)
    assert isinstance(lead.refuse_transfer(2), ReplicaNotInSyncError)
    assert lead.refuse_transfer(1) is None
    assert not lead.holds_log(1, written=12)
    lead.ack(p, 12, written=12, now=T0 + 0.1)
    assert not lead.holds_log(1, written=12)  # the commit point must cover it too
    lead.advance_commit(12)
    assert lead.holds_log(1, written=12)
    lead.disconnect(p, T0 + 0.2)
    assert isinstance(lead.refuse_transfer(1), ReplicaNotInSyncError)


# --- the lone leader ---------------------------------------------------------------------------------

POLL = 0.05  # election_poll_seconds: the driver asks once a round


def lone_leader() -> Leadership:
    """Replica 2 won after 0 and 1 died: its in-sync set {1, 2} keeps the dead 1, which
    it cannot drop (min_insync 2). It holds entries up to 7, committed up to 6."""
    return Leadership(rules(2), epoch=9, isr=InSync((1, 2), 8), commit=6, now=T0)


def test_the_lone_leader_admits_during_its_grace_then_fails_and_refuses_within_lag_max_and_one_round():
    lead = lone_leader()
    assert lead.refuse_write(T0 + 0.1) is None  # replica 1 may still be connecting
    assert lead.uncommittable(T0 + 0.1) is None and not lead.stalled(T0 + 0.1)
    # By lag_max after the election (plus one round), what waits fails and new writes are refused.
    at = T0 + LAG + POLL
    assert lead.stalled(at)
    failed = lead.uncommittable(at)
    assert isinstance(failed, CommitStalledError) and isinstance(failed, NotEnoughReplicasError)
    assert "outcome unknown" in str(failed) and failed.retryable
    refused = lead.refuse_write(at)
    assert isinstance(refused, NotEnoughReplicasError) and (refused.in_sync, refused.required) == (1, 2)
    # A write needing no sync (a receive, an ack) is refused while what it would wait for is
    # uncommitted ...
    assert isinstance(lead.refuse_any_write(at, read_ticket=7), NotEnoughReplicasError)
    # ... and goes on (answered at once) while everything it reads is committed.
    assert lead.refuse_any_write(at, read_ticket=6) is None
    assert lead.wanted_isr(at) is None  # 1 stays named: it may hold what was acknowledged


def test_a_follower_gone_from_a_set_at_min_insync_stalls_the_commit_point_until_it_returns():
    lead = leading((0, 1), commit=10)
    p = caught_up(lead, 1, 10, written=10, at=T0)
    lead.disconnect(p, T0 + 0.2)
    assert not lead.stalled(T0 + 0.2 + LAG / 2)  # it may come back at once
    assert lead.stalled(T0 + 0.2 + LAG)
    back = caught_up(lead, 1, 10, written=10, at=T0 + 3)
    assert back.connected and not lead.stalled(T0 + 3)


def test_a_slow_follower_does_not_stall_the_commit_point():
    lead = leading((0, 1), commit=10)
    caught_up(lead, 1, 10, written=20, at=T0)
    assert lead.refuse_write(T0 + 5) is not None  # too far behind to admit writes ...
    assert not lead.stalled(T0 + 5) and lead.uncommittable(T0 + 5) is None  # ... but it may catch up


# --- fencing --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shard, replica_id, epoch, leading_epoch, code", [
    ("broker-0", 1, 7, 7, None),
    ("broker-1", 1, 7, 7, grpc.StatusCode.INVALID_ARGUMENT),
    ("broker-0", 0, 7, 7, grpc.StatusCode.INVALID_ARGUMENT),  # itself
    ("broker-0", 3, 7, 7, grpc.StatusCode.INVALID_ARGUMENT),  # beyond the replication factor
    ("broker-0", 1, 6, 7, grpc.StatusCode.FAILED_PRECONDITION),  # an older epoch
    ("broker-0", 1, 8, 7, grpc.StatusCode.FAILED_PRECONDITION),  # a newer one: this leader is deposed
    ("broker-0", 1, 7, None, grpc.StatusCode.FAILED_PRECONDITION),  # not leading
])
def test_a_session_is_served_only_by_the_leader_of_its_epoch(shard, replica_id, epoch, leading_epoch, code):
    refused = state.refuse_session(rules(0), shard, replica_id, epoch, leading_epoch)
    assert (refused[0] if refused else None) == code


# --- the election ------------------------------------------------------------------------------

ME = 1
LEADER = Leader(0, "10.0.0.1:10911", epoch=40, lease=77, replication_address="10.0.0.1:10912")
FOUNDED = InSync((0, 1, 2), 41)


def view(shard: ShardState | None, **kwargs) -> View:
    base = View(shard, now=T0, lease_ok_at=T0, lease_id=55, leading=None, following=None, member=True, written=20)
    return replace(base, **kwargs)


@pytest.mark.parametrize("case, v, actions", [
    ("leading, etcd down within the lease", view(None, leading=40, now=T0 + 0.5, etcd_error="down"), []),
    ("leading, etcd down past the lease", view(None, leading=40, now=T0 + 1.5, etcd_error="down"),
     [StepDown("etcd unreachable for 1.5 s: down")]),
    ("following, etcd down", view(None, now=T0 + 9, etcd_error="down"), []),
    ("leading, its key gone", view(ShardState(None, FOUNDED), leading=40),
     [StepDown("the leader key is no longer this replica's")]),
    ("leading, another epoch's key", view(ShardState(replace(LEADER, epoch=44), FOUNDED), leading=40),
     [StepDown("the leader key is no longer this replica's")]),
    ("leading, lease not renewed", view(ShardState(LEADER, FOUNDED), leading=40, now=T0 + 1.2),
     [StepDown("lease not renewed for 1.2 s")]),
    ("leading, all well", view(ShardState(LEADER, FOUNDED), leading=40), [MaintainIsr()]),
    ("its own key from before a restart", view(ShardState(replace(LEADER, replica=ME), FOUNDED)), [Resign(40)]),
    # A campaign whose answer was lost (etcd restarted), or a step-down while etcd was down
    # whose key etcd kept: the key under its own lease, and it does not lead (seen in
    # tests.chaos_anchored, seed 369037068: it followed itself and the shard stayed leaderless).
    ("its own key under its own lease, not leading", view(ShardState(replace(LEADER, replica=ME, lease=55), FOUNDED)),
     [Resign(40)]),
    ("a leader to follow", view(ShardState(LEADER, FOUNDED)), [Follow(LEADER)]),
    ("a new leader to follow", view(ShardState(LEADER, FOUNDED), following=39), [Follow(LEADER)]),
    ("following it", view(ShardState(LEADER, FOUNDED), following=40, follow_commit=18), []),
    ("rebuilt, holding the commit point, in the set", view(ShardState(LEADER, FOUNDED), following=40, member=False,
                                                           follow_commit=18), [BecomeMember()]),
    ("rebuilt, not yet at the commit point", view(ShardState(LEADER, FOUNDED), following=40, member=False,
                                                  follow_commit=25), []),
    ("rebuilt, no commit point heard yet", view(ShardState(LEADER, FOUNDED), following=40, member=False), []),
    ("rebuilt, not in the set", view(ShardState(LEADER, InSync((0, 2), 41)), following=40, member=False,
                                     follow_commit=18), []),
    ("no leader: campaign", view(ShardState(None, FOUNDED), following=40),
     [StopFollowing(), Campaign(FOUNDED, (0, 1, 2))]),
    ("no leader, not in the set", view(ShardState(None, InSync((0, 2), 41))), [StopFollowing()]),
    ("no leader, incomplete store", view(ShardState(None, FOUNDED), member=False), [StopFollowing()]),
    ("no leader, handed to another", view(ShardState(None, FOUNDED, handover_to=2)), [StopFollowing()]),
    ("no leader, handed to it", view(ShardState(None, FOUNDED, handover_to=ME)),
     [StopFollowing(), Campaign(FOUNDED, (0, 1, 2))]),
    ("no leader, stopping", view(ShardState(None, FOUNDED), stopping=True), [StopFollowing()]),
    ("never founded, empty store", view(ShardState(None, InSync((), 0)), member=False, written=0),
     [StopFollowing(), Campaign(InSync((), 0), (ME,))]),
    ("never founded, data of it", view(ShardState(None, InSync((), 0)), member=False, written=5),
     [StopFollowing()]),
    ("never founded, a member's data (etcd lost its keys)", view(ShardState(None, InSync((), 0)), written=5),
     [StopFollowing(), Campaign(InSync((), 0), (ME,))]),
])
def test_each_election_round_decides_from_etcd_and_the_replica(case, v, actions):
    assert Election(rules(ME)).round(v) == actions, case


@pytest.mark.parametrize("members, min_insync, expected", [
    ((0, 1, 2), 2, (1, 2)),      # the last leader (0) leaves the set it may no longer be in sync with
    ((0, 1), 2, (0, 1)),         # ... unless that would leave fewer than min_insync
    ((1, 2), 2, (1, 2)),         # not in it: nothing to drop
    ((0, 1, 2), 3, (0, 1, 2)),
])
def test_a_campaign_drops_the_last_leader_from_the_set_while_min_insync_remain(members, min_insync, expected):
    election = Election(rules(ME, min_insync=min_insync))
    election.round(view(ShardState(LEADER, InSync(members, 41))))  # it saw replica 0 lead
    [_stop, campaign] = election.round(view(ShardState(None, InSync(members, 41))))
    assert campaign == Campaign(InSync(members, 41), expected)


def test_a_founder_writes_itself_as_the_set():
    [_stop, campaign] = Election(rules(ME)).round(view(ShardState(None, InSync((), 0)), member=False, written=0))
    assert campaign.members == (ME,)
