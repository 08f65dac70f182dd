"""A half message the proxy gave up on, sent again by the client (same message id, same
shard) while the proxy's ROLLBACK answer to that orphan's check is still on its way to the
broker: the broker answers the repeat as the PREPARED half it still is, and the client,
told a success, would run its local transaction and commit a message the answer then rolls
back. The proxy must refuse the repeat instead (FAILED_PRECONDITION, the half ROLLED_BACK)
and make its answer good.

Real name server and broker processes (the session's cluster); the proxy's own objects
(upstream, relay, check manager) run in this process so that the answer can be held in
flight: their one checker address is an unused port, so the answer the check manager
sends never arrives (as one delayed or lost between the proxy and the checker). The
abandonment itself (a send moved away from a shard that stored it) is set as the relay
leaves it; tests/proxy/test_failover.py produces it with real lost answers.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from services.proxy.checks import CheckManager
from services.proxy.clients import ClientKey, ClientRegistry
from services.proxy.config import ProxyConfig
from services.proxy.metrics import ProxyMetrics
from services.proxy.protocol import definition_pb2
from services.proxy.relay import Relay
from services.proxy.upstream import Upstream
from txmq.errors import TransactionStateError
from txmq.v1 import admin_pb2, checker_pb2, common_pb2

UNUSED_CHECKER = "127.0.0.1:1"


def _half(topic: str, message_id: str) -> common_pb2.Message:
    return common_pb2.Message(topic=topic, message_id=message_id, producer_group=topic, body=b"order 42",
                              type=common_pb2.MESSAGE_TYPE_TRANSACTION)


async def _scenario(nameserver: str, topic: str, message_id: str, *, answer_first: bool
                    ) -> tuple[str, BaseException | None]:
    """The half stored, abandoned on its shard; the orphan's check answered ROLLBACK (held
    in flight) when ``answer_first``; then the client's repeat. Returns (the transaction
    id, what the repeat raised)."""
    config = ProxyConfig(nameserver_addresses=(nameserver,))
    upstream = Upstream(config)
    registry = ClientRegistry(idle_expiry_seconds=60.0)
    manager = CheckManager(config, upstream, registry, ProxyMetrics())
    relay = Relay(config, upstream)
    try:
        await upstream.refresh()
        upstream.checkers = {UNUSED_CHECKER: "checker-0"}
        first = await relay.send(_half(topic, message_id))  # stored; its answer "lost"
        assert first.transaction_state == common_pb2.TRANSACTION_STATE_PREPARED
        upstream.abandoned.add((first.broker_name, message_id))  # as a send moving away leaves it
        if answer_first:
            client = ClientKey(None, "client-1")
            stream = registry.open_stream(client, "peer-1")
            registry.update_settings(stream, definition_pb2.Settings(publishing=definition_pb2.Publishing(
                topics=[definition_pb2.Resource(name=topic)])))
            await manager._sync(client)  # the manager's loop step, run by hand
            link = manager.links[(client, UNUSED_CHECKER)]
            assert manager._deliver(link, checker_pb2.CheckRequest(
                check_id="check-1", transaction_id=first.transaction_id, broker_name=first.broker_name,
                answer_timeout_seconds=2.0, message=_half(topic, message_id))) == "orphan_rolled_back"
        try:
            await relay.send(_half(topic, message_id))
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            return first.transaction_id, exc
        return first.transaction_id, None
    finally:
        await manager.stop()
        await upstream.stop()


def _state(cluster, transaction_id: str) -> int:
    return cluster.admin_stub().DescribeTransaction(
        admin_pb2.DescribeTransactionRequest(transaction_id=transaction_id), timeout=10).transaction.state


def test_a_repeat_crossing_the_orphans_rollback_answer_is_refused_and_the_half_rolled_back(
        cluster, unique_name) -> None:
    topic = unique_name("orphan-repeat")
    cluster.create_topic(topic, 1)
    transaction_id, raised = asyncio.run(_scenario(cluster.nameserver_address, topic, uuid.uuid4().hex,
                                                   answer_first=True))
    assert isinstance(raised, TransactionStateError), f"the repeat was told {raised!r}, not refused"
    assert raised.code == grpc.StatusCode.FAILED_PRECONDITION and "ROLLED_BACK" in str(raised)
    # The answer never arrived, yet the half is rolled back: the proxy made it good.
    assert _state(cluster, transaction_id) == common_pb2.TRANSACTION_STATE_ROLLED_BACK


def test_a_repeat_of_an_abandoned_half_whose_check_was_not_answered_is_the_clients_again(
        cluster, unique_name) -> None:
    """No check answered yet: the repeat finds the half it first stored, is told so, and
    the half is the client's to decide (no longer an orphan)."""
    topic = unique_name("orphan-repeat")
    cluster.create_topic(topic, 1)
    transaction_id, raised = asyncio.run(_scenario(cluster.nameserver_address, topic, uuid.uuid4().hex,
                                                   answer_first=False))
    assert raised is None
    assert _state(cluster, transaction_id) == common_pb2.TRANSACTION_STATE_PREPARED


@pytest.fixture(autouse=True)
def _no_checker_in_between(cluster) -> None:
    """The session cluster has no checker: nothing but this test decides its halves."""
    assert not cluster.checkers
