"""OperationsService (backup, drain) and restoring a backup.

A backup is a RocksDB checkpoint taken between two writes while the broker serves (so it
is consistent: every request's WriteBatch is in it whole or not at all), streamed file by
file to the caller and closed by a manifest: the shard, the last commit-log sequence and
the log end the copy holds, the time, and every file's size and sha256. ``txmq broker
backup SHARD --to DIR`` writes the files and then ``MANIFEST.json`` into DIR (a directory
without a manifest is an unfinished backup).

:func:`restore` (``txmq broker restore --from DIR --data-dir PATH``, or ``python -m
services.broker.restore``) verifies every file against the manifest, refuses a data dir a
running broker holds (or any non-empty one unless told to replace it), copies the files in
through a staging directory renamed into place, and checks the result with fsck before it
says the store may be started.

What a restored broker lacks: every write after the checkpoint (messages sent,
transactions prepared or ended, acks). The restored store gets a new store identity, so
transaction ids and receipt handles the original issued are refused as an earlier store's
(INVALID_ARGUMENT / NOT_FOUND) rather than taken for what the restored broker issues anew at
the same sequences. Its pending transactions (including those decided after the backup) are
checked again under new ids and decided by their producer group's answers; a transaction
prepared after the backup is gone, so its producer sends it again. Consumers may see
messages they had acknowledged after the backup again (at least once). On a replicated shard, restore one replica's data dir and start
that replica alone first: the other replicas, with empty data dirs, rebuild from it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from txmq.backup import MANIFEST, MANIFEST_FORMAT
from txmq.v1 import common_pb2, operations_pb2, operations_pb2_grpc

from services.common.auth import recheck

from .config import BrokerConfig
from .core import BrokerCore
from .drain import drain_status, is_draining, set_draining_op
from .fsck import check
from .store import codec
from .store.checkpoint import StoreCheckpoint, flush_for_checkpoint
from .store.db import Database

log = logging.getLogger(__name__)



# --- serving a backup -------------------------------------------------------------------------

class OperationsServicer(operations_pb2_grpc.OperationsServiceServicer):
    """``serving()`` gives the store, the domain and the bridge serving clients now
    (``(db, core, bridge)``), or raises (NotLeaderError on a replica that does not lead);
    ``on_drain_change`` runs after the drain flag changed (a heartbeat, so name servers
    mark routes at once)."""

    def __init__(self, *, data_dir: str, shard: str, replica_id: int, replication_factor: int,
                 serving: Callable[[], tuple[Database, Any, Any]],
                 on_drain_change: Callable[[], None] = lambda: None) -> None:
        self.data_dir = data_dir
        self.shard = shard
        self.replica_id = replica_id
        self.replication_factor = replication_factor
        self.serving = serving
        self.on_drain_change = on_drain_change

    async def SetDraining(self, request: operations_pb2.SetDrainingRequest,
                          context: Any) -> operations_pb2.SetDrainingResponse:
        db, core, bridge = self.serving()
        if is_draining(db) != request.draining:
            await bridge.run(set_draining_op(request.draining))
            log.warning("draining" if request.draining else "draining ended", extra={"fields": {"shard": self.shard}})
            self.on_drain_change()
        return operations_pb2.SetDrainingResponse(status=self._status(db, core))

    async def GetDrainStatus(self, request: operations_pb2.GetDrainStatusRequest,
                             context: Any) -> operations_pb2.GetDrainStatusResponse:
        db, core, _bridge = self.serving()
        return operations_pb2.GetDrainStatusResponse(status=self._status(db, core))

    def _status(self, db: Database, core: Any) -> operations_pb2.DrainStatus:
        s = drain_status(db, core)
        return operations_pb2.DrainStatus(
            shard=self.shard, draining=s["draining"], pending_transactions=s["pending_transactions"],
            discarded_transactions=s["discarded_transactions"],
            backlog=[operations_pb2.ConsumerBacklog(consumer_group=g, topic=t, unacknowledged=n)
                     for (g, t), n in s["backlog"].items()],
            unread_topics=s["unread_topics"],
            topics=[common_pb2.TopicQueues(topic=t, queue_count=n) for t, n in s["topics"].items()],
            empty=s["empty"])

    async def BackupStore(self, request: operations_pb2.BackupStoreRequest,
                          context: Any) -> AsyncIterator[operations_pb2.BackupStoreResponse]:
        await flush_for_checkpoint(self.serving()[0])
        db, core, _bridge = self.serving()
        # No await between these lines: the checkpoint and the sequence read are taken
        # between the same two writes.
        last_seq = core.next_seq - 1
        created_ms = int(time.time() * 1000)
        checkpoint = StoreCheckpoint(db, self.data_dir)
        log.info("backup started", extra={"fields": {"log_end": checkpoint.log_end, "last_log_sequence": last_seq}})
        started = time.monotonic()
        total = 0
        try:
            async for name, size, data in checkpoint.chunks():
                recheck()  # admin-read revoked during a backup: nothing more of the store
                total += len(data)
                yield operations_pb2.BackupStoreResponse(chunk=operations_pb2.BackupFileChunk(
                    file_name=name, file_size=size, data=data))
            yield operations_pb2.BackupStoreResponse(manifest=operations_pb2.BackupManifest(
                shard=self.shard, replica_id=self.replica_id, replication_factor=self.replication_factor,
                last_log_sequence=last_seq, log_end=checkpoint.log_end, created_at_ms=created_ms,
                files=[operations_pb2.BackupFile(name=n, size=s, sha256=h)
                       for n, (s, h) in sorted(checkpoint.files.items())]))
        finally:
            checkpoint.remove()
        log.info("backup streamed", extra={"fields": {"bytes": total, "files": len(checkpoint.files),
                                                      "seconds": round(time.monotonic() - started, 3)}})


# --- the manifest -----------------------------------------------------------------------------

class BackupError(Exception):
    """A backup that cannot be restored, or a restore refused (the message says why)."""


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(backup_dir: str) -> dict[str, Any]:
    path = os.path.join(backup_dir, MANIFEST)
    try:
        with open(path) as fh:
            manifest: dict[str, Any] = json.load(fh)
    except FileNotFoundError:
        raise BackupError(f"{backup_dir}: no {MANIFEST} (not a backup, or one that did not finish)") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"{path}: unreadable manifest: {exc}") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise BackupError(f"{path}: manifest format {manifest.get('format')!r}, this broker reads {MANIFEST_FORMAT}")
    return manifest


def verify(backup_dir: str, manifest: dict[str, Any]) -> None:
    """Every file the manifest names is there with its size and sha256, and no other."""
    names = {f["name"] for f in manifest["files"]}
    extra = sorted(set(os.listdir(backup_dir)) - names - {MANIFEST})
    if extra:
        raise BackupError(f"{backup_dir}: files the manifest does not name: {', '.join(extra)}")
    for f in manifest["files"]:
        path = os.path.join(backup_dir, f["name"])
        if not os.path.isfile(path):
            raise BackupError(f"{path}: missing")
        size = os.path.getsize(path)
        if size != f["size"]:
            raise BackupError(f"{path}: {size} bytes, the manifest says {f['size']}")
        if sha256_file(path) != f["sha256"]:
            raise BackupError(f"{path}: sha256 differs from the manifest")


# --- restoring --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Restored:
    data_dir: str
    shard: str
    last_log_sequence: int
    files: int
    bytes: int
    records: dict[str, int]


def store_in_use(data_dir: str) -> bool:
    """True while a process holds the store's RocksDB LOCK (a running broker)."""
    path = os.path.join(data_dir, "LOCK")
    if not os.path.exists(path):
        return False
    with open(path, "r+b") as fh:
        try:
            fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.lockf(fh, fcntl.LOCK_UN)
    return False


