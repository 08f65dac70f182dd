"""The settings test clusters run with, in one place: the sub-second timings every test
broker gets, and the named variants whole modules use. A module that needs other values
names a preset here (or overrides one key inline, for one test); it does not copy one: two
copies drift, and clusters whose settings differ cannot be shared.

Each preset is a mapping of ``TXMQ_*`` variables, passed as ``broker_env=``,
``checker_env=``, ``nameserver_env=`` or ``proxy_env=`` to :class:`tests.support.cluster.Cluster`
or to the ``fresh_cluster_factory`` fixture. The values are those the tests were written
against (their assertions count checks, attempts and leases from them): change one only
together with the tests that read it.

Shared clusters (one per preset, started once per run under ``make test``, see
:func:`shared_cluster`): a test that only reads — its own topics and groups from ``unique_name``, no kill, restart or
setting of its own — uses the preset's session fixture instead of starting a cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import pytest

from . import lanes
from .cluster import Cluster

# ---------------------------------------------------------------------------- brokers
#: Every test broker unless the test asks otherwise (the session ``cluster``,
#: ``fresh_cluster``, ``fresh_cluster_factory``): the first check 1 s after a half message,
#: every 0.5 s after; a message dead-lettered after 4 attempts; a 1 MiB write-ahead log
#: pre-sized at start (64 MiB a start adds up over a run).
BROKER = {
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1.0",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.5",
    "TXMQ_MAX_DELIVERY_ATTEMPTS": "4",
    "TXMQ_WAL_PREFILL_BYTES": str(1024 * 1024),
}
#: The presets below set only what they change from a broker's defaults (every test broker
#: pre-sizes a 1 MiB write-ahead log: tests/support/cluster.py's ``BROKER_DEFAULTS``).

#: Checks fast and few (tests/integration/test_checks.py, test_explicit_transactions.py):
#: the first 0.3 s after a half message, backing off 0.2 → 0.5 s, discarded after 3.
CHECKS_BROKER = {
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.3",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.2",
    "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "0.5",
    "TXMQ_CHECK_MAX": "3",
}
#: Checks again soon after an unanswered one, no jitter, 15 of them (a re-claim while the
#: first answer is late; tests/integration/test_check_flow.py, test_aio_sdk.py).
FLOW_BROKER = {
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.3",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.2",
    "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "0.3",
    "TXMQ_CHECK_JITTER": "0",
    "TXMQ_CHECK_MAX": "15",
}
#: :data:`FLOW_BROKER` with no second check for a minute: an answer after the timeout meets
#: the claim it answers.
FLOW_SLOW_BROKER = {**FLOW_BROKER, "TXMQ_CHECK_INTERVAL_SECONDS": "60", "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "60"}
#: The pipeline's: first check 0.5 s after the half message, check_max 2 (tests/pipeline).
PIPELINE_BROKER = {
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.5",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.2",
    "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "0.5",
    "TXMQ_CHECK_MAX": "2",
}
#: Everything the dashboards and alerts count happens within a second or two: 2 delivery
#: attempts, checks 0.2 s after the half message, check_max 2 (tests/chart/test_prometheus.py).
METRICS_BROKER = {
    "TXMQ_MAX_DELIVERY_ATTEMPTS": "2",
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.2",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.2",
    "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "0.3",
    "TXMQ_CHECK_MAX": "2",
}
#: Namespaced topics and groups (tests/integration/test_namespaces.py): dead letters after 2.
NAMESPACES_BROKER = {
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.5",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.3",
    "TXMQ_MAX_DELIVERY_ATTEMPTS": "2",
}
#: Global transactions (tests/integration/test_global_transactions.py, tests/chaos_global.py).
GLOBAL_BROKER = {
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "0.4",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.2",
    "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "0.4",
}
#: Behind the RocketMQ proxy (tests/proxy): redelivered after 3 attempts, which the proxy
#: advertises to the official clients as their local retries.
PROXY_BROKER = {
    "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1.0",
    "TXMQ_CHECK_INTERVAL_SECONDS": "0.5",
    "TXMQ_MAX_DELIVERY_ATTEMPTS": "3",
}

# ---------------------------------------------------------------------------- checkers
#: Claims due checks at once and learns new brokers within half a second.
CHECKER = {"TXMQ_CLAIM_INTERVAL_SECONDS": "0.05", "TXMQ_BROKER_REFRESH_SECONDS": "0.5"}
#: :data:`CHECKER` with a 1 s claim lease and a 0.5 s answer timeout (an unanswered check
#: is due again within about a second: test_checks, tests/pipeline, test_prometheus).
QUICK_CHECKER = {**CHECKER, "TXMQ_LEASE_SECONDS": "1.0", "TXMQ_ANSWER_TIMEOUT_SECONDS": "0.5"}
#: A 0.6 s lease and 0.3 s answer timeout (late answers; test_check_flow, test_aio_sdk).
FLOW_CHECKER = {**CHECKER, "TXMQ_LEASE_SECONDS": "0.6", "TXMQ_ANSWER_TIMEOUT_SECONDS": "0.3"}
#: Checks claimed just before a replicated shard's leader dies come back after their lease:
#: kept short, with a 1 s answer timeout (test_replication, test_leaderless, tests/chaos).
REPLICATED_CHECKER = {"TXMQ_LEASE_SECONDS": "2.0", "TXMQ_ANSWER_TIMEOUT_SECONDS": "1.0"}
#: Behind the proxy: the official clients answer checks through it (2 s answer timeout).
PROXY_CHECKER = {"TXMQ_ANSWER_TIMEOUT_SECONDS": "2.0", "TXMQ_BROKER_REFRESH_SECONDS": "0.5"}

# ---------------------------------------------------------------------------- proxies
#: Deliveries invisible 0.2 s at least, 5 s by default; consumer back-off 0.2 → 0.5 s; push
#: long polls of 2 s.
PROXY = {
    "TXMQ_MIN_INVISIBLE_DURATION_SECONDS": "0.2",
    "TXMQ_CONSUMER_BACKOFF_INITIAL_SECONDS": "0.2",
    "TXMQ_CONSUMER_BACKOFF_MAX_SECONDS": "0.5",
    "TXMQ_PUSH_LONG_POLLING_SECONDS": "2.0",
    "TXMQ_DEFAULT_INVISIBLE_DURATION_SECONDS": "5.0",
}

# ---------------------------------------------------------------------------- shared clusters
#: The shared clusters this process runs now, by fixture name.
_LIVE: dict[str, Cluster] = {}


def shared_cluster(name: str, **cluster: Any) -> Callable[..., Cluster]:
    """A fixture: one :class:`Cluster` built with ``cluster`` (``broker_env=``, ``checker=True``,
    ...), started by the first test that asks for it and kept for the tests that follow
    while they ask for it too; stopped after the last of a row (:func:`release`), so it does
    not idle through the rest of the run. Under ``make test`` (xdist) every test using it is
    one work unit (tests/support/lanes.py), so it starts once. Tests using it must only
    read: their own topics and groups (``unique_name``), nothing stopped, killed or
    reconfigured (a test that pauses a process resumes it before it ends).

    In a conftest or a test module::

        checks_cluster = presets.shared_cluster("checks_cluster", broker_env=presets.CHECKS_BROKER,
                                                checker=True, checker_env=presets.QUICK_CHECKER)
    """
    settings: Mapping[str, Any] = dict(cluster)
    lanes.SHARED_FIXTURES[name] = f"preset-{name}"

    @pytest.fixture(name=name)
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
        c = _LIVE.get(name)
        if c is None:
            workdir: Path = tmp_path_factory.mktemp(name)
            c = _LIVE[name] = Cluster(workdir, **settings)
        return c

    fixture.__doc__ = f"The shared {name} (tests/support/presets.py): {settings}"
    return fixture


def release(nextitem: pytest.Item | None) -> None:
    """After a test's teardown: stops every shared cluster the next test does not use (all
    of them after the last test)."""
    wanted = set(getattr(nextitem, "fixturenames", ())) if nextitem is not None else set()
    for name in [n for n in _LIVE if n not in wanted]:
        _LIVE.pop(name).stop()
