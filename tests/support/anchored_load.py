"""Anchored transactions in a loop, in producer processes that a chaos run SIGKILLs
(tests/chaos_anchored.py): the process itself (``python -m tests.support.anchored_load``)
and :class:`AnchoredLoad`, which starts, kills, arms and restarts a fleet of them.

Each transaction, drawn from the process's seed: ``commit`` (one ``orders`` row, one
message), ``double`` (one row, two messages), ``raise`` (the row and a message, then the
block raises: rolled back). The order id is in every body (``<order>#<i>``) and in the
message's keys; the row records how many messages the order has (``orders.messages``),
so the table alone says what must be delivered. The process answers its group's checks
from the decisions table and sweeps it, as every instance of an anchored group does.

    python -m tests.support.anchored_load --nameserver A --dsn D --topic T --group G
           --prefix P --stop-file F [--seed S] [--flavour sync|asyncio|sqlalchemy]

``--flavour asyncio``: the same loop with ``txmq.aio`` and a psycopg ``AsyncConnection``
(the SDKs share the decision core, not their stream and end paths); ``sqlalchemy``: the
sync SDK on a SQLAlchemy ``Session`` over psycopg (whose BEGIN and COMMIT the SDK sends
itself). :class:`AnchoredLoad` gives the generations the flavours in turn, from its seed.

Events, one JSON line each on stdout: {"ready"}, {"begin": order, "kind": k},
{"committed": order, "transaction_ids": [...]}, {"rolled_back": order} (the block raised
on purpose), {"error": order, "type", "message", "retryable"} (the transaction failed:
rolled back, or — a lost COMMIT — decided by the checks), {"idle": n} (``--stop-file``
appeared: no more transactions; checks are still answered until SIGTERM), {"done": n}.
``TXMQ_SDK_FAILPOINT`` (``txmq._database.FAILPOINTS``) makes it SIGKILL itself at that step.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from services.common.process import child_pythonpath
from tests.support.anchored_worker import emit

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("commit", "commit", "commit", "double", "raise")
INSERT_ORDER = "INSERT INTO orders (id, messages) VALUES (%s, %s)"
#: Every producer process's options, sync or asyncio (its decisions: DECISION_SETTINGS).
PRODUCER_OPTIONS: dict[str, Any] = {"checker_refresh_seconds": 0.5, "send_timeout_seconds": 2.0,
                                    "request_timeout_seconds": 3.0}
#: The SDK (and the caller's connection) each producer process runs, in turn per generation
#: from the run's seed, with the letter that marks it in the process's order prefix.
FLAVOURS = ("sync", "asyncio", "sqlalchemy")
FLAVOUR_MARKS = {"sync": "s", "asyncio": "a", "sqlalchemy": "q"}
#: The table the load writes (with the decisions table, ``txmq.anchored.schema_sql()``).
ORDERS_SQL = "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, messages int NOT NULL)"
#: The producers' decision settings: repairs and IN_PROGRESS retries within about a second.
DECISION_SETTINGS = {"repair_after_seconds": 1.0, "sweep_interval_seconds": 0.5, "in_progress_retry_seconds": 0.5}


class Deliberate(Exception):
    """The block's own exception: the transaction is rolled back on purpose."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nameserver", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flavour", choices=FLAVOURS, default="sync")
    args = parser.parse_args()
    if args.flavour == "asyncio":
        asyncio.run(main_async(args))
        return

    import txmq
    from txmq.anchored import Decisions

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    producer = txmq.TransactionProducer(args.nameserver, producer_group=args.group,
                                        decisions=Decisions(args.dsn, **DECISION_SETTINGS), **PRODUCER_OPTIONS)
    database = SessionOrders(args.dsn) if args.flavour == "sqlalchemy" else PsycopgOrders(args.dsn)
    emit(ready=True)
    orders = Orders(args, stop.is_set)
    for order in orders:
        try:
            with producer.transaction(database.connection()) as tx:
                for message in order.messages(args.topic):
                    tx.send(message)
                database.insert(order)
                order.end_block()
            order.committed(tx.result)
        except Deliberate:
            emit(rolled_back=order.id)
        except Exception as exc:  # noqa: BLE001 - reported; the loop goes on (a fault is under test)
            order.failed(exc)
            time.sleep(0.05)
    emit(idle=orders.started)
    stop.wait()
    producer.close()
    emit(done=orders.started)


