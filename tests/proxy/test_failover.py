"""The official RocketMQ 5 Python client through the proxy while one of two shards is down
(issue 21): the proxy routes new sends around the failing shard, so the client keeps its
throughput, sees no failed call, and every commit is delivered once after the shard returns.

Nothing is timed: what keeps the throughput is counted (see tests/integration/test_failover.py).
"""

from __future__ import annotations

import time
from typing import Callable

import pytest

from services.proxy.checks import CHECK_CREDIT_PER_CLIENT
from services.proxy.config import ProxyConfig
from services.proxy.relay import BOUND_ATTEMPTS, SEND_ATTEMPTS
from tests.support import holdsync
from tests.support.failover import drain, measure, pending, rerouted_bound, table
from tests.support.holdsync import SyncGate
from tests.support.metrics import metric
from tests.support.waiting import wait_until

from .conftest import CHECKER_ENV, PROXY_ENV
from .support import ClientProcess, Clients

pytestmark = pytest.mark.timeout(240)

NAMESERVER_ENV = {"TXMQ_AUTO_CREATE_TOPICS": "true", "TXMQ_BROKER_EXPIRY_SECONDS": "1.5"}
WINDOW_SECONDS = 4.0
WINDOW_DEADLINE_SECONDS = 40.0
#: As in tests/integration/test_failover.py, a load one broker carries alone on a loaded
#: machine; longer than there: each transaction makes two unary calls through the proxy,
#: whose latency on one broker carrying both shards' calls doubled (6 → 12 ms) at a load
#: average of 15 on 2 cores.
LOCAL_TRANSACTION_SECONDS = 0.1
LOAD_THREADS = 4


@pytest.mark.heavy  # a throughput comparison
def test_official_client_keeps_throughput_through_the_proxy_when_a_shard_fails(
        fresh_cluster_factory, clients: Clients, unique_name: Callable[[str], str]) -> None:
    cluster = fresh_cluster_factory(brokers=2, checker=True, checker_env=CHECKER_ENV, proxies=1,
                                    proxy_env=PROXY_ENV, nameserver_env=NAMESERVER_ENV)
    topic = unique_name("orders")
    cluster.create_topic(topic, 4)
    proxy = cluster.proxies[0]
    load = clients.python("commit_load", timeout=220, endpoints=proxy.address, topic=topic, threads=LOAD_THREADS,
                          local_seconds=LOCAL_TRANSACTION_SECONDS)
    load.wait_event("started", timeout=60)

    def committed() -> int:
        return len(load.of("committed"))

    def sent_to(shard: str) -> float:
        return metric(proxy.metrics_port, "txmq_proxy_shard_send_seconds_count", {"shard": shard}) or 0.0

    def rerouted() -> float:
        return metric(proxy.metrics_port, "txmq_proxy_sends_rerouted_total") or 0.0

    measure(committed, 50, WINDOW_DEADLINE_SECONDS)  # connections open, routes cached
    size = max(100, int(measure(committed, 100, WINDOW_DEADLINE_SECONDS).rate * WINDOW_SECONDS))
    before = measure(committed, size, WINDOW_DEADLINE_SECONDS)
    assert sent_to("broker-1") > 0
    rerouted_before = rerouted()
    cluster.kill_broker(1)
    during = measure(committed, size, WINDOW_DEADLINE_SECONDS)
    rerouted_during = rerouted() - rerouted_before
    cluster.restart_broker(1)
    served = sent_to("broker-1")
    wait_until(lambda: sent_to("broker-1") > served + 10, 10,
               message="the proxy sends nothing to the restarted broker")
    after = measure(committed, size, WINDOW_DEADLINE_SECONDS)
    stop_load(load)

    times = sorted(e["t"] for e in load.of("committed"))
    seconds = [sum(1 for t in times if times[0] + s <= t < times[0] + s + 1) for s in range(int(times[-1] - times[0]))]
    report = table([("before", before), ("during", during), ("after", after)]) + f"\n  per second: {seconds}"
    print(f"\n{report}")
    assert load.of("failed") == [], f"calls failed to the application: {load.of('failed')[:3]}"
    # Counted, not timed (see tests/integration/test_failover.py): the window completed, and
    # only the sends in flight at the kill and the proxy's probes paid broker-1.
    assert during.transactions >= size, f"the load stalled while broker-1 was down:\n{report}"
    assert rerouted_during <= rerouted_bound(LOAD_THREADS, during.seconds), \
        f"{rerouted_during:.0f} sends paid the dead shard in {during.seconds:.1f}s:\n{report}"
    assert (metric(proxy.metrics_port, "txmq_proxy_shard_avoided", {"shard": "broker-1"}) or 0.0) == 0.0

    # Commits deferred to the check while broker-1 was down are decided by the client's
    # checker; attempts left behind on broker-1 are rolled back by the proxy.
    expected = {e["body"].encode() for e in load.of("committed")}
    bodies = drain(cluster, topic, unique_name("audit"), expected, timeout=60)
    duplicates = {b for b in bodies if bodies.count(b) > 1}
    assert not duplicates, f"{len(duplicates)} messages delivered twice"
    assert set(bodies) == expected, f"not committed yet delivered: {sorted(set(bodies) - expected)[:5]}"
    wait_until(lambda: not pending(cluster, topic), 20,
               message=lambda: f"transactions left pending: {pending(cluster, topic)[:3]}")
    load.expect_success(60)


