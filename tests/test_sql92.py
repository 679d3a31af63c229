"""RocketMQ's SQL92 message filter (``broker_model.common.sql92``): what it matches on a message's
properties, with SQL's unknown for missing properties and values of another type, and the
expressions it refuses, naming the field."""

from __future__ import annotations

import pytest

from broker_model.common.sql92 import SqlFilter
from schemas.errors import ValidationError

PROPERTIES = {"a": "5", "b": "x", "price": "12.5", "flag": "true", "TAGS": "TagA", "odd": "five"}


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ("a = 5", True),
        ("a > 4 AND a < 6", True),
        ("a >= 6", False),
        ("a <> 5", False),
        ("a != 4", True),
        ("b = 'x'", True),
        ("b = 'y' OR a = 5", True),
        ("NOT (b = 'y')", True),
        ("price BETWEEN 10 AND 13", True),
        ("price NOT BETWEEN 10 AND 13", False),
        ("b IN ('x', 'z')", True),
        ("b NOT IN ('x', 'z')", False),
        ("missing IS NULL", True),
        ("a IS NOT NULL", True),
        ("missing = 1", False),  # unknown
        ("NOT (missing = 1)", False),  # NOT unknown is unknown
        ("missing = 1 OR a = 5", True),
        ("missing = 1 AND a = 5", False),
        ("odd > 3", False),  # not a number: the message does not match
        ("odd > 3 OR a = 5", False),  # ... at all, as RocketMQ's evaluation fails for it
        ("odd = 3 OR a = 5", True),  # an equality with a non-number is only unknown
        ("price > a", True),  # two properties, compared as numbers
        ("flag = TRUE", True),
        ("TAGS = 'TagA'", True),
        ("b STARTSWITH 'x'", True),
        ("TAGS CONTAINS 'gA'", True),
        ("TAGS ENDSWITH 'B'", False),
        ("b NOT CONTAINS 'q'", True),
        ("b = 'it''s'", False),
        ("(a = 5 OR b = 'q') AND NOT price < 1", True),
        ("a = 5 and b = 'x'", True),  # keywords in any case
    ],
)
def test_a_condition_matches_as_rocketmqs_filter_does(expression: str, matches: bool) -> None:
    assert SqlFilter.parse(expression).matches(PROPERTIES) is matches


@pytest.mark.parametrize(
    "expression",
    ["", "a >", "a = ", "(a = 5", "a = 5)", "a ~ 5", "a BETWEEN 1", "NOT", "a IN (1", "a > '1'", "a BETWEEN 'x' AND 2"],
)
def test_an_expression_that_is_not_sql92_is_refused_naming_the_field(expression: str) -> None:
    with pytest.raises(ValidationError, match=r"^filter_expression="):
        SqlFilter.parse(expression)
