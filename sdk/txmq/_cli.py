"""``txmq``: the operator's command line. It speaks the name server's AdminService (and
NameServerService for listings), so it needs only the name server address.

    txmq [--nameserver HOST:PORT[,...]] [--json] COMMAND

    txmq txn list [--group G] [--state pending|discarded|committed|rolled-back]
                  [--older-than 60s] [--limit N]
    txmq txn describe ID
    txmq txn resolve ID --commit|--rollback [--operator NAME] --reason TEXT
    txmq topic list
    txmq topic create NAME [--queues N]
    txmq topic expand TOPIC --broker SHARD [--queues N]
    txmq broker list
    txmq broker elect SHARD --replica R
    txmq broker backup SHARD --to DIR
    txmq broker restore --from DIR --data-dir PATH [--replace]
    txmq broker drain SHARD [--wait 5m] [--status | --undo]
    txmq checker list

``--nameserver`` defaults to ``$TXMQ_NAMESERVER``, else 127.0.0.1:9876; with several
addresses the next is tried when one is unavailable. Output is a table, or JSON with
``--json``. Exit status: 0 done, 1 the request failed (the error on stderr), 2 bad usage.
Durations are ``500ms``, ``60s``, ``5m``, ``1h``, ``2d`` or plain seconds.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import getpass
import json
import math
import os
import re
import sys
import time
from typing import Any, Callable, Sequence, TextIO

import grpc

from ._errors import TxmqError, error_from_rpc
from ._ops_cli import add_broker_commands, add_topic_commands
from .v1 import admin_pb2, admin_pb2_grpc, common_pb2, nameserver_pb2, nameserver_pb2_grpc

DEFAULT_NAMESERVER = "127.0.0.1:9876"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")

STATES = {
    "pending": common_pb2.TRANSACTION_STATE_PREPARED,
    "prepared": common_pb2.TRANSACTION_STATE_PREPARED,
    "discarded": common_pb2.TRANSACTION_STATE_DISCARDED,
    "committed": common_pb2.TRANSACTION_STATE_COMMITTED,
    "rolled-back": common_pb2.TRANSACTION_STATE_ROLLED_BACK,
}
_STATE_NAMES = {
    common_pb2.TRANSACTION_STATE_PREPARED: "pending",
    common_pb2.TRANSACTION_STATE_COMMITTED: "committed",
    common_pb2.TRANSACTION_STATE_ROLLED_BACK: "rolled-back",
    common_pb2.TRANSACTION_STATE_DISCARDED: "discarded",
}
_SOURCE_NAMES = {
    common_pb2.TRANSACTION_SOURCE_CLIENT: "client",
    common_pb2.TRANSACTION_SOURCE_CHECK: "check",
    common_pb2.TRANSACTION_SOURCE_OPERATOR: "operator",
    common_pb2.TRANSACTION_SOURCE_BROKER: "broker",
}


# --- durations and times ------------------------------------------------------------------

def parse_duration(text: str) -> float:
    """``"90s"`` → 90.0, ``"5m"`` → 300.0, ``"1.5h"``, ``"250ms"``, ``"2d"``, ``"42"`` (seconds)."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a duration (e.g. 500ms, 60s, 5m, 1h, 2d, or seconds)")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite duration")
    return value