def stop_load(load: ClientProcess) -> None:
    """Ends ``load``'s commits (its producer stays up, answering checks, until it finishes)."""
    assert load.proc.stdin is not None
    load.proc.stdin.write(b"stop\n")
    load.proc.stdin.flush()
    load.wait_event("stopped", timeout=60)


@pytest.mark.timeout(300)
@pytest.mark.heavy  # six replicas, etcd and the official client's load
def test_both_leaders_killed_at_once_cost_the_official_client_only_the_calls_in_flight_and_the_probes(
        fresh_cluster_factory, clients: Clients, unique_name: Callable[[str], str]) -> None:
    """Replicated shards behind the proxy: the leaders of broker-0 and broker-1 SIGKILLed
    together. No shard is usable while their followers take over, so a send that failed on
    one and then on the other stays there, backed off, until its next leader (as the SDK's
    sends do, tests/integration/test_failover.py); the proxy used to bounce it back to the
    first dead leader at once, spending its attempts, and the client's own retries, in
    milliseconds (in six 1.3-1.4 s fail-overs 13-58 of the client's sends failed and 142-554
    calls at the proxy; 0-4 and 36-52 now). Counted, not timed: only the callers in flight
    at the kill and the fault table's probes may fail to the client; at the proxy (the
    client sends a failed send again at once, which hides some) only the calls of those
    sends, every attempt of the client's and of the proxy's; none fails once both shards
    lead again, and every commit is delivered once."""
    cluster = fresh_cluster_factory(brokers=2, replication_factor=3, checker=True, checker_env=CHECKER_ENV, proxies=1,
                                    proxy_env=PROXY_ENV, nameserver_env=NAMESERVER_ENV)
    cluster.wait_leaders()
    topic = unique_name("orders")
    cluster.create_topic(topic, 4)
    proxy = cluster.proxies[0]
    load = clients.python("commit_load", timeout=280, endpoints=proxy.address, topic=topic, threads=LOAD_THREADS,
                          local_seconds=LOCAL_TRANSACTION_SECONDS)
    load.wait_event("started", timeout=60)

    def committed() -> int:
        return len(load.of("committed"))

    def sent_to(shard: str) -> float:
        return metric(proxy.metrics_port, "txmq_proxy_shard_send_seconds_count", {"shard": shard}) or 0.0

    def sent_to_again(shard: str) -> None:
        served = sent_to(shard)
        wait_until(lambda: sent_to(shard) > served + 10, 10, message=f"the proxy sends nothing to {shard}'s new leader")

    def failed_calls() -> float:
        return sum(metric(proxy.metrics_port, "txmq_proxy_shard_failures_total", {"shard": shard}) or 0.0
                   for shard in ("broker-0", "broker-1"))

    measure(committed, 50, WINDOW_DEADLINE_SECONDS)  # connections open, routes cached
    assert sent_to("broker-0") > 0 and sent_to("broker-1") > 0
    old = cluster.wait_leaders()
    failed_calls_before = failed_calls()
    killed = time.monotonic()
    for leader in old.values():
        leader.kill()
    for shard, leader in old.items():
        cluster.wait_leaders(shards=[shard], not_on=leader)
    between_leaders = time.monotonic() - killed
    for shard in old:
        sent_to_again(shard)
    failed_then, failed_calls_then = len(load.of("failed")), failed_calls() - failed_calls_before
    after = measure(committed, 100, WINDOW_DEADLINE_SECONDS)
    stop_load(load)

    bound = rerouted_bound(LOAD_THREADS, between_leaders + 1.0)  # + the routes' refresh
    # At the proxy, without that helper's slack: each caller in flight at the kill and each
    # probe may cost one of the client's sends every attempt, the client's (what the proxy
    # advertises) of the proxy's; and each EndTransaction in flight its attempts.
    in_flight_and_probes = bound // 2
    calls_bound = (in_flight_and_probes * ProxyConfig().producer_max_attempts * SEND_ATTEMPTS
                   + LOAD_THREADS * BOUND_ATTEMPTS)
    print(f"\n  both shards between leaders {between_leaders:.1f} s: {failed_then} sends failed to the client (at "
          f"most {bound} may), {failed_calls_then:.0f} calls at the proxy (at most {calls_bound});\n"
          f"{table([('after', after)])}")
    assert failed_then <= bound, (f"{failed_then} sends failed to the client in the {between_leaders:.1f} s both "
                                  f"shards were between leaders (at most {bound} may): {load.of('failed')[:3]}")
    assert failed_calls_then <= calls_bound, (f"{failed_calls_then:.0f} calls failed at the proxy in the "
                                              f"{between_leaders:.1f} s both shards were between leaders (at most "
                                              f"{calls_bound} may)")
    assert len(load.of("failed")) == failed_then, \
        f"sends failed after both shards led again: {load.of('failed')[failed_then:][:3]}"
    assert after.transactions >= 100, "the load stalled after both shards led again"

    expected = {e["body"].encode() for e in load.of("committed")}
    bodies = drain(cluster, topic, unique_name("audit"), expected, timeout=60)
    duplicates = {b for b in bodies if bodies.count(b) > 1}
    assert not duplicates, f"{len(duplicates)} messages delivered twice"
    assert set(bodies) == expected, f"not committed yet delivered: {sorted(set(bodies) - expected)[:5]}"
    wait_until(lambda: not pending(cluster, topic), 30,
               message=lambda: f"transactions left pending: {pending(cluster, topic)[:3]}")
    load.expect_success(60)


