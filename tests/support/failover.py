"""A transactional load for shard failure scenarios (tests/integration/test_failover.py and
``bench.failover``): threads of one ``TransactionProducer`` committing transactions in a
loop, recording when each call returned, what it committed and what it raised.

The listener records the local transactions it ran under their transaction id and answers
checks by it (COMMIT for one it ran, ROLLBACK otherwise), as the SDK asks applications to.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import txmq
from txmq.faults import FaultTable
from txmq.v1 import admin_pb2, common_pb2

from .waiting import wait_until

LocalState = txmq.LocalTransactionState


class CommitListener(txmq.TransactionListener):
    """``local_seconds``: how long each local transaction takes (a database write)."""

    def __init__(self, local_seconds: float = 0.0) -> None:
        self.local_seconds = local_seconds
        self.ran: set[str] = set()
        #: Checks asked, by transaction id.
        self.checked: list[str] = []

    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
        if self.local_seconds:
            time.sleep(self.local_seconds)
        self.ran.add(message.transaction_id)
        return LocalState.COMMIT

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        self.checked.append(message.transaction_id)
        return LocalState.COMMIT if message.transaction_id in self.ran else LocalState.ROLLBACK


@dataclass
class CommitLoad:
    """``threads`` threads committing on ``topic`` through ``producer`` until :meth:`stop`."""

    producer: txmq.TransactionProducer
    topic: str
    threads: int = 4
    #: time.monotonic() when each call returned without raising, in order.
    done_at: list[float] = field(default_factory=list)
    #: Keys (message bodies) of the transactions committed (or left to the check to commit:
    #: their EndTransaction was lost), with the shard that holds each.
    committed: dict[bytes, str] = field(default_factory=dict)
    #: Transaction ids whose EndTransaction was not delivered (the check decides them).
    end_errors: list[str] = field(default_factory=list)
    #: What the calls raised to the application.
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers = [threading.Thread(target=self._run, args=(i,), name=f"commit-load-{i}", daemon=True)
                         for i in range(self.threads)]

    def start(self) -> "CommitLoad":
        for w in self._workers:
            w.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        for w in self._workers:
            w.join(timeout)

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            key = f"{i}-{n}".encode()
            n += 1
            try:
                result = self.producer.send_in_transaction(txmq.Message(self.topic, key))
            except txmq.ClientClosedError:
                return
            except Exception as exc:  # noqa: BLE001 - counted: a failed call to the application
                with self._lock:
                    self.errors.append(exc)
                continue
            with self._lock:
                self.committed[key] = result.broker_name
                if result.end_error is not None:
                    self.end_errors.append(result.transaction_id)
                self.done_at.append(time.monotonic())

    # --- measuring ----------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self.done_at)

    def count_between(self, start: float, end: float) -> int:
        times = self.done_at
        return bisect.bisect_left(times, end) - bisect.bisect_left(times, start)

    def window(self, transactions: int, timeout: float) -> "Window":
        """Waits (up to ``timeout``) until ``transactions`` more calls returned; the window is
        from now to then."""
        return measure(lambda: self.count, transactions, timeout)

    def per_second(self, start: float, end: float) -> list[int]:
        """Calls returned in each whole second from ``start`` to ``end``."""
        return [self.count_between(start + s, start + s + 1) for s in range(int(end - start))]


def measure(count: Callable[[], int], transactions: int, timeout: float) -> "Window":
    """Waits (up to ``timeout``) until ``count()`` grew by ``transactions``: the window from
    now to then, with what it counted."""
    first, start = count(), time.monotonic()
    deadline = start + timeout
    while count() < first + transactions and time.monotonic() < deadline:
        time.sleep(0.01)
    return Window(count() - first, time.monotonic() - start)


@dataclass(frozen=True)
class Window:
    transactions: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.transactions / self.seconds if self.seconds > 0 else 0.0


def shard_successes(producer: txmq.Producer, shard: str) -> int:
    """Sends the producer's fault table counted as answered by ``shard``."""
    for s in producer.routing_stats().shards:
        if s.shard == shard:
            return s.successes
    return 0


def shard_failures(producer: txmq.Producer, shard: str) -> int:
    """Calls to ``shard`` the producer's fault table counted as failed."""
    for s in producer.routing_stats().shards:
        if s.shard == shard:
            return s.failures
    return 0


def sent_to_again(producer: txmq.Producer, shard: str, timeout: float = 10.0) -> float:
    """Seconds until ``shard`` answered 10 more of the producer's sends (it takes traffic
    again), counted from now."""
    since = time.monotonic()
    served = shard_successes(producer, shard)
    wait_until(lambda: shard_successes(producer, shard) > served + 10, timeout,
               message=f"{shard} gets no new sends")
    return time.monotonic() - since


def rerouted_bound(threads: int, seconds: float) -> int:
    """The most sends that may pay a failed attempt on a dead shard over ``seconds``: one
    per caller in flight when it died, then only the fault table's probes (one per
    avoidance interval: 0.25, 0.5, 1 s, then every 2 s, FaultTable's defaults), and one more of
    each for slack. A caller stuck on the dead shard shows as many more than this, whatever
    the machine's load: the count, not the rate, is what the tests compare (the rates are
    ``bench.failover``'s)."""
    defaults = FaultTable()
    probes, t, interval = 0, 0.0, defaults.base_avoid_seconds
    while t < seconds:
        t += interval
        probes += 1
        interval = min(2 * interval, defaults.max_avoid_seconds)
    return 2 * (threads + probes)


def table(rows: Sequence[tuple[str, Window]]) -> str:
    return "\n".join(f"  {name:<8} {w.transactions:6d} txn in {w.seconds:5.2f}s = {w.rate:7.1f} txn/s"
                     for name, w in rows)


def pending(cluster, group: str) -> list[common_pb2.Transaction]:
    return list(cluster.admin_stub().ListTransactions(admin_pb2.ListTransactionsRequest(
        producer_group=group, state=common_pb2.TRANSACTION_STATE_PREPARED), timeout=5).transactions)


def describe(cluster, transaction_id: str) -> common_pb2.Transaction:
    return cluster.admin_stub().DescribeTransaction(
        admin_pb2.DescribeTransactionRequest(transaction_id=transaction_id), timeout=5).transaction


def drain(cluster, topic: str, group: str, expected: set[bytes], timeout: float = 30.0) -> list[bytes]:
    """Every body the group receives (acknowledged) until all of ``expected`` came and then
    a receive of 0.5 s brought nothing more."""
    bodies: list[bytes] = []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as consumer:
        def settled() -> bool:
            batch = consumer.receive(max_messages=64)
            bodies.extend(m.body for m in batch)
            consumer.ack_many(batch)
            return not batch and expected <= set(bodies)

        wait_until(settled, timeout, interval=0.0, ignore=(txmq.UnavailableError,),
                   message=lambda: f"{len(expected - set(bodies))} committed messages not delivered")
    return bodies
