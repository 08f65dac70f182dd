"""Whom a service's call is for: the proxy serves many principals with one service identity,
and the native services decide a proxied call against the principal it is for, with the
same policy and the same store records as that principal's direct calls — the decision is
made in one place, by the service that holds the records.

The proxy names the end principal in the ``x-txmq-on-behalf-of`` header (percent-encoded
UTF-8) of its calls to the brokers and checkers made while it serves that principal's
request (:func:`act_for`, set by the proxy's auth interceptor for the handler and by its
background work — renewals, check subscriptions — for the principal it does it for). The
receiving interceptor (:func:`effective_principal`) accepts the header only from a
caller that authenticated as a service identity: a service identity holds every right, so
acting for another principal can only narrow what it may do. From any other caller the
header is refused (PERMISSION_DENIED), never ignored; an unknown end principal is
UNAUTHENTICATED. Without the header a service identity acts as itself.

Name-server calls carry no header: routes and broker lists are the proxy's own directory,
shared between the clients it serves. One exception: a route lookup that may create its
topic (``for_send`` with ``auto_create_topics``) names the principal it is for
(:func:`on_behalf_metadata`), so the name server holds the creation to that principal's
topic quota, as it would its own lookup.
"""

from __future__ import annotations

import contextvars
import urllib.parse
from typing import Any, Mapping

import grpc

from txmq.errors import PermissionDeniedError, UnauthenticatedError

from .store import Credentials, Principal

ON_BEHALF_OF_HEADER = "x-txmq-on-behalf-of"
#: The calls that carry it: the services that hold records an id names.
DELEGATED_PREFIXES = ("/txmq.v1.BrokerService/", "/txmq.v1.CheckerService/")

#: The principal the current task's native calls are for (None: the service itself).
_ACTING_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar("txmq_acting_for", default=None)


def act_for(principal: str | None) -> contextvars.Token[str | None]:
    """The calls made from here on in this task (and the tasks it starts) are for
    ``principal`` (None: for the service itself). Returns the token to reset it with."""
    return _ACTING_FOR.set(principal)


def reset(token: contextvars.Token[str | None]) -> None:
    _ACTING_FOR.reset(token)


def acting_for() -> str | None:
    return _ACTING_FOR.get()


def on_behalf_metadata() -> list[tuple[str, str]]:
    """The header naming :func:`acting_for`, for a call that must carry it outside
    ``DELEGATED_PREFIXES`` (none while the task acts for the service itself)."""
    principal = _ACTING_FOR.get()
    return [] if principal is None else [(ON_BEHALF_OF_HEADER, urllib.parse.quote(principal, safe=""))]


def effective_principal(credentials: Credentials, authenticated: Principal, metadata: Mapping[str, str]) -> Principal:
    """The principal a call is decided for: ``authenticated``, or the one it acts for."""
    header = metadata.get(ON_BEHALF_OF_HEADER)
    if header is None:
        return authenticated
    name = urllib.parse.unquote(header)
    if not authenticated.service:
        raise PermissionDeniedError(authenticated.name, "act for",
                                    f"principal {name[:64]!r} ({ON_BEHALF_OF_HEADER}: only service identities act "
                                    "for others)")
    end = credentials.principals.get(name)
    if end is None:
        raise UnauthenticatedError(f"{authenticated.name!r} acts for principal {name[:64]!r}, which this service's "
                                   "credential files do not know")
    return end


def _details(details: Any) -> Any:
    principal = _ACTING_FOR.get()
    method = details.method.decode() if isinstance(details.method, bytes) else details.method
    if principal is None or not method.startswith(DELEGATED_PREFIXES):
        return details
    metadata = [(k, v) for k, v in (details.metadata or ()) if k != ON_BEHALF_OF_HEADER]
    metadata.append((ON_BEHALF_OF_HEADER, urllib.parse.quote(principal, safe="")))
    # grpc.aio takes any sequence of pairs here; the stubs name only its Metadata class.
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,  # type: ignore[arg-type]
                                      details.credentials, details.wait_for_ready)


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_details(details), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_details(details), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_details(details), request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_details(details), request_iterator)


def on_behalf_interceptors() -> list[Any]:
    """asyncio client interceptors naming :func:`acting_for` on the delegated calls (no
    header while it is None: every service installs them, only the proxy sets it)."""
    return [_UnaryUnary(), _UnaryStream(), _StreamUnary(), _StreamStream()]
