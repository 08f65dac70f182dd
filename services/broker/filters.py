"""Subscription filters: RocketMQ's tag expressions and its SQL92 property filters.

A SQL92 filter is parsed once per receive by a small recursive-descent parser (never
``eval``) into a tree, and evaluated on the broker against each candidate message's
properties, so a message it rejects never crosses the network.

The grammar is RocketMQ's ``SelectorParser.jj`` (keywords in any case)::

    selector    := or
    or          := and ( OR and )*
    and         := equality ( AND equality )*
    equality    := comparison ( "=" comparison | "<>" comparison
                              | IS NULL | IS NOT NULL )*
    comparison  := unary ( (">" | ">=" | "<" | "<=") unary
                         | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string
                         | [NOT] BETWEEN unary AND unary
                         | [NOT] IN "(" string ( "," string )* ")" )*
    unary       := "+" unary | "-" unary | NOT unary | primary
    primary     := string | integer | float | TRUE | FALSE | NULL | identifier
                 | "(" or ")"

``identifier`` is ``[A-Za-z_$][A-Za-z0-9_$]*`` and names a message property; ``TAGS`` is
the message's tag and ``KEYS`` its keys joined by a space, as in RocketMQ. Strings are
single-quoted (``''`` is a quote); ``--`` and ``/* */`` comments are skipped. ``!=`` is
accepted for ``<>``.

Evaluation follows RocketMQ's (ActiveMQ's) three-valued logic, with string conversion on
(RocketMQ sets ``CONVERT_STRING_EXPRESSIONS``): a property is a string, converted to the
other side's type when compared with a number or boolean literal;

- a missing property is NULL; a comparison, ``IN`` or ``BETWEEN`` with NULL is NULL
  (unknown), ``NOT NULL`` is NULL, ``NULL AND FALSE`` is FALSE, ``NULL OR TRUE`` TRUE;
- ``IS NULL`` / ``IS NOT NULL`` are never NULL; ``CONTAINS``/``STARTSWITH``/``ENDSWITH``
  and their ``NOT`` forms are FALSE on NULL;
- a message matches only when the whole expression is TRUE (NULL does not match);
- a value that cannot be converted (``a > 5`` with ``a = 'abc'``) makes the evaluation
  fail, and RocketMQ's broker then treats the message as not matching: so does this one.
  The conversion is to the literal's type, so ``price > 2`` fails on ``price = '2.5'``
  (not a long) where ``price > 2.0`` works; two properties compare as doubles.

What the parser refuses (RocketMQ refuses the same at subscription time): ``=`` with a
``NULL`` literal, ``<``/``>``/``BETWEEN`` with a non-numeric literal, ``BETWEEN`` bounds
in the wrong order, an expression that is not a condition (``1``, ``'x' AND a = 1``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn

from txmq.errors import InvalidFieldError

from .validation import parse_tag_filter

#: The longest SQL92 expression accepted, and the deepest nesting (of parentheses, NOT,
#: and unary signs): a subscription is small; this bounds the parser's recursion.
MAX_EXPRESSION_CHARS = 4096
MAX_DEPTH = 64

_FIELD = "filter_expression"
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1

_KEYWORDS = {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS",
             "CONTAINS", "STARTSWITH", "ENDSWITH"}
_TOKEN = re.compile(r"""
    (?P<space>\s+|--[^\n\r]*(?:\r\n|\n|\r|$)|/\*(?:[^*]|\*+[^*/])*\*+/)
  | (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>(?:0|[1-9]\d*)[lL]?)
  | (?P<string>'(?:''|[^'])*')
  | (?P<ident>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|!=|>=|<=|[=<>(),+-])