class PsycopgOrders:
    """The sync loop's psycopg ``Connection`` (a new one once it broke)."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.dsn, self.conn = dsn, psycopg.connect(dsn)

    def connection(self) -> Any:
        import psycopg

        if self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(self.dsn)
        return self.conn

    def insert(self, order: "Order") -> None:
        self.conn.execute(INSERT_ORDER, (order.id, order.count))


class SessionOrders:
    """The sync loop's SQLAlchemy ``Session`` on psycopg (rolled back by the SDK after a
    failure, so the same one serves the next transaction)."""

    def __init__(self, dsn: str) -> None:
        import sqlalchemy
        from sqlalchemy.orm import Session

        parts = dict(p.split("=", 1) for p in dsn.split())
        engine = sqlalchemy.create_engine(sqlalchemy.URL.create(
            "postgresql+psycopg", username=parts.get("user"), host=parts.get("host"), port=int(parts["port"]),
            database=parts.get("dbname")))
        self.session = Session(engine)
        self.statement = sqlalchemy.text("INSERT INTO orders (id, messages) VALUES (:id, :messages)")

    def connection(self) -> Any:
        return self.session

    def insert(self, order: "Order") -> None:
        self.session.execute(self.statement, {"id": order.id, "messages": order.count})


async def main_async(args: argparse.Namespace) -> None:
    """:func:`main`'s loop with the asyncio SDK."""
    import psycopg

    from txmq.aio import AsyncTransactionProducer
    from txmq.anchored import Decisions

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    producer = AsyncTransactionProducer(args.nameserver, producer_group=args.group,
                                        decisions=Decisions(args.dsn, **DECISION_SETTINGS), **PRODUCER_OPTIONS)
    await producer.start()
    conn = await psycopg.AsyncConnection.connect(args.dsn)
    emit(ready=True)
    orders = Orders(args, stop.is_set)
    for order in orders:
        try:
            if conn.closed or conn.broken:
                conn = await psycopg.AsyncConnection.connect(args.dsn)
            async with producer.transaction(conn) as tx:
                for message in order.messages(args.topic):
                    tx.send(message)
                await conn.execute(INSERT_ORDER, (order.id, order.count))
                order.end_block()
            order.committed(tx.result)
        except Deliberate:
            emit(rolled_back=order.id)
        except Exception as exc:  # noqa: BLE001 - reported; the loop goes on (a fault is under test)
            order.failed(exc)
            await asyncio.sleep(0.05)
    emit(idle=orders.started)
    await stop.wait()
    await producer.close()
    emit(done=orders.started)


@dataclass(frozen=True)
class Order:
    """One transaction of the loop: its order id, its kind (``KINDS``), its messages."""

    id: str
    kind: str

    @property
    def count(self) -> int:
        return 2 if self.kind == "double" else 1

    def messages(self, topic: str) -> list[Any]:
        import txmq

        return [txmq.Message(topic, f"{self.id}#{i}".encode(), keys=(self.id,)) for i in range(self.count)]

    def end_block(self) -> None:
        """The block's last step: a ``raise`` transaction raises (rolled back on purpose)."""
        if self.kind == "raise":
            raise Deliberate(self.id)

    def committed(self, result: Any) -> None:
        assert result is not None
        emit(committed=self.id, transaction_ids=[m.transaction_id for m in result.messages])

    def failed(self, exc: Exception) -> None:
        emit(error=self.id, type=type(exc).__name__, message=str(exc)[:300],
             retryable=getattr(exc, "retryable", None))


class Orders:
    """The loop's transactions, drawn from ``--seed``, each announced ({"begin"}) as it
    starts, until ``stopped()`` or the stop file appears; ``started``: how many."""

    def __init__(self, args: argparse.Namespace, stopped: Callable[[], bool]) -> None:
        self.args = args
        self.stopped = stopped
        self.started = 0

    def __iter__(self) -> Iterator[Order]:
        rnd = random.Random(self.args.seed)
        while not self.stopped() and not os.path.exists(self.args.stop_file):
            order = Order(f"{self.args.prefix}-{self.started}", rnd.choice(KINDS))
            self.started += 1
            emit(begin=order.id, kind=order.kind)
            yield order


