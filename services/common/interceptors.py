"""The one interceptor chain every RPC of every service passes through: request bodies
decoded and their numbers checked (``limits.guard_deserializer``), load shed beyond
``max_concurrent_rpcs`` and streams limited per connection (``limits``), timing and status
codes for metrics, and domain error → status mapping. It runs before authentication (the
outermost interceptor: a flood is shed before any credential is looked at), so what is
counted per principal is counted by the auth interceptor once it knows the principal
(``limits.PrincipalShares``)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import types
from typing import Any, Callable, Iterator

import grpc

from txmq.errors import TxmqError

from .errors import abort_with
from .limits import Admission, ConnectionLimit, Refused, connection_of, guard_deserializer, quiet_method
from .metrics import BaseMetrics

log = logging.getLogger(__name__)


def _short_method(full: str) -> str:
    return full.rsplit("/", 1)[-1]


#: Answers a refusal made before a unary method ran (overload, a bad number) in band, as
#: the method's own response: the proxy's RocketMQ clients read errors from a ``Status``
#: inside the response. None: answer with a gRPC status.
InBand = Callable[[str, TxmqError], Any]


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: BaseMetrics, admission: Admission | None = None,
                 streams: ConnectionLimit | None = None, unmetered: frozenset[str] = frozenset(),
                 in_band: InBand | None = None, *, delegated: bool = False) -> None:
        self.metrics = metrics
        #: Auth is on, so a call's on-behalf-of header is checked (``connection_of``).
        self.delegated = delegated
        #: Unary calls in flight (``max_concurrent_rpcs``); ``unmetered`` methods (long
        #: polls, which wait by design) are limited per connection instead.
        self.admission = admission
        #: Open streams per connection (``max_streams_per_connection``).
        self.streams = streams
        self.unmetered = unmetered
        self.in_band = in_band
        #: full method → (the handler it was given, the wrapped one): a registered
        #: method's handler is the same object on every call, so its wrapping (closures,
        #: guarded deserializer, a new RpcMethodHandler) is built once, not per call.
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Callable[..., Any],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self.wrap(handler_call_details.method, handler)

    def wrap(self, full_method: str, handler: Any) -> Any:
        """``handler`` of ``full_method`` behind this chain (built once per handler)."""
        cached = self._wrapped.get(full_method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(full_method, handler)
        self._wrapped[full_method] = (handler, wrapped)
        return wrapped

    def _wrap(self, full_method: str, handler: Any) -> Any:
        method = _short_method(full_method)
        request_deserializer = guard_deserializer(handler.request_deserializer, method,
                                                  streaming=handler.request_streaming)
        # Health and reflection: decoded and mapped like the rest, neither limited nor timed.
        quiet = quiet_method(full_method)
        admission = self.admission if not quiet and method not in self.unmetered else None
        streams = self.streams if not quiet else None
        in_band = self.in_band
        observe = self.metrics.rpc_duration
        service = self.metrics.service
        # The histogram's child per status code, looked up once (``labels()`` costs
        # microseconds on every call).
        children: dict[grpc.StatusCode, Any] = {}

        def record(start: float, context: Any, code: grpc.StatusCode | None) -> None:
            if quiet:
                return
            if code is None:
                code = context.code() if context.code() is not None else grpc.StatusCode.OK
                if isinstance(code, int):
                    code = grpc.StatusCode.OK if code == 0 else grpc.StatusCode.UNKNOWN
            child = children.get(code)
            if child is None:
                child = children[code] = observe.labels(service, method, code.name)
            child.observe(time.perf_counter() - start)

        async def fail(context: Any, exc: BaseException) -> grpc.StatusCode:
            if isinstance(exc, TxmqError):
                await abort_with(context, exc)
            if isinstance(exc, NotImplementedError):  # e.g. the stock health service's List
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented")
            log.exception("unexpected error in %s", method)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}")
            raise AssertionError("unreachable")

        def wrap_unary(behavior: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
            async def wrapper(request_or_iterator: Any, context: Any) -> Any:
                start = time.perf_counter()
                code: grpc.StatusCode | None = None
                try:
                    if isinstance(request_or_iterator, Refused):
                        raise request_or_iterator.error
                    if streaming:
                        with streams.hold(connection_of(context, verified=self.delegated)) if streams else _nothing():
                            return await behavior(request_or_iterator, context)
                    if admission is None:
                        return await behavior(request_or_iterator, context)
                    try:
                        admission.enter()
                    except TxmqError as exc:
                        if in_band is None:
                            raise
                        code = exc.code
                        return in_band(method, exc)
                    try:
                        return await behavior(request_or_iterator, context)
                    finally:
                        admission.exit()
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except TxmqError as exc:
                    code = exc.code
                    await fail(context, exc)
                except Exception as exc:  # noqa: BLE001 - mapped to INTERNAL once, here
                    code = grpc.StatusCode.INTERNAL
                    await fail(context, exc)
                finally:
                    record(start, context, code)
            return wrapper

        def wrap_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
            if not inspect.isasyncgenfunction(behavior):
                return wrap_unary(behavior, streaming=True)

            async def wrapper(request_or_iterator: Any, context: Any) -> Any:
                start = time.perf_counter()
                code: grpc.StatusCode | None = None
                try:
                    if isinstance(request_or_iterator, Refused):
                        raise request_or_iterator.error
                    with streams.hold(connection_of(context, verified=self.delegated)) if streams else _nothing():
                        async for item in behavior(request_or_iterator, context):
                            yield item
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except TxmqError as exc:
                    code = exc.code
                    await fail(context, exc)
                except Exception as exc:  # noqa: BLE001 - anything else is INTERNAL, mapped once here
                    code = grpc.StatusCode.INTERNAL
                    await fail(context, exc)
                finally:
                    record(start, context, code)
            return wrapper

        return _rebuild(handler, request_deserializer, types.SimpleNamespace(
            unary_unary=handler.unary_unary and wrap_unary(handler.unary_unary, streaming=False),
            unary_stream=handler.unary_stream and wrap_stream(handler.unary_stream),
            stream_unary=handler.stream_unary and wrap_unary(handler.stream_unary, streaming=True),
            stream_stream=handler.stream_stream and wrap_stream(handler.stream_stream)))


class Registrar:
    """Stands for a ``grpc.aio`` server while services register on it, wrapping every
    method handler in ``chain`` as it is registered. A server whose only interceptor is
    the shared chain is built without interceptors and registers through this: grpc.aio
    then finds a call's handler directly instead of running an interceptor coroutine (and
    its continuation's) for every call; what each call runs is the same wrapped handler."""

    def __init__(self, server: grpc.aio.Server, chain: ServerInterceptor) -> None:
        self.server = server
        self.chain = chain

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.server.add_generic_rpc_handlers(tuple(_WrappedGeneric(h, self.chain) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.server.add_registered_method_handlers(
            service, {name: self.chain.wrap(f"/{service}/{name}", h) for name, h in handlers.items()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)


class _WrappedGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, chain: ServerInterceptor) -> None:
        self.inner = inner
        self.chain = chain

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self.inner.service(handler_call_details)
        return None if handler is None else self.chain.wrap(handler_call_details.method, handler)


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler),
          ("unary_stream", grpc.unary_stream_rpc_method_handler),
          ("stream_unary", grpc.stream_unary_rpc_method_handler),
          ("stream_stream", grpc.stream_stream_rpc_method_handler))


def _rebuild(handler: Any, request_deserializer: Any, behaviors: Any) -> Any:
    """``handler`` with the guarded request deserializer and the behaviours of ``behaviors``."""
    for kind, make in _KINDS:
        if getattr(handler, kind):
            return make(getattr(behaviors, kind), request_deserializer, handler.response_serializer)
    return handler
