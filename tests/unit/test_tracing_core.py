"""The tracing core (``txmq._tracing``) without a cluster: the no-op without a recording
span, and the proxy's mapping of the official clients' ``trace_context``. The spans' names,
kinds, parents, links and attributes are tests/integration/test_tracing.py's (a process of
their own with OpenTelemetry's SDK: this one keeps no global tracer provider)."""

from __future__ import annotations

import txmq
from txmq import _tracing as tracing
from txmq.v1 import common_pb2


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
