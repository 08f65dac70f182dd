"""Fixtures of the proxy tests: one cluster shared by the modules that only read (name
server, broker, checker and two proxies, sub-second timings) and the client subprocesses of a test (a temporary HOME
each: the official clients write their logs under it), shown when the test fails."""

from __future__ import annotations

import weakref
from typing import Any, Iterator

import pytest

from tests.support import presets
from tests.support.cluster import Cluster
from tests.support.processes import ServiceProcess

from .support import Clients

#: Sub-second timings: first check 1 s after the half message, redelivery after few attempts
#: (tests/support/presets.py).
BROKER_ENV = presets.PROXY_BROKER
CHECKER_ENV = presets.PROXY_CHECKER
PROXY_ENV = presets.PROXY

#: One cluster for every proxy module that only reads (each test has topics and groups of
#: its own; a test pausing the broker resumes it before it ends).
rmq_cluster = presets.shared_cluster("rmq_cluster", broker_env=BROKER_ENV, checker=True, checker_env=CHECKER_ENV,
                                     proxies=2, proxy_env=PROXY_ENV, nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": "true"})


#: A third proxy: deliveries invisible 1 s by default (auto_renew must keep a slow push
#: listener's message invisible), and limit settings that differ from the brokers' (the
#: proxy must advertise the brokers' own).
RENEWING_PROXY_ENV = {
    **PROXY_ENV,
    "TXMQ_DEFAULT_INVISIBLE_DURATION_SECONDS": "1.0",
    "TXMQ_MAX_BODY_BYTES": "1000",
    "TXMQ_MAX_DELIVERY_ATTEMPTS": "99",
}


_RENEWING: "weakref.WeakKeyDictionary[Cluster, ServiceProcess]" = weakref.WeakKeyDictionary()


@pytest.fixture
def renewing_proxy(rmq_cluster: Cluster) -> ServiceProcess:
    """Started on first use; stopped with the shared cluster."""
    proxy = _RENEWING.get(rmq_cluster)
    if proxy is None:
        proxy = _RENEWING[rmq_cluster] = rmq_cluster.start_proxy(RENEWING_PROXY_ENV)
    return proxy


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
