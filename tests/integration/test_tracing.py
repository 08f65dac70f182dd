"""Tracing end to end: a transactional message's one trace across three processes — its
producer, a check answered by another process of the group, and its consumer — each with
OpenTelemetry's SDK and an in-memory exporter (tests/support/traced_worker.py), sync and
asyncio mixed; no trace context at all without OpenTelemetry; and the tracing core's spans
without a cluster (a process of its own, so no global tracer provider stays behind)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_checks import COMMITTED, describe
from tests.support.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checked(checks_cluster: Cluster) -> Cluster:
    """test_checks.py's shared cluster (tests/conftest.py): these tests only read it."""
    return checks_cluster


def worker(*args: str, stdin: str = "") -> tuple[list[dict[str, Any]], list[str]]:
    done = subprocess.run([sys.executable, "-m", "tests.support.traced_worker", *args], input=stdin, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    return [json.loads(line[5:]) for line in lines if line.startswith("SPAN ")], lines


def one(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, (name, [s["name"] for s in spans])
    return found[0]


@pytest.mark.parametrize("producer, checker, consumer", [("sync", "asyncio", "push-sync"),
                                                         ("asyncio", "sync", "push-asyncio"),
                                                         ("sync", "sync", "simple")])
def test_one_trace_links_the_producer_a_check_in_another_process_and_the_consumer(checked, unique_name, producer,
                                                                                   checker, consumer):
    group, topic, consumer_group = unique_name("g"), unique_name("orders"), unique_name("c")
    checked.create_topic(topic, 1)
    ns = checked.nameserver_address

    produced, lines = worker("produce", producer, ns, group, topic)
    transaction_id = next(line.split()[1] for line in lines if line.startswith("TRANSACTION "))
    send = one(produced, f"send {topic}")
    assert send["kind"] == "PRODUCER" and send["parent_id"] is None
    trace_id, send_id = send["trace_id"], send["span_id"]
    attributes = send["attributes"]
    assert attributes["messaging.system"] == "txmq" and attributes["messaging.operation.type"] == "send"
    assert attributes["messaging.destination.name"] == topic and attributes["txmq.transaction_id"] == transaction_id
    assert attributes["messaging.rocketmq.message.type"] == "transaction"
    message_id = attributes["messaging.message.id"]
    local = one(produced, "execute_local_transaction")
    end = one(produced, f"end {topic}")
    assert (local["parent_id"], end["parent_id"]) == (send_id, send_id)
    assert end["attributes"]["txmq.decision"] == "UNKNOWN" and end["attributes"]["txmq.state"] == "PREPARED"
    assert {s["trace_id"] for s in produced} == {trace_id}

    # The decision comes from a check answered by another process of the group: its span
    # continues the trace the half message carries.
    checks, _ = worker("check", checker, ns, group, topic, stdin=transaction_id + "\n")
    assert describe(checked, transaction_id).state == COMMITTED
    answered = [s for s in checks if s["name"] == f"check {topic}"]
    assert answered and all(s["trace_id"] == trace_id and s["parent_id"] == send_id and s["kind"] == "CONSUMER"
                            for s in answered)
    assert answered[-1]["attributes"]["txmq.check.result"] == "COMMIT"
    assert answered[-1]["attributes"]["messaging.message.id"] == message_id

    # The consumer: its spans are in the same trace (processing a child of the send, its
    # receive and ack linked to it).
    role, _, flavour = consumer.partition("-")
    consumed, _ = worker(role, flavour or "sync", ns, group, topic, consumer_group)
    link = f"{trace_id}/{send_id}"
    ack = one(consumed, f"ack {topic}")
    assert link in ack["links"] and ack["attributes"]["messaging.operation.type"] == "settle"
    assert ack["attributes"]["messaging.consumer.group.name"].endswith(consumer_group)
    if role == "push":
        process = one(consumed, f"process {topic}")
        assert (process["trace_id"], process["parent_id"], process["kind"]) == (trace_id, send_id, "CONSUMER")
        assert process["attributes"]["messaging.message.id"] == message_id
        assert process["attributes"]["txmq.delivery_attempt"] == 1
    else:
        receive = one(consumed, f"receive {topic}")
        assert link in receive["links"] and receive["attributes"]["messaging.batch.message_count"] == 1
        handled = one(consumed, "handle order")  # the application's span, through txmq.tracing.context_of
        assert (handled["trace_id"], handled["parent_id"]) == (trace_id, send_id)


NO_OPENTELEMETRY = """
import sys
sys.modules["opentelemetry"] = None   # as if the extra were not installed
import txmq, txmq.tracing
assert txmq.tracing.ENABLED is False
ns, topic = sys.argv[1:3]
with txmq.Producer(ns) as producer:
    producer.send(txmq.Message(topic, b"untraced"))
with txmq.SimpleConsumer(ns, consumer_group=topic + "-c", subscriptions={topic: "*"},
                         await_duration_seconds=0.5) as consumer:
    for _ in range(40):
        got = consumer.receive(4)
        if got:
            consumer.ack(got[0])
            assert txmq.tracing.context_of(got[0]) is None
            print(sorted(got[0].properties))
            break
"""


def test_without_opentelemetry_nothing_is_traced_and_nothing_is_added(checked, unique_name):
    topic = unique_name("plain")
    checked.create_topic(topic, 1)
    done = subprocess.run([sys.executable, "-c", NO_OPENTELEMETRY, checked.nameserver_address, topic], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "traceparent" not in done.stdout and done.stdout.strip() == "[]"


SPANS = r'''
import txmq
import txmq.tracing
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from txmq import _tracing as tracing

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

message = txmq.Message("orders", b"body", tag="t", message_group="g")
with tracing.send(message, transactional=True, client_id="p1") as send:
    carried = send.inject(message)
    assert carried.message_group == "g" and carried.tag == "t" and carried.body == b"body"
    traceparent = carried.properties["traceparent"]
    assert traceparent.startswith("00-") and len(traceparent.split("-")) == 4
    mine = txmq.Message("orders", b"x", properties={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert send.inject(mine) is mine                      # a traceparent of its own is kept
    tracing.sent(send, message_id="M1", queue_id=3, broker_name="broker-0", transaction_id="T1")
    half = txmq.TransactionMessage(message=carried, message_id="M1", transaction_id="T1", broker_name="broker-0",
                                   queue_id=3)
    with tracing.local_transaction(send, half) as local, local.current():
        assert trace.get_current_span() is local.span     # the listener runs inside it
    with tracing.end(send, half, txmq.LocalTransactionState.COMMIT) as end:
        tracing.ended(end, txmq.TransactionState.COMMITTED, None)
with tracing.end(None, half, txmq.LocalTransactionState.ROLLBACK):
    pass                                                  # an explicit transaction's end: from the message

check = txmq.CheckMessage(message=carried, message_id="M1", transaction_id="T1", broker_name="broker-0", queue_id=3,
                          attempt=2)
with tracing.check(check, "orders-group") as checked, checked.current():
    tracing.checked(checked, txmq.InProgress(retry_after_seconds=1))
received = type("Received", (), {"topic": "orders", "properties": carried.properties, "message_id": "M1",
                                 "queue_id": 3, "delivery_attempt": 1})()
tracing.received("billing", [received], tracing.now_ns())
with tracing.process("billing", received) as process:
    process.fail(ValueError("bad order"))
tracing.acked("billing", [received], [None], tracing.now_ns())

finished = exporter.get_finished_spans()
ends = [s for s in finished if s.name == "end orders"]
assert len(ends) == 2                                     # send_in_transaction's, and the explicit one
spans = {s.name: s for s in finished}
send_span = spans["send orders"]
assert send_span.kind.name == "PRODUCER" and send_span.parent is None
a = send_span.attributes
assert (a["messaging.system"], a["messaging.operation.type"], a["messaging.destination.name"],
        a["messaging.message.id"], a["messaging.destination.partition.id"], a["txmq.transaction_id"],
        a["messaging.rocketmq.message.type"], a["messaging.rocketmq.message.group"], a["messaging.client.id"]) == (
        "txmq", "send", "orders", "M1", "3", "T1", "transaction", "g", "p1")
sid, tid = send_span.context.span_id, send_span.context.trace_id
for span in [spans["execute_local_transaction"], *ends, spans["check orders"], spans["process orders"]]:
    assert span.context.trace_id == tid and span.parent.span_id == sid, span.name
assert ends[0].attributes["txmq.state"] == "COMMITTED" and ends[1].attributes["txmq.decision"] == "ROLLBACK"
assert spans["check orders"].kind.name == "CONSUMER" and spans["check orders"].attributes["txmq.check.attempt"] == 2
assert spans["check orders"].attributes["txmq.check.result"] == "IN_PROGRESS"
assert spans["process orders"].status.status_code.name == "ERROR"
for name in ("receive orders", "ack orders"):
    span = spans[name]
    assert [(l.context.trace_id, l.context.span_id) for l in span.links] == [(tid, sid)], name
    assert span.attributes["messaging.batch.message_count"] == 1
assert spans["ack orders"].attributes["messaging.operation.type"] == "settle"
context = txmq.tracing.context_of(received)
assert trace.get_current_span(context).get_span_context().span_id == sid
print("ok")
'''


def test_the_cores_spans_and_the_context_messages_carry():
    """The tracing core without a cluster, with OpenTelemetry's SDK in a process of its own."""
    done = subprocess.run([sys.executable, "-c", SPANS], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
