"""Queries of committed state: a transaction, transactions by group and state, the
counters' recount, the last transaction id (a commit-log record is ``BrokerContext.read_message``).

They read the store directly and stage nothing, so they may run on any thread; what they
see is committed (the service waits for it to be durable before it answers).
"""

from __future__ import annotations

from typing import Iterable

from txmq.errors import InvalidFieldError, TransactionNotFoundError
from txmq.names import namespace_of, validate_name, validate_namespace

from .base import BrokerContext
from .model import MAX_KEY_BYTES, STATE_DISCARDED, STATE_PREPARED
from .store import codec
from .store.codec import TxnRow
from .transactions import Transactions


class Queries:
    def __init__(self, ctx: BrokerContext, transactions: Transactions) -> None:
        self.ctx = ctx
        self.transactions = transactions

    def get_txn(self, transaction_id: str) -> TxnRow:
        row = self.ctx.read_txn(self.ctx.parse_txn_id(transaction_id))
        if row is None:
            raise TransactionNotFoundError(transaction_id)
        return row

    def query_txns(self, group: str, state: int, older_than_seconds: float, limit: int,
                   page_token: str, *, namespace: str = "", key: str = "") -> tuple[list[TxnRow], str]:
        """Transactions (of ``group``, in ``state``: either may be empty/0 for any),
        prepared more than ``older_than_seconds`` ago when that is positive, of a producer
        group in ``namespace`` and whose message carries ``key`` when those are set; up to
        ``limit`` of them and the page token to continue from ('' at the end). The filters
        apply before the limit, so a page is never short because another namespace's
        transactions took its places."""
        if group:
            validate_name("producer_group", group)
        if namespace:
            validate_namespace(namespace)
        if len(key.encode()) > MAX_KEY_BYTES:
            raise InvalidFieldError("key", f"at most {MAX_KEY_BYTES} bytes (no stored key is longer), "
                                           f"got {len(key.encode())}")
        limit = min(limit if limit > 0 else 100, 10_000)
        ctx = self.ctx
        now = ctx.clock()
        max_prepared = now - int(older_than_seconds * 1000) if older_than_seconds > 0 else None
        rows: list[TxnRow] = []
        after = ctx.parse_txn_id(page_token, cursor=True) if page_token else 0
        if group and state == STATE_PREPARED:
            upper = codec.group_time_key(group, (max_prepared if max_prepared is not None else now) + 1, 0)
            start = codec.group_time_key(group, self.transactions.pending_floor(group), 0)
            source: Iterable[int] = (codec.split_group_time_key(k)[2]
                                     for k, _ in ctx.db.scan("pending", start, upper))
        else:
            source = (codec.log_seq(k) for k, _ in ctx.db.scan("txn", codec.txn_key(after + 1)))
        for seq in source:
            if seq <= after and not (group and state == STATE_PREPARED):
                continue
            row = ctx.read_txn(seq)
            if row is None:
                continue
            if group and row.producer_group != group:
                continue
            if state and row.state != state:
                continue
            if max_prepared is not None and row.prepared_ms > max_prepared:
                continue
            if namespace and namespace_of(row.producer_group) != namespace:
                continue
            if key and not self._carries(seq, key):
                continue
            if group and state == STATE_PREPARED and seq <= after:
                continue
            rows.append(row)
            if len(rows) >= limit:
                return rows, ctx.txn_id(seq)
        return rows, ""

    def _carries(self, seq: int, key: str) -> bool:
        record = self.ctx.read_message(seq)
        return record is not None and key in record.keys

    def recount(self) -> dict[str, tuple[int, int]]:
        """(pending, discarded) per group from the transaction table: what the counters
        must equal."""
        out: dict[str, list[int]] = {}
        for key, value in self.ctx.db.scan("txn"):
            row = codec.decode_txn(value, key)
            counts = out.setdefault(row.producer_group, [0, 0])
            if row.state == STATE_PREPARED:
                counts[0] += 1
            elif row.state == STATE_DISCARDED:
                counts[1] += 1
        return {g: (c[0], c[1]) for g, c in out.items()}

    def last_txn_id(self) -> str:
        key = self.ctx.db.last_key("txn")
        return self.ctx.txn_id(codec.log_seq(key)) if key else ""
