"""The dashboard and the metrics behind it, checked with a real Prometheus (Debian's
`prometheus`) scraping real txmq processes (a name server, a broker and a checker from
tests/support/cluster.py, plus a RocketMQ proxy) while a workload commits, rolls back,
checks, discards and leaves transactions pending, and the official RocketMQ Python client
(tests/proxy's client scenarios, in subprocesses) commits, rolls back and consumes through
the proxy. Every query of every dashboard panel is evaluated through
Prometheus's HTTP API and must return a number.

Prometheus scrapes every 200 ms and the service timings are sub-second, so the test takes
seconds; every wait is a deadline on a condition.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import grpc
import psutil
import pytest
import yaml

import txmq
from tests.proxy.support import Clients
from tests.support import presets
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2

from .chart import CHART, NAMESPACE

DASHBOARD = CHART / "dashboards" / "txmq.json"
LocalState = txmq.LocalTransactionState
BROKER_ENV = presets.METRICS_BROKER
CHECKER_ENV = presets.QUICK_CHECKER
#: What Grafana would substitute: every namespace/group, and a window that spans the test.
VARIABLES = {"$namespace": NAMESPACE, "$group": ".*", "$__rate_interval": "1m"}


def _panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _queries() -> list[tuple[str, str]]:
    return [(f"{p['title']} [{t['refId']}]", t["expr"]) for p in _panels() for t in p["targets"]]


def _substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown dashboard variable in {expr}"
    return expr


def test_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "group"} <= variables
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"].lower() for p in _panels())
    for wanted in ("p50", "p99", "pending", "oldest pending", "checks by result", "discards",
                   "commits and rollbacks", "rpc latency", "disk", "replication lag (seconds)",
                   "replication lag (records)", "in-sync replicas vs replication factor", "leader epoch",
                   "leadership changes", "writes refused", "sends rerouted", "shards avoided",
                   "send latency per shard", "consumer lag (messages)",
                   "consumer lag (oldest unacknowledged, seconds)", "messages in and out", "dead letters",
                   "global transactions ended", "global transaction parts undecided",
                   "oldest undecided global part", "global pushes and pulls",
                   "refused at a per-principal quota", "proxy clients remembered"):
        assert wanted in titles, wanted
    # Counts over a window that follows the zoom ($__rate_interval) change with it: none.
    for p in _panels():
        for t in p["targets"]:
            assert "increase(" not in t["expr"] or "[$__rate_interval]" not in t["expr"], (p["title"], t["expr"])
    for p in _panels():
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["targets"] and all(t["expr"] for t in p["targets"])
        for t in p["targets"]:
            assert 'namespace=~"$namespace"' in t["expr"], (p["title"], "filter by the namespace variable")


def test_dashboard_stat_thresholds_are_the_alerts(helm_bin: Path, rendered) -> None:
    """The check-lag and due-check stat panels turn red where their alerts fire, in the
    file (the chart's defaults) and in the ConfigMap (the release's values)."""
    from .chart import render

    values = yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["prometheusRule"]

    def thresholds(dashboard: dict[str, Any]) -> dict[str, float]:
        out = {}
        for p in dashboard["panels"]:
            if p["type"] == "stat":
                for step in p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", []):
                    if "txmqAlertValue" in step:
                        out[step["txmqAlertValue"]] = step["value"]
        return out

    assert thresholds(json.loads(DASHBOARD.read_text())) == {
        "checkLagP99Seconds": values["checkLagP99Seconds"], "checkDueAgeSeconds": values["checkDueAgeSeconds"]}
    custom = render(helm_bin, sets={"metrics.grafanaDashboard.enabled": "true",
                                    "metrics.prometheusRule.checkLagP99Seconds": "9",
                                    "metrics.prometheusRule.checkDueAgeSeconds": "120"})
    (cm,) = [d for d in custom.of_kind("ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    assert thresholds(json.loads(cm["data"]["txmq.json"])) == {"checkLagP99Seconds": 9, "checkDueAgeSeconds": 120}
    stats = {p["title"]: p["targets"][0]["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]
             if p["type"] == "stat"}
    assert any("txmq_check_lag_seconds_bucket" in e and "[5m]" in e for e in stats.values())
    assert any("txmq_check_due_oldest_age_seconds" in e for e in stats.values())


def test_dashboard_configmap_carries_the_same_json(rendered) -> None:
    cms = [d for d in rendered["ha-monitoring"].of_kind("ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    (cm,) = cms
    assert json.loads(cm["data"]["txmq.json"]) == json.loads(DASHBOARD.read_text())


# ---------------------------------------------------------------------------- the live test
class Prometheus:
    """A real Prometheus on an ephemeral port (learned from the process's listening socket)."""

    def __init__(self, binary: Path, workdir: Path, targets: list[dict[str, Any]]) -> None:
        config = {"global": {"scrape_interval": "200ms", "scrape_timeout": "150ms", "evaluation_interval": "200ms"},
                  "scrape_configs": [{"job_name": t["labels"]["job"] + "-" + t["labels"]["pod"],
                                      "static_configs": [t]} for t in targets]}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [str(binary), f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             "--web.listen-address=127.0.0.1:0", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.workdir = workdir
        try:
            self.port = wait_until(self._listening_port, 30, interval=0.05,
                                   message=lambda: f"prometheus not listening\n{self.log_text()}")
            wait_until(self._ready, 30, interval=0.05, message=lambda: f"prometheus not ready\n{self.log_text()}")
        except BaseException:
            self.stop()
            raise

    def log_text(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-4000:]

    def _listening_port(self) -> int | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}\n{self.log_text()}")
        conns = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        ports = [c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN]
        return ports[0] if ports else None

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def checked_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("prom-cluster"), broker_env=BROKER_ENV, checker=True,
                checker_env=CHECKER_ENV, proxies=1)
    try:
        yield c
    finally:
        c.stop()