""", re.VERBOSE)
# Java's Long.valueOf / Double.valueOf, which RocketMQ uses to convert a property.
_JAVA_LONG = re.compile(r"[+-]?\d+")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?)")


class FilterSyntaxError(InvalidFieldError):
    """A SQL92 filter that does not parse: the message names the 1-based column."""

    def __init__(self, expression: str, position: int, problem: str) -> None:
        super().__init__(_FIELD, f"SQL92 syntax error at column {position + 1}: {problem} "
                                 f"(in {expression[:120]!r})")
        self.position = position + 1


class _EvaluationError(Exception):
    """A value could not be converted: the message does not match (as in RocketMQ)."""


@dataclass(slots=True, frozen=True)
class _Token:
    kind: str  # "int" "float" "string" "ident" "op" "kw" "end"
    text: str
    pos: int
    value: Any = None


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise FilterSyntaxError(text, pos, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        word = m.group()
        if kind == "int":
            value = int(word.rstrip("lL"))
            if value > _LONG_MAX + 1:  # +1: the magnitude of Long.MIN_VALUE after a "-"
                raise FilterSyntaxError(text, pos, f"integer {word} is out of the 64-bit range")
            out.append(_Token("int", word, pos, value))
        elif kind == "float":
            out.append(_Token("float", word, pos, float(word)))
        elif kind == "string":
            out.append(_Token("string", word, pos, word[1:-1].replace("''", "'")))
        elif kind == "ident":
            upper = word.upper()
            out.append(_Token("kw", upper, pos) if upper in _KEYWORDS else _Token("ident", word, pos))
        elif kind == "op":
            out.append(_Token("op", "<>" if word == "!=" else word, pos))
        pos = m.end()
    out.append(_Token("end", "end of expression", len(text)))
    return out


# --- the tree ------------------------------------------------------------------------------
# A node is a callable of the message's properties returning a value: a str, int, float,
# bool, or None (NULL). ``boolean`` says whether the node is a condition.

Props = Mapping[str, str]


@dataclass(slots=True)
class _Node:
    eval: Callable[[Props], Any]
    boolean: bool = False
    constant: bool = False
    value: Any = None  # the constant's value
    prop: str | None = None  # a property reference's name
    pos: int = 0


def _const(value: Any, pos: int) -> _Node:
    def constant(_p: Props) -> Any:
        return value
    return _Node(constant, boolean=isinstance(value, bool) or value is None,
                 constant=True, value=value, pos=pos)


def _java_long(text: str) -> int:
    if not _JAVA_LONG.fullmatch(text):
        raise _EvaluationError(f"{text!r} is not a long")
    value = int(text)
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise _EvaluationError(f"{text!r} is out of the long range")
    return value


def _java_double(text: str) -> float:
    stripped = text.strip()
    if not _JAVA_DOUBLE.fullmatch(stripped):
        raise _EvaluationError(f"{text!r} is not a double")
    return float(stripped.rstrip("fFdD").replace("Infinity", "inf"))


#: (left type, right type) → how each side converts before comparing (None: as is).
_CONVERSIONS: dict[tuple[type, type], tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]] = {
    (int, float): (float, None),
    (int, str): (None, _java_long),
    (float, int): (None, float),
    (float, str): (None, _java_double),
    (str, bool): (lambda v: v.lower() == "true", None),
    (str, int): (_java_long, None),
    (str, float): (_java_double, None),
}


def _cmp(lv: Any, rv: Any) -> int:
    """RocketMQ's ``__compare`` with string conversion on: values of different types are
    converted towards the literal's type; types that do not convert compare as -1."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is bool and rt is str:
            raise _EvaluationError("a boolean compared with a string")
        conversion = _CONVERSIONS.get((lt, rt))
        if conversion is None:
            return -1
        left, right = conversion
        lv = left(lv) if left else lv
        rv = right(rv) if right else rv
    order: int = (lv > rv) - (lv < rv)
    return order


def _equal(left: _Node, right: _Node) -> _Node:
    def ev(p: Props) -> bool | None:
        lv, rv = left.eval(p), right.eval(p)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or (type(lv) is type(rv) and lv == rv):
            return True
        return _cmp(lv, rv) == 0
    return _Node(ev, boolean=True, pos=left.pos)


