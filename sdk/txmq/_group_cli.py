"""``txmq group reset``, ``txmq group clients`` and ``txmq message get|find|print``: the
operator's commands for a group's position, its clients, and finding messages.

    txmq group reset GROUP --topic T (--to-earliest | --to-latest | --to-time TIME |
                     --to-offset [BROKER/]QUEUE:OFFSET ... | --shift N)
                     [--dry-run | --execute] [--force] [--reason TEXT] [--operator NAME]
    txmq group delete GROUP [--dry-run] [--force] [--dead-letters] [--reason TEXT] [--operator NAME]
    txmq group delete-producer GROUP [--dry-run] [--force] [--discarded] [--reason TEXT] [--operator NAME]
    txmq group clients GROUP
    txmq message get MESSAGE_ID [--body-out FILE]
    txmq message find TOPIC --key KEY [--limit N] [--since 1h] [--until TIME]
    txmq message print TOPIC --queue Q --offset O [--broker SHARD] [--count N]

``group reset`` is a dry run unless ``--execute``: it prints, per queue, the group's
current offset, the new one and how the lag changes. ``--to-time`` takes an ISO 8601 time
(``2026-12-01T09:30:00Z``; one without a zone is UTC) or how long ago (``15m ago``,
``-15m``).

``group delete`` deletes at once unless ``--dry-run``: it prints, per broker, what went
(positions, deliveries in flight, reset records, clients) and whether the group's dead
letters were kept (the default) or deleted (``--dead-letters``).

``group delete-producer`` deletes a producer group (its counters, metric series and quota
place): a verb of its own, since a name does not say which kind of group it is, and the
rules differ (no ``--force`` goes past a transaction not ended).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
from typing import Any, Callable

from ._errors import InvalidFieldError, TxmqError
from ._ids import MessageId, TransactionId
from ._resets import ResetResult, parse_to_offset
from .v1 import broker_pb2, common_pb2

Output = Callable[[Any, Callable[[], str]], None]
_AGO = re.compile(r"^\s*(?:-\s*(?P<a>.+?)|(?P<b>.+?)\s+ago)\s*$")


def parse_time(text: str, field: str, parse_duration: Callable[[str], float],
               now: _dt.datetime | None = None) -> _dt.datetime:
    """An ISO 8601 time (UTC when it names no zone) or ``15m ago`` / ``-15m`` (a duration
    as ``parse_duration`` reads it)."""
    now = now or _dt.datetime.now(tz=_dt.UTC)
    match = _AGO.match(text)
    if match:
        try:
            return now - _dt.timedelta(seconds=parse_duration(match.group("a") or match.group("b")))
        except ValueError as exc:
            raise InvalidFieldError(field, str(exc)) from None
    try:
        when = _dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidFieldError(field, f"{text!r} is not an ISO 8601 time (2026-12-01T09:30:00Z) nor a time ago "
                                       "(15m ago, -15m)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=_dt.UTC)


def _iso(ms: int) -> str | None:
    if not ms:
        return None
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC).isoformat(timespec="milliseconds")


# --- group reset / clients -----------------------------------------------------------------

def reset_dict(result: ResetResult) -> dict[str, Any]:
    return {"consumer_group": result.consumer_group, "topic": result.topic, "applied": result.applied,
            "operator": result.operator or None,
            "queues": [{"broker": q.broker_name, "queue_id": q.queue_id, "current_offset": q.current_offset,
                        "new_offset": q.new_offset, "min_offset": q.min_offset, "max_offset": q.max_offset,
                        "lag_before": q.lag_before, "lag_after": q.lag_after, "lag_change": q.lag_change,
                        "inflight_invalidated": q.inflight_invalidated, "asked_offset": q.asked_offset,
                        "clamped": q.clamped} for q in result.queues],
            "live_consumers": [{"client_id": c.client_id, "address": c.address, "broker": c.broker_name,
                                "waiting": c.waiting, "last_seen": _iso(c.last_seen_ms)}
                               for c in result.live_consumers],
            "unreachable_brokers": list(result.unreachable_brokers)}


def _group_reset(admin: Any, args: argparse.Namespace, out: Output, helpers: Any) -> None:
    table = helpers.table
    offsets: dict[Any, int] = {}
    for given in args.to_offset or []:
        broker, queue, offset = parse_to_offset(given)
        offsets[(broker, queue) if broker else queue] = offset
    result = admin.reset_offsets(
        args.group, args.topic, to_earliest=args.to_earliest, to_latest=args.to_latest,
        to_time=parse_time(args.to_time, "to_time", helpers.parse_duration) if args.to_time else None, to_offsets=offsets or None,
        shift=args.shift, dry_run=not args.execute, force=args.force, reason=args.reason or "",
        operator=args.operator or "")
    data = reset_dict(result)

    def text() -> str:
        body: str = table(["BROKER", "QUEUE", "CURRENT", "NEW", "LAG BEFORE", "LAG AFTER", "CHANGE", "IN FLIGHT"],
                     [[q["broker"], q["queue_id"], q["current_offset"], q["new_offset"], q["lag_before"],
                       q["lag_after"], f"{q['lag_change']:+d}", q["inflight_invalidated"]] for q in data["queues"]])
        lines = [body]
        lines.extend(f"{q.broker_name}/{q.queue_id}: asked {q.asked_offset}, the queue holds {q.min_offset}.."
                     f"{q.max_offset}: NEW is {q.new_offset}" for q in result.queues if q.clamped)
        if result.live_consumers:
            lines.append(f"live consumers of {args.topic} in {args.group}: " + ", ".join(
                f"{c.client_id}@{c.broker_name}" for c in result.live_consumers)
                + ("" if result.applied else " (an --execute is refused while they run, unless --force)"))
        if result.applied:
            lines.append(f"reset {args.group} in {args.topic} (by {result.operator}): its next receive reads from NEW; "
                         "deliveries in flight were invalidated (their acks now fail)")
        else:
            lines.append("dry run: nothing changed (run it again with --execute)")
        if result.unreachable_brokers:
            lines.append(f"unreachable brokers (not shown): {', '.join(result.unreachable_brokers)}")
        lines.append("CHANGE: messages the group receives again (+) or skips (-); IN FLIGHT: deliveries the reset "
                     "invalidates")
        return "\n".join(lines)
    out(data, text)


def deletion_dict(response: Any) -> dict[str, Any]:
    return {"consumer_group": response.consumer_group, "applied": response.applied,
            "operator": response.operator or None,
            "brokers": [{"broker": d.broker_name, "topics": list(d.topics), "cursors": d.cursors,
                         "inflight": d.inflight, "resets": d.resets, "clients": d.clients,
                         "dead_letters": d.dead_letters, "dead_letter_topic_deleted": d.dead_letter_topic_deleted}
                        for d in response.brokers],
            "live_consumers": [{"client_id": c.client_id, "address": c.address, "broker": c.broker_name,
                                "waiting": c.waiting, "last_seen": _iso(c.last_seen_ms)}
                               for c in response.live_consumers],
            "unreachable_brokers": list(response.unreachable_brokers)}


def _group_delete(admin: Any, args: argparse.Namespace, out: Output, helpers: Any) -> None:
    table = helpers.table
    response = admin.delete_consumer_group(args.group, force=args.force, dry_run=args.dry_run,
                                           dead_letters=args.dead_letters, reason=args.reason or "",
                                           operator=args.operator or "")
    data = deletion_dict(response)

    def text() -> str:
        body: str = table(["BROKER", "TOPICS", "POSITIONS", "IN FLIGHT", "RESETS", "CLIENTS", "DEAD LETTERS"],
                     [[b["broker"], ", ".join(b["topics"]), b["cursors"], b["inflight"], b["resets"], b["clients"],
                       f"{b['dead_letters']} ({'deleted' if b['dead_letter_topic_deleted'] else 'kept'})"]
                      for b in data["brokers"]])
        lines = [body]
        if response.live_consumers:
            lines.append(f"live consumers of {args.group}: " + ", ".join(
                f"{c.client_id}@{c.broker_name}" for c in response.live_consumers)
                + ("" if response.applied else " (a deletion is refused while they run, unless --force)"))
        if response.applied:
            lines.append(f"deleted {args.group} (by {response.operator}): its next receive starts it as a new group; "
                         "deliveries in flight were invalidated (their acks now fail)")
            if not args.dead_letters:
                lines.append(f"its dead letters (%DLQ%{args.group}) were kept: --dead-letters deletes them too")
        return "\n".join(_deletion_end(response, lines))
    out(data, text)


def _deletion_end(response: Any, lines: list[str]) -> list[str]:
    """The last lines of a group deletion's report: a dry run said, the brokers not reached."""
    if not response.applied:
        lines.append("dry run: nothing changed (run it again without --dry-run)")
    if response.unreachable_brokers:
        lines.append(f"unreachable brokers (not deleted there: run it again once they are back): "
                     f"{', '.join(response.unreachable_brokers)}")
    return lines


