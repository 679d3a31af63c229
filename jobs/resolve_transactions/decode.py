"""The transaction records of a few commit log rows, decoded on the driver with Arrow and Python: the
rows an incremental run appends to ``transaction_records`` without a Spark job. The Spark
:func:`jobs.resolve_transactions.transforms.build_transaction_records` decodes whole logs and is the
reference: ``tests/test_transaction_decode.py`` checks both give the same rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from broker_model.broker import REMOVE_TAG
from broker_model.common import constants as c
from jobs.resolve_transactions.transforms import (
    DISCARD,
    FINAL,
    HALF,
    NO_IMMUNITY,
    OFFSET_SEPARATOR,
    OP,
    TRANSACTION_SOURCE_COLUMNS,
    UNKNOWN_OFFSET,
)
from schemas.catalog import TRANSACTION_RECORDS

TRANSACTION_TOPICS = (c.RMQ_SYS_TRANS_HALF_TOPIC, c.RMQ_SYS_TRANS_OP_HALF_TOPIC, c.TRANS_CHECK_MAX_TIME_TOPIC)
# Rows that may be transaction records, as DNF filters a reader prunes files with: a system topic
# of transactions, or a sys flag with the COMMIT bit (8) set, which only sys flags >= 8 have.
CANDIDATE_FILTERS = [[("topic", "in", list(TRANSACTION_TOPICS))], [("sys_flag", ">=", c.TRANSACTION_COMMIT_TYPE)]]

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INTEGER = re.compile(rb"[+-]?[0-9]+")
_TRIMMED = bytes(range(0x21)) + b"\x7f"  # what a cast of a string to a number trims at both ends


def decode_transaction_records(rows: pa.Table) -> pa.Table:
    """The ``transaction_records`` rows of commit log ``rows`` (at least :data:`TRANSACTION_SOURCE_COLUMNS`),
    decoded as :func:`~jobs.resolve_transactions.transforms.build_transaction_records` does."""
    candidates = rows.select(list(TRANSACTION_SOURCE_COLUMNS)).filter(_may_be_transaction_record(rows))
    out: list[dict[str, Any]] = []
    for row in candidates.to_pylist():
        kind = _kind(row)
        if kind is not None:
            out.extend(_records(row, kind))
    return pa.Table.from_pylist(out, schema=TRANSACTION_RECORDS.arrow_schema)


def _may_be_transaction_record(rows: pa.Table) -> pa.ChunkedArray:
    topics = pc.is_in(rows["topic"], pa.array(TRANSACTION_TOPICS))
    commit = pc.equal(pc.bit_wise_and(rows["sys_flag"], c.TRANSACTION_ROLLBACK_TYPE), c.TRANSACTION_COMMIT_TYPE)
    return pc.fill_null(pc.or_(topics, commit), False)


def _kind(row: Mapping[str, Any]) -> str | None:
    topic, transaction_type = row["topic"], row["sys_flag"] & c.TRANSACTION_ROLLBACK_TYPE
    if topic == c.RMQ_SYS_TRANS_HALF_TOPIC and transaction_type == c.TRANSACTION_NOT_TYPE:
        return HALF
    if topic == c.RMQ_SYS_TRANS_OP_HALF_TOPIC:
        return OP
    if topic == c.TRANS_CHECK_MAX_TIME_TOPIC:
        return DISCARD
    copied = (
        topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX)
        or topic.startswith(c.DLQ_GROUP_TOPIC_PREFIX)
        or topic == c.SCHEDULE_TOPIC
        or topic == c.TIMER_TOPIC
    )
    return FINAL if transaction_type == c.TRANSACTION_COMMIT_TYPE and not copied else None


def _records(row: Mapping[str, Any], kind: str) -> Iterable[dict[str, Any]]:
    properties = _properties(row["properties"])
    is_half = kind == HALF
    immunity = properties.get(c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
    immunity_seconds = _number(immunity, c.JAVA_LONG_RANGE)
    immunity_ms = None
    if immunity_seconds is not None and immunity_seconds != NO_IMMUNITY:
        immunity_ms = _within(immunity_seconds * 1000, c.JAVA_LONG_RANGE)
    record = {
        "kind": kind,
        "broker_name": row["broker_name"],
        "queue_id": row["queue_id"],
        "queue_offset": row["queue_offset"],
        "commit_log_offset": row["commit_log_offset"],
        "born_timestamp": row["born_timestamp"],
        "store_timestamp": row["store_timestamp"],
        "topic": row["topic"],
        "producer_group": properties.get(c.PROPERTY_PRODUCER_GROUP),
        "uniq_key": row["uniq_key"],
        "real_topic": properties.get(c.PROPERTY_REAL_TOPIC) if is_half else None,
        "real_queue_id": _number(properties.get(c.PROPERTY_REAL_QUEUE_ID), _INT32) if is_half else None,
        "check_times": (
            _number(properties.get(c.PROPERTY_TRANSACTION_CHECK_TIMES), _INT32) if kind in (HALF, DISCARD) else None
        ),
        "prepared_queue_offset": (
            _number(properties.get(c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET), c.JAVA_LONG_RANGE)
            if is_half
            else None
        ),
        "has_check_immunity": immunity is not None if is_half else None,
        "check_immunity_ms": immunity_ms if is_half else None,
        "removes": row["tags"] == REMOVE_TAG if kind == OP else None,
        "half_queue_offset": None,
        "prepared_transaction_offset": row["prepared_transaction_offset"] if kind == FINAL else None,
    }
    if kind != OP:
        return [record]
    listed = _listed_offsets(row["body"])
    return [{**record, "half_queue_offset": _op_offset(listed_offset)} for listed_offset in listed]


def _properties(pairs: Iterable[tuple[str, str]] | None) -> dict[str, str]:
    """A map column's key/value pairs as a dict; the first value of a repeated key counts."""
    found: dict[str, str] = {}
    for key, value in pairs or ():
        found.setdefault(key, value)
    return found


def _listed_offsets(body: bytes | None) -> list[bytes | None]:
    """The non-empty ``,``-separated entries of an op body; ``[None]`` when there are none."""
    if body is None:
        return [None]
    listed: list[bytes | None] = [part for part in body.split(OFFSET_SEPARATOR.encode()) if part]
    return listed or [None]


def _op_offset(listed_offset: bytes | None) -> int | None:
    if listed_offset is None:
        return None
    number = _number(listed_offset, c.JAVA_LONG_RANGE)
    return UNKNOWN_OFFSET if number is None else number


def _number(text: str | bytes | None, bounds: tuple[int, int]) -> int | None:
    """An integer as a cast of a string that returns null on failure reads it: ASCII control
    characters (DEL included) and spaces trimmed at both ends, an optional sign, ASCII digits,
    within ``bounds``."""
    if text is None:
        return None
    raw = (text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text).strip(_TRIMMED)
    if not _INTEGER.fullmatch(raw):
        return None
    return _within(int(raw), bounds)


def _within(value: int, bounds: tuple[int, int]) -> int | None:
    return value if bounds[0] <= value <= bounds[1] else None
