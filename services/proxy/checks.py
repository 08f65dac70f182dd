"""Orphan recovery for the official clients: the proxy answers the checkers on behalf of the
transactional producers connected to it.

For each producer client with a live Telemetry stream and each live checker, the proxy
keeps one ``CheckTransactionState`` stream subscribed with the client's id and its
producer groups (= its published topics, see ``convert``)::

    checker ── CheckRequest ──▶ proxy ── RecoverOrphanedTransactionCommand ──▶ client's Telemetry
                                  │ written to the live stream ⇒ CheckReceived ──▶ checker
    client's TransactionChecker ── EndTransaction(SOURCE_SERVER_CHECK) ──▶ any proxy replica

The answer may reach any replica, so it is applied there directly: native
``EndTransaction`` with source CHECK to the broker the transaction id names (durable before
the client's call returns). The replica that holds the check then also sends the checker a
``CheckAnswer`` (so its metrics count an answer, not a timeout; the broker then refuses the
report as stale, since the transaction is already decided, and that refusal is ignored). A
replica that does not hold it sends nothing: the checker counts the check as unanswered
after its answer timeout, and the broker state is final already.

If the client has no live stream when a check comes, nothing is acknowledged: the checker
reports the check undelivered after its timeout and nothing is spent. A client's
subscriptions end when its last Telemetry stream ends or it announces its termination
(unacknowledged checks go back to the broker at once). A subscription holding checks
written to the client drains instead of ending: ``CheckDrain`` tells the checker to send
it nothing more and hand back what was not written, and the stream stays open until the
answers the client owes came (the official clients answer from their check thread pool
and may send the EndTransaction after they shut their Telemetry stream down) or were
forgotten; then it ends.

Flow control on the client's behalf: an official client announces no check capacity, so
each subscription grants ``CHECK_CREDIT_PER_CLIENT`` and gives one back when a check it
holds ends here — answered through this replica, answered ROLLBACK by the proxy itself
(an orphan of a send it moved), not written (no live stream), or forgotten
``PENDING_SLACK_SECONDS`` past its answer timeout (answered through another replica, or
never). A client that stops answering is thus sent at most that many checks
per checker until they are forgotten; the rest stay due in the broker.

One connection is sent at most ``max_pending_checks_per_connection`` checks at once (all its
clients and checkers together: a connection may carry many client ids), and one principal at
most ``max_pending_checks_per_principal`` over all its connections (auth on: each check is
kept here with its half message until it is over, and connections are the principal's to
multiply). A check that comes while its client's connection or principal is at its limit is
held back: not written and not acknowledged, so the checker counts it undelivered after its
answer timeout (nothing spent) and it stays due on the broker; the link's credit for it is
given back only once there is room again, so the checker sends no more meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import grpc

from txmq import tracing
from txmq.checking import Check, CheckStream, Refused, Subscribed, check_message
from txmq.v1 import checker_pb2, checker_pb2_grpc, common_pb2

from services.common.aio import wait_event
from services.common.auth import act_for
from services.common.limits import ConnectionLimit, PrincipalLimit, principal_key

from .clients import ClientKey, ClientRegistry, TelemetryStream
from .config import ProxyConfig
from .convert import check_to_rmq
from .metrics import ProxyMetrics
from .protocol import service_pb2
from .upstream import Upstream

log = logging.getLogger(__name__)

#: Kept this long past a check's answer timeout, for a late EndTransaction.
PENDING_SLACK_SECONDS = 30.0
#: Checks one client's subscription at one checker may hold (see the module docstring).
CHECK_CREDIT_PER_CLIENT = 32

Request = checker_pb2.CheckTransactionStateRequest


@dataclass(slots=True)
class _Pending:
    """A check offered to a client here: registered before it is written, since the
    client's answer may come back (an EndTransaction) before the write's callback runs."""

    link: "CheckerLink"
    check: checker_pb2.CheckRequest
    forget_after: float
    #: The connection of the client's stream it was offered on (counted against its limit).
    peer: str
    #: The principal of that stream (counted against its limit; None: not counted).
    principal: str | None = None
    #: Its write to the client's stream began: the client may hold it from then on, even if
    #: the stream ends before the write's completion is seen (so its answer is still owed).
    writing: bool = False
    #: Written to the client's stream (CheckReceived sent).
    written: bool = False


class CheckerLink:
    """One client's subscription at one checker; reopened with backoff until closed. The
    stream itself (its Subscribe, sessions, response kinds, reconnect backoff) is the SDK's
    check-stream core (``txmq.checking.CheckStream``); what this relay does with checks and
    answers is its own (see the module's docstring)."""

    def __init__(self, manager: "CheckManager", address: str, client: ClientKey, groups: tuple[str, ...]) -> None:
        self.manager = manager
        self.address = address
        self.client = client
        self.client_id = client.client_id
        self.groups = groups
        self.closed = False
        #: Sent CheckDrain: only answers to checks already written go on this link.
        self.draining = False
        #: Credit held back from the checker while the client's connection (``held_on``)
        #: is at max_pending_checks_per_connection (or its principal at the per-principal limit).
        self.withheld = 0
        self.held_on = ""
        self.stream = CheckStream(address, address, producer_groups=groups, client_id=client.client_id,
                                  credit=CHECK_CREDIT_PER_CLIENT)
        self._outbox: asyncio.Queue[Request | None] | None = None
        self._task = asyncio.create_task(self._run(), name=f"check-link-{client.client_id}@{address}")

    def send(self, request: Request) -> None:
        if not self.closed:
            self.stream.send(request)

    def drain(self) -> None:
        """No more checks for this link; it stays open for the answers owed on it."""
        self.draining = True
        self.send(Request(drain=checker_pb2.CheckDrain()))

    @staticmethod
    async def _requests(outbox: "asyncio.Queue[Request | None]") -> AsyncIterator[Request]:
        while True:
            item = await outbox.get()
            if item is None:
                return
            yield item

    async def _run(self) -> None:
        # Subscribed for the client's principal: the checker decides which groups it may
        # serve, as for a native producer (``services.common.auth.delegation``).
        act_for(self.client.principal)
        stream = self.stream
        stub = checker_pb2_grpc.CheckerServiceStub(self.manager.upstream.channel(self.address))
        while not self.closed:
            outbox: asyncio.Queue[Request | None] = asyncio.Queue()
            self._outbox = outbox
            session, subscribe = stream.open(outbox.put_nowait)
            outbox.put_nowait(subscribe)
            call = stub.CheckTransactionState(self._requests(outbox))
            try:
                async for response in call:
                    event = stream.classify(response, session)
                    if type(event) is Check:
                        self.manager.deliver(self, event.check)
                    elif type(event) is Subscribed:
                        if stream.subscribed(event.checker_name):
                            log.info("checker reachable again", extra={"fields": {"checker": self.address}})
                    elif type(event) is Refused:
                        log.debug("checker refused a request", extra={"fields": {
                            "checker": self.address, "client_id": self.client_id,
                            "reason": response.error.reason, "error": response.error.message[:200]}})
            except grpc.aio.AioRpcError as exc:
                if self.closed:
                    return
                if stream.failed():
                    log.warning("check stream failed, reopening", extra={"fields": {
                        "checker": self.address, "client_id": self.client_id, "code": exc.code().name,
                        "error": str(exc.details())[:200]}})
            finally:
                stream.end()
                outbox.put_nowait(None)
                self._outbox = None
            if self.closed or self.draining:  # a reopened stream would subscribe again
                self.closed = True
                return
            await asyncio.sleep(stream.backoff.pause())

    async def close(self) -> None:
        """Half-closes the stream (the checker hands unacknowledged checks back at once)."""
        self.closed = True
        if self._outbox is not None:
            self._outbox.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 0.5)
        except (TimeoutError, asyncio.CancelledError):
            pass
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class CheckManager:
    def __init__(self, config: ProxyConfig, upstream: Upstream, registry: ClientRegistry,
                 metrics: ProxyMetrics, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.upstream = upstream
        self.registry = registry
        self.metrics = metrics
        self.monotonic = monotonic
        self.links: dict[tuple[ClientKey, str], CheckerLink] = {}
        #: Links whose client left while owing answers (closed once nothing is owed).
        self.draining: set[CheckerLink] = set()
        #: transaction id → the check offered to a client here.
        self.pending: dict[str, _Pending] = {}
        #: Checks offered and not yet over, per client connection.
        self.per_connection = ConnectionLimit("max_pending_checks_per_connection",
                                              config.max_pending_checks_per_connection)
        #: ... and per principal, all its connections together.
        self.per_principal = PrincipalLimit("max_pending_checks_per_principal", config.max_pending_checks_per_principal)
        self._dirty: set[ClientKey] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        registry.on_change.append(self.client_changed)
        upstream.on_checkers_changed.append(self.checkers_changed)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="check-subscriptions")

    def client_changed(self, client: ClientKey) -> None:
        self._dirty.add(client)
        self._wake.set()

    def checkers_changed(self) -> None:
        self._dirty.update(self.registry.producers())
        self._dirty.update(c for c, _ in self.links)
        self._wake.set()

    async def _run(self) -> None:
        sweep = min(self.config.directory_refresh_seconds, 1.0)
        while True:
            await wait_event(self._wake, sweep)
            self._wake.clear()
            self.registry.revise()  # rights revoked since: the clients' topics first
            dirty, self._dirty = self._dirty, set()
            for client in dirty:
                await self._sync(client)
            self._expire()
            self._refill()
            await self._close_drained()
            self.registry.sweep()
            self.metrics.subscriptions.set(len(self.links))
            for client_type, count in self.registry.stream_count().items():
                self.metrics.streams.labels(str(client_type)).set(count)

    async def _sync(self, client: ClientKey) -> None:
        """Makes the client's links match its topics and the live checkers."""
        topics = self.registry.producers().get(client, ())
        groups = tuple(topics[: self.config.max_groups_per_client])
        wanted = set(self.upstream.checkers) if groups else set()
        for (cid, address), link in list(self.links.items()):
            if cid != client:
                continue
            if address not in wanted or link.groups != groups:
                del self.links[(cid, address)]
                for txn, entry in list(self.pending.items()):
                    if entry.link is link and not entry.writing:  # never sent: the checker hands these back
                        self._drop(txn)
                if self._owes(link):
                    link.drain()
                    self.draining.add(link)
                else:
                    await link.close()
        for address in wanted:
            if (client, address) not in self.links:
                self.links[(client, address)] = CheckerLink(self, address, client, groups)

    def _owes(self, link: CheckerLink) -> bool:
        """Checks written to the client through this link are still waiting for answers."""
        return any(entry.link is link for entry in self.pending.values())

    def _drop(self, transaction_id: str) -> _Pending | None:
        """Forgets the check offered for a transaction; its connection has room again."""
        entry = self.pending.pop(transaction_id, None)
        if entry is not None:
            self.per_connection.give_back(entry.peer)
            if entry.principal is not None:
                self.per_principal.give_back(entry.principal)
            self._refill(entry.peer, entry.principal)
        return entry

    def _has_room(self, stream: TelemetryStream, replaced: _Pending | None = None) -> bool:
        """Whether one more check may be written to ``stream``: its connection and its
        principal are under their limits (``replaced``: the check it replaces, given back)."""
        if self.per_connection.available(stream.peer) == 0 and not (replaced is not None and replaced.peer == stream.peer):
            return False
        principal = principal_key(stream.caller)
        return principal is None or self.per_principal.available(principal) > 0 or (
            replaced is not None and replaced.principal == principal)

    def _refill(self, peer: str | None = None, principal: str | None = None) -> None:
        """Gives the checkers back the credit held back for connections (``peer``, or all)
        and principals (``principal``) that have room again, or whose client left (its checks
        go elsewhere then)."""
        for link in [*self.links.values(), *self.draining]:
            if not link.withheld or (peer is not None and link.held_on != peer and (
                    principal is None or link.client.principal != principal)):
                continue
            stream = self.registry.stream_for(link.client, link.groups[0]) if link.groups else None
            if stream is not None and stream.peer == link.held_on and not self._has_room(stream):
                continue
            link.send(Request(credit=checker_pb2.CheckCredit(checks=link.withheld)))
            link.withheld = 0

    async def _close_drained(self) -> None:
        for link in [link for link in self.draining if link.closed or not self._owes(link)]:
            self.draining.discard(link)
            await link.close()

    def deliver(self, link: CheckerLink, check: checker_pb2.CheckRequest) -> None:
        """A check from ``link``'s checker for its client, traced as a check of the half
        message (``txmq.tracing``: a child of the client's send when its message carries the
        trace context) whose result says what the relay did with it."""
        with tracing.check(check_message(check, link.address), check.message.producer_group) as traced:
            outcome = self._deliver(link, check)
            traced.set({"txmq.check.result": outcome, "messaging.client.id": link.client_id})

    def _deliver(self, link: CheckerLink, check: checker_pb2.CheckRequest) -> str:
        if link.draining:  # sent before the checker read the drain; it hands the check back
            self.metrics.checks.labels("no_stream").inc()
            return "no_stream"
        orphan = (check.broker_name, check.message.message_id)
        if orphan in self.upstream.abandoned:
            # An orphan of a send this replica moved to another shard: its local transaction
            # never ran, and the client would find its message id committed (elsewhere).
            # Noted before the answer leaves: a repeat of this half that reaches the broker
            # before the answer does must not be told as a success (relay.send).
            self.upstream.orphans_rolled_back.add(orphan)
            link.send(Request(received=checker_pb2.CheckReceived(check_id=check.check_id)))
            link.send(Request(answer=checker_pb2.CheckAnswer(check_id=check.check_id,
                                                             result=common_pb2.CHECK_RESULT_ROLLBACK, credit=1)))
            self.metrics.checks.labels("orphan_rolled_back").inc()
            return "orphan_rolled_back"
        stream = self.registry.stream_for(link.client, check.message.topic)
        if stream is None:
            self.metrics.checks.labels("no_stream").inc()
            link.send(Request(credit=checker_pb2.CheckCredit(checks=1)))
            return "no_stream"
        # A check of a transaction offered here already replaces it: no more held.
        if not self._has_room(stream, self.pending.get(check.transaction_id)):
            # Held back: neither written nor acknowledged (the checker hands it back to the
            # broker after its answer timeout, nothing spent); its credit waits for room.
            link.withheld += 1
            link.held_on = stream.peer
            self.metrics.checks.labels("held_back").inc()
            log.debug("check held back", extra={"fields": {
                "client_id": link.client_id, "peer": stream.peer, "transaction_id": check.transaction_id,
                "limit": f"max_pending_checks_per_connection={self.per_connection.limit}, "
                         f"max_pending_checks_per_principal={self.per_principal.limit}"}})
            return "held_back"
        command = service_pb2.TelemetryCommand(
            recover_orphaned_transaction_command=service_pb2.RecoverOrphanedTransactionCommand(
                message=check_to_rmq(check.message), transaction_id=check.transaction_id))
        entry = _Pending(link, check, self.monotonic() + check.answer_timeout_seconds + PENDING_SLACK_SECONDS,
                         stream.peer, principal_key(stream.caller))

        def written() -> None:
            # A check counts as received once written to a live Telemetry stream (unless
            # it was answered already, which counts as both, or handed back by a drain).
            if self.pending.get(check.transaction_id) is not entry:
                return
            entry.written = True
            link.send(Request(received=checker_pb2.CheckReceived(check_id=check.check_id)))
            self.metrics.checks.labels("forwarded").inc()

        def writing() -> None:
            entry.writing = True

        if not stream.offer(command, written, writing):
            self.metrics.checks.labels("no_stream").inc()
            link.send(Request(credit=checker_pb2.CheckCredit(checks=1)))
            return "no_stream"
        previous = self._drop(check.transaction_id)
        if previous is not None:  # checked again: the earlier check is over
            previous.link.send(Request(credit=checker_pb2.CheckCredit(checks=1)))
        self.per_connection.take(stream.peer)
        if entry.principal is not None:
            self.per_principal.take(entry.principal)
        self.pending[check.transaction_id] = entry
        self.metrics.checks_pending.set(len(self.pending))
        return "offered"


    def answered(self, transaction_id: str, result: common_pb2.CheckResult.ValueType) -> bool:
        """The client answered a check through this replica (already applied on the
        broker); tells the checker if the check was sent from here. ``result`` is a
        ``txmq.v1.CheckResult``."""
        entry = self._drop(transaction_id)
        if entry is None:
            return False
        link, check = entry.link, entry.check
        # Naming the transaction: the answer counts even if the link's stream was opened
        # again meanwhile (the broker accepts it as it is: already decided the same way).
        link.send(Request(answer=checker_pb2.CheckAnswer(
            check_id=check.check_id, result=result, transaction_id=check.transaction_id,
            broker_name=check.broker_name, producer_group=check.message.producer_group, credit=1)))
        if link.draining:
            self._wake.set()  # closed by the loop once it owes nothing
        return True

    def _expire(self) -> None:
        now = self.monotonic()
        for txn, entry in list(self.pending.items()):
            if entry.forget_after <= now or entry.link.closed:
                self._drop(txn)
                entry.link.send(Request(credit=checker_pb2.CheckCredit(checks=1)))
        self.metrics.checks_pending.set(len(self.pending))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        links, self.links = [*self.links.values(), *self.draining], {}
        self.draining = set()
        await asyncio.gather(*(link.close() for link in links))
