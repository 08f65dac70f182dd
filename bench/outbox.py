"""The user's own job, side by side: change a row in PostgreSQL and publish a message,
atomically and durably, and have a consumer receive it.

    python -m bench.outbox [--seconds 5] [--callers 1,8,64] [--runs 3] [--systems txmq,txmq-asyncio,outbox,rabbitmq]

Every system runs the same job against the same private PostgreSQL (``fsync=on``,
``synchronous_commit=on``; see ``bench/peers.py``), started for the run:

- **txmq** (``txmq``: one process per caller, each with its own ``TransactionProducer``,
  the layout of a multi-process Python service; ``txmq-asyncio``: the callers are
  coroutines of one process sharing one ``txmq.aio.AsyncTransactionProducer``, each with
  its own asyncio PostgreSQL connection; ``txmq-threads``: threads of one process sharing
  one producer): half message → the business row INSERTed and
  committed in PostgreSQL in ``execute_local_transaction``, keyed by the transaction id,
  which ``check_local_transaction`` looks up → EndTransaction; a ``SimpleConsumer``
  process receives and acknowledges. Name server, broker (``flush=sync``) and checker are
  local processes.
- **outbox** (the transactional outbox): one PostgreSQL transaction inserts the business
  row and an outbox row and NOTIFYs; a relay process LISTENs and moves outbox rows to a
  ``consumed`` table in batches (``DELETE … RETURNING`` into ``INSERT``): the consumer.
- **rabbitmq**: the business row committed in PostgreSQL, *then* the message published
  in an AMQP transaction (``tx.select``/``tx.commit``, persistent message, durable queue),
  consumed with acks. Not atomic (a crash between the two loses or strands one): the cost
  floor of a dual write.

Each caller loops for ``--seconds``. A transaction counts once it is consumed; the rate is
transactions consumed ÷ the time from the start until the last of them was consumed. The
latency is the caller's (from before the first call of the job to its return). Each run
checks the counts: committed = business rows = consumed, nothing consumed twice; a
mismatch is printed and makes the exit status 1. CPU per transaction is given per
component (the service's processes, PostgreSQL's server processes, RabbitMQ's, the callers,
the consumer), from the same window. The table prints the median run of each row and the
ratio of its rate to the outbox's at the same number of callers.

This is a benchmark, not a test: absolute numbers on a shared machine are noise, the ratios
measured in the same run are the result. A run where the machine's CPUs were busy all the
time is marked "saturated" (the rate is then what this machine could do, not a system's
limit).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench import machine

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, ref text UNIQUE NOT NULL, body bytea NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (id bigserial PRIMARY KEY, ref text NOT NULL, body bytea NOT NULL);
CREATE TABLE IF NOT EXISTS consumed (id bigserial PRIMARY KEY, ref text NOT NULL, body bytea NOT NULL);
"""
BODY = b"x" * 200
#: The body of a caller's warm-up transaction (not counted).
WARM_UP = b"warm-up"
#: Latencies each caller keeps (a uniform sample beyond it).
MAX_SAMPLES = 20_000
#: How long a run may take to consume what its callers committed.
DRAIN_SECONDS = 60.0


# --- callers (each in a process of its own, spawned) ------------------------------------------

def _loop(job: Any, threads: int, start: Any, stop: Any, out: Any, name: str, exit_: Any) -> None:
    """Runs ``job(thread_index, serial)`` on ``threads`` threads from ``start`` until
    ``stop``; reports (name, committed, errors, latencies, cpu seconds, wall seconds)."""
    committed = [0] * threads
    errors: list[str] = []
    latencies: list[list[float]] = [[] for _ in range(threads)]

    def run(i: int) -> None:
        start.wait()
        n = 0
        while not stop.is_set():
            began = time.perf_counter()
            try:
                if job(i, n):
                    committed[i] += 1
                    lat = latencies[i]
                    if len(lat) < MAX_SAMPLES:
                        lat.append(time.perf_counter() - began)
                else:
                    errors.append("not committed")
            except Exception as exc:  # noqa: BLE001 - counted and reported, the loop goes on
                errors.append(f"{type(exc).__name__}: {exc}")
            n += 1

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    out.put(("ready",))
    start.wait()
    cpu, wall = time.process_time(), time.monotonic()
    for w in workers:
        w.join()
    out.put((name, sum(committed), errors[:5], len(errors), [x for lat in latencies for x in lat],
             time.process_time() - cpu, time.monotonic() - wall))
    exit_.wait(120)


