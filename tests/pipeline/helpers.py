"""Workloads with known outcomes and waits on broker state, for the pipeline tests."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, Callable

import txmq
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2

LocalState = txmq.LocalTransactionState


class Scripted(txmq.TransactionListener):
    """execute and check answers chosen per message by its ``outcome`` property:
    commit / rollback (by the client), check-commit (UNKNOWN, then COMMIT when checked),
    discard (UNKNOWN, and UNKNOWN to every check), pending (UNKNOWN; the message sets a
    long check immunity)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checked: set[str] = set()

    def execute_local_transaction(self, message: Any, arg: Any) -> LocalState:
        outcome = message.properties["outcome"]
        return {"commit": LocalState.COMMIT, "rollback": LocalState.ROLLBACK}.get(outcome, LocalState.UNKNOWN)

    def check_local_transaction(self, message: Any) -> LocalState:
        with self.lock:
            self.checked.add(message.transaction_id)
        return LocalState.COMMIT if message.properties["outcome"] == "check-commit" else LocalState.UNKNOWN


def producer(cluster: Cluster, group: str, listener: txmq.TransactionListener) -> txmq.TransactionProducer:
    p = txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=listener,
                                 checker_refresh_seconds=0.5, tls=cluster.client_tls())
    wait_until(lambda: len(p.connected_checkers()) == len(cluster.checkers), 15,
               message="producer not subscribed with every checker")
    return p


def send_workload(p: txmq.TransactionProducer, topic: str, outcomes: dict[str, int]) -> dict[str, list[Any]]:
    """Sends ``outcomes[name]`` transactions of each outcome; returns their results by outcome."""
    results: dict[str, list[Any]] = {name: [] for name in outcomes}
    i = 0
    for name, count in outcomes.items():
        for _ in range(count):
            message = txmq.Message(topic, f"{name}-{i}".encode(), tag=name, keys=(f"key-{i}",),
                                   properties={"outcome": name, "i": str(i)},
                                   check_immunity_seconds=600.0 if name == "pending" else None)
            results[name].append(p.send_in_transaction(message))
            i += 1
    return results


def transactions(cluster: Cluster, group: str) -> list[common_pb2.Transaction]:
    response = cluster.admin_stub().ListTransactions(
        admin_pb2.ListTransactionsRequest(producer_group=group, limit=10_000), timeout=10)
    return list(response.transactions)


def wait_settled(cluster: Cluster, group: str, expected: int, pending: int = 0, timeout: float = 30.0
                 ) -> list[common_pb2.Transaction]:
    """Until the group has ``expected`` transactions of which exactly ``pending`` are PREPARED."""
    def settled() -> list[common_pb2.Transaction] | None:
        rows = transactions(cluster, group)
        prepared = sum(1 for t in rows if t.state == common_pb2.TRANSACTION_STATE_PREPARED)
        return rows if len(rows) == expected and prepared == pending else None

    return wait_until(settled, timeout, interval=0.1,
                      message=lambda: f"group {group} not settled: "
                                      f"{[common_pb2.TransactionState.Name(t.state) for t in transactions(cluster, group)]}")


def committed_offsets(cluster: Cluster, results: list[Any]) -> dict[str, tuple[str, int, int]]:
    """message id → (broker, queue, offset) from the brokers' transaction rows."""
    out = {}
    for r in results:
        t = cluster.admin_stub().DescribeTransaction(
            admin_pb2.DescribeTransactionRequest(transaction_id=r.transaction_id), timeout=10).transaction
        assert t.state == common_pb2.TRANSACTION_STATE_COMMITTED, t
        out[r.message_id] = (t.broker_name, t.queue_id, t.queue_offset)
    return out


#: The JIT of every test JVM (C1 only: see conftest.py), and how a driver run as a user
#: runs it gets it.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
DRIVER_JIT = {"JAVA_TOOL_OPTIONS": TEST_JVM_OPTIONS}


def clean_env() -> dict[str, str]:
    """This environment without anything that points Spark or Python at our code (no
    PYSPARK_PYTHON, SPARK_*, PYTHONPATH): what a user's shell has; its JVM with the test
    JVMs' JIT (:data:`DRIVER_JIT`)."""
    import os

    kept = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_", "PYTHON"))}
    return {**kept, **DRIVER_JIT}


def run_as_a_user(args: list[str], cwd: Any, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m txmq_pipeline.audit ARGS`` with the venv's interpreter, from ``cwd``, in
    an environment holding nothing that points Spark or Python at our code (plus ``env``)."""
    return subprocess.run([sys.executable, "-m", "txmq_pipeline.audit", *args], cwd=cwd,
                          env={**clean_env(), **(env or {})}, capture_output=True, text=True, timeout=500)


def run_until(predicate: Callable[[], Any], timeout: float, message: str) -> Any:
    return wait_until(predicate, timeout, interval=0.2, message=message)
