"""RocketMQ's SQL92 message filter (``ExpressionType.SQL92``, the broker's ``SelectorParser``): a
condition on a message's properties, which a consumer subscribes with instead of a tag expression.

The grammar: ``OR``, ``AND``, ``NOT``, parentheses; comparisons ``=``, ``<>`` (or ``!=``), ``>``,
``>=``, ``<``, ``<=``; ``IS [NOT] NULL``; ``[NOT] BETWEEN a AND b``; ``[NOT] IN ('a', 'b')``;
``[NOT] CONTAINS | STARTSWITH | ENDSWITH 'text'``; string literals in single quotes (``''`` for a
quote), integers, decimals, ``TRUE``, ``FALSE``, ``NULL``; identifiers name properties (keywords
are not case-sensitive, identifiers are). A property is a string: compared with ``=`` or ``<>`` to a
number it is read as a number (not one: unknown), to ``TRUE``/``FALSE`` as ``true``/``false``. The
ordering comparisons (``>``, ``>=``, ``<``, ``<=``, ``BETWEEN``) are numeric, as RocketMQ's: a
string literal there is refused, and a message whose property is not a number there does not
match at all (RocketMQ's evaluation fails for it). A missing property is NULL, and a comparison
with NULL is unknown; as in SQL, ``NOT`` of unknown is unknown, and a message matches only when
the whole condition is true.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from schemas.errors import ValidationError

_TOKEN: Final = re.compile(
    r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<number>-?\d+(?:\.\d+)?)|(?P<op><>|!=|>=|<=|[=<>(),])"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_.\-]*))"
)
_KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "IS", "NULL", "BETWEEN", "IN", "TRUE", "FALSE", "CONTAINS", "STARTSWITH", "ENDSWITH"}
)

Value = str | int | float | bool | None
Condition = Callable[[Mapping[str, str]], bool | None]  # None: unknown


@dataclass(frozen=True)
class SqlFilter:
    """A parsed SQL92 filter: :meth:`matches` a message's properties."""

    expression: str
    condition: Condition

    @classmethod
    def parse(cls, expression: str) -> SqlFilter:
        """Raises:
        ValidationError: ``filter_expression``, naming what is wrong and where."""
        tokens = _tokens(expression)
        parser = _Parser(expression, tokens)
        condition = parser.disjunction()
        if parser.at < len(tokens):
            parser.fail(f"unexpected {tokens[parser.at][1]!r}")
        return cls(expression, condition)

    def matches(self, properties: Mapping[str, str]) -> bool:
        try:
            return self.condition(properties) is True
        except _NotNumeric:  # RocketMQ's evaluation of the message fails: it is not delivered
            return False


class _NotNumeric(Exception):
    """A property compared by order is not a number."""


def _tokens(expression: str) -> list[tuple[str, str]]:
    found, at = [], 0
    text = expression.rstrip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise ValidationError(
                "filter_expression", expression, f"has a character SQL92 does not take at {at}: {text[at : at + 10]!r}"
            )
        kind = match.lastgroup
        assert kind is not None
        value = match.group(kind)
        if kind == "word" and value.upper() in _KEYWORDS:
            kind, value = "keyword", value.upper()
        found.append((kind, value))
        at = match.end()
    if not found:
        raise ValidationError("filter_expression", expression, "is empty")
    return found