def _warm_up(send: Any) -> None:
    """The first transaction, retried while the services are unreachable: 64 processes
    connecting at once to a machine that is busy can time out (a failed half send runs no
    local transaction, so the warm-up rows stay one per caller)."""
    import txmq

    deadline = time.monotonic() + 60
    while True:
        try:
            send()
            return
        except txmq.TxmqError as err:
            if not err.retryable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def txmq_caller(nameserver: str, dsn: str, topic: str, threads: int, start: Any, stop: Any, out: Any,
                exit_: Any) -> None:
    import psycopg

    import txmq

    local = threading.local()
    # Every thread's connection stays open until the process ends: its backend's CPU is
    # counted after the threads have finished.
    kept: list[Any] = []
    check_conn = psycopg.connect(dsn, autocommit=True)
    check_lock = threading.Lock()

    def conn() -> Any:
        c = getattr(local, "conn", None)
        if c is None:
            c = local.conn = psycopg.connect(dsn)
            kept.append(c)
        return c

    class Orders(txmq.TransactionListener):
        def execute_local_transaction(self, message: Any, arg: Any) -> txmq.LocalTransactionState:
            c = conn()
            with c.transaction():
                c.execute("INSERT INTO orders (ref, body) VALUES (%s, %s)", (message.transaction_id, BODY))
            return txmq.LocalTransactionState.COMMIT

        def check_local_transaction(self, message: Any) -> txmq.LocalTransactionState:
            with check_lock:
                found = check_conn.execute("SELECT 1 FROM orders WHERE ref = %s",
                                           (message.transaction_id,)).fetchone()
            return txmq.LocalTransactionState.COMMIT if found else txmq.LocalTransactionState.ROLLBACK

    producer = txmq.TransactionProducer(nameserver, producer_group="bench-outbox", listener=Orders())
    _warm_up(lambda: producer.send_in_transaction(txmq.Message(topic, WARM_UP)))  # routes, connections

    def job(i: int, n: int) -> bool:
        result = producer.send_in_transaction(txmq.Message(topic, BODY))
        return result.state is txmq.TransactionState.COMMITTED

    try:
        _loop(job, threads, start, stop, out, "caller", exit_)
    finally:
        producer.close()


def txmq_async_caller(nameserver: str, dsn: str, topic: str, callers: int, start: Any, stop: Any, out: Any,
                      exit_: Any) -> None:
    """``callers`` coroutines of one process sharing one ``AsyncTransactionProducer``, each
    with its own asyncio PostgreSQL connection (the layout of an asyncio service)."""
    import asyncio

    import psycopg

    import txmq
    from txmq.aio import AsyncTransactionListener, AsyncTransactionProducer

    async def main() -> None:
        conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(callers)]
        check_conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        check_lock = asyncio.Lock()

        class Orders(AsyncTransactionListener):
            async def execute_local_transaction(self, message: Any, conn: Any) -> txmq.LocalTransactionState:
                async with conn.transaction():
                    await conn.execute("INSERT INTO orders (ref, body) VALUES (%s, %s)",
                                       (message.transaction_id, BODY))
                return txmq.LocalTransactionState.COMMIT

            async def check_local_transaction(self, message: Any) -> txmq.LocalTransactionState:
                async with check_lock:
                    cursor = await check_conn.execute("SELECT 1 FROM orders WHERE ref = %s",
                                                      (message.transaction_id,))
                    found = await cursor.fetchone()
                return txmq.LocalTransactionState.COMMIT if found else txmq.LocalTransactionState.ROLLBACK

        committed, errors = [0] * callers, []
        latencies: list[list[float]] = [[] for _ in range(callers)]
        stopped = False

        async def run(i: int) -> None:
            while not stopped:
                began = time.perf_counter()
                try:
                    result = await producer.send_in_transaction(txmq.Message(topic, BODY), conns[i])
                    if result.state is txmq.TransactionState.COMMITTED:
                        committed[i] += 1
                        if len(latencies[i]) < MAX_SAMPLES:
                            latencies[i].append(time.perf_counter() - began)
                    else:
                        errors.append("not committed")
                except Exception as exc:  # noqa: BLE001 - counted and reported, the loop goes on
                    errors.append(f"{type(exc).__name__}: {exc}")

        async with AsyncTransactionProducer(nameserver, producer_group="bench-outbox", listener=Orders()) as producer:
            await producer.send_in_transaction(txmq.Message(topic, WARM_UP), conns[0])
            out.put(("ready",))
            await asyncio.to_thread(start.wait)
            cpu, wall = time.process_time(), time.monotonic()
            tasks = [asyncio.ensure_future(run(i)) for i in range(callers)]
            await asyncio.to_thread(stop.wait)
            stopped = True
            await asyncio.gather(*tasks)
            out.put(("caller", sum(committed), errors[:5], len(errors), [x for lat in latencies for x in lat],
                     time.process_time() - cpu, time.monotonic() - wall))
            await asyncio.to_thread(exit_.wait, 120)

    asyncio.run(main())


