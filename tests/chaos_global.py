"""Multi-message transactions under random crashes (part of ``make chaos``).

    python -m tests.chaos_global [--rounds 60] [--seed S]

A cluster of two shards and a checker; each round drives one global transaction (four
messages on two topics, two on each shard) with a combination drawn from the seed: which
broker is armed with which fail point (``services/broker/failpoints.py``; a step that broker
never reaches only means no crash), which shard coordinates, whether the participant is
named, the producer's decision and the last step it takes. Some rounds the group answers
every check UNKNOWN, so ``G`` is discarded (``check_max``): every part must be discarded on
its shard, and an operator then commits or rolls ``G`` back. A broker that dies is restarted
(disarmed). After each round: all four messages reach the consumers of both topics, or none
does and every part is decided; at the end, nothing of a rolled-back transaction was ever
delivered. The seed is printed first; a failure is reproduced with ``--seed``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import txmq
from services.broker import failpoints
from tests.integration.test_global_transactions import (FAST, SHARDS, Case, Consuming, Driver,
                                                        _committed_in_queues, _global_states, _parts_open, two_topics)
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from txmq.v1 import broker_pb2, common_pb2

LocalState = txmq.LocalTransactionState


def draw(rng: random.Random) -> Case:
    producer_until = rng.choice(["end", "end", "end", "local", "parts", "begin"])
    shard, step = "", ""
    if rng.random() < 0.8:
        shard, step = rng.choice(SHARDS), rng.choice(failpoints.STEPS)
    decision = rng.choice([LocalState.COMMIT, LocalState.COMMIT, LocalState.ROLLBACK])
    if rng.random() < 0.15:  # the group never knows: G is discarded, then an operator decides
        decision, producer_until = LocalState.UNKNOWN, "local"
    return Case(shard, step, decision, producer_until, listed=rng.random() < 0.7)


def _discarded(cluster, gid: str) -> bool:
    """G and every part of it are DISCARDED, and no participant is left to tell."""
    states, pending = _global_states(cluster, gid)
    return not pending and set(states) == {common_pb2.TRANSACTION_STATE_DISCARDED}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"chaos_global: seed {seed}, {args.rounds} rounds", flush=True)
    rng = random.Random(seed)
    env = {"TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.4", "TXMQ_CHECK_INTERVAL_SECONDS": "0.2",
           "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "0.4", "TXMQ_WAL_PREFILL_BYTES": str(1 << 20),
           "TXMQ_CHECK_MAX": "3", **FAST}
    workdir = Path(tempfile.mkdtemp(prefix="txmq-chaos-global-"))
    cluster = Cluster(workdir, brokers=2, checker=True, broker_env=env)
    rolled_back: list[str] = []
    started = time.monotonic()
    try:
        topics = two_topics(cluster, "chaos-global")
        decisions: dict[str, LocalState] = {}
        in_flight: set[str] = set()

        def check(message):
            if message.message_id in in_flight:
                return txmq.InProgress(retry_after_seconds=0.2)
            return decisions.get(message.transaction_id, LocalState.ROLLBACK)
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group="chaos-pg", checker=check) as group:
            wait_until(lambda: group.connected_checkers(), 10)
            consumers = Consuming(cluster, topics, "chaos-cg")
            driver = Driver(cluster, topics, "chaos-pg", decisions, in_flight)
            try:
                for n in range(args.rounds):
                    case = draw(rng)
                    print(f"round {n}: {case}", flush=True)
                    if case.shard:
                        driver.arm(case.shard, case.step)
                    gid, ids = driver.run(case, n)

                    def settled() -> bool:
                        for i, proc in enumerate(cluster.brokers):
                            if not proc.running:  # its fail point fired after the producer's calls
                                driver.revive(SHARDS[i])
                        return not any(_parts_open(cluster, s, gid) for s in SHARDS)
                    wait_until(settled, 30, message=f"round {n} ({case}): still undecided", ignore=(Exception,))
                    commits = case.commits
                    if case.decision is LocalState.UNKNOWN:
                        wait_until(lambda: settled() and _discarded(cluster, gid), 30, ignore=(Exception,),
                                   message=f"round {n} ({case}): not discarded whole")
                        assert not consumers.of(gid), f"round {n} ({case}): discarded, yet delivered"
                        commits = rng.random() < 0.5
                        print(f"round {n}: the operator {'commits' if commits else 'rolls back'} {gid}", flush=True)
                        driver.call(SHARDS[0] if case.listed else SHARDS[1], "EndTransaction",
                                    broker_pb2.EndTransactionRequest(
                                        transaction_id=gid, source=common_pb2.TRANSACTION_SOURCE_OPERATOR,
                                        resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT if commits
                                        else common_pb2.TRANSACTION_RESOLUTION_ROLLBACK, operator="chaos"))
                        wait_until(settled, 30, message=f"round {n} ({case}): undecided after the operator",
                                   ignore=(Exception,))
                    if case.shard and cluster.brokers[SHARDS.index(case.shard)].env.get("TXMQ_FAILPOINT"):
                        driver.arm(case.shard, "")  # never reached: disarm
                    if commits:
                        wait_until(lambda: consumers.of(gid) == ids, 30, message=f"round {n} ({case}): partial")
                    else:
                        assert not _committed_in_queues(driver, gid), f"round {n} ({case}): rolled back, yet queued"
                        rolled_back.append(gid)
                assert all(not consumers.of(g) for g in rolled_back), "a rolled-back transaction was delivered"
                assert not consumers.errors, consumers.errors
            finally:
                consumers.stop()
    except BaseException:
        print(f"chaos_global: FAILED (seed {seed}); logs in {workdir}", flush=True)
        raise
    finally:
        cluster.stop()
    print(f"chaos_global: {args.rounds} rounds all-or-nothing ({len(rolled_back)} rolled back) in "
          f"{time.monotonic() - started:.0f}s, seed {seed}")
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when a run fails
    return 0


if __name__ == "__main__":
    sys.exit(main())