#: The replicated shard's name and pods as the chart would name them (a StatefulSet per
#: shard, pod = <shard>-<replica id>), with the `shard` label its ServiceMonitor adds.
SHARD = "txmq-broker-7"


@pytest.fixture(scope="module")
def replicated_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One shard of three replicas (min in-sync 2) on a real etcd, beside checked_cluster."""
    c = Cluster(tmp_path_factory.mktemp("prom-replicated"), replication_factor=3, min_insync_replicas=2)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def prometheus(prometheus_bin: Path, checked_cluster: Cluster, replicated_cluster: Cluster,
               tmp_path: Path) -> Iterator[Prometheus]:
    targets = []
    for proc in checked_cluster.processes:
        component = proc.module.rsplit(".", 1)[-1]
        targets.append({"targets": [f"127.0.0.1:{proc.metrics_port}"],
                        "labels": {"job": component, "namespace": NAMESPACE, "pod": f"txmq-{proc.name}",
                                   "service": f"txmq-{component}-headless"}})
    for r, proc in enumerate(replicated_cluster.shards["broker-0"]):
        targets.append({"targets": [f"127.0.0.1:{proc.metrics_port}"],
                        "labels": {"job": "broker", "namespace": NAMESPACE, "pod": f"{SHARD}-{r}",
                                   "service": "txmq-broker-headless", "shard": SHARD}})
    p = Prometheus(prometheus_bin, tmp_path, targets)
    try:
        yield p
    finally:
        p.stop()


class Listener(txmq.TransactionListener):
    def __init__(self, execute: LocalState, check: LocalState) -> None:
        self.execute, self.check = execute, check
        self.checks = 0
        self.lock = threading.Lock()

    def execute_local_transaction(self, message, arg):
        return self.execute

    def check_local_transaction(self, message):
        with self.lock:
            self.checks += 1
        return self.check


def _producer(cluster: Cluster, group: str, listener: Listener, answer: bool = True) -> txmq.TransactionProducer:
    p = txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=listener,
                                 checker_refresh_seconds=0.3, answer_checks=answer)
    if answer:
        wait_until(lambda: len(p.connected_checkers()) == len(cluster.checkers), 10,
                   message=f"{group}: producer not subscribed with every checker")
    return p


def _rocketmq_round(clients: Clients, cluster: Cluster, topic: str, group: str, n: int) -> None:
    """The official RocketMQ Python client through the proxy: commit and roll back, then
    consume the committed ones."""
    proxy = cluster.proxy_addresses[0]
    bodies = [f"{kind}-{n}-{i}" for i in range(2) for kind in ("commit", "rollback")]
    clients.python("transactional", endpoints=proxy, topic=topic, bodies=bodies).expect_success(60)
    clients.python("simple", endpoints=proxy, topic=topic, group=group, count=2,
                   await_seconds=1).expect_success(60)


def test_every_dashboard_query_returns_data_from_a_real_prometheus(
        prometheus: Prometheus, checked_cluster: Cluster, unique_name, tmp_path: Path) -> None:
    cluster = checked_cluster
    topic, rmq_topic, rmq_group = unique_name("orders"), unique_name("rmq-orders"), unique_name("rmq-consumers")
    cluster.create_topic(topic, queue_count=2)
    cluster.create_topic(rmq_topic, queue_count=2)
    groups = {name: unique_name(name) for name in ("direct", "checked", "discarding", "orphaned")}
    producers = []
    home = tmp_path / "client-home"  # the official client logs under $HOME/logs
    home.mkdir()
    clients = Clients(home)
    try:
        # Decided by the producer at once: commits and rollbacks from the client.
        commit = _producer(cluster, groups["direct"], Listener(LocalState.COMMIT, LocalState.COMMIT))
        rollback = _producer(cluster, groups["direct"], Listener(LocalState.ROLLBACK, LocalState.ROLLBACK))
        # Undecided, then committed by a check.
        checked_listener = Listener(LocalState.UNKNOWN, LocalState.COMMIT)
        checked = _producer(cluster, groups["checked"], checked_listener)
        # Undecided and never decided: checks answered UNKNOWN until the budget is spent.
        discarding = _producer(cluster, groups["discarding"], Listener(LocalState.UNKNOWN, LocalState.UNKNOWN))
        # Undecided, and no producer answers checks: pending, with a due check growing old.
        orphaned = _producer(cluster, groups["orphaned"], Listener(LocalState.UNKNOWN, LocalState.UNKNOWN),
                             answer=False)
        producers += [commit, rollback, checked, discarding, orphaned]

        def send_round(n: int) -> None:
            for i in range(n):
                for name, p in (("c", commit), ("r", rollback), ("k", checked), ("d", discarding),
                                ("o", orphaned)):
                    p.send_in_transaction(txmq.Message(topic, f"{name}{i}".encode()))

        # Counters and histograms appear with their first observation, so a rate needs a
        # second round after Prometheus has scraped the first.
        send_round(2)
        _rocketmq_round(clients, cluster, rmq_topic, rmq_group, 1)
        wait_until(lambda: checked_listener.checks >= 2, 20, message="first checks not answered")
        wait_until(lambda: prometheus.query(f'txmq_check_lag_seconds_count{{group="{groups["checked"]}"}}')
                   and prometheus.query(f'txmq_transactions_ended_total{{group="{groups["direct"]}"}}'),
                   20, interval=0.2, message="first round not scraped")
        wait_until(lambda: prometheus.query(f'txmq_proxy_messages_out_total{{topic="{rmq_topic}"}}'), 20,
                   interval=0.2, message="first proxy round not scraped")
        send_round(2)
        _rocketmq_round(clients, cluster, rmq_topic, rmq_group, 2)
        wait_until(lambda: checked_listener.checks >= 4, 20, message="second round of checks not answered")
        # A consumer group that lags (nothing acknowledged) and dead-letters what it took.
        with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=unique_name("consumers"),
                                 subscriptions={topic: "*"}, await_duration_seconds=0.3) as consumer:
            taken: list[int] = []
            wait_until(lambda: taken.extend(m.delivery_attempt for m in consumer.receive(
                1, invisible_duration_seconds=0.1)) or max(taken, default=0) >= 2, 20,
                message="no message delivered twice")
            wait_until(lambda: prometheus.query('txmq_dead_letters') or (consumer.receive(
                1, invisible_duration_seconds=0.1) and False), 20, interval=0.3, message="no dead letter scraped")
        queries = _queries()
        pending: dict[str, str] = {}

        def all_have_data() -> bool:
            pending.clear()
            for title, expr in queries:
                result = prometheus.query(_substitute(expr))
                numbers = [float(s["value"][1]) for s in result]
                if not [n for n in numbers if n == n]:  # no series, or only NaN
                    pending[title] = f"{_substitute(expr)} -> {result}"
            return not pending

        wait_until(all_have_data, 45, interval=0.5,
                   message=lambda: "dashboard queries without data:\n" + "\n".join(f"  {k}: {v}" for k, v in pending.items()))

        # What a user reads off the dashboard, per group.
        def by_group(expr: str) -> dict[str, float]:
            return {s["metric"].get("group", ""): float(s["value"][1]) for s in prometheus.query(_substitute(expr))}

        ended = prometheus.query(_substitute(
            'sum by (group, resolution, source) (txmq_transactions_ended_total{namespace=~"$namespace"})'))
        seen = {(s["metric"]["group"], s["metric"]["resolution"], s["metric"]["source"]) for s in ended}
        assert (groups["direct"], "commit", "client") in seen
        assert (groups["direct"], "rollback", "client") in seen
        assert (groups["checked"], "commit", "check") in seen
        wait_until(lambda: by_group('sum by (group) (txmq_transactions_discarded_total{namespace=~"$namespace"})')
                   .get(groups["discarding"], 0) >= 1, 20, interval=0.3, message="no discard seen by prometheus")
        assert by_group('sum by (group) (txmq_transactions_pending{namespace=~"$namespace"})')[groups["orphaned"]] == 4
        wait_until(lambda: by_group('max by (group) (txmq_check_due_oldest_age_seconds{namespace=~"$namespace"})')
                   .get(groups["orphaned"], 0) > 0, 20, interval=0.3, message="orphaned checks show no due age")
        lag = by_group('histogram_quantile(0.99, sum by (group, le) '
                       '(rate(txmq_check_lag_seconds_bucket{namespace=~"$namespace"}[1m])))')
        assert 0 <= lag[groups["checked"]] < 5
        proxy_in = prometheus.query(_substitute(
            'sum by (topic) (txmq_proxy_messages_in_total{namespace=~"$namespace"})'))
        assert {s["metric"]["topic"]: float(s["value"][1]) for s in proxy_in}.get(rmq_topic) == 8
        ended = prometheus.query(_substitute('sum by (resolution, source, result) '
                                             '(txmq_proxy_end_transactions_total{namespace=~"$namespace"})'))
        assert {(s["metric"]["resolution"], s["metric"]["source"], s["metric"]["result"]) for s in ended} >= \
            {("commit", "client", "ok"), ("rollback", "client", "ok")}
    finally:
        clients.close()
        for p in producers:
            p.close()


# ---------------------------------------------------------------------------- replication
def _replication_alerts(helm_bin: Path) -> dict[str, str]:
    """The replication alerts' expressions as the chart renders them for a replicated release."""
    from .chart import render, scenario_file

    (rule,) = render(helm_bin, [scenario_file("replicated")]).of_kind("PrometheusRule")
    return {r["alert"]: r["expr"] for g in rule["spec"]["groups"] if g["name"] == "txmq.replication"
            for r in g["rules"]}


