"""The transactional streaming sink: ``df.writeStream.format("txmq")``.

Each micro-batch is one set of txmq transactions::

    executor tasks (write)     every row → a half message with a deterministic message id
                               (unique bytes = sha256(query id, sink epoch, batch id,
                               partition, row index)), bound to a broker queue chosen from
                               the same hash; returns the transaction ids
    driver commit(batchId)     records "batch B committed with epoch E" in the sink log, then
                               EndTransaction COMMIT for every transaction of the batch
    driver abort(batchId)      records "batch B of epoch E aborted" and moves to epoch E+1,
                               then EndTransaction ROLLBACK for what the tasks reported

Exactly once: a task retried within a batch sends the same ids, which the broker
deduplicates (also after the decision), and a batch re-run after a driver crash (it
reached neither commit nor abort, or commit but not Spark's commit log) sends the same
ids again: a repeated half send returns the first transaction and its state, and a
repeated COMMIT is idempotent. Only an **abort** changes the ids of a re-run: its
transactions were rolled back, and the broker would answer the same ids with
ROLLED_BACK forever, so the sink's epoch (part of the id) moves on.

Half messages a task wrote but never reported (it failed, or its batch never reached
commit or abort) are resolved by checks: :class:`SinkCheckResponder` answers for the
sink's producer group from the sink log kept inside the query's checkpoint — batch
committed with that epoch → COMMIT; batch aborted, or committed with another epoch, or an
epoch that is over → ROLLBACK; the running batch → IN_PROGRESS (asked again later, nothing
spent). Run it on the driver while the query runs::

    with SinkCheckResponder(nameserver=ns, producer_group="orders-sink", checkpoint_location=ckpt):
        query = (df.writeStream.format("txmq").option("nameserver", ns)
                 .option("topic", "orders").option("producerGroup", "orders-sink")
                 .option("checkpointLocation", ckpt).start())
        query.awaitTermination()

Columns: ``body`` (binary or string, required), and optionally ``topic`` (else
``option("topic")``), ``key`` (string) or ``keys`` (array), ``tag``, ``properties`` (map).

The sink log lives in ``<checkpointLocation>/txmq-sink`` and is read and written with
Python file I/O on the driver: the checkpoint must be a local or mounted path (on
Kubernetes a PersistentVolume), or set ``option("sinkLogPath", ...)`` to one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

import txmq
from txmq._errors import TransactionStateError, TxmqError, error_from_entry
from txmq._ids import MessageId
from txmq.v1 import broker_pb2, common_pb2

from . import _broker

log = logging.getLogger(__name__)

PROP_QUERY = "txmq-sink-query"
PROP_EPOCH = "txmq-sink-epoch"
PROP_BATCH = "txmq-sink-batch"
#: Requests in flight per task on a broker's Produce stream.
WINDOW = 512
ATTEMPTS = 5
#: How long an IN_PROGRESS answer defers the next check of a running batch's message.
IN_PROGRESS_RETRY_SECONDS = 2.0


# ----------------------------------------------------------------------------- the sink log

def _local_path(location: str) -> Path:
    if location.startswith("file://"):
        location = location[len("file://"):]
    elif location.startswith("file:"):
        location = location[len("file:"):]
    elif "://" in location:
        raise ValueError(f"the txmq sink keeps its log with Python file I/O on the driver: {location!r} is "
                         "not a local or mounted path; set option('sinkLogPath', '/mounted/path')")
    return Path(location)


class SinkLog:
    """``<checkpoint>/txmq-sink``: ``epoch`` (the current one), ``committed/<batch>`` (the
    epoch it committed with), ``aborted/<batch>-<epoch>``. Every file is written whole
    and renamed into place, so a reader never sees a torn one."""

    def __init__(self, checkpoint_location: str, sink_log_path: str | None = None) -> None:
        self.checkpoint = _local_path(checkpoint_location)
        self.root = _local_path(sink_log_path) if sink_log_path else self.checkpoint / "txmq-sink"

    @classmethod
    def from_options(cls, options: Any) -> "SinkLog":
        checkpoint = options.get("checkpointLocation") or ""
        if not checkpoint:
            raise ValueError("the txmq sink needs option('checkpointLocation', ...) (its log lives there)")
        return cls(checkpoint, options.get("sinkLogPath"))

    def _write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def epoch(self) -> int:
        try:
            return int((self.root / "epoch").read_text().strip() or 0)
        except FileNotFoundError:
            return 0

    def committed_epoch(self, batch: int) -> int | None:
        try:
            return int((self.root / "committed" / str(batch)).read_text().strip())
        except FileNotFoundError:
            return None

    def aborted(self, batch: int, epoch: int) -> bool:
        return (self.root / "aborted" / f"{batch}-{epoch}").exists()

    def mark_committed(self, batch: int, epoch: int) -> None:
        self._write(self.root / "committed" / str(batch), str(epoch))

    def mark_aborted(self, batch: int, epoch: int) -> None:
        self._write(self.root / "aborted" / f"{batch}-{epoch}", "")
        if self.epoch() <= epoch:
            self._write(self.root / "epoch", str(epoch + 1))

    def query_id(self) -> str | None:
        """The streaming query's id from Spark's ``<checkpoint>/metadata``."""
        try:
            return json.loads((self.checkpoint / "metadata").read_text().splitlines()[0]).get("id")
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def decide(self, query: str, epoch: int, batch: int) -> "txmq.LocalTransactionState | txmq.InProgress":
        """The answer to a check of a half message the sink wrote."""
        own = self.query_id()
        if own is not None and query != own:
            return txmq.LocalTransactionState.UNKNOWN  # another query's message: not ours to decide
        if self.aborted(batch, epoch):
            return txmq.LocalTransactionState.ROLLBACK
        committed = self.committed_epoch(batch)
        if committed is not None:
            return (txmq.LocalTransactionState.COMMIT if committed == epoch
                    else txmq.LocalTransactionState.ROLLBACK)
        if epoch < self.epoch():
            return txmq.LocalTransactionState.ROLLBACK  # an aborted epoch never commits again
        return txmq.InProgress(retry_after_seconds=IN_PROGRESS_RETRY_SECONDS)


# ----------------------------------------------------------------------------- writing

@dataclass
class SinkCommitMessage(WriterCommitMessage):
    epoch: int
    batch: int
    partition: int
    rows: int
    #: (broker address, transaction id, message id, state after the send)
    transactions: list[tuple[str, str, str, int]] = field(default_factory=list)


def message_unique(query: str, epoch: int, batch: int, partition: int, row: int) -> bytes:
    return hashlib.sha256(f"{query}\x00{epoch}\x00{batch}\x00{partition}\x00{row}".encode()).digest()[:16]


def _local_property(name: str) -> str | None:
    from pyspark import TaskContext
    context = TaskContext.get()
    return context.getLocalProperty(name) if context is not None else None


class _Sender:
    """Pipelines requests on the Produce streams of one client, retrying transient failures
    with the same request (the broker deduplicates sends by message id; decisions are
    idempotent)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.inflight: list[tuple[str, Any, Any, int, Any]] = []

    def submit(self, address: str, entry: Any, tag: Any, attempt: int = 1) -> None:
        reply = self.client.produce_stream(address).submit(entry)
        self.inflight.append((address, entry, reply, attempt, tag))

    def drain(self, keep: int = 0) -> Iterator[tuple[Any, Any]]:
        """Waits for the oldest requests until at most ``keep`` are in flight; yields (tag,
        result) of each, or raises the error of one that failed for good."""
        while len(self.inflight) > keep:
            address, entry, reply, attempt, tag = self.inflight.pop(0)
            try:
                result = reply.result(timeout=60)
                if result.status.code:
                    raise error_from_entry(result.status)
            except TxmqError as err:
                if err.retryable and attempt < ATTEMPTS:
                    time.sleep(min(0.1 * 2 ** attempt, 2.0))
                    self.submit(address, entry, tag, attempt + 1)
                    continue
                yield tag, err
                continue
            yield tag, result


