"""``txmq txn global G`` and ``txmq txn list-global``: multi-message (global) transactions
as the brokers hold them. The CLI asks every live broker (BrokerService, admin-read
rights) and joins the answers: G's row on its coordinator, the participants still to be
told its decision, and every part on each shard with its state (decided ones too, while
their rows are retained). ``txmq txn resolve G`` (the
existing command) decides a global transaction as a whole; a part refuses a decision of
its own.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import grpc

from ._errors import TxmqError, error_from_rpc
from ._ids import TransactionId
from ._tables import table
from .v1 import broker_pb2, broker_pb2_grpc

Output = Callable[[Any, Callable[[], str]], None]
#: Part states still waiting for G's decision (``transaction_dict`` names).
_UNDECIDED = ("pending", "discarded")


def _brokers(admin: Any) -> list[tuple[str, str]]:
    return sorted((b.name, b.address) for b in admin.list_brokers(include_followers=False).brokers)


def _ask(admin: Any, address: str, method: str, request: Any) -> Any:
    channel = admin.channel_to(address)
    try:
        return getattr(broker_pb2_grpc.BrokerServiceStub(channel), method)(
            request, timeout=admin.request_timeout_seconds)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
    finally:
        channel.close()


def _global_describe(admin: Any, args: argparse.Namespace, out: Output, transaction_dict: Any) -> None:
    gid = args.global_transaction_id
    coordinator = TransactionId.decode(gid).broker
    data: dict[str, Any] = {"global_transaction_id": gid, "coordinator_shard": coordinator, "coordinator": None,
                            "participants": [], "participants_pending": [], "parts": [], "open_parts": [],
                            "unreachable_brokers": []}
    for name, address in _brokers(admin):
        try:
            found = _ask(admin, address, "GetGlobalTransaction",
                         broker_pb2.GetGlobalTransactionRequest(global_transaction_id=gid))
        except TxmqError as err:
            if not err.retryable:
                raise  # a malformed id, or G unknown to its coordinator
            data["unreachable_brokers"].append(name)
            continue
        if found.HasField("transaction"):
            data["coordinator"] = transaction_dict(found.transaction)
            data["participants"] = list(found.participants)
            data["participants_pending"] = list(found.participants_pending)
        data["parts"] += [transaction_dict(p) for p in found.parts]
    data["open_parts"] = [p for p in data["parts"] if p["state"] in _UNDECIDED]

    def text() -> str:
        c = data["coordinator"]
        lines = [f"global transaction {gid}", f"coordinator  {coordinator}: "
                 + (f"{c['state']} ({c['resolution_source'] or 'undecided'})" if c else "unknown")]
        if data["participants_pending"]:
            lines.append(f"to be told   {', '.join(data['participants_pending'])}")
        for p in data["parts"]:
            lines.append(f"part         {p['transaction_id']} on {p['broker']} ({p['topic']}): {p['state']}"
                         + (f" ({p['resolution_source']})" if p["resolution_source"] else ""))
        if data["unreachable_brokers"]:
            lines.append(f"unreachable  {', '.join(data['unreachable_brokers'])} (parts there not shown)")
        return "\n".join(lines)
    out(data, text)


def _global_list(admin: Any, args: argparse.Namespace, out: Output) -> None:
    joined: dict[str, dict[str, Any]] = {}
    unreachable = []
    for name, address in _brokers(admin):
        try:
            found = _ask(admin, address, "ListGlobalTransactions",
                         broker_pb2.ListGlobalTransactionsRequest(limit=args.limit))
        except TxmqError as err:
            if not err.retryable:
                raise
            unreachable.append(name)
            continue
        for g in found.transactions:
            row = joined.setdefault(g.global_transaction_id, {
                "global_transaction_id": g.global_transaction_id,
                "coordinator_shard": TransactionId.decode(g.global_transaction_id).broker,
                "open_parts": {}, "participants_pending": []})
            if g.open_parts:
                row["open_parts"][name] = g.open_parts
            if g.coordinator:
                row["participants_pending"] = list(g.participants_pending)
    rows = sorted(joined.values(), key=lambda r: r["global_transaction_id"])

    def text() -> str:
        body = table(["GLOBAL TRANSACTION", "COORDINATOR", "OPEN PARTS", "TO BE TOLD"],
                     [[r["global_transaction_id"], r["coordinator_shard"],
                       ", ".join(f"{b}:{n}" for b, n in sorted(r["open_parts"].items())),
                       ", ".join(r["participants_pending"])] for r in rows])
        body += f"\n{len(rows)} global transaction(s) undecided or being applied"
        if unreachable:
            body += f"; unreachable brokers (list incomplete): {', '.join(unreachable)}"
        return body
    out(rows, text)


def add_global_commands(txn: Any, common: argparse.ArgumentParser, transaction_dict: Any) -> None:
    """Adds ``global`` and ``list-global`` to the ``txmq txn`` subcommands."""
    p = txn.add_parser("global", parents=[common], help="one multi-message transaction: its coordinator's "
                                                         "state, participants not yet told, every part "
                                                         "with its state")
    p.add_argument("global_transaction_id")
    p.set_defaults(run=lambda admin, args, out: _global_describe(admin, args, out, transaction_dict))
    p = txn.add_parser("list-global", parents=[common], help="multi-message transactions undecided or whose "
                                                              "decision is still being applied")
    p.add_argument("--limit", type=int, default=100, help="most per broker (default 100)")
    p.set_defaults(run=_global_list)
