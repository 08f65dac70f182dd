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

Under issue 29's one-caller targets it also prints what Python's gRPC alone costs there
(``bench/grpc_floor.py``, measured once per run): the broker's requests of a transaction and
the caller's Produce messages at that price, and the rest as their own work.

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
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench import grpc_floor, machine
from bench.grpc_floor import Floor

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, ref text UNIQUE NOT NULL, body bytea NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (id bigserial PRIMARY KEY, ref text NOT NULL, body bytea NOT NULL);
CREATE TABLE IF NOT EXISTS consumed (id bigserial PRIMARY KEY, ref text NOT NULL, body bytea NOT NULL);
"""
#: CPU groups counted inside "txmq" (its services), shown apart too.
SERVICE_PARTS = ("broker", "checker", "nameserver")
#: The systems that run on txmq (its services are started for them).
TXMQ_SYSTEMS = ("txmq", "anchored")
#: The business payload (the message body and the outbox row carry it; a decision row does
#: not): ``--body-bytes`` sets it in every benchmark process through the environment.
#: Incompressible (PostgreSQL would compress a repeated byte in a 16 KiB row to almost nothing),
#: and the same in every process (seeded).
BODY = random.Random(29).randbytes(int(os.environ.get("BENCH_OUTBOX_BODY_BYTES", "256"))).replace(b"|", b"-")
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
    # (ref, wall-clock time its job returned): the commit, for commit-to-consumer latency.
    commits: list[list[tuple[str, float]]] = [[] for _ in range(threads)]

    def run(i: int) -> None:
        start.wait()
        n = 0
        while not stop.is_set():
            began = time.perf_counter()
            try:
                done = job(i, n)
                if done:
                    committed[i] += 1
                    lat = latencies[i]
                    if len(lat) < MAX_SAMPLES:
                        lat.append(time.perf_counter() - began)
                        if isinstance(done, str):
                            commits[i].append((done, time.time()))
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
             time.process_time() - cpu, time.monotonic() - wall, [c for cs in commits for c in cs]))
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
                     time.process_time() - cpu, time.monotonic() - wall, []))
            await asyncio.to_thread(exit_.wait, 120)

    asyncio.run(main())


def anchored_caller(nameserver: str, dsn: str, topic: str, threads: int, start: Any, stop: Any, out: Any,
                    exit_: Any) -> None:
    """An anchored transaction per job (``producer.transaction(conn)``, docs/anchored-transactions.md):
    the business row and the decision row in one PostgreSQL transaction, the half message
    sent while the row is inserted, EndTransaction off the caller's path; checks answered
    from the decisions table."""
    import psycopg

    import txmq
    from txmq.anchored import Decisions

    pid = os.getpid()
    conns = [psycopg.connect(dsn) for _ in range(threads)]
    producer = txmq.TransactionProducer(nameserver, producer_group="bench-anchored", decisions=Decisions(dsn))

    def warm() -> None:
        with producer.transaction(conns[0]) as tx:
            tx.send(txmq.Message(topic, WARM_UP))
            conns[0].execute("INSERT INTO orders (ref, body) VALUES (%s, %s)", (f"warm-{pid}", WARM_UP))

    _warm_up(warm)

    def job(i: int, n: int) -> str:
        c = conns[i]
        ref = f"{pid}-{i}-{n}"
        with producer.transaction(c) as tx:
            tx.send(txmq.Message(topic, ref.encode() + b"|" + BODY))
            c.execute("INSERT INTO orders (ref, body) VALUES (%s, %s)", (ref, BODY))
        return ref

    try:
        _loop(job, threads, start, stop, out, "caller", exit_)
    finally:
        producer.close()


def anchored_async_caller(nameserver: str, dsn: str, topic: str, callers: int, start: Any, stop: Any, out: Any,
                          exit_: Any) -> None:
    """``callers`` coroutines of one process sharing one ``AsyncTransactionProducer`` with
    ``decisions=``, each with its own ``psycopg.AsyncConnection``."""
    import asyncio

    import psycopg

    import txmq
    from txmq.aio import AsyncTransactionProducer
    from txmq.anchored import Decisions

    async def main() -> None:
        pid = os.getpid()
        conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(callers)]
        committed, errors = [0] * callers, []
        latencies: list[list[float]] = [[] for _ in range(callers)]
        commits: list[list[tuple[str, float]]] = [[] for _ in range(callers)]
        stopped = False

        async def run(producer: Any, i: int) -> None:
            c = conns[i]
            n = 0
            while not stopped:
                began = time.perf_counter()
                ref = f"{pid}-{i}-{n}"
                n += 1
                try:
                    async with producer.transaction(c) as tx:
                        tx.send(txmq.Message(topic, ref.encode() + b"|" + BODY))
                        await c.execute("INSERT INTO orders (ref, body) VALUES (%s, %s)", (ref, BODY))
                    committed[i] += 1
                    if len(latencies[i]) < MAX_SAMPLES:
                        latencies[i].append(time.perf_counter() - began)
                        commits[i].append((ref, time.time()))
                except Exception as exc:  # noqa: BLE001 - counted and reported, the loop goes on
                    errors.append(f"{type(exc).__name__}: {exc}")

        async with AsyncTransactionProducer(nameserver, producer_group="bench-anchored",
                                            decisions=Decisions(dsn)) as producer:
            async with producer.transaction(conns[0]) as tx:
                tx.send(txmq.Message(topic, WARM_UP))
                await conns[0].execute("INSERT INTO orders (ref, body) VALUES (%s, %s)", (f"warm-{pid}", WARM_UP))
            out.put(("ready",))
            await asyncio.to_thread(start.wait)
            cpu, wall = time.process_time(), time.monotonic()
            tasks = [asyncio.ensure_future(run(producer, i)) for i in range(callers)]
            await asyncio.to_thread(stop.wait)
            stopped = True
            await asyncio.gather(*tasks)
            out.put(("caller", sum(committed), errors[:5], len(errors), [x for lat in latencies for x in lat],
                     time.process_time() - cpu, time.monotonic() - wall, [c for cs in commits for c in cs]))
            await asyncio.to_thread(exit_.wait, 120)

    asyncio.run(main())


def outbox_async_caller(dsn: str, callers: int, start: Any, stop: Any, out: Any, exit_: Any) -> None:
    """The outbox's transaction from ``callers`` coroutines of one process, each with its own
    ``psycopg.AsyncConnection`` (the layout of an asyncio service)."""
    import asyncio

    import psycopg

    async def main() -> None:
        pid = os.getpid()
        conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(callers)]
        committed, errors = [0] * callers, []
        latencies: list[list[float]] = [[] for _ in range(callers)]
        commits: list[list[tuple[str, float]]] = [[] for _ in range(callers)]
        stopped = False

        async def run(i: int) -> None:
            c = conns[i]
            n = 0
            while not stopped:
                began = time.perf_counter()
                ref = f"{pid}-{i}-{n}"
                n += 1
                try:
                    async with c.transaction():
                        await c.execute("INSERT INTO orders (ref, body) VALUES (%s, %s)", (ref, BODY))
                        await c.execute("INSERT INTO outbox (ref, body) VALUES (%s, %s)", (ref, BODY))
                        await c.execute("NOTIFY outbox")
                    committed[i] += 1
                    if len(latencies[i]) < MAX_SAMPLES:
                        latencies[i].append(time.perf_counter() - began)
                        commits[i].append((ref, time.time()))
                except Exception as exc:  # noqa: BLE001 - counted and reported, the loop goes on
                    errors.append(f"{type(exc).__name__}: {exc}")

        out.put(("ready",))
        await asyncio.to_thread(start.wait)
        cpu, wall = time.process_time(), time.monotonic()
        tasks = [asyncio.ensure_future(run(i)) for i in range(callers)]
        await asyncio.to_thread(stop.wait)
        stopped = True
        await asyncio.gather(*tasks)
        out.put(("caller", sum(committed), errors[:5], len(errors), [x for lat in latencies for x in lat],
                 time.process_time() - cpu, time.monotonic() - wall, [c for cs in commits for c in cs]))
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
        return ref

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
    seen: dict[str, float] = {}  # ref → wall-clock time first consumed
    duplicates = 0
    out.put(("ready",))
    start.wait()
    cpu, began = time.process_time(), time.monotonic()
    last = began
    while True:
        # Read before the poll: an empty poll begun before the last commit says nothing.
        finishing = done.is_set()
        refs = poll()
        if refs:
            last = time.monotonic()
            now = time.time()
            for ref in refs:
                if ref in seen:
                    duplicates += 1
                else:
                    seen[ref] = now
        elif finishing:
            break
    out.put(("consumer", len(seen), duplicates, time.process_time() - cpu, last - began, seen))
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
            # Anchored transactions carry their order's ref: "ref|BODY".
            return [m.message_id if m.body == BODY else m.body[:-len(BODY) - 1].decode()
                    for m in batch if m.body == BODY or m.body.endswith(b"|" + BODY)]

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
    #: Commit (the caller's job returned) → first consumed, seconds, for the sampled jobs.
    delivery: list[float] = field(default_factory=list)
    #: WAL PostgreSQL wrote over the run (pg_stat_wal.wal_bytes), and the body size.
    wal_bytes: float = 0.0
    body_bytes: int = 0
    #: txmq: what the broker counted over the run (``broker_counts``), per name.
    broker: dict[str, float] = field(default_factory=dict)

    def delivery_pct(self, q: float) -> float:
        if not self.delivery:
            return 0.0
        xs = sorted(self.delivery)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

    def per_txn_us(self, component: str) -> float:
        return self.cpu.get(component, 0.0) / max(self.consumed, 1) * 1e6

    @property
    def cpu_per_txn_us(self) -> float:
        """Every process's CPU per transaction (the broker counted once, inside txmq)."""
        return sum(v for k, v in self.cpu.items() if k not in SERVICE_PARTS) / max(self.consumed, 1) * 1e6

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
                "consumer_calls_per_txn": round(self.consumer_calls / max(self.consumed, 1), 3),
                "delivery_p50_ms": round(self.delivery_pct(0.5), 3), "delivery_p99_ms": round(self.delivery_pct(0.99), 3),
                "wal_bytes_per_txn": round(self.wal_bytes / max(self.consumed, 1), 1), "body_bytes": self.body_bytes,
                "broker_per_txn": {k: round(v / max(self.consumed, 1), 3) for k, v in self.broker.items()}}


