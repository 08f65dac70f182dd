"""``txmq``: the operator's command line. It speaks the name server's AdminService (and
NameServerService for listings), so it needs only the name server address.

    txmq [--nameserver HOST:PORT[,...]] [--json] COMMAND

    txmq txn list [--group G] [--state pending|discarded|committed|rolled-back]
                  [--older-than 60s] [--limit N]
    txmq txn describe ID|MESSAGE_ID [--body-out FILE]
    txmq txn list ... [--key K]
    txmq txn resolve ID --commit|--rollback [--operator NAME] --reason TEXT
    txmq txn global GLOBAL_ID
    txmq txn list-global [--limit N]
    txmq topic list
    txmq topic create NAME [--queues N]
    txmq topic describe NAME
    txmq topic delete NAME [--force]
    txmq group list [--topic T]
    txmq group describe GROUP [--topic T]
    txmq group reset GROUP --topic T (--to-earliest | --to-latest | --to-time TIME |
                     --to-offset [BROKER/]QUEUE:OFFSET | --shift N) [--dry-run | --execute] [--force]
    txmq group clients GROUP
    txmq message get MESSAGE_ID | find TOPIC --key K | print TOPIC --queue Q --offset O
    txmq dlq list GROUP [--limit N]
    txmq dlq redrive GROUP --ids ID [ID ...] | --all
    txmq topic expand TOPIC --broker SHARD [--queues N]
    txmq broker list
    txmq broker status
    txmq broker elect SHARD --replica R
    txmq broker backup SHARD --to DIR
    txmq broker restore --from DIR --data-dir PATH [--replace]
    txmq broker drain SHARD [--wait 5m] [--status | --undo]
    txmq checker list
    txmq db schema|init|status [--dsn DSN | --dsn-file FILE] [--table T]
    txmq completion bash
    txmq --version

``--nameserver`` defaults to ``$TXMQ_NAMESERVER``, else 127.0.0.1:9876; with several
addresses the next is tried when one is unavailable. ``--tls-ca FILE`` dials the name
servers with TLS (``--tls-cert FILE --tls-key FILE``: presenting a client certificate, for
mutual TLS); they default to ``$TXMQ_TLS_CA_FILE``, ``$TXMQ_TLS_CERT_FILE``,
``$TXMQ_TLS_KEY_FILE``, and ``--tls-server-name`` to ``$TXMQ_TLS_SERVER_NAME``; ``--token``
(default ``$TXMQ_TOKEN``) is sent as a bearer token. ``--namespace NS`` (default ``$TXMQ_NAMESPACE``)
puts every topic and group named in that namespace, and the listings (topics, groups,
transactions) show only its resources. Output is a table cut to the terminal's width
(``$COLUMNS``; ids are never cut; not cut when piped), or JSON with ``--json``. Exit status: 0 done, 1 the
request failed (the error on stderr), 2 bad usage. A reader that stops early (``| head``)
ends the output quietly.
Durations are ``500ms``, ``60s``, ``5m``, ``1h``, ``2d`` or plain seconds.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import getpass
import json
import math
import os
import re
import sys
import time
from importlib import metadata
from typing import Any, Callable, NoReturn, Sequence, TextIO

from ._admin import Admin as _AdminClient
from ._administering import cut_per_broker
from ._db_cli import add_db_commands, run_db
from ._errors import TopicExistsError, TxmqError
from ._global_cli import add_global_commands
from ._group_cli import add_group_commands, add_message_commands, describe_by_message_id, is_message_id
from ._names import in_namespace, unqualify
from ._tables import format_table, table, terminal_width  # noqa: F401 - the CLI's tables
from ._ops_cli import add_broker_commands, add_topic_commands
from ._tls import add_tls_arguments, tls_from_args
from .v1 import admin_pb2, common_pb2, nameserver_pb2

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
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC).isoformat(timespec="milliseconds")


def _now_ms() -> int:
    return int(_dt.datetime.now(tz=_dt.UTC).timestamp() * 1000)


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
        "keys": list(t.keys),
    }


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


#: Most characters of a text body ``txn describe`` and ``dlq list`` print.
BODY_PREVIEW_CHARS = 512


def body_preview(body: bytes, limit: int = BODY_PREVIEW_CHARS) -> str:
    """A body as a terminal can show it: UTF-8 text (control characters escaped) up to
    ``limit`` characters, else a hex preview marked binary. Never writes raw bytes."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\n\t" for c in text):
        shown = text[:limit]
        more = f" … ({len(body) - len(shown.encode())} more bytes)" if len(text) > limit else ""
        return shown.replace("\n", "\\n").replace("\t", "\\t") + more
    head = body[:32].hex(" ")
    return f"<binary, {len(body)} bytes> {head}{' …' if len(body) > 32 else ''} (--body-out FILE writes it raw)"


def message_dict(m: common_pb2.Message) -> dict[str, Any]:
    """Keys, tag, properties and body of a message (body as UTF-8 text when it is, and always base64)."""
    try:
        text: str | None = m.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"topic": m.topic, "tag": m.tag, "keys": list(m.keys), "properties": dict(sorted(m.properties.items())),
            **({"message_group": m.message_group} if m.message_group else {}),
            "born_host": m.born_host, "born_at": _iso(m.born_timestamp_ms), "body_size_bytes": len(m.body),
            "body_utf8": text, "body_base64": base64.b64encode(m.body).decode()}


# --- commands --------------------------------------------------------------------------------

Output = Callable[[Any, Callable[[], str]], None]
Admin = _AdminClient


