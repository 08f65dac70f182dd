"""RocksDB (through rocksdict) with the broker's column families, and the group-commit
writer every mutation goes through.

One writer thread applies operations in arrival order. Each operation reads what it needs,
stages its writes in an :class:`OpWrites` and returns a result; the writer folds the staged
writes of up to ``group_commit_max_ops`` operations into ONE WriteBatch and writes it once,
syncing the WAL when any of them asked for durability and ``flush=sync``. So every request's
state change is one atomic batch (never two writes a crash can separate), and concurrent
requests share one fsync (group commit). Results are released only after the write.

An operation that raises has staged nothing into the shared batch (its ``OpWrites`` is
dropped), so a refused request changes nothing.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from rocksdict import Options, Rdict, ReadOptions, WriteBatch, WriteOptions

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
    "meta",       # store identity and format
)


@dataclass(slots=True)
class OpWrites:
    """The writes one operation stages, plus work to run once they are durable."""

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
Done = Callable[[Any, BaseException | None], None]


class StoreClosedError(Exception):
    pass


class Database:
    def __init__(self, path: str, *, sync: bool = True, group_commit_max_ops: int = 512,
                 on_fatal: Callable[[BaseException], None] | None = None) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.sync = sync
        self.max_ops = group_commit_max_ops
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_max_background_jobs(2)
        self.db = Rdict(path, opts, column_families={name: Options(raw_mode=True) for name in COLUMN_FAMILIES})
        self.handles = {name: self.db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self.cf = {name: self.db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._sync_opts = WriteOptions()
        self._sync_opts.sync = True
        self._async_opts = WriteOptions()
        self._queue: queue.SimpleQueue[tuple[Op, Done, bool] | None] = queue.SimpleQueue()
        self._batch_listeners: list[Callable[[], None]] = []
        self._on_fatal = on_fatal
        self._closed = False
        # Writes staged by earlier operations of the batch being built: operations read
        # through it (``read``) so the second of two requests in one batch sees the first.
        self._overlay: dict[tuple[str, bytes], bytes | None] = {}
        self.writes = 0
        self.ops_written = 0
        self.bytes_written = 0
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    # --- reads (any thread) --------------------------------------------------------------

    def get(self, cf: str, key: bytes) -> bytes | None:
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

    def read(self, cf: str, key: bytes) -> bytes | None:
        """Writer thread only: the value including writes staged in the current batch."""
        staged = self._overlay.get((cf, key), _MISSING)
        if staged is not _MISSING:
            return staged  # type: ignore[return-value]
        return self.cf[cf].get(key)

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

    # --- writes (through the writer thread) ----------------------------------------------

    def submit(self, op: Op, done: Done, *, sync: bool = True) -> None:
        """Runs ``op`` on the writer thread; ``done(result, error)`` is called there once
        its writes are durable (or it failed)."""
        if self._closed:
            done(None, StoreClosedError("store is closed"))
            return
        self._queue.put((op, done, sync))

    def call(self, op: Op, *, sync: bool = True, timeout: float | None = None) -> Any:
        """Blocking ``submit`` for start-up, tools and tests."""
        event = threading.Event()
        box: list[Any] = [None, None]

        def done(result: Any, error: BaseException | None) -> None:
            box[0], box[1] = result, error
            event.set()

        self.submit(op, done, sync=sync)
        if not event.wait(timeout):
            raise TimeoutError("store operation timed out")
        if box[1] is not None:
            raise box[1]
        return box[0]

    def add_batch_listener(self, fn: Callable[[], None]) -> None:
        """``fn`` runs on the writer thread after every batch's completions."""
        self._batch_listeners.append(fn)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            items = [item]
            while len(items) < self.max_ops:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                items.append(nxt)
            self._write_group(items)

    def _write_group(self, items: list[tuple[Op, Done, bool]]) -> None:
        batch = WriteBatch(raw_mode=True)
        handles = self.handles
        outcomes: list[tuple[Done, Any, BaseException | None, OpWrites | None]] = []
        need_sync = False
        staged = 0
        for op, done, sync in items:
            writes = OpWrites(sync=sync)
            try:
                result = op(writes)
            except Exception as exc:  # noqa: BLE001 - the op's own error goes to its caller
                outcomes.append((done, None, exc, None))
                continue
            for cf, key, value in writes.puts:
                self._overlay[(cf, key)] = value
                if value is None:
                    batch.delete(key, handles[cf])
                else:
                    batch.put(key, value, handles[cf])
                    self.bytes_written += len(key) + len(value)
                staged += 1
            need_sync |= writes.sync and bool(writes.puts)
            outcomes.append((done, result, None, writes))
        self._overlay.clear()
        if staged:
            try:
                self.db.write(batch, self._sync_opts if (need_sync and self.sync) else self._async_opts)
            except Exception as exc:  # noqa: BLE001
                # In-memory state already moved with the operations: the only safe answer
                # is to fail everything and stop (a restart recovers from the WAL).
                log.critical("store write failed; stopping", exc_info=True)
                for done, _result, _error, _writes in outcomes:
                    done(None, exc)
                for listener in self._batch_listeners:
                    listener()
                if self._on_fatal is not None:
                    self._on_fatal(exc)
                return
            self.writes += 1
        self.ops_written += len(items)
        for done, result, error, writes in outcomes:
            if writes is not None:
                for fn in writes.after:
                    try:
                        fn()
                    except Exception:  # noqa: BLE001
                        log.exception("after-write hook failed")
            done(result, error)
        for listener in self._batch_listeners:
            listener()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=30)
        try:
            self.db.flush_wal(True)
        except Exception:  # noqa: BLE001
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


_MISSING = object()


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