def format_duration(seconds: float) -> str:
    """A short readable duration: ``850ms``, ``42s``, ``5m03s``, ``2h05m``, ``3d04h``."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s".replace(".0s", "s") if seconds < 10 else f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _iso(ms: int) -> str:
    if not ms:
        return ""
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc).isoformat(timespec="milliseconds")


def _now_ms() -> int:
    return int(_dt.datetime.now(tz=_dt.timezone.utc).timestamp() * 1000)


# --- rows ------------------------------------------------------------------------------------

def transaction_dict(t: common_pb2.Transaction, now_ms: int | None = None) -> dict[str, Any]:
    now_ms = _now_ms() if now_ms is None else now_ms
    return {
        "transaction_id": t.transaction_id,
        "state": _STATE_NAMES.get(t.state, "unknown"),
        "producer_group": t.producer_group,
        "topic": t.topic,
        "queue_id": t.queue_id,
        "broker": t.broker_name,
        "message_id": t.message_id,
        "producer_client_id": t.producer_client_id,
        "prepared_at": _iso(t.prepared_at_ms),
        "age_seconds": max(now_ms - t.prepared_at_ms, 0) / 1000 if t.prepared_at_ms else None,
        "ended_at": _iso(t.ended_at_ms),
        "resolution_source": _SOURCE_NAMES.get(t.resolution_source, ""),
        "checks_delivered": t.checks_delivered,
        "checks_answered": t.checks_answered,
        "next_check_at": _iso(t.next_check_at_ms),
        "discarded_at": _iso(t.discarded_at_ms),
        "discard_reason": t.discard_reason,
        "operator": t.operator,
        "reason": t.reason,
        "queue_offset": t.queue_offset,
        "body_size_bytes": t.body_size_bytes,
    }


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


# --- the name server connection ----------------------------------------------------------

class Admin:
    """Calls on the first name server that answers (the next on UNAVAILABLE)."""

    def __init__(self, nameservers: str, timeout: float) -> None:
        self.addresses = [a.strip() for a in nameservers.replace(";", ",").split(",") if a.strip()]
        if not self.addresses:
            raise TxmqError("no name server address given")
        self.timeout = timeout
        self._channels: dict[str, grpc.Channel] = {}

    def call(self, service: str, method: str, request: Any) -> Any:
        error: TxmqError | None = None
        for address in self.addresses:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = grpc.insecure_channel(address)
            stub: Any = (admin_pb2_grpc.AdminServiceStub(channel) if service == "admin"
                         else nameserver_pb2_grpc.NameServerServiceStub(channel))
            try:
                return getattr(stub, method)(request, timeout=self.timeout)
            except grpc.RpcError as exc:
                error = error_from_rpc(exc)
                if not error.retryable:
                    raise error from None
        assert error is not None
        raise error

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


# --- commands --------------------------------------------------------------------------------

Output = Callable[[Any, Callable[[], str]], None]


def _txn_list(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "ListTransactions", admin_pb2.ListTransactionsRequest(
        producer_group=args.group or "", state=STATES[args.state] if args.state else 0,
        older_than_seconds=args.older_than or 0.0, limit=args.limit))
    now = _now_ms()
    rows = [transaction_dict(t, now) for t in response.transactions]
    data = {"transactions": rows, "unreachable_brokers": list(response.unreachable_brokers)}

    def table() -> str:
        text = format_table(
            ["TRANSACTION", "STATE", "GROUP", "TOPIC", "AGE", "CHECKS", "NEXT CHECK", "REASON"],
            [[r["transaction_id"], r["state"], r["producer_group"], r["topic"],
              format_duration(r["age_seconds"] or 0), f"{r['checks_delivered']}/{r['checks_answered']}",
              r["next_check_at"][11:23] if r["next_check_at"] else "",
              r["discard_reason"] or r["reason"]] for r in rows])
        text += f"\n{len(rows)} transaction(s)"
        if response.unreachable_brokers:
            text += f"; unreachable brokers (list incomplete): {', '.join(response.unreachable_brokers)}"
        return text
    out(data, table)


def _describe_text(row: dict[str, Any]) -> str:
    width = max(len(k) for k in row)
    lines = []
    for key, value in row.items():
        if key == "age_seconds" and value is not None:
            value = f"{format_duration(value)} ({value:.3f}s)"
        lines.append(f"{key.ljust(width)}  {'' if value is None else value}")
    return "\n".join(lines)


def _txn_describe(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "DescribeTransaction",
                          admin_pb2.DescribeTransactionRequest(transaction_id=args.transaction_id))
    row = transaction_dict(response.transaction)
    out(row, lambda: _describe_text(row))


def _txn_resolve(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    resolution = (common_pb2.TRANSACTION_RESOLUTION_COMMIT if args.commit
                  else common_pb2.TRANSACTION_RESOLUTION_ROLLBACK)
    response = admin.call("admin", "ResolveTransaction", admin_pb2.ResolveTransactionRequest(
        transaction_id=args.transaction_id, resolution=resolution, operator=args.operator,
        reason=args.reason))
    row = transaction_dict(response.transaction)
    out(row, lambda: f"{row['transaction_id']} is {row['state']} (by {row['operator'] or args.operator}: "
                     f"{row['reason'] or args.reason})")


def _topic_list(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "ListTopics", admin_pb2.ListTopicsRequest())
    topics = [{"topic": t.topic, "queues": sum(b.queue_count for b in t.brokers),
               "brokers": {b.broker_name: b.queue_count for b in t.brokers}} for t in response.topics]
    out({"topics": topics}, lambda: format_table(
        ["TOPIC", "QUEUES", "BROKERS"],
        [[t["topic"], t["queues"], ", ".join(f"{b}:{n}" for b, n in sorted(t["brokers"].items()))]
         for t in topics]))


def _topic_create(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "CreateTopic",
                          admin_pb2.CreateTopicRequest(topic=args.name, queue_count=args.queues))
    data = {"topic": response.topic, "brokers": {b.broker_name: b.queue_count for b in response.brokers}}
    out(data, lambda: f"created {data['topic']}: "
                      + ", ".join(f"{b} {n} queue(s)" for b, n in sorted(data["brokers"].items())))


_ROLES = {nameserver_pb2.BROKER_ROLE_UNSPECIFIED: "single", nameserver_pb2.BROKER_ROLE_LEADER: "leader",
          nameserver_pb2.BROKER_ROLE_FOLLOWER: "follower"}


def _broker_list(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    """Every broker, and every replica of replicated shards: role, epoch, in-sync state and
    lag as the shard's leader reports them."""
    response = admin.call("nameserver", "ListBrokers", nameserver_pb2.ListBrokersRequest(include_followers=True))
    now = _now_ms()
    # What each shard's leader says of its followers.
    seen_by_leader: dict[tuple[str, int], Any] = {}
    in_sync: dict[str, set[int]] = {}
    for b in response.brokers:
        if b.role == nameserver_pb2.BROKER_ROLE_LEADER:
            in_sync[b.name] = set(b.replication.in_sync_replicas)
            for f in b.replication.followers:
                seen_by_leader[(b.name, f.replica_id)] = f
    brokers = []
    for b in response.brokers:
        row: dict[str, Any] = {
            "name": b.name, "address": b.address, "topics": len(b.topics), "last_heartbeat": _iso(b.last_heartbeat_ms),
            "heartbeat_age_seconds": max(now - b.last_heartbeat_ms, 0) / 1000}
        if b.role != nameserver_pb2.BROKER_ROLE_UNSPECIFIED:
            f = seen_by_leader.get((b.name, b.replica_id))
            row.update({"replica": b.replica_id, "role": _ROLES[b.role], "epoch": b.leader_epoch,
                        "in_sync": b.replica_id in in_sync.get(b.name, set()), "log_end": b.replication.log_end,
                        "lag_records": f.lag_records if f is not None else 0,
                        "lag_seconds": f.lag_seconds if f is not None else 0.0})
        brokers.append(row)

    def text() -> str:
        return format_table(
            ["SHARD", "REPLICA", "ROLE", "EPOCH", "IN SYNC", "LAG", "ADDRESS", "TOPICS", "LAST HEARTBEAT"],
            [[b["name"], b.get("replica", "-"), b.get("role", "single"), b.get("epoch", "-"),
              ("yes" if b["in_sync"] else "NO") if "in_sync" in b else "-",
              (f"{b['lag_records']} rec / {format_duration(b['lag_seconds'])}" if b.get("role") == "follower"
               else "-"),
              b["address"], b["topics"], format_duration(b["heartbeat_age_seconds"]) + " ago"] for b in brokers])
    out({"brokers": brokers}, text)


