"""Test-only anomaly injection into a STOPPED broker's store (opened directly through
BrokerCore): states the broker never produces itself, for the audit to find."""

from __future__ import annotations

from dataclasses import dataclass

from services.broker.config import BrokerConfig
from services.broker.core import BrokerCore
from services.broker.store import codec
from txmq.ids import MessageId


@dataclass(frozen=True)
class Injected:
    #: A COMMITTED transaction row whose message is in no topic.
    missing_transaction_id: str
    missing_message_id: str
    #: A committed message given a second offset in its queue (same message id twice).
    duplicate_message_id: str
    duplicate_transaction_id: str
    #: A PREPARED transaction whose half message was entered into its queue (visible,
    #: not committed); None unless ``expose`` named one.
    exposed_transaction_id: str | None = None


def inject(data_dir: str, broker_name: str, *, topic: str, group: str, queue_id: int = 0,
           expose: str | None = None) -> Injected:
    """The anomalies above into ``broker_name``'s stopped store; with ``expose`` (the id of
    a PREPARED transaction of ``topic`` on this broker) also its half message into its queue."""
    core = BrokerCore(BrokerConfig(data_dir=data_dir, broker_name=broker_name, flush="sync", wal_prefill_bytes=0))
    try:
        now = core.clock()
        # 1. A committed row with no log record and no queue entry. Its sequence is kept
        #    from reuse by raising the store's sequence floor in the same batch.
        seq = core.next_seq
        message_id = MessageId.new(broker_name, queue_id).encode()
        row = codec.TxnRow(seq=seq, state=codec.STATE_COMMITTED, producer_group=group,
                           producer_client_id="injected", topic=topic, queue_id=queue_id,
                           message_id=message_id, prepared_ms=now - 2000, next_due_ms=0, body_size=3,
                           source=codec.SOURCE_CLIENT, ended_ms=now - 1000, queue_offset=10_000_000)
        core.db.call(lambda w: (w.put("txn", codec.txn_key(seq), codec.encode_txn(row)),
                                w.put("meta", b"seq_floor", codec.encode_u64(seq + 1))))
        # 2. The first committed transactional message of the queue, entered a second time.
        first = next(iter(core.db.scan("cq", codec.queue_prefix(topic, queue_id))), None)
        assert first is not None, f"no message in {topic}/{queue_id} to duplicate"
        key, value = first
        entry = codec.decode_cq_entry(value, key)
        record = core.read_message(entry.log_seq)
        assert record is not None and record.kind == codec.KIND_HALF
        offset = core.queue_next[(topic, queue_id)]
        core.db.call(lambda w: w.put("cq", codec.cq_key(topic, queue_id, offset), value))
        # 3. A PREPARED transaction's half message entered into its queue.
        if expose is not None:
            half = core.parse_txn_id(expose)
            row = core._read_txn(half)
            assert row is not None and row.state == codec.STATE_PREPARED and row.topic == topic, row
            at = offset + 1 if row.queue_id == queue_id else core.queue_next[(topic, row.queue_id)]
            exposed = codec.encode_cq_entry(codec.CqEntry(half, now, ""))
            core.db.call(lambda w: w.put("cq", codec.cq_key(topic, row.queue_id, at), exposed))
        return Injected(core.txn_id(seq), message_id, record.message_id, core.txn_id(entry.log_seq), expose)
    finally:
        core.close()
