"""The proxy's own limit on the orphan checks it forwards to one client connection
(``max_pending_checks_per_connection``), with the official Python client: beyond it checks
are held back, never dropped nor spent twice; every orphan is still resolved."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.support.metrics import metric_sum
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2

from .conftest import BROKER_ENV, CHECKER_ENV, PROXY_ENV
from .support import Clients

pytestmark = pytest.mark.timeout(180)


def test_checks_beyond_the_connection_limit_are_held_back_not_dropped(
        fresh_cluster_factory: Any, clients: Clients, unique_name: Callable[[str], str]) -> None:
    c = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True, checker_env=CHECKER_ENV, proxies=1,
                              proxy_env={**PROXY_ENV, "TXMQ_MAX_PENDING_CHECKS_PER_CONNECTION": "2"},
                              nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": "true"})
    topic, orphans = unique_name("limit"), 6
    proxy = c.proxy_addresses[0]
    # The client answers one check at a time (its check thread pool has one thread), each
    # after 0.3 s: without the limit the proxy would write it all six at once.
    answering = clients.python("checker", endpoints=proxy, topic=topic, hold_seconds=0.3)
    answering.wait_event("started", timeout=60)
    dying = clients.python("orphan", endpoints=proxy, topic=topic, body="orphan", count=orphans)
    sent = dying.wait_event("sent", count=orphans, timeout=60)
    assert dying.finish(30, close_stdin=False) == -9
    port = c.proxies[0].metrics_port
    most = 0

    def resolved() -> bool:
        nonlocal most
        most = max(most, int(metric_sum(port, "txmq_proxy_checks_pending")))
        states = [c.admin_stub().DescribeTransaction(admin_pb2.DescribeTransactionRequest(
            transaction_id=e["transaction_id"]), timeout=5).transaction.state for e in sent]
        return all(s == common_pb2.TRANSACTION_STATE_COMMITTED for s in states)
    wait_until(resolved, 90, interval=0.05, message="the orphans were not all committed")
    assert metric_sum(port, "txmq_proxy_checks_total", {"result": "held_back"}) > 0
    assert most <= 2, f"{most} checks pending on one connection, limit 2"
    # Every orphan reached the client; none was lost on the way.
    assert {e["message_id"] for e in sent} <= {e["message_id"] for e in answering.of("checked")}
    answering.expect_success(60)
