"""Between the asyncio server and the store's writer thread.

Operations resolve asyncio futures and topics wake long polls; both are collected on the
writer thread and handed to the event loop once per written batch (one wake-up per
group commit, not one per request).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from .store.db import Database, Op


class StoreBridge:
    def __init__(self, db: Database, loop: asyncio.AbstractEventLoop) -> None:
        self.db = db
        self.loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._topics: set[str] = set()
        self._versions: dict[str, int] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        db.add_batch_listener(self._flush)

    def run(self, op: Op, *, sync: bool = True) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()
        ready = self._ready
        lock = self._lock

        def done(result: Any, error: BaseException | None) -> None:
            with lock:
                ready.append((fut, result, error))

        self.db.submit(op, done, sync=sync)
        return fut

    def note_visible(self, topic: str) -> None:
        """Writer thread: ``topic`` got messages (or an earlier redelivery)."""
        with self._lock:
            self._topics.add(topic)

    def _flush(self) -> None:
        with self._lock:
            if not self._ready and not self._topics:
                return
            items, self._ready = self._ready, []
            topics, self._topics = self._topics, set()
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._resolve, items, topics)

    def _resolve(self, items: list[tuple[asyncio.Future[Any], Any, BaseException | None]],
                 topics: set[str]) -> None:
        for fut, result, error in items:
            if fut.done():
                continue
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
        for topic in topics:
            self._versions[topic] = self._versions.get(topic, 0) + 1
            for waiter in self._waiters.pop(topic, ()):
                if not waiter.done():
                    waiter.set_result(None)

    # --- long polling (event loop only) ---------------------------------------------------

    def version(self, topic: str) -> int:
        return self._versions.get(topic, 0)

    async def wait_visible(self, topic: str, since_version: int, timeout: float) -> None:
        """Returns when ``topic`` changed after ``since_version`` or ``timeout`` passed."""
        if self._versions.get(topic, 0) != since_version or timeout <= 0:
            return
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._waiters.setdefault(topic, set()).add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(topic)
            if waiters is not None:
                waiters.discard(waiter)
