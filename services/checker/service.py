"""CheckerService: the CheckTransactionState stream, proto ⇄ domain and nothing else.

The protocol on one stream:

1. The producer's first request must be a ``Subscribe`` (producer groups: 1 to
   ``max_groups_per_stream`` valid group names; ``client_id``: 1-255 bytes;
   ``check_credit`` ≥ 0). Anything else ends the stream with INVALID_ARGUMENT (reason
   INVALID_FIELD or INVALID_NAME).
2. The checker answers ``Subscribed`` and then pushes ``CheckRequest``s, never more than
   the credit the producer granted (``check_credit``, then ``CheckCredit`` and
   ``CheckAnswer.credit``; 0 in Subscribe: ``default_check_credit``, given back as checks end).
3. For each check the producer sends ``CheckReceived`` when it starts it and
   ``CheckAnswer`` when it knows. A request the checker refuses — a check id not
   outstanding on this stream (unknown, sent on another stream, already answered, expired)
   in a request that does not name its transaction, an answer without a valid result, a
   late answer for a group the stream does not serve, a credit that is not positive, a
   second ``Subscribe``, a request with no command set — comes back as
   ``CheckTransactionStateResponse.error`` (an ``EntryStatus``, reason INVALID_FIELD,
   details naming the ``check_id``) and changes nothing; the stream stays open. An answer
   the broker refuses (TRANSACTION_STATE_CONFLICT: decided otherwise already) comes back
   the same way.
4. The producer ends its side (half-close) to unsubscribe; checks it had not started are
   handed back to the broker at once (UNDELIVERED, nothing spent). A producer leaving
   while it still owes answers sends ``CheckDrain`` first: no more checks, unstarted ones
   handed back at once, the stream open for the answers it owes until it half-closes.
5. A right revoked while the stream is open (the credential files reloaded) takes effect on
   it within a sweep (``standing``): a group the principal may no longer check leaves the
   stream (an ``error`` PERMISSION_DENIED naming it; its checks go back to the broker, an
   answer for one, or naming the group, is refused in band the same way and the stream goes
   on for its other groups), and the stream ends PERMISSION_DENIED once no group is left, or
   UNAUTHENTICATED once its credentials name its principal no more.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from txmq.errors import InvalidFieldError, TxmqError
from txmq.names import validate_group
from txmq.v1 import checker_pb2, checker_pb2_grpc

from services.common.auth import CALLER
from services.common.limits import CallerLimit, ConnectionLimit, PrincipalLimit

from .dispatcher import Dispatcher
from .standing import Standing
from .streams import ProducerStream

log = logging.getLogger(__name__)

MAX_CLIENT_ID_BYTES = 255


def validate_subscribe(request: checker_pb2.CheckTransactionStateRequest,
                       max_groups: int) -> tuple[str, tuple[str, ...], int]:
    """The client id and groups of a stream's first request; raises the TxmqError that
    ends the stream otherwise."""
    if request.WhichOneof("command") != "subscribe":
        raise InvalidFieldError("subscribe", "the first request on the stream must be a Subscribe")
    subscribe = request.subscribe
    client_id = subscribe.client_id
    if not client_id:
        raise InvalidFieldError("client_id", "required")
    if len(client_id.encode()) > MAX_CLIENT_ID_BYTES:
        raise InvalidFieldError("client_id", f"longer than {MAX_CLIENT_ID_BYTES} bytes")
    groups = tuple(dict.fromkeys(subscribe.producer_groups))
    if not groups:
        raise InvalidFieldError("producer_groups", "at least one producer group is required")
    if len(groups) > max_groups:
        raise InvalidFieldError("producer_groups", f"at most {max_groups} groups per stream, got {len(groups)}")
    for group in groups:
        validate_group("producer_groups", group)
    if subscribe.check_credit < 0:
        raise InvalidFieldError("check_credit", f"must not be negative, got {subscribe.check_credit}")
    return client_id, groups, subscribe.check_credit


class CheckerServicer(checker_pb2_grpc.CheckerServiceServicer):
    def __init__(self, dispatcher: Dispatcher, *, max_groups_per_stream: int,
                 max_pending_checks_per_connection: int = 16_384, max_pending_checks_per_principal: int = 65_536,
                 refused: Any = None) -> None:
        self.dispatcher = dispatcher
        self.max_groups = max_groups_per_stream
        #: The credit (checks owed) of one connection's streams together, and (auth on) of one
        #: principal's streams over all its connections (``refused``: its refusals counter).
        self.pending = CallerLimit(
            ConnectionLimit("max_pending_checks_per_connection", max_pending_checks_per_connection),
            PrincipalLimit("max_pending_checks_per_principal", max_pending_checks_per_principal, refused))
        #: What each stream's principal may still check, after a credentials reload.
        self.standing = Standing(dispatcher)

    # A grpc.aio stream answered through context.write(): the generated base declares only
    # handlers that return an iterator.
    async def CheckTransactionState(self,  # type: ignore[override]
                                    request_iterator: AsyncIterator[checker_pb2.CheckTransactionStateRequest],
                                    context: Any) -> None:
        requests = request_iterator.__aiter__()
        try:
            first = await requests.__anext__()
        except StopAsyncIteration:
            return
        client_id, groups, credit = validate_subscribe(first, self.max_groups)
        owed = min(credit or self.dispatcher.default_credit, self.dispatcher.queue_size)
        held = self.pending.take(context, owed)
        stream = self.dispatcher.subscribe(client_id, groups, credit)
        self.standing.watch(stream, CALLER.get())
        try:
            await self._serve(requests, context, stream, groups)
        finally:
            self.standing.forget(stream)
            self.pending.give_back(held, owed)

    async def _serve(self, requests: AsyncIterator[checker_pb2.CheckTransactionStateRequest], context: Any,
                     stream: ProducerStream, groups: tuple[str, ...]) -> None:
        ready = asyncio.Event()
        stream.set_waiter(ready.set)
        reader = asyncio.ensure_future(self._read(requests, stream))
        try:
            await context.write(checker_pb2.CheckTransactionStateResponse(subscribed=checker_pb2.Subscribed(
                checker_name=self.dispatcher.checker_name, producer_groups=groups)))
            while True:
                self.standing.revise()  # nothing written under rules since revoked
                response = stream.pop()
                if response is None:
                    if stream.closed:
                        break
                    ready.clear()
                    await ready.wait()
                    continue
                await context.write(response)
            # A request that did not decode (or carried a bad number) ends the stream with
            # its status (INVALID_ARGUMENT); a revoked right with PERMISSION_DENIED or
            # UNAUTHENTICATED.
            if reader.done() and not reader.cancelled() and (refused := reader.result()) is not None:
                raise refused
            if stream.refusal is not None:
                raise stream.refusal
        finally:
            reader.cancel()
            self.dispatcher.unsubscribe(stream)

    async def _read(self, requests: AsyncIterator[checker_pb2.CheckTransactionStateRequest],
                    stream: ProducerStream) -> TxmqError | None:
        refused: TxmqError | None = None
        try:
            async for request in requests:
                self._handle(request, stream)
                # Backpressure: a producer that reads none of the replies its requests
                # queue is read no further until it does.
                await stream.room.wait()
        except asyncio.CancelledError:
            raise
        except TxmqError as exc:
            refused = exc
        except Exception as exc:  # noqa: BLE001 - the producer went away mid-read
            log.debug("stream read ended", extra={"fields": {"stream": stream.id, "error": str(exc)[:200]}})
        # The producer half-closed (or is gone): end the stream.
        self.dispatcher.unsubscribe(stream)
        return refused

    def _handle(self, request: checker_pb2.CheckTransactionStateRequest, stream: ProducerStream) -> None:
        kind = request.WhichOneof("command")
        check_id = group = ""
        self.standing.revise()  # an answer for a group no longer allowed is not outstanding here
        try:
            if kind == "received":
                check_id = request.received.check_id
                self.dispatcher.received(stream, check_id)
            elif kind == "answer":
                answer = request.answer
                check_id, group = answer.check_id, answer.producer_group
                if answer.credit:
                    self.dispatcher.grant(stream, answer.credit)
                self.dispatcher.answered(stream, check_id, answer.result, answer.retry_after_seconds,
                                         transaction_id=answer.transaction_id, broker_name=answer.broker_name,
                                         producer_group=answer.producer_group)
            elif kind == "credit":
                self.dispatcher.grant(stream, request.credit.checks)
            elif kind == "drain":
                self.dispatcher.drain(stream)
            elif kind == "subscribe":
                raise InvalidFieldError("subscribe", "this stream is already subscribed; open another "
                                                     "stream to serve other groups")
            else:
                raise InvalidFieldError("command", "set received, answer, credit or drain")
        except TxmqError as error:
            self.dispatcher.refused(stream, check_id, error, answer=kind == "answer", producer_group=group)
