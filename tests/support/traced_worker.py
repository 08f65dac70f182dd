"""One role of a traced transaction, in a process of its own with OpenTelemetry's SDK and an
in-memory exporter; prints its spans as JSON lines (``SPAN {...}``) when it is done
(tests/integration/test_tracing.py).

    python -m tests.support.traced_worker ROLE FLAVOUR NAMESERVER GROUP TOPIC [CONSUMER_GROUP]

ROLE ``produce``: one transaction whose local transaction answers UNKNOWN (so a check decides
it); prints ``TRANSACTION <id>``. ``check``: answers the group's checks COMMIT until the
transaction named on stdin is committed. ``push``: a push consumer until it processed one
message. ``simple``: a simple consumer receives, processes (a span of its own in the
message's trace, ``txmq.tracing.context_of``) and acknowledges one message. FLAVOUR is
``sync`` or ``asyncio``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

import txmq
import txmq.tracing
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from txmq.aio import (
    AsyncPushConsumer,
    AsyncTransactionListener,
    AsyncTransactionProducer,
)
from txmq.v1 import common_pb2

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(PROVIDER)
UNKNOWN, COMMIT = txmq.LocalTransactionState.UNKNOWN, txmq.LocalTransactionState.COMMIT


def dump() -> None:
    for span in EXPORTER.get_finished_spans():
        context, parent = span.get_span_context(), span.parent
        print("SPAN " + json.dumps({
            "name": span.name, "kind": span.kind.name, "trace_id": f"{context.trace_id:032x}",
            "span_id": f"{context.span_id:016x}", "parent_id": f"{parent.span_id:016x}" if parent else None,
            "attributes": dict(span.attributes or {}),
            "links": [f"{link.context.trace_id:032x}/{link.context.span_id:016x}" for link in span.links],
            "status": span.status.status_code.name}), flush=True)


class Unknown(txmq.TransactionListener):
    def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        return UNKNOWN

    def check_local_transaction(self, message: Any) -> Any:
        return UNKNOWN


class AsyncUnknown(AsyncTransactionListener):
    async def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        return UNKNOWN

    async def check_local_transaction(self, message: Any) -> Any:
        return UNKNOWN


def produce(flavour: str, nameserver: str, group: str, topic: str) -> None:
    message = txmq.Message(topic, b"traced", tag="t")
    if flavour == "sync":
        with txmq.TransactionProducer(nameserver, producer_group=group, listener=Unknown(),
                                      answer_checks=False) as producer:
            result = producer.send_in_transaction(message)
    else:
        async def run() -> Any:
            async with AsyncTransactionProducer(nameserver, producer_group=group, listener=AsyncUnknown(),
                                                answer_checks=False) as producer:
                return await producer.send_in_transaction(message)
        result = asyncio.run(run())
    print(f"TRANSACTION {result.transaction_id}", flush=True)


def check(flavour: str, nameserver: str, group: str, transaction_id: str) -> None:
    committed = threading.Event()

    def committed_yet() -> bool:
        with txmq.Admin(nameserver) as admin:
            state = admin.describe_transaction(transaction_id).transaction.state
        return state == common_pb2.TRANSACTION_STATE_COMMITTED

    def wait() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not committed_yet():
            time.sleep(0.1)
        committed.set()

    if flavour == "sync":
        with txmq.TransactionProducer(nameserver, producer_group=group, checker=lambda m: COMMIT,
                                      checker_refresh_seconds=0.5):
            wait()
    else:
        async def answer(message: Any) -> Any:
            return COMMIT

        async def run() -> None:
            async with AsyncTransactionProducer(nameserver, producer_group=group, checker=answer,
                                                checker_refresh_seconds=0.5):
                await asyncio.to_thread(wait)
        asyncio.run(run())


def push(flavour: str, nameserver: str, topic: str, consumer_group: str) -> None:
    done = threading.Event()

    def listener(message: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        done.set()
        return txmq.ConsumeResult.SUCCESS

    if flavour == "sync":
        with txmq.PushConsumer(nameserver, consumer_group=consumer_group, subscriptions={topic: "*"},
                               listener=listener, await_duration_seconds=0.5):
            done.wait(60)
    else:
        async def alistener(message: txmq.ReceivedMessage) -> txmq.ConsumeResult:
            return listener(message)

        async def run() -> None:
            async with AsyncPushConsumer(nameserver, consumer_group=consumer_group, subscriptions={topic: "*"},
                                         listener=alistener, await_duration_seconds=0.5):
                await asyncio.to_thread(done.wait, 60)
        asyncio.run(run())


def simple(nameserver: str, topic: str, consumer_group: str) -> None:
    tracer = trace.get_tracer("the-application")
    with txmq.SimpleConsumer(nameserver, consumer_group=consumer_group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as consumer:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for message in consumer.receive(4):
                with tracer.start_as_current_span("handle order", context=txmq.tracing.context_of(message)):
                    consumer.ack(message)
                return


def main(argv: list[str]) -> int:
    role, flavour, nameserver, group, topic = argv[1:6]
    if role == "produce":
        produce(flavour, nameserver, group, topic)
    elif role == "check":
        check(flavour, nameserver, group, sys.stdin.readline().strip())
    elif role == "push":
        push(flavour, nameserver, topic, argv[6])
    else:
        simple(nameserver, topic, argv[6])
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
