"""The official clients' namespace: ``x-mq-namespace`` on every call, and
``Resource.resource_namespace`` on the resources some clients fill (the Python client
fills them all; the Node.js client only a producer's topics). Every resource of a request
that names no namespace gets the header's as it is deserialized, before the ACL check and
the handler read it, so both see one name (``convert.resource_name``: ``<namespace>%<name>``).
A resource that names its own namespace keeps it.
"""

from __future__ import annotations

from typing import Any, Callable

import grpc
from google.protobuf.message import Message

from .protocol import definition_pb2

NAMESPACE_HEADER = "x-mq-namespace"
_RESOURCE = definition_pb2.Resource.DESCRIPTOR


def fill_namespace(message: Message, namespace: str) -> None:
    """Sets ``namespace`` on every Resource in ``message`` (at any depth) that has none."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        items = value if field.is_repeated else (value,)
        if field.message_type is _RESOURCE:
            for r in items:
                if not r.resource_namespace:
                    r.resource_namespace = namespace
        elif not field.message_type.GetOptions().map_entry:
            for item in items:
                fill_namespace(item, namespace)


class NamespaceInterceptor(grpc.aio.ServerInterceptor):
    """Fills the header's namespace into each request as it is deserialized (unary and
    streamed requests alike); calls without the header are not touched."""

    async def intercept_service(self, continuation: Callable[..., Any],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        namespace = next((v for k, v in handler_call_details.invocation_metadata or ()
                          if k == NAMESPACE_HEADER and isinstance(v, str)), "")
        if handler is None or not namespace or handler.request_deserializer is None:
            return handler
        deserialize = handler.request_deserializer

        def filled(data: bytes) -> Any:
            request = deserialize(data)
            fill_namespace(request, namespace)
            return request
        return handler._replace(request_deserializer=filled)
