"""Instants and durations as users write them on command lines.

An instant is epoch milliseconds (``1795315023721``) or ISO-8601 with an explicit zone
(``2026-11-22T02:00:00Z``, ``2026-11-22T10:00:00+08:00``); a time without a zone is refused, since
the product never guesses from the machine's local zone. A duration is ISO-8601 (``P1DT2H``,
``PT30M``, ``PT1.5S``).
"""

from __future__ import annotations

import re
import time
from datetime import datetime

from schemas.errors import ValidationError

_DURATION = re.compile(
    r"^P(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d{1,3})?)S)?)?$"
)
_UNIT_MS = {"weeks": 604_800_000, "days": 86_400_000, "hours": 3_600_000, "minutes": 60_000, "seconds": 1000}


def parse_instant(text: str, field: str = "as_of") -> int:
    """Epoch milliseconds of ``text`` (epoch ms digits, or ISO-8601 with a zone).

    Raises:
        ValidationError: naming ``field``: not a number nor ISO-8601, or ISO-8601 without a zone.
    """
    value = text.strip()
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValidationError(
            field,
            text,
            "is neither epoch milliseconds nor an ISO-8601 date-time",
            "write e.g. 1795315023721 or 2026-11-22T02:00:00Z",
        ) from None
    if moment.tzinfo is None:
        raise ValidationError(
            field, text, "has no time zone", "add one, e.g. Z or +08:00: the machine's zone is never assumed"
        )
    return int(moment.timestamp() * 1000)


def parse_duration(text: str, field: str = "duration") -> int:
    """Milliseconds of an ISO-8601 duration such as ``P1DT2H`` (weeks, days, hours, minutes,
    seconds with up to 3 decimals; no years or months, whose length varies).

    Raises:
        ValidationError: naming ``field``: not such a duration, or an empty one (``P``, ``PT``).
    """
    match = _DURATION.match(text.strip().upper())
    if match is None or not any(match.groupdict().values()):
        raise ValidationError(
            field,
            text,
            "is not an ISO-8601 duration of weeks, days, hours, minutes or seconds",
            "write e.g. P1DT2H or PT30M",
        )
    total = 0.0
    for unit, amount in match.groupdict().items():
        if amount:
            total += float(amount) * _UNIT_MS[unit]
    return round(total)


def now_ms() -> int:
    """The real clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000
