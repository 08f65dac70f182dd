"""Tracing (see ``txmq._tracing``): W3C trace context in message properties and OpenTelemetry
spans for send, the local transaction, checks, EndTransaction, receive, process and ack, a
no-op unless ``opentelemetry-api`` is installed (``pip install txmq[tracing]``).

The public home of ``txmq._tracing``: :func:`context_of` continues a received message's
trace (``tracer.start_as_current_span("work", context=txmq.tracing.context_of(message))``);
the span helpers are what the RocketMQ proxy's check relay records its checks with."""

from ._tracing import (  # re-exported
    ENABLED,
    NOOP,
    TRACEPARENT,
    TRACESTATE,
    Operation,
    check,
    checked,
    context_of,
)

__all__ = ["ENABLED", "NOOP", "TRACEPARENT", "TRACESTATE", "Operation", "check", "checked", "context_of"]
