"""Fault injection against a replicated shard, Jepsen-style (``make chaos``).

    python -m tests.chaos [--runs 10] [--seed S] [--faults 6] [--partitions]

Each run starts a name server, etcd, a checker and one shard of three replicas
(min_insync_replicas 2), puts a mixed transactional load on it (4 producers committing,
rolling back and answering UNKNOWN, 2 consumers) and applies a fault schedule drawn from
the run's seed: SIGKILL the leader (restarted later), SIGSTOP the leader past its lease
then SIGCONT it, SIGKILL a follower, wipe a follower's data and restart it, and — with
``--partitions`` (root, network namespaces; at least one per run) — cut the leader off with
a real network partition (tests/support/netns.py): from everyone, or from etcd, the other
replicas and the name server while its clients still reach it; the cut-off leader must step
down by itself, and the partition heals after its successor serves. Every run prints its seed and schedule first; a failure is reproduced with
``--seed``. After the schedule the load stops and the run checks:

- nothing acknowledged lost: every transaction acknowledged COMMITTED, and every UNKNOWN
  whose local transaction committed, is delivered;
- nothing delivered that must not be: no rolled-back or never-run local transaction;
- no committed message stored twice;
- checks spent ≤ check_max for every transaction;
- after quiescence every replica equal (a digest per column family) and clean under fsck.

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

from tests.support import netns, replicas
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from tests.support.workload import Workload

SHARD = "broker-0"
CHECK_MAX = 15
FAULTS = ("kill-leader", "kill-leader", "pause-leader", "kill-follower", "wipe-follower")
BROKER_ENV = {"TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1.0", "TXMQ_CHECK_INTERVAL_SECONDS": "0.5",
              "TXMQ_CHECK_MAX": str(CHECK_MAX), "TXMQ_WAL_PREFILL_BYTES": str(1 << 20)}
CHECKER_ENV = {"TXMQ_LEASE_SECONDS": "2.0", "TXMQ_ANSWER_TIMEOUT_SECONDS": "1.0"}


@dataclass
class RunResult:
    seed: int
    schedule: list[str]
    failovers: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    summary: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


#: With ``--partitions``: the leader cut off from everyone, or from etcd, the other replicas
#: and the name server while its clients (producers, consumers, the checker) still reach it.
PARTITIONS = ("partition-leader", "partition-leader-from-cluster")


def schedule_for(seed: int, faults: int, partitions: bool = False) -> list[str]:
    rnd = random.Random(seed)
    kinds = FAULTS + (PARTITIONS if partitions else ())
    schedule = [rnd.choice(kinds) for _ in range(faults)]
    if partitions and faults and not any(f in PARTITIONS for f in schedule):
        schedule[rnd.randrange(faults)] = rnd.choice(PARTITIONS)  # every partition run partitions
    return schedule


def run_once(seed: int, faults: int, workdir: Path, *, partitions: bool = False, log=print) -> RunResult:
    schedule = schedule_for(seed, faults, partitions)
    log(f"chaos run seed={seed} schedule={schedule}")
    rnd = random.Random(seed + 1)
    result = RunResult(seed, schedule)
    started = time.monotonic()
    cluster = Cluster(workdir, brokers=1, replication_factor=3, checker=True, broker_env=BROKER_ENV,
                      checker_env=CHECKER_ENV, netns=partitions)
    work: Workload | None = None
    try:
        topic, group = f"chaos-{seed}", f"chaos-{seed}"
        cluster.create_topic(topic, 4)
        work = Workload(cluster.nameserver_address, topic, group, producers=4, consumers=2, seed=seed).start()
        wait_until(lambda: work.sent >= 20, 60, message=lambda: f"load did not start: {work.summary()}")
        for step, fault in enumerate(schedule, 1):
            time.sleep(rnd.uniform(0.3, 1.5))  # load between faults
            leader = cluster.wait_leaders(60)[SHARD]
            followers = [p for p in cluster.shards[SHARD] if p is not leader]
            if fault == "kill-leader":
                leader.kill()
                t0 = time.monotonic()
                cluster.wait_leaders(60, not_on=leader)
                result.failovers.append(time.monotonic() - t0)
                time.sleep(rnd.uniform(0.0, 1.5))
                leader.restart(60)
            elif fault == "pause-leader":
                leader.pause()
                t0 = time.monotonic()
                try:
                    cluster.wait_leaders(60, not_on=leader)
                    result.failovers.append(time.monotonic() - t0)
                    time.sleep(rnd.uniform(0.0, 1.0))
                finally:
                    leader.resume()
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
                    cluster.wait_leaders(60, not_on=leader)
                    result.failovers.append(time.monotonic() - t0)
                    # Cut off, it must find out by itself that it leads no more.
                    wait_until(lambda: "stepped down" in leader.log_text(since), 30,
                               message=lambda: f"the partitioned leader {leader.name} never stepped down")
                    time.sleep(rnd.uniform(0.0, 1.0))
            log(f"  fault {step}/{len(schedule)} {fault} done; {work.summary()}")
        work.stop_producers()
        wait_until(lambda: not work.missing(), 90, interval=0.2,
                   message=lambda: f"never delivered: {describe_missing(cluster, work)} {work.summary()}")
        replicas.wait_in_sync(cluster, SHARD, timeout=90)
        time.sleep(1.0)  # late redeliveries would show a duplicate
        work.stop()
        result.violations = work.violations()
        result.summary = work.summary()
        replicas.stop_and_compare(cluster, SHARD)
        spent = max(replicas.max_checks_spent(p) for p in cluster.shards[SHARD])
        if spent > CHECK_MAX:
            result.violations.append(f"a transaction was sent {spent} checks, above check_max={CHECK_MAX}")
    except BaseException as exc:
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
    for v in result.violations[:20]:
        log(f"  VIOLATION {v}")
    return result


def describe_missing(cluster: Cluster, work: Workload) -> list[str]:
    """What the shard says of each transaction that should have been delivered and was not
    (a lost write shows as NOT_FOUND, a slow check as PREPARED with its next check time)."""
    from txmq.errors import TxmqError, error_from_rpc
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="run this seed only (reproduce a failure)")
    parser.add_argument("--faults", type=int, default=6)
    parser.add_argument("--partitions", action="store_true", help="also cut the leader off (network namespaces)")
    args = parser.parse_args(argv)
    if args.partitions:
        problem = netns.available()
        if problem:
            parser.error(f"--partitions: {problem}")
        netns.cleanup_leftovers()
    seeds = [args.seed] if args.seed is not None else [random.randrange(1, 10**9) for _ in range(args.runs)]
    results = []
    base = Path(tempfile.mkdtemp(prefix="txmq-chaos-"))
    for seed in seeds:
        results.append(run_once(seed, args.faults, base / str(seed), partitions=args.partitions,
                                log=lambda m: print(m, flush=True)))
    ok = report(results)
    if ok:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"logs kept in {base}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
