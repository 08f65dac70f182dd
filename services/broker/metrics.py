"""Broker metrics. Gauges that describe stored state are computed at scrape time from
the broker's own counters and indexes, so they cannot drift from it: the event loop copies
the in-memory state (``BrokerCore.snapshot``) while the scrape's thread waits, and the
scrape reads the store from there."""

from __future__ import annotations

import asyncio
import contextlib
import concurrent.futures
import logging
from typing import Any, Callable, Iterator

import grpc
from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.common.metrics import BaseMetrics

from .base import first_time
from .core import BrokerCore, StateSnapshot
from .globalviews import GlobalStats
from .groups import describe_positions
from .schedule import NO_DUE_MS, count_due
from .store.codec import KIND_HALF, STATE_NAMES

log = logging.getLogger(__name__)

#: How long a scrape waits for the event loop to copy the state it shows.
SNAPSHOT_TIMEOUT_SECONDS = 5.0

_SOURCES = {1: "client", 2: "check", 3: "operator", 4: "broker"}
#: Labels of the global transaction counters, created at start so their series exist at 0.
GLOBAL_RESULTS = ("committed", "rolled_back", "discarded")
#: An ack's entry status codes for a stale receipt handle (NOT_FOUND, FAILED_PRECONDITION).
_STALE_CODES = frozenset({grpc.StatusCode.NOT_FOUND.value[0], grpc.StatusCode.FAILED_PRECONDITION.value[0]})
GLOBAL_PUSH_RESULTS = ("acknowledged", "failed")
GLOBAL_PULL_ANSWERS = ("committed", "rolled_back", "discarded", "prepared", "unknown", "failed")


