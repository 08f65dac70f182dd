"""The checker's side of the brokers: which brokers are live (from the name servers), and
per broker a claim loop and a reporter.

A claim loop asks its broker for due checks in a claim session: the groups served (with
their producers' capacity) are sent only when they change, and each claim names only the
groups whose free credit is below their capacity, with that free credit as their limit
(split between the brokers). So a group whose producers are busy is not claimed for (its
checks stay due in the broker), and a claim costs nothing per idle group. A claim runs
every ``claim_interval_seconds``, at once when a group's free credit reaches half its
capacity, and again at once when the broker says more is due. A claim that finds nothing
due is held on the broker (up to ``claim_wait_seconds``) until a check of the groups may
fall due, so an idle checker claims about once per wait. The claim is atomic and
leased on the broker, so replicas of the checker need no coordination: a check claimed by
one is not handed to another until its lease ends.

A reporter sends the reports about that broker's checks in batches (``ReportChecks``), one
call at a time so a check's DELIVERED always reaches the broker before its ANSWERED.
Reports it cannot deliver (the broker is down, or its shard failing over) are parked and
go to the shard's next address: a late answer still decides the transaction there.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
from typing import Callable

import grpc

from services.common.aio import wait_event
from services.common.channels import ChannelPool, open_channel
from txmq.errors import BrokerNotFoundError, TxmqError, error_from_entry, error_from_rpc
from txmq.v1 import broker_pb2, broker_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc

from .config import CheckerConfig
from .dispatcher import Dispatcher

log = logging.getLogger(__name__)

#: Attempts of one ReportChecks batch before it is dropped (the lease then makes the
#: checks due again on the broker).
REPORT_ATTEMPTS = 3
#: Reports kept per shard while it has no reachable leader.
MAX_PARKED_REPORTS = 10_000
#: How long the first report of a batch waits for others.
REPORT_LINGER_SECONDS = 0.005

OnError = Callable[[TxmqError], None] | None


class BrokerLink:
    def __init__(self, name: str, address: str, config: CheckerConfig, dispatcher: Dispatcher,
                 on_unavailable: Callable[[], None] = lambda: None,
                 reroute: Callable[[str, list[tuple[broker_pb2.CheckReport, OnError]]], None] | None = None,
                 shares: Callable[[], int] = lambda: 1) -> None:
        #: Called when the broker is unreachable or no longer leads its shard: the
        #: directory looks at the name servers again at once (a fail-over moved it).
        self._on_unavailable = on_unavailable
        #: Reports this link could not deliver go back to the directory, which sends them
        #: to the shard's current address (None: dropped; the lease makes them due again).
        self._reroute = reroute
        #: How many brokers share the producers' credit (each claim asks for its share).
        self.shares = shares
        self.session_id = f"{config.checker_name}/{name}/{os.urandom(6).hex()}"
        self._groups_version = 0
        self._sent_key: tuple[int, int] | None = None
        self.name = name
        self.address = address
        self.config = config
        self.dispatcher = dispatcher
        self.channel = open_channel(address, config.max_grpc_message_bytes)
        self.stub = broker_pb2_grpc.BrokerServiceStub(self.channel)
        self._reports: collections.deque[tuple[broker_pb2.CheckReport, OnError]] = collections.deque()
        self._in_flight: list[tuple[broker_pb2.CheckReport, OnError]] = []
        self._report_ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._failing = False
        self._sending = False

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._claim_loop(), name=f"claim-{self.name}"),
                       asyncio.create_task(self._report_loop(), name=f"report-{self.name}")]

    def wake(self) -> None:
        self._wake.set()

    def report(self, report: broker_pb2.CheckReport, on_error: OnError = None) -> None:
        self._reports.append((report, on_error))
        self._report_ready.set()

    def take_unsent(self) -> list[tuple[broker_pb2.CheckReport, OnError]]:
        """After stop: the reports not sent, and the answers of a batch cut off in flight
        (a repeated answer changes nothing; a repeated DELIVERED would spend twice)."""
        unsent = [r for r in self._in_flight if r[0].outcome == broker_pb2.CHECK_OUTCOME_ANSWERED]
        unsent += self._reports
        self._reports.clear()
        self._in_flight = []
        return unsent

    async def stop(self, flush_seconds: float = 0.0) -> None:
        """Stops claiming; sends the reports queued so far (up to ``flush_seconds``)."""
        if self._tasks:
            self._tasks[0].cancel()
            if flush_seconds > 0 and (self._reports or self._sending):
                loop = asyncio.get_running_loop()
                deadline = loop.time() + flush_seconds
                while (self._reports or self._sending) and loop.time() < deadline:
                    await asyncio.sleep(0.01)
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.channel.close()

    # --- claims --------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        while True:
            again = False
            # Cleared before the claim: credit granted while it runs wakes the next one.
            self._wake.clear()
            started = loop.time()
            if self.dispatcher.credit.total_free > 0:
                try:
                    again = await self._claim()
                except grpc.aio.AioRpcError as exc:
                    self._failed("claim", error_from_rpc(exc))
                    self._sent_key = None
                else:
                    self._recovered()
            if again:
                await asyncio.sleep(0)  # more is due and there is credit: claim again at once
                continue
            # A claim the broker held has waited already; one answered at once (something
            # due but no credit, an older broker, a failure) waits out the interval here.
            await wait_event(self._wake, max(cfg.claim_interval_seconds - (loop.time() - started), 0.0))

    async def _claim(self) -> bool:
        """One claim in this link's session; True when it should be followed at once."""
        cfg = self.config
        dispatcher = self.dispatcher
        shares = max(self.shares(), 1)
        limits = dispatcher.credit.claim_limits(shares)
        request = broker_pb2.ClaimChecksRequest(
            max_checks=cfg.claim_batch, lease_seconds=cfg.lease_seconds, checker_id=cfg.checker_name,
            session_id=self.session_id, wait_ms=int(cfg.claim_wait_seconds * 1000),
            limits=[broker_pb2.ClaimGroup(producer_group=g, max_checks=n) for g, n in limits.items()])
        key = (dispatcher.membership.version, shares)
        if key != self._sent_key:
            self._groups_version += 1
            request.groups.extend(broker_pb2.ClaimGroup(producer_group=g, max_checks=n)
                                  for g, n in dispatcher.credit.claim_groups(shares).items())
        request.groups_version = self._groups_version
        response = await self.stub.ClaimChecks(request, timeout=cfg.rpc_timeout_seconds + cfg.claim_wait_seconds)
        if response.groups_needed:
            self._sent_key = None  # the broker forgot the session: send the groups again
            return True
        if request.groups:
            self._sent_key = key
        if response.tasks:
            dispatcher.dispatch(self.name, response.tasks)
        dispatcher.credit.claimed(response.tasks, limits, shares)
        if dispatcher.credit.total_free <= 0:
            return False
        return response.more_due or len(response.tasks) >= cfg.claim_batch or dispatcher.credit.backlog_has_credit()

    def _failed(self, what: str, error: TxmqError) -> None:
        if error.retryable:
            self._on_unavailable()
        if not self._failing:
            self._failing = True
            log.warning("broker call failed", extra={"fields": {
                "broker": self.name, "address": self.address, "call": what, "error": str(error)[:300]}})

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            log.info("broker reachable again", extra={"fields": {"broker": self.name}})

    # --- reports -------------------------------------------------------------------------

    async def _report_loop(self) -> None:
        cfg = self.config
        while True:
            await self._report_ready.wait()
            self._report_ready.clear()
            if len(self._reports) < cfg.report_batch:
                # A few milliseconds gather the reports of checks answered together into one
                # call (one write on the broker) instead of one call each.
                await asyncio.sleep(REPORT_LINGER_SECONDS)
            while self._reports:
                batch = [self._reports.popleft() for _ in range(min(len(self._reports), cfg.report_batch))]
                self._sending = True
                self._in_flight = batch  # left set if cancelled: take_unsent() hands its answers on
                try:
                    await self._send(batch)
                finally:
                    self._sending = False
                self._in_flight = []

    async def _send(self, batch: list[tuple[broker_pb2.CheckReport, OnError]]) -> None:
        cfg = self.config
        request = broker_pb2.ReportChecksRequest(reports=[r for r, _ in batch], checker_id=cfg.checker_name)
        for attempt in range(1, REPORT_ATTEMPTS + 1):
            try:
                response = await self.stub.ReportChecks(request, timeout=cfg.rpc_timeout_seconds)
                break
            except grpc.aio.AioRpcError as exc:
                error = error_from_rpc(exc)
                if error.retryable:
                    self._on_unavailable()
                if not error.retryable or attempt == REPORT_ATTEMPTS:
                    if error.retryable and self._reroute is not None:
                        # The shard may have a new leader by now: the directory sends them there.
                        self._reroute(self.name, batch)
                        return
                    # Dropped: the claims' leases make these checks due again on the broker
                    # (an answer dropped here is asked for again).
                    log.warning("check reports dropped", extra={"fields": {
                        "broker": self.name, "reports": len(batch), "error": str(error)[:300]}})
                    for report, _ in batch:
                        if report.outcome == broker_pb2.CHECK_OUTCOME_ANSWERED:
                            self.dispatcher.metrics.answer_refused(report.producer_group, "unavailable")
                    return
                await asyncio.sleep(cfg.claim_interval_seconds * attempt)
        self._recovered()
        metrics = self.dispatcher.metrics
        for entry, status, late in itertools.zip_longest(batch, response.entries, response.late):
            if entry is None or status is None:
                break
            report, on_error = entry
            if late:
                metrics.late_answer(report.producer_group)
            if status.code == 0:
                continue
            error = error_from_entry(status)
            log.debug("check report refused", extra={"fields": {
                "broker": self.name, "transaction_id": report.transaction_id,
                "outcome": broker_pb2.CheckOutcome.Name(report.outcome), "reason": error.reason}})
            if on_error is not None:
                on_error(error)