def outbox_caller(dsn: str, threads: int, start: Any, stop: Any, out: Any, exit_: Any) -> None:
    import psycopg

    pid = os.getpid()
    conns = [psycopg.connect(dsn) for _ in range(threads)]

    def job(i: int, n: int) -> bool:
        c = conns[i]
        ref = f"{pid}-{i}-{n}"
        with c.transaction():
            c.execute("INSERT INTO orders (ref, body) VALUES (%s, %s)", (ref, BODY))
            c.execute("INSERT INTO outbox (ref, body) VALUES (%s, %s)", (ref, BODY))
            c.execute("NOTIFY outbox")
        return True

    _loop(job, threads, start, stop, out, "caller", exit_)


def rabbit_caller(dsn: str, amqp_port: int, threads: int, start: Any, stop: Any, out: Any, exit_: Any) -> None:
    import pika
    import psycopg

    pid = os.getpid()
    conns = [psycopg.connect(dsn) for _ in range(threads)]
    channels = []
    for _ in range(threads):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=0))
        channel = connection.channel()
        channel.tx_select()
        channels.append(channel)
    persistent = pika.BasicProperties(delivery_mode=2)

    def job(i: int, n: int) -> bool:
        c = conns[i]
        ref = f"{pid}-{i}-{n}"
        with c.transaction():
            c.execute("INSERT INTO orders (ref, body) VALUES (%s, %s)", (ref, BODY))
        channels[i].basic_publish("", "orders", ref.encode() + b"|" + BODY, persistent)
        channels[i].tx_commit()
        return True

    _loop(job, threads, start, stop, out, "caller", exit_)


# --- consumers -------------------------------------------------------------------------------

def _consume(poll: Any, start: Any, done: Any, out: Any, exit_: Any) -> None:
    """Calls ``poll()`` (→ the refs it consumed) from ``start`` until ``done`` is set and a
    poll comes back empty; reports (consumed, duplicates, cpu seconds, seconds from start to
    the last consumed)."""
    seen: set[str] = set()
    duplicates = 0
    out.put(("ready",))
    start.wait()
    cpu, began = time.process_time(), time.monotonic()
    last = began
    while True:
        refs = poll()
        if refs:
            last = time.monotonic()
            for ref in refs:
                if ref in seen:
                    duplicates += 1
                seen.add(ref)
        elif done.is_set():
            break
    out.put(("consumer", len(seen), duplicates, time.process_time() - cpu, last - began))
    exit_.wait(120)


def txmq_consumer(nameserver: str, topic: str, group: str, start: Any, done: Any, out: Any, exit_: Any,
                  acks: str = "deferred") -> None:
    import txmq

    from bench.transactions import acknowledge

    with txmq.SimpleConsumer(nameserver, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.2) as consumer:
        _warm_up(lambda: consumer.receive(max_messages=1, invisible_duration_seconds=1))  # creates the group

        def poll() -> list[str]:
            batch = consumer.receive(max_messages=256, invisible_duration_seconds=60)
            if batch:
                acknowledge(consumer, batch, acks)
            return [m.message_id for m in batch if m.body == BODY]

        _consume(poll, start, done, out, exit_)


