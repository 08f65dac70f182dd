"""Anchored transactions against a real PostgreSQL while the shard fails over and the
producers themselves die (part of ``make chaos``).

    python -m tests.chaos_anchored [--runs 10] [--seed S] [--faults 4] [--producers 3]
                                   [--consumers 2] [--partitions] [--classic] [--schedule s1,s2]
                                   [--resolver drawn|on|off]

Each run starts tests/chaos.py's cluster (a name server, etcd, a checker, one shard of
three replicas) and a private PostgreSQL, then ``--producers`` producer processes
(tests/support/anchored_load.py) running anchored transactions in a loop — one ``orders``
row and one message, some two messages, some raising in the block to roll back; each
process, in turn from the seed, on the sync SDK, on ``txmq.aio``, or on the sync SDK with a
SQLAlchemy ``Session`` for the caller's connection (the summary counts the
commits of each) — and
``--consumers`` consumers recording every delivery. The schedule, drawn from the seed and
printed first, mixes ``--faults`` broker faults of tests/chaos.py (every one but the check
storm; the partitions with ``--partitions``) with the producers' own deaths:

- ``kill-producer``: a producer process SIGKILLed at a random moment (the k-th such step
  kills slot k mod producers, so every producer dies), restarted after a drawn pause;
- ``failpoint:<step>`` (at least one per run, steps of ``txmq._database.FAILPOINTS``): a
  producer restarted armed with ``TXMQ_SDK_FAILPOINT`` dies at that step of its anchored
  transaction (inside it, with halves stored, just before or after COMMIT, during or after
  EndTransaction), then restarts unarmed;
- ``kill-all-producers`` (every other run, drawn): the whole fleet SIGKILLed at once and
  down for 2-5 s, so checks fall due while no producer is online.

Every other run (drawn; ``--resolver on|off`` decides instead) the checker is configured
to answer the group's checks itself from the decisions table while no producer of the
group is subscribed (``TXMQ_RESOLVER_GROUPS``, docs/anchored-transactions.md).

A producer step runs beside the schedule (it may fall inside the next broker fault). Then
the producers stop starting transactions (the ones running keep answering checks), a
fresh instance of the group joins them, and once the checks settle the run checks, with
the ``orders`` table as the truth:

- a message is delivered iff its order committed (every body ``<order>#<i>`` of every
  committed order, and no other);
- nothing delivered whose transaction rolled back or never committed;
- no committed message stored twice (delivered from two queue offsets; redelivery of the
  same offset is at-least-once);
- no transaction of the group left PREPARED or DISCARDED on the broker;
- the decisions table drains to fence rows (``rollback``) only;
- what the producers were told agrees with the table (acknowledged COMMITTED → a row;
  rolled back → none), and no transaction failed with an error the SDK does not retry;
- the replicas equal and fsck clean, checks spent ≤ check_max (as tests/chaos.py).

A failure is reproduced with ``--seed`` (the draws; the interleaving is the machine's).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tests import chaos
from tests.support import replicas
from tests.support.anchored_load import DECISION_SETTINGS, ORDERS_SQL, AnchoredLoad
from tests.support.cluster import Cluster
from tests.support.postgres import PostgresInstance, fresh_database
from tests.support.waiting import WaitTimeout, wait_until
from tests.support.workload import Workload

SHARD = chaos.SHARD
#: The broker faults drawn: tests/chaos.py's, but the check storm (the classic listener's load).
BROKER_FAULTS = chaos.FAULTS + tuple(f for f in chaos.MORE_FAULTS if f != "check-storm")
PRODUCER_FAULTS = ("kill-producer", "kill-all-producers")
#: How long the whole fleet stays down in ``kill-all-producers`` (checks fall due meanwhile:
#: the first 1 s after a half message).
FLEET_DOWN_SECONDS = (2.0, 5.0)
#: How long an armed producer may take to reach its fail point (a broker fault may be holding
#: its transaction up) before the step counts as missed.
FAILPOINT_WAIT = 60.0


def failpoints() -> tuple[str, ...]:
    from txmq._database import FAILPOINTS

    return FAILPOINTS


def schedule_for(seed: int, faults: int, producers: int = 3, partitions: bool = False,
                 more: bool = True) -> list[str]:
    """``faults`` broker faults as tests/chaos.py draws them, one ``kill-producer`` per
    producer and one ``failpoint:<step>``, in a drawn order; every other run (drawn) also
    ``kill-all-producers``."""
    rnd = random.Random(seed)
    kinds = (chaos.FAULTS if not more else BROKER_FAULTS) + (chaos.PARTITIONS if partitions else ())
    broker = [rnd.choice(kinds) for _ in range(faults)]
    if partitions and faults and not any(f in chaos.PARTITIONS for f in broker):
        broker[rnd.randrange(faults)] = rnd.choice(chaos.PARTITIONS)
    steps = broker + ["kill-producer"] * producers + [f"failpoint:{rnd.choice(failpoints())}"]
    rnd.shuffle(steps)
    extra = random.Random(seed + 2)  # drawn apart: the schedules drawn before it came stay as they were
    if extra.random() < 0.5:
        steps.insert(extra.randrange(len(steps) + 1), "kill-all-producers")
    return steps


def resolver_for(seed: int) -> bool:
    """Whether the run's checker answers the group's checks itself while no producer is
    online (``TXMQ_RESOLVER_GROUPS``): every other run, drawn."""
    return random.Random(seed + 3).random() < 0.5


def check_schedule(schedule: list[str]) -> None:
    known = set(BROKER_FAULTS + chaos.PARTITIONS + PRODUCER_FAULTS)
    for step in schedule:
        if step.startswith("failpoint:"):
            if step.split(":", 1)[1] not in failpoints():
                raise ValueError(f"{step}: the fail points are {', '.join(failpoints())}")
        elif step not in known:
            raise ValueError(f"{step}: not a fault of this run ({', '.join(sorted(known))}, failpoint:<step>)")


def run_once(seed: int, faults: int, workdir: Path, *, producers: int = 3, consumers: int = 2,
             partitions: bool = False, more: bool = True, schedule: list[str] | None = None,
             resolver: bool | None = None, pg: PostgresInstance | None = None,
             log: Callable[[str], None] = print) -> chaos.RunResult:
    """One run (see the module's doc); ``resolver``: None draws it from the seed."""
    schedule = schedule if schedule is not None else schedule_for(seed, faults, producers, partitions, more)
    check_schedule(schedule)
    resolver = resolver_for(seed) if resolver is None else resolver
    log(f"chaos_anchored run seed={seed} producers={producers} consumers={consumers} "
        f"resolver={'on' if resolver else 'off'} schedule={schedule}")
    rnd = random.Random(seed + 1)
    result = chaos.RunResult(seed, schedule)
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    own_pg = pg is None
    pg = pg if pg is not None else PostgresInstance(max_connections=200)
    cluster: Cluster | None = None
    load: AnchoredLoad | None = None
    deliveries: Workload | None = None
    steps: list[threading.Thread] = []
    try:
        dsn = prepare(pg)
        topic, group = f"anchored-{seed}", f"anchored-{seed}"
        checker_env = {}
        if resolver:
            (workdir / "resolver.dsn").write_text(dsn)
            checker_env = {"TXMQ_RESOLVER_GROUPS": f"{group}={workdir / 'resolver.dsn'}",
                           "TXMQ_RESOLVER_IN_PROGRESS_RETRY_SECONDS": "0.5",
                           "TXMQ_RESOLVER_REPAIR_AFTER_SECONDS": "1.0", "TXMQ_RESOLVER_SWEEP_INTERVAL_SECONDS": "0.5"}
        cluster = chaos.start_shard(workdir / "cluster", partitions=partitions, checker_env=checker_env)
        cluster.create_topic(topic, 4)
        cluster.create_topic(f"{topic}-probe", 1)  # kill-two's probes
        deliveries = Workload(cluster.nameserver_address, topic, group, producers=0, consumers=consumers,
                              seed=seed).start()
        load = AnchoredLoad(workdir, nameserver=cluster.nameserver_address, dsn=dsn, topic=topic, group=group,
                            producers=producers, seed=seed)
        wait_until(lambda: load.committed() >= 10, 90, interval=0.1,
                   message=lambda: f"load did not start: {load.describe()}")
        kills = 0
        locks = [threading.Lock() for _ in range(producers)]  # one producer step at a time per slot
        for step, fault in enumerate(schedule, 1):
            time.sleep(rnd.uniform(0.3, 1.5))  # load between faults
            if fault in PRODUCER_FAULTS or fault.startswith("failpoint:"):
                slot = kills % producers if fault == "kill-producer" else rnd.randrange(producers)
                kills += fault == "kill-producer"
                down = rnd.uniform(*FLEET_DOWN_SECONDS) if fault == "kill-all-producers" else rnd.uniform(0.0, 1.5)
                action = producer_fault(load, fault, slot, rnd.uniform(0.0, 2.0), down, locks, log)
                thread = threading.Thread(target=action, name=f"step-{step}", daemon=True)
                thread.start()
                steps.append(thread)
                log(f"  step {step}/{len(schedule)} {fault}"
                    f"{'' if fault == 'kill-all-producers' else f' on producer {slot}'} started")
                continue
            chaos.apply_fault(fault, cluster, rnd, result, log, work=deliveries)
            log(f"  step {step}/{len(schedule)} {fault} done; {load.summary()} "
                f"delivered {len(deliveries.delivered)}")
        for thread in steps:
            thread.join(FAILPOINT_WAIT + 60)
            if thread.is_alive():
                raise WaitTimeout(f"the producer step {thread.name} did not finish")
        result.violations += settle_and_check(cluster, dsn, group, load, deliveries, log)
        result.summary = {**load.summary(), "delivered": len(deliveries.delivered),
                          "redeliveries": deliveries.deliveries - len(deliveries.delivered),
                          "fences": len([k for k, d in decision_rows(dsn) if d == "rollback"]),
                          "resolver_took_over": cluster.checkers[0].log_text(0).count("resolver answers the group")}
        missed = load.failpoints_missed
        if missed:
            log(f"  fail points not reached within {FAILPOINT_WAIT:.0f} s: {missed}")
        deliveries.stop()
        load.stop()
        result.violations += chaos.compare_replicas(cluster)
    except BaseException as exc:  # noqa: BLE001 - whatever ended the run is reported as its violation
        result.violations.append(f"run failed: {type(exc).__name__}: {exc}"[:2000])
        if cluster is not None:
            for name, text in cluster.logs(40).items():
                log(f"--- {name}\n{text}")
        if load is not None:
            for proc in load.history[-6:]:
                log(f"--- {proc.prefix} (exit {proc.proc.returncode})\n{proc.stderr_tail()}")
    finally:
        for thread in steps:
            thread.join(5)
        if deliveries is not None:
            deliveries.stop()
        if load is not None:
            load.stop()
        if cluster is not None:
            cluster.stop()
        if own_pg:
            pg.stop()
    result.seconds = time.monotonic() - started
    reached = load.failpoints_reached if load is not None else {}
    log(f"chaos_anchored run seed={seed}: {'OK' if not result.violations else 'VIOLATIONS'} in "
        f"{result.seconds:.0f} s; {result.summary}; fail points reached {reached}; "
        f"fail-overs {[round(f, 2) for f in result.failovers]}")
    for v in result.violations[:20]:
        log(f"  VIOLATION {v}")
    return result


def producer_fault(load: AnchoredLoad, fault: str, slot: int, delay: float, down: float,
                   locks: list[threading.Lock], log: Callable[[str], None]) -> Callable[[], None]:
    """The producer step as a thread's target: SIGKILL slot ``slot`` ``delay`` seconds from
    now; ``kill-producer`` restarts it ``down`` seconds later, ``failpoint:<step>`` restarts
    it armed, waits for it to die at the step, then restarts it unarmed;
    ``kill-all-producers`` kills every slot at once and restarts them ``down`` seconds later.
    A slot's steps take its lock, so a death is never counted for the wrong step."""

    def run() -> None:
        time.sleep(delay)
        if fault == "kill-all-producers":
            for lock in locks:
                lock.acquire()
            try:
                for other in range(len(locks)):
                    load.kill(other)
                time.sleep(down)
                for other in range(len(locks)):
                    load.start(other)
            finally:
                for lock in locks:
                    lock.release()
            return
        with locks[slot]:
            load.kill(slot)
            if fault == "kill-producer":
                time.sleep(down)
            else:
                step = fault.split(":", 1)[1]
                if not load.die_at(slot, step, FAILPOINT_WAIT):
                    log(f"    producer {slot} did not reach the fail point {step}")
            load.start(slot)

    return run


def prepare(pg: PostgresInstance) -> str:
    import psycopg

    from txmq.anchored import schema_sql

    dsn = fresh_database(pg, "chaos")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema_sql())
        conn.execute(ORDERS_SQL)
    return dsn


