"""A mixed transactional load with its own record of what was acknowledged, and the
invariants a run must keep (Jepsen-style: the clients' history is the truth).

Producers run ``send_in_transaction`` with bodies that say what the local transaction
decides: ``c`` commits, ``r`` rolls back, ``uc``/``ur`` answer UNKNOWN and leave the
decision to the check, which answers from the "local database" — the set of local
transactions that really ran in this process — so a half message whose local transaction
never ran (its send failed) is rolled back, as a real service would; while the send is
still waiting for its answer (held up by a fail-over) the check answers UNKNOWN, since the
local transaction may still run. Consumers receive everything and remember every delivery.

Invariants (:meth:`Workload.violations`):
- every transaction acknowledged COMMITTED is delivered;
- nothing whose local transaction decided ROLLBACK, or never ran, is ever delivered;
- no committed message is stored twice (delivered from two queue offsets);
- every UNKNOWN whose local transaction committed is resolved by checks and delivered.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import txmq

log = logging.getLogger(__name__)

KINDS = ("c", "c", "c", "r", "uc", "ur")


class _Listener(txmq.TransactionListener):
    def __init__(self, workload: "Workload") -> None:
        self.workload = workload

    def execute_local_transaction(self, message: Any, arg: Any) -> txmq.LocalTransactionState:
        body = message.message.body.decode()
        kind = body.split(":", 1)[0]
        with self.workload.lock:
            self.workload.ran[body] = kind in ("c", "uc")  # the local database: what committed
        if kind == "c":
            return txmq.LocalTransactionState.COMMIT
        if kind == "r":
            return txmq.LocalTransactionState.ROLLBACK
        return txmq.LocalTransactionState.UNKNOWN

    def check_local_transaction(self, message: Any) -> txmq.LocalTransactionState:
        body = message.message.body.decode()
        with self.workload.lock:
            committed = self.workload.ran.get(body)
            sending = body in self.workload.sending and body not in self.workload.ran
            self.workload.checks_answered += 1
            self.workload.checks_by_shard[message.broker_name] = self.workload.checks_by_shard.get(
                message.broker_name, 0) + 1
        if sending:
            # The half message is stored but its send has not returned yet (its answer was
            # held up by a fail-over): the local transaction has not run *yet*. A careful
            # service answers "don't know" here, never ROLLBACK — it may still commit.
            return txmq.LocalTransactionState.UNKNOWN
        return txmq.LocalTransactionState.COMMIT if committed else txmq.LocalTransactionState.ROLLBACK


@dataclass
class Workload:
    nameserver: str
    topic: str
    group: str
    producers: int = 4
    consumers: int = 1
    seed: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: body -> whether its local transaction committed (absent: it never ran).
    ran: dict[str, bool] = field(default_factory=dict)
    #: body -> the state send_in_transaction reported (None: EndTransaction undelivered).
    acknowledged: dict[str, Any] = field(default_factory=dict)
    #: bodies whose send_in_transaction raised (the half may or may not exist).
    failed: dict[str, str] = field(default_factory=dict)
    #: bodies whose send_in_transaction raised an error the SDK calls not retryable.
    failed_for_good: dict[str, str] = field(default_factory=dict)
    #: body -> {(broker, queue, offset)} it was delivered from.
    delivered: dict[str, set[tuple[str, int, int]]] = field(default_factory=dict)
    #: body -> its transaction id (acknowledged half messages).
    transaction_ids: dict[str, str] = field(default_factory=dict)
    #: bodies whose send_in_transaction has not returned yet.
    sending: set[str] = field(default_factory=set)
    checks_answered: int = 0
    #: shard -> checks answered for its transactions.
    checks_by_shard: dict[str, int] = field(default_factory=dict)
    #: body -> the shard its half message was stored on (acknowledged half messages).
    shard_of: dict[str, str] = field(default_factory=dict)
    sent: int = 0
    #: Deliveries in all (more than ``len(delivered)``: redeliveries, e.g. of messages
    #: whose ack or receive a fail-over took back).
    deliveries: int = 0

    def __post_init__(self) -> None:
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self._threads: list[threading.Thread] = []
        self._clients: list[Any] = []
        self._counter = itertools.count()
        self._random = random.Random(self.seed)

    # --- running ---------------------------------------------------------------------------

    def start(self) -> "Workload":
        for i in range(self.producers):
            producer = txmq.TransactionProducer(self.nameserver, producer_group=self.group, listener=_Listener(self),
                                                request_timeout_seconds=3.0)
            self._clients.append(producer)
            self._spawn(f"producer-{i}", self._produce, producer, random.Random(self.seed * 1000 + i))
        for i in range(self.consumers):
            consumer = txmq.SimpleConsumer(self.nameserver, consumer_group=f"{self.group}-c",
                                           subscriptions={self.topic: "*"}, await_duration_seconds=0.5,
                                           request_timeout_seconds=3.0)
            self._clients.append(consumer)
            self._spawn(f"consumer-{i}", self._consume, consumer)
        return self

    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _produce(self, producer: Any, rnd: random.Random) -> None:
        while not self._stop_producing.is_set():
            if not self._send_one(producer, rnd.choice(KINDS)):
                time.sleep(0.02)  # a failing shard: don't spin

    def _send_one(self, producer: Any, kind: str) -> bool:
        body = f"{kind}:{next(self._counter)}"
        with self.lock:
            self.sending.add(body)
        try:
            result = producer.send_in_transaction(txmq.Message(self.topic, body.encode()))
        except txmq.TxmqError as exc:
            with self.lock:
                self.failed[body] = type(exc).__name__
                if not exc.retryable:
                    self.failed_for_good[body] = f"{type(exc).__name__}: {exc}"[:300]
            return False
        finally:
            with self.lock:
                self.sending.discard(body)
        with self.lock:
            self.acknowledged[body] = result.state
            self.transaction_ids[body] = result.transaction_id
            self.shard_of[body] = result.broker_name
            self.sent += 1
        return True

    def storm(self, transactions: int, threads: int = 8) -> float:
        """Sends ``transactions`` transactions that answer UNKNOWN at once (half commit
        locally, half roll back), over the producers, so their checks all fall due together
        one transaction timeout later; returns the seconds it took."""
        started = time.monotonic()
        kinds = iter([("uc", "ur")[i % 2] for i in range(transactions)])
        lock = threading.Lock()

        def send(producer: Any) -> None:
            while True:
                with lock:
                    kind = next(kinds, None)
                if kind is None:
                    return
                self._send_one(producer, kind)
        producers = [c for c in self._clients if isinstance(c, txmq.TransactionProducer)]
        workers = [threading.Thread(target=send, args=(producers[i % len(producers)],), daemon=True)
                   for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(300)
        return time.monotonic() - started

    def _consume(self, consumer: Any) -> None:
        while not self._stop_consuming.is_set():
            try:
                messages = consumer.receive(max_messages=32, invisible_duration_seconds=5)
            except txmq.TxmqError:
                time.sleep(0.05)
                continue
            for m in messages:
                body = m.body.decode()
                with self.lock:
                    self.delivered.setdefault(body, set()).add((m.broker_name, m.queue_id, m.queue_offset))
                    self.deliveries += 1
                try:
                    consumer.ack(m)
                except txmq.TxmqError:
                    pass  # redelivered later: at least once

    def stop_producers(self) -> None:
        """Producers stop sending (their check answering goes on until :meth:`stop`)."""
        self._stop_producing.set()
        for thread in self._threads:
            if thread.name.startswith("producer"):
                thread.join(30)

    def stop(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for thread in self._threads:
            thread.join(30)
        for client in self._clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing what is left: best effort
                pass

    # --- what must hold --------------------------------------------------------------------

    def expected_delivered(self) -> set[str]:
        """Bodies that must be delivered: acknowledged COMMITTED, or whose local transaction
        committed (an UNKNOWN resolved by a check, or an EndTransaction that got lost)."""
        with self.lock:
            out = {b for b, s in self.acknowledged.items() if s == txmq.TransactionState.COMMITTED}
            out |= {b for b, committed in self.ran.items() if committed}
        return out

    def violations(self) -> list[str]:
        problems = []
        with self.lock:
            delivered = {b: set(v) for b, v in self.delivered.items()}
            ran = dict(self.ran)
            acknowledged = dict(self.acknowledged)
        for body in sorted(self.expected_delivered()):
            if body not in delivered:
                problems.append(f"{body}: committed (ack {acknowledged.get(body)}, transaction "
                                f"{self.transaction_ids.get(body, '?')}) but never delivered")
        for body, places in sorted(delivered.items()):
            if not ran.get(body):
                problems.append(f"{body}: delivered but its local transaction "
                                f"{'rolled back' if body in ran else 'never ran'} (ack {acknowledged.get(body)})")
            if len(places) > 1:
                problems.append(f"{body}: stored twice, delivered from {sorted(places)}")
            if acknowledged.get(body) == txmq.TransactionState.ROLLED_BACK:
                problems.append(f"{body}: acknowledged ROLLED_BACK but delivered")
        return problems

    def missing(self) -> set[str]:
        with self.lock:
            return self.expected_delivered() - set(self.delivered)

    def summary(self) -> dict[str, int]:
        with self.lock:
            return {"acknowledged": len(self.acknowledged), "failed_calls": len(self.failed),
                    "committed_locally": sum(1 for v in self.ran.values() if v),
                    "delivered": len(self.delivered), "redeliveries": self.deliveries - len(self.delivered),
                    "checks_answered": self.checks_answered}

    def by_shard(self) -> dict[str, dict[str, int]]:
        """Per shard: transactions acknowledged, messages delivered (distinct bodies, by the
        shard they were delivered from) and checks answered — where the load really went."""
        with self.lock:
            out: dict[str, dict[str, int]] = {}

            def add(shard: str, what: str, n: int = 1) -> None:
                row = out.setdefault(shard, {"acknowledged": 0, "delivered": 0, "checks_answered": 0})
                row[what] += n
            for shard in self.shard_of.values():
                add(shard, "acknowledged")
            for places in self.delivered.values():
                for shard in {broker for broker, _, _ in places}:
                    add(shard, "delivered")
            for shard, n in self.checks_by_shard.items():
                add(shard, "checks_answered", n)
            return dict(sorted(out.items()))
