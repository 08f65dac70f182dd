"""A consistent copy of a live store, read back in chunks: what a follower rebuilding from
its leader and an operator's backup both stream.

:class:`StoreCheckpoint` takes a RocksDB checkpoint (hard links where it can) between two
writes: construct it on the thread that writes (the broker's event loop), so no batch is
half in it, after ``await`` :func:`flush_for_checkpoint` (which flushes the memtables off the loop, so
the checkpoint itself holds the loop for milliseconds). :meth:`StoreCheckpoint.chunks` then
reads its files off the event loop, in name order, and hashes them as it goes;
:meth:`StoreCheckpoint.remove` deletes the copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import uuid
from typing import AsyncIterator

from .db import Database

CHUNK_BYTES = 1024 * 1024


async def flush_for_checkpoint(db: Database) -> None:
    """Syncs ``db``'s WAL and flushes its memtables on a worker thread: construct the
    :class:`StoreCheckpoint` right after, with no other ``await`` between."""
    await asyncio.to_thread(db.prepare_checkpoint)


class StoreCheckpoint:
    def __init__(self, db: Database, data_dir: str, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.path = f"{data_dir.rstrip('/')}.checkpoint-{uuid.uuid4().hex[:8]}"
        self.chunk_bytes = chunk_bytes
        #: The store's write counter (the replication log end) the copy holds.
        self.log_end = db.checkpoint(self.path)
        #: name -> (size, sha256 hex) of every file read to its end by :meth:`chunks`.
        self.files: dict[str, tuple[int, str]] = {}

    async def chunks(self) -> AsyncIterator[tuple[str, int, bytes]]:
        """``(file_name, file_size, data)`` per chunk; name and size only on a file's first
        chunk ("" and 0 after). An empty file is one chunk with no data."""
        for name in sorted(os.listdir(self.path)):
            full = os.path.join(self.path, name)
            size = os.path.getsize(full)
            digest = hashlib.sha256()
            with open(full, "rb") as fh:
                offset = 0
                while True:
                    data = await asyncio.to_thread(fh.read, self.chunk_bytes)
                    digest.update(data)
                    yield (name if offset == 0 else "", size if offset == 0 else 0, data)
                    offset += len(data)
                    if not data or offset >= size:
                        break
            self.files[name] = (offset, digest.hexdigest())

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