def _order(left: _Node, right: _Node, test: Callable[[int], bool]) -> _Node:
    def ev(p: Props) -> bool | None:
        lv = left.eval(p)
        if lv is None:
            return None
        rv = right.eval(p)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            return test(_cmp(_java_double(lv), _java_double(rv)))
        return test(_cmp(lv, rv))
    return _Node(ev, boolean=True, pos=left.pos)


def _not(operand: _Node, pos: int | None = None) -> _Node:
    def ev(p: Props) -> bool | None:
        v = operand.eval(p)
        return None if v is None else not v
    return _Node(ev, boolean=True, pos=operand.pos if pos is None else pos)


def _logic(left: _Node, right: _Node, decisive: bool) -> _Node:
    """AND (``decisive`` FALSE) or OR (TRUE): either side decisive decides; else NULL if
    either side is NULL."""
    def ev(p: Props) -> bool | None:
        lv: bool | None = left.eval(p)
        if lv is decisive:
            return decisive
        rv: bool | None = right.eval(p)
        if rv is decisive:
            return decisive
        return None if lv is None or rv is None else not decisive
    return _Node(ev, boolean=True, pos=left.pos)


def _and(left: _Node, right: _Node) -> _Node:
    return _logic(left, right, False)


def _or(left: _Node, right: _Node) -> _Node:
    return _logic(left, right, True)


def _in(left: _Node, items: frozenset[str], negated: bool) -> _Node:
    def ev(p: Props) -> bool | None:
        v = left.eval(p)
        if type(v) is not str:
            return None
        return (v in items) != negated
    return _Node(ev, boolean=True, pos=left.pos)


def _text_test(left: _Node, search: str, test: Callable[[str, str], bool], negated: bool) -> _Node:
    def ev(p: Props) -> bool:
        v = left.eval(p)
        if not search or type(v) is not str:
            return False
        return test(v, search) != negated
    return _Node(ev, boolean=True, pos=left.pos)


def _negate(operand: _Node) -> _Node:
    if operand.constant and type(operand.value) in (int, float):
        return _const(-operand.value, operand.pos)

    def ev(p: Props) -> Any:
        v = operand.eval(p)
        return -v if type(v) in (int, float) else None
    return _Node(ev, pos=operand.pos)


def _boolean_cast(node: _Node) -> _Node:
    """A bare property where a condition is expected: TRUE only for a boolean value, which
    a property (a string) never is (RocketMQ's BooleanCast)."""
    def ev(p: Props) -> bool | None:
        v = node.eval(p)
        return None if v is None else (v if type(v) is bool else False)
    return _Node(ev, boolean=True, pos=node.pos)


