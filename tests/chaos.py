"""Fault injection against replicated shards, Jepsen-style (``make chaos``).

    python -m tests.chaos [--runs 10] [--seed S] [--faults 6] [--partitions] [--classic]
                          [--schedule f1,f2] [--storm N] [--shards N]

Each run starts a name server, etcd, a checker and one shard of three replicas
(min_insync_replicas 2), puts a mixed transactional load on it (4 producers committing,
rolling back and answering UNKNOWN, 2 consumers) and applies a fault schedule drawn from
the run's seed: SIGKILL the leader (restarted later), SIGSTOP the leader past its lease
then SIGCONT it, SIGKILL a follower, wipe a follower's data and restart it, the more faults
of :data:`MORE_FAULTS` (etcd, rebuilds, check storms, the name server), and — with
``--partitions`` (root, network namespaces; at least one per run) — cut the leader off with
a real network partition (tests/support/netns.py): from everyone, or from etcd, the other
replicas and the name server while its clients still reach it; the cut-off leader must step
down by itself, and the partition heals after its successor serves.

With ``--shards N`` (default 1) there are N such shards and the load's topic has queues on
each (the name server spreads them; the run refuses to start otherwise), so producers,
consumers and the checker work against all of them while one is between leaders. Each
fault names the shard it hits, drawn from the seed (``kill-leader@broker-1``; etcd and
name-server faults name none), and :data:`PAIR_FAULTS` hit two shards at once — both
leaders killed together, one killed while the other is paused, and with ``--partitions``
both cut off (:data:`PAIR_PARTITIONS`); every such run has at least one. A single-shard
run's schedules name no shard and are what they always were.

Every run prints its seed and schedule first; a failure is reproduced with ``--seed`` (and
the same ``--shards``, ``--faults``, ``--partitions``, ``--classic``). After the schedule
the load stops and the run checks, for every shard:

- nothing acknowledged lost: every transaction acknowledged COMMITTED, and every UNKNOWN
  whose local transaction committed, is delivered;
- nothing delivered that must not be: no rolled-back or never-run local transaction;
- no committed message stored twice;
- checks spent ≤ check_max for every transaction;
- after quiescence every replica equal (a digest per column family) and clean under fsck;
- the load reached every shard (deliveries from each; printed per shard with
  acknowledgements and checks answered).

It prints the fail-over times (p50, max) over the leader kills and pauses.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.support import netns, presets, replicas, shardset
from tests.support.cluster import Cluster
from tests.support.processes import ServiceProcess
from tests.support.shardset import ShardSet
from tests.support.waiting import WaitTimeout, wait_until
from tests.support.workload import Workload

SHARD = shardset.FIRST
CHECK_MAX = 15
FAULTS = ("kill-leader", "kill-leader", "pause-leader", "kill-follower", "wipe-follower")
#: Drawn too unless ``--classic`` (``more=False``): a leader elected by ``txmq broker elect``
#: killed at once; two replicas killed together (the survivor must refuse writes, retryably);
#: a follower paused during its rebuild from a checkpoint; the leader killed during a
#: follower's rebuild; etcd paused (SIGSTOP, past the leader's lease or not) or restarted
#: under load; a check storm (thousands of UNKNOWN transactions due at once) and the leader
#: killed as their checks fall due; the only name server killed for up to 6 s (the clients
#: keep their routes, the checker its brokers: nothing may fail for good).
MORE_FAULTS = ("elect-kill-leader", "kill-two", "pause-follower-rebuild", "kill-leader-during-rebuild",
               "pause-etcd", "restart-etcd", "check-storm", "kill-nameserver")
#: Seconds a killed or paused leader may go without a successor before the run asks
#: whether one was possible (fail-overs take ~1 s here; the target is 10 s).
FAILOVER_WAIT = 15.0
#: Transactions of one check storm (``--storm``).
STORM = 1000
BROKER_ENV = {"TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1.0", "TXMQ_CHECK_INTERVAL_SECONDS": "0.5",
              "TXMQ_CHECK_MAX": str(CHECK_MAX), "TXMQ_WAL_PREFILL_BYTES": str(1 << 20),
              # A wiped follower is beyond the kept log after a few seconds of load: it rebuilds
              # from a checkpoint (the rebuild faults act during that).
              "TXMQ_REPLICATION_LOG_ENTRIES": "500"}
CHECKER_ENV = presets.REPLICATED_CHECKER


@dataclass
class RunResult:
    seed: int
    schedule: list[str]
    failovers: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    summary: dict[str, int] = field(default_factory=dict)
    #: Per shard: transactions acknowledged, messages delivered, checks answered.
    by_shard: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0


#: With ``--partitions``: the leader cut off from everyone, or from etcd, the other replicas
#: and the name server while its clients (producers, consumers, the checker) still reach it.
PARTITIONS = ("partition-leader", "partition-leader-from-cluster")
#: With ``--shards`` 2 or more, faults that hit two shards at once (the first named shard's
#: leader, then the second's): both leaders SIGKILLed together; the first killed while the
#: second is paused (SIGSTOP past its lease).
PAIR_FAULTS = ("kill-leaders", "kill-pause-leaders")
#: With ``--shards`` 2 or more and ``--partitions``: both leaders cut off at once, the first
#: from everyone, the second from the cluster while its clients still reach it.
PAIR_PARTITIONS = ("partition-leaders",)
#: Faults of the whole cluster, which name no shard.
CLUSTER_FAULTS = ("pause-etcd", "restart-etcd", "kill-nameserver")


def schedule_for(seed: int, faults: int, partitions: bool = False, more: bool = True, shards: int = 1) -> list[str]:
    """The schedule of ``seed``. With ``shards`` > 1 every entry names the shards it hits
    (:mod:`tests.support.shardset`), drawn from the seed too, and at least one fault hits
    two shards at once; a single-shard schedule names none (and is what it always was)."""
    rnd = random.Random(seed)
    pairs = PAIR_FAULTS + (PAIR_PARTITIONS if partitions else ()) if shards > 1 else ()
    kinds = FAULTS + (MORE_FAULTS if more else ()) + (PARTITIONS if partitions else ()) + pairs
    schedule = [rnd.choice(kinds) for _ in range(faults)]
    cuts = PARTITIONS + PAIR_PARTITIONS
    if partitions and faults and not any(f in cuts for f in schedule):
        schedule[rnd.randrange(faults)] = rnd.choice(PARTITIONS)  # every partition run partitions
    if shards == 1:
        return schedule
    if faults and not any(f in pairs for f in schedule):  # every multi-shard run hits two at once
        free = [i for i, f in enumerate(schedule) if f not in cuts] or list(range(faults))
        i = rnd.choice(free)
        schedule[i] = rnd.choice(PAIR_PARTITIONS if schedule[i] in cuts else PAIR_FAULTS)
    names = shardset.shard_names(shards)
    return [shardset.label(f, () if f in CLUSTER_FAULTS else shardset.draw(rnd, names, 2 if f in pairs else 1))
            for f in schedule]


def run_once(seed: int, faults: int, workdir: Path, *, partitions: bool = False, more: bool = True,
             schedule: list[str] | None = None, storm: int = STORM, shards: int = 1, log=print) -> RunResult:
    schedule = schedule if schedule is not None else schedule_for(seed, faults, partitions, more, shards)
    log(f"chaos run seed={seed}{f' shards={shards}' if shards > 1 else ''} schedule={schedule}")
    rnd = random.Random(seed + 1)
    result = RunResult(seed, schedule)
    started = time.monotonic()
    cluster = start_shard(workdir, partitions=partitions, shards=shards)
    every = ShardSet(cluster)
    work: Workload | None = None
    try:
        topic, group = f"chaos-{seed}", f"chaos-{seed}"
        cluster.create_topic(topic, max(4, 2 * shards))  # the name server spreads the queues over the shards
        cluster.create_topic(probe_topic(topic), shards)  # what a probe sends (its outcome may stay unknown)
        for name, counts in ((topic, every.queues(topic)), (probe_topic(topic), every.queues(probe_topic(topic)))):
            if not all(counts.values()):
                raise AssertionError(f"topic {name} left shards without queues: {counts}")
        work = Workload(cluster.nameserver_address, topic, group, producers=4, consumers=2, seed=seed).start()
        wait_until(lambda: work.sent >= 20, 60, message=lambda: f"load did not start: {work.summary()}")
        for step, fault in enumerate(schedule, 1):
            time.sleep(rnd.uniform(0.3, 1.5))  # load between faults
            apply_fault(fault, cluster, rnd, result, log, work=work, storm=storm)
            log(f"  fault {step}/{len(schedule)} {fault} done; {work.summary()}")
        work.stop_producers()
        wait_until(lambda: not work.missing(), 90, interval=0.2,
                   message=lambda: f"never delivered: {describe_missing(cluster, work)} {work.summary()}")
        every.wait_in_sync(timeout=90)
        time.sleep(1.0)  # late redeliveries would show a duplicate
        work.stop()
        result.by_shard = work.by_shard()
        # No send fails for good: while the shard is between leaders the name servers answer
        # NoLeaderError (retryable), which a send waits out within its send timeout.
        result.violations = work.violations() + [
            f"{body}: a send failed with an error the SDK does not retry: {why}"
            for body, why in sorted(work.failed_for_good.items())]
        result.summary = work.summary()
        result.violations += [f"the load never reached {name}: {result.by_shard}"
                              for name in every.names if not result.by_shard.get(name, {}).get("delivered")]
        result.violations += compare_replicas(cluster)
    except BaseException as exc:  # noqa: BLE001 - whatever ended the run is reported as its violation
        result.violations.append(f"run failed: {type(exc).__name__}: {exc}"[:2000])
        for name, text in cluster.logs(40).items():
            log(f"--- {name}\n{text}")
    finally:
        if work is not None:
            work.stop()
        cluster.stop()
    result.seconds = time.monotonic() - started
    log(f"chaos run seed={seed}: {'OK' if not result.violations else 'VIOLATIONS'} in {result.seconds:.0f} s; "
        f"{result.summary}; fail-overs {[round(f, 2) for f in result.failovers]}")
    if shards > 1:
        log(f"  by shard: {result.by_shard}")
    for v in result.violations[:20]:
        log(f"  VIOLATION {v}")
    return result


def start_shard(workdir: Path, *, partitions: bool = False, checker_env: dict[str, str] | None = None,
                shards: int = 1) -> Cluster:
    """The cluster every chaos run starts: a name server, etcd, a checker and ``shards``
    shards of three replicas each (min_insync_replicas 2), with the chaos timings
    (:data:`BROKER_ENV`); ``partitions``: each replica in a network namespace of its own;
    ``checker_env``: more checker settings."""
    return Cluster(workdir, brokers=shards, replication_factor=3, checker=True, broker_env=BROKER_ENV,
                   checker_env={**CHECKER_ENV, **(checker_env or {})}, netns=partitions)


def apply_fault(entry: str, cluster: Cluster, rnd: random.Random, result: RunResult, log=print, *,
                work: Any = None, storm: int = STORM) -> None:
    """One entry of the schedule (any of :data:`FAULTS`, :data:`MORE_FAULTS`,
    :data:`PARTITIONS`, :data:`PAIR_FAULTS`, :data:`PAIR_PARTITIONS`, against the shards it
    names: see :mod:`tests.support.shardset`), returning once it is over and every shard
    has a leader again. ``work`` is the load (its ``topic``'s probe topic takes
    ``kill-two``'s probes; ``check-storm`` calls its ``storm``); fail-over times go to
    ``result``."""
    fault, shards = shardset.parse(entry)
    if fault in PAIR_FAULTS + PAIR_PARTITIONS:
        pair_fault(fault, cluster, shards, rnd, result, log)
        return
    shard = shards[0]
    leader = cluster.wait_leaders(60)[shard]
    followers = [p for p in cluster.shards[shard] if p is not leader]
    if fault == "kill-leader":
        kill_leader(cluster, leader, result, rnd.uniform(0.0, 1.5), log, shard=shard)
    elif fault == "pause-leader":
        leader.pause()
        try:
            if wait_failover(cluster, leader, result, log, shard=shard):
                time.sleep(rnd.uniform(0.0, 1.0))
        finally:
            leader.resume()
        cluster.wait_leaders(60)
    elif fault == "kill-follower":
        victim = rnd.choice(followers)
        victim.kill()
        time.sleep(rnd.uniform(0.2, 1.5))
        victim.restart(60)
    elif fault == "wipe-follower":
        victim = rnd.choice(followers)
        victim.kill()
        shutil.rmtree(victim.env["TXMQ_DATA_DIR"], ignore_errors=True)
        time.sleep(rnd.uniform(0.0, 0.5))
        victim.restart(60)
    elif fault in PARTITIONS:
        since = leader.log_size()
        with netns.isolated(leader, clients=fault == "partition-leader-from-cluster"):
            t0 = time.monotonic()
            cluster.wait_leaders(60, shards=[shard], not_on=leader)
            result.failovers.append(time.monotonic() - t0)
            # Cut off, it must find out by itself that it leads no more.
            wait_stepped_down(leader, since)
            time.sleep(rnd.uniform(0.0, 1.0))
    elif fault in MORE_FAULTS:
        more_fault(fault, cluster, shard, work, leader, followers, rnd, result, storm, log)


def pair_fault(fault: str, cluster: Cluster, shards: tuple[str, ...], rnd: random.Random, result: RunResult,
               log=print) -> None:
    """One of :data:`PAIR_FAULTS` or :data:`PAIR_PARTITIONS` against the leaders of two
    shards at once (``shards``: the first, then the second); each shard's fail-over is timed
    from the moment both were hit."""
    first, second = shards
    leaders = cluster.wait_leaders(60, shards=list(shards))
    if fault == "partition-leaders":
        since = {s: leaders[s].log_size() for s in shards}
        with netns.isolated(leaders[first]), netns.isolated(leaders[second], clients=True):
            t0 = time.monotonic()
            for s in shards:
                cluster.wait_leaders(60, shards=[s], not_on=leaders[s])
                result.failovers.append(time.monotonic() - t0)
            for s in shards:
                wait_stepped_down(leaders[s], since[s])
            time.sleep(rnd.uniform(0.0, 1.0))
        cluster.wait_leaders(60)
        return
    killed, hit = leaders[first], leaders[second]
    killed.kill()
    if fault == "kill-leaders":
        hit.kill()
    else:
        hit.pause()
    t0 = time.monotonic()
    try:
        took_over = [wait_failover(cluster, leaders[s], result, log, shard=s, since=t0) for s in shards]
        if all(took_over):
            time.sleep(rnd.uniform(0.0, 1.5))
    finally:
        if fault == "kill-pause-leaders":
            hit.resume()
    for proc in (killed, hit) if fault == "kill-leaders" else (killed,):
        proc.restart(60)
    cluster.wait_leaders(60)


def wait_stepped_down(leader: ServiceProcess, since: int) -> None:
    """Until ``leader``, cut off, logs (after byte ``since``) that it stepped down by itself."""
    wait_until(lambda: "stepped down" in leader.log_text(since), 30,
               message=lambda: f"the partitioned leader {leader.name} never stepped down")


def compare_replicas(cluster: Cluster) -> list[str]:
    """Stops every shard's replicas and compares them (equal digests, fsck clean: raises
    otherwise); returns the violations of transactions sent more than ``check_max`` checks."""
    return ShardSet(cluster).stop_and_compare(CHECK_MAX)


def kill_leader(cluster: Cluster, leader: ServiceProcess, result: RunResult, down_seconds: float,
                log=print, *, shard: str = SHARD) -> None:
    """SIGKILL of ``shard``'s leader; times the fail-over; restarts it ``down_seconds`` later
    (at once when no other replica could take over: see :func:`wait_failover`)."""
    leader.kill()
    if wait_failover(cluster, leader, result, log, shard=shard):
        time.sleep(down_seconds)
    leader.restart(60)
    cluster.wait_leaders(60)


def wait_failover(cluster: Cluster, leader: ServiceProcess, result: RunResult, log=print, *,
                  shard: str = SHARD, since: float | None = None) -> bool:
    """Waits for another replica of ``shard`` to lead after ``leader`` was killed or paused,
    and times it (from ``since``, a monotonic time, default now). If none does within
    :data:`FAILOVER_WAIT` seconds, that is right only when none could: no other running
    replica is both in etcd's in-sync set and complete (two faults in a row can leave the
    set as {the leader, a wiped replica still rebuilding} while the third replica, back from
    a kill, is not yet re-admitted; electing it could lose what only the leader and the
    wiped replica had acknowledged). Then it returns False and the caller brings the leader
    back; a possible successor that never took over raises."""
    t0 = time.monotonic() if since is None else since
    try:
        cluster.wait_leaders(max(0.0, t0 + FAILOVER_WAIT - time.monotonic()), shards=[shard], not_on=leader)
    except WaitTimeout:
        eligible, views = ShardSet(cluster).successors(shard, leader)
        if eligible:
            raise WaitTimeout(f"no fail-over of {shard} within {FAILOVER_WAIT} s although replicas {eligible} "
                              f"could lead: {views}") from None
        log(f"    no other replica could lead after {leader.name} stopped ({views}): bringing it back")
        return False
    result.failovers.append(time.monotonic() - t0)
    return True


def probe_topic(topic: str) -> str:
    return f"{topic}-probe"


def more_fault(fault: str, cluster: Cluster, shard: str, work: Workload, leader: ServiceProcess,
               followers: list[ServiceProcess], rnd: random.Random, result: RunResult, storm: int, log) -> None:
    """One of :data:`MORE_FAULTS` (against ``shard``, where it hits one)."""
    from txmq.v1 import replication_pb2, replication_pb2_grpc

    if fault == "elect-kill-leader":
        # Every replica in sync, so the transfer may choose any; a registration under a load
        # that never pauses (the anchored run's) always shows the batch in flight.
        replicas.wait_in_sync(cluster, shard, timeout=60, lag_records=100)
        leader = cluster.wait_leaders(60)[shard]
        target = rnd.choice([p for p in cluster.shards[shard] if p is not leader])
        old_epoch = replicas.leader_status(cluster, shard).leader_epoch
        moved = True
        with grpc.insecure_channel(leader.address) as channel:
            try:
                replication_pb2_grpc.ReplicationServiceStub(channel).TransferLeadership(
                    replication_pb2.TransferLeadershipRequest(shard=shard, replica_id=int(target.env["TXMQ_REPLICA_ID"])),
                    timeout=30)
            except grpc.RpcError as exc:
                moved = False
                result.violations.append(f"txmq broker elect refused under load: {exc.code().name}: {exc.details()}")
        target.kill()  # the replica just elected, at once
        t0 = time.monotonic()
        wait_until(lambda: cluster.leader(shard) not in (None, target)
                   and replicas.leader_status(cluster, shard).leader_epoch > old_epoch, 60, interval=0.05,
                   message="no leader after the elected replica was killed", ignore=(grpc.RpcError, KeyError))
        if moved:
            result.failovers.append(time.monotonic() - t0)
        time.sleep(rnd.uniform(0.0, 1.0))
        target.restart(60)
    elif fault == "kill-two":
        survivor = rnd.choice(followers)
        victims = [leader, next(p for p in followers if p is not survivor)]
        for victim in victims:
            victim.kill()
        result.violations.extend(replicas.probe_refused(survivor, probe_topic(work.topic), rnd.uniform(1.0, 3.0)))
        rnd.shuffle(victims)
        for victim in victims:
            victim.restart(60)
        cluster.wait_leaders(60)  # a recovery (restarts included), not a fail-over: not timed
    elif fault in ("pause-follower-rebuild", "kill-leader-during-rebuild"):
        victim = rnd.choice(followers)
        victim.kill()
        shutil.rmtree(victim.env["TXMQ_DATA_DIR"], ignore_errors=True)
        time.sleep(1.0)  # the load writes past the log the leader keeps
        others = [p for p in cluster.shards[shard] if p is not victim]
        since = {p.name: p.log_size() for p in others}
        since_victim = victim.log_size()
        victim.restart(60)
        try:  # on whichever replica leads by then
            wait_until(lambda: any("checkpoint for a follower" in p.log_text(since[p.name]) for p in others), 30,
                       interval=0.05)
        except WaitTimeout:
            log("    no rebuild started within 30 s (the follower replayed the log)")
            return
        if fault == "pause-follower-rebuild":
            victim.pause()
            time.sleep(rnd.uniform(0.5, 3.0))
            victim.resume()
        else:
            kill_leader(cluster, cluster.wait_leaders(60)[shard], result, rnd.uniform(0.0, 1.0), log, shard=shard)
        try:
            wait_until(lambda: "rebuilt from the leader's checkpoint" in victim.log_text(since_victim), 90,
                       interval=0.05)
        except WaitTimeout:
            result.violations.append(f"{victim.name} never finished its rebuild after {fault}")
    elif fault == "pause-etcd":
        assert cluster.etcd is not None
        cluster.etcd.pause()
        try:
            time.sleep(rnd.uniform(1.0, 6.0))  # the leader's lease is 4 s: past it or not
        finally:
            cluster.etcd.resume()
        cluster.wait_leaders(60)
    elif fault == "restart-etcd":
        assert cluster.etcd is not None
        cluster.etcd.restart()
        cluster.wait_leaders(60)
    elif fault == "kill-nameserver":
        nameserver = cluster.nameservers[0]
        nameserver.kill()
        time.sleep(rnd.uniform(1.0, 6.0))  # the load goes on against the brokers meanwhile
        nameserver.restart(60)
        cluster.wait_brokers_registered(60)
        cluster.wait_leaders(60)
    elif fault == "check-storm":
        took = work.storm(storm)
        log(f"    {storm} UNKNOWN transactions sent in {took:.1f} s; killing the leader as their checks fall due")
        kill_leader(cluster, cluster.wait_leaders(60)[shard], result, 0.0, log, shard=shard)


def describe_missing(cluster: Cluster, work: Workload) -> list[str]:
    """What the shard says of each transaction that should have been delivered and was not
    (a lost write shows as NOT_FOUND, a slow check as PREPARED with its next check time)."""
    from txmq.errors import error_from_rpc
    from txmq.v1 import admin_pb2

    out = []
    for body in sorted(work.missing())[:10]:
        tid = work.transaction_ids.get(body, "")
        try:
            t = cluster.admin_stub().DescribeTransaction(admin_pb2.DescribeTransactionRequest(transaction_id=tid),
                                                         timeout=5).transaction
            out.append(f"{body} {tid} state={t.state} checks={t.checks_delivered}/{t.checks_answered} "
                       f"next_check_in={(t.next_check_at_ms - time.time() * 1000) / 1000:.1f}s "
                       f"source={t.resolution_source} discard={t.discard_reason!r}")
        except Exception as exc:  # noqa: BLE001 - a description, best effort
            err = error_from_rpc(exc) if hasattr(exc, "code") else exc
            out.append(f"{body} {tid} {type(err).__name__}: {err}"[:300])
    return out


def report(results: list[RunResult], log=print) -> bool:
    failovers = [f for r in results for f in r.failovers]
    bad = [r for r in results if r.violations]
    if failovers:
        log(f"fail-over over {len(failovers)} leader kills/pauses: p50 {statistics.median(failovers):.2f} s, "
            f"max {max(failovers):.2f} s")
    log(f"{len(results)} runs, {sum(len(r.schedule) for r in results)} faults, {len(bad)} with violations"
        + (f" (seeds {[r.seed for r in bad]})" if bad else ""))
    return not bad


def seeds_to_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The seeds of a chaos command (``--seed``, or ``--runs`` drawn); with ``--partitions``
    the network namespaces checked and cleaned first (the command refuses, naming why)."""
    if args.partitions:
        problem = netns.available()
        if problem:
            parser.error(f"--partitions: {problem}")
        netns.cleanup_leftovers()
    return [args.seed] if args.seed is not None else [random.randrange(1, 10**9) for _ in range(args.runs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="run this seed only (reproduce a failure)")
    parser.add_argument("--faults", type=int, default=6)
    parser.add_argument("--partitions", action="store_true", help="also cut the leader off (network namespaces)")
    parser.add_argument("--classic", action="store_true", help=f"draw only {', '.join(sorted(set(FAULTS)))}")
    parser.add_argument("--schedule", default="", help="run this comma-separated schedule instead of drawing one")
    parser.add_argument("--storm", type=int, default=STORM, help="transactions of one check storm")
    parser.add_argument("--shards", type=int, default=1,
                        help="shards of three replicas each; with 2 or more every fault names its shards, "
                             "and some hit two at once")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards: at least 1")
    seeds = seeds_to_run(parser, args)
    results = []
    base = Path(tempfile.mkdtemp(prefix="txmq-chaos-"))
    for seed in seeds:
        results.append(run_once(seed, args.faults, base / str(seed), partitions=args.partitions, more=not args.classic,
                                schedule=args.schedule.split(",") if args.schedule else None, storm=args.storm,
                                shards=args.shards, log=lambda m: print(m, flush=True)))
    ok = report(results)
    if ok:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"logs kept in {base}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