class BrokerDirectory:
    """The live brokers, listed on every name server every ``broker_refresh_seconds``; a
    link per broker, started when it joins and stopped when it leaves. Also the reporter
    the dispatcher uses (reports go to the link of the broker that was claimed from)."""

    def __init__(self, config: CheckerConfig, dispatcher: Dispatcher) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.links: dict[str, BrokerLink] = {}
        self._channels = ChannelPool()
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()
        self._kick = asyncio.Event()
        #: Reports waiting for their shard to be reachable again (by shard name).
        self._parked: dict[str, list[tuple[broker_pb2.CheckReport, OnError]]] = {}
        dispatcher.membership.on_groups_changed.append(self._wake_all)

    def _wake_all(self) -> None:
        for link in self.links.values():
            link.wake()

    def report(self, broker: str, report: broker_pb2.CheckReport, on_error: OnError = None) -> None:
        link = self.links.get(broker)
        if link is None and broker in self._parked:  # its shard is failing over
            self._reroute(broker, [(report, on_error)])
            return
        if link is None:
            # The broker left (its lease makes the check due again when it is back), or a
            # late answer names a broker this checker does not know.
            log.debug("report for a broker not linked", extra={"fields": {"broker": broker}})
            if on_error is not None:
                on_error(BrokerNotFoundError(broker))
            return
        link.report(report, on_error)

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="broker-refresh")

    def kick(self) -> None:
        """Look at the name servers now (a broker failed: its shard may have a new leader)."""
        self._kick.set()

    def _reroute(self, broker: str, batch: list[tuple[broker_pb2.CheckReport, OnError]]) -> None:
        parked = self._parked.setdefault(broker, [])
        parked.extend(batch)
        if len(parked) > MAX_PARKED_REPORTS:
            # The shard stays away: its claims' leases make these checks due again anyway.
            log.warning("check reports dropped", extra={"fields": {
                "broker": broker, "reports": len(parked) - MAX_PARKED_REPORTS, "error": "shard unreachable"}})
            del parked[:len(parked) - MAX_PARKED_REPORTS]
        self.kick()

    async def _run(self) -> None:
        while True:
            if await wait_event(self._kick, self.config.broker_refresh_seconds):
                await asyncio.sleep(min(0.1, self.config.broker_refresh_seconds))  # let the routes settle
            self._kick.clear()
            await self.refresh()

    @property
    def _stubs(self) -> "dict[str, nameserver_pb2_grpc.NameServerServiceAsyncStub]":
        # From the pool at each use: it opens new channels when the TLS files change.
        return {a: nameserver_pb2_grpc.NameServerServiceStub(self._channels.get(a))
                for a in self.config.nameserver_addresses}

    async def _list(self, address: str) -> list[nameserver_pb2.BrokerInfo] | None:
        try:
            response = await self._stubs[address].ListBrokers(nameserver_pb2.ListBrokersRequest(),
                                                              timeout=self.config.rpc_timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            if address not in self._failing:
                self._failing.add(address)
                log.warning("name server unreachable", extra={"fields": {"nameserver": address,
                                                                          "error": str(exc.details())[:200]}})
            return None
        self._failing.discard(address)
        return list(response.brokers)

    async def refresh(self) -> None:
        answers = await asyncio.gather(*(self._list(a) for a in self._stubs))
        if all(a is None for a in answers):
            return  # keep what we know until a name server answers
        live: dict[str, nameserver_pb2.BrokerInfo] = {}
        for brokers in answers:
            for info in brokers or ():
                known = live.get(info.name)
                # A replicated shard: the leader of the newest epoch any name server routes.
                if known is None or (info.leader_epoch, info.last_heartbeat_ms) > (
                        known.leader_epoch, known.last_heartbeat_ms):
                    live[info.name] = info
        moved: dict[str, list[tuple[broker_pb2.CheckReport, OnError]]] = {}
        for name, link in list(self.links.items()):
            current = live.get(name)
            if current is None or current.address != link.address:
                del self.links[name]
                log.info("broker left", extra={"fields": {"broker": name, "address": link.address}})
                await link.stop()
                # Reports not yet sent go to the shard's next address (its new leader).
                moved[name] = link.take_unsent()
        for name, info in sorted(live.items()):
            if name not in self.links:
                link = BrokerLink(name, info.address, self.config, self.dispatcher, self.kick, self._reroute,
                                  shares=lambda: len(self.links))
                self.links[name] = link
                link.start()
                log.info("broker joined", extra={"fields": {"broker": name, "address": info.address}})
        for name in list(self._parked) + list(moved):
            serving = self.links.get(name)
            if serving is not None:
                for report, on_error in [*self._parked.pop(name, []), *moved.pop(name, [])]:
                    serving.report(report, on_error)
            else:
                self._parked.setdefault(name, []).extend(moved.pop(name, []))

    async def stop(self, flush_seconds: float = 1.0) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.stop(flush_seconds) for link in links))
        await self._channels.close()