def test_replication_panels_and_alerts_follow_a_live_replicated_shard(
        prometheus: Prometheus, replicated_cluster: Cluster, helm_bin: Path) -> None:
    """The replication panels and alert expressions on a real 3-replica shard: healthy, then
    with a follower stopped (under-replicated, in-sync set shrunk), then with both stopped
    and a write refused."""
    cluster = replicated_cluster
    replicas = cluster.shards["broker-0"]
    leader = cluster.wait_leaders()["broker-0"]
    leader_id = replicas.index(leader)
    followers = [i for i in range(3) if i != leader_id]

    def values(expr: str) -> dict[tuple[str, ...], float]:
        return {tuple(v for k, v in sorted(s["metric"].items())): float(s["value"][1])
                for s in prometheus.query(_substitute(expr))}

    queries = [(title, expr) for title, expr in _queries() if "txmq_replica_" in expr]
    assert len(queries) >= 7
    wait_until(lambda: all(values(expr) for _title, expr in queries), 30, interval=0.3,
               message=lambda: "replication panels without data: "
                               f"{[t for t, e in queries if not values(e)]}")
    ns = 'namespace=~"$namespace"'
    wait_until(lambda: values(f"max by (shard) (txmq_replica_insync_replicas{{{ns}}})") == {(SHARD,): 3.0}, 20,
               interval=0.3, message="the in-sync set never reached 3")
    assert values(f"max by (shard) (txmq_replica_replication_factor{{{ns}}})") == {(SHARD,): 3.0}
    assert values(f"max by (shard) (txmq_replica_min_insync_replicas{{{ns}}})") == {(SHARD,): 2.0}
    assert values(f"sum by (shard) (txmq_replica_is_leader{{{ns}}})") == {(SHARD,): 1.0}
    assert values(f"max by (shard) (txmq_replica_leader_epoch{{{ns}}})")[(SHARD,)] > 0
    # Lag is reported by the leader, per follower.
    lag = prometheus.query(_substitute(f"max by (replica) (txmq_replica_lag_seconds{{{ns}}})"))
    assert sorted(int(s["metric"]["replica"]) for s in lag) == followers
    alerts = _replication_alerts(helm_bin)
    assert set(alerts) == {"TxmqShardWithoutLeader", "TxmqShardUnderReplicated", "TxmqShardInsyncShrinking",
                           "TxmqWritesRefused"}
    for name, expr in alerts.items():
        assert prometheus.query(expr) == [], f"{name} on a healthy shard"

    def firing(name: str) -> bool:
        return [s["metric"].get("shard") for s in prometheus.query(alerts[name])] == [SHARD]

    try:
        # One follower stops: the leader drops it from the in-sync set (replica_lag_max_seconds).
        replicas[followers[0]].stop()
        wait_until(lambda: firing("TxmqShardUnderReplicated") and firing("TxmqShardInsyncShrinking"), 30,
                   interval=0.3, message=lambda: f"no under-replication seen: {values(alerts['TxmqShardUnderReplicated'])}")
        assert not firing("TxmqShardWithoutLeader") and not firing("TxmqWritesRefused")
        # The other stops too: fewer than min_insync_replicas, so writes are refused.
        replicas[followers[1]].stop()

        def refused() -> bool:
            try:
                cluster.admin_stub(cluster.nameserver_address).CreateTopic(
                    admin_pb2.CreateTopicRequest(topic=f"refused-{time.monotonic_ns()}", queue_count=1), timeout=5)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return firing("TxmqWritesRefused")

        wait_until(refused, 30, interval=0.5, message="refused writes never showed")
        assert values(f"sum by (shard) (rate(txmq_replica_writes_refused_total{{{ns}}}[1m]))")[(SHARD,)] > 0
    finally:
        for i in followers:
            if not replicas[i].running:
                cluster.restart_broker(cluster.brokers.index(replicas[i]))
