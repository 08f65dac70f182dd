"""The CLI's text for an operator (issue 32, item 5): a refused field is named as the
command's option (``--broker``, not ``broker_name``), and ``group describe`` shows one
reset once, not once per broker that recorded it, and names the brokers when they differ."""

from __future__ import annotations

from typing import Any

import pytest

from txmq._cli import build_parser, flag_named, last_reset_lines
from txmq.errors import InvalidFieldError, TopicNotFoundError


@pytest.mark.parametrize(("argv", "field", "flag"), [
    (["message", "print", "t", "--queue", "0", "--offset", "0"], "broker_name", "--broker"),
    (["message", "print", "t", "--queue", "0", "--offset", "0"], "limit", "--count"),
    (["message", "find", "t", "--key", "k"], "key", "--key"),
    (["group", "reset", "g", "--topic", "t", "--shift", "1"], "offsets", "--to-offset"),
    (["group", "reset", "g", "--topic", "t", "--shift", "1"], "timestamp_ms", "--to-time"),
])
def test_a_refused_field_is_named_as_the_commands_option(argv: list[str], field: str, flag: str) -> None:
    args = build_parser().parse_args(argv)
    err = InvalidFieldError(field, "required: 't' has queues on broker-0, broker-1")
    assert flag_named(err.message, err, args.field_flags) == f"{flag}: required: 't' has queues on broker-0, broker-1"


def test_other_errors_and_commands_keep_their_message() -> None:
    err = InvalidFieldError("broker_name", "required")
    assert flag_named(err.message, err, {}) == "broker_name: required"  # a command without a map
    assert flag_named(err.message, err, {"key": "--key"}) == "broker_name: required"
    missing = TopicNotFoundError("orders")
    assert flag_named(missing.message, missing, {"broker_name": "--broker"}) == missing.message


def queue(broker: str, queue_id: int, topic: str = "orders", **reset: Any) -> dict[str, Any]:
    return {"topic": topic, "broker": broker, "queue_id": queue_id,
            "last_reset": {"operator": "ops", "target": "shift", "reason": "replay", **reset} if reset else None}


def test_one_reset_recorded_by_every_broker_is_one_line_at_the_latest() -> None:
    queues = [queue("broker-0", 0, at="2026-12-02T03:09:29.431+00:00"),
              queue("broker-0", 1, at="2026-12-02T03:09:29.431+00:00"),
              queue("broker-1", 0, at="2026-12-02T03:09:29.471+00:00")]
    assert last_reset_lines(queues) == ["last reset of orders: 2026-12-02T03:09:29.471+00:00 by ops (to shift): replay"]


def test_brokers_naming_other_resets_are_named() -> None:
    queues = [queue("broker-0", 0, at="2026-12-02T03:00:00.000+00:00", target="offset", reason=""),
              queue("broker-0", 1, at="2026-12-02T03:00:00.000+00:00", target="offset", reason=""),
              queue("broker-1", 0, at="2026-12-01T03:00:00.000+00:00"),
              queue("broker-2", 0)]
    assert last_reset_lines(queues) == [
        "last reset of orders: 2026-12-02T03:00:00.000+00:00 by ops (to offset) (on broker-0 only)",
        "last reset of orders: 2026-12-01T03:00:00.000+00:00 by ops (to shift): replay (on broker-1 only)"]


def test_the_latest_topics_first_and_never_reset_ones_left_out() -> None:
    queues = [queue("b", 0, topic=f"t{i}", at=f"2026-12-0{i}T00:00:00.000+00:00") for i in range(1, 6)]
    queues.append(queue("b", 0, topic="quiet"))
    assert [line.split(":")[0] for line in last_reset_lines(queues)] == [
        "last reset of t5", "last reset of t4", "last reset of t3"]
