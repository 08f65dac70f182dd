"""``txmq --json`` (issue 32, item 5): errors are one JSON object on stderr (code, reason,
message, field, details) — for a refused request, a bad command line and a client that
cannot start —, and a value that is not there is null, never "" (an empty body excepted:
it is a value)."""

from __future__ import annotations

import io
import json

from txmq._cli import error_json, json_nulls, main
from txmq.errors import InvalidFieldError, TopicNotFoundError


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_missing_values_are_null_and_an_empty_body_stays_a_value() -> None:
    data = {"operator": "", "keys": [], "nested": {"reason": "", "n": 0, "ok": False}, "rows": [{"tag": ""}],
            "body_utf8": "", "body_base64": ""}
    assert json_nulls(data) == {"operator": None, "keys": [], "nested": {"reason": None, "n": 0, "ok": False},
                                "rows": [{"tag": None}], "body_utf8": "", "body_base64": ""}


def test_an_error_names_its_code_reason_and_field() -> None:
    error = json.loads(error_json(InvalidFieldError("limit", "must be positive")))["error"]
    assert error == {"code": "INVALID_ARGUMENT", "reason": "INVALID_FIELD", "message": "limit: must be positive",
                     "field": "limit", "details": {"problem": "must be positive"}}
    error = json.loads(error_json(TopicNotFoundError("orders")))["error"]
    assert error["code"] == "NOT_FOUND" and error["field"] is None and error["details"] == {"topic": "orders"}


def test_a_bad_command_line_is_a_json_usage_error_under_json(capsys) -> None:
    code, out, _err = run("--json", "group", "reset", "g", "--topic", "t")  # argparse writes to sys.stderr
    assert code == 2 and out == ""
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["code"] == "USAGE" and "--to-earliest" in error["message"]
    code, _out, _err = run("group", "reset", "g", "--topic", "t")  # without --json: argparse's text
    assert code == 2 and capsys.readouterr().err.startswith("usage:")


def test_a_client_that_cannot_start_answers_json_too() -> None:
    code, _out, err = run("--json", "--namespace", "bad namespace!", "topic", "list")
    assert code == 2
    error = json.loads(err)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and error["field"] == "namespace"


def test_no_name_server_is_a_json_unavailable() -> None:
    code, _out, err = run("--json", "--nameserver", "127.0.0.1:1", "--timeout", "2s", "topic", "list")
    assert code == 1 and json.loads(err)["error"]["code"] in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
