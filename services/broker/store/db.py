"""RocksDB (through rocksdict) with the broker's column families, and how every mutation
is applied.

One thread owns the store (the broker's event loop; start-up code and tools before it
runs). :meth:`Database.apply` runs an operation there: it reads what it needs, stages its
writes in an :class:`OpWrites` and returns a result; the staged writes then go to RocksDB
as ONE WriteBatch, so every request's state change is atomic (never two writes a crash can
separate). An operation that raises has staged nothing that is written, so a refused
request changes nothing.

Writes are not synced here. RocksDB appends each batch to its WAL with write(2), so once
``apply`` returns the batch survives a crash of the broker process; surviving a crash of
the machine takes an fdatasync of the WAL (:meth:`Database.sync_wal`), which the broker's
``StoreBridge`` does once for all the writes made since the last one. Each write is
numbered (``written``); ``apply`` returns the number a caller must see durable before it
answers (its *ticket*), and the caller holds the answer until then. Tools and tests use
:meth:`Database.call`, which syncs in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from rocksdict import Checkpoint, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from . import replog
from .replication_log import ReplicationLog


log = logging.getLogger(__name__)

COLUMN_FAMILIES = (
    "log",        # seq -> LogRecord: the commit log (half and normal messages)
    "cq",         # topic|queue|offset -> CqEntry: consume queues (visible messages)
    "txn",        # seq -> TxnRow: one row per transaction
    "due",        # group|due_ms|seq -> b"": the check schedule
    "pending",    # group|prepared_ms|seq -> b"": PREPARED transactions by age
    "dedup",      # message id -> DedupEntry
    "dedup_exp",  # expire_ms|message id -> b"": when a dedup entry may go
    "counters",   # group -> (pending, discarded), moved in the batch that moves them
    "consumers",  # group|topic|queue -> next offset never delivered
    "inflight",   # group|topic|queue|offset -> (attempt, invisible until)
    "topics",     # topic -> queue count
    "timer",      # due_ms|seq -> b"": delay / timer messages not yet in their queue
    "meta",       # store identity and format
    "walfill",    # scratch: the filler that pre-sizes the WAL at start (see Database)
    "replog",     # lsn -> replication entry (replicated shards only; see store/replog.py)
    "undo",       # lsn -> undo record: the entry's keys as they were before it
    "replica",    # this replica's own bookkeeping: log end, epoch history, membership
    "global",     # multi-message transactions: open G, pushes due, undecided parts (store/globalcodec.py)
    "keys",       # topic|key|queue|offset -> b"": the key index (codec.key_index_key)
)

#: Obsolete WAL files RocksDB keeps to reuse for new ones. Writing into a file whose blocks
#: exist already (instead of appending) spares every fdatasync a journal commit for the
#: file's size and allocation: on ext4 0.11 ms instead of 0.17 ms per sync idle, 0.13
#: instead of 0.21 under bench.transactions.
WAL_RECYCLE_FILES = 4
_FILL_CHUNK = 1 << 20


@dataclass(slots=True)
class OpWrites:
    """The writes one operation stages, plus work to run once they are durable.

    ``sync=False`` (receives, acks, retention): the operation's own writes need not be
    durable before it is answered, only what it read (a lost receive or ack means a
    redelivery, at least once)."""

    puts: list[tuple[str, bytes, bytes | None]] = field(default_factory=list)
    after: list[Callable[[], None]] = field(default_factory=list)
    sync: bool = True

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self.puts.append((cf, key, value))

    def delete(self, cf: str, key: bytes) -> None:
        self.puts.append((cf, key, None))

    def on_durable(self, fn: Callable[[], None]) -> None:
        self.after.append(fn)


Op = Callable[[OpWrites], Any]


@dataclass(slots=True, frozen=True)
class Applied:
    """An operation's result, and the write number that must be durable before anyone
    hears of it (or of the hooks in ``after``)."""

    result: Any
    ticket: int
    after: list[Callable[[], None]]


class StoreClosedError(Exception):
    pass


class StoreInUseError(Exception):
    """Another process (a broker still running, an fsck) holds the store open: RocksDB
    lets one process open it for writing at a time."""

    def __init__(self, path: str) -> None:
        super().__init__(f"the store at {path} is open in another process (is its broker still running? "
                         "stop it first)")
        self.path = path


#: The ticket :meth:`Database.apply` returns inside a write group: the group's own comes
#: when it ends.
GROUP_TICKET = -1
_ABSENT = object()


@dataclass(slots=True)
class WriteGroup:
    """The writes of the operations applied inside :meth:`Database.grouped`."""

    puts: list[tuple[str, bytes, bytes | None]] = field(default_factory=list)
    #: (column family, key) -> the staged value (None: deleted), for reads in the group.
    overlay: dict[tuple[str, bytes], bytes | None] = field(default_factory=dict)
    #: Whether an operation in it asked to be durable (``sync=True``).
    sync: bool = False
    #: Set on exit: the write number covering the group.
    ticket: int = 0


class Database:
    """The store. ``max_wal_bytes`` (0: RocksDB's default, up to gigabytes with this many
    column families) bounds the write-ahead logs kept: past it RocksDB flushes the column
    families that hold the oldest log, so a restart replays at most about that much.
    ``wal_prefill_bytes`` pre-sizes the log in use at start (see :meth:`_prefill_wal`)."""

    def __init__(self, path: str, *, sync: bool = True,
                 on_fatal: Callable[[BaseException], None] | None = None,
                 wal_prefill_bytes: int = 0, max_wal_bytes: int = 0, replicated: bool = False,
                 replog_keep_entries: int = 100_000) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self._reopen = {"sync": sync, "on_fatal": on_fatal, "wal_prefill_bytes": 0, "max_wal_bytes": max_wal_bytes,
                        "replicated": replicated, "replog_keep_entries": replog_keep_entries}
        #: ``flush=sync``: answers wait for the WAL sync of what they depend on.
        self.sync = sync
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_max_background_jobs(2)
        opts.set_recycle_log_file_num(WAL_RECYCLE_FILES)
        if max_wal_bytes > 0:
            opts.set_max_total_wal_size(max_wal_bytes)
        try:
            self.db = Rdict(path, opts, column_families={name: Options(raw_mode=True) for name in COLUMN_FAMILIES})
        except Exception as exc:
            if "/LOCK" in str(exc):
                raise StoreInUseError(path) from exc
            raise
        self.handles = {name: self.db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self.cf = {name: self.db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._write_opts = WriteOptions()
        self._on_fatal = on_fatal
        self._closed = False
        #: Held by work on another thread (:meth:`prepare_checkpoint`); :meth:`close` waits for it.
        self._background = threading.Lock()
        #: Write batches applied so far; a write's number is its ticket.
        self.written = 0
        #: The number of the last write that asked to be durable (``sync=True``): what an
        #: answer based on the current state waits for. Writes made with ``sync=False``
        #: (receives, acks) do not move it, so they never hold anyone's answer.
        self.read_ticket = 0
        self.ops_written = 0
        self.bytes_written = 0
        self._synced_in_place = 0
        self._group: WriteGroup | None = None
        #: Replicated shard (replication_factor > 1): every write is also a numbered entry
        #: of the replication log with its undo record, and ``written`` is the log's last
        #: lsn (store/replication_log.py).
        self.replicated = replicated
        self.replication = ReplicationLog(self, replog_keep_entries)
        if replicated:
            self.replication.load()
        if wal_prefill_bytes > 0:
            self._prefill_wal(wal_prefill_bytes)

    def _prefill_wal(self, size: int) -> None:
        """Leaves a write-ahead log of at least ``size`` bytes in use, so the writes that
        follow overwrite blocks it has (PostgreSQL zero-fills new WAL segments for the same
        reason). RocksDB only reuses logs it retired, so: fill the current log with
        ``size`` bytes of zeros in a scratch column family, flush (a new log starts, and
        the filled one, no longer needed, is kept for reuse), flush again (the next new
        log is the filled one), then drop the filler. Costs a write of ``size`` bytes at
        start (~0.17 s for 64 MiB here)."""
        fill = self.cf["walfill"]
        chunk = bytes(_FILL_CHUNK)
        for i in range(max(1, -(-size // _FILL_CHUNK))):
            fill[i.to_bytes(4, "big")] = chunk
        self._flush_all()
        fill.delete_range(b"", b"\xff" * 5)  # also the write that makes the second flush switch logs
        self._flush_all()
        fill.compact_range(None, None)

    def _flush_all(self) -> None:
        for cf in self.cf.values():
            cf.flush()

    def wal_files(self) -> dict[str, int]:
        """The write-ahead logs in the store's directory, name → size in bytes."""
        return {entry.name: entry.stat().st_size for entry in os.scandir(self.path) if entry.name.endswith(".log")}

    # --- reads (any thread; they may see writes not yet durable) -------------------------

    def get(self, cf: str, key: bytes) -> bytes | None:
        group = self._group
        if group is not None:
            staged = group.overlay.get((cf, key), _ABSENT)
            if staged is not _ABSENT:
                return staged  # type: ignore[return-value]  # not _ABSENT: bytes, or None (deleted)
        return self.cf[cf].get(key)

    def scan(self, cf: str, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, stop) (forward), or from ``start`` downwards (reverse, where
        ``start`` is an exclusive upper bound and ``stop`` an inclusive lower bound)."""
        if not reverse:
            opts = ReadOptions()
            if stop is not None:
                opts.set_iterate_upper_bound(stop)
            it = self.cf[cf].iter(opts)
            it.seek(start) if start else it.seek_to_first()
            while it.valid():
                yield it.key(), it.value()
                it.next()
            return
        it = self.cf[cf].iter(ReadOptions())
        it.seek_for_prev(start)
        if it.valid() and it.key() >= start:
            it.prev()
        while it.valid():
            key = it.key()
            if stop is not None and key < stop:
                return
            yield key, it.value()
            it.prev()

    def last_key(self, cf: str, prefix: bytes = b"") -> bytes | None:
        """The largest key starting with ``prefix``."""
        if not prefix:
            it = self.cf[cf].iter(ReadOptions())
            it.seek_to_last()
            return it.key() if it.valid() else None
        upper = _prefix_upper_bound(prefix)
        for key, _ in self.scan(cf, upper, prefix, reverse=True):
            return key if key.startswith(prefix) else None
        return None

    def first_key(self, cf: str, prefix: bytes = b"") -> bytes | None:
        for key, _ in self.scan(cf, prefix, _prefix_upper_bound(prefix) if prefix else None):
            return key
        return None

    # --- writes (the owner thread) ----------------------------------------------------

    def apply(self, op: Op, *, sync: bool = True) -> Applied:
        """Runs ``op`` and writes what it staged as one batch (unsynced). Raises what the
        operation raised, having written nothing. ``sync=False`` (or ``OpWrites.sync``
        cleared by the operation) means only the sync-requiring writes before it
        (``read_ticket``) must be durable before it is answered, not its own.

        Inside :meth:`grouped` the operation's writes join the group's batch instead and
        its ticket is the group's (``GROUP_TICKET`` until the group ends)."""
        if self._closed:
            raise StoreClosedError("store is closed")
        writes = OpWrites(sync=sync)
        result = op(writes)
        self.ops_written += 1
        group = self._group
        if group is not None:
            overlay = group.overlay
            for cf, key, value in writes.puts:
                overlay[(cf, key)] = value
            group.puts.extend(writes.puts)
            group.sync = group.sync or (writes.sync and bool(writes.puts))
            return Applied(result, GROUP_TICKET, writes.after)
        if writes.puts:
            self._write(writes.puts)
            if writes.sync:
                self.read_ticket = self.written
        return Applied(result, self.read_ticket, writes.after)

    def _write(self, puts: list[tuple[str, bytes, bytes | None]]) -> None:
        if self.replicated:
            replication = self.replication
            replication.append([(self.written + 1, replog.encode_entry(replication.epoch, puts), puts, None)])
            return
        batch = WriteBatch(raw_mode=True)
        handles = self.handles
        size = 0
        for cf, key, value in puts:
            if value is None:
                batch.delete(key, handles[cf])
            else:
                batch.put(key, value, handles[cf])
                size += len(key) + len(value)
        self.commit_batch(batch)
        self.written += 1
        self.bytes_written += size

    def commit_batch(self, batch: WriteBatch) -> None:
        """Writes one batch. A failure stops the process: the operations (or the replicated
        entries) already moved in-memory state, and a restart recovers from the WAL with
        nothing acknowledged lost."""
        try:
            self.db.write(batch, self._write_opts)
        except Exception as exc:
            log.critical("store write failed; stopping", exc_info=True)
            if self._on_fatal is not None:
                self._on_fatal(exc)
            raise

    @contextlib.contextmanager
    def grouped(self) -> Iterator[WriteGroup]:
        """Operations applied inside write one batch between them, at the end (one WAL
        append and one memtable insert instead of one per operation): the Produce stream
        applies each message's entries so. They read each other's writes through
        :meth:`get` (not :meth:`scan`). On exit ``group.ticket`` is the write number that
        covers everything they wrote and read; the batch is written even if the block
        raised, since the operations applied before already moved in-memory state."""
        if self._group is not None:
            raise RuntimeError("write groups do not nest")
        group = WriteGroup()
        self._group = group
        try:
            yield group
        finally:
            self._group = None
            if group.puts:
                self._write(group.puts)
                if group.sync:
                    self.read_ticket = self.written
            group.ticket = self.read_ticket

    # --- the replication log (replicated shards: store/replication_log.py) ----------------

    def reopen_args(self) -> dict[str, Any]:
        """What opens a store like this one (another directory, e.g. after a rebuild)."""
        return dict(self._reopen)

    def prepare_checkpoint(self) -> None:
        """Syncs the WAL and writes every memtable to a file, off the event loop (both
        release the GIL), so that the :meth:`checkpoint` taken right after on the thread
        that writes has only the writes since to flush. RocksDB's checkpoint holds the GIL
        while it flushes: a large memtable under load held a leader's event loop for over
        a second, its etcd lease lapsed, and it stepped down while a follower rebuilt."""
        with self._background:
            if self._closed:
                return
            self.db.flush_wal(True)
            self._flush_all()

    def checkpoint(self, path: str) -> int:
        """A consistent copy of the whole store in ``path`` (hard links where it can);
        returns the log end it holds. Call it on the thread that writes, between two
        writes (after :meth:`prepare_checkpoint`, it flushes only what came since)."""
        self.db.flush_wal(True)
        Checkpoint(self.db).create_checkpoint(path)
        return self.written

    def digest(self) -> dict[str, str]:
        """sha256 of every replicated column family's keys and values: replicas of one
        shard at the same lsn have equal digests."""
        out = {}
        for name in replog.REPLICATED_CFS:
            h = hashlib.sha256()
            for key, value in self.scan(name):
                h.update(len(key).to_bytes(4, "big"))
                h.update(key)
                h.update(len(value).to_bytes(4, "big"))
                h.update(value)
            out[name] = h.hexdigest()
        return out

    def call(self, op: Op, *, sync: bool = True) -> Any:
        """``apply`` then, with ``flush=sync``, a WAL sync in place and the hooks: for
        start-up, tools and tests (it blocks the thread for the sync)."""
        applied = self.apply(op, sync=sync)
        if self.sync and applied.ticket > self._synced_in_place:
            self.sync_wal()
            self._synced_in_place = applied.ticket
        for fn in applied.after:
            fn()
        return applied.result

    def sync_wal(self) -> None:
        """fdatasync of the WAL files RocksDB writes (and of their directory when a new one
        appeared), blocking the calling thread; the GIL is released meanwhile."""
        self.db.flush_wal(True)

    def close(self) -> None:
        if self._closed:
            return
        with self._background:  # a flush on another thread ends before the store closes
            self._closed = True
        try:
            self.db.flush_wal(True)
        except Exception:
            log.exception("final WAL flush failed")
        self.cf.clear()
        self.handles.clear()
        self.db.close()

    def size_bytes(self) -> int:
        total = 0
        for entry in os.scandir(self.path):
            if entry.is_file():
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    pass
        return total


def _prefix_upper_bound(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b"\xff" * (len(prefix) + 8)
    b[-1] += 1
    return bytes(b)


def now_ms() -> int:
    return int(time.time() * 1000)
