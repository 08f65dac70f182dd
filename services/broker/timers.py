"""Delay / timer messages: a message with a delivery time stays out of its queue until
then. Its log record (with ``deliver_at_ms``) is stored at once; the ``timer`` index holds
``due_ms | seq`` until the time comes, when :meth:`Timers.timer_op` moves it into its
queue in one batch (queue entry + index removal), so it is delivered as normal from then on.

- A normal message with a delivery time is scheduled when it is stored; its queue offset
  is given when it is moved, and its log record is rewritten then with that offset (as
  RocketMQ 5's timer writes a timer message again when it is due).
- A transactional message with a delivery time is scheduled when it is committed (if the
  time is still ahead; else it is visible at once, like any commit); the moved message gets
  its queue offset in its transaction row.

The index is read from its start up to now: its cost follows due work, never the number
of messages scheduled further ahead, and the earliest due time is kept in memory (loaded
from the index's first key when the store opens), so the pump (``TimerPump``) sleeps
until exactly then. Every write is in the replicated column families: a new leader loads
the index and carries on. A message is never moved before its time (the broker's clock).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Callable

from txmq.fifo import message_group_hash

from services.common.aio import wait_event

from .base import BrokerContext
from .model import KIND_NORMAL, STATE_COMMITTED
from .queues import Queues
from .store import codec
from .store.codec import CqEntry, LogRecord
from .store.db import OpWrites

log = logging.getLogger(__name__)

#: Messages one timer operation moves at most (an operation holds the event loop).
TIMER_ROUND = 1000


class Timers:
    """The timer index: scheduling, and moving due messages into their queues."""

    def __init__(self, ctx: BrokerContext, queues: Queues) -> None:
        self.ctx = ctx
        self.queues = queues
        first = ctx.db.first_key("timer")
        #: The earliest due time in the index (None: empty).
        self._next: int | None = codec.split_timer_key(first)[0] if first else None

    def timer_next_ms(self) -> int | None:
        return self._next

    def schedule(self, w: OpWrites, due_ms: int, seq: int) -> None:
        w.put("timer", codec.timer_key(due_ms, seq), b"")
        if self._next is None or due_ms < self._next:
            self._next = due_ms
            w.on_durable(lambda: self.ctx.listeners.notify_timer(due_ms))

    def send_scheduled(self, w: OpWrites, record: LogRecord, seq: int) -> None:
        """Stages a normal message with a delivery time: stored, deduplicated, scheduled;
        not in its queue (offset -1 until it is moved)."""
        w.put("log", codec.log_key(seq), codec.encode_log_record(record))
        w.put("dedup", record.message_id.encode(), codec.encode_dedup(
            codec.DedupEntry(codec.DEDUP_NORMAL, seq, record.queue_id, -1)))
        self.ctx.expire_dedup(w, record.stored_ms, record.message_id)
        self.schedule(w, record.deliver_at_ms, seq)
        topic = record.topic
        w.on_durable(lambda: self.ctx.listeners.notify_stored(topic, KIND_NORMAL))

    def timer_op(self, limit: int = TIMER_ROUND) -> Callable[[OpWrites], int]:
        """Moves up to ``limit`` due messages into their queues; returns how many."""
        def op(w: OpWrites) -> int:
            db = self.ctx.db
            now = self.ctx.clock()
            moved = 0
            visible: set[str] = set()
            lateness: list[int] = []
            for key, _ in db.scan("timer", b"", codec.timer_key(now + 1, 0)):
                if moved >= limit:
                    break
                if db.get("timer", key) is None:
                    continue  # moved by an earlier operation of this write group
                due, seq = codec.split_timer_key(key)
                w.delete("timer", key)
                moved += 1
                lateness.append(now - due)
                topic = self._move(w, seq, now)
                if topic:
                    visible.add(topic)
            self._next = self._next_due(now, moved >= limit)
            listeners = self.ctx.listeners
            for topic in sorted(visible):
                w.on_durable(functools.partial(listeners.notify_visible, topic))
            if lateness:
                w.on_durable(lambda: listeners.notify_timer_moved(lateness))
            return moved
        return op

    def _next_due(self, now: int, more_now: bool) -> int | None:
        if more_now:
            return now
        first = None
        for key, _ in self.ctx.db.scan("timer", codec.timer_key(now + 1, 0)):
            first = key
            break
        return codec.split_timer_key(first)[0] if first else None

    def _move(self, w: OpWrites, seq: int, now: int) -> str:
        """Puts the scheduled message ``seq`` into its queue; returns its topic ('' if it is
        gone: removed by retention, or a transaction no longer committed)."""
        record = self.ctx.read_message(seq)
        if record is None:
            return ""
        entry = CqEntry(seq, now, record.tag, message_group_hash(record.message_group))
        if record.kind == KIND_NORMAL:
            topic = record.topic
            record.queue_offset = self.queues.append(w, topic, record.queue_id, entry, record.keys)
            w.put("log", codec.log_key(seq), codec.encode_log_record(record))
        else:
            row = self.ctx.read_txn(seq)
            if row is None or row.state != STATE_COMMITTED:
                return ""
            topic = row.topic
            row.queue_offset = self.queues.append(w, topic, row.queue_id, entry, record.keys)
            w.put("txn", codec.txn_key(seq), codec.encode_txn(row))
        return topic


class TimerPump:
    """Runs the leader's timer: sleeps until the earliest due time (or until a send or a
    commit schedules an earlier one), then moves what is due. ``current`` gives the
    serving (core, bridge), or None while this replica does not lead."""

    def __init__(self, current: Callable[[], tuple[Any, Any] | None],
                 on_moved: Callable[[int], None] | None = None) -> None:
        self._current = current
        self._on_moved = on_moved
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self, _due_ms: int = 0) -> None:
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="timer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # before reading the due time: a wake after this is kept
            pair = self._current()
            wait: float | None = 1.0  # not leading: look again (a new term wakes us too)
            if pair is not None:
                core, bridge = pair
                due = core.timer_next_ms()
                wait = None if due is None else (due - core.clock()) / 1000
                if wait is not None and wait <= 0:
                    try:
                        moved = await bridge.run(core.timer_op(), sync=True)
                    except asyncio.CancelledError:
                        raise
                    except Exception:  # a lost leadership or a refused write: try again
                        log.warning("timer round failed", exc_info=True)
                        moved, wait = 0, 0.1
                    else:
                        if self._on_moved is not None and moved:
                            self._on_moved(moved)
                        continue
            await wait_event(self._wake, wait)