def _broker_elect(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    """Moves a replicated shard's leadership to ``--replica`` and waits until it serves."""
    response = admin.call("admin", "ElectLeader", admin_pb2.ElectLeaderRequest(shard=args.shard,
                                                                                 replica_id=args.replica))
    deadline = time.monotonic() + args.wait
    leader = None
    while time.monotonic() < deadline:
        listed = admin.call("nameserver", "ListBrokers", nameserver_pb2.ListBrokersRequest())
        leader = next((b for b in listed.brokers if b.name == args.shard), None)
        if leader is not None and leader.replica_id == args.replica and leader.role == nameserver_pb2.BROKER_ROLE_LEADER:
            break
        time.sleep(0.1)
    else:
        raise TxmqError(f"{args.shard}: replica {args.replica} did not take over within {args.wait:g} s "
                        f"(routed now: {'replica ' + str(leader.replica_id) if leader else 'none'})")
    data = {"shard": args.shard, "leader": args.replica, "previous_leader": response.previous_replica_id,
            "epoch": leader.leader_epoch, "address": leader.address, "log_end": response.log_end}
    out(data, lambda: f"{args.shard}: replica {args.replica} leads (epoch {data['epoch']}, {data['address']}); "
                      f"replica {data['previous_leader']} handed over at log end {data['log_end']}")


def _checker_list(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("nameserver", "ListCheckers", nameserver_pb2.ListCheckersRequest())
    now = _now_ms()
    checkers = [{"name": c.name, "address": c.address, "last_heartbeat": _iso(c.last_heartbeat_ms),
                 "heartbeat_age_seconds": max(now - c.last_heartbeat_ms, 0) / 1000} for c in response.checkers]
    out({"checkers": checkers}, lambda: format_table(
        ["CHECKER", "ADDRESS", "LAST HEARTBEAT"],
        [[c["name"], c["address"], format_duration(c["heartbeat_age_seconds"]) + " ago"] for c in checkers]))


# --- the parser ------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    # Common options are accepted before or after the command (``txmq --json txn list`` and
    # ``txmq txn list --json``); SUPPRESS keeps a subcommand from resetting what came before.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nameserver", default=argparse.SUPPRESS,
                        help=f"name server host:port, comma-separated for several "
                             f"(default $TXMQ_NAMESERVER or {DEFAULT_NAMESERVER})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument("--timeout", type=_duration_arg, default=argparse.SUPPRESS,
                        help="deadline of each call (default 10s)")

    parser = argparse.ArgumentParser(prog="txmq", parents=[common],
                                     description="Operate a txmq cluster through its name servers.")
    commands = parser.add_subparsers(dest="noun", required=True, metavar="{txn,topic,broker,checker}")

    txn = commands.add_parser("txn", help="transactions").add_subparsers(dest="verb", required=True)
    p = txn.add_parser("list", parents=[common], help="transactions by group, state and age")
    p.add_argument("--group", help="producer group (default all)")
    p.add_argument("--state", choices=["pending", "discarded", "committed", "rolled-back"])
    p.add_argument("--older-than", type=_duration_arg, help="prepared at least this long ago (60s, 5m, 1h)")
    p.add_argument("--limit", type=int, default=100, help="most rows per broker (default 100)")
    p.set_defaults(run=_txn_list)
    p = txn.add_parser("describe", parents=[common], help="one transaction")
    p.add_argument("transaction_id")
    p.set_defaults(run=_txn_describe)
    p = txn.add_parser("resolve", parents=[common], help="commit or roll back a pending or discarded transaction")
    p.add_argument("transaction_id")
    decision = p.add_mutually_exclusive_group(required=True)
    decision.add_argument("--commit", action="store_true")
    decision.add_argument("--rollback", action="store_true")
    p.add_argument("--operator", default=None, help="who decides (default $USER)")
    p.add_argument("--reason", required=True, help="why (recorded on the transaction)")
    p.set_defaults(run=_txn_resolve)

    topic = commands.add_parser("topic", help="topics").add_subparsers(dest="verb", required=True)
    p = topic.add_parser("list", parents=[common], help="topics and their queues")
    p.set_defaults(run=_topic_list)
    p = topic.add_parser("create", parents=[common], help="create a topic (queues spread over the brokers)")
    p.add_argument("name")
    p.add_argument("--queues", type=int, default=0, help="total queues (default: the name server's)")
    p.set_defaults(run=_topic_create)
    add_topic_commands(topic, common)

    broker = commands.add_parser("broker", help="brokers").add_subparsers(dest="verb", required=True)
    broker.add_parser("list", parents=[common], help="live brokers and replicas (role, epoch, in sync, lag)"
                      ).set_defaults(run=_broker_list)
    p = broker.add_parser("elect", parents=[common], help="move a replicated shard's leadership to a replica")
    p.add_argument("shard", help="the shard (broker name)")
    p.add_argument("--replica", type=int, required=True, help="the in-sync replica id to lead")
    p.add_argument("--wait", type=_duration_arg, default=15.0, help="how long to wait for it to serve (default 15s)")
    p.set_defaults(run=_broker_elect)
    add_broker_commands(broker, common, _duration_arg)
    checker = commands.add_parser("checker", help="checkers").add_subparsers(dest="verb", required=True)
    checker.add_parser("list", parents=[common], help="live checkers").set_defaults(run=_checker_list)
    return parser


def _default_operator() -> str:
    try:
        return os.environ.get("USER") or getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name: the operator must say who
        return ""


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    nameserver = getattr(args, "nameserver", None) or os.environ.get("TXMQ_NAMESERVER") or DEFAULT_NAMESERVER
    as_json = getattr(args, "json", False)
    if getattr(args, "verb", None) == "resolve" and args.noun == "txn":
        args.operator = args.operator or _default_operator()
        if not args.operator:
            stderr.write("txmq: --operator is required (no $USER to default to)\n")
            return 2

    def out(data: Any, table: Callable[[], str]) -> None:
        stdout.write((json.dumps(data, indent=2, sort_keys=False) if as_json else table()) + "\n")

    try:
        admin = Admin(nameserver, getattr(args, "timeout", 10.0))
    except TxmqError as err:
        stderr.write(f"txmq: {err.message}\n")
        return 2
    try:
        args.run(admin, args, out)
    except TxmqError as err:
        stderr.write(f"txmq: {err.message}\n")
        return 1
    finally:
        admin.close()
    return 0


def run() -> None:
    raise SystemExit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