_TEXT_TESTS: dict[str, Callable[[str, str], bool]] = {
    "CONTAINS": lambda v, s: s in v,
    "STARTSWITH": lambda v, s: v.startswith(s),
    "ENDSWITH": lambda v, s: v.endswith(s),
}
_ORDER_TESTS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0,
}


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0
        self.depth = 0

    # --- token helpers ---
    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def peek(self, ahead: int = 1) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def at(self, kind: str, text: str | None = None) -> bool:
        t = self.tok
        return t.kind == kind and (text is None or t.text == text)

    def accept(self, kind: str, text: str | None = None) -> _Token | None:
        if self.at(kind, text):
            t = self.tok
            self.i += 1
            return t
        return None

    def expect(self, kind: str, text: str | None, what: str) -> _Token:
        t = self.accept(kind, text)
        if t is None:
            self.fail(self.tok.pos, f"expected {what}, found {self._describe(self.tok)}")
        return t

    def fail(self, pos: int, problem: str) -> NoReturn:
        raise FilterSyntaxError(self.text, pos, problem)

    @staticmethod
    def _describe(t: _Token) -> str:
        return t.text if t.kind == "end" else repr(t.text)

    def boolean(self, node: _Node) -> _Node:
        if node.boolean:
            return node
        if node.prop is not None:
            return _boolean_cast(node)
        self.fail(node.pos, "this is a value, not a condition")
        raise AssertionError  # unreachable

    def numeric_operand(self, node: _Node, op: str) -> None:
        if node.constant and type(node.value) not in (int, float):
            self.fail(node.pos, f"{op} compares numbers; {self._literal(node.value)} is not one")
        if node.boolean and not node.constant:
            self.fail(node.pos, f"{op} compares numbers, not conditions")

    @staticmethod
    def _literal(value: Any) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        return repr(value)

    # --- grammar ---
    def parse(self) -> _Node:
        if self.at("end"):
            self.fail(0, "the expression is empty")
        node = self.boolean(self.or_())
        if not self.at("end"):
            self.fail(self.tok.pos, f"unexpected {self._describe(self.tok)}")
        return node

    def or_(self) -> _Node:
        left = self.and_()
        while self.accept("kw", "OR"):
            left = _or(self.boolean(left), self.boolean(self.and_()))
        return left

    def and_(self) -> _Node:
        left = self.equality()
        while self.accept("kw", "AND"):
            left = _and(self.boolean(left), self.boolean(self.equality()))
        return left

    def equality(self) -> _Node:
        left = self.comparison()
        while True:
            if self.at("op", "=") or self.at("op", "<>"):
                op = self.expect("op", None, "an operator").text  # at() saw it
                right = self.comparison()
                for side in (left, right):
                    if side.constant and side.value is None:
                        self.fail(side.pos, f"NULL cannot be compared with {op}: use IS NULL")
                if left.constant and right.constant and isinstance(left.value, bool) \
                        and not isinstance(right.value, bool):
                    self.fail(right.pos, f"{self._literal(left.value)} cannot be compared with "
                                         f"{self._literal(right.value)}")
                node = _equal(left, right)
                left = node if op == "=" else _not(node)
            elif self.at("kw", "IS"):
                self.i += 1
                negated = self.accept("kw", "NOT") is not None
                self.expect("kw", "NULL", "NULL" if negated else "NULL or NOT NULL")
                node = _equal(left, _const(None, left.pos))
                left = _not(node) if negated else node
            else:
                return left

    def comparison(self) -> _Node:
        left = self.unary()
        while True:
            t = self.tok
            if t.kind == "op" and t.text in _ORDER_TESTS:
                self.i += 1
                right = self.unary()
                self.numeric_operand(left, t.text)
                self.numeric_operand(right, t.text)
                left = _order(left, right, _ORDER_TESTS[t.text])
                continue
            negated = False
            if t.kind == "kw" and t.text == "NOT" and self.peek().kind == "kw" \
                    and self.peek().text in ("BETWEEN", "IN", *_TEXT_TESTS):
                self.i += 1
                negated = True
                t = self.tok
            if t.kind == "kw" and t.text in _TEXT_TESTS:
                self.i += 1
                search = self.expect("string", None, f"a quoted string after {t.text}").value
                left = _text_test(left, search, _TEXT_TESTS[t.text], negated)
            elif t.kind == "kw" and t.text == "BETWEEN":
                self.i += 1
                low = self.unary()
                self.expect("kw", "AND", "AND between the bounds of BETWEEN")
                high = self.unary()
                for node in (left, low, high):
                    self.numeric_operand(node, "BETWEEN")
                if low.constant and high.constant and low.value > high.value:
                    self.fail(low.pos, f"BETWEEN bounds are reversed: {low.value} > {high.value}")
                if negated:
                    left = _or(_order(left, low, _ORDER_TESTS["<"]), _order(left, high, _ORDER_TESTS[">"]))
                else:
                    left = _and(_order(left, low, _ORDER_TESTS[">="]), _order(left, high, _ORDER_TESTS["<="]))
            elif t.kind == "kw" and t.text == "IN":
                self.i += 1
                if left.prop is None:
                    self.fail(left.pos, "IN needs a property on its left")
                self.expect("op", "(", "'(' after IN")
                items = [self.expect("string", None, "a quoted string in the IN list").value]
                while self.accept("op", ","):
                    items.append(self.expect("string", None, "a quoted string in the IN list").value)
                self.expect("op", ")", "')' or ',' in the IN list")
                left = _in(left, frozenset(items), negated)
            else:
                return left

    def unary(self) -> _Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(self.tok.pos, f"nested deeper than {MAX_DEPTH} levels")
        try:
            t = self.tok
            if self.accept("op", "+"):
                return self.unary()
            if self.accept("op", "-"):
                return _negate(self.unary())
            if self.accept("kw", "NOT"):
                return _not(self.boolean(self.unary()), t.pos)
            return self.primary()
        finally:
            self.depth -= 1

    def primary(self) -> _Node:
        t = self.tok
        if t.kind in ("string", "int", "float"):
            self.i += 1
            if t.kind == "int" and t.value > _LONG_MAX:
                self.fail(t.pos, f"integer {t.text} is out of the 64-bit range")
            return _const(t.value, t.pos)
        if t.kind == "kw" and t.text in ("TRUE", "FALSE", "NULL"):
            self.i += 1
            return _const({"TRUE": True, "FALSE": False, "NULL": None}[t.text], t.pos)
        if t.kind == "ident":
            self.i += 1
            name = t.text

            def prop(p: Props) -> str | None:
                return p.get(name)
            return _Node(prop, prop=name, pos=t.pos)
        if self.accept("op", "("):
            node = self.or_()
            self.expect("op", ")", "')'")
            node.pos = t.pos
            return node
        self.fail(t.pos, f"expected a value, a property or '(', found {self._describe(t)}")
        raise AssertionError  # unreachable


