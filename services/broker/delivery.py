"""Consumer deliveries: receiving (new messages and redeliveries of those whose
invisibility ran out), acknowledgements, invisibility changes, dead-lettering to
%DLQ%<group>, and reading a queue by offset.

A delivery is at least once: the in-flight entries and cursors these operations stage are
written without waiting for the disk (``w.sync = False``), because losing one only means
a message is delivered again.
"""

from __future__ import annotations

from typing import Callable

from txmq.errors import InvalidFieldError, QueueNotFoundError, ReceiptHandleNotFoundError
from txmq.ids import ReceiptHandle
from txmq.names import dlq_topic, validate_group

from .base import BrokerContext
from .consumers import ConsumerGroups, Cursor, Inflight
from .filters import MessageFilter, SqlFilter, message_properties
from .model import Delivery, ReceiveResult
from .queues import Queues
from .store import codec
from .store.codec import CqEntry
from .store.db import OpWrites

#: Queue entries one receive passes over for a filter at most (per queue) before it answers;
#: a longer run of filtered-out messages is scanned by the next receive (the long poll
#: comes back at once), so a selective filter never holds the event loop for long.
MAX_FILTERED_SCAN = 4096


class Deliveries:
    """Receive, redelivery, DLQ, ack, change-invisible, dead-letter."""

    def __init__(self, ctx: BrokerContext, queues: Queues, consumers: ConsumerGroups) -> None:
        self.ctx = ctx
        self.queues = queues
        self.consumers = consumers
        #: A replicated shard's leader epoch this domain serves in (0: unreplicated). Every
        #: delivery records it and its receipt handle carries it.
        self.leader_epoch = 0

    def receive_op(self, group: str, topic: str, queue_id: int, tags: MessageFilter,
                   max_messages: int, invisible_seconds: float) -> Callable[[OpWrites], ReceiveResult]:
        cfg = self.ctx.config
        validate_group("consumer_group", group)
        count = self.queues.count(topic)
        if queue_id >= count or queue_id < -1:
            raise QueueNotFoundError(topic, queue_id)
        if max_messages <= 0:
            raise InvalidFieldError("max_messages", "must be positive")
        max_messages = min(max_messages, cfg.max_receive_batch)
        if invisible_seconds == 0:
            invisible_seconds = cfg.default_invisible_duration_seconds
        if not 0 < invisible_seconds <= cfg.max_invisible_duration_seconds:
            raise InvalidFieldError("invisible_duration_seconds",
                                    f"{invisible_seconds} is outside (0, max_invisible_duration_seconds="
                                    f"{cfg.max_invisible_duration_seconds}]")
        invisible_ms = int(max(invisible_seconds, cfg.min_invisible_duration_seconds) * 1000)
        queues = [queue_id] if queue_id >= 0 else list(range(count))
        if len(queues) > 1:
            start = self.ctx.random.randrange(len(queues))
            queues = queues[start:] + queues[:start]

        def op(w: OpWrites) -> ReceiveResult:
            w.sync = False  # a lost receive only means an earlier redelivery
            now = self.ctx.clock()
            out: list[Delivery] = []
            next_deadline: int | None = None
            for q in queues:
                cursor = self.cursor(w, group, topic, q)
                held = False
                if len(out) < max_messages:
                    held = self._redeliver(w, group, topic, q, cursor, now, invisible_ms, max_messages, out)
                deliver = self._deliver_fifo if topic in self.queues.fifo_topics else self._deliver_new
                if len(out) < max_messages and deliver(w, group, topic, q, cursor, now, invisible_ms,
                                                       tags, max_messages, out):
                    next_deadline = now  # more to scan: the long poll comes back at once
                d = cursor.next_deadline_ms()
                if held and d is not None and d <= now:
                    d = None  # redeliveries held back behind a read cap: nothing to wake for
                if d is not None and (next_deadline is None or d < next_deadline):
                    next_deadline = d
            return ReceiveResult(out, next_deadline)
        return op

    def cursor(self, w: OpWrites, group: str, topic: str, q: int) -> Cursor:
        """The group's cursor in one queue, created (at the oldest retained entry) when the
        group first reads it. A group deleted before (``groupdelete.py``) starts so too, its
        deliveries in flight then revoked: their offsets' next deliveries count on from them."""
        cursor = self.consumers.get(group, topic, q)
        if cursor is None:
            start = self.queues.first_offset(topic, q)
            cursor = Cursor(start)
            key = codec.revoked_key(group, topic, q)
            value = self.ctx.db.get("meta", key)
            if value is not None:
                w.delete("meta", key)
                for offset, attempt in codec.decode_revoked(value, key).items():
                    if offset >= start:  # below: gone to retention, never delivered again
                        cursor.revoked[offset] = attempt
                        w.put("inflight", codec.inflight_key(group, topic, q, offset),
                              codec.encode_inflight(attempt, codec.REVOKED_DEADLINE))
            self.consumers.add(group, topic, q, cursor)
            w.put("consumers", codec.consumer_key(group, topic, q), codec.encode_u64(start))
        return cursor

    def _redeliver(self, w: OpWrites, group: str, topic: str, q: int, cursor: Cursor, now: int,
                   invisible_ms: int, limit: int, out: list[Delivery]) -> bool:
        """Redelivers the queue's deliveries whose invisibility ended; returns whether some
        were held back (at or past the queue's readable end: ``Queues.readable_end``)."""
        expired = cursor.pop_expired(now)
        readable = self.queues.readable_end(topic, q)
        held = [(o, e) for o, e in expired if o >= readable]
        expired = [(o, e) for o, e in expired if o < readable]
        for offset, entry in held:
            cursor.push_back(offset, entry)
        for i, (offset, entry) in enumerate(expired):
            if len(out) >= limit:
                for rest_offset, rest in expired[i:]:
                    cursor.push_back(rest_offset, rest)
                return bool(held)
            key = codec.inflight_key(group, topic, q, offset)
            value = self.ctx.db.get("cq", codec.cq_key(topic, q, offset))
            if value is None:  # expired by retention: nothing left to deliver
                self._end_delivery(w, group, topic, q, cursor, offset)
                continue
            cq = codec.decode_cq_entry(value)
            if entry.attempt >= self.ctx.config.max_delivery_attempts:
                self._to_dlq(w, group, cq)
                self._end_delivery(w, group, topic, q, cursor, offset)
                continue
            attempt, epoch = entry.attempt + 1, self.leader_epoch
            cursor.track(offset, attempt, now + invisible_ms, epoch)
            w.put("inflight", key, codec.encode_inflight(attempt, now + invisible_ms, epoch))
            out.append(Delivery(topic, q, offset, cq.log_seq, attempt, now + invisible_ms, cq.visible_ms,
                                self.ctx.receipt(topic, q, offset, attempt, epoch, group=group)))
        return bool(held)

    def _to_dlq(self, w: OpWrites, group: str, cq: CqEntry) -> int:
        """Stages the entry into %DLQ%<group>; returns its offset there."""
        topic = dlq_topic(group)
        self.queues.ensure_topic(w, topic, 1)
        offset = self.queues.append(w, topic, 0, CqEntry(cq.log_seq, self.ctx.clock(), cq.tag))
        w.on_durable(lambda: self.ctx.listeners.notify_visible(topic))
        return offset

    def _deliver_new(self, w: OpWrites, group: str, topic: str, q: int, cursor: Cursor, now: int,
                     invisible_ms: int, tags: MessageFilter, limit: int,
                     out: list[Delivery]) -> bool:
        """Delivers new messages of one queue (up to its readable end); returns whether it
        stopped at MAX_FILTERED_SCAN filtered-out entries with more left to scan."""
        end = self.queues.readable_end(topic, q)
        start = cursor.next_offset
        if start >= end:
            return False
        offset = start
        skipped = 0
        truncated = False
        for key, value in self.ctx.db.scan("cq", codec.cq_key(topic, q, start), codec.cq_key(topic, q, end)):
            if len(out) >= limit:
                break
            if skipped >= MAX_FILTERED_SCAN:
                truncated = True
                break
            o = codec.split_cq_key(key)[2]
            cq = codec.decode_cq_entry(value, key)
            offset = o + 1
            if tags is not None and not self._passes(tags, cq):
                skipped += 1
                continue  # filtered out: never delivered to this group
            deadline, epoch, attempt = now + invisible_ms, self.leader_epoch, cursor.first_attempt(o)
            cursor.track(o, attempt, deadline, epoch)
            w.put("inflight", codec.inflight_key(group, topic, q, o), codec.encode_inflight(attempt, deadline, epoch))
            out.append(Delivery(topic, q, o, cq.log_seq, attempt, deadline, cq.visible_ms,
                                self.ctx.receipt(topic, q, o, attempt, epoch, group=group)))
        if offset != start:
            cursor.next_offset = offset
            w.put("consumers", codec.consumer_key(group, topic, q), codec.encode_u64(offset))
        return truncated

    def _deliver_fifo(self, w: OpWrites, group: str, topic: str, q: int, cursor: Cursor, now: int,
                      invisible_ms: int, tags: MessageFilter, limit: int, out: list[Delivery]) -> bool:
        """Delivers new messages of one queue of a FIFO topic: at most one delivery in flight
        per message group, each group in queue order. A message whose group has one in flight
        is passed over and kept in ``cursor.ahead`` (at most MAX_FILTERED_SCAN of them), so
        the next receive offers it again without reading the queue; the cursor stays before
        the first one. Returns whether it stopped at MAX_FILTERED_SCAN entries with
        filtered-out ones among them (a window of messages held back only because their
        groups wait is not rescanned until an ack frees one). Reads up to the queue's
        readable end."""
        end = self.queues.readable_end(topic, q)
        start = cursor.next_offset
        if start >= end:
            return False
        blocked = self._inflight_groups(topic, q, cursor)
        ahead = cursor.ahead
        if cursor.scanned_to < start:
            ahead.clear()
            cursor.scanned_to = start

        def deliver(o: int, cq: CqEntry) -> None:
            blocked.add(cq.group_hash)
            deadline, epoch, attempt = now + invisible_ms, self.leader_epoch, cursor.first_attempt(o)
            cursor.track(o, attempt, deadline, epoch)
            cursor.group_of[o] = cq.group_hash
            w.put("inflight", codec.inflight_key(group, topic, q, o), codec.encode_inflight(attempt, deadline, epoch))
            out.append(Delivery(topic, q, o, cq.log_seq, attempt, deadline, cq.visible_ms,
                                self.ctx.receipt(topic, q, o, attempt, epoch, group=group)))

        filtered = 0
        for o in sorted(ahead):  # held back before: their groups may be free now
            if len(out) >= limit:
                break
            cq = ahead[o]
            if cq.group_hash in blocked or o >= end:
                continue  # its group waits, or it lies past a read cap set since it was scanned
            del ahead[o]
            if tags is not None and not self._passes(tags, cq):
                continue  # the group's filter changed meanwhile
            deliver(o, cq)
        scanned = 0
        if len(out) < limit and cursor.scanned_to < end and len(ahead) < MAX_FILTERED_SCAN:
            for key, value in self.ctx.db.scan("cq", codec.cq_key(topic, q, cursor.scanned_to),
                                           codec.cq_key(topic, q, end)):
                if len(out) >= limit or scanned >= MAX_FILTERED_SCAN or len(ahead) >= MAX_FILTERED_SCAN:
                    break
                scanned += 1
                o = codec.split_cq_key(key)[2]
                cursor.scanned_to = o + 1
                if o in cursor.inflight or o in cursor.settled:
                    continue
                cq = codec.decode_cq_entry(value, key)
                if tags is not None and not self._passes(tags, cq):
                    filtered += 1
                    continue  # filtered out: never delivered to this group, blocks no group
                if cq.group_hash in blocked:
                    ahead[o] = cq  # waits for its group's delivery in flight
                    continue
                deliver(o, cq)
        frontier = min(ahead) if ahead else cursor.scanned_to
        if frontier > start:
            for o in [o for o in cursor.settled if o < frontier]:
                cursor.settled.discard(o)
                w.delete("inflight", codec.inflight_key(group, topic, q, o))
            cursor.next_offset = frontier
            w.put("consumers", codec.consumer_key(group, topic, q), codec.encode_u64(frontier))
        return scanned >= MAX_FILTERED_SCAN and filtered > 0

    def _inflight_groups(self, topic: str, q: int, cursor: Cursor) -> set[int]:
        """The message groups (hashes) with a delivery in flight in one queue of a FIFO topic."""
        groups = set()
        for offset in cursor.inflight:
            g = cursor.group_of.get(offset)
            if g is None:
                value = self.ctx.db.get("cq", codec.cq_key(topic, q, offset))
                g = cursor.group_of[offset] = codec.decode_cq_entry(value).group_hash if value else 0
            groups.add(g)
        return groups

    def _passes(self, tags: frozenset[str] | SqlFilter, cq: CqEntry) -> bool:
        """Whether a queue entry passes a tag or SQL92 filter (a SQL92 filter reads the
        message's properties from the log; a record gone to retention passes, and the
        delivery then finds it gone)."""
        if not isinstance(tags, SqlFilter):
            return cq.tag in tags
        value = self.ctx.db.get("log", codec.log_key(cq.log_seq))
        if value is None:
            return True
        r = codec.decode_log_record(value, codec.log_key(cq.log_seq))
        return tags.matches(message_properties(r.tag, r.keys, r.properties))

    def _inflight(self, group: str, handle: ReceiptHandle) -> tuple[Cursor, Inflight] | None:
        """The group's in-flight delivery a receipt handle names, while it is that delivery
        (not acknowledged, dead-lettered or redelivered since)."""
        cursor = self.consumers.get(group, handle.topic, handle.queue_id)
        entry = cursor.inflight.get(handle.offset) if cursor else None
        if cursor is None or entry is None or entry.attempt != handle.attempt or entry.epoch != handle.epoch:
            return None
        return cursor, entry

    def _settle(self, w: OpWrites, group: str, handle: ReceiptHandle, cursor: Cursor) -> None:
        """Ends an in-flight delivery (acknowledged or dead-lettered)."""
        self._end_delivery(w, group, handle.topic, handle.queue_id, cursor, handle.offset)

    def _end_delivery(self, w: OpWrites, group: str, topic: str, q: int, cursor: Cursor, offset: int) -> None:
        """Ends an in-flight delivery (acknowledged, dead-lettered or gone to retention). On a
        FIFO topic one past the cursor is remembered as settled, and the message's group may
        go on: long polls wake."""
        del cursor.inflight[offset]
        key = codec.inflight_key(group, topic, q, offset)
        if offset >= cursor.next_offset:
            cursor.settled.add(offset)
            w.put("inflight", key, codec.encode_inflight(*codec.SETTLED_PAST_CURSOR))
        else:
            w.delete("inflight", key)
        cursor.group_of.pop(offset, None)
        if topic in self.queues.fifo_topics:
            w.on_durable(lambda: self.ctx.listeners.notify_visible(topic))

    def _parse_receipt_for(self, group: str, topic: str, text: str) -> ReceiptHandle:
        handle = self.ctx.parse_receipt(text, group)
        if topic and handle.topic != topic:
            raise InvalidFieldError("topic", f"receipt handle is for topic {handle.topic!r}")
        return handle

    def ack_op(self, group: str, topic: str, handles: list[str],
               ) -> Callable[[OpWrites], list[Exception | None]]:
        validate_group("consumer_group", group)
        parsed: list[ReceiptHandle | Exception] = []
        for text in handles:
            try:
                parsed.append(self._parse_receipt_for(group, topic, text))
            except Exception as exc:  # noqa: BLE001 - reported per entry
                parsed.append(exc)

        def op(w: OpWrites) -> list[Exception | None]:
            w.sync = False  # a lost ack only means a redelivery (at least once)
            results: list[Exception | None] = []
            for text, handle in zip(handles, parsed):
                if isinstance(handle, Exception):
                    results.append(handle)
                    continue
                found = self._inflight(group, handle)
                if found is None:
                    results.append(ReceiptHandleNotFoundError(text))
                    continue
                self._settle(w, group, handle, found[0])
                results.append(None)
            return results
        return op

    def change_invisible_op(self, group: str, topic: str, handle_text: str, seconds: float,
                            ) -> Callable[[OpWrites], tuple[str, int]]:
        validate_group("consumer_group", group)
        handle = self._parse_receipt_for(group, topic, handle_text)
        cfg = self.ctx.config
        if not 0 <= seconds <= cfg.max_invisible_duration_seconds:
            raise InvalidFieldError("invisible_duration_seconds",
                                    f"{seconds} is outside 0..max_invisible_duration_seconds="
                                    f"{cfg.max_invisible_duration_seconds}")
        delay_ms = int(max(seconds, cfg.min_invisible_duration_seconds) * 1000)

        def op(w: OpWrites) -> tuple[str, int]:
            w.sync = False
            found = self._inflight(group, handle)
            if found is None:
                raise ReceiptHandleNotFoundError(handle_text)
            cursor, entry = found
            deadline = self.ctx.clock() + delay_ms
            cursor.track(handle.offset, entry.attempt, deadline, entry.epoch)  # the same delivery, still
            w.put("inflight", codec.inflight_key(group, handle.topic, handle.queue_id, handle.offset),
                  codec.encode_inflight(entry.attempt, deadline, entry.epoch))
            topic_ = handle.topic
            w.on_durable(lambda: self.ctx.listeners.notify_visible(topic_))
            return self.ctx.receipt(handle.topic, handle.queue_id, handle.offset, entry.attempt, entry.epoch,
                                    group=group), deadline
        return op

    def dead_letter_op(self, group: str, topic: str, handle_text: str) -> Callable[[OpWrites], tuple[str, int]]:
        """Moves one in-flight delivery to %DLQ%<group> now (the consumer gave up on it)."""
        validate_group("consumer_group", group)
        handle = self._parse_receipt_for(group, topic, handle_text)

        def op(w: OpWrites) -> tuple[str, int]:
            found = self._inflight(group, handle)
            if found is None:
                raise ReceiptHandleNotFoundError(handle_text)
            value = self.ctx.db.get("cq", codec.cq_key(handle.topic, handle.queue_id, handle.offset))
            if value is None:
                raise ReceiptHandleNotFoundError(handle_text)  # expired by retention
            offset = self._to_dlq(w, group, codec.decode_cq_entry(value))
            self._settle(w, group, handle, found[0])
            return dlq_topic(group), offset
        return op
