"""The replication log of a replicated shard (replication_factor > 1), kept in the store it
belongs to: every write of the store is also a numbered entry of this log with its undo
record (the keys' values before it), so a follower applies what its leader shipped and a
replica can take back a tail its leader never acknowledged. The store's ``written`` is the
log's last lsn.

The log's own state (the epoch this replica writes with, the epoch history, the commit
point, where the kept log starts) lives here; the store (:class:`~.db.Database`) owns the
RocksDB handles and the write numbering, and hands each of its own writes to
:meth:`ReplicationLog.append` when replicated. Entries are encoded by :mod:`.replog`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Protocol

from rocksdict import WriteBatch

from . import replog
from .codec import decode_u64, encode_u64, unframe

log = logging.getLogger(__name__)


class Store(Protocol):
    """What the log needs of the store that holds it (:class:`~.db.Database`)."""

    cf: dict[str, Any]
    handles: dict[str, Any]
    #: The number of the last write: the log's last lsn.
    written: int
    read_ticket: int
    bytes_written: int

    def commit_batch(self, batch: WriteBatch) -> None: ...

    def sync_wal(self) -> None: ...

    def scan(self, cf: str, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]: ...

    def first_key(self, cf: str, prefix: bytes = b"") -> bytes | None: ...

    def last_key(self, cf: str, prefix: bytes = b"") -> bytes | None: ...


class CannotTruncateError(Exception):
    """A replica cannot take back its log to a point: it must be rebuilt from its leader."""


class ReplicationLog:
    """The replication log's state and operations, over the store that holds it (one
    thread owns both: the broker's event loop)."""

    def __init__(self, store: Store, keep_entries: int) -> None:
        self.store = store
        #: Committed entries kept for followers that fall behind (older ones are trimmed).
        self.keep_entries = keep_entries
        #: The epoch this replica's own writes are stamped with (set when it leads).
        self.epoch = 0
        #: (epoch, first lsn) of every epoch in this replica's log, ascending.
        self.epochs: list[tuple[int, int]] = []
        #: Entries up to here are known to be on every in-sync replica: their undo records
        #: can go (they will never be taken back).
        self.commit_lsn = 0
        self._undo_cleared = 0
        self._first = 0
        #: Called with [(lsn, encoded entry, its undo record or b"")] after every
        #: replicated write.
        self.append_listeners: list[Callable[[list[tuple[int, bytes, bytes]]], None]] = []

    def load(self) -> None:
        """Reads this replica's log end, commit point and epochs from the store (at open)."""
        local = self.store.cf["replica"]
        self.epochs = replog.decode_epochs(local.get(b"epochs"))
        stored = local.get(b"lsn")
        last = self.store.last_key("replog")
        self.store.written = max(decode_u64(stored, "replica lsn") if stored else 0,
                           replog.key_lsn(last) if last else 0)
        committed = local.get(b"commit")
        self.commit_lsn = min(decode_u64(committed, "replica commit") if committed else 0, self.store.written)
        self._undo_cleared = self.commit_lsn
        first = self.store.first_key("replog")
        self._first = replog.key_lsn(first) if first else self.store.written + 1
        # What is on disk may not be on the other replicas yet: a read of it waits until it is.
        self.store.read_ticket = self.store.written

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else 0

    @property
    def first(self) -> int:
        """The oldest lsn this replica can still ship (``written + 1`` when none)."""
        return self._first

    @property
    def is_member(self) -> bool:
        """Whether this replica holds a complete copy of its shard (not a fresh or wiped
        store, not a rebuild in progress): only a member may lead."""
        return self.store.cf["replica"].get(b"member") == b"1"

    def set_member(self, member: bool) -> None:
        if member:
            self.store.cf["replica"][b"member"] = b"1"
        else:
            self.store.cf["replica"].delete(b"member")
        self.store.sync_wal()

    def begin_epoch(self, epoch: int) -> None:
        """This replica leads from now on with ``epoch``: its writes carry it, and its
        history records that the epoch starts at the next lsn (durably, before anything is
        written in it)."""
        if epoch <= self.last_epoch:
            raise ValueError(f"epoch {epoch} is not above {self.last_epoch}")
        self.epoch = epoch
        self.epochs.append((epoch, self.store.written + 1))
        self.store.cf["replica"][b"epochs"] = replog.encode_epochs(self.epochs)
        self.store.sync_wal()

    def append_entries(self, data: bytes, commit: int) -> int:
        """A follower appends what its leader shipped (``replog.pack_entries``) in a frame
        carrying the leader's commit point ``commit``: each entry is applied as the leader
        applied it, with the leader's undo record stored as it came (no before-image read
        here: replicas are equal at every lsn), all in one batch (unsynced). Returns the new
        log end."""
        entries = []
        expect = self.store.written + 1
        last_epoch = self.last_epoch
        for lsn, value, undo in replog.unpack_entries(data):
            if lsn != expect:
                raise ValueError(f"replication entry {lsn} does not follow {expect - 1}")
            epoch, puts = replog.decode_entry(value, replog.lsn_key(lsn))
            if epoch < last_epoch:
                raise ValueError(f"entry {lsn} has epoch {epoch}, older than {last_epoch}")
            if undo:
                unframe(undo, "undo record", replog.lsn_key(lsn))  # its CRC: stored, it must be right
            elif lsn > commit:
                raise ValueError(f"entry {lsn} comes without its undo record, above the commit point {commit}")
            last_epoch = epoch
            entries.append((lsn, value, puts, undo))
            expect += 1
        if entries:
            # Entries shipped without an undo record are committed: the commit point moves
            # over them in the same batch, so a replica never holds, above its commit point,
            # an entry it could not take back.
            self.commit_lsn = max(self.commit_lsn, min(commit, entries[-1][0]))
            self.append(entries)
        return self.store.written

    def append(self, entries: list[tuple[int, bytes, list[tuple[str, bytes, bytes | None]], bytes | None]]) -> None:
        """Writes entries (lsn, encoded, puts, undo) as one batch: their state, the entries
        themselves, their undo records (the keys' values before them: ``undo`` as shipped,
        none for ``b""`` (a committed entry), or, for ``None`` (this replica's own write, as
        leader), read from the store now), the epoch history and log end; plus the cleanup
        of undo records now committed and of the oldest log entries beyond
        ``replog_keep_entries``."""
        batch = WriteBatch(raw_mode=True)
        handles = self.store.handles
        cf = self.store.cf
        before: dict[tuple[str, bytes], bytes | None] = {}
        size = 0
        epochs_changed = False
        shipped: list[tuple[int, bytes, bytes]] = []
        for lsn, encoded, puts, undo in entries:
            if undo is None:
                record: list[tuple[str, bytes, bytes | None]] = []
                seen: set[tuple[str, bytes]] = set()
                for name, key, value in puts:
                    ref = (name, key)
                    if ref not in seen:
                        seen.add(ref)
                        record.append((name, key, before[ref] if ref in before else cf[name].get(key)))
                    before[ref] = value
                undo = replog.encode_entry(0, record)
            for name, key, value in puts:
                if value is None:
                    batch.delete(key, handles[name])
                else:
                    batch.put(key, value, handles[name])
                    size += len(key) + len(value)
            lkey = replog.lsn_key(lsn)
            batch.put(lkey, encoded, handles["replog"])
            if undo:
                batch.put(lkey, undo, handles["undo"])
            shipped.append((lsn, encoded, undo))
            epoch = replog.entry_epoch(encoded)
            if epoch > self.last_epoch:
                self.epochs.append((epoch, lsn))
                epochs_changed = True
        last = entries[-1][0]
        local = handles["replica"]
        batch.put(b"lsn", encode_u64(last), local)
        if epochs_changed:
            batch.put(b"epochs", replog.encode_epochs(self.epochs), local)
        if self.commit_lsn > self._undo_cleared:
            _clear(batch, handles["undo"], self._undo_cleared + 1, self.commit_lsn + 1)
            batch.put(b"commit", encode_u64(self.commit_lsn), local)
            self._undo_cleared = self.commit_lsn
        trim = min(last - self.keep_entries, self.commit_lsn) + 1
        if trim > self._first + min(1024, max(self.keep_entries // 4, 1)):  # in strides
            _clear(batch, handles["replog"], self._first, trim)
            self._first = trim
        self.store.commit_batch(batch)
        self.store.written = last
        self.store.bytes_written += size
        if self._first > last:
            self._first = entries[0][0]
        for fn in self.append_listeners:
            fn(shipped)

    def read_entries(self, first: int, max_bytes: int) -> list[tuple[int, bytes, bytes]]:
        """Entries from ``first`` on, at least one, about ``max_bytes`` in all, each with
        its undo record (b"" where it is gone: the entry is committed)."""
        out: list[tuple[int, bytes, bytes]] = []
        size = 0
        undo_cf = self.store.cf["undo"]
        for key, value in self.store.scan("replog", replog.lsn_key(first)):
            undo = undo_cf.get(key) or b""
            out.append((replog.key_lsn(key), value, undo))
            size += len(value) + len(undo)
            if size >= max_bytes:
                break
        return out

    def truncate(self, to_lsn: int) -> int:
        """Takes back every entry after ``to_lsn`` (a tail its leader never had
        acknowledged): their undo records are applied newest first, the entries, undo
        records and the epochs that began after ``to_lsn`` dropped, in one synced batch.
        Returns how many entries went. Raises :class:`CannotTruncateError` when an undo
        record is missing (the replica must be rebuilt)."""
        if to_lsn >= self.store.written:
            kept = [(e, s) for e, s in self.epochs if s <= to_lsn]
            if kept != self.epochs:
                # Epochs begun after the log's end hold no entry: this replica won them and
                # lost them before writing. Its leader may ship entries of an older epoch
                # there, which the newer one would refuse (Kafka drops them too).
                self.epochs = kept
                self.store.cf["replica"][b"epochs"] = replog.encode_epochs(kept)
                self.store.sync_wal()
                log.warning("empty epochs dropped", extra={"fields": {"after_lsn": to_lsn, "epochs": kept[-3:]}})
            return 0
        if to_lsn < self.commit_lsn:
            raise CannotTruncateError(f"lsn {to_lsn} is below the commit point {self.commit_lsn}")
        batch = WriteBatch(raw_mode=True)
        handles = self.store.handles
        undo_cf = self.store.cf["undo"]
        for lsn in range(self.store.written, to_lsn, -1):
            value = undo_cf.get(replog.lsn_key(lsn))
            if value is None:
                raise CannotTruncateError(f"no undo record for lsn {lsn}")
            _epoch, puts = replog.decode_entry(value, replog.lsn_key(lsn))
            for name, key, old in puts:
                if old is None:
                    batch.delete(key, handles[name])
                else:
                    batch.put(key, old, handles[name])
        end = replog.lsn_key(self.store.written + 1)
        batch.delete_range(replog.lsn_key(to_lsn + 1), end, handles["replog"])
        batch.delete_range(replog.lsn_key(to_lsn + 1), end, handles["undo"])
        dropped = self.store.written - to_lsn
        self.epochs = [(e, s) for e, s in self.epochs if s <= to_lsn]
        local = handles["replica"]
        batch.put(b"epochs", replog.encode_epochs(self.epochs), local)
        batch.put(b"lsn", encode_u64(to_lsn), local)
        self.store.commit_batch(batch)
        self.store.sync_wal()
        self.store.written = to_lsn
        self.store.read_ticket = min(self.store.read_ticket, to_lsn)
        if self._first > to_lsn:
            self._first = to_lsn + 1
        log.warning("replication log truncated", extra={"fields": {"to_lsn": to_lsn, "entries_dropped": dropped}})
        return dropped

    def note_commit(self, lsn: int) -> None:
        """Entries up to ``lsn`` are on every in-sync replica (recorded with the next write)."""
        if lsn > self.commit_lsn:
            self.commit_lsn = min(lsn, self.store.written)


#: A log range cleared with more entries than this takes one range tombstone, a shorter one
#: a point tombstone per entry.
CLEAR_RANGE_ENTRIES = 4096


def _clear(batch: WriteBatch, handle: Any, first: int, end: int) -> None:
    """Deletes the log entries [first, end) of one column family. Never a range tombstone
    from 0 on each commit, as this did: RocksDB fragments overlapping range tombstones when
    it flushes a memtable, at a cost that grows with their square. A replica that had
    advanced its commit point ~12,000 times took 62 s to open (its recovery flushed them),
    and 10,000 of them took 7 GB and 28 s to close. Point tombstones for the usual few
    entries, and disjoint ranges for a long stretch (a jump after a rebuild), stay linear."""
    if end - first > CLEAR_RANGE_ENTRIES:
        batch.delete_range(replog.lsn_key(first), replog.lsn_key(end), handle)
        return
    for lsn in range(first, end):
        batch.delete(replog.lsn_key(lsn), handle)
