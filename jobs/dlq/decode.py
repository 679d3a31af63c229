"""The send-back records of a few commit log rows, decoded on the driver with Arrow and Python: the
rows an incremental run appends to ``retry_records`` without a Spark job. The Spark
:func:`jobs.dlq.transforms.build_retry_records` decodes whole logs and is the reference:
``tests/test_route_dlq_incremental.py`` checks both give the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import constants as c
from jobs.dlq.transforms import DEAD_LETTER, PROPERTY_ROUTED_BY, RETRY, RETRY_COPIED_COLUMNS, SCHEDULED
from schemas.catalog import RETRY_RECORDS

RETRY_SOURCE_COLUMNS = (
    *RETRY_COPIED_COLUMNS,
    "reconsume_times",
    "born_timestamp",
    "store_timestamp",
    "body",
    "properties",
)
_PREFIXES = (c.RETRY_GROUP_TOPIC_PREFIX, c.DLQ_GROUP_TOPIC_PREFIX)


def decode_retry_records(rows: pa.Table) -> pa.Table:
    """The ``retry_records`` rows of commit log ``rows`` (at least :data:`RETRY_SOURCE_COLUMNS`), decoded
    as :func:`jobs.dlq.transforms.build_retry_records` does."""
    topic = rows["topic"]
    candidates = pc.or_(
        pc.equal(topic, c.SCHEDULE_TOPIC),
        pc.or_(pc.starts_with(topic, c.RETRY_GROUP_TOPIC_PREFIX), pc.starts_with(topic, c.DLQ_GROUP_TOPIC_PREFIX)),
    )
    out: list[dict[str, Any]] = []
    for row in rows.select(list(RETRY_SOURCE_COLUMNS)).filter(pc.fill_null(candidates, False)).to_pylist():
        record = _record(row)
        if record is not None:
            out.append(record)
    return pa.Table.from_pylist(out, schema=RETRY_RECORDS.arrow_schema)


def _record(row: dict[str, Any]) -> dict[str, Any] | None:
    pairs = row["properties"] or []
    topic = row["topic"]
    real_topic = _property(pairs, c.PROPERTY_REAL_TOPIC)
    if topic == c.SCHEDULE_TOPIC:
        if real_topic is None or not real_topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX):
            return None
        kind, target = SCHEDULED, real_topic
    elif topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX):
        kind, target = RETRY, topic
    elif topic.startswith(c.DLQ_GROUP_TOPIC_PREFIX):
        kind, target = DEAD_LETTER, topic
    else:
        return None
    kept = kind != SCHEDULED
    origin_group = _property(pairs, c.PROPERTY_ORIGIN_GROUP)
    pop_topic = pop_retry_topic(target, origin_group)
    return {
        "kind": kind,
        "group": origin_group if pop_topic is not None else _without_prefix(target),
        "broker_name": row["broker_name"],
        "topic": topic,
        "queue_id": row["queue_id"],
        "queue_offset": row["queue_offset"],
        "commit_log_offset": row["commit_log_offset"],
        "msg_id": row["msg_id"],
        "uniq_key": row["uniq_key"],
        "keys": row["keys"],
        "origin_msg_id": _trimmed(_property(pairs, c.PROPERTY_ORIGIN_MESSAGE_ID)),
        "origin_topic": _origin_topic(_trimmed(_property(pairs, c.PROPERTY_RETRY_TOPIC)), origin_group) or pop_topic,
        "reconsume_times": row["reconsume_times"],
        "born_timestamp": row["born_timestamp"],
        "store_timestamp": row["store_timestamp"],
        "routed_by": _property(pairs, PROPERTY_ROUTED_BY) if kind == DEAD_LETTER else None,
        "body": row["body"] if kept else None,
        "properties": pairs if kept and row["properties"] is not None else None,
    }


def pop_retry_topic(target: str, origin_group: str | None) -> str | None:
    """The topic a RocketMQ 5 POP retry topic ``target`` retries (``%RETRY%<origin_group>`` and
    ``_`` or ``+`` before it), None when it is none: :func:`jobs.dlq.transforms.pop_retry_topic_of`."""
    if not origin_group:
        return None
    for separator in c.POP_RETRY_SEPARATORS:
        prefix = c.RETRY_GROUP_TOPIC_PREFIX + origin_group + separator
        if target.startswith(prefix) and len(target) > len(prefix):
            return target[len(prefix) :]
    return None


def _origin_topic(retry_topic: str | None, origin_group: str | None) -> str | None:
    """``RETRY_TOPIC``, or the topic it retries when it is a POP retry topic (a POP dead letter's
    ``RETRY_TOPIC`` is the stored retry copy's topic, docs/pop.md)."""
    if retry_topic is None:
        return None
    return pop_retry_topic(retry_topic, origin_group) or retry_topic


def _property(pairs: Sequence[tuple[str, str | None]], name: str) -> str | None:
    """The value of the first entry ``name`` (as Spark's map lookup), None when absent."""
    return next((value for key, value in pairs if key == name), None)


def _without_prefix(target: str) -> str:
    """``target`` without a leading ``%RETRY%`` or ``%DLQ%`` (the Spark ``regexp_replace``)."""
    for prefix in _PREFIXES:
        if target.startswith(prefix):
            return target[len(prefix) :]
    return target


def _trimmed(value: str | None) -> str | None:
    """Spark's ``nullif(trim(value), '')``: spaces trimmed at both ends, empty as None."""
    if value is None:
        return None
    trimmed = value.strip(" ")
    return trimmed or None