#: A next check this late (or more) is flagged as overdue: nobody is answering it.
OVERDUE_SLACK_SECONDS = 1.0


def _overdue_seconds(t: common_pb2.Transaction, now_ms: int) -> float:
    if t.state != common_pb2.TRANSACTION_STATE_PREPARED or not t.next_check_at_ms:
        return 0.0
    late = (now_ms - t.next_check_at_ms) / 1000
    return late if late >= OVERDUE_SLACK_SECONDS else 0.0


def _txn_list(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    # One more than asked per broker tells a cut list from one that ended.
    # The namespace and the key are filtered on each broker, before its limit.
    response = admin.call("admin", "ListTransactions", admin_pb2.ListTransactionsRequest(
        producer_group=args.group or "",
        state=STATES[args.state] if args.state else common_pb2.TRANSACTION_STATE_UNSPECIFIED,
        older_than_seconds=args.older_than or 0.0, limit=args.limit + 1, namespace=admin.namespace,
        key=args.key or ""))
    kept = [t for t in response.transactions if admin.in_scope(t.producer_group)]  # a broker from before the field
    del response.transactions[:]
    response.transactions.extend(kept)
    response = cut_per_broker(response, args.limit)
    now = _now_ms()
    cut_brokers = set(response.truncated_brokers)
    rows = []
    for t in response.transactions:
        row = transaction_dict(t, now)
        row["next_check_overdue_seconds"] = _overdue_seconds(t, now)
        rows.append(row)
    data = {"transactions": rows, "unreachable_brokers": list(response.unreachable_brokers),
            "truncated": bool(cut_brokers), "limit_per_broker": args.limit}

    def next_check(r: dict[str, Any]) -> str:
        if not r["next_check_at"]:
            return ""
        late = r["next_check_overdue_seconds"]
        return f"OVERDUE {format_duration(late)}" if late else r["next_check_at"][11:19]

    def text() -> str:
        body = table(
            ["TRANSACTION", "STATE", "GROUP", "TOPIC", "KEYS", "AGE", "CHECKS", "NEXT CHECK", "REASON"],
            [[r["transaction_id"], r["state"], r["producer_group"], r["topic"], ",".join(r["keys"]),
              format_duration(r["age_seconds"] or 0), f"{r['checks_delivered']}/{r['checks_answered']}",
              next_check(r), r["discard_reason"] or r["reason"]] for r in rows])
        body += f"\n{len(rows)} transaction(s)"
        if cut_brokers:
            body += (f"; cut at --limit {args.limit} per broker on {', '.join(sorted(cut_brokers))}: "
                     f"more match (raise --limit, or narrow with --group/--state/--older-than/--key)")
        if response.unreachable_brokers:
            body += f"; unreachable brokers (list incomplete): {', '.join(response.unreachable_brokers)}"
        if rows:
            body += ("\nCHECKS: sent to a producer / answered (check_max counts the sent ones); "
                     "NEXT CHECK: when it is due (UTC)")
        if any(r["next_check_overdue_seconds"] for r in rows):
            body += ("\nOVERDUE: the check was due that long ago and no producer of the group took it "
                     "(none connected, or all busy); see txmq checker list and the group's producers")
        return body
    out(data, text)


def _describe_text(row: dict[str, Any]) -> str:
    width = max(len(k) for k in row)
    lines = []
    for key, value in row.items():
        if key == "age_seconds" and value is not None:
            value = f"{format_duration(value)} ({value:.3f}s)"
        elif key in ("properties",) and isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        elif key == "keys" and isinstance(value, list):
            value = ", ".join(value)
        lines.append(f"{key.ljust(width)}  {'' if value is None else value}")
    return "\n".join(lines)


def _with_helpers(handler: Callable[..., None]) -> Callable[[Admin, argparse.Namespace, Output], None]:
    """A command of ``_group_cli`` given this module's helpers."""
    helpers = argparse.Namespace(table=table, message_dict=message_dict, body_preview=body_preview,
                                 describe_text=_describe_text, parse_duration=parse_duration)

    def run(admin: Admin, args: argparse.Namespace, out: Output) -> None:
        # Their Admin methods put names in the namespace themselves (main already did).
        for attr in ("topic", "group"):
            value = getattr(args, attr, None)
            if isinstance(value, str) and value:
                setattr(args, attr, unqualify(admin.namespace, value))
        handler(admin, args, out, helpers)
    return run


def _txn_describe(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    if is_message_id(args.transaction_id):  # a message id: its transaction
        args.transaction_id = describe_by_message_id(admin, args.transaction_id)
    response = admin.call("admin", "DescribeTransaction",
                          admin_pb2.DescribeTransactionRequest(transaction_id=args.transaction_id))
    now = _now_ms()
    row = transaction_dict(response.transaction, now)
    row["checks"] = (f"{row['checks_delivered']} sent to producers (check_max counts these), "
                     f"{row['checks_answered']} answered")
    overdue = _overdue_seconds(response.transaction, now)
    row["next_check_overdue_seconds"] = overdue
    has_message = response.HasField("message")
    if args.body_out:
        if not has_message:
            raise TxmqError(f"transaction {args.transaction_id}: its message is gone (removed by retention)")
        with open(args.body_out, "wb") as f:
            f.write(response.message.body)
    data = dict(row)
    data["message"] = message_dict(response.message) if has_message else None

    def text() -> str:
        shown = dict(row)
        if overdue:
            shown["next_check_at"] = f"{row['next_check_at']}  OVERDUE by {format_duration(overdue)}"
        shown.pop("next_check_overdue_seconds")
        if has_message:
            m = response.message
            shown.update({"tag": m.tag, "keys": list(m.keys), "properties": dict(sorted(m.properties.items())),
                          "born_host": m.born_host,
                          "body": (f"written to {args.body_out} ({len(m.body)} bytes)" if args.body_out
                                   else body_preview(m.body))})
        else:
            shown["body"] = "(message removed by retention)"
        return _describe_text(shown)
    out(data, text)


def _txn_resolve(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    resolution = (common_pb2.TRANSACTION_RESOLUTION_COMMIT if args.commit
                  else common_pb2.TRANSACTION_RESOLUTION_ROLLBACK)
    response = admin.call("admin", "ResolveTransaction", admin_pb2.ResolveTransactionRequest(
        transaction_id=args.transaction_id, resolution=resolution, operator=args.operator,
        reason=args.reason))
    row = transaction_dict(response.transaction)
    out(row, lambda: f"{row['transaction_id']} is {row['state']} (by {row['operator'] or args.operator}: "
                     f"{row['reason'] or args.reason})")


def _in_namespace(args: argparse.Namespace, namespace: str) -> None:
    """Puts the topic and group arguments in ``namespace`` (refusing one that names another)."""
    for attr, field in (("name", "topic"), ("topic", "topic"), ("group", "group")):
        value = getattr(args, attr, None)
        if isinstance(value, str) and value:
            setattr(args, attr, in_namespace(namespace, field, value))


def _topic_list(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.list_topics()  # with a namespace, its topics alone
    topics: list[dict[str, Any]] = [{"topic": t.topic, "type": _topic_type_name(t.topic_type), "queues": sum(b.queue_count for b in t.brokers),
               "brokers": {b.broker_name: b.queue_count for b in t.brokers}} for t in response.topics]
    out({"topics": topics}, lambda: table(
        ["TOPIC", "TYPE", "QUEUES", "BROKERS"],
        [[t["topic"], t["type"], t["queues"], ", ".join(f"{b}:{n}" for b, n in sorted(t["brokers"].items()))]
         for t in topics]))


def _topic_type_name(value: int) -> str:
    return "FIFO" if value == common_pb2.TOPIC_TYPE_FIFO else "NORMAL"


def _topic_create(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    wanted = common_pb2.TOPIC_TYPE_FIFO if args.type == "fifo" else common_pb2.TOPIC_TYPE_NORMAL
    try:
        response = admin.call("admin", "CreateTopic",
                              admin_pb2.CreateTopicRequest(topic=args.name, queue_count=args.queues, topic_type=wanted))
    except TopicExistsError:
        if not args.exist_ok:
            raise
        _topic_exists(admin, args, wanted, out)
        return
    data = {"topic": response.topic, "type": args.type.upper(),
            "brokers": {b.broker_name: b.queue_count for b in response.brokers}}
    out(data, lambda: f"created {data['type']} topic {data['topic']}: "
                      + ", ".join(f"{b} {n} queue(s)" for b, n in sorted(data["brokers"].items())))


def _topic_exists(admin: Admin, args: argparse.Namespace, wanted: int, out: Output) -> None:
    """``topic create --exist-ok`` of a topic that already holds at least the queues asked:
    success when its type is the one asked (a declared topic applied again), an error when
    not (a topic's type cannot change)."""
    described = admin.call("admin", "DescribeTopic", admin_pb2.DescribeTopicRequest(topic=args.name))
    if described.topic_type != wanted:
        raise TxmqError(f"topic {args.name!r} exists as a {_topic_type_name(described.topic_type)} topic, not "
                        f"{_topic_type_name(wanted)}: a topic's type cannot change (delete it and create it again)")
    brokers: dict[str, int] = {}
    for q in described.queues:
        brokers[q.broker_name] = brokers.get(q.broker_name, 0) + 1
    data = {"topic": described.topic, "type": _topic_type_name(wanted), "brokers": brokers, "existed": True}
    out(data, lambda: f"{data['type']} topic {data['topic']} exists ({sum(brokers.values())} queue(s)): "
                      "nothing to do")


def _topic_describe(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "DescribeTopic", admin_pb2.DescribeTopicRequest(topic=args.name))
    queues = [{"broker": q.broker_name, "queue_id": q.queue_id, "min_offset": q.min_offset,
               "max_offset": q.max_offset, "messages": q.max_offset - q.min_offset} for q in response.queues]
    consumers = [_queue_status(q) for q in response.consumers]
    data = {"topic": response.topic, "type": _topic_type_name(response.topic_type), "queues": queues,
            "consumers": consumers, "unreachable_brokers": list(response.unreachable_brokers)}

    def text() -> str:
        parts = [f"topic {response.topic} ({data['type']}): {len(queues)} queue(s), "
                 f"{sum(q['messages'] for q in queues)} message(s) retained",
                 table(["BROKER", "QUEUE", "MIN OFFSET", "MAX OFFSET", "RETAINED"],
                       [[q["broker"], q["queue_id"], q["min_offset"], q["max_offset"], q["messages"]]
                        for q in queues])]
        groups = _group_totals(consumers)
        parts.append("consumer groups: none" if not groups else "consumer groups:\n" + _groups_table(groups))
        if response.unreachable_brokers:
            parts.append(f"unreachable brokers (incomplete): {', '.join(response.unreachable_brokers)}")
        return "\n".join(parts)
    out(data, text)


def _topic_delete(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "DeleteTopic", admin_pb2.DeleteTopicRequest(topic=args.name, force=args.force))
    data = {"topic": response.topic, "brokers": list(response.brokers), "entries_deleted": response.entries_deleted,
            "consumer_groups": list(response.consumer_groups)}
    out(data, lambda: f"deleted {data['topic']} on {', '.join(data['brokers'])} ({data['entries_deleted']} queue "
                      f"entries)" + (f"; dropped the positions of {', '.join(data['consumer_groups'])}"
                                     if data["consumer_groups"] else ""))


def _queue_status(q: Any) -> dict[str, Any]:
    return {"consumer_group": q.consumer_group, "topic": q.topic, "broker": q.broker_name, "queue_id": q.queue_id,
            "ack_offset": q.ack_offset, "next_offset": q.next_offset, "max_offset": q.max_offset,
            "lag_messages": q.lag_messages, "lag_seconds": q.lag_seconds, "inflight": q.inflight,
            "retrying": q.retrying,
            "last_reset": {"operator": q.last_reset_operator, "at": _iso(q.last_reset_at_ms),
                           "reason": q.last_reset_reason, "target": q.last_reset_target}
            if q.last_reset_at_ms else None}


def _group_totals(queues: list[dict[str, Any]], dead: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Per group: topics, lag (sum of messages, oldest in seconds), in flight, retrying, dead letters."""
    groups: dict[str, dict[str, Any]] = {}
    for q in queues:
        g = groups.setdefault(q["consumer_group"], {"consumer_group": q["consumer_group"], "topics": set(),
                                                   "lag_messages": 0, "lag_seconds": 0.0, "inflight": 0,
                                                   "retrying": 0, "dead_letters": 0})
        if not q["topic"].startswith("%"):
            g["topics"].add(q["topic"])
        g["lag_messages"] += q["lag_messages"]
        g["lag_seconds"] = max(g["lag_seconds"], q["lag_seconds"])
        g["inflight"] += q["inflight"]
        g["retrying"] += q["retrying"]
    for name, count in (dead or {}).items():
        groups.setdefault(name, {"consumer_group": name, "topics": set(), "lag_messages": 0, "lag_seconds": 0.0,
                                 "inflight": 0, "retrying": 0, "dead_letters": 0})["dead_letters"] = count
    return [{**g, "topics": sorted(g["topics"])} for _n, g in sorted(groups.items())]


def _groups_table(groups: list[dict[str, Any]]) -> str:
    return table(["GROUP", "TOPICS", "LAG (MSGS)", "LAG (OLDEST)", "IN FLIGHT", "RETRYING", "DEAD LETTERS"],
                 [[g["consumer_group"], ", ".join(g["topics"]), g["lag_messages"], format_duration(g["lag_seconds"]),
                   g["inflight"], g["retrying"], g["dead_letters"]] for g in groups])


def _dead_counts(response: Any) -> dict[str, int]:
    dead: dict[str, int] = {}
    for d in response.dead_letters:
        dead[d.consumer_group] = dead.get(d.consumer_group, 0) + d.dead_lettered
    return dead


def _group_list(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "ListConsumerGroups", admin_pb2.ListConsumerGroupsRequest(topic=args.topic or ""))
    groups = _group_totals([_queue_status(q) for q in response.queues if admin.in_scope(q.consumer_group)],
                           {g: n for g, n in _dead_counts(response).items() if admin.in_scope(g)})
    data = {"groups": groups, "unreachable_brokers": list(response.unreachable_brokers)}

    def text() -> str:
        body = _groups_table(groups) + f"\n{len(groups)} group(s)"
        if response.unreachable_brokers:
            body += f"; unreachable brokers (incomplete): {', '.join(response.unreachable_brokers)}"
        return body
    out(data, text)


def last_reset_lines(queues: list[dict[str, Any]], most: int = 3) -> list[str]:
    """The last offset reset of each topic (``most`` topics, the latest reset first). Each
    broker records the last reset of a group's topic on it (every queue row of that broker
    repeats it) at its own time: one reset is shown once, at the latest, when every broker
    holding the topic names it; else once per distinct reset, naming its brokers (the
    others' were another, or none)."""
    topics: list[tuple[str, list[str]]] = []
    for topic in sorted({q["topic"] for q in queues}):
        brokers = {q["broker"] for q in queues if q["topic"] == topic}
        kinds: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
        for q in queues:
            if q["topic"] == topic and (r := q["last_reset"]):
                kinds.setdefault((r["operator"], r["target"], r["reason"]), {})[q["broker"]] = r
        if not kinds:
            continue
        lines = []
        for by_broker in kinds.values():
            latest = max(by_broker.values(), key=lambda r: r["at"])
            where = "" if set(by_broker) == brokers else f" (on {', '.join(sorted(by_broker))} only)"
            lines.append((latest["at"], f"last reset of {topic}: {latest['at']} by {latest['operator']} "
                                        f"(to {latest['target']})" + (f": {latest['reason']}" if latest["reason"]
                                                                       else "") + where))
        lines.sort(reverse=True)
        topics.append((lines[0][0], [line for _at, line in lines]))
    return [line for _at, lines in sorted(topics, reverse=True)[:most] for line in lines]


def _group_describe(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "ListConsumerGroups", admin_pb2.ListConsumerGroupsRequest(
        consumer_group=args.group, topic=args.topic or ""))
    queues = [_queue_status(q) for q in response.queues]
    dead = {d.broker_name: d.dead_lettered for d in response.dead_letters}
    data = {"consumer_group": args.group, "queues": queues, "dead_letters": dead,
            "unreachable_brokers": list(response.unreachable_brokers)}

    def text() -> str:
        parts = [table(["TOPIC", "BROKER", "QUEUE", "ACKED", "DELIVERED", "END", "LAG", "LAG AGE", "IN FLIGHT",
                        "RETRYING"],
                       [[q["topic"], q["broker"], q["queue_id"], q["ack_offset"], q["next_offset"], q["max_offset"],
                         q["lag_messages"], format_duration(q["lag_seconds"]), q["inflight"], q["retrying"]]
                        for q in queues])]
        total = sum(dead.values())
        parts.append(f"dead letters: {total}" + (" (" + ", ".join(f"{b}: {n}" for b, n in sorted(dead.items())) + ")"
                                                 if total else "")
                     + (f"; txmq dlq list {args.group}" if total else ""))
        parts.extend(last_reset_lines(queues))
        parts.append("ACKED: every offset below is acknowledged; DELIVERED: the next never delivered; "
                     "LAG = END - ACKED; LAG AGE: how long the oldest unacknowledged message has been visible")
        if response.unreachable_brokers:
            parts.append(f"unreachable brokers (incomplete): {', '.join(response.unreachable_brokers)}")
        return "\n".join(parts)
    out(data, text)


def _dlq_list(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "ListDeadLetters", admin_pb2.ListDeadLettersRequest(
        consumer_group=args.group, limit=args.limit))
    rows = [{"message_id": m.message.message_id, "topic": m.message.topic, "broker": m.broker_name,
             "dead_lettered_at": _iso(m.visible_at_ms), "stored_at": _iso(m.stored_at_ms),
             "transaction_id": m.transaction_id, **{k: v for k, v in message_dict(m.message).items() if k != "topic"}}
            for m in response.messages]
    data = {"consumer_group": args.group, "messages": rows, "truncated": response.truncated,
            "unreachable_brokers": list(response.unreachable_brokers)}

    def text() -> str:
        body = table(["MESSAGE ID", "TOPIC", "TAG", "KEYS", "DEAD-LETTERED (UTC)", "BODY"],
                     [[r["message_id"], r["topic"], r["tag"], ",".join(r["keys"]), r["dead_lettered_at"][:23],
                       body_preview(m.message.body, 80)] for r, m in zip(rows, response.messages)])
        body += f"\n{len(rows)} dead letter(s)"
        if response.truncated:
            body += f"; cut at --limit {args.limit} per broker: more wait"
        if response.unreachable_brokers:
            body += f"; unreachable brokers (incomplete): {', '.join(response.unreachable_brokers)}"
        if rows:
            body += f"\nre-drive: txmq dlq redrive {args.group} --ids ID ... | --all"
        return body
    out(data, text)


def _dlq_redrive(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    response = admin.call("admin", "RedriveDeadLetters", admin_pb2.RedriveDeadLettersRequest(
        consumer_group=args.group, message_ids=args.ids or [], all=args.all))
    data = {"consumer_group": args.group, "redriven": list(response.redriven), "not_found": list(response.not_found),
            "expired": list(response.expired), "unreachable_brokers": list(response.unreachable_brokers)}

    def text() -> str:
        lines = [f"re-drove {len(data['redriven'])} message(s) to {args.group}: its next receive delivers them"]
        if data["not_found"]:
            lines.append(f"not among {args.group}'s dead letters: {', '.join(data['not_found'])}")
        if data["expired"]:
            lines.append(f"removed by retention (dropped from the DLQ): {', '.join(data['expired'])}")
        if data["unreachable_brokers"]:
            lines.append(f"unreachable brokers (not re-driven there): {', '.join(data['unreachable_brokers'])}")
        return "\n".join(lines)
    out(data, text)
    if data["not_found"] and not data["redriven"]:
        raise TxmqError(f"nothing re-driven: {len(data['not_found'])} id(s) not among {args.group}'s dead letters")
    if args.all and not data["redriven"] and not data["expired"]:
        raise TxmqError(f"nothing to re-drive: {args.group} has no dead letters")


def _broker_status(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    """GetBrokerStats of every serving broker (the leader of a replicated shard), with its
    replicas' roles and in-sync state from the name server."""
    response = admin.call("admin", "DescribeBrokers", admin_pb2.DescribeBrokersRequest())
    listed = admin.call("nameserver", "ListBrokers", nameserver_pb2.ListBrokersRequest(include_followers=True))
    replicas: dict[str, list[Any]] = {}
    for b in listed.brokers:
        replicas.setdefault(b.name, []).append(b)
    now = _now_ms()
    brokers = []
    for st in response.brokers:
        shard = replicas.get(st.broker_name, [])
        leader = next((b for b in shard if b.role == nameserver_pb2.BROKER_ROLE_LEADER), None)
        oldest = min((g.oldest_pending_prepared_at_ms for g in st.groups if g.oldest_pending_prepared_at_ms),
                     default=0)
        brokers.append({
            "name": st.broker_name, "store_bytes": st.store_bytes, "free_disk_bytes": st.free_disk_bytes,
            "topics": len([t for t in st.topics if not t.topic.startswith("%")]),
            "pending": sum(g.pending for g in st.groups), "discarded": sum(g.discarded for g in st.groups),
            "oldest_pending_age_seconds": max(now - oldest, 0) / 1000 if oldest else None,
            "max_body_bytes": st.max_body_bytes, "max_delivery_attempts": st.max_delivery_attempts,
            "draining": any(b.draining for b in shard),
            "replicas": len(shard) if leader is not None else 1,
            "in_sync": len(leader.replication.in_sync_replicas) if leader is not None else 1,
            "leader_replica": leader.replica_id if leader is not None else None,
            "epoch": leader.leader_epoch if leader is not None else None,
            "groups": [{"producer_group": g.producer_group, "pending": g.pending, "discarded": g.discarded}
                       for g in st.groups]})
    data = {"brokers": brokers, "unreachable_brokers": list(response.unreachable_brokers)}

    def text() -> str:
        body = table(["SHARD", "STATE", "REPLICAS IN SYNC", "LEADER", "STORE", "FREE DISK", "TOPICS", "PENDING",
                      "DISCARDED", "OLDEST PENDING", "MAX BODY"],
                     [[b["name"], "DRAINING" if b["draining"] else "serving", f"{b['in_sync']}/{b['replicas']}",
                       "-" if b["leader_replica"] is None else f"replica {b['leader_replica']} (epoch {b['epoch']})",
                       _bytes(b["store_bytes"]), _bytes(b["free_disk_bytes"]), b["topics"], b["pending"],
                       b["discarded"],
                       "" if b["oldest_pending_age_seconds"] is None else format_duration(b["oldest_pending_age_seconds"]),
                       _bytes(b["max_body_bytes"])] for b in brokers])
        if response.unreachable_brokers:
            body += f"\nunreachable brokers: {', '.join(response.unreachable_brokers)}"
        if any(b["draining"] for b in brokers):
            body += "\nDRAINING: takes no new sends (txmq broker drain SHARD --status; --undo ends it)"
        return body
    out(data, text)


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
            "name": b.name, "address": b.address, "draining": b.draining, "topics": len(b.topics),
            "last_heartbeat": _iso(b.last_heartbeat_ms),
            "heartbeat_age_seconds": max(now - b.last_heartbeat_ms, 0) / 1000}
        if b.role != nameserver_pb2.BROKER_ROLE_UNSPECIFIED:
            f = seen_by_leader.get((b.name, b.replica_id))
            row.update({"replica": b.replica_id, "role": _ROLES[b.role], "epoch": b.leader_epoch,
                        "in_sync": b.replica_id in in_sync.get(b.name, set()), "log_end": b.replication.log_end,
                        "complete": b.replication.complete,
                        "lag_records": f.lag_records if f is not None else 0,
                        "lag_seconds": f.lag_seconds if f is not None else 0.0})
        brokers.append(row)

    def text() -> str:
        return table(
            ["SHARD", "STATE", "REPLICA", "ROLE", "EPOCH", "IN SYNC", "LAG", "ADDRESS", "TOPICS", "LAST HEARTBEAT"],
            [[b["name"], "DRAINING" if b["draining"] else "serving", b.get("replica", "-"), b.get("role", "single"),
              b.get("epoch", "-"),
              (("yes" if b["in_sync"] else "NO") + ("" if b["complete"] else " (rebuilding)")) if "in_sync" in b else "-",
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
    out({"checkers": checkers}, lambda: table(
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
    add_tls_arguments(common)
    common.add_argument("--timeout", type=_duration_arg, default=argparse.SUPPRESS,
                        help="deadline of each call (default 10s)")
    common.add_argument("--namespace", default=argparse.SUPPRESS,
                        help="namespace of every topic and group named; listings show only its resources "
                             "(default $TXMQ_NAMESPACE)")
    common.add_argument("--token", default=argparse.SUPPRESS,
                        help="bearer token for a cluster with auth on (default $TXMQ_TOKEN); "
                             "with auth on, txn resolve records this token's principal as the operator")

    # Typed as argparse's own: its subcommands are _Parser at run time too (add_subparsers
    # makes its parsers of the parser's class), and take the plain `common` as a parent.
    parser: argparse.ArgumentParser = _Parser(prog="txmq", parents=[common],
                                     description="Operate a txmq cluster through its name servers.")
    parser.add_argument("--version", action="version", version=f"txmq {_version()}")
    commands = parser.add_subparsers(dest="noun", required=True,
                                     metavar="{txn,topic,group,message,dlq,broker,checker,db,completion}")

    txn = commands.add_parser("txn", help="transactions").add_subparsers(dest="verb", required=True)
    p = txn.add_parser("list", parents=[common], help="transactions by group, state and age")
    p.add_argument("--group", help="producer group (default all)")
    p.add_argument("--state", choices=["pending", "discarded", "committed", "rolled-back"])
    p.add_argument("--older-than", type=_duration_arg, help="prepared at least this long ago (60s, 5m, 1h)")
    p.add_argument("--key", help="only transactions whose message carries this key")
    p.add_argument("--limit", type=_positive_int, default=100,
                   help="most rows per broker (default 100); a cut list says so")
    p.set_defaults(run=_txn_list)
    p = txn.add_parser("describe", parents=[common], help="one transaction with its message (keys, tag, "
                                                           "properties, body)")
    p.add_argument("transaction_id", help="a transaction id, or the message id of a transactional message")
    p.add_argument("--body-out", metavar="FILE", help="write the body, raw, to FILE (- is not accepted: "
                                                       "binary bodies never go to the terminal)")
    p.set_defaults(run=_txn_describe)
    p = txn.add_parser("resolve", parents=[common], help="commit or roll back a pending or discarded transaction")
    p.add_argument("transaction_id")
    decision = p.add_mutually_exclusive_group(required=True)
    decision.add_argument("--commit", action="store_true")
    decision.add_argument("--rollback", action="store_true")
    p.add_argument("--operator", default=None, help="who decides (default $USER)")
    p.add_argument("--reason", required=True, help="why (recorded on the transaction)")
    p.set_defaults(run=_txn_resolve)
    add_global_commands(txn, common, transaction_dict)
    add_message_commands(commands, common, _with_helpers, _positive_int)

    topic = commands.add_parser("topic", help="topics").add_subparsers(dest="verb", required=True)
    p = topic.add_parser("list", parents=[common], help="topics and their queues")
    p.set_defaults(run=_topic_list)
    p = topic.add_parser("create", parents=[common], help="create a topic (queues spread over the brokers)")
    p.add_argument("name")
    p.add_argument("--queues", type=int, default=0, help="total queues (default: the name server's)")
    p.add_argument("--type", choices=["normal", "fifo"], default="normal",
                   help="fifo: every message carries a message group, delivered in order per group")
    p.add_argument("--exist-ok", action="store_true",
                   help="succeed when the topic already exists with this type and at least these queues "
                        "(fewer are added); an existing topic of the other type is still an error")
    p.set_defaults(run=_topic_create)
    p = topic.add_parser("describe", parents=[common], help="queues (offsets per broker) and the groups reading it")
    p.add_argument("name")
    p.set_defaults(run=_topic_describe)
    p = topic.add_parser("delete", parents=[common], help="delete a topic (refused while groups read it)")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="delete even while consumer groups read it")
    p.set_defaults(run=_topic_delete)

    group = commands.add_parser("group", help="consumer groups").add_subparsers(dest="verb", required=True)
    p = group.add_parser("list", parents=[common], help="every consumer group: lag, in flight, retrying, "
                                                         "dead letters")
    p.add_argument("--topic", help="only groups reading this topic")
    p.set_defaults(run=_group_list)
    p = group.add_parser("describe", parents=[common], help="one group per queue: acknowledged offset, lag "
                                                             "(messages, seconds), in flight, retrying")
    p.add_argument("group")
    p.add_argument("--topic", help="only this topic")
    p.set_defaults(run=_group_describe)
    add_group_commands(group, common, _with_helpers)

    dlq = commands.add_parser("dlq", help="dead letters (%%DLQ%%<group>)").add_subparsers(dest="verb", required=True)
    p = dlq.add_parser("list", parents=[common], help="a group's dead letters, oldest first")
    p.add_argument("group")
    p.add_argument("--limit", type=_positive_int, default=100, help="most messages per broker (default 100)")
    p.set_defaults(run=_dlq_list)
    p = dlq.add_parser("redrive", parents=[common], help="give dead letters back to their group (only it "
                                                          "receives them again)")
    p.add_argument("group")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--ids", nargs="+", metavar="MESSAGE_ID", help="these messages (ids from txmq dlq list)")
    which.add_argument("--all", action="store_true", help="every dead letter of the group")
    p.set_defaults(run=_dlq_redrive)
    add_topic_commands(topic, common)

    broker = commands.add_parser("broker", help="brokers").add_subparsers(dest="verb", required=True)
    broker.add_parser("list", parents=[common], help="live brokers and replicas (role, epoch, in sync, lag)"
                      ).set_defaults(run=_broker_list)
    broker.add_parser("status", parents=[common], help="store, free disk, transactions and limits of every "
                                                       "serving broker").set_defaults(run=_broker_status)
    p = broker.add_parser("elect", parents=[common], help="move a replicated shard's leadership to a replica")
    p.add_argument("shard", help="the shard (broker name)")
    p.add_argument("--replica", type=int, required=True, help="the in-sync replica id to lead")
    p.add_argument("--wait", type=_duration_arg, default=15.0, help="how long to wait for it to serve (default 15s)")
    p.set_defaults(run=_broker_elect)
    add_broker_commands(broker, common, _duration_arg)
    checker = commands.add_parser("checker", help="checkers").add_subparsers(dest="verb", required=True)
    checker.add_parser("list", parents=[common], help="live checkers").set_defaults(run=_checker_list)
    add_db_commands(commands, common)
    p = commands.add_parser("completion", help="print a shell completion script: "
                                               "eval \"$(txmq completion bash)\" (zsh: after bashcompinit)")
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(run=None)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _version() -> str:
    try:
        return metadata.version("txmq")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def completion_script(parser: argparse.ArgumentParser) -> str:
    """A bash completion function for ``txmq`` built from the parser: commands, their
    verbs and options (zsh loads it through bashcompinit)."""
    def options(p: argparse.ArgumentParser) -> list[str]:
        return sorted(o for a in p._actions for o in a.option_strings if o.startswith("--"))

    def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for a in p._actions:  # argparse keeps its tree here
            if isinstance(a, argparse._SubParsersAction):
                return dict(a.choices)
        return {}

    cases = []
    nouns = subcommands(parser)
    for noun, sub in nouns.items():
        verbs = subcommands(sub)
        cases.append(f'    "{noun}") words="{" ".join(verbs) or " ".join(options(sub))}" ;;')
        for verb, leaf in verbs.items():
            cases.append(f'    "{noun} {verb}") words="{" ".join(options(leaf))}" ;;')
    return "\n".join([
        "# txmq shell completion (bash; zsh: autoload -U bashcompinit && bashcompinit first)",
        "_txmq() {",
        "  local cur=${COMP_WORDS[COMP_CWORD]} path=\"\" w words",
        "  for w in \"${COMP_WORDS[@]:1:COMP_CWORD-1}\"; do",
        "    case $w in -*) ;; *) [ -z \"$path\" ] && path=$w || { [ \"${path#* }\" = \"$path\" ] && "
        "path=\"$path $w\"; } ;; esac",
        "  done",
        "  case $path in",
        f'    "") words="{" ".join(nouns)} {" ".join(options(parser))}" ;;',
        *cases,
        "    *) words=\"\" ;;",
        "  esac",
        "  COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))",
        "}",
        "complete -o default -F _txmq txmq",
        ""])


def _default_operator() -> str:
    try:
        return os.environ.get("USER") or getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name: the operator must say who
        return ""


#: JSON fields whose empty string is a value (an empty body), not a missing one.
_EMPTY_IS_VALUE = frozenset({"body_utf8", "body_base64"})


def json_nulls(data: Any) -> Any:
    """``data`` as ``--json`` prints it: a missing value is null, never ``""``."""
    if isinstance(data, dict):
        return {k: (v if k in _EMPTY_IS_VALUE else json_nulls(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [json_nulls(v) for v in data]
    return None if data == "" else data


def error_json(err: TxmqError | None, message: str = "", *, usage: bool = False) -> str:
    """An error as ``--json`` prints it (one line on stderr): ``code`` (the gRPC status
    name, ``USAGE`` for a command line the CLI refused), ``reason``, ``message``, ``field``
    (the request field it names, or null) and ``details``."""
    if err is None:
        body: dict[str, Any] = {"code": "USAGE" if usage else "UNKNOWN", "reason": None, "message": message,
                                "field": None, "details": {}}
    else:
        details = {k: v for k, v in err.details.items() if k != "field"}
        body = {"code": err.code.name, "reason": err.reason, "message": err.message,
                "field": err.details.get("field") or None, "details": json.loads(json.dumps(details, default=str))}
    return json.dumps({"error": body}, sort_keys=False)


def flag_named(message: str, err: TxmqError, flags: dict[str, str]) -> str:
    """The refused request field that starts ``message``, named as the command's option
    (``broker_name: required ...`` is ``--broker: required ...`` for ``message print``):
    the operator reads the flag to fix. ``--json`` keeps the field (the API's name)."""
    field = err.details.get("field")
    flag = flags.get(field) if isinstance(field, str) else None
    return f"{flag}{message[len(field):]}" if flag and field and message.startswith(f"{field}:") else message


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are JSON under ``--json`` (set by :func:`main`)."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if _Parser.json_errors:
            self.exit(2, error_json(None, f"{self.prog}: {message}", usage=True) + "\n")
        super().error(message)


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    _Parser.json_errors = "--json" in argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        _Parser.json_errors = False
    nameserver = getattr(args, "nameserver", None) or os.environ.get("TXMQ_NAMESERVER") or DEFAULT_NAMESERVER
    as_json = getattr(args, "json", False)

    def fail(err: TxmqError | None, message: str) -> None:
        if err is not None and not as_json:
            message = flag_named(message, err, getattr(args, "field_flags", None) or {})
        stderr.write((error_json(err, message) if as_json else f"txmq: {message}") + "\n")

    if getattr(args, "verb", None) == "resolve" and args.noun == "txn":
        args.operator = args.operator or _default_operator()
        if not args.operator:
            fail(None, "--operator is required (no $USER to default to)")
            return 2
    if getattr(args, "verb", None) in ("reset", "delete", "delete-producer") and args.noun == "group":
        args.operator = args.operator or _default_operator()  # the principal, with auth on

    def out(data: Any, table: Callable[[], str]) -> None:
        stdout.write((json.dumps(json_nulls(data), indent=2, sort_keys=False) if as_json else table()) + "\n")

    try:
        if args.noun == "completion":
            stdout.write(completion_script(parser))
            stdout.flush()
            return 0
        if args.noun == "db":
            try:
                run_db(args, out)
            except TxmqError as err:
                stderr.write(f"txmq: {err.message}\n")
                return 2
            except Exception as err:  # noqa: BLE001 - the database refused or is unreachable
                stderr.write(f"txmq: {type(err).__name__}: {str(err).strip()}\n")
                return 1
            stdout.flush()
            return 0
        try:
            admin = Admin(nameserver, request_timeout_seconds=getattr(args, "timeout", 10.0),
                          tls=tls_from_args(args),
                          token=getattr(args, "token", None) or os.environ.get("TXMQ_TOKEN") or None,
                          namespace=getattr(args, "namespace", None) or os.environ.get("TXMQ_NAMESPACE") or "")
            _in_namespace(args, admin.namespace)
        except TxmqError as err:
            fail(err, err.message)
            return 2
        try:
            args.run(admin, args, out)
            stdout.flush()
        except TxmqError as err:
            stdout.flush()
            fail(err, err.message)
            return 1
        except OSError as err:
            if isinstance(err, BrokenPipeError):
                raise
            fail(None, str(err))  # --body-out FILE not writable
            return 1
        finally:
            admin.close()
    except BrokenPipeError:
        # The reader stopped early (``| head``, ``| true``): not an error of ours. Later
        # flushes (at exit) must not fail again, so stdout goes to /dev/null from here.
        _silence(stdout)
        return 0
    return 0


def _silence(stream: TextIO) -> None:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def run() -> None:
    raise SystemExit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