def producer_deletion_dict(response: Any) -> dict[str, Any]:
    return {"producer_group": response.producer_group, "applied": response.applied,
            "operator": response.operator or None,
            "brokers": [{"broker": d.broker_name, "counters": d.counters, "pending": d.pending,
                         "discarded": d.discarded, "global_pushes": d.global_pushes,
                         "discard_topic": d.discard_topic, "discard_topic_deleted": d.discard_topic_deleted}
                        for d in response.brokers],
            "live_producers": [{"client_id": c.client_id, "kind": c.kind, "broker": c.broker_name,
                                "last_seen": _iso(c.last_seen_ms)} for c in response.live_producers],
            "unreachable_brokers": list(response.unreachable_brokers)}


def _group_delete_producer(admin: Any, args: argparse.Namespace, out: Output, helpers: Any) -> None:
    table = helpers.table
    response = admin.delete_producer_group(args.group, force=args.force, dry_run=args.dry_run,
                                           discard_topic=args.discarded, reason=args.reason or "",
                                           operator=args.operator or "")
    data = producer_deletion_dict(response)

    def text() -> str:
        body: str = table(["BROKER", "COUNTERS", "PREPARED", "DISCARDED", "GLOBAL PUSHES", "DISCARD TOPIC"],
                          [[b["broker"], "yes" if b["counters"] else "no", b["pending"], b["discarded"],
                            b["global_pushes"], ("deleted" if b["discard_topic_deleted"] else "kept")
                            if b["discard_topic"] else "-"] for b in data["brokers"]])
        lines = [body]
        if any(b["pending"] or b["discarded"] or b["global_pushes"] for b in data["brokers"]):
            lines.append(f"{args.group} has transactions not ended: a deletion is refused until they are "
                         "decided (txmq txn resolve), --force or not")
        if response.live_producers:
            lines.append(f"live producers of {args.group}: " + ", ".join(
                f"{c.client_id}@{c.broker_name} ({c.kind})" for c in response.live_producers)
                + ("" if response.applied else " (a deletion is refused while they run, unless --force)"))
        if response.applied:
            lines.append(f"deleted {args.group} (by {response.operator}): its next half message makes it anew; "
                         "its ended transactions stay")
            if not args.discarded:
                lines.append(f"its discard topic (%DISCARD%{args.group}) was kept: --discarded deletes it too")
        return "\n".join(_deletion_end(response, lines))
    out(data, text)


