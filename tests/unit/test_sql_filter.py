"""The SQL92 filter parser and evaluator (services/broker/filters.py) against RocketMQ's
documented semantics: three-valued logic with NULL for a missing property, string
properties converted towards the literal's type, a conversion failure as no match, and
malformed expressions refused with the column of the error."""

from __future__ import annotations

import pytest

from services.broker.filters import (MAX_DEPTH, MAX_EXPRESSION_CHARS, FilterSyntaxError, SqlFilter,
                                     message_properties, parse_filter)
from txmq.errors import InvalidFieldError

T, F, N = True, False, None

FULL = {"a": "10", "s": "abc", "b": "true", "f": "2.5", "neg": "-3", "region": "eu-west", "TAGS": "TagA"}
EMPTY: dict[str, str] = {}

# expression, result with FULL, result with EMPTY (None = NULL: does not match)
TABLE = [
    # numeric comparisons: the property (a string) converted to the literal's type
    ("a > 5", T, N),
    ("a >= 10", T, N),
    ("a < 10", F, N),
    ("a <= 10", T, N),
    ("a = 10", T, N),
    ("a <> 10", F, N),
    ("a != 10", F, N),
    ("a = 10.0", T, N),
    ("f > 2.0", T, N),
    ("f > 2", N, N),  # "2.5" is not a long: RocketMQ converts to the literal's type
    ("f = 2.5", T, N),
    ("neg < -2", T, N),
    ("neg = -3", T, N),
    ("a > -5", T, N),
    ("a > 5L", T, N),
    ("a > 1E0", T, N),
    # a property that does not convert: the evaluation fails → no match
    ("s > 5", N, N),
    ("s = 5", N, N),
    ("s = 5 OR a = 10", N, N),  # RocketMQ fails the whole message, OR or not
    ("f = 2", N, N),  # "2.5" is not a long
    # strings: equality only
    ("s = 'abc'", T, N),
    ("s <> 'abc'", F, N),
    ("s = 'ABC'", F, N),
    ("region = 'eu-west'", T, N),
    ("'abc' = s", T, F),  # a literal on the left against NULL is FALSE, not NULL (RocketMQ)
    ("s = 'it''s'", F, N),
    # two properties compared by order: both as doubles
    ("a > f", T, N),
    ("s > a", N, N),
    # booleans
    ("b = TRUE", T, N),
    ("b = FALSE", F, N),
    ("TRUE", T, T),
    ("FALSE", F, F),
    ("b", F, N),  # a bare property is a boolean only if it is one (a string never is)
    # BETWEEN
    ("a BETWEEN 5 AND 10", T, N),
    ("a BETWEEN 11 AND 20", F, N),
    ("a NOT BETWEEN 11 AND 20", T, N),
    ("a not between 1 and 10", F, N),
    ("f BETWEEN 2.0 AND 3.0", T, N),
    ("f BETWEEN 2 AND 3", N, N),
    # IN: strings only
    ("s IN ('abc', 'def')", T, N),
    ("s IN ('x')", F, N),
    ("s NOT IN ('x', 'y')", T, N),
    ("s NOT IN ('abc')", F, N),
    ("TAGS IN ('TagA', 'TagB')", T, N),
    ("a IN ('10')", T, N),
    # IS NULL is never NULL
    ("a IS NULL", F, T),
    ("a IS NOT NULL", T, F),
    ("missing IS NULL", T, T),
    ("TAGS IS NOT NULL AND TAGS IN ('TagA')", T, F),
    # NOT on NULL stays NULL (so neither x nor NOT x matches a message without the property)
    ("NOT (a > 5)", F, N),
    ("NOT (a > 50)", T, N),
    ("NOT NOT (a > 5)", T, N),
    # AND / OR with NULL
    ("a > 5 AND s = 'abc'", T, N),
    ("a > 5 AND s = 'x'", F, N),
    ("missing = 1 AND a > 5", N, N),
    ("missing = 1 AND a > 50", F, N),
    ("missing = 1 OR a > 5", T, N),
    ("missing = 1 OR a > 50", N, N),
    ("a > 5 OR missing = 1", T, N),
    ("missing IS NULL OR a > 5", T, T),
    ("missing IS NULL AND a > 5", T, N),
    ("a > 50 AND missing = 1", F, N),
    ("FALSE AND missing = 1", F, F),
    ("TRUE OR missing = 1", T, T),
    # precedence: AND binds tighter than OR; parentheses group
    ("a = 1 OR a = 10 AND s = 'abc'", T, N),
    ("(a = 1 OR a = 10) AND s = 'x'", F, N),
    ("a = 1 OR (a = 10 AND s = 'x')", F, N),
    # CONTAINS / STARTSWITH / ENDSWITH: FALSE (not NULL) when the property is missing
    ("region CONTAINS 'west'", T, F),
    ("region NOT CONTAINS 'west'", F, F),
    ("region STARTSWITH 'eu'", T, F),
    ("region ENDSWITH 'west'", T, F),
    ("region NOT STARTSWITH 'us'", T, F),
    ("region NOT ENDSWITH 'east'", T, F),
    ("NOT (region CONTAINS 'x')", T, T),
    ("region CONTAINS ''", F, F),
    # keywords in any case, comments and whitespace
    ("a > 5 and s in ('abc') or not TRUE", T, N),
    ("a > 5 /* the amount */ AND -- a comment\n s = 'abc'", T, N),
    ("  a\t>\n5  ", T, N),
    # unary minus of a property is NULL (it is a string)
    ("-a < 0", N, N),
    ("+a > 5", T, N),
]


