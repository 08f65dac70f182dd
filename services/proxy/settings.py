"""The proxy's answer to a client's Telemetry ``Settings``, and the endpoints it advertises.
Pure functions of the client's settings and the proxy's configuration.

Every reply has status OK (the Python client ignores settings without it) and metrics off
(otherwise the clients export OTLP to the endpoints named here). Producers get the
brokers' body limit and an exponential retry policy (Node.js crashes without one);
consumers get batch size, long polling and the redelivery backoff with the broker's
``max_delivery_attempts`` as its max attempts, as a customized list of delays (what the
Python and Java push consumers use) or, for Node.js (which honours only that), as an
exponential policy.
"""

from __future__ import annotations

import ipaddress
from typing import TypeAlias

from .config import ProxyConfig
from .convert import backoff_delays, duration
from .protocol import definition_pb2
from .upstream import Limits

Settings: TypeAlias = definition_pb2.Settings


def reply(client: Settings, config: ProxyConfig, limits: "Limits | None" = None, *, fifo: bool = False) -> Settings:
    """``limits``: the brokers' limits (``Upstream.limits``); the configuration's by default.
    ``fifo``: the consumer subscribes to FIFO topics."""
    body_limit = limits.max_body_bytes if limits is not None else config.max_body_bytes
    max_attempts = limits.max_delivery_attempts if limits is not None else config.max_delivery_attempts
    out = Settings()
    out.CopyFrom(client)
    out.metric.Clear()
    out.metric.on = False
    kind = client.WhichOneof("pub_sub")
    if kind == "publishing" or (kind is None and client.client_type == definition_pb2.PRODUCER):
        out.backoff_policy.CopyFrom(definition_pb2.RetryPolicy(
            max_attempts=config.producer_max_attempts,
            exponential_backoff=definition_pb2.ExponentialBackoff(
                initial=duration(config.producer_backoff_initial_seconds),
                max=duration(config.producer_backoff_max_seconds), multiplier=2.0)))
        out.publishing.max_body_size = body_limit
        out.publishing.validate_message_type = True
        return out
    sub = out.subscription
    sub.fifo = fifo
    sub.receive_batch_size = config.receive_batch_size
    if client.client_type != definition_pb2.SIMPLE_CONSUMER or not client.subscription.HasField(
            "long_polling_timeout"):
        sub.long_polling_timeout.CopyFrom(duration(config.push_long_polling_seconds))
    policy = definition_pb2.RetryPolicy(max_attempts=max_attempts)
    if client.user_agent.language == definition_pb2.NODE_JS:
        policy.exponential_backoff.CopyFrom(definition_pb2.ExponentialBackoff(
            initial=duration(config.consumer_backoff_initial_seconds),
            max=duration(config.consumer_backoff_max_seconds), multiplier=config.consumer_backoff_multiplier))
    else:
        delays = backoff_delays(config.consumer_backoff_initial_seconds, config.consumer_backoff_multiplier,
                                config.consumer_backoff_max_seconds, max_attempts)
        policy.customized_backoff.next.extend(duration(d) for d in delays)
    out.backoff_policy.CopyFrom(policy)
    return out


def endpoints_for(host: str, port: int) -> definition_pb2.Endpoints:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        scheme = definition_pb2.IPv4 if ip.version == 4 else definition_pb2.IPv6
        host = str(ip)
    except ValueError:
        scheme = definition_pb2.DOMAIN_NAME
    return definition_pb2.Endpoints(scheme=scheme, addresses=[definition_pb2.Address(host=host, port=port)])


def advertised(config: ProxyConfig, requested: definition_pb2.Endpoints, bound_port: int) -> definition_pb2.Endpoints:
    """Where a route tells the client to connect: ``advertise_address`` if set, else the
    access point the client used (so a client behind a Service keeps using the Service),
    else this process."""
    if config.advertise_address:
        host, _, port = config.advertise_address.rpartition(":")
        return endpoints_for(host, int(port))
    if requested.addresses:
        if requested.scheme != definition_pb2.ADDRESS_SCHEME_UNSPECIFIED:
            return requested
        first = requested.addresses[0]
        fixed = endpoints_for(first.host, first.port)
        fixed.addresses.extend(requested.addresses[1:])
        return fixed
    host = "127.0.0.1" if config.host in ("", "0.0.0.0") else config.host
    return endpoints_for(host, bound_port)
