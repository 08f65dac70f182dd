"""FIFO message groups under random broker kills and CPU load (part of ``make chaos``).

    python -m tests.chaos_fifo [--runs 5] [--seed S] [--model-seeds 100] [--max-attempts 1000] [--burners N]

First the seeded model check of the broker's FIFO delivery state
(``tests/support/fifo_model.py``: random interleavings of sends, receives, stale and
current acks, postponements, expiries, dead letters and restarts) over ``--model-seeds``
seeds, half of them with the held-back window shrunk to 4 entries so that it overflows.

Then ``--runs`` runs of the issue's scenario against real processes (``FifoRun`` of
``tests/integration/test_fifo_scenario.py``: producers sending each group in order,
push consumers failing at random), each drawing from its seed: one or two brokers, the
groups and messages per group, 0-2 CPU burners (busy processes beside the cluster), and
1-3 broker SIGKILLs, each at a drawn share of the messages processed plus a drawn delay
of up to 300 ms (so the kill falls anywhere between a receive's write and its reply, a
send's write and its answer), the broker restarted at once or after a pause past its
registration's expiry (its groups' sends wait for it). Each run checks, per group: no
message processed ahead of an earlier one, never two of a group at once, every message
processed, in order; and that nothing was dead-lettered (``--max-attempts`` is high
enough that no message may run out of attempts: a dead letter frees its group, which then
skips that message by design: ``--max-attempts 2`` shows that at once, the suite's
default of 4, which the scenario ran with when it failed, only under heavy load).

The seed of every run is printed first; ``--seed S`` replays run S's draw (its schedule
and parameters; the threads' interleaving is the machine's). A model failure names its
seed, which ``--seed S --model-seeds 1 --runs 0`` replays exactly (odd seeds run with the
window of 4).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import TEST_BROKER_ENV
from tests.integration.test_fifo_scenario import BROKER_ENV, FifoRun, create_fifo
from tests.support.cluster import Cluster
from tests.support.fifo_model import run_model
from tests.support.waiting import wait_until

#: Name server settings: a killed broker's registration expires within a drawn pause.
NAMESERVER_ENV = {"TXMQ_BROKER_EXPIRY_SECONDS": "2.0"}


@dataclass(frozen=True)
class Draw:
    seed: int
    brokers: int
    groups: int
    per_group: int
    burners: int
    #: (share of the messages processed, extra delay in seconds, broker, pause before restart)
    kills: tuple[tuple[float, float, int, float], ...]


def draw(seed: int) -> Draw:
    rng = random.Random(seed)
    brokers = rng.choice([1, 2])
    kills = sorted((round(rng.uniform(0.05, 0.9), 2), round(rng.uniform(0.0, 0.3), 3), rng.randrange(brokers),
                    rng.choice([0.0, 0.0, 0.5, 3.0])) for _ in range(rng.randint(1, 3)))
    return Draw(seed, brokers, rng.choice([10, 30, 50]), rng.choice([40, 80, 120, 200]), rng.choice([0, 1, 2]),
                tuple(kills))


def run_scenario(d: Draw, max_attempts: int, workdir: Path) -> str:
    """One run of the scenario as drawn; returns its summary, raises on a violation."""
    env = {**TEST_BROKER_ENV, **BROKER_ENV, "TXMQ_MAX_DELIVERY_ATTEMPTS": str(max_attempts)}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(d.burners)]
    cluster = Cluster(workdir, brokers=d.brokers, broker_env=env, nameserver_env=NAMESERVER_ENV)
    try:
        topic = f"chaos-fifo-{d.seed}"
        create_fifo(cluster, topic, 4)
        run = FifoRun(cluster.nameserver_address, topic, groups=d.groups, per_group=d.per_group,
                      seed=d.seed).start()
        total = d.groups * d.per_group
        try:
            for share, delay, broker, pause in d.kills:
                wait_until(lambda: run.processed() >= share * total, 180, message=run.summary)
                time.sleep(delay)
                cluster.kill_broker(broker)
                time.sleep(pause)
                cluster.restart_broker(broker)
            run.wait_complete(300)  # names the dead letters if some message never came
        finally:
            run.stop()
        run.check()  # in order, nothing skipped, nothing dead-lettered
        return run.summary()
    finally:
        cluster.stop()
        for p in burners:
            p.kill()
            p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos_fifo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None, help="run this seed only (replay a failure's draw)")
    parser.add_argument("--model-seeds", type=int, default=100)
    parser.add_argument("--max-attempts", type=int, default=1000)
    parser.add_argument("--burners", type=int, default=None, help="CPU burners in every run instead of the drawn 0-2")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the clients' warnings during kills are expected
    workdir = Path(tempfile.mkdtemp(prefix="txmq-chaos-fifo-"))
    try:
        if args.model_seeds:
            first = random.randrange(2**31) if args.seed is None else args.seed
            print(f"chaos_fifo: model seeds {first}..{first + args.model_seeds - 1}", flush=True)
            started = time.monotonic()
            for seed in range(first, first + args.model_seeds):
                run_model(seed, workdir, window=4 if seed % 2 else None)
                shutil.rmtree(workdir / f"model-{seed}", ignore_errors=True)
            print(f"chaos_fifo: {args.model_seeds} model runs in order, nothing lost, "
                  f"in {time.monotonic() - started:.0f}s", flush=True)
        seeds = [args.seed] if args.seed is not None else [random.randrange(2**31) for _ in range(args.runs)]
        seeds = seeds[:args.runs]  # --runs 0: the model only
        for seed in seeds:
            d = draw(seed)
            if args.burners is not None:
                d = dataclasses.replace(d, burners=args.burners)
            print(f"chaos_fifo: run seed={seed} {d}", flush=True)
            started = time.monotonic()
            summary = run_scenario(d, args.max_attempts, workdir / f"run-{seed}")
            print(f"chaos_fifo: seed {seed} passed in {time.monotonic() - started:.0f}s: {summary}", flush=True)
            shutil.rmtree(workdir / f"run-{seed}", ignore_errors=True)
    except BaseException:
        print(f"chaos_fifo: FAILED; logs in {workdir}", flush=True)
        raise
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when a run fails
    return 0


if __name__ == "__main__":
    sys.exit(main())