@pytest.mark.parametrize("expression,with_props,without", TABLE, ids=[t[0] for t in TABLE])
def test_expression_table(expression: str, with_props, without) -> None:
    f = SqlFilter(expression)
    assert f.evaluate(FULL) is with_props
    assert f.evaluate(EMPTY) is without
    assert f.matches(FULL) is (with_props is True)
    assert f.matches(EMPTY) is (without is True)


# expression, 1-based column the error names, a word of the message
MALFORMED = [
    ("", 1, "empty"),
    ("   ", 1, "empty"),
    ("a >", 4, "expected a value"),
    ("a > > 5", 5, "expected a value"),
    ("a = NULL", 5, "IS NULL"),
    ("NULL = a", 1, "IS NULL"),
    ("a > 'x'", 5, "numbers"),
    ("a > TRUE", 5, "numbers"),
    ("'x' < a", 1, "numbers"),
    ("a BETWEEN 'x' AND 3", 11, "numbers"),
    ("a BETWEEN 3 AND 1", 11, "reversed"),
    ("a BETWEEN 1 3", 13, "AND"),
    ("1", 1, "not a condition"),
    ("'abc'", 1, "not a condition"),
    ("1 AND a = 1", 1, "not a condition"),
    ("a = 1 AND 2", 11, "not a condition"),
    ("NOT 5", 5, "not a condition"),
    ("(a = 1", 7, "expected ')'"),
    ("a = 1)", 6, "unexpected ')'"),
    ("a = 1 b = 2", 7, "unexpected 'b'"),
    ("a @ 1", 3, "unexpected character '@'"),
    ("a = \"x\"", 5, "unexpected character"),
    ("s = 'unterminated", 5, "unexpected character"),
    ("a IN ()", 7, "quoted string"),
    ("a IN (1, 2)", 7, "quoted string"),
    ("a IN 'x'", 6, "'('"),
    ("a IN ('x' 'y')", 11, "')' or ','"),
    ("'x' IN ('x')", 1, "property"),
    ("a CONTAINS 5", 12, "quoted string"),
    ("a IS 5", 6, "NULL or NOT NULL"),
    ("a IS NOT 5", 10, "NULL"),
    ("(a > 1) > 2", 1, "conditions"),
    ("NOT a > 5", 1, "conditions"),  # NOT binds tighter than >, as in RocketMQ's grammar
    ("TRUE = 1", 8, "cannot be compared"),
    ("a = 99999999999999999999", 5, "64-bit"),
    ("AND a = 1", 1, "expected a value"),
    ("a = 1 OR", 9, "expected a value"),
    ("a.b = 1", 2, "unexpected character '.'"),
]


@pytest.mark.parametrize("expression,column,words", MALFORMED, ids=[m[0] or "empty" for m in MALFORMED])
def test_malformed_expressions_are_refused_naming_the_column(expression: str, column: int, words: str) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        SqlFilter(expression)
    err = info.value
    assert isinstance(err, InvalidFieldError)  # INVALID_ARGUMENT, field filter_expression
    assert err.details["field"] == "filter_expression"
    assert err.position == column, str(err)
    assert f"column {column}" in str(err)
    assert words in str(err)


def test_limits_on_size_and_depth() -> None:
    with pytest.raises(InvalidFieldError, match=str(MAX_EXPRESSION_CHARS)):
        SqlFilter("a = 1 OR " * 1000 + "a = 1")
    deep = "(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(FilterSyntaxError, match="nested deeper"):
        SqlFilter(deep)
    ok = "(" * (MAX_DEPTH - 1) + "a = 1" + ")" * (MAX_DEPTH - 1)
    assert SqlFilter(ok).matches({"a": "1"})
    with pytest.raises(FilterSyntaxError, match="nested deeper"):
        SqlFilter("NOT " * (MAX_DEPTH + 1) + "TRUE")


def test_tags_and_keys_are_properties() -> None:
    props = message_properties("TagA", ("k1", "k2"), {"x": "1"})
    assert props == {"x": "1", "TAGS": "TagA", "KEYS": "k1 k2"}
    assert message_properties("", (), {}) == {}
    assert SqlFilter("TAGS = 'TagA' AND KEYS CONTAINS 'k2'").matches(props)
    assert not SqlFilter("TAGS IS NOT NULL").matches(message_properties("", (), {"x": "1"}))


def test_never_evaluates_python() -> None:
    for text in ("__import__('os').system('true')", "a = 1; import os", "a.__class__ = 1"):
        with pytest.raises(FilterSyntaxError):
            SqlFilter(text)
    # a property may be called anything the grammar allows, and is only ever looked up
    assert SqlFilter("__class__ IS NULL").matches({})


def test_parse_filter_picks_the_syntax() -> None:
    assert parse_filter("*", sql=False) is None
    assert parse_filter("A || B", sql=False) == frozenset({"A", "B"})
    f = parse_filter("a > 1", sql=True)
    assert isinstance(f, SqlFilter) and f.matches({"a": "2"})
    assert parse_filter("a > 1", sql=True) is f  # parsed once
    with pytest.raises(InvalidFieldError):
        parse_filter("a >", sql=True)