def outbox_relay(dsn: str, start: Any, done: Any, out: Any, exit_: Any) -> None:
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("LISTEN outbox")
    move = ("WITH moved AS (DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 1000 "
            "FOR UPDATE SKIP LOCKED) RETURNING ref, body) "
            "INSERT INTO consumed (ref, body) SELECT ref, body FROM moved RETURNING ref")

    def poll() -> list[str]:
        refs = [r for (r,) in conn.execute(move).fetchall()]
        if not refs:
            for _ in conn.notifies(timeout=0.2, stop_after=1):
                pass
        return refs

    _consume(poll, start, done, out, exit_)


def rabbit_consumer(amqp_port: int, start: Any, done: Any, out: Any, exit_: Any) -> None:
    import pika

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=0))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=512)

    def poll() -> list[str]:
        refs = []
        tag = None
        for method, _props, body in channel.consume("orders", inactivity_timeout=0.2):
            if method is None:
                break
            refs.append(body.split(b"|", 1)[0].decode())
            tag = method.delivery_tag
            if len(refs) >= 256:
                break
        if tag is not None:
            channel.basic_ack(tag, multiple=True)
        return refs

    _consume(poll, start, done, out, exit_)


# --- orchestration ---------------------------------------------------------------------------

@dataclass
class Run:
    system: str
    callers: int
    committed: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    consumed: int = 0
    duplicates: int = 0
    rows: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    busy: float = 0.0
    #: txmq: ReceiveMessages + AckMessages the broker answered over the run.
    consumer_calls: float = 0.0

    @property
    def rate(self) -> float:
        return self.consumed / self.seconds if self.seconds > 0 else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

    @property
    def ok(self) -> bool:
        return self.committed == self.rows == self.consumed and self.duplicates == 0

    @property
    def saturated(self) -> bool:
        return self.busy >= 0.95

    def summary(self) -> dict[str, Any]:
        return {"system": self.system, "callers": self.callers, "txn_per_s": round(self.rate, 1),
                "p50_ms": round(self.pct(0.5), 3), "p99_ms": round(self.pct(0.99), 3),
                "committed": self.committed, "business_rows": self.rows, "consumed": self.consumed,
                "duplicates": self.duplicates, "errors": self.errors, "seconds": round(self.seconds, 3),
                "cpu_us_per_txn": {k: round(v / max(self.consumed, 1) * 1e6, 1) for k, v in self.cpu.items()},
                "cpu_busy": round(self.busy, 3), "saturated": self.saturated, "ok": self.ok,
                "consumer_calls_per_txn": round(self.consumer_calls / max(self.consumed, 1), 3)}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pg: Any = None
        self.rabbit: Any = None
        self.cluster: Any = None
        self.phase = 0

    def __enter__(self) -> "Bench":
        import psycopg

        from bench.peers import PostgresInstance, RabbitInstance

        systems = self.args.systems
        self.pg = PostgresInstance(max_connections=max(self.args.callers) * 4 + 50)
        with psycopg.connect(self.pg.dsn, autocommit=True) as c:
            c.execute(SCHEMA)
        if "rabbitmq" in systems:
            self.rabbit = RabbitInstance()
        if any(s.startswith("txmq") for s in systems):
            from tests.support.cluster import Cluster

            self.cluster = Cluster(tempfile.mkdtemp(prefix="txmq-bench-outbox-"), brokers=1, checker=True,
                                   broker_env={"TXMQ_FLUSH": "sync"})
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.rabbit is not None:
            self.rabbit.stop()
        if self.pg is not None:
            self.pg.stop()

    def _service_processes(self, system: str) -> dict[str, list[Any]]:
        import psutil

        groups: dict[str, list[Any]] = {"postgresql": self.pg.processes()}
        if system.startswith("txmq"):
            groups["txmq"] = [psutil.Process(p.pid) for p in self.cluster.processes if p.running]
        if system == "rabbitmq":
            groups["rabbitmq"] = self.rabbit.processes()
        return groups

    def _reset(self, system: str) -> None:
        import psycopg

        with psycopg.connect(self.pg.dsn, autocommit=True) as c:
            c.execute("TRUNCATE orders, outbox, consumed")
            c.execute("VACUUM ANALYZE")
        if system == "rabbitmq":
            import pika

            conn = pika.BlockingConnection(self.rabbit.parameters())
            ch = conn.channel()
            ch.queue_delete("orders")
            ch.queue_declare("orders", durable=True)
            conn.close()

    def _consumer_calls(self) -> float:
        from bench.transactions import consumer_calls

        return consumer_calls(self.cluster.brokers[0].metrics_port) if self.cluster is not None else 0.0

    def run(self, system: str, callers: int) -> Run:
        """One timed run of ``system`` with ``callers`` concurrent callers."""
        import psutil
        import psycopg

        from bench.peers import cpu_between, cpu_snapshot

        self.phase += 1
        # A txmq system may name how its consumer acknowledges: "txmq/calls", "txmq-asyncio/deferred".
        system, _, acks = system.partition("/")
        acks = acks or self.args.txmq_acks[0]
        self._reset(system)
        ctx = mp.get_context("spawn")
        start, stop, done, exit_ = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
        out = ctx.Queue()
        procs = []
        dsn, seconds = self.pg.dsn, self.args.seconds
        if system.startswith("txmq"):
            topic, group = f"bench-outbox-{self.phase}", f"bench-outbox-{self.phase}"
            self.cluster.create_topic(topic, 8)
            ns = self.cluster.nameserver_address
            procs.append(ctx.Process(target=txmq_consumer, args=(ns, topic, group, start, done, out, exit_, acks)))
            if system == "txmq-threads":
                procs.append(ctx.Process(target=txmq_caller, args=(ns, dsn, topic, callers, start, stop, out, exit_)))
            elif system == "txmq-asyncio":
                procs.append(ctx.Process(target=txmq_async_caller,
                                         args=(ns, dsn, topic, callers, start, stop, out, exit_)))
            else:
                procs += [ctx.Process(target=txmq_caller, args=(ns, dsn, topic, 1, start, stop, out, exit_))
                          for _ in range(callers)]
        elif system == "outbox":
            procs.append(ctx.Process(target=outbox_relay, args=(dsn, start, done, out, exit_)))
            procs += [ctx.Process(target=outbox_caller, args=(dsn, 1, start, stop, out, exit_))
                      for _ in range(callers)]
        elif system == "rabbitmq":
            port = self.rabbit.port
            procs.append(ctx.Process(target=rabbit_consumer, args=(port, start, done, out, exit_)))
            procs += [ctx.Process(target=rabbit_caller, args=(dsn, port, 1, start, stop, out, exit_))
                      for _ in range(callers)]
        else:
            raise SystemExit(f"unknown system {system!r}")
        for p in procs:
            p.start()
        result = Run(system if acks == self.args.txmq_acks[0] or not system.startswith("txmq")
                     else f"{system}/{acks}", callers)
        calls = self._consumer_calls()
        try:
            for _ in procs:  # each process connects and warms up, then waits for the start
                if out.get(timeout=120)[0] != "ready":
                    raise RuntimeError("a benchmark process reported before the start")
            services = self._service_processes(system)
            before = {name: cpu_snapshot(ps) for name, ps in services.items()}
            psutil.cpu_percent(None)
            start.set()
            time.sleep(seconds)
            stop.set()
            reports = [out.get(timeout=DRAIN_SECONDS) for _ in range(len(procs) - 1)]
            done.set()
            consumer = out.get(timeout=DRAIN_SECONDS)
            result.busy = psutil.cpu_percent(None) / 100
            after = {name: cpu_snapshot(ps) for name, ps in self._service_processes(system).items()}
            for name in before:
                result.cpu[name] = cpu_between(before[name], after[name])
            result.cpu["callers"] = sum(r[5] for r in reports)
            result.cpu["consumer"] = consumer[3]
            result.consumer_calls = self._consumer_calls() - calls
            result.committed = sum(r[1] for r in reports)
            result.errors = sum(r[3] for r in reports)
            result.error_samples = [e for r in reports for e in r[2]][:5]
            result.latencies = [x for r in reports for x in r[4]]
            _name, result.consumed, result.duplicates, _cpu, result.seconds = consumer
            with psycopg.connect(dsn, autocommit=True) as c:
                # The warm-up transactions of txmq's callers are rows too, consumed before the start.
                result.rows = c.execute("SELECT count(*) FROM orders").fetchone()[0]
                if system.startswith("txmq"):
                    result.rows -= len(procs) - 1
        finally:
            exit_.set()
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.outbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="each run's length")
    parser.add_argument("--callers", default="1,8,64", help="concurrent callers, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs of each row (the median is printed)")
    parser.add_argument("--systems", default="txmq,txmq-asyncio,outbox,rabbitmq",
                        help="of txmq, txmq-asyncio, txmq-threads, outbox, rabbitmq")
    parser.add_argument("--txmq-acks", default="deferred",
                        help="how txmq's consumer acknowledges: deferred (ack_later, on its next receive) or calls "
                             "(ack_many); both, comma-separated, runs each txmq row both ways (the first unlabelled)")
    parser.add_argument("--json", default="", help="also write every run here")
    args = parser.parse_args(argv)
    args.callers = [int(x) for x in args.callers.split(",") if x]
    args.txmq_acks = [x for x in args.txmq_acks.split(",") if x]
    if not args.txmq_acks or any(m not in ("deferred", "calls") for m in args.txmq_acks):
        parser.error("--txmq-acks: comma-separated of deferred, calls")
    args.systems = [variant for x in args.systems.split(",") if x
                    for variant in ([x] + [f"{x}/{m}" for m in args.txmq_acks[1:]] if x.startswith("txmq") else [x])]

    rows: dict[tuple[str, int], Run] = {}
    every: list[dict[str, Any]] = []
    failed = False
    with Bench(args) as bench:
        for callers in args.callers:
            for system in args.systems:
                runs = []
                for i in range(args.runs):
                    try:
                        r = bench.run(system, callers)
                    except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others
                        failed = True
                        print(f"RUN FAILED: {system} × {callers} run {i + 1}: {exc!r}", file=sys.stderr)
                        continue
                    every.append(r.summary())
                    runs.append(r)
                    if not r.ok:
                        failed = True
                        print(f"COUNTS DIFFER: {system} × {callers} run {i + 1}: committed {r.committed}, "
                              f"business rows {r.rows}, consumed {r.consumed}, duplicates {r.duplicates}; "
                              f"errors {r.errors} {r.error_samples}", file=sys.stderr)
                    print(f"  {system:>13} × {callers:<3} run {i + 1}: {r.rate:8.1f} txn/s, p50 "
                          f"{r.pct(0.5):6.2f} ms{' (saturated)' if r.saturated else ''}", file=sys.stderr)
                if runs:
                    rows[(system, callers)] = sorted(runs, key=lambda r: r.rate)[len(runs) // 2]
    _print(rows, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every, f, indent=1)
    return 1 if failed else 0


def _print(rows: dict[tuple[str, int], Run], args: argparse.Namespace) -> None:
    print(f"\nThe user's job: a PostgreSQL row and a message, atomically, consumed (median of {args.runs} "
          f"run(s) of {args.seconds:g} s; CPU in µs per transaction; {machine.describe()})")
    head = (f"{'callers':>7} {'system':>18} {'txn/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'÷ outbox':>8} "
            f"{'service':>8} {'postgres':>8} {'callers':>8} {'consumer':>8} {'calls':>5}  checks")
    print(head)
    for (system, callers), r in rows.items():
        outbox = rows.get(("outbox", callers))
        ratio = f"{r.rate / outbox.rate:8.2f}" if outbox and outbox.rate else f"{'—':>8}"
        per = {k: v / max(r.consumed, 1) * 1e6 for k, v in r.cpu.items()}
        service = per.get("txmq", per.get("rabbitmq", 0.0))
        check = "ok" if r.ok else "COUNTS DIFFER"
        if r.errors:
            check += f", {r.errors} errors"
        if r.saturated:
            check += ", saturated"
        print(f"{callers:>7} {system:>18} {r.rate:>9.1f} {r.pct(0.5):>7.2f} {r.pct(0.99):>7.2f} {ratio} "
              f"{service:>8.0f} {per.get('postgresql', 0):>8.0f} {per.get('callers', 0):>8.0f} "
              f"{per.get('consumer', 0):>8.0f} {r.consumer_calls / max(r.consumed, 1) if system.startswith('txmq') else 0:>5.2f}"
              f"  {check}")
    print("service: txmq's name server + broker + checker, or RabbitMQ's node; outbox has none "
          "(its relay is the consumer). calls: txmq's consumer calls (ReceiveMessages + AckMessages) per "
          f"transaction; its acks: {args.txmq_acks[0]} unless the system says /calls or /deferred. "
          "committed = business rows = consumed is checked per run.")


if __name__ == "__main__":
    sys.exit(main())
