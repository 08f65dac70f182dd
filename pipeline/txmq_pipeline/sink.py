"""The transactional streaming sink: ``df.writeStream.format("txmq")``.

Each micro-batch is one set of txmq transactions::

    executor tasks (write)     every row → a half message on a queue chosen from a hash of
                               (query id, sink epoch, batch id, partition, row index), on a
                               shard the fault table does not avoid, with a deterministic
                               message id (unique bytes = sha256(that row key, the shard));
                               returns the transactions it stored
    driver commit(batchId)     records "batch B committed with epoch E: these message ids"
                               in the sink log, then EndTransaction COMMIT for every
                               transaction of the batch, then "batch B settled"
    driver abort(batchId)      records "batch B of epoch E aborted" and moves to epoch E+1,
                               then EndTransaction ROLLBACK for what the tasks reported

Exactly once: a task retried within a batch sends the same ids, which the broker
deduplicates (also after the decision), and a batch re-run after a driver crash (it
reached neither commit nor abort, or commit but not Spark's commit log) sends the same
ids again: a repeated half send returns the first transaction and its state, and a
repeated COMMIT is idempotent. Only an **abort** changes the ids of a re-run: its
transactions were rolled back, and the broker would answer the same ids with
ROLLED_BACK forever, so the sink's epoch (part of the id) moves on.

A failing shard (issue 21): a send that fails transiently before it was acknowledged
(the shard is down or unreachable) marks the shard in the fault table (``txmq.faults``,
the one the SDK and the RocketMQ proxy use), and the row goes to a queue of another
shard, with the id its row key and *that* shard give; later rows avoid the shard until a
probe finds it back. The attempt left behind may have been stored (the answer was lost):
it is an orphan with an id of its own, never reported, so the batch's commit record does
not name it and its check is answered ROLLBACK. A row is thus committed once, on the
shard whose copy a task reported. Only what an id binds to its shard waits for it: a
NOT_LEADER/LEADERSHIP_LOST answer (a replicated shard failing over) keeps the send and
its id on the shard, retried at the leader's new address; and the commit's
EndTransactions for rows a shard had acknowledged before it failed are retried there,
then left to the check, which commits them from the commit record once the shard is back
(the batch is committed, and the query goes on meanwhile). A task fails only when every
shard of the topic keeps failing (after ``ATTEMPTS`` sends of one row).

Half messages a task wrote but never reported (it failed, its batch never reached commit
or abort, or the row moved to another shard) are resolved by checks:
:class:`SinkCheckResponder` answers for the sink's producer group from the sink log kept
inside the query's checkpoint — batch committed with that epoch → COMMIT if the commit
record names the message id (a reported transaction), ROLLBACK otherwise (an attempt left
behind), and ROLLBACK once the batch is settled (every reported one committed); batch
aborted, or committed with another epoch, or an epoch that is over → ROLLBACK; the running
batch → IN_PROGRESS (asked again later, nothing spent). The commit record costs 8 bytes
per row until the batch settles (the file is removed then). Run the responder on the
driver while the query runs::

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

import collections
import hashlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

import txmq
from txmq.client import QueueRoute
from txmq.errors import NoLeaderError, TransactionStateError, TxmqError, error_from_entry
from txmq.faults import Abandoned
from txmq.ids import MessageId, TransactionId
from txmq.names import in_namespace
from txmq.sending import Pick, Rebind, Request, Sleep, Steps, end_transaction, finished, send_new
from txmq.v1 import common_pb2

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


#: Batches whose commit record a responder keeps in memory.
RECORDS_CACHED = 8


def id_digest(message_id: str) -> bytes:
    """What the commit record keeps of a reported message id (8 bytes)."""
    return hashlib.blake2b(message_id.encode(), digest_size=8).digest()


class SinkLog:
    """``<checkpoint>/txmq-sink``: ``epoch`` (the current one), ``committed/<batch>`` (the
    epoch it committed with, then ``ids`` while ``committed/<batch>.ids`` names the
    reported message ids — sorted 8-byte digests — or ``settled`` once every reported
    transaction is committed; a bare epoch, written before rerouting existed, commits
    every message of that epoch), ``aborted/<batch>-<epoch>``. Every file is written
    whole and renamed into place, so a reader never sees a torn one; the ids file is in
    place before the record that points to it."""

    def __init__(self, checkpoint_location: str, sink_log_path: str | None = None) -> None:
        self.checkpoint = _local_path(checkpoint_location)
        self.root = _local_path(sink_log_path) if sink_log_path else self.checkpoint / "txmq-sink"
        self._ids: collections.OrderedDict[tuple[int, int], frozenset[bytes]] = collections.OrderedDict()

    @classmethod
    def from_options(cls, options: Any) -> "SinkLog":
        checkpoint = options.get("checkpointLocation") or ""
        if not checkpoint:
            raise ValueError("the txmq sink needs option('checkpointLocation', ...) (its log lives there)")
        return cls(checkpoint, options.get("sinkLogPath"))

    def _write(self, path: Path, text: str | bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def epoch(self) -> int:
        try:
            return int((self.root / "epoch").read_text().strip() or 0)
        except FileNotFoundError:
            return 0

    def _record(self, batch: int) -> tuple[int, str] | None:
        """(epoch, ``all`` | ``ids`` | ``settled``) of a committed batch."""
        try:
            words = (self.root / "committed" / str(batch)).read_text().split()
        except FileNotFoundError:
            return None
        return int(words[0]), (words[1] if len(words) > 1 else "all")

    def committed_epoch(self, batch: int) -> int | None:
        record = self._record(batch)
        return record[0] if record is not None else None

    def aborted(self, batch: int, epoch: int) -> bool:
        return (self.root / "aborted" / f"{batch}-{epoch}").exists()

    def mark_committed(self, batch: int, epoch: int, message_ids: Sequence[str]) -> None:
        """Batch ``batch`` commits with ``epoch``, and exactly the transactions of these
        message ids (what the tasks reported)."""
        ids = b"".join(sorted({id_digest(m) for m in message_ids}))
        self._write(self.root / "committed" / f"{batch}.ids", ids)
        self._write(self.root / "committed" / str(batch), f"{epoch} ids")

    def mark_settled(self, batch: int, epoch: int) -> None:
        """Every reported transaction of the batch is committed: what a check still asks
        about is an attempt left behind."""
        self._write(self.root / "committed" / str(batch), f"{epoch} settled")
        (self.root / "committed" / f"{batch}.ids").unlink(missing_ok=True)

    def _reported(self, batch: int, epoch: int) -> frozenset[bytes]:
        key = (batch, epoch)
        ids = self._ids.get(key)
        if ids is None:
            try:
                raw = (self.root / "committed" / f"{batch}.ids").read_bytes()
            except FileNotFoundError:  # settled meanwhile
                return frozenset()
            ids = frozenset(raw[i:i + 8] for i in range(0, len(raw), 8))
            self._ids[key] = ids
            while len(self._ids) > RECORDS_CACHED:
                self._ids.popitem(last=False)
        return ids

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

    def decide(self, query: str, epoch: int, batch: int,
               message_id: str) -> "txmq.LocalTransactionState | txmq.InProgress":
        """The answer to a check of a half message the sink wrote."""
        own = self.query_id()
        if own is not None and query != own:
            return txmq.LocalTransactionState.UNKNOWN  # another query's message: not ours to decide
        if self.aborted(batch, epoch):
            return txmq.LocalTransactionState.ROLLBACK
        record = self._record(batch)
        if record is not None:
            committed, mode = record
            if committed == epoch and (mode == "all" or (
                    mode == "ids" and id_digest(message_id) in self._reported(batch, epoch))):
                return txmq.LocalTransactionState.COMMIT
            return txmq.LocalTransactionState.ROLLBACK
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
    #: Rows whose send failed on one shard and went to another.
    rerouted: int = 0


def row_key(query: str, epoch: int, batch: int, partition: int, row: int) -> bytes:
    """Which queue a row goes to first (a hash of its place in the query)."""
    return hashlib.sha256(f"{query}\x00{epoch}\x00{batch}\x00{partition}\x00{row}".encode()).digest()


def message_unique(key: bytes, shard: str) -> bytes:
    """The unique bytes of the message id a row gets on ``shard``: the same on every
    attempt there (the broker deduplicates it), another one on another shard."""
    return hashlib.sha256(key + b"\x00" + shard.encode()).digest()[:16]


def _local_property(name: str) -> str | None:
    from pyspark import TaskContext
    context = TaskContext.get()
    return context.getLocalProperty(name) if context is not None else None


@dataclass
class _Flight:
    """One row's send (or one EndTransaction): its steps, where its request went, its reply."""
    steps: Steps
    tag: Any
    #: Performs the row's Pick step (its queue, from its key).
    pick: Callable[[Pick], Any] | None = None
    shard: str = ""
    address: str = ""
    send: bool = False
    started: float = 0.0
    reply: Any = None


