"""Talking to txmq from Spark's Python processes: routes and brokers through the name
servers, offset reads (``ReadQueue`` / ``GetQueueOffsets``, which touch no consumer group)
and pages of the transaction table (``QueryTransactions``).

gRPC channels are not picklable: every object here is created where it is used (on the
driver while planning, on an executor inside ``read``/``write``) and closed there.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator

from txmq.client import Client
from txmq.errors import TxmqError
from txmq.ids import TransactionId
from txmq.names import is_system_topic
from txmq.tls import TLS
from txmq.v1 import broker_pb2, common_pb2, nameserver_pb2

#: Messages asked for per ReadQueue call (the broker caps it at 4 x max_receive_batch).
READ_BATCH = 1024
#: Transactions asked for per QueryTransactions page (the broker caps it at 10,000).
TXN_PAGE = 5000

STATE_NAMES = {common_pb2.TRANSACTION_STATE_PREPARED: "PREPARED",
               common_pb2.TRANSACTION_STATE_COMMITTED: "COMMITTED",
               common_pb2.TRANSACTION_STATE_ROLLED_BACK: "ROLLED_BACK",
               common_pb2.TRANSACTION_STATE_DISCARDED: "DISCARDED"}
STATE_VALUES = {name: value for value, name in STATE_NAMES.items()}
SOURCE_NAMES = {common_pb2.TRANSACTION_SOURCE_CLIENT: "CLIENT",
                common_pb2.TRANSACTION_SOURCE_CHECK: "CHECK",
                common_pb2.TRANSACTION_SOURCE_OPERATOR: "OPERATOR",
                common_pb2.TRANSACTION_SOURCE_BROKER: "BROKER"}


#: The options giving the connector TLS material (the CLI's --tls-* flags), as txmq.TLS fields.
TLS_OPTIONS = {"tls.ca": "ca_file", "tls.cert": "cert_file", "tls.key": "key_file", "tls.serverName": "server_name"}


def tls_from_options(options: Any) -> TLS | None:
    """The TLS the options ask for (None: plaintext). Read on the driver; a TLS value is
    pickled to the tasks, which read the files (the same paths must exist on executors)."""
    lowered = {str(k).lower(): v for k, v in dict(options).items()}
    fields = {field: lowered.get(name.lower()) or "" for name, field in TLS_OPTIONS.items()}
    if not (fields["ca_file"] or fields["cert_file"] or fields["key_file"]):
        return None
    return TLS(**fields)


def tls_options(tls: TLS | None) -> dict[str, str]:
    """The options giving the connector ``tls`` (none for plaintext): how a job passes its
    own TLS to the reads it starts."""
    if tls is None:
        return {}
    return {name: getattr(tls, field) for name, field in TLS_OPTIONS.items() if getattr(tls, field)}


def connect(nameserver: str, tls: TLS | None = None) -> Client:
    """A client of the cluster; on a cluster with auth on it sends the bearer token in
    ``TXMQ_TOKEN`` (set it on the driver and, with ``spark.executorEnv.TXMQ_TOKEN``, on the
    executors: the token never travels inside Spark plans or partitions)."""
    return Client(nameserver, request_timeout_seconds=30.0, route_refresh_seconds=5.0, what="txmq-pipeline",
                  tls=tls, token=os.environ.get("TXMQ_TOKEN") or None)


def timestamp(ms: int) -> dt.datetime | None:
    """Broker milliseconds → an aware UTC datetime (None for 0, "never")."""
    if not ms:
        return None
    return dt.datetime.fromtimestamp(ms / 1000.0, tz=dt.UTC)


@dataclass(frozen=True)
class Broker:
    name: str
    address: str
    topics: tuple[tuple[str, int], ...]


def list_brokers(client: Client) -> list[Broker]:
    response = client._nameserver_call("ListBrokers", nameserver_pb2.ListBrokersRequest())
    return sorted((Broker(b.name, b.address, tuple((t.topic, t.queue_count) for t in b.topics))
                   for b in response.brokers), key=lambda b: b.name)


def user_topics(client: Client) -> list[str]:
    """Every topic some live broker holds, system topics (``%...``) excluded."""
    return sorted({t for b in list_brokers(client) for t, _ in b.topics if not is_system_topic(t)})


@dataclass(frozen=True)
class QueueRange:
    """Offsets [start, end) of one queue of a topic on one broker."""

    topic: str
    broker: str
    address: str
    queue: int
    start: int
    end: int


def queue_offsets(client: Client, topic: str) -> dict[tuple[str, int], tuple[str, int, int]]:
    """(broker, queue) → (address, oldest retained offset, next offset) for every queue of
    ``topic`` on a live broker (brokers found through the topic's route)."""
    response = client._nameserver_call("QueryRoute", nameserver_pb2.QueryRouteRequest(topic=topic))
    addresses = {q.broker_name: q.broker_address for q in response.queues}
    out: dict[tuple[str, int], tuple[str, int, int]] = {}
    for name, address in sorted(addresses.items()):
        offsets = client.call(client.broker(address).GetQueueOffsets,
                              broker_pb2.GetQueueOffsetsRequest(topic=topic))
        for q in offsets.queues:
            out[(name, q.queue_id)] = (address, q.min_offset, q.max_offset)
    return out


#: How long a read keeps retrying a shard that is failing over (its leader moving).
FOLLOW_LEADER_SECONDS = 30.0


def on_shard(client: Client, broker: str, address: str, method: str, request: Any) -> Any:
    """One call to shard ``broker``: while it answers retryably (unreachable, NOT_LEADER
    during a fail-over of a replicated shard), its address is looked up again and the call
    retried, for up to FOLLOW_LEADER_SECONDS. Reads are idempotent, so retrying is safe."""
    deadline = time.monotonic() + FOLLOW_LEADER_SECONDS
    delay = 0.05
    while True:
        try:
            return client.call(getattr(client.broker(address), method), request)
        except TxmqError as exc:
            if not exc.retryable or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
        try:
            address = client.broker_address(broker, refresh=True)
        except TxmqError:
            pass  # no leader routed yet: try the last address again


def read_queue(client: Client, r: QueueRange, max_messages: int = READ_BATCH
               ) -> Iterator[common_pb2.DeliveredMessage]:
    """Committed messages of ``r`` in offset order (from the oldest retained one when
    ``r.start`` is below it); follows the shard's leader if it moves meanwhile."""
    offset = r.start
    while offset < r.end:
        response = on_shard(client, r.broker, r.address, "ReadQueue", broker_pb2.ReadQueueRequest(
            topic=r.topic, queue_id=r.queue, start_offset=offset, end_offset=r.end,
            max_messages=min(max_messages, r.end - offset)))
        yield from response.messages
        if response.next_offset <= offset:
            return  # nothing more below r.end (the queue ends earlier than planned)
        offset = response.next_offset


def store_id_and_sequences(client: Client, address: str) -> tuple[int, int, int] | None:
    """(store id, first sequence, last sequence) of a broker's transaction table, or None
    when it is empty: the first row from QueryTransactions, the last from GetBrokerStats."""
    stub = client.broker(address)
    first = client.call(stub.QueryTransactions, broker_pb2.QueryTransactionsRequest(limit=1))
    if not first.transactions:
        return None
    head = TransactionId.decode(first.transactions[0].transaction_id)
    stats = client.call(stub.GetBrokerStats, broker_pb2.GetBrokerStatsRequest())
    last = TransactionId.decode(stats.last_transaction_id).sequence if stats.last_transaction_id else head.sequence
    return head.store_id, head.sequence, max(last, head.sequence)


def read_transactions(client: Client, broker: str, address: str, store_id: int, first_seq: int,
                      last_seq: int, producer_group: str = "", state: int = 0,
                      ) -> Iterator[common_pb2.Transaction]:
    """Transaction rows with sequences in [first_seq, last_seq], paged in order."""
    after = first_seq - 1
    while after < last_seq:
        token = TransactionId(broker, store_id, after).encode() if after > 0 else ""
        page = on_shard(client, broker, address, "QueryTransactions", broker_pb2.QueryTransactionsRequest(
            producer_group=producer_group, state=state, page_token=token,
            limit=max(1, min(TXN_PAGE, last_seq - after))))
        for t in page.transactions:
            seq = TransactionId.decode(t.transaction_id).sequence
            if seq > last_seq:
                return
            yield t
            after = seq
        if not page.next_page_token:
            return
        after = max(after, TransactionId.decode(page.next_page_token).sequence)


__all__ = ["Broker", "QueueRange", "TxmqError", "connect", "list_brokers", "on_shard", "queue_offsets", "read_queue",
           "read_transactions", "store_id_and_sequences", "timestamp", "tls_options", "user_topics"]
