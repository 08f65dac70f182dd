"""A replicated store's log, leader and follower side by side on real RocksDB: a follower
stores the undo records its leader ships instead of reading its own before-images, and
those records are exactly what reading them would have given, so taking back a tail
still puts every replica back where the leader was."""

from __future__ import annotations

import random

import pytest

from services.broker.store import replog
from services.broker.store.db import Database
from services.broker.store.replication_log import CannotTruncateError

CFS = ("txn", "cq", "dedup", "counters", "inflight")


class Pair:
    """A leader (epoch 2) and a follower store, and what the leader's log appended."""

    def __init__(self, tmp_path) -> None:
        self.path = tmp_path
        self.leader = Database(str(tmp_path / "leader"), sync=False, replicated=True)
        self.follower = Database(str(tmp_path / "follower"), sync=False, replicated=True)
        self.shipped: list[tuple[int, bytes, bytes]] = []
        self.leader.replication.append_listeners.append(self.shipped.extend)
        self.leader.replication.begin_epoch(2)

    def reopen_follower(self) -> Database:
        self.follower.close()
        self.follower = Database(str(self.path / "follower"), sync=False, replicated=True)
        return self.follower

    def close(self) -> None:
        self.leader.close()
        self.follower.close()


@pytest.fixture
def pair(tmp_path):
    stores = Pair(tmp_path)
    yield stores
    stores.close()


def _random_puts(rng: random.Random, keys: list[tuple[str, bytes]]) -> list[tuple[str, bytes, bytes | None]]:
    """A write batch over a small key space: puts and deletes, some keys twice in one batch."""
    puts: list[tuple[str, bytes, bytes | None]] = []
    for _ in range(rng.randint(1, 6)):
        cf, key = rng.choice(keys)
        value = None if rng.random() < 0.25 else rng.randbytes(rng.randint(0, 24))
        puts.append((cf, key, value))
    return puts


def _staging(puts: list[tuple[str, bytes, bytes | None]]):
    def op(w) -> None:
        for cf, key, value in puts:
            if value is None:
                w.delete(cf, key)
            else:
                w.put(cf, key, value)
    return op


def _expected_undo(follower: Database, entries: list[tuple[int, bytes, bytes]]) -> dict[int, bytes]:
    """The undo record of each entry as a follower reading its own before-images computes it
    (the keys' values in its store, or earlier in the same batch), before it appends them."""
    staged: dict[tuple[str, bytes], bytes | None] = {}
    out = {}
    for lsn, data, _undo in entries:
        _epoch, puts = replog.decode_entry(data)
        record, seen = [], set()
        for cf, key, value in puts:
            if (cf, key) not in seen:
                seen.add((cf, key))
                record.append((cf, key, staged[(cf, key)] if (cf, key) in staged else follower.cf[cf].get(key)))
            staged[(cf, key)] = value
        out[lsn] = replog.encode_entry(0, record)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_follower_stores_the_undo_records_its_own_before_images_give(pair, seed):
    rng = random.Random(seed)
    leader, follower, shipped = pair.leader, pair.follower, pair.shipped
    keys = [(rng.choice(CFS), bytes([i])) for i in range(12)]
    digests = {0: leader.digest()}
    checked = 0
    for _round in range(40):
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.3:
                with leader.grouped():
                    for _ in range(rng.randint(2, 3)):
                        leader.apply(_staging(_random_puts(rng, keys)))
            else:
                leader.apply(_staging(_random_puts(rng, keys)))
            digests[leader.written] = leader.digest()
        # Ship what is new, the commit point somewhere behind it (as a leader's lags).
        batch = [e for e in shipped if e[0] > follower.written]
        commit = rng.randint(follower.replication.commit_lsn, batch[0][0] - 1)
        expected = _expected_undo(follower, batch)
        follower.replication.append_entries(replog.pack_entries(batch), commit)
        assert follower.written == leader.written
        for lsn, _data, undo in batch:
            stored = follower.cf["undo"].get(replog.lsn_key(lsn))
            if lsn > follower.replication.commit_lsn:
                assert stored == expected[lsn], f"seed {seed}: lsn {lsn}'s undo record is not its before-image"
                assert stored == undo == leader.cf["undo"].get(replog.lsn_key(lsn))
                checked += 1
        leader.replication.note_commit(commit)
    assert checked > 40
    assert follower.digest() == leader.digest()
    # Taking back the uncommitted tail with the shipped records: the follower is where
    # the leader was at that lsn.
    back = rng.randint(follower.replication.commit_lsn, follower.written - 1)
    follower.replication.truncate(back)
    assert follower.written == back
    assert follower.digest() == digests[back], f"seed {seed}: truncated to {back}, state differs"


