"""Domain errors → gRPC status: the one server-side mapping.

Domain code raises ``txmq.TxmqError`` subclasses. Unary and streaming handlers get them
mapped by :class:`services.common.interceptors.ServerInterceptor` through
:func:`abort_with`; per-entry results of batches and streams use :func:`entry_status`.
"""

from __future__ import annotations

import json

import grpc

from txmq.errors import DETAILS_METADATA_KEY, REASON_METADATA_KEY, TxmqError, encode_details
from txmq.v1 import common_pb2


def trailing_metadata(error: TxmqError) -> tuple[tuple[str, str], ...]:
    return ((REASON_METADATA_KEY, error.reason),
            (DETAILS_METADATA_KEY, json.dumps(encode_details(error))))


async def abort_with(context: grpc.aio.ServicerContext, error: TxmqError) -> None:
    await context.abort(error.code, error.message, trailing_metadata(error))


def entry_status(error: TxmqError | None) -> common_pb2.EntryStatus:
    if error is None:
        return common_pb2.EntryStatus(code=0)
    status = common_pb2.EntryStatus(code=error.code.value[0], message=error.message,
                                    reason=error.reason, details=encode_details(error))
    state = getattr(error, "state", None)
    if isinstance(state, str) and state:
        status.transaction_state = common_pb2.TransactionState.Value(
            state if state.startswith("TRANSACTION_STATE_") else "TRANSACTION_STATE_" + state)
    return status


OK = common_pb2.EntryStatus(code=0)


class StartupError(Exception):
    """The environment keeps a service from starting (a port in use, a data directory that
    cannot be written...); the message is the one line the operator reads."""