class _Parser:
    def __init__(self, expression: str, tokens: list[tuple[str, str]]) -> None:
        self.expression, self.tokens, self.at = expression, tokens, 0

    def fail(self, problem: str) -> None:
        raise ValidationError("filter_expression", self.expression, f"is not SQL92: {problem}")

    def peek(self, *values: str) -> bool:
        return self.at < len(self.tokens) and self.tokens[self.at][1] in values and self.tokens[self.at][0] != "string"

    def take(self, *values: str) -> str:
        if not self.peek(*values):
            found = self.tokens[self.at][1] if self.at < len(self.tokens) else "the end"
            self.fail(f"expected {' or '.join(values)}, found {found!r}")
        self.at += 1
        return self.tokens[self.at - 1][1]

    def disjunction(self) -> Condition:
        parts = [self.conjunction()]
        while self.peek("OR"):
            self.at += 1
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else _any(parts)

    def conjunction(self) -> Condition:
        parts = [self.negation()]
        while self.peek("AND"):
            self.at += 1
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else _all(parts)

    def negation(self) -> Condition:
        if self.peek("NOT"):
            self.at += 1
            inner = self.negation()
            return lambda p: None if (v := inner(p)) is None else not v
        return self.comparison()

    def comparison(self) -> Condition:
        if self.peek("("):
            self.at += 1
            inner = self.disjunction()
            self.take(")")
            return inner
        left = self.operand()
        if self.peek("=", "<>", "!=", ">", ">=", "<", "<="):
            op = self.take("=", "<>", "!=", ">", ">=", "<", "<=")
            if op in (">", ">=", "<", "<="):
                self.no_string_before(op)
            right = self.operand()
            return lambda p: _compare(op, left(p), right(p))
        if self.peek("IS"):
            self.at += 1
            negated = self.peek("NOT")
            self.at += negated
            self.take("NULL")
            return lambda p: (left(p) is None) != negated
        negated = self.peek("NOT")
        self.at += negated
        if self.peek("BETWEEN"):
            self.at += 1
            self.no_string_before("BETWEEN")
            low = self.operand()
            self.take("AND")
            self.no_string_before("BETWEEN")
            high = self.operand()

            def between(p: Mapping[str, str]) -> bool | None:
                above, below = _compare(">=", left(p), low(p)), _compare("<=", left(p), high(p))
                return None if above is None or below is None else (above and below) != negated

            return between
        if self.peek("IN"):
            self.at += 1
            self.take("(")
            options = [self.literal()]
            while self.peek(","):
                self.at += 1
                options.append(self.literal())
            self.take(")")

            def within(p: Mapping[str, str]) -> bool | None:
                value = left(p)
                return None if value is None else (str(value) in {str(o) for o in options}) != negated

            return within
        if self.peek("CONTAINS", "STARTSWITH", "ENDSWITH"):
            op = self.take("CONTAINS", "STARTSWITH", "ENDSWITH")
            text = self.literal()
            if not isinstance(text, str):
                self.fail(f"{op} takes a string")
            test = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}[op]

            def textual(p: Mapping[str, str]) -> bool | None:
                value = left(p)
                return None if not isinstance(value, str) else test(value, str(text)) != negated

            return textual
        if negated:
            self.fail("NOT must come before a condition or BETWEEN, IN, CONTAINS, STARTSWITH, ENDSWITH")
        self.fail("expected a comparison")
        raise AssertionError  # fail raised

    def no_string_before(self, op: str) -> None:
        """An ordering comparison is numeric: a string literal there is refused."""
        if self.at < len(self.tokens) and self.tokens[self.at][0] == "string":
            self.fail(f"{op} compares numbers, not the string {self.tokens[self.at][1]}")

    def operand(self) -> Callable[[Mapping[str, str]], Value]:
        if self.at < len(self.tokens) and self.tokens[self.at][0] == "word":
            name = self.tokens[self.at][1]
            self.at += 1
            return lambda p: p.get(name)
        value = self.literal()
        return lambda p: value

    def literal(self) -> Value:
        if self.at >= len(self.tokens):
            self.fail("a value is missing at the end")
        kind, text = self.tokens[self.at]
        self.at += 1
        if kind == "string":
            return text[1:-1].replace("''", "'")
        if kind == "number":
            return float(text) if "." in text else int(text)
        if kind == "keyword" and text in ("TRUE", "FALSE"):
            return text == "TRUE"
        if kind == "keyword" and text == "NULL":
            return None
        self.fail(f"expected a value, found {text!r}")
        raise AssertionError  # fail raised


def _any(parts: list[Condition]) -> Condition:
    def either(p: Mapping[str, str]) -> bool | None:
        values = [part(p) for part in parts]
        return True if True in values else None if None in values else False

    return either


def _all(parts: list[Condition]) -> Condition:
    def both(p: Mapping[str, str]) -> bool | None:
        values = [part(p) for part in parts]
        return False if False in values else None if None in values else True

    return both


def _compare(op: str, left: Value, right: Value) -> bool | None:
    """A comparison of a property (a string) with a literal, or of two literals; None when unknown.

    Raises:
        _NotNumeric: an ordering comparison of something that is not a number.
    """
    if left is None or right is None:
        return None
    if op in ("=", "<>", "!="):
        a, b = _comparable(left, right)
        if a is None or b is None:
            return None
        return bool(a == b) if op == "=" else bool(a != b)
    x, y = _number(left), _number(right)  # ordering is numeric: a property that is no number fails
    ordered: dict[str, Callable[[float, float], bool]] = {
        ">": lambda u, v: u > v,
        ">=": lambda u, v: u >= v,
        "<": lambda u, v: u < v,
        "<=": lambda u, v: u <= v,
    }
    return ordered[op](x, y)


def _number(value: Value) -> float:
    if isinstance(value, bool) or value is None:
        raise _NotNumeric(value)
    try:
        return float(value)
    except ValueError:
        raise _NotNumeric(value) from None


def _comparable(left: Value, right: Value) -> tuple[Value, Value]:
    """Both sides as one type: a string beside a number is read as a number, beside a boolean
    as ``true``/``false``."""
    if isinstance(left, str) and not isinstance(right, str):
        return _as(left, right), right
    if isinstance(right, str) and not isinstance(left, str):
        return left, _as(right, left)
    return left, right


def _as(text: str, like: Value) -> Value:
    if isinstance(like, bool):
        lowered = text.strip().lower()
        return True if lowered == "true" else False if lowered == "false" else None
    try:
        return float(text) if isinstance(like, float) or "." in text else int(text)
    except ValueError:
        return None
