"""Rebuilds (docs/replication.md, "Rebuild"): a replica with nothing to continue from —
new, wiped, or behind the oldest entry its leader keeps — copies a RocksDB checkpoint of
the leader's store over gRPC (``FetchCheckpoint``: rare, and its chunks are large), swaps
it in with fsync and rename, and follows from the checkpoint's log end. It is no member
(it may not lead) until its leader counts it in sync again.

:func:`serve_checkpoint` is the leader's side, :func:`rebuild_from` the follower's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Any, AsyncIterator, Callable

import grpc

from txmq.v1 import replication_pb2, replication_pb2_grpc

from services.common.auth import recheck
from services.common.channels import open_channel

from ..config import BrokerConfig
from ..store.checkpoint import StoreCheckpoint, flush_for_checkpoint
from ..store.db import Database
from .state import Leader

log = logging.getLogger(__name__)

#: Largest FetchCheckpoint message a rebuilding follower accepts.
MAX_CHECKPOINT_MESSAGE_BYTES = 64 * 1024 * 1024
CHECKPOINT_CHUNK = 1024 * 1024

Refusal = Callable[[], "tuple[grpc.StatusCode, str] | None"]


async def serve_checkpoint(db: Database, data_dir: str, request: replication_pb2.FetchCheckpointRequest,
                           context: Any, refusal: Refusal) -> AsyncIterator[replication_pb2.FetchCheckpointResponse]:
    """Streams a checkpoint of ``db`` to the follower ``request`` names, while
    ``refusal()`` (asked again after the flush: the term may have ended meanwhile) is None
    and the caller's credentials still name a service identity (decided again before each
    chunk once the credential files were reloaded: UNAUTHENTICATED or PERMISSION_DENIED)."""
    refused = refusal()
    if refused is None:
        await flush_for_checkpoint(db)
        refused = refusal()
    if refused is not None:
        await context.abort(*refused)
    checkpoint = StoreCheckpoint(db, data_dir, chunk_bytes=CHECKPOINT_CHUNK)
    log.info("checkpoint for a follower", extra={"fields": {"replica_id": request.replica_id,
                                                            "log_end": checkpoint.log_end}})
    try:
        first = True
        async for name, size, data in checkpoint.chunks():
            recheck()  # the follower's identity removed meanwhile: nothing more of the store
            yield replication_pb2.FetchCheckpointResponse(
                file_name=name, file_size=size, data=data, log_end=checkpoint.log_end if first else 0)
            first = False
    finally:
        checkpoint.remove()


async def rebuild_from(config: BrokerConfig, db: Database, leader: Leader) -> Database:
    """Replaces the store ``db`` (closed here) with a checkpoint of ``leader``'s; returns
    the new store, not a member, with ``db``'s append listeners."""
    channel = open_channel(leader.address, MAX_CHECKPOINT_MESSAGE_BYTES)
    try:
        stub = replication_pb2_grpc.ReplicationServiceStub(channel)
        data_dir = config.data_dir.rstrip("/")
        staging = data_dir + ".rebuild"
        started = time.monotonic()
        log_end, total = await _fetch(stub, config, leader, staging)
    finally:
        await channel.close()
    reopen = db.reopen_args()
    db.close()
    trash = data_dir + ".old"
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(data_dir, trash)
    os.rename(staging, data_dir)
    _sync_dir(os.path.dirname(os.path.abspath(data_dir)))
    shutil.rmtree(trash, ignore_errors=True)
    new = Database(data_dir, **reopen)
    new.replication.set_member(False)  # a member again once its leader counts it in sync
    new.replication.append_listeners.extend(db.replication.append_listeners)
    log.warning("rebuilt from the leader's checkpoint", extra={"fields": {
        "log_end": log_end, "bytes": total, "seconds": round(time.monotonic() - started, 3)}})
    return new


async def _fetch(stub: replication_pb2_grpc.ReplicationServiceAsyncStub, config: BrokerConfig, leader: Leader,
                 staging: str) -> tuple[int, int]:
    """Writes the checkpoint's files into ``staging``, synced; returns (its log end, bytes)."""
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    log_end = 0
    total = 0
    fh = None
    try:
        async for chunk in stub.FetchCheckpoint(replication_pb2.FetchCheckpointRequest(
                shard=config.broker_name, replica_id=config.replica_id, leader_epoch=leader.epoch)):
            if chunk.log_end:
                log_end = chunk.log_end
            if chunk.file_name:
                if fh is not None:
                    await asyncio.to_thread(_close_synced, fh)  # an fsync: off the event loop
                if "/" in chunk.file_name or chunk.file_name in (".", ".."):
                    raise RuntimeError(f"bad checkpoint file name {chunk.file_name!r}")
                fh = open(os.path.join(staging, chunk.file_name), "wb")
            if fh is None:
                raise RuntimeError("checkpoint data before a file name")
            fh.write(chunk.data)
            total += len(chunk.data)
        if fh is not None:
            await asyncio.to_thread(_close_synced, fh)
            fh = None
        await asyncio.to_thread(_sync_dir, staging)
    except BaseException:
        if fh is not None:
            fh.close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return log_end, total


def _close_synced(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
