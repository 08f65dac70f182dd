"""Proxy metrics: Telemetry streams by client type, check subscriptions, checks forwarded
to clients, EndTransaction by source and result, messages in and out per topic, acks and
dead-lettering by result, push consumers' invisibility renewals, the clients remembered (live
and departed). Labels are client types, results, states and topics only."""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from services.common.metrics import BaseMetrics
from txmq.faults import FaultTable


class FaultTableCollector(Collector):
    """The routing fault table's counters, read at scrape time: sends rerouted, shards
    avoided (1) or not (0), and per shard the calls that failed and the send latency (count
    and sum: rate(sum) / rate(count) is the mean). Labelled by shard (a broker name) only."""

    def __init__(self, faults: FaultTable) -> None:
        self.faults = faults

    def collect(self) -> Iterator[Metric]:
        stats = self.faults.stats()
        yield CounterMetricFamily("txmq_proxy_sends_rerouted", "Sends that failed on one shard and were "
                                  "sent again to another", value=stats.rerouted)
        avoided = GaugeMetricFamily("txmq_proxy_shard_avoided", "1 while new sends avoid the shard (it "
                                    "failed and no probe has succeeded since)", labels=["shard"])
        failures = CounterMetricFamily("txmq_proxy_shard_failures", "Calls to the shard that failed as if it "
                                       "were down (each such attempt of a send or of a call an id binds to it): "
                                       "what makes new sends avoid it",
                                       labels=["shard"])
        latency = SummaryMetricFamily("txmq_proxy_shard_send_seconds", "Latency of sends answered by each "
                                      "shard", labels=["shard"])
        for shard in stats.shards:
            avoided.add_metric([shard.shard], 1.0 if shard.avoided else 0.0)
            failures.add_metric([shard.shard], shard.failures)
            latency.add_metric([shard.shard], count_value=shard.successes, sum_value=shard.latency_seconds_sum)
        yield avoided
        yield failures
        yield latency


class ClientsCollector(Collector):
    """The clients the proxy remembers, read at scrape time: live (a Telemetry stream open)
    and departed (remembered by their topics for client_idle_expiry_seconds, at most
    max_departed_clients_per_principal per principal). Not labelled by principal or client id."""

    def __init__(self, counts: Callable[[], tuple[int, int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        live, departed = self.counts()
        clients = GaugeMetricFamily("txmq_proxy_clients", "RocketMQ clients this proxy remembers, by state: "
                                    "live (a Telemetry stream open) or departed (every stream ended, kept for "
                                    "client_idle_expiry_seconds, at most max_departed_clients_per_principal "
                                    "per principal)", labels=["state"])
        clients.add_metric(["live"], live)
        clients.add_metric(["departed"], departed)
        yield clients


class ProxyMetrics(BaseMetrics):
    def __init__(self) -> None:
        super().__init__("proxy")
        self.streams = Gauge(
            "txmq_proxy_telemetry_streams", "Open Telemetry streams of RocketMQ clients, by client type "
            "(apache.rocketmq.v2.ClientType number)", ["client_type"], registry=self.registry)
        self.subscriptions = Gauge(
            "txmq_proxy_check_subscriptions", "CheckTransactionState streams held for connected producers "
            "(one per producer client and checker)", registry=self.registry)
        self.checks = Counter(
            "txmq_proxy_checks_total", "Checks from the checkers by result: forwarded (written to the "
            "client's Telemetry stream), no_stream (the client has no live stream here), answered "
            "(answer relayed to the checker), orphan_rolled_back (the orphan of a send this proxy moved "
            "to another shard, answered ROLLBACK without asking the client), held_back (the client's "
            "connection held max_pending_checks_per_connection checks already: not written, it stays due)",
            ["result"], registry=self.registry)
        self.checks_pending = Gauge(
            "txmq_proxy_checks_pending", "Checks offered to clients here and not yet answered or forgotten",
            registry=self.registry)
        self.end_transactions = Counter(
            "txmq_proxy_end_transactions_total", "EndTransaction calls by resolution, source "
            "(client, server_check) and result (ok, deferred: its shard was down, the check decides, or the "
            "RocketMQ code name)",
            ["resolution", "source", "result"], registry=self.registry)
        self.messages_in = Counter(
            "txmq_proxy_messages_in_total", "Messages sent through the proxy, by topic", ["topic"],
            registry=self.registry)
        self.messages_out = Counter(
            "txmq_proxy_messages_out_total", "Messages delivered through the proxy, by topic", ["topic"],
            registry=self.registry)
        self.acks = Counter(
            "txmq_proxy_acks_total", "AckMessage entries by result (ok or the RocketMQ code name)", ["result"],
            registry=self.registry)
        self.dead_letters = Counter(
            "txmq_proxy_dead_letters_total", "ForwardMessageToDeadLetterQueue calls by result (ok or the "
            "RocketMQ code name)", ["result"], registry=self.registry)
        self.renewals = Counter(
            "txmq_proxy_renewals_total", "Invisibility renewals of push consumers' deliveries (auto_renew) by "
            "result: ok, error (retried), and how renewing ended: gone (acknowledged elsewhere, "
            "redelivered or dead-lettered), client_gone, max_time", ["result"], registry=self.registry)
        self.renewing = Gauge(
            "txmq_proxy_renewing_deliveries", "Deliveries whose invisibility the proxy is renewing",
            registry=self.registry)

    def watch_clients(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Exposes the clients remembered (``ClientsCollector``): ``counts`` gives (live, departed)."""
        self.registry.register(ClientsCollector(counts))

    def watch_faults(self, faults: FaultTable) -> None:
        """Exposes the routing fault table (``FaultTableCollector``)."""
        self.registry.register(FaultTableCollector(faults))
