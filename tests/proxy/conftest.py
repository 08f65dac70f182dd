"""Fixtures of the proxy tests: one cluster per module (name server, broker, checker and
two proxies, sub-second timings) and the client subprocesses of a test (a temporary HOME
each: the official clients write their logs under it), shown when the test fails."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.processes import ServiceProcess

from .support import Clients

#: Sub-second timings: first check 1 s after the half message, redelivery after few attempts.
BROKER_ENV = {
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1.0",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.5",
    "TXMQ_MAX_DELIVERY_ATTEMPTS": "3",
    # A stopped client stops counting as a live consumer soon (offset resets wait for it).
    "TXMQ_CONSUMER_SESSION_SECONDS": "3.0",
}
CHECKER_ENV = {
    "TXMQ_ANSWER_TIMEOUT_SECONDS": "2.0",
    "TXMQ_BROKER_REFRESH_SECONDS": "0.5",
}
PROXY_ENV = {
    "TXMQ_MIN_INVISIBLE_DURATION_SECONDS": "0.2",
    "TXMQ_CONSUMER_BACKOFF_INITIAL_SECONDS": "0.2",
    "TXMQ_CONSUMER_BACKOFF_MAX_SECONDS": "0.5",
    "TXMQ_PUSH_LONG_POLLING_SECONDS": "2.0",
    "TXMQ_DEFAULT_INVISIBLE_DURATION_SECONDS": "5.0",
}


@pytest.fixture(scope="module")
def rmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("proxy-cluster"), broker_env=BROKER_ENV, checker=True,
                checker_env=CHECKER_ENV, proxies=2, proxy_env=PROXY_ENV,
                nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": "true"})
    try:
        yield c
    finally:
        c.stop()


#: A third proxy: deliveries invisible 1 s by default (auto_renew must keep a slow push
#: listener's message invisible), and limit settings that differ from the brokers' (the
#: proxy must advertise the brokers' own).
RENEWING_PROXY_ENV = {
    **PROXY_ENV,
    "TXMQ_DEFAULT_INVISIBLE_DURATION_SECONDS": "1.0",
    "TXMQ_MAX_BODY_BYTES": "1000",
    "TXMQ_MAX_DELIVERY_ATTEMPTS": "99",
}


@pytest.fixture(scope="module")
def renewing_proxy(rmq_cluster: Cluster) -> ServiceProcess:
    """Started on first use; stopped with the module's cluster."""
    return rmq_cluster.start_proxy(RENEWING_PROXY_ENV)


@pytest.fixture
def clients(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Clients]:
    made = Clients(tmp_path_factory.mktemp("client-home"))
    request.node.stash[_CLIENTS] = made
    try:
        yield made
    finally:
        made.close()


_CLIENTS = pytest.StashKey[Clients]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    made = item.stash.get(_CLIENTS, None)
    if report.failed and made is not None and made.started:
        report.sections.append(("client processes", made.report()))
    return report