def test_committed_entries_come_without_undo_records_and_cannot_be_taken_back(pair):
    leader, follower = pair.leader, pair.follower
    for i in range(6):
        leader.apply(lambda w, i=i: w.put("txn", bytes([i % 3]), bytes([i])))
    # Entries 1-4 committed (no undo record), 5-6 above the commit point (with theirs).
    wire = [(lsn, data, b"" if lsn <= 4 else undo) for lsn, data, undo in pair.shipped]
    follower.replication.append_entries(replog.pack_entries(wire), 4)
    assert follower.replication.commit_lsn == 4
    assert [replog.key_lsn(k) for k, _ in follower.scan("undo")] == [5, 6]
    follower.replication.truncate(4)
    assert [v for _k, v in follower.scan("txn")] == [bytes([3]), bytes([1]), bytes([2])]  # as after lsn 4
    with pytest.raises(CannotTruncateError):
        follower.replication.truncate(3)
    # The commit point moved with the entries, durably: a reopened store knows it.
    assert pair.reopen_follower().replication.commit_lsn == 4


def test_an_entry_above_the_commit_point_without_its_undo_record_is_refused_and_nothing_applied(pair):
    leader, follower = pair.leader, pair.follower
    for i in range(3):
        leader.apply(lambda w, i=i: w.put("txn", bytes([i]), b"v"))
    wire = [(lsn, data, b"" if lsn == 3 else undo) for lsn, data, undo in pair.shipped]
    with pytest.raises(ValueError, match="entry 3 comes without its undo record, above the commit point 1"):
        follower.replication.append_entries(replog.pack_entries(wire), 1)
    corrupt = [(lsn, data, undo[:-1] + bytes([undo[-1] ^ 1])) for lsn, data, undo in pair.shipped]
    with pytest.raises(Exception, match="undo record"):
        follower.replication.append_entries(replog.pack_entries(corrupt), 0)
    assert follower.written == 0 and follower.replication.commit_lsn == 0
    assert list(follower.scan("txn")) == [] and list(follower.scan("undo")) == []


def test_a_checkpoint_after_the_off_loop_flush_has_no_memtable_left_to_flush_and_holds_every_write(pair, tmp_path):
    """RocksDB's checkpoint flushes the memtables while it holds the GIL: a leader building
    one for a rebuilding follower under load held its event loop past its etcd lease and
    stepped down (chaos seed 1). ``flush_for_checkpoint`` does that flush on a worker
    thread first, so the checkpoint taken after it, on the loop, has nothing large left to
    flush; the copy still holds every write and the log end it reports."""
    import asyncio

    from services.broker.store.checkpoint import StoreCheckpoint, flush_for_checkpoint

    rng = random.Random(7)
    db = pair.leader
    for i in range(300):
        db.apply(_staging([(cf, f"k{i}-{cf}".encode(), rng.randbytes(64)) for cf in CFS]))

    def unflushed() -> int:
        return sum(db.cf[cf].property_int_value("rocksdb.num-entries-active-mem-table") for cf in CFS)

    assert unflushed() >= 300 * len(CFS)
    asyncio.run(flush_for_checkpoint(db))
    assert unflushed() == 0
    checkpoint = StoreCheckpoint(db, str(tmp_path / "leader"))
    try:
        assert checkpoint.log_end == db.written
        copy = Database(checkpoint.path, sync=False, replicated=True)
        try:
            assert copy.written == db.written
            assert copy.digest() == db.digest()
        finally:
            copy.close()
    finally:
        checkpoint.remove()


def test_a_closed_store_skips_the_checkpoint_flush(tmp_path):
    db = Database(str(tmp_path / "s"), sync=False, replicated=True)
    db.close()
    db.prepare_checkpoint()  # a stop raced the rebuild's flush: nothing to do, no crash


def _range_deletions(db: Database, cf: str) -> int:
    db._flush_all()
    props = db.cf[cf].property_value("rocksdb.aggregated-table-properties")
    return int(props.split("# range deletions=")[1].split(";")[0])


def test_clearing_committed_undo_records_and_the_trimmed_log_leaves_no_pile_of_range_tombstones(tmp_path):
    """Each commit point cleared the undo records below it with a range tombstone from 0:
    RocksDB's flush fragments overlapping ones at a cost that grows with their square (a
    replica that had advanced its commit ~12,000 times took 62 s to open; 10,000 took 7 GB
    to close). Committed undo records now go with point tombstones, the trimmed log in
    disjoint strides; both still go, and uncommitted undo records stay."""
    db = Database(str(tmp_path / "s"), sync=False, replicated=True, replog_keep_entries=100)
    db.replication.begin_epoch(2)
    for i in range(600):
        db.apply(_staging([("txn", f"k{i}".encode(), b"v")]))
        db.replication.note_commit(db.written - 1)  # one entry behind, as under load
    assert _range_deletions(db, "undo") == 0
    assert _range_deletions(db, "replog") <= 600 // 25 + 1  # one per stride of 25, none overlapping
    kept = [replog.key_lsn(k) for k, _ in db.scan("undo")]
    # The last commit point is recorded (and its undo records cleared) with the next write.
    assert kept == [db.written - 1, db.written], "committed undo records are left"
    assert db.first_key("replog") is not None and replog.key_lsn(db.first_key("replog")) > db.written - 200
    db.close()