def restore(backup_dir: str, data_dir: str, *, replace: bool = False) -> Restored:
    """Copies a verified backup into ``data_dir`` and checks it with fsck; raises
    :class:`BackupError` (changing nothing) when it cannot."""
    manifest = read_manifest(backup_dir)
    verify(backup_dir, manifest)
    data_dir = data_dir.rstrip("/")
    if os.path.isdir(data_dir) and store_in_use(data_dir):
        raise BackupError(f"{data_dir}: a running broker holds this store; stop it before restoring")
    if os.path.exists(data_dir) and (not os.path.isdir(data_dir) or os.listdir(data_dir)) and not replace:
        raise BackupError(f"{data_dir}: not empty (pass --replace to restore over it)")
    parent = os.path.dirname(os.path.abspath(data_dir))
    if not os.access(parent if os.path.isdir(parent) else os.path.dirname(parent), os.W_OK):
        raise BackupError(f"{parent}: not writable")
    staging = data_dir + ".restoring"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    total = 0
    try:
        for f in manifest["files"]:
            dst = os.path.join(staging, f["name"])
            shutil.copyfile(os.path.join(backup_dir, f["name"]), dst)
            with open(dst, "rb+") as fh:
                os.fsync(fh.fileno())
            total += f["size"]
        _sync_dir(staging)
        try:
            core = BrokerCore(BrokerConfig(data_dir=staging, broker_name=manifest["shard"], flush="async"))
        except Exception as exc:  # noqa: BLE001 - RocksDB says why it cannot open the copy
            raise BackupError(f"the restored store does not open: {exc}") from None
        try:
            report = check(core)
            if not report["problems"]:
                # A new store identity: ids the original issued after the checkpoint
                # (transaction ids, receipt handles) must not name what the restored store
                # issues anew at the same sequences and offsets. They are refused instead
                # (an earlier store's); pending transactions get checks under new ids.
                core.db.call(lambda w: w.put("meta", b"store_id", codec.encode_u64(random.getrandbits(32) or 1)))
        finally:
            core.close()
        if report["problems"]:
            raise BackupError(f"the restored store fails fsck: {'; '.join(report['problems'][:5])}")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if os.path.exists(data_dir):
        trash = data_dir + ".replaced"
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(data_dir, trash)
        os.rename(staging, data_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(staging, data_dir)
    _sync_dir(parent)
    log.info("store restored", extra={"fields": {"data_dir": data_dir, "shard": manifest["shard"],
                                                 "last_log_sequence": manifest["last_log_sequence"]}})
    return Restored(data_dir, manifest["shard"], manifest["last_log_sequence"], len(manifest["files"]), total,
                    report["records"])


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