def _group_clients(admin: Any, args: argparse.Namespace, out: Output, helpers: Any) -> None:
    table = helpers.table
    response = admin.group_clients(args.group)
    clients = [{"kind": c.kind, "client_id": c.client_id, "address": c.address or None, "broker": c.broker_name,
                "topics": list(c.topics), "last_seen": _iso(c.last_seen_ms),
                "waiting": c.waiting if c.kind in ("consumer", "checker") else None,
                "capacity": c.capacity if c.kind == "checker" else None} for c in response.clients]
    data = {"group": args.group, "clients": clients, "unreachable_brokers": list(response.unreachable_brokers)}

    def text() -> str:
        body: str = table(["KIND", "CLIENT", "ADDRESS", "BROKER", "TOPICS", "LAST SEEN (UTC)", "STATE"],
                     [[c["kind"], c["client_id"], c["address"] or "", c["broker"], ", ".join(c["topics"]),
                       (c["last_seen"] or "")[11:23],
                       ("waiting in a receive" if c["waiting"] else "") if c["kind"] == "consumer"
                       else f"credit {c['capacity']}" + (", claim held" if c["waiting"] else "")]
                      for c in clients])
        body += f"\n{len(clients)} client(s) of {args.group}"
        if not clients:
            body += (": no consumer received from it and no checker claimed its checks lately "
                     "(within the brokers' consumer_session_seconds)")
        if response.unreachable_brokers:
            body += f"; unreachable brokers (incomplete): {', '.join(response.unreachable_brokers)}"
        return body
    out(data, text)