class LoadProcess:
    """One producer process (one generation of producer ``index``); its events collected
    as they come, its stderr in ``<workdir>/<prefix>.log``."""

    def __init__(self, prefix: str, *, nameserver: str, dsn: str, topic: str, group: str, stop_file: Path,
                 workdir: Path, seed: int, failpoint: str = "", flavour: str = "sync") -> None:
        self.prefix = prefix
        self.failpoint = failpoint
        self.flavour = flavour
        # This checkout's code, its own sdk/ included (the parent's entries made absolute).
        env = dict(os.environ, PYTHONPATH=child_pythonpath(os.environ.get("PYTHONPATH", "")))
        env.pop("TXMQ_SDK_FAILPOINT", None)
        if failpoint:
            env["TXMQ_SDK_FAILPOINT"] = failpoint
        self.log_path = workdir / f"{prefix}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.anchored_load", "--nameserver", nameserver, "--dsn", dsn,
                 "--topic", topic, "--group", group, "--prefix", prefix, "--stop-file", str(stop_file),
                 "--seed", str(seed), "--flavour", flavour],
                stdout=subprocess.PIPE, stderr=log, env=env, cwd=ROOT, text=True)
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"events-{prefix}")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if kind in e]

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.running:
            self.proc.kill()
        self.wait_exit(30)

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (closes its producer), SIGKILL if it has not exited within ``timeout``."""
        if self.running:
            self.proc.terminate()
            try:
                return self.wait_exit(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.proc.returncode

    def stderr_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class AnchoredLoad:
    """``producers`` producer processes of one group; each slot can be killed, armed with a
    fail point and restarted (a new generation, a new order prefix). Every generation's
    events are kept: together they are the clients' history."""

    def __init__(self, workdir: Path, *, nameserver: str, dsn: str, topic: str, group: str, producers: int,
                 seed: int) -> None:
        self.workdir = workdir
        self.settings = {"nameserver": nameserver, "dsn": dsn, "topic": topic, "group": group}
        self.stop_file = workdir / "stop-producing"
        self.seed = seed
        self.lock = threading.Lock()
        #: slot -> the process now in it
        self.slots: dict[int, LoadProcess] = {}
        self.history: list[LoadProcess] = []
        self._generations = itertools.count()
        self.kills = 0
        #: fail point -> how many processes died of it
        self.failpoints_reached: dict[str, int] = {}
        self.failpoints_missed: list[str] = []
        for slot in range(producers):
            self.start(slot)

    def start(self, slot: int, failpoint: str = "") -> LoadProcess:
        generation = next(self._generations)
        seed = self.seed * 1000 + generation
        flavour = FLAVOURS[(self.seed + generation) % len(FLAVOURS)]  # in turn: the first fleet runs every one
        proc = LoadProcess(f"p{slot}g{generation}{FLAVOUR_MARKS[flavour]}", stop_file=self.stop_file, workdir=self.workdir,
                           seed=seed, failpoint=failpoint, flavour=flavour, **self.settings)
        with self.lock:
            self.slots[slot] = proc
            self.history.append(proc)
        return proc

    def kill(self, slot: int) -> None:
        with self.lock:
            proc = self.slots[slot]
            self.kills += 1
        proc.kill()

    def die_at(self, slot: int, failpoint: str, timeout: float) -> bool:
        """Restarts ``slot`` armed with ``failpoint``, waits for it to die there (SIGKILL by
        itself); False when it did not reach the step within ``timeout`` (then it is killed)."""
        proc = self.start(slot, failpoint)
        try:
            died = proc.wait_exit(timeout) == -signal.SIGKILL
        except subprocess.TimeoutExpired:
            died = False
        if died:
            with self.lock:
                self.failpoints_reached[failpoint] = self.failpoints_reached.get(failpoint, 0) + 1
        else:
            self.failpoints_missed.append(failpoint)
            self.kill(slot)
        return died

    def committed(self) -> int:
        return sum(len(p.of("committed")) for p in list(self.history))

    def stop_producing(self, timeout: float) -> None:
        """No more transactions: the processes running go idle (still answering checks)."""
        from tests.support.waiting import wait_until

        self.stop_file.touch()
        wait_until(lambda: all(p.of("idle") or not p.running for p in list(self.slots.values())), timeout,
                   interval=0.1, message=lambda: f"producers not idle: {self.describe()}")

    def stop(self) -> None:
        for proc in list(self.slots.values()):
            proc.terminate()

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for p in list(self.history) for e in p.of(kind)]

    def describe(self) -> str:
        return "; ".join(f"{p.prefix}{'' if p.running else f' exit {p.proc.returncode}'} last "
                         f"{p.events[-1] if p.events else None}" for p in list(self.slots.values()))

    def summary(self) -> dict[str, int]:
        return {"transactions": len(self.events("begin")), "committed_acked": len(self.events("committed")),
                "rolled_back": len(self.events("rolled_back")), "errors": len(self.events("error")),
                "producer_kills": self.kills, "failpoint_deaths": sum(self.failpoints_reached.values()),
                **{f"committed_{flavour}": sum(len(p.of("committed")) for p in list(self.history)
                                               if p.flavour == flavour) for flavour in FLAVOURS}}


if __name__ == "__main__":
    main()