def broker_counts(metrics_port: int) -> dict[str, float]:
    """What a broker has counted so far: unary calls answered by method, Produce stream
    messages in and out, WAL syncs (its /metrics)."""
    import re
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("txmq_rpc_duration_seconds_count{"):
            method = re.search(r'method="([^"]+)"', name)
            if method and method.group(1) != "Produce":
                counts[method.group(1)] = counts.get(method.group(1), 0.0) + float(value)
        elif name.startswith("txmq_produce_stream_messages_total{"):
            counts["Produce " + re.search(r'direction="([^"]+)"', name).group(1)] = float(value)
        elif name == "txmq_store_wal_syncs_total":
            counts["WAL syncs"] = float(value)
    return counts


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pg: Any = None
        self.rabbit: Any = None
        self.cluster: Any = None
        self.phase = 0

    def __enter__(self) -> "Bench":
        try:
            return self._start()
        except BaseException:
            self.__exit__()  # what started is stopped (a PostgreSQL left running otherwise)
            raise

    def _start(self) -> "Bench":
        import psycopg

        from bench.peers import PostgresInstance, RabbitInstance

        systems = self.args.systems
        self.pg = PostgresInstance(max_connections=max(self.args.callers) * 4 + 50)
        from txmq.anchored import schema_sql

        with psycopg.connect(self.pg.dsn, autocommit=True) as c:
            c.execute(SCHEMA)
            c.execute(schema_sql())
        if "rabbitmq" in systems:
            self.rabbit = RabbitInstance()
        if any(s.startswith(TXMQ_SYSTEMS) for s in systems):
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
        if system.startswith(TXMQ_SYSTEMS):
            groups["txmq"] = [psutil.Process(p.pid) for p in self.cluster.processes if p.running]
            groups["broker"] = [psutil.Process(b.pid) for b in self.cluster.brokers if b.running]
            groups["checker"] = [psutil.Process(c.pid) for c in self.cluster.checkers if c.running]
            groups["nameserver"] = [psutil.Process(n.pid) for n in self.cluster.nameservers if n.running]
        if system == "rabbitmq":
            groups["rabbitmq"] = self.rabbit.processes()
        return groups

    def _reset(self, system: str) -> None:
        import psycopg

        with psycopg.connect(self.pg.dsn, autocommit=True) as c:
            c.execute("TRUNCATE orders, outbox, consumed, txmq_decisions")
            c.execute("VACUUM ANALYZE")
        if system == "rabbitmq":
            import pika

            conn = pika.BlockingConnection(self.rabbit.parameters())
            ch = conn.channel()
            ch.queue_delete("orders")
            ch.queue_declare("orders", durable=True)
            conn.close()

    def wal_bytes(self) -> float:
        import psycopg

        with psycopg.connect(self.pg.dsn, autocommit=True) as c:
            return float(c.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()[0])

    def broker_round_trip_ms(self, sends: int = 200) -> float:
        """p50 of a durable empty send (flush=sync) on this run's broker, one at a time: the
        floor an anchored transaction adds at one caller (its half must be durable before
        the local COMMIT)."""
        import txmq

        topic = "bench-outbox-rtt"
        if not getattr(self, "_rtt_topic", False):
            self.cluster.create_topic(topic, 1)
            self._rtt_topic = True
        times = []
        with txmq.Producer(self.cluster.nameserver_address) as producer:
            _warm_up(lambda: producer.send(txmq.Message(topic, b"")))
            for _ in range(sends):
                began = time.perf_counter()
                producer.send(txmq.Message(topic, b""))
                times.append(time.perf_counter() - began)
        return sorted(times)[len(times) // 2] * 1000

    def _broker_counts(self) -> dict[str, float]:
        return broker_counts(self.cluster.brokers[0].metrics_port) if self.cluster is not None else {}

    def _consumer_calls(self) -> float:
        from bench.transactions import consumer_calls

        return consumer_calls(self.cluster.brokers[0].metrics_port) if self.cluster is not None else 0.0

    def _profile(self, system: str, callers: int, body_bytes: int, procs: list[Any]) -> list[Any]:
        """``py-spy record`` of every txmq service and benchmark process over the timed
        window (``--profile DIR``): one collapsed-stack file per process, named after the
        row and the process, for ``python -m bench.profile``."""
        import subprocess

        os.makedirs(self.args.profile, exist_ok=True)
        named = [(f"caller{i}" if i else "consumer", p.pid) for i, p in enumerate(procs)]
        if system.startswith(TXMQ_SYSTEMS):
            named += [(p.name, p.pid) for p in self.cluster.processes if p.running]
        spies = []
        for name, pid in named:
            out = os.path.join(self.args.profile, f"{system.replace('/', '-')}-{callers}-{body_bytes}-{name}.txt")
            spies.append(subprocess.Popen(
                [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--format", "raw",
                 "--rate", str(self.args.profile_rate),
                 # --native must stop the process to read its C stacks; else sampling does not.
                 *([] if "--native" in self.args.profile_flags else ["--nonblocking"]),
                 "--duration", str(max(1, int(self.args.seconds))), "--pid", str(pid), "--output", out,
                 *self.args.profile_flags.split()],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return spies

    def run(self, system: str, callers: int, body_bytes: int = 256) -> Run:
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
        os.environ["BENCH_OUTBOX_BODY_BYTES"] = str(body_bytes)  # the spawned processes' BODY
        if system.startswith(TXMQ_SYSTEMS):
            topic, group = f"bench-outbox-{self.phase}", f"bench-outbox-{self.phase}"
            self.cluster.create_topic(topic, 8)
            ns = self.cluster.nameserver_address
            procs.append(ctx.Process(target=txmq_consumer, args=(ns, topic, group, start, done, out, exit_, acks)))
            if system == "anchored":
                procs += [ctx.Process(target=anchored_caller, args=(ns, dsn, topic, 1, start, stop, out, exit_))
                          for _ in range(callers)]
            elif system == "anchored-asyncio":
                procs.append(ctx.Process(target=anchored_async_caller,
                                         args=(ns, dsn, topic, callers, start, stop, out, exit_)))
            elif system == "txmq-threads":
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
        elif system == "outbox-asyncio":
            procs.append(ctx.Process(target=outbox_relay, args=(dsn, start, done, out, exit_)))
            procs.append(ctx.Process(target=outbox_async_caller, args=(dsn, callers, start, stop, out, exit_)))
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
                     else f"{system}/{acks}", callers, body_bytes=body_bytes)
        calls = self._consumer_calls()
        counts = self._broker_counts()
        try:
            for _ in procs:  # each process connects and warms up, then waits for the start
                if out.get(timeout=120)[0] != "ready":
                    raise RuntimeError("a benchmark process reported before the start")
            services = self._service_processes(system)
            wal = self.wal_bytes()
            before = {name: cpu_snapshot(ps) for name, ps in services.items()}
            psutil.cpu_percent(None)
            start.set()
            spies = self._profile(system, callers, body_bytes, procs) if self.args.profile else []
            time.sleep(seconds)
            stop.set()
            for spy in spies:
                spy.wait(60)
            reports = [out.get(timeout=DRAIN_SECONDS) for _ in range(len(procs) - 1)]
            done.set()
            consumer = out.get(timeout=DRAIN_SECONDS)
            result.busy = psutil.cpu_percent(None) / 100
            after = {name: cpu_snapshot(ps) for name, ps in self._service_processes(system).items()}
            result.wal_bytes = self.wal_bytes() - wal
            for name in before:
                result.cpu[name] = cpu_between(before[name], after[name])
            result.cpu["callers"] = sum(r[5] for r in reports)
            result.cpu["consumer"] = consumer[3]
            result.consumer_calls = self._consumer_calls() - calls
            result.broker = {k: v - counts.get(k, 0.0) for k, v in self._broker_counts().items()}
            result.committed = sum(r[1] for r in reports)
            result.errors = sum(r[3] for r in reports)
            result.error_samples = [e for r in reports for e in r[2]][:5]
            result.latencies = [x for r in reports for x in r[4]]
            _name, result.consumed, result.duplicates, _cpu, result.seconds, consumed_at = consumer
            result.delivery = [consumed_at[ref] - at for r in reports for ref, at in r[7] if ref in consumed_at]
            with psycopg.connect(dsn, autocommit=True) as c:
                # The warm-up transactions of txmq's callers are rows too, consumed before the start.
                result.rows = c.execute("SELECT count(*) FROM orders").fetchone()[0]
                if system.startswith(TXMQ_SYSTEMS):
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
    parser.add_argument("--systems", default="txmq,txmq-asyncio,anchored,anchored-asyncio,outbox,outbox-asyncio,rabbitmq",
                        help="of txmq, txmq-asyncio, txmq-threads, anchored, anchored-asyncio, outbox, "
                             "outbox-asyncio, rabbitmq")
    parser.add_argument("--body-bytes", type=int, default=256, help="the business payload of every row")
    parser.add_argument("--wal-bodies", default="16384",
                        help="further payload sizes run for PostgreSQL's cost per transaction (anchored-asyncio and "
                             "both outbox layouts at 8 callers, or the largest count below); empty: none")
    parser.add_argument("--txmq-acks", default="deferred",
                        help="how txmq's consumer acknowledges: deferred (ack_later, on its next receive) or calls "
                             "(ack_many); both, comma-separated, runs each txmq row both ways (the first unlabelled)")
    parser.add_argument("--json", default="", help="also write every run here")
    parser.add_argument("--profile", default="", help="a directory: py-spy records every process of each run "
                                                      "there (collapsed stacks; read with python -m bench.profile)")
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy's samples per second")
    parser.add_argument("--profile-flags", default="", help="more py-spy record flags (--gil, --native, --idle)")
    args = parser.parse_args(argv)
    args.callers = [int(x) for x in args.callers.split(",") if x]
    args.txmq_acks = [x for x in args.txmq_acks.split(",") if x]
    if not args.txmq_acks or any(m not in ("deferred", "calls") for m in args.txmq_acks):
        parser.error("--txmq-acks: comma-separated of deferred, calls")
    args.systems = [variant for x in args.systems.split(",") if x
                    for variant in ([x] + [f"{x}/{m}" for m in args.txmq_acks[1:]] if x.startswith("txmq") else [x])]
    args.wal_bodies = [int(x) for x in args.wal_bodies.split(",") if x]

    rows: dict[tuple[str, int], Run] = {}
    every: list[dict[str, Any]] = []
    failed = False
    round_trips: list[float] = []
    wal_rows: dict[tuple[str, int], Run] = {}
    transport: Floor | None = None
    with Bench(args) as bench:
        if bench.cluster is not None:
            round_trips.append(bench.broker_round_trip_ms())
            transport = grpc_floor.measure()
        plan = [(callers, system, args.body_bytes) for callers in args.callers for system in args.systems]
        wal_callers = max([c for c in args.callers if c <= 8], default=min(args.callers))
        plan += [(wal_callers, system, body) for body in args.wal_bodies
                 for system in ("anchored-asyncio", "outbox", "outbox-asyncio") if system in args.systems]
        for callers, system, body in plan:
                runs = []
                for i in range(args.runs):
                    try:
                        r = bench.run(system, callers, body)
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
                    print(f"  {system:>16} × {callers:<3} {body:>6} B run {i + 1}: {r.rate:8.1f} txn/s, p50 "
                          f"{r.pct(0.5):6.2f} ms{' (saturated)' if r.saturated else ''}", file=sys.stderr)
                if runs:
                    median = sorted(runs, key=lambda r: r.rate)[len(runs) // 2]
                    if body == args.body_bytes:
                        rows[(system, callers)] = median
                    else:
                        wal_rows[(system, body)] = median
        if bench.cluster is not None:
            round_trips.append(bench.broker_round_trip_ms())
    _print(rows, args)
    _print_targets(rows, wal_rows, sorted(round_trips)[len(round_trips) // 2] if round_trips else 0.0, args, transport)
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
        outbox = best_outbox(rows, callers)
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
              f"{per.get('consumer', 0):>8.0f} {r.consumer_calls / max(r.consumed, 1) if system.startswith(TXMQ_SYSTEMS) else 0:>5.2f}"
              f"  {check}")
    counted = [(system, callers, r) for (system, callers), r in rows.items() if r.broker]
    if counted:
        print("broker, per transaction (unary calls by method, Produce stream messages, WAL syncs), and the "
              "services' CPU apart (µs):")
        for system, callers, r in counted:
            print(f"{callers:>7} {system:>18}  " + ", ".join(
                f"{k} {v / max(r.consumed, 1):.2f}" for k, v in sorted(r.broker.items()) if v)
                  + "; " + ", ".join(f"{k} {r.per_txn_us(k):,.0f}" for k in SERVICE_PARTS))
    print("÷ outbox: the rate over the outbox's faster layout at the same callers (outbox: a process per "
          "caller; outbox-asyncio: coroutines of one process). anchored: docs/anchored-transactions.md.")
    print("service: txmq's name server + broker + checker, or RabbitMQ's node; outbox has none "
          "(its relay is the consumer). calls: txmq's consumer calls (ReceiveMessages + AckMessages) per "
          f"transaction; its acks: {args.txmq_acks[0]} unless the system says /calls or /deferred. "
          "committed = business rows = consumed is checked per run.")


def best_outbox(rows: dict[tuple[str, int], Run], callers: int) -> Run | None:
    """The outbox's faster layout at ``callers`` (the one every ratio compares with)."""
    found = [r for (system, c), r in rows.items() if c == callers and system in ("outbox", "outbox-asyncio")]
    return max(found, key=lambda r: r.rate, default=None)


def _cpu_line(r: Run) -> str:
    parts = {k: r.per_txn_us(k) for k in r.cpu if k not in SERVICE_PARTS}
    return (f"{r.system} {r.cpu_per_txn_us:,.0f} µs (" + ", ".join(f"{k} {v:,.0f}" for k, v in parts.items())
            + f"; machine busy {r.busy:.0%})")


def _print_targets(rows: dict[tuple[str, int], Run], wal_rows: dict[tuple[str, int], Run], round_trip_ms: float,
                   args: argparse.Namespace, transport: Floor | None) -> None:
    """Issue 29's targets, each with its ratio; a target not met says what stops it, from
    the numbers of this run."""
    print("\nTargets (issue 29), each against the outbox's faster layout at the same callers:")

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT MET"

    for callers in (8, 64):
        a, o = rows.get(("anchored-asyncio", callers)), best_outbox(rows, callers)
        if a is None or o is None or not o.rate:
            continue
        ratio = a.rate / o.rate
        print(f"- anchored-asyncio ≥ 1.0× the outbox at {callers} callers: {a.rate:,.0f} vs {o.rate:,.0f} txn/s "
              f"({o.system}) = {ratio:.2f}× — {verdict(ratio >= 1.0)}")
        if ratio < 1.0:
            print(f"    what stops it: CPU per transaction {_cpu_line(a)} against {_cpu_line(o)}")
        if callers == 64:
            cpu_ratio = a.cpu_per_txn_us / max(o.cpu_per_txn_us, 1e-9)
            print(f"- CPU per transaction (all processes) at 64 ≤ the outbox's: {a.cpu_per_txn_us:,.0f} vs "
                  f"{o.cpu_per_txn_us:,.0f} µs = {cpu_ratio:.2f}× — {verdict(cpu_ratio <= 1.0)}")
            if cpu_ratio > 1.0:
                print(f"    where it goes: {_cpu_line(a)}; {_cpu_line(o)}")
    o1 = best_outbox(rows, 1)
    for system in ("anchored", "anchored-asyncio"):
        a = rows.get((system, 1))
        if a is None or o1 is None:
            continue
        floor = o1.pct(0.5) + round_trip_ms
        print(f"- {system} p50 at 1 caller ≤ the outbox's p50 + one durable empty broker round trip: "
              f"{a.pct(0.5):.2f} ms vs {o1.pct(0.5):.2f} + {round_trip_ms:.2f} = {floor:.2f} ms "
              f"({a.pct(0.5) / max(floor, 1e-9):.2f}×) — {verdict(a.pct(0.5) <= floor)}")
        if a.pct(0.5) > floor:
            print(f"    what stops it: {a.pct(0.5) - floor:.2f} ms over the floor; the caller's CPU "
                  f"{a.per_txn_us('callers'):,.0f} µs per transaction against the outbox caller's "
                  f"{o1.per_txn_us('callers'):,.0f} µs, PostgreSQL {a.per_txn_us('postgresql'):,.0f} µs against "
                  f"{o1.per_txn_us('postgresql'):,.0f} µs")
            if transport is not None and a.broker:
                messages = a.broker.get("Produce in", 0.0) / max(a.consumed, 1)
                client = transport.aio_stream_client_us if system == "anchored-asyncio" else transport.stream_client_us
                print(f"    of the caller's CPU, gRPC's client side alone ~{messages * client:,.0f} µs ({messages:.2f} "
                      f"Produce messages × {client:,.0f} µs, bench/grpc_floor.py), the rest psycopg and the SDK")
        services = a.per_txn_us("txmq")
        print(f"- {system} services' CPU per transaction at 1 caller ≤ 600 µs: {services:,.0f} µs "
              f"({services / 600:.2f}×) — {verdict(services <= 600)}")
        if services > 600:
            print(f"    where it goes: the broker {a.per_txn_us('broker'):,.0f} µs of it (half message + "
                  f"EndTransaction + the consumer's receive and ack calls), name server and checker the rest")
            if transport is not None and a.broker:
                unary, streamed, alone = grpc_cost_us(a, transport)
                print(f"    what stops it: Python gRPC alone costs {alone:,.0f} µs of it ({unary:.2f} unary calls × "
                      f"{transport.unary_server_us:,.0f} µs + {streamed:.2f} stream messages × "
                      f"{transport.stream_server_us:,.0f} µs per transaction, a bare grpc.aio server paced like one "
                      f"caller: bench/grpc_floor.py), the broker's own work the other "
                      f"{a.per_txn_us('broker') - alone:,.0f} µs")
    for callers in args.callers:
        a, o = rows.get(("anchored-asyncio", callers)), best_outbox(rows, callers)
        if a is None or o is None or not a.delivery or not o.delivery:
            continue
        ok = a.delivery_pct(0.5) <= o.delivery_pct(0.5) and a.delivery_pct(0.99) <= o.delivery_pct(0.99)
        print(f"- commit-to-consumer at {callers} callers no worse than the outbox's relay: p50 "
              f"{a.delivery_pct(0.5):.2f} vs {o.delivery_pct(0.5):.2f} ms, p99 {a.delivery_pct(0.99):.2f} vs "
              f"{o.delivery_pct(0.99):.2f} ms — {verdict(ok)}")
        if not ok:
            print("    what stops it: the anchored message becomes visible at its EndTransaction (sent after the "
                  "COMMIT, batched) and reaches the consumer at its next long-poll receive; the relay moves "
                  "outbox rows as soon as NOTIFY wakes it")
    wal_callers = max([c for c in args.callers if c <= 8], default=min(args.callers))
    sizes = [(args.body_bytes, {s: rows.get((s, wal_callers)) for s in ("anchored-asyncio", "outbox", "outbox-asyncio")})]
    sizes += [(b, {s: wal_rows.get((s, b)) for s in ("anchored-asyncio", "outbox", "outbox-asyncio")})
              for b in args.wal_bodies]
    for body, by in sizes:
        a = by["anchored-asyncio"]
        outs = [r for s, r in by.items() if s != "anchored-asyncio" and r is not None]
        if a is None or not outs:
            continue
        o = max(outs, key=lambda r: r.rate)
        a_cpu, o_cpu = a.per_txn_us("postgresql"), o.per_txn_us("postgresql")
        a_wal, o_wal = a.wal_bytes / max(a.consumed, 1), o.wal_bytes / max(o.consumed, 1)
        print(f"- PostgreSQL's cost per transaction at {body} B bodies ({wal_callers} callers) ≤ the outbox's: "
              f"server CPU {a_cpu:,.0f} vs {o_cpu:,.0f} µs ({a_cpu / max(o_cpu, 1e-9):.2f}×), WAL "
              f"{a_wal:,.0f} vs {o_wal:,.0f} B ({a_wal / max(o_wal, 1e-9):.2f}×) — "
              f"{verdict(a_cpu <= o_cpu and a_wal <= o_wal)}")
        if not (a_cpu <= o_cpu and a_wal <= o_wal):
            print("    what stops it: the decision row is written three times (inserted, its halves recorded, "
                  "deleted in batches once acknowledged) and the business row is the caller's own; the outbox "
                  "writes its row and the relay moves it")
    for callers in (8,):
        for anchored, classic in (("anchored-asyncio", "txmq-asyncio"), ("anchored", "txmq")):
            a, t = rows.get((anchored, callers)), rows.get((classic, callers))
            if a is None or t is None:
                continue
            print(f"- broker CPU per transaction at {callers} callers: {anchored} {a.per_txn_us('broker'):,.0f} µs "
                  f"beside {classic} (two synchronous round trips) {t.per_txn_us('broker'):,.0f} µs")
    print(f"(one durable empty broker round trip, p50 of 200 sends at the start and end of this run: "
          f"{round_trip_ms:.2f} ms)")
    if transport is not None:
        print(f"({transport.line()})")


def grpc_cost_us(r: Run, floor: Floor) -> tuple[float, float, float]:
    """(unary calls, Produce stream messages in, their cost in µs) per transaction of ``r``'s
    broker, at ``floor``'s price of each: what Python gRPC alone would cost it."""
    per = max(r.consumed, 1)
    unary = sum(v for k, v in r.broker.items() if not k.startswith("Produce ") and k != "WAL syncs") / per
    streamed = r.broker.get("Produce in", 0.0) / per
    return unary, streamed, unary * floor.unary_server_us + streamed * floor.stream_server_us


if __name__ == "__main__":
    sys.exit(main())
