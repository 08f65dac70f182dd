"""The proxy's check relay when a client leaves while a check's write to it is under way.

The official clients may read a check, close their Telemetry stream and answer from their
check thread pool. On a busy proxy the stream can end after the check reached the client
but before the writer coroutine saw its write complete (its task is cancelled with the
stream): the check was never marked written. It must still count as owed, so the answer
that follows reaches the checker as the answer to it (found under load in
tests/proxy/test_replicas.py: the check was forgotten and its answer went nowhere).

Real objects throughout (registry, upstream, check manager); the one checker address is
an unused port, so the check link's stream only retries: what is asserted is the proxy's
own bookkeeping, which decides whether the answer is relayed. Also the checks held back
per principal (``max_pending_checks_per_principal``), over all its connections.
"""

from __future__ import annotations

import asyncio

from txmq.v1 import checker_pb2, common_pb2

from services.common.auth import Caller
from services.common.auth.store import Principal
from services.proxy.checks import CheckManager
from services.proxy.clients import ClientKey, ClientRegistry
from services.proxy.config import ProxyConfig
from services.proxy.metrics import ProxyMetrics
from services.proxy.protocol import definition_pb2
from services.proxy.upstream import Upstream

TOPIC = "orders"
CLIENT = ClientKey(None, "client-1")


def _check(transaction_id: str) -> checker_pb2.CheckRequest:
    return checker_pb2.CheckRequest(
        check_id=f"check-{transaction_id}", transaction_id=transaction_id, broker_name="broker-0",
        answer_timeout_seconds=2.0,
        message=common_pb2.Message(topic=TOPIC, message_id=f"m-{transaction_id}", producer_group=TOPIC))


async def _scenario(write_completes: bool) -> tuple[bool, bool]:
    """A check offered to the client, its write started (and completed or not), then the
    client's last stream ends. Returns (the link drains rather than closing, the client's
    answer is relayed as the answer to that check)."""
    upstream = Upstream(ProxyConfig(nameserver_addresses=("127.0.0.1:1",)))
    upstream.checkers = {"127.0.0.1:1": "checker-0"}
    registry = ClientRegistry(idle_expiry_seconds=60.0)
    manager = CheckManager(ProxyConfig(nameserver_addresses=("127.0.0.1:1",)), upstream, registry, ProxyMetrics())
    try:
        stream = registry.open_stream(CLIENT, "peer-1")
        settings = definition_pb2.Settings(publishing=definition_pb2.Publishing(
            topics=[definition_pb2.Resource(name=TOPIC)]))
        registry.update_settings(stream, settings)
        await manager._sync(CLIENT)  # the manager's loop step, run by hand
        link = manager.links[(CLIENT, "127.0.0.1:1")]

        manager.deliver(link, _check("t1"))
        item = await stream.next()
        assert item is not None
        _command, on_writing, on_written = item
        assert on_writing is not None and on_written is not None
        on_writing()  # the writer hands the command to the stream ...
        if write_completes:
            on_written()  # ... and sees the write complete (not so when the client cancels first)

        registry.close_stream(stream)
        await manager._sync(CLIENT)
        drains = link in manager.draining and not link.closed
        relayed = manager.answered("t1", common_pb2.CHECK_RESULT_COMMIT)
        return drains, relayed
    finally:
        await manager.stop()
        await upstream.stop()


def test_a_check_whose_write_completed_is_still_owed_after_the_client_left() -> None:
    assert asyncio.run(_scenario(write_completes=True)) == (True, True)


def test_a_check_whose_write_began_is_owed_even_if_its_completion_was_never_seen() -> None:
    assert asyncio.run(_scenario(write_completes=False)) == (True, True)


async def _per_principal() -> list[tuple[str, int]]:
    """alice's two clients on two connections, max_pending_checks_per_principal=1: the
    second client's check is held back although its own connection has room, and its
    credit goes back to the checker once alice's first check is answered. Returns, after
    each step, (what the check manager did, the credit the second client's link holds back)."""
    config = ProxyConfig(nameserver_addresses=("127.0.0.1:1",), max_pending_checks_per_connection=5,
                         max_pending_checks_per_principal=1)
    upstream = Upstream(config)
    upstream.checkers = {"127.0.0.1:1": "checker-0"}
    registry = ClientRegistry(idle_expiry_seconds=60.0)
    manager = CheckManager(config, upstream, registry, ProxyMetrics())
    alice = Caller(Principal("alice"), store=None, credentials=object())  # type: ignore[arg-type]
    settings = definition_pb2.Settings(publishing=definition_pb2.Publishing(topics=[definition_pb2.Resource(name=TOPIC)]))
    links = []
    try:
        for n in (1, 2):
            client = ClientKey("alice", f"alice-{n}")
            registry.update_settings(registry.open_stream(client, f"peer-{n}", alice), settings)
            await manager._sync(client)  # the manager's loop step, run by hand
            links.append(manager.links[(client, "127.0.0.1:1")])
        steps = [(manager._deliver(links[0], _check("t1")), links[1].withheld),
                 (manager._deliver(links[1], _check("t2")), links[1].withheld)]
        manager.answered("t1", common_pb2.CHECK_RESULT_COMMIT)
        steps.append(("answered", links[1].withheld))
        steps.append((manager._deliver(links[1], _check("t3")), links[1].withheld))
        return steps
    finally:
        await manager.stop()
        await upstream.stop()


def test_checks_are_held_back_per_principal_over_all_its_connections() -> None:
    assert asyncio.run(_per_principal()) == [("offered", 0), ("held_back", 1), ("answered", 0), ("offered", 0)]