@pytest.fixture(scope="module")
def gate_library(tmp_path_factory: pytest.TempPathFactory):
    return holdsync.build(tmp_path_factory.mktemp("holdsync"))


def test_an_orphan_left_by_a_moved_half_message_is_rolled_back_by_the_proxy(
        fresh_cluster_factory, clients: Clients, unique_name: Callable[[str], str], gate_library, tmp_path,
        monkeypatch) -> None:
    """broker-1 stores half messages but never answers (its WAL sync is held): the proxy
    moves each to broker-0 (same client message id), where it is committed. broker-1 then
    crashes and restarts with the orphans: the proxy answers their checks ROLLBACK itself,
    since the client's checker would find the message id committed and commit it twice."""
    cluster = fresh_cluster_factory(brokers=2, checker=True, checker_env=CHECKER_ENV, proxies=1,
                                    proxy_env={**PROXY_ENV, "TXMQ_RPC_TIMEOUT_SECONDS": "0.5"},
                                    nameserver_env=NAMESERVER_ENV)
    topic = unique_name("orders")
    cluster.create_topic(topic, 2)
    gate = SyncGate(gate_library, tmp_path / "gate")
    gate.install(monkeypatch)
    cluster.restart_broker(1)  # broker-1 alone loads the gate
    monkeypatch.delenv("LD_PRELOAD")
    proxy = cluster.proxies[0]
    answering = clients.python("checker", endpoints=proxy.address, topic=topic)  # the group's live producer
    answering.wait_event("started", timeout=60)
    gate.hold()
    bodies = [f"commit-{i}" for i in range(12)]
    clients.python("transactional", endpoints=proxy.address, topic=topic, bodies=bodies).expect_success(90)
    assert gate.holding_wal(), "no half message reached broker-1: the test did not exercise a lost answer"
    cluster.kill_broker(1)
    gate.release()
    cluster.restart_broker(1)

    def rolled_back() -> float:
        return metric(proxy.metrics_port, "txmq_proxy_checks_total", {"result": "orphan_rolled_back"}) or 0.0

    wait_until(lambda: rolled_back() >= 1 and not pending(cluster, topic), 30,
               message=lambda: f"orphans: {rolled_back()} rolled back, pending {pending(cluster, topic)[:3]}")
    delivered = drain(cluster, topic, unique_name("audit"), {b.encode() for b in bodies})
    assert sorted(delivered) == sorted(b.encode() for b in bodies), "an orphan was delivered as a second copy"
    assert answering.of("checked") == [], "the client was asked about an orphan the proxy knew"
    # Each orphan's credit came back with its answer: the client can still take a full window.
    wait_until(lambda: metric(cluster.checkers[0].metrics_port, "txmq_check_credit_free", {"group": topic})
               == CHECK_CREDIT_PER_CLIENT, 10, message="credit of the orphans answered by the proxy lost")
    answering.expect_success(60)