class BrokerMetrics(BaseMetrics):
    def __init__(self) -> None:
        super().__init__("broker")
        self.messages_in = Counter("txmq_messages_in_total", "Messages stored, by topic and type",
                                   ["topic", "type"], registry=self.registry)
        self.messages_out = Counter("txmq_messages_out_total", "Messages delivered to consumers, by topic",
                                    ["topic"], registry=self.registry)
        self.acks = Counter("txmq_acks_total", "Acknowledgements applied (ok) or refused (stale: the handle was "
                            "redelivered since or already acknowledged; invalid), by how they came (ack: "
                            "AckMessages; receive: carried on a ReceiveMessages)", ["via", "result"],
                            registry=self.registry)
        self.transactions_ended = Counter(
            "txmq_transactions_ended_total", "Transaction decisions, by group, resolution and source",
            ["group", "resolution", "source"], registry=self.registry)
        self.transactions_discarded = Counter(
            "txmq_transactions_discarded_total", "Transactions discarded (check budget or lifetime spent)",
            ["group"], registry=self.registry)
        self.produce_messages = Counter(
            "txmq_produce_stream_messages_total", "Produce stream messages, by direction (in: requests, "
            "out: responses); entries per message is the batching clients get", ["direction"],
            registry=self.registry)
        self.produce_entries = Counter("txmq_produce_entries_total", "Sends and EndTransactions on Produce streams",
                                       registry=self.registry)
        self.produce_shed = Counter(
            "txmq_produce_entries_shed_total", "Sends on Produce streams refused in band with OVERLOADED "
            "(max_pending_produce_entries reached; nothing applied, the client retries them)", registry=self.registry)
        self.produce_in = self.produce_messages.labels("in")
        self.produce_out = self.produce_messages.labels("out")
        self.wal_sync_seconds = Histogram(
            "txmq_store_wal_sync_seconds", "WAL syncs (fdatasync on the event loop: the wait a "
            "flush=sync acknowledgement adds)", registry=self.registry,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.wal_sync_writes = Counter("txmq_store_wal_synced_writes", "Write batches made durable by WAL syncs "
                                       "(÷ syncs = writes per group commit)", registry=self.registry)
        self.timer_lateness = Histogram(
            "txmq_timer_lateness_seconds", "Delay / timer messages: due time → moved into their queue "
            "(visible)", registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0))
        self.global_transactions = Counter(
            "txmq_global_transactions_total", "Multi-message (global) transactions this broker coordinates that "
            "ended, by result (committed, rolled_back, discarded: every part went to %DISCARD%; one decided "
            "after its discard counts again)", ["result"], registry=self.registry)
        self.global_pushes = Counter(
            "txmq_global_pushes_total", "A global transaction's decision (or discard) pushed to a participant, "
            "by result (acknowledged; failed: tried again after check_interval_seconds)", ["result"],
            registry=self.registry)
        self.global_pulls = Counter(
            "txmq_global_pulls_total", "Questions to a global transaction's coordinator about parts undecided "
            "here, by answer (committed, rolled_back, discarded: applied; prepared, failed: asked again; "
            "unknown: G unknown to its coordinator, rolled back)", ["answer"], registry=self.registry)
        self.replication_refused = Counter(
            "txmq_replication_sessions_refused_total", "Follower connections this replica's replication port "
            "refused, by status code (UNAUTHENTICATED / PERMISSION_DENIED: its credentials; FAILED_PRECONDITION: "
            "not the leader of its epoch; INVALID_ARGUMENT, DEADLINE_EXCEEDED: a bad or late hello; "
            "RESOURCE_EXHAUSTED: too many connections)", ["code"], registry=self.registry)
        for result in GLOBAL_RESULTS:
            self.global_transactions.labels(result)
        for result in GLOBAL_PUSH_RESULTS:
            self.global_pushes.labels(result)
        for answer in GLOBAL_PULL_ANSWERS:
            self.global_pulls.labels(answer)
        self.store_bytes_value = 0
        self._ended: dict[tuple[str, int, int], Any] = {}
        self._stored: dict[tuple[str, int], Any] = {}
        self._delivered: dict[str, Any] = {}

    # The per-message paths look their labelled child up in a dict: ``labels()`` costs
    # microseconds on every call.

    def record_end(self, group: str, state: int, source: int) -> None:
        child = self._ended.get((group, state, source))
        if child is None:
            resolution = "commit" if STATE_NAMES.get(state) == "COMMITTED" else "rollback"
            child = self._ended[(group, state, source)] = self.transactions_ended.labels(
                group, resolution, _SOURCES.get(source, "unknown"))
        child.inc()

    def record_replication_refused(self, code: str) -> None:
        """A follower's connection refused on the replication port (``transport.py``)."""
        self.replication_refused.labels(code).inc()

    def record_sync(self, seconds: float, writes: int) -> None:
        self.wal_sync_seconds.observe(seconds)
        self.wal_sync_writes.inc(writes)

    def record_discard(self, group: str) -> None:
        self.transactions_discarded.labels(group).inc()

    def producer_group_gone(self, group: str) -> None:
        """A producer group deleted (``producerdelete.py``): its labelled series go (its gauges
        went with its counters row)."""
        for key in [key for key in self._ended if key[0] == group]:
            del self._ended[key]
            _group, state, source = key
            resolution = "commit" if STATE_NAMES.get(state) == "COMMITTED" else "rollback"
            self.transactions_ended.remove(group, resolution, _SOURCES.get(source, "unknown"))
        with contextlib.suppress(KeyError):  # none discarded: no series
            self.transactions_discarded.remove(group)

    def record_global(self, result: str) -> None:
        self.global_transactions.labels(result).inc()

    def record_global_push(self, result: str) -> None:
        self.global_pushes.labels(result).inc()

    def record_global_pull(self, answer: str) -> None:
        self.global_pulls.labels(answer).inc()

    def record_timer_moved(self, lateness_ms: list[int]) -> None:
        for ms in lateness_ms:
            self.timer_lateness.observe(ms / 1000)

    def record_stored(self, topic: str, kind: int) -> None:
        child = self._stored.get((topic, kind))
        if child is None:
            child = self._stored[(topic, kind)] = self.messages_in.labels(
                topic, "transaction" if kind == KIND_HALF else "normal")
        child.inc()

    def record_acks(self, via: str, codes: list[int]) -> None:
        """One count per acknowledgement by its entry status code."""
        ok = codes.count(0)
        stale = sum(1 for code in codes if code in _STALE_CODES)
        for result, count in (("ok", ok), ("stale", stale), ("invalid", len(codes) - ok - stale)):
            if count:
                self.acks.labels(via, result).inc(count)

    def record_delivered(self, topic: str, count: int) -> None:
        child = self._delivered.get(topic)
        if child is None:
            child = self._delivered[topic] = self.messages_out.labels(topic)
        child.inc(count)

    def watch(self, current: Callable[[], "tuple[BrokerCore, Any] | None"]) -> None:
        """Scrapes describe the state ``current()`` returns: (core, bridge), or None on a
        replica that does not lead (it serves no state of its own)."""
        self.registry.register(_StateCollector(current, self))

    def watch_replication(self, node: Any) -> None:
        self.registry.register(_ReplicationCollector(node))


