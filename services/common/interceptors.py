"""The one interceptor chain every RPC of every service passes through: timing and status
codes for metrics, and domain error → status mapping. Security (TLS, authentication,
ACLs) will be added here, in one place."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import Any, Callable

import grpc

from txmq._errors import TxmqError

from .errors import abort_with
from .metrics import BaseMetrics

log = logging.getLogger(__name__)


def _short_method(full: str) -> str:
    return full.rsplit("/", 1)[-1]


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: BaseMetrics) -> None:
        self.metrics = metrics

    async def intercept_service(self, continuation: Callable[..., Any],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = _short_method(handler_call_details.method)
        if method == "Check" or method == "Watch" or "ServerReflection" in handler_call_details.method:
            return handler
        observe = self.metrics.rpc_duration
        service = self.metrics.service

        def record(start: float, context: Any, code: grpc.StatusCode | None) -> None:
            if code is None:
                code = context.code() if context.code() is not None else grpc.StatusCode.OK
                if isinstance(code, int):
                    code = grpc.StatusCode.OK if code == 0 else grpc.StatusCode.UNKNOWN
            observe.labels(service, method, code.name).observe(time.perf_counter() - start)

        async def fail(context: Any, exc: BaseException) -> grpc.StatusCode:
            if isinstance(exc, TxmqError):
                await abort_with(context, exc)
            log.exception("unexpected error in %s", method)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}")
            raise AssertionError("unreachable")

        def wrap_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            async def wrapper(request_or_iterator: Any, context: Any) -> Any:
                start = time.perf_counter()
                code: grpc.StatusCode | None = None
                try:
                    return await behavior(request_or_iterator, context)
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
                return wrap_unary(behavior)

            async def wrapper(request_or_iterator: Any, context: Any) -> Any:
                start = time.perf_counter()
                code: grpc.StatusCode | None = None
                try:
                    async for item in behavior(request_or_iterator, context):
                        yield item
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except TxmqError as exc:
                    code = exc.code
                    await fail(context, exc)
                except Exception as exc:  # noqa: BLE001
                    code = grpc.StatusCode.INTERNAL
                    await fail(context, exc)
                finally:
                    record(start, context, code)
            return wrapper

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                wrap_unary(handler.unary_unary), handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                wrap_stream(handler.unary_stream), handler.request_deserializer, handler.response_serializer)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                wrap_unary(handler.stream_unary), handler.request_deserializer, handler.response_serializer)
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                wrap_stream(handler.stream_stream), handler.request_deserializer, handler.response_serializer)
        return handler
