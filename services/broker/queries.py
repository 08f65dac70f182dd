"""Queries of committed state: a transaction, transactions by group and state, the
oldest pending transaction of a group, the counters' recount, a commit-log record.

They read the store directly and stage nothing, so they may run on any thread; what they
see is committed (the service waits for it to be durable before it answers).
"""

from __future__ import annotations

from typing import Iterable

from txmq.errors import TransactionNotFoundError
from txmq.names import validate_name

from .base import BrokerBase
from .model import STATE_DISCARDED, STATE_PREPARED
from .store import codec
from .store.codec import LogRecord, TxnRow


class QueriesPart(BrokerBase):
    def get_txn(self, transaction_id: str) -> TxnRow:
        seq = self.parse_txn_id(transaction_id)
        row = self._read_txn(seq)
        if row is None:
            raise TransactionNotFoundError(transaction_id)
        return row

    def query_txns(self, group: str, state: int, older_than_seconds: float, limit: int,
                   page_token: str) -> tuple[list[TxnRow], str]:
        """Transactions (of ``group``, in ``state``: either may be empty/0 for any),
        prepared more than ``older_than_seconds`` ago when that is positive; up to
        ``limit`` of them and the page token to continue from ('' at the end)."""
        if group:
            validate_name("producer_group", group)
        limit = min(limit if limit > 0 else 100, 10_000)
        now = self.clock()
        max_prepared = now - int(older_than_seconds * 1000) if older_than_seconds > 0 else None
        rows: list[TxnRow] = []
        after = self.parse_txn_id(page_token, cursor=True) if page_token else 0
        if group and state == STATE_PREPARED:
            upper = codec.group_time_key(group, (max_prepared if max_prepared is not None else now) + 1, 0)
            start = codec.group_time_key(group, self._pending_floor.get(group, 0), 0)
            source: Iterable[int] = (codec.split_group_time_key(k)[2]
                                     for k, _ in self.db.scan("pending", start, upper))
        else:
            source = (codec.log_seq(k) for k, _ in self.db.scan("txn", codec.txn_key(after + 1)))
        for seq in source:
            if seq <= after and not (group and state == STATE_PREPARED):
                continue
            row = self._read_txn(seq)
            if row is None:
                continue
            if group and row.producer_group != group:
                continue
            if state and row.state != state:
                continue
            if max_prepared is not None and row.prepared_ms > max_prepared:
                continue
            if group and state == STATE_PREPARED and seq <= after:
                continue
            rows.append(row)
            if len(rows) >= limit:
                return rows, self.txn_id(seq)
        return rows, ""

    def oldest_pending_ms(self, group: str) -> int | None:
        found = self._first_time("pending", group, self._pending_floor.get(group, 0))
        if found is not None:
            self._pending_floor[group] = found  # nothing older remains: start there next time
        return found

    def recount(self) -> dict[str, tuple[int, int]]:
        """(pending, discarded) per group from the transaction table: what the counters
        must equal."""
        out: dict[str, list[int]] = {}
        for key, value in self.db.scan("txn"):
            row = codec.decode_txn(value, key)
            counts = out.setdefault(row.producer_group, [0, 0])
            if row.state == STATE_PREPARED:
                counts[0] += 1
            elif row.state == STATE_DISCARDED:
                counts[1] += 1
        return {g: (c[0], c[1]) for g, c in out.items()}

    def last_txn_id(self) -> str:
        key = self.db.last_key("txn")
        return self.txn_id(codec.log_seq(key)) if key else ""

    def read_message(self, seq: int) -> LogRecord | None:
        value = self.db.get("log", codec.log_key(seq))
        return codec.decode_log_record(value, codec.log_key(seq)) if value is not None else None