def decision_rows(dsn: str) -> list[tuple[str, str]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT transaction_key, decision FROM txmq_decisions").fetchall()


def committed_orders(dsn: str) -> dict[str, int]:
    """The truth: order id -> how many messages it sent, for every order that committed."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT id, messages FROM orders").fetchall())


def transactions(cluster: Cluster, group: str, state: int, key: str = "") -> list[Any]:
    from txmq.v1 import admin_pb2

    response = cluster.admin_stub().ListTransactions(
        admin_pb2.ListTransactionsRequest(producer_group=group, state=state, limit=1000, key=key), timeout=5)
    return list(response.transactions)


def settle_and_check(cluster: Cluster, dsn: str, group: str, load: AnchoredLoad,
                     deliveries: Workload, log: Callable[[str], None]) -> list[str]:
    """Stops the producers' transactions, lets the checks settle (the producers left and a
    fresh instance of the group answer them from the table) and checks the invariants."""
    import txmq
    from txmq.anchored import Decisions
    from txmq.v1 import common_pb2

    problems: list[str] = []
    prepared, discarded = common_pb2.TRANSACTION_STATE_PREPARED, common_pb2.TRANSACTION_STATE_DISCARDED

    def wait(condition: Callable[[], object], timeout: float, what: Callable[[], str]) -> bool:
        try:
            wait_until(condition, timeout, interval=0.2, message=what, ignore=(txmq.TxmqError, OSError))
            return True
        except WaitTimeout as exc:
            problems.append(str(exc)[:2000])
            return False

    load.stop_producing(60)
    fresh = txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, checker_refresh_seconds=0.5,
                                     decisions=Decisions(dsn, **DECISION_SETTINGS))
    try:
        wait_until(lambda: len(fresh.connected_checkers()) == len(cluster.checkers), 30)
        wait(lambda: not transactions(cluster, group, prepared), 120,
             lambda: f"left PREPARED on the broker: {[t.transaction_id for t in transactions(cluster, group, prepared)][:10]}")
        wait(lambda: all(d == "rollback" for _k, d in decision_rows(dsn)), 60,
             lambda: f"COMMIT rows left in the decisions table: {[r for r in decision_rows(dsn) if r[1] != 'rollback'][:10]}")
        expected = expected_bodies(committed_orders(dsn))
        wait(lambda: expected <= bodies(deliveries), 90,
             lambda: f"{len(expected - bodies(deliveries))} bodies of committed orders not delivered")
        replicas.wait_in_sync(cluster, SHARD, timeout=90)
        time.sleep(1.0)  # late deliveries would show what must not be delivered, or a duplicate
        for t in transactions(cluster, group, discarded):
            problems.append(f"transaction {t.transaction_id} DISCARDED (checks {t.checks_delivered}/"
                            f"{t.checks_answered}, {t.discard_reason!r}): the group answers every check")
    finally:
        fresh.close()
    with deliveries.lock:
        delivered = {b: set(p) for b, p in deliveries.delivered.items()}
    orders = committed_orders(dsn)
    problems += judge(orders, delivered, load.events("committed"), load.events("rolled_back"), load.events("error"),
                      describe=lambda order: describe_order(cluster, group, order))
    expected = expected_bodies(orders)
    log(f"  settled: {len(orders)} orders committed ({len(expected)} messages), {len(delivered)} bodies delivered")
    return problems


def bodies(deliveries: Workload) -> set[str]:
    with deliveries.lock:
        return set(deliveries.delivered)


def expected_bodies(orders: dict[str, int]) -> set[str]:
    return {f"{order}#{i}" for order, n in orders.items() for i in range(n)}


def judge(orders: dict[str, int], delivered: dict[str, set[tuple[str, int, int]]], committed: list[dict[str, Any]],
          rolled_back: list[dict[str, Any]], errors: list[dict[str, Any]],
          describe: Callable[[str], str] = lambda order: "") -> list[str]:
    """The invariants over the history: ``orders`` (the table: order -> its message count),
    ``delivered`` (body -> the (broker, queue, offset) places it was delivered from) and
    the producers' events (tests/support/anchored_load.py). Returns the violations."""
    problems: list[str] = []
    expected = expected_bodies(orders)
    told = {e["committed"] for e in committed}
    raised = {e["rolled_back"] for e in rolled_back}
    failed = {e["error"]: e for e in errors}
    for body in sorted(expected - set(delivered))[:20]:
        order = body.rpartition("#")[0]
        said = "COMMITTED" if order in told else failed.get(order, "nothing")
        problems.append(f"{body}: its order committed but it was never delivered (producer told {said}; "
                        f"broker: {describe(order)})")
    for body, places in sorted(delivered.items()):
        order = body.rpartition("#")[0]
        if body not in expected:
            why = ("rolled back by the block" if order in raised else
                   f"failed: {failed[order]}" if order in failed else "never committed")
            problems.append(f"{body}: delivered but its order is not in the table ({why})")
        if len(places) > 1:
            problems.append(f"{body}: stored twice, delivered from {sorted(places)}")
    for order in sorted(told - set(orders)):
        problems.append(f"{order}: the producer was told COMMITTED but its row is not in the table")
    for order in sorted(raised & set(orders)):
        problems.append(f"{order}: the block raised (rolled back) but its row is in the table")
    for order, e in sorted(failed.items()):
        if e.get("retryable") is not True:
            problems.append(f"{order}: the transaction failed with an error the SDK does not retry: "
                            f"{e['type']}: {e['message']}")
    return problems


