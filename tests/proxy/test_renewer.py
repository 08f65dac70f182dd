"""The proxy's in-process parts around the brokers: auto renewal of push deliveries
(``renew.Renewer``, against a fake relay) and the limits fallback (``Upstream``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from services.proxy.config import ProxyConfig
from services.proxy.metrics import ProxyMetrics
from services.proxy.renew import Renewer
from services.proxy.upstream import Upstream
from txmq.errors import ReceiptHandleNotFoundError, UnavailableError


class FakeRelay:
    """Renews by returning ``<handle>'``; fails as told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, float]] = []
        self.fail: dict[str, Exception] = {}

    async def change_invisible(self, group: str, topic: str, handle: str, seconds: float) -> str:
        self.calls.append((group, topic, handle, seconds))
        error = self.fail.get(handle.rstrip("'"))
        if error is not None:
            raise error
        return handle + "'"


async def until(predicate: Callable[[], Any], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def run(test: Callable[[Renewer, FakeRelay], Awaitable[None]], **config: Any) -> None:
    async def main() -> None:
        relay = FakeRelay()
        renewer = Renewer(ProxyConfig(nameserver_addresses=("127.0.0.1:1",), **config), relay,  # type: ignore[arg-type]
                          ProxyMetrics())
        renewer.start()
        try:
            await test(renewer, relay)
        finally:
            await renewer.stop()
    asyncio.run(main())


def test_renews_with_the_newest_handle_until_finished() -> None:
    async def test(renewer: Renewer, relay: FakeRelay) -> None:
        renewer.add("c1", "g", "t", "h1", 0.1)
        await until(lambda: len(relay.calls) >= 3)
        assert [c[2] for c in relay.calls[:3]] == ["h1", "h1'", "h1''"]
        assert all(c[:2] == ("g", "t") and c[3] == 0.1 for c in relay.calls)
        # The client's ack carries the handle it got; the broker gets the newest one.
        # Another principal's call, or one naming another topic, ends nothing (the broker
        # refuses it, or takes the handle as sent).
        assert await renewer.finish("g", "h1", topic="t", principal="p2") == "h1"
        assert await renewer.finish("g", "h1", topic="t2", principal=None) == "h1"
        assert ("g", "h1") in renewer.renewals
        newest = await renewer.finish("g", "h1", topic="t", principal=None)
        assert newest.startswith("h1'") and newest == relay.calls[-1][2] + "'"
        assert await renewer.finish("g", "h1", topic="t", principal=None) == "h1"  # no longer renewed: unchanged
        count = len(relay.calls)
        renewer.add("c1", "g", "t", "h2", 0.1)  # renewals go on for the others only
        await until(lambda: any(c[2].startswith("h2") for c in relay.calls[count:]))
        assert not any(c[2].startswith("h1") for c in relay.calls[count:])
    run(test)


def test_stops_when_the_client_goes_away_the_delivery_is_gone_or_time_is_up() -> None:
    async def test(renewer: Renewer, relay: FakeRelay) -> None:
        relay.fail["gone"] = ReceiptHandleNotFoundError("gone")
        relay.fail["flaky"] = UnavailableError("broker down")
        renewer.add("c1", "g", "t", "mine", 0.1)
        renewer.add("c2", "g", "t", "other", 0.1)
        renewer.add("c2", "g", "t", "gone", 0.1)
        renewer.add("c2", "g", "t", "flaky", 0.1)
        await until(lambda: ("g", "gone") not in renewer.renewals)
        await until(lambda: sum(c[2] == "flaky" for c in relay.calls) >= 2)  # retried
        renewer.client_gone("c1")
        assert set(renewer.renewals) == {("g", "other"), ("g", "flaky")}
        # auto_renew_max_seconds: 0.5 s after the delivery, renewing ends.
        await until(lambda: not renewer.renewals, 5.0)
    run(test, auto_renew_max_seconds=0.5)


def test_limits_fall_back_to_the_configuration_while_no_broker_answers() -> None:
    async def main() -> None:
        upstream = Upstream(ProxyConfig(nameserver_addresses=("127.0.0.1:1",), max_body_bytes=1234,
                                        max_delivery_attempts=7, rpc_timeout_seconds=0.5))
        try:
            upstream.brokers = {"broker-0": "127.0.0.1:1"}  # nothing listens there
            limits = await upstream.refresh_limits()
            assert (limits.max_body_bytes, limits.max_delivery_attempts, limits.source) == (1234, 7, "config")
        finally:
            await upstream.stop()
    asyncio.run(main())