class _ReplicationCollector(Collector):
    """Replication of a replicated shard, from this replica's point of view."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        status = node.status()
        leader = node.is_leader
        info = GaugeMetricFamily("txmq_replica_info", "1, labelled with this replica's shard and replica id "
                                 "(join on it to group the other replica metrics by shard)",
                                 labels=["shard", "replica"])
        info.add_metric([node.shard, str(node.replica_id)], 1)
        yield info
        yield GaugeMetricFamily("txmq_replica_is_leader", "1 on the replica that leads its shard",
                                value=1 if leader else 0)
        yield GaugeMetricFamily("txmq_replica_leader_epoch", "The leader epoch this replica knows (etcd revision)",
                                value=node.known_epoch())
        yield CounterMetricFamily("txmq_replica_leadership_changes", "Times this replica became or stopped being "
                                  "its shard's leader", value=node.leadership_changes)
        yield GaugeMetricFamily("txmq_replica_log_end", "Last replication log entry on this replica",
                                value=status.log_end)
        yield GaugeMetricFamily("txmq_replica_commit_lsn", "Entries on every in-sync replica (acknowledged)",
                                value=status.commit_lsn)
        yield CounterMetricFamily("txmq_replica_messages_shipped", "Replication stream messages with entries "
                                  "this replica sent as leader (to all followers; a follower appends and syncs "
                                  "each as one batch)", value=node.messages_shipped)
        if not leader:
            return
        yield GaugeMetricFamily("txmq_replica_insync_replicas", "Members of the shard's in-sync set",
                                value=len(status.in_sync_replicas))
        yield GaugeMetricFamily("txmq_replica_min_insync_replicas", "min_insync_replicas of the shard",
                                value=status.min_insync_replicas)
        yield GaugeMetricFamily("txmq_replica_replication_factor", "Replicas of the shard",
                                value=status.replication_factor)
        yield CounterMetricFamily("txmq_replica_writes_refused", "Writes refused for too few in-sync replicas",
                                  value=node.refused_writes)
        records = GaugeMetricFamily("txmq_replica_lag_records", "Entries a follower lacks", labels=["replica"])
        seconds = GaugeMetricFamily("txmq_replica_lag_seconds", "How long since a follower was caught up",
                                    labels=["replica"])
        in_sync = GaugeMetricFamily("txmq_replica_in_sync", "1 when a follower is in the in-sync set",
                                    labels=["replica"])
        for f in status.followers:
            records.add_metric([str(f.replica_id)], f.lag_records)
            seconds.add_metric([str(f.replica_id)], f.lag_seconds)
            in_sync.add_metric([str(f.replica_id)], 1 if f.in_sync else 0)
        yield from (records, seconds, in_sync)


def _consumer_families(db: Any, snap: StateSnapshot) -> Iterator[Metric]:
    """Consumer lag in seconds (the oldest unacknowledged message's age) and dead letters."""
    queues, dead = describe_positions(db, snap.positions, snap.topics, snap.queue_next, snap.now_ms)
    lag = GaugeMetricFamily("txmq_consumer_lag_seconds", "How long the oldest message a consumer group has not "
                            "acknowledged has been visible, by topic (0: caught up)", labels=["group", "topic"])
    oldest: dict[tuple[str, str], float] = {}
    for q in queues:
        oldest[(q.group, q.topic)] = max(oldest.get((q.group, q.topic), 0.0), q.lag_seconds)
    for (group, topic), value in sorted(oldest.items()):
        lag.add_metric([group, topic], value)
    letters = GaugeMetricFamily("txmq_dead_letters", "Messages in %DLQ%<group> not re-driven, by consumer group "
                                "(counted up to 100,000)", labels=["group"])
    for group, count in sorted(dead.items()):
        letters.add_metric([group], count)
    yield from (lag, letters)


def _global_families(stats: GlobalStats) -> Iterator[Metric]:
    """Multi-message (global) transactions: live work of the commit protocol on this broker."""
    yield GaugeMetricFamily("txmq_global_transactions_open", "Global transactions this broker coordinates "
                            "that are undecided (PREPARED, or DISCARDED awaiting an operator)", value=stats.open)
    yield GaugeMetricFamily("txmq_global_pushes_pending", "Participants still to be told a global "
                            "transaction's decision or discard (pushed until they acknowledge)",
                            value=stats.pushes_pending)
    yield GaugeMetricFamily("txmq_global_push_oldest_age_seconds", "How long the oldest decision not yet "
                            "acknowledged by every participant has waited (0: none; since the broker "
                            "started for one it found in its store)", value=stats.oldest_push_ms / 1000)
    parts = GaugeMetricFamily("txmq_global_parts_undecided", "Parts of global transactions stored here "
                              "and not yet decided, by state (prepared: waiting for the decision; discarded: "
                              "the transaction was discarded, waiting for an operator)", labels=["state"])
    parts.add_metric(["prepared"], stats.parts_prepared)
    parts.add_metric(["discarded"], stats.parts_discarded)
    yield parts
    yield GaugeMetricFamily("txmq_global_part_oldest_prepared_age_seconds", "How long the oldest PREPARED part "
                            "of a global transaction here has waited for the decision (0: none)",
                            value=stats.oldest_prepared_part_ms / 1000)


def take_snapshot(core: BrokerCore, loop: asyncio.AbstractEventLoop,
                  timeout: float = SNAPSHOT_TIMEOUT_SECONDS) -> StateSnapshot | None:
    """``core.snapshot()`` taken on ``loop`` (the thread that owns the domain), waited for
    here; None when the loop does not take it in ``timeout`` or is closed (a stopping
    broker): the scrape then shows no state."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        return core.snapshot()
    future: concurrent.futures.Future[StateSnapshot] = concurrent.futures.Future()

    def take() -> None:
        if not future.set_running_or_notify_cancel():
            return  # the scrape gave up waiting
        try:
            future.set_result(core.snapshot())
        except BaseException as exc:  # noqa: BLE001 - raised in the scrape's thread
            future.set_exception(exc)
    try:
        loop.call_soon_threadsafe(take)
    except RuntimeError:  # the loop is closed
        return None
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        log.warning("metrics scrape: the event loop took no state snapshot within %.1f s", timeout)
        return None


class _StateCollector(Collector):
    """The domain's state at scrape time: a snapshot the event loop takes (in-memory state
    is never read on the scrape's thread), then reads of the store from the floors in it."""

    def __init__(self, current: Callable[[], "tuple[BrokerCore, Any] | None"], metrics: BrokerMetrics) -> None:
        self.current = current
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        pair = self.current()
        if pair is None:
            return
        core, bridge = pair
        snap = take_snapshot(core, bridge.loop)
        if snap is None:
            return
        db = core.db
        now = snap.now_ms
        pending = GaugeMetricFamily("txmq_transactions_pending", "PREPARED transactions, by producer group",
                                    labels=["group"])
        discarded = GaugeMetricFamily("txmq_transactions_discarded",
                                      "DISCARDED transactions not yet resolved, by producer group",
                                      labels=["group"])
        oldest = GaugeMetricFamily("txmq_transaction_oldest_pending_age_seconds",
                                   "Age of the oldest PREPARED transaction, by producer group",
                                   labels=["group"])
        due = GaugeMetricFamily("txmq_check_due_oldest_age_seconds",
                                "How long the oldest due check has waited (0 when none is due)",
                                labels=["group"])
        waiting = GaugeMetricFamily("txmq_checks_waiting",
                                    "Checks due and not claimed: waiting for capacity of the group's "
                                    "producers (or for a producer), counted up to 100,000", labels=["group"])
        for group, (p, d) in sorted(snap.counters.items()):
            pending.add_metric([group], p)
            discarded.add_metric([group], d)
            first = snap.oldest_pending_ms.get(group)
            oldest.add_metric([group], max(now - first, 0) / 1000 if first else 0.0)
            floor = snap.due_floors.get(group, (NO_DUE_MS, 0))
            first_due = first_time(db, "due", group, floor[0])
            due.add_metric([group], max(now - first_due, 0) / 1000 if first_due else 0.0)
            waiting.add_metric([group], count_due(db, group, floor, now))
        yield from (pending, discarded, oldest, due, waiting)
        lag = GaugeMetricFamily("txmq_consumer_lag_messages",
                                "Messages not yet acknowledged by a consumer group, by topic",
                                labels=["group", "topic"])
        totals: dict[tuple[str, str], int] = {}
        for pos in snap.positions:
            totals[(pos.group, pos.topic)] = totals.get((pos.group, pos.topic), 0) + max(
                snap.queue_next.get((pos.topic, pos.queue_id), 0) - pos.ack_offset, 0)
        for (group, topic), value in sorted(totals.items()):
            lag.add_metric([group, topic], value)
        yield lag
        yield from _consumer_families(db, snap)
        yield from _global_families(snap.globals)
        yield GaugeMetricFamily("txmq_store_bytes", "Bytes of the broker's RocksDB directory",
                                value=self.metrics.store_bytes_value)
        yield GaugeMetricFamily("txmq_disk_free_bytes", "Free bytes on the broker's data volume",
                                value=snap.free_disk_bytes)
        yield CounterMetricFamily("txmq_store_writes", "RocksDB write batches (one per request, or per Produce stream message)",
                                  value=db.written)
        yield CounterMetricFamily("txmq_store_operations", "Operations applied to the store",
                                  value=db.ops_written)
        yield CounterMetricFamily("txmq_store_wal_syncs", "WAL syncs (group commits; 0 with flush=async)",
                                  value=bridge.syncs)
        yield CounterMetricFamily("txmq_store_written_bytes", "Key and value bytes put into RocksDB",
                                  value=db.bytes_written)
