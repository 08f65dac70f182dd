"""The txmq CLI without a cluster: durations, tables, argument handling and exit codes.
(The commands against real services are exercised in tests/integration/test_checks.py.)"""

from __future__ import annotations

import io
import json

import pytest

from txmq import _cli
from txmq.v1 import common_pb2


@pytest.mark.parametrize("text, seconds", [
    ("60s", 60.0), ("5m", 300.0), ("1h", 3600.0), ("2d", 172800.0), ("250ms", 0.25),
    ("42", 42.0), ("1.5h", 5400.0), (".5s", 0.5), (" 10 s ", 10.0), ("0", 0.0),
])
def test_parse_duration_accepts_units_and_plain_seconds(text, seconds):
    assert _cli.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "5x", "-5s", "1h30m", "abc", "1e999", "5 minutes"])
def test_parse_duration_refuses_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="duration"):
        _cli.parse_duration(text)


@pytest.mark.parametrize("seconds, text", [
    (0.0, "0ms"), (0.85, "850ms"), (1.0, "1s"), (2.5, "2.5s"), (42.0, "42s"), (303.0, "5m03s"),
    (7500.0, "2h05m"), (273600.0, "3d04h"), (-5.0, "-5s"),
])
def test_format_duration(seconds, text):
    assert _cli.format_duration(seconds) == text


def test_format_table_aligns_columns():
    text = _cli.format_table(["A", "LONGER"], [["x", 1], ["yyyy", None]])
    assert text.splitlines() == ["A     LONGER", "x     1", "yyyy"]


def test_transaction_dict_names_states_and_ages():
    t = common_pb2.Transaction(transaction_id="T1", state=common_pb2.TRANSACTION_STATE_DISCARDED,
                               producer_group="g", prepared_at_ms=1_000, checks_delivered=3,
                               discard_reason="budget", resolution_source=common_pb2.TRANSACTION_SOURCE_BROKER)
    row = _cli.transaction_dict(t, now_ms=61_000)
    assert row["state"] == "discarded"
    assert row["age_seconds"] == 60.0
    assert row["checks_delivered"] == 3
    assert row["resolution_source"] == "broker"
    assert row["prepared_at"].startswith("1970-01-01T00:00:01")
    json.dumps(row)  # --json output must be serialisable


def run(argv, env=None, monkeypatch=None):
    out, err = io.StringIO(), io.StringIO()
    code = _cli.main(argv, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_usage_errors_exit_2(capsys):
    assert run([])[0] == 2
    assert run(["txn", "list", "--older-than", "soon"])[0] == 2
    assert run(["txn", "list", "--state", "weird"])[0] == 2
    assert run(["txn", "resolve", "T1", "--reason", "x"])[0] == 2  # neither --commit nor --rollback
    assert run(["txn", "resolve", "T1", "--commit", "--rollback", "--reason", "x"])[0] == 2
    assert "not a duration" in capsys.readouterr().err


def test_common_options_go_before_or_after_the_command():
    parser = _cli.build_parser()
    before = parser.parse_args(["--json", "--nameserver", "h:1", "txn", "list", "--state", "pending"])
    after = parser.parse_args(["txn", "list", "--state", "pending", "--json", "--nameserver", "h:1"])
    for args in (before, after):
        assert args.json is True and args.nameserver == "h:1" and args.state == "pending"
    assert parser.parse_args(["txn", "list", "--older-than", "5m"]).older_than == 300.0


def test_a_failed_request_prints_the_error_and_exits_1():
    # Nothing listens on port 1: UNAVAILABLE, reported as the TxmqError message.
    code, out, err = run(["--nameserver", "127.0.0.1:1", "--timeout", "2s", "broker", "list"])
    assert code == 1
    assert out == ""
    assert err.startswith("txmq: ")


def test_resolve_operator_defaults_to_user(monkeypatch):
    monkeypatch.setenv("USER", "alice")
    assert _cli._default_operator() == "alice"


def test_tables_are_cut_to_the_terminal_but_not_when_piped(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert _cli.terminal_width() is None  # pytest's stdout is no terminal: whole values
    monkeypatch.setenv("COLUMNS", "40")
    assert _cli.terminal_width() == 40
    text = _cli.format_table(["TRANSACTION", "STATE", "REASON"],
                             [["T" * 20, "discarded", "check budget spent: 15 checks delivered"]], 45)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 45
    assert lines[1].startswith("T" * 20 + "  discarded") and lines[1].endswith("…")


def test_body_preview_never_writes_raw_bytes():
    assert _cli.body_preview(b"order 42\n") == "order 42\\n"
    binary = _cli.body_preview(bytes(range(40)))
    assert binary.startswith("<binary, 40 bytes> 00 01 02") and "\x00" not in binary
    assert _cli.body_preview(b"x" * 600).endswith("(88 more bytes)")