# --- messages --------------------------------------------------------------------------------

_STATES = {common_pb2.TRANSACTION_STATE_PREPARED: "pending", common_pb2.TRANSACTION_STATE_COMMITTED: "committed",
           common_pb2.TRANSACTION_STATE_ROLLED_BACK: "rolled-back",
           common_pb2.TRANSACTION_STATE_DISCARDED: "discarded"}


def found_dict(found: Any, message_dict: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    d = found.message
    return {"message_id": d.message.message_id, "topic": d.topic, "broker": d.broker_name, "queue_id": d.queue_id,
            "queue_offset": d.queue_offset if d.queue_offset >= 0 else None,
            "transaction_id": d.transaction_id or None,
            "transaction_state": _STATES.get(found.transaction_state),
            "scheduled": found.scheduled, "stored_at": _iso(d.stored_at_ms), "visible_at": _iso(d.visible_at_ms),
            **{k: v for k, v in message_dict(d.message).items() if k != "topic"}}


def _message_get(admin: Any, args: argparse.Namespace, out: Output, helpers: Any) -> None:
    found = admin.get_message(args.message_id)
    if args.body_out:
        with open(args.body_out, "wb") as f:
            f.write(found.message.message.body)
    data = found_dict(found, helpers.message_dict)

    def text() -> str:
        shown = {k: v for k, v in data.items() if k not in ("body_utf8", "body_base64")}
        shown["body"] = (f"written to {args.body_out}" if args.body_out
                         else helpers.body_preview(found.message.message.body))
        if data["transaction_state"] and data["transaction_state"] != "committed":
            shown["note"] = (f"a half message ({data['transaction_state']}): not visible to consumers; "
                             f"txmq txn describe {data['transaction_id']}")
        elif data["scheduled"]:
            shown["note"] = "waits for its delivery time (not yet in its queue)"
        described: str = helpers.describe_text(shown)
        return described
    out(data, text)


def _message_find(admin: Any, args: argparse.Namespace, out: Output, helpers: Any) -> None:
    response = admin.find_messages(args.topic, args.key, limit=args.limit,
                                   begin=parse_time(args.since, "since", helpers.parse_duration) if args.since else None,
                                   end=parse_time(args.until, "until", helpers.parse_duration) if args.until else None)
    rows = [found_dict(f, helpers.message_dict) for f in response.messages]
    data = {"topic": args.topic, "key": args.key, "messages": rows, "truncated": response.truncated,
            "unreachable_brokers": list(response.unreachable_brokers)}

    def text() -> str:
        body: str = helpers.table(["MESSAGE ID", "BROKER", "QUEUE", "OFFSET", "VISIBLE (UTC)", "TAG", "KEYS", "BODY"],
                             [[r["message_id"], r["broker"], r["queue_id"], r["queue_offset"],
                               (r["visible_at"] or "")[:23], r["tag"] or "", ",".join(r["keys"]),
                               helpers.body_preview(f.message.message.body, 60)]
                              for r, f in zip(rows, response.messages)])
        body += f"\n{len(rows)} message(s) with key {args.key!r}, newest first"
        if response.truncated:
            body += f"; cut at --limit {args.limit} per broker (narrow with --since/--until)"
        if response.unreachable_brokers:
            body += f"; unreachable brokers (incomplete): {', '.join(response.unreachable_brokers)}"
        body += "\nhalf messages (not committed) are not listed: txmq txn list --key KEY"
        return body
    out(data, text)


def _message_print(admin: Any, args: argparse.Namespace, out: Output, helpers: Any) -> None:
    response = admin.read_messages(args.topic, args.queue, args.offset, broker=args.broker or "", limit=args.count)
    rows = [found_dict(f, helpers.message_dict) for f in response.messages]
    data = {"topic": args.topic, "queue_id": args.queue, "min_offset": response.min_offset,
            "max_offset": response.max_offset, "messages": rows}

    def text() -> str:
        if not rows:
            return (f"nothing at offset {args.offset} of queue {args.queue} (it holds {response.min_offset}.."
                    f"{response.max_offset - 1})" if response.max_offset > response.min_offset
                    else f"queue {args.queue} of {args.topic} is empty (next offset {response.max_offset})")
        blocks: list[str] = []
        for r, f in zip(rows, response.messages):
            shown = {k: v for k, v in r.items() if k not in ("body_utf8", "body_base64")}
            shown["body"] = helpers.body_preview(f.message.message.body)
            blocks.append(helpers.describe_text(shown))
        return "\n\n".join(blocks)
    out(data, text)


def describe_by_message_id(admin: Any, message_id: str) -> str:
    """``txn describe MESSAGE_ID``: the transaction id of a transactional message (a
    TxmqError naming the id for a normal message)."""
    found: broker_pb2.FoundMessage = admin.get_message(message_id)
    if not found.message.transaction_id:
        raise TxmqError(f"message {message_id} is not transactional (a normal message of "
                        f"{found.message.topic}): txmq message get {message_id}")
    return found.message.transaction_id


def is_message_id(text: str) -> bool:
    """Whether ``text`` is a txmq message id (not a transaction id)."""
    try:
        MessageId.decode(text)
    except TxmqError:
        return False
    try:
        TransactionId.decode(text)
    except TxmqError:
        return True
    return False


def add_group_commands(group: Any, common: argparse.ArgumentParser, run: Callable[..., Any]) -> None:
    """``group reset`` and ``group clients``; ``run(handler)`` is the command's ``run``,
    calling ``handler(admin, args, out, helpers)`` with the CLI's helpers (``table``,
    ``message_dict``, ``body_preview``, ``describe_text``, ``parse_duration``)."""
    p = group.add_parser("reset", parents=[common], help="move a group's position in a topic (a dry run unless "
                                                          "--execute)")
    p.add_argument("group")
    p.add_argument("--topic", required=True)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the oldest retained message of each queue")
    target.add_argument("--to-latest", action="store_true", help="each queue's end: skip everything stored so far")
    target.add_argument("--to-time", metavar="TIME", help="the first message visible at TIME or later "
                                                          "(2026-12-01T09:30:00Z, '15m ago', -15m)")
    target.add_argument("--to-offset", metavar="[BROKER/]QUEUE:OFFSET", action="append",
                        help="these queues to these offsets (repeatable; BROKER when the topic spans brokers)")
    target.add_argument("--shift", type=int, metavar="N", help="each queue's acknowledged offset plus N "
                                                               "(negative: back)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="show what would change (the default)")
    mode.add_argument("--execute", action="store_true", help="do it")
    p.add_argument("--force", action="store_true", help="even while the group has live consumers of the topic "
                                                        "(their deliveries in flight are invalidated)")
    p.add_argument("--reason", help="why (recorded with the reset)")
    p.add_argument("--operator", help="who (default $USER; with auth on the token's principal is recorded)")
    p.set_defaults(run=run(_group_reset), field_flags={"offsets": "--to-offset", "timestamp_ms": "--to-time",
                                                       "operator": "--operator"})
    p = group.add_parser("delete", parents=[common], help="delete a consumer group on every broker: its positions, "
                         "deliveries in flight, reset records and clients (dead letters kept unless --dead-letters)")
    p.add_argument("group")
    p.add_argument("--dry-run", action="store_true", help="show what would be deleted, change nothing")
    p.add_argument("--force", action="store_true", help="even while the group has live consumers (their deliveries "
                   "in flight are invalidated)")
    p.add_argument("--dead-letters", action="store_true", help="also delete %%DLQ%%GROUP and its dead letters")
    p.add_argument("--reason", help="why (logged with the deletion)")
    p.add_argument("--operator", help="who (default $USER; with auth on the token's principal is recorded)")
    p.set_defaults(run=run(_group_delete))
    p = group.add_parser("delete-producer", parents=[common], help="delete a producer group on every broker: its "
                         "counters, metric series and quota place (refused while it has transactions not ended; "
                         "%%DISCARD%% kept unless --discarded)")
    p.add_argument("group")
    p.add_argument("--dry-run", action="store_true", help="show what would be deleted and what blocks it, "
                   "change nothing")
    p.add_argument("--force", action="store_true", help="even while the group has live producers (they make it "
                   "anew when they send); never past transactions not ended")
    p.add_argument("--discarded", action="store_true", help="also delete %%DISCARD%%GROUP and its messages")
    p.add_argument("--reason", help="why (logged with the deletion)")
    p.add_argument("--operator", help="who (default $USER; with auth on the token's principal is recorded)")
    p.set_defaults(run=run(_group_delete_producer))
    p = group.add_parser("clients", parents=[common], help="a group's clients: a consumer group's live receivers, a "
                                                            "producer group's checkers")
    p.add_argument("group")
    p.set_defaults(run=run(_group_clients))


def add_message_commands(commands: Any, common: argparse.ArgumentParser, run: Callable[..., Any],
                         positive: Callable[[str], int]) -> None:
    message = commands.add_parser("message", help="find messages: by id, by key, by queue and offset"
                                  ).add_subparsers(dest="verb", required=True)
    p = message.add_parser("get", parents=[common], help="one message by its message id")
    p.add_argument("message_id")
    p.add_argument("--body-out", metavar="FILE", help="write the body, raw, to FILE")
    p.set_defaults(run=run(_message_get))
    p = message.add_parser("find", parents=[common], help="a topic's messages by key, newest first")
    p.add_argument("topic")
    p.add_argument("--key", required=True)
    p.add_argument("--limit", type=positive, default=32, help="most messages per broker (default 32, at most 1000)")
    p.add_argument("--since", metavar="TIME", help="stored at TIME or later ('1h ago', ISO 8601)")
    p.add_argument("--until", metavar="TIME", help="stored before TIME")
    p.set_defaults(run=run(_message_find), field_flags={"key": "--key", "limit": "--limit"})
    p = message.add_parser("print", parents=[common], help="messages of one queue from an offset (nothing is "
                                                            "delivered)")
    p.add_argument("topic")
    p.add_argument("--queue", type=int, required=True)
    p.add_argument("--offset", type=int, required=True)
    p.add_argument("--broker", help="the queue's broker (when the topic spans brokers)")
    p.add_argument("--count", type=positive, default=1, help="how many messages (default 1, at most 1000)")
    p.set_defaults(run=run(_message_print), field_flags={"broker_name": "--broker", "offset": "--offset",
                                                         "limit": "--count"})