def describe_order(cluster: Cluster, group: str, order: str) -> str:
    """The broker's transactions carrying the order's key, with their states."""
    from txmq.v1 import common_pb2

    found = [f"{t.transaction_id} {common_pb2.TransactionState.Name(t.state)} source={t.resolution_source} "
             f"checks={t.checks_delivered}/{t.checks_answered}"
             for s in (common_pb2.TRANSACTION_STATE_PREPARED, common_pb2.TRANSACTION_STATE_DISCARDED,
                       common_pb2.TRANSACTION_STATE_ROLLED_BACK, common_pb2.TRANSACTION_STATE_COMMITTED)
             for t in transactions(cluster, group, s, key=order)]
    return "; ".join(found) or "no transaction with its key"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos_anchored", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="run this seed only (reproduce a failure)")
    parser.add_argument("--faults", type=int, default=4, help="broker faults per run (producer steps come on top)")
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--partitions", action="store_true", help="also cut the leader off (network namespaces)")
    parser.add_argument("--classic", action="store_true", help=f"draw only {', '.join(sorted(set(chaos.FAULTS)))}")
    parser.add_argument("--schedule", default="", help="run this comma-separated schedule instead of drawing one")
    parser.add_argument("--resolver", choices=("drawn", "on", "off"), default="drawn",
                        help="the checker answers the group's checks while no producer is online (default: drawn)")
    args = parser.parse_args(argv)
    if args.producers < 1 or args.consumers < 1:
        parser.error("--producers and --consumers: at least 1")
    schedule = args.schedule.split(",") if args.schedule else None
    if schedule is not None:
        try:
            check_schedule(schedule)
        except ValueError as exc:
            parser.error(f"--schedule: {exc}")
    seeds = chaos.seeds_to_run(parser, args)
    results = []
    base = Path(tempfile.mkdtemp(prefix="txmq-chaos-anchored-"))
    pg = PostgresInstance(max_connections=200)
    try:
        for seed in seeds:
            results.append(run_once(seed, args.faults, base / str(seed), producers=args.producers,
                                    consumers=args.consumers, partitions=args.partitions, more=not args.classic,
                                    schedule=schedule, resolver=None if args.resolver == "drawn" else args.resolver == "on",
                                    pg=pg, log=lambda m: print(m, flush=True)))
    finally:
        pg.stop()
    ok = chaos.report(results)
    if ok:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"logs kept in {base}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