class SqlFilter:
    """A parsed SQL92 filter. ``matches(properties)`` says whether a message with these
    properties (``TAGS``/``KEYS`` included, see :func:`message_properties`) matches."""

    __slots__ = ("expression", "_root")

    def __init__(self, expression: str) -> None:
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise InvalidFieldError(_FIELD, f"SQL92 expression is {len(expression)} characters, above the "
                                            f"limit {MAX_EXPRESSION_CHARS}")
        self.expression = expression
        self._root = _Parser(expression).parse()  # columns count from the first character sent

    def evaluate(self, properties: Props) -> bool | None:
        """TRUE, FALSE or None (NULL: unknown); a conversion failure is None too."""
        try:
            result: bool | None = self._root.eval(properties)
            return result
        except _EvaluationError:
            return None

    def matches(self, properties: Props) -> bool:
        return self.evaluate(properties) is True

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


def message_properties(tag: str, keys: tuple[str, ...], properties: Mapping[str, str]) -> dict[str, str]:
    """What a SQL92 filter sees of a message: its properties, ``TAGS`` (its tag, absent when
    it has none) and ``KEYS`` (its keys joined by a space, absent when none)."""
    out = dict(properties)
    if tag:
        out["TAGS"] = tag
    if keys:
        out["KEYS"] = " ".join(keys)
    return out


#: What a receive filters with: None (everything), a set of tags, or a SQL92 filter.
MessageFilter = frozenset[str] | SqlFilter | None


def parse_filter(expression: str, sql: bool) -> MessageFilter:
    """A subscription's filter: a tag expression, or (``sql``) a SQL92 expression (parsed
    once per distinct expression: consumers repeat theirs on every receive)."""
    return _parse_sql(expression) if sql else parse_tag_filter(expression)


@functools.lru_cache(maxsize=256)
def _parse_sql(expression: str) -> SqlFilter:
    return SqlFilter(expression)
