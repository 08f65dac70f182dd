"""The tracing core (``txmq._tracing``) without a cluster: the no-op without a recording
span, the context a message carries and keeps, the spans' names, kinds, parents, links and
attributes (in a process of its own with OpenTelemetry's SDK, so this test process keeps no
global tracer provider), and the proxy's mapping of the official clients' ``trace_context``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import txmq
from txmq import _tracing as tracing
from txmq.v1 import common_pb2

REPO = Path(__file__).resolve().parents[2]


def test_without_a_recording_span_nothing_is_added():
    message = txmq.Message("orders", b"x", properties={"a": "1"})
    assert tracing.NOOP.inject(message) is message
    assert not tracing.NOOP and tracing.NOOP.context() is None
    with tracing.NOOP as op, op.current():
        op.set({"messaging.message.id": "M"})
        op.fail(RuntimeError("nothing recorded"))
    # OpenTelemetry's API with no SDK configured: spans do not record, messages stay as they are.
    traced = tracing.send(message, transactional=False)
    assert traced.inject(message).properties == {"a": "1"}
    traced.end()
    assert tracing.context_of(message) is None


SCRIPT = r'''
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


def test_spans_and_the_context_messages_carry():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_proxy_maps_the_official_clients_trace_context():
    from services.proxy import convert
    from services.proxy.protocol import definition_pb2

    traceparent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    sent = definition_pb2.Message(topic=definition_pb2.Resource(name="orders"), body=b"x")
    sent.system_properties.message_id = "M1"
    sent.system_properties.message_type = definition_pb2.NORMAL
    sent.system_properties.trace_context = traceparent
    native = convert.to_native(sent, client_id="c", max_body_bytes=1024)
    assert native.properties["traceparent"] == traceparent
    delivered = convert.delivered_to_rmq(common_pb2.DeliveredMessage(topic="orders", message=native), 0)
    assert delivered.system_properties.trace_context == traceparent
    plain = convert.delivered_to_rmq(common_pb2.DeliveredMessage(
        topic="orders", message=common_pb2.Message(topic="orders", body=b"y")), 0)
    assert not plain.system_properties.HasField("trace_context")