class TxmqStreamWriter(DataSourceStreamWriter):
    """Created on the driver for every micro-batch (and for its commit/abort), pickled to the
    tasks: ``self.epoch`` is the sink log's epoch when the batch was planned."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.nameserver = options.get("nameserver") or ""
        self.tls = _broker.tls_from_options(options)
        if not self.nameserver:
            raise ValueError("the txmq sink needs option('nameserver', ...)")
        self.producer_group = options.get("producerGroup") or ""
        if not self.producer_group:
            raise ValueError("the txmq sink needs option('producerGroup', ...): the group its checks are asked of")
        self.topic = options.get("topic") or ""
        self.columns = set(schema.fieldNames())
        if "body" not in self.columns:
            raise ValueError("the txmq sink needs a 'body' column (binary or string)")
        if "topic" not in self.columns and not self.topic:
            raise ValueError("the txmq sink needs a 'topic' column or option('topic', ...)")
        immunity = options.get("checkImmunitySeconds")
        self.check_immunity_seconds = float(immunity) if immunity else 0.0
        self.log = SinkLog.from_options(options)
        self.epoch = self.log.epoch()

    # --- executors --------------------------------------------------------------------

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        from pyspark import TaskContext
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        batch = int(_local_property("streaming.sql.batchId") or -1)
        query = _local_property("sql.streaming.queryId") or "no-query"
        client = _broker.connect(self.nameserver, self.tls)
        sender = _Sender(client)
        out = SinkCommitMessage(self.epoch, batch, partition, 0)
        client_id = f"spark-sink-{query}"[:255]
        host = socket.gethostname()
        try:
            for index, row in enumerate(iterator):
                address, pb = self._message(client, row, query, batch, partition, index, client_id, host)
                sender.submit(address, broker_pb2.ProduceEntry(
                    send_message=broker_pb2.SendMessageRequest(message=pb)), address)
                out.rows += 1
                self._collect(sender.drain(WINDOW), out)
            self._collect(sender.drain(0), out)
        finally:
            client.close()
        return out

    def _message(self, client: Any, row: Any, query: str, batch: int, partition: int, index: int,
                 client_id: str, host: str) -> tuple[str, common_pb2.Message]:
        values = row.asDict() if hasattr(row, "asDict") else dict(row)
        topic = values.get("topic") or self.topic
        unique = message_unique(query, self.epoch, batch, partition, index)
        routes = client.route(topic)
        route = routes[int.from_bytes(unique[:4], "big") % len(routes)]
        body = values.get("body")
        if body is None:
            body = b""
        elif isinstance(body, str):
            body = body.encode()
        keys = list(values.get("keys") or [])
        if values.get("key"):
            keys.insert(0, str(values["key"]))
        properties = {str(k): str(v) for k, v in (values.get("properties") or {}).items()}
        properties.update({PROP_QUERY: query, PROP_EPOCH: str(self.epoch), PROP_BATCH: str(batch)})
        pb = common_pb2.Message(
            topic=topic, body=bytes(body), tag=values.get("tag") or "", keys=keys, properties=properties,
            message_id=MessageId(route.broker_name, route.queue_id, unique).encode(),
            type=common_pb2.MESSAGE_TYPE_TRANSACTION, producer_group=self.producer_group,
            producer_client_id=client_id, check_immunity_seconds=self.check_immunity_seconds,
            born_timestamp_ms=int(time.time() * 1000), born_host=host, queue_id=route.queue_id)
        return route.broker_address, pb

    @staticmethod
    def _collect(results: Iterator[tuple[Any, Any]], out: SinkCommitMessage) -> None:
        for address, result in results:
            if isinstance(result, Exception):
                raise result
            sent = result.send_message
            out.transactions.append((address, sent.transaction_id, sent.message_id, sent.transaction_state))

    # --- the driver -------------------------------------------------------------------

    def _end(self, messages: Sequence[SinkCommitMessage | None], resolution: int) -> list[TxmqError]:
        client = _broker.connect(self.nameserver, self.tls)
        sender = _Sender(client)
        errors: list[TxmqError] = []
        try:
            for message in messages:
                if message is None:
                    continue
                for address, transaction_id, message_id, _state in message.transactions:
                    sender.submit(address, broker_pb2.ProduceEntry(end_transaction=broker_pb2.EndTransactionRequest(
                        transaction_id=transaction_id, message_id=message_id, resolution=resolution,
                        source=common_pb2.TRANSACTION_SOURCE_CLIENT, producer_group=self.producer_group)),
                        transaction_id)
                    errors.extend(e for _, e in sender.drain(WINDOW) if isinstance(e, Exception))
            errors.extend(e for _, e in sender.drain(0) if isinstance(e, Exception))
        finally:
            client.close()
        return errors

    def _epoch_of(self, messages: Sequence[SinkCommitMessage | None]) -> int:
        epochs = {m.epoch for m in messages if m is not None}
        return epochs.pop() if len(epochs) == 1 else self.epoch

    def commit(self, messages: Sequence[SinkCommitMessage | None], batchId: int) -> None:
        epoch = self._epoch_of(messages)
        self.log.mark_committed(batchId, epoch)
        errors = [e for e in self._end(messages, common_pb2.TRANSACTION_RESOLUTION_COMMIT)
                  if not (isinstance(e, TransactionStateError) and getattr(e, "state", None) == "COMMITTED")]
        if errors:
            # Recorded as committed: checks commit what this call could not reach.
            raise RuntimeError(f"txmq sink: batch {batchId} recorded as committed but {len(errors)} "
                               f"EndTransaction(COMMIT) failed, first: {errors[0]!r}")

    def abort(self, messages: Sequence[SinkCommitMessage | None], batchId: int) -> None:
        epoch = self._epoch_of(messages)
        self.log.mark_aborted(batchId, epoch)
        errors = self._end(messages, common_pb2.TRANSACTION_RESOLUTION_ROLLBACK)
        for e in errors[:5]:
            log.warning("txmq sink: rollback of batch %d failed (checks will roll it back): %r", batchId, e)


# ----------------------------------------------------------------------------- checks

class _CheckpointListener(txmq.TransactionListener):
    def __init__(self, sink_log: SinkLog) -> None:
        self.sink_log = sink_log
        self.lock = threading.Lock()
        self.answers: dict[str, int] = {}

    def execute_local_transaction(self, message: Any, arg: Any) -> txmq.LocalTransactionState:
        return txmq.LocalTransactionState.UNKNOWN  # the responder never sends

    def check_local_transaction(self, message: Any) -> Any:
        props = message.properties
        try:
            decision = self.sink_log.decide(props[PROP_QUERY], int(props[PROP_EPOCH]), int(props[PROP_BATCH]))
        except (KeyError, ValueError):
            decision = txmq.LocalTransactionState.UNKNOWN  # not written by this sink
        name = decision.name if isinstance(decision, txmq.LocalTransactionState) else "IN_PROGRESS"
        with self.lock:
            self.answers[name] = self.answers.get(name, 0) + 1
        return decision


class SinkCheckResponder:
    """Answers the checks of the sink's producer group from the query's checkpoint, for as
    long as it is open (a context manager; run it on the driver beside the query)."""

    def __init__(self, *, nameserver: str, producer_group: str, checkpoint_location: str,
                 sink_log_path: str | None = None, checker_refresh_seconds: float = 5.0,
                 tls: txmq.TLS | None = None) -> None:
        self.listener = _CheckpointListener(SinkLog(checkpoint_location, sink_log_path))
        self.producer = txmq.TransactionProducer(nameserver, producer_group=producer_group, listener=self.listener,
                                                 checker_refresh_seconds=checker_refresh_seconds, tls=tls)

    @property
    def answers(self) -> dict[str, int]:
        """How many checks got each answer (COMMIT, ROLLBACK, IN_PROGRESS, UNKNOWN)."""
        with self.listener.lock:
            return dict(self.listener.answers)

    def connected_checkers(self) -> list[str]:
        return self.producer.connected_checkers()

    def close(self) -> None:
        self.producer.close()

    def __enter__(self) -> "SinkCheckResponder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
