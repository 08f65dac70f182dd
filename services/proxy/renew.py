"""Push consumers' ``auto_renew``: the proxy keeps a delivery invisible while the client's
listener works on it (what RocketMQ's proxy ``ReceiptHandleProcessor`` does).

A PushConsumer's ReceiveMessage has ``auto_renew=true`` and no invisible duration. Each
delivery it gets is invisible for ``default_invisible_duration_seconds``, and registered
here under (client id, group, receipt handle). Every half invisible duration the proxy
calls ``ChangeInvisibleDuration`` on the broker with the delivery's newest handle, setting
the invisibility again, until:

- the client acknowledges it (AckMessage) or nacks it (ChangeInvisibleDuration): both
  arrive with the handle the client got; they end the renewal (waiting for a renewal
  already on the wire, so that it cannot land after a nack and undo its delay) and use the
  newest handle on the broker;
- the client goes away: NotifyClientTermination, or its last Telemetry stream on this
  replica ends;
- the broker no longer knows the delivery (acknowledged elsewhere, dead-lettered,
  redelivered): RECEIPT_HANDLE_EXPIRED or an invalid handle;
- ``auto_renew_max_seconds`` have passed since the delivery: the delivery then becomes
  visible at the end of its last invisibility and is redelivered (attempt + 1).

Per replica and in memory, like the client's connection: the official clients send every
call of one client over one connection (one replica). txmq receipt handles name the
delivery's attempt, not its deadline, so a renewed delivery keeps its handle and an ack or
nack that reaches another replica (with the original handle) is still valid on the broker.
A transient broker failure is retried after ``RETRY_SECONDS`` (within the delivery's
invisibility when possible).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

from txmq.errors import TxmqError

from services.common.aio import wait_event
from services.common.auth import act_for

from .config import ProxyConfig
from .metrics import ProxyMetrics
from .relay import Relay

log = logging.getLogger(__name__)

#: Delay before retrying a renewal the broker did not answer.
RETRY_SECONDS = 1.0
#: Reasons after which the delivery is gone (no point renewing again).
_GONE = {"RECEIPT_HANDLE_EXPIRED", "INVALID_ID", "WRONG_BROKER", "INVALID_FIELD", "INVALID_NAME"}

Key = tuple[str, str]  # (group, receipt handle as the client has it)


@dataclass
class Renewal:
    #: The client (``clients.ClientKey``: its principal and client id).
    client: Hashable
    group: str
    topic: str
    #: The handle the client holds (what its ack or nack will carry).
    original: str
    #: The newest handle the broker returned.
    current: str
    invisible_seconds: float
    #: Monotonic times: next renewal, end of renewing.
    next_at: float
    give_up_at: float
    renewals: int = 0
    inflight: asyncio.Task[None] | None = field(default=None, repr=False)
    #: The principal the renewals are for (the one that received the delivery).
    principal: str | None = None


class Renewer:
    def __init__(self, config: ProxyConfig, relay: Relay, metrics: ProxyMetrics,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.relay = relay
        self.metrics = metrics
        self.monotonic = monotonic
        self.renewals: dict[Key, Renewal] = {}
        #: Renewals per principal (``max_renewals_per_principal``).
        self.held: collections.Counter[str | None] = collections.Counter()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="auto-renew")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        pending = [r.inflight for r in self.renewals.values() if r.inflight is not None]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self.renewals.clear()
        self.held.clear()

    # --- what the servicer tells it ------------------------------------------------------

    def room(self, principal: str | None) -> int:
        """How many more deliveries may be renewed for ``principal``."""
        return max(self.config.max_renewals_per_principal - self.held[principal], 0)

    def _pop(self, key: Key) -> Renewal | None:
        renewal = self.renewals.pop(key, None)
        if renewal is not None:
            self.held[renewal.principal] -= 1
            if self.held[renewal.principal] <= 0:
                del self.held[renewal.principal]
        return renewal

    def add(self, client: Hashable, group: str, topic: str, handle: str, invisible_seconds: float,
            principal: str | None = None) -> None:
        """A delivery made with ``auto_renew``: renew it (for ``principal``) until the client
        is done with it."""
        if self.config.auto_renew_max_seconds <= 0:
            return
        now = self.monotonic()
        renewal = Renewal(client, group, topic, handle, handle, invisible_seconds,
                          next_at=now + self._interval(invisible_seconds),
                          give_up_at=now + self.config.auto_renew_max_seconds, principal=principal)
        old = self._pop((group, handle))
        if old is not None and old.inflight is not None:
            old.inflight.cancel()
        self.renewals[(group, handle)] = renewal
        self.held[principal] += 1
        self.metrics.renewing.set(len(self.renewals))
        self._wake.set()

    async def finish(self, group: str, handle: str, *, topic: str, principal: str | None) -> str:
        """The client acknowledged or nacked the delivery: stop renewing it. Returns the
        handle to use on the broker (the newest one; ``handle`` if it is not renewed here).

        Only the principal the renewals are for, naming the delivery's topic, ends them: the
        broker decides the call afterwards, and a call it refuses (another principal of the
        group without the topic's right, a topic that is not the handle's) must not have
        stopped the owner's renewals on the way (its delivery would be redelivered). Another
        caller's call goes to the broker with ``handle`` as sent (still valid there: a
        renewed delivery keeps its handle)."""
        renewal = self.renewals.get((group, handle))
        if renewal is None or renewal.topic != topic or renewal.principal != principal:
            return handle
        self._pop((group, handle))
        self.metrics.renewing.set(len(self.renewals))
        if renewal.inflight is not None:
            # Let a renewal already sent land first: it must not undo the client's nack.
            await asyncio.gather(asyncio.shield(renewal.inflight), return_exceptions=True)
        return renewal.current

    def client_gone(self, client: Hashable) -> None:
        """NotifyClientTermination, or the client's last Telemetry stream here ended."""
        gone = [k for k, r in self.renewals.items() if r.client == client]
        for key in gone:
            self._drop(key, "client_gone")

    # --- the renewing loop ---------------------------------------------------------------

    def _interval(self, invisible_seconds: float) -> float:
        return max(invisible_seconds / 2, 0.05)

    def _drop(self, key: Key, result: str) -> None:
        if self._pop(key) is not None:
            self.metrics.renewals.labels(result).inc()
            self.metrics.renewing.set(len(self.renewals))

    async def _run(self) -> None:
        while True:
            now = self.monotonic()
            wait = 1.0
            for key, renewal in list(self.renewals.items()):
                if renewal.inflight is not None:
                    continue
                if now >= renewal.give_up_at:
                    self._drop(key, "max_time")
                    continue
                if renewal.next_at <= now:
                    renewal.inflight = asyncio.create_task(self._renew(key, renewal))
                else:
                    wait = min(wait, renewal.next_at - now)
            self._wake.clear()
            await wait_event(self._wake, max(wait, 0.01))

    async def _renew(self, key: Key, renewal: Renewal) -> None:
        act_for(renewal.principal)  # this task's calls are for the principal the delivery was made to
        seconds = renewal.invisible_seconds
        try:
            handle = await self.relay.change_invisible(renewal.group, renewal.topic, renewal.current, seconds)
        except TxmqError as exc:
            if exc.reason in _GONE:
                log.debug("renewal ended: delivery gone", extra={"fields": {
                    "group": renewal.group, "reason": exc.reason}})
                if self.renewals.get(key) is renewal:
                    self._drop(key, "gone")
            else:
                self.metrics.renewals.labels("error").inc()
                renewal.next_at = self.monotonic() + min(RETRY_SECONDS, self._interval(seconds))
            return
        except Exception:  # keep renewing the others
            log.exception("renewal failed")
            self.metrics.renewals.labels("error").inc()
            renewal.next_at = self.monotonic() + RETRY_SECONDS
            return
        finally:
            renewal.inflight = None
            self._wake.set()
        renewal.current = handle or renewal.current
        renewal.renewals += 1
        renewal.next_at = self.monotonic() + self._interval(seconds)
        self.metrics.renewals.labels("ok").inc()