@dataclass
class _Sending:
    """What the SDK's send steps (``txmq.sending``) read and record of their sender: the
    client (routes, fault table), the attempts and their backoff, the attempts given up on."""
    _client: Any
    max_attempts: int = ATTEMPTS
    #: How long a send waits for its topic's route while its shards are between leaders.
    send_timeout_seconds: float = 30.0
    #: The first retry's pause on the same shard (doubling, at most 2 s).
    retry_backoff_seconds: float = 0.2
    _abandoned: Abandoned = field(default_factory=Abandoned)


class _Window:
    """Drives the SDK's send steps (``txmq.sending.send_new`` per row, ``end_transaction`` per
    decision: the producers' own routing and retries) for many rows at once, pipelined on
    one client's Produce streams: a Request step is submitted to the stream and its row's
    steps go on when the reply comes (every outcome recorded in the fault table); Sleep
    steps wait side by side (the rows of a shard that is down all back off at once, not
    one after the other); Pick (the row's queue) and Rebind (the shard's current address)
    are performed at once. Yields each (tag, address of its last request, outcome or the
    TxmqError it failed with)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sending = _Sending(client)
        self.inflight: collections.deque[_Flight] = collections.deque()
        #: (when, flight): rows to go on once their pause is over.
        self.sleeping: list[tuple[float, _Flight]] = []
        self.done: collections.deque[tuple[Any, str, Any]] = collections.deque()

    def start(self, steps: Steps, tag: Any, pick: Callable[[Pick], Any] | None = None) -> None:
        self._advance(_Flight(steps, tag, pick), None, None)

    def _advance(self, flight: _Flight, value: Any, error: TxmqError | None) -> None:
        while True:
            try:
                step = flight.steps.send(value) if error is None else flight.steps.throw(error)
            except StopIteration as stop:
                self.done.append((flight.tag, flight.address, stop.value))
                return
            except TxmqError as err:
                self.done.append((flight.tag, flight.address, err))
                return
            value = error = None
            kind = type(step)
            if kind is Request:
                flight.shard, flight.address, flight.send = step.shard, step.address, step.send
                flight.started = time.monotonic()
                flight.reply = self.client.produce_stream(step.address).submit(step.entry)
                self.inflight.append(flight)
                return
            if kind is Sleep:
                self.sleeping.append((time.monotonic() + step.seconds, flight))
                return
            try:
                if kind is Pick:
                    assert flight.pick is not None
                    value = flight.pick(step)
                else:
                    value = self._rebind(step)
            except TxmqError as err:
                error = err

    def _rebind(self, step: Rebind) -> str:
        """The shard's current address (its leader may have moved), else the last one; raises
        NoLeaderError while the shard is between leaders (the steps wait for one)."""
        try:
            if step.topic:
                self.client.invalidate_route(step.topic)
                self.client.route(step.topic, refresh=True)
            return self.client.broker_address(step.route.broker_name, refresh=True)
        except NoLeaderError:
            raise
        except TxmqError:
            return step.address

    def _wake(self) -> None:
        now = time.monotonic()
        due = [f for when, f in self.sleeping if when <= now]
        if due:
            self.sleeping = [(when, f) for when, f in self.sleeping if when > now]
            for flight in due:
                self._advance(flight, None, None)

    def drain(self, keep: int = 0) -> Iterator[tuple[Any, str, Any]]:
        """Waits for the oldest requests until at most ``keep`` rows are unfinished (and takes
        the oldest ones answered already, so a failing shard is known soon)."""
        faults = self.client.faults
        while True:
            while self.done:
                yield self.done.popleft()
            self._wake()
            if self.done:
                continue
            if len(self.inflight) + len(self.sleeping) <= keep and not (
                    self.inflight and self.inflight[0].reply.wait(0)):
                return
            if not self.inflight:
                time.sleep(max(0.0, min(when for when, _ in self.sleeping) - time.monotonic()))
                continue
            flight = self.inflight.popleft()
            try:
                result = flight.reply.result(timeout=60)
                if result.status.code:
                    raise error_from_entry(result.status)
            except TxmqError as err:
                finished(faults, flight.shard, err)
                self._advance(flight, None, err)
                continue
            finished(faults, flight.shard, None, time.monotonic() - flight.started if flight.send else None)
            self._advance(flight, result, None)


@dataclass(frozen=True)
class _Half:
    """What an EndTransaction of the sink names: its transaction, message and shard."""
    transaction_id: str
    message_id: str
    broker_name: str


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
        self.topic = options.get("topic") or ""  # already in the namespace (check_options)
        self.namespace = options.get("namespace") or ""
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
        out = SinkCommitMessage(self.epoch, batch, partition, 0)
        client_id = f"spark-sink-{query}"[:255]
        host = socket.gethostname()

        window = _Window(client)

        def start(values: dict[str, Any], index: int) -> None:
            topic = in_namespace(self.namespace, "topic", values["topic"]) if values.get("topic") else self.topic
            key = row_key(query, self.epoch, batch, partition, index)

            def pick(step: Pick) -> Any:
                choose = client.faults.choose_usable if step.moving else client.faults.choose
                route = choose(client.route(step.topic), lambda q: q.broker_name,
                               int.from_bytes(key[:4], "big"), step.exclude)
                if route is not None and step.exclude and route.broker_name not in step.exclude:
                    out.rerouted += 1
                return route  # None (moving, no shard usable): the row stays on its shard

            def build(route: Any, _random_id: str) -> common_pb2.Message:
                return self._message(values, topic, key, route, query, batch, client_id, host)

            window.start(send_new(window.sending, topic, build), (values, index), pick)

        try:
            for index, row in enumerate(iterator):
                start(row.asDict() if hasattr(row, "asDict") else dict(row), index)
                out.rows += 1
                self._collect(window.drain(WINDOW), out)
            self._collect(window.drain(0), out)
        finally:
            client.close()
        if out.rerouted:
            log.warning("txmq sink: %d rows of batch %d partition %d went to another shard (theirs failed)",
                        out.rerouted, batch, partition)
        return out

    def _message(self, values: dict[str, Any], topic: str, key: bytes, route: Any, query: str, batch: int,
                 client_id: str, host: str) -> common_pb2.Message:
        """The row's half message on ``route``'s queue, with the id it has there (its row key
        and that shard: the same on a retry there, another one on another shard)."""
        unique = message_unique(key, route.broker_name)
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
        return common_pb2.Message(
            topic=topic, body=bytes(body), tag=values.get("tag") or "", keys=keys, properties=properties,
            message_id=MessageId(route.broker_name, route.queue_id, unique).encode(),
            type=common_pb2.MESSAGE_TYPE_TRANSACTION, producer_group=self.producer_group,
            producer_client_id=client_id, check_immunity_seconds=self.check_immunity_seconds,
            born_timestamp_ms=int(time.time() * 1000), born_host=host, queue_id=route.queue_id)

    @staticmethod
    def _collect(results: Iterator[tuple[Any, str, Any]], out: SinkCommitMessage) -> None:
        for _, address, outcome in results:
            if isinstance(outcome, Exception):
                raise outcome
            _route, _pb, sent = outcome
            out.transactions.append((address, sent.transaction_id, sent.message_id, sent.transaction_state))

    # --- the driver -------------------------------------------------------------------

    def _end(self, messages: Sequence[SinkCommitMessage | None],
             decision: txmq.LocalTransactionState) -> list[TxmqError]:
        """EndTransaction ``decision`` of every transaction the tasks reported, pipelined,
        each retried on the shard its id names (``txmq.sending.end_transaction``); the errors
        of those that failed for good (or were refused)."""
        client = _broker.connect(self.nameserver, self.tls)
        window = _Window(client)
        errors: list[TxmqError] = []
        try:
            for message in messages:
                if message is None:
                    continue
                for address, transaction_id, message_id, _state in message.transactions:
                    shard = TransactionId.decode(transaction_id).broker
                    half = _Half(transaction_id, message_id, shard)
                    window.start(end_transaction(window.sending, QueueRoute(shard, address, -1), "", half,
                                                 decision, self.producer_group), transaction_id)
                    errors.extend(_end_errors(window.drain(WINDOW)))
            errors.extend(_end_errors(window.drain(0)))
        finally:
            client.close()
        return errors

    def _epoch_of(self, messages: Sequence[SinkCommitMessage | None]) -> int:
        epochs = {m.epoch for m in messages if m is not None}
        return epochs.pop() if len(epochs) == 1 else self.epoch

    def commit(self, messages: Sequence[SinkCommitMessage | None], batchId: int) -> None:
        epoch = self._epoch_of(messages)
        self.log.mark_committed(batchId, epoch, [t[2] for m in messages if m is not None for t in m.transactions])
        errors = [e for e in self._end(messages, txmq.LocalTransactionState.COMMIT)
                  if not (isinstance(e, TransactionStateError) and getattr(e, "state", None) == "COMMITTED")]
        if not errors:
            self.log.mark_settled(batchId, epoch)
            return
        refused = [e for e in errors if not e.retryable]
        if refused:
            # Recorded as committed: checks commit what this call could not reach.
            raise RuntimeError(f"txmq sink: batch {batchId} recorded as committed but {len(refused)} "
                               f"EndTransaction(COMMIT) were refused, first: {refused[0]!r}")
        # Their shards are down: the check commits them from the record once they are back.
        log.warning("txmq sink: batch %d committed; %d EndTransaction(COMMIT) could not reach their shard "
                    "and are left to the check, first: %r", batchId, len(errors), errors[0])

    def abort(self, messages: Sequence[SinkCommitMessage | None], batchId: int) -> None:
        epoch = self._epoch_of(messages)
        self.log.mark_aborted(batchId, epoch)
        errors = self._end(messages, txmq.LocalTransactionState.ROLLBACK)
        for e in errors[:5]:
            log.warning("txmq sink: rollback of batch %d failed (checks will roll it back): %r", batchId, e)


def _end_errors(results: Iterator[tuple[Any, str, Any]]) -> list[TxmqError]:
    """The errors among EndTransaction outcomes ((state, error) each)."""
    return [error for _, _, (_state, error) in results if error is not None]


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
            decision = self.sink_log.decide(props[PROP_QUERY], int(props[PROP_EPOCH]), int(props[PROP_BATCH]),
                                            message.message_id)
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
                 tls: txmq.TLS | None = None, namespace: str = "") -> None:
        self.listener = _CheckpointListener(SinkLog(checkpoint_location, sink_log_path))
        self.producer = txmq.TransactionProducer(nameserver, producer_group=producer_group, listener=self.listener,
                                                 checker_refresh_seconds=checker_refresh_seconds, tls=tls,
                                                 namespace=namespace)

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
