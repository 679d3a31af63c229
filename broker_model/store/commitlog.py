"""The commitlog table seen from one broker: Arrow rows in the table's schema, and the offsets a restart recovers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import dispatched_mask
from schemas.catalog import COMMITLOG


def recover_offsets(log: pa.Table) -> tuple[int, int, dict[tuple[str, int], int]]:
    """(next physical offset, current segment base, next offset per (topic, queue_id)) from the
    rows of one broker's commit log (columns segment, commit_log_offset, store_size, topic,
    queue_id, queue_offset, sys_flag)."""
    if log.num_rows == 0:
        return 0, 0, {}
    ends = pc.add(log["commit_log_offset"], pc.cast(log["store_size"], pa.int64()))
    last = pc.index(ends, pc.max(ends)).as_py()
    next_commit_log_offset = ends[last].as_py()
    segment = log["segment"][last].as_py()
    dispatched = log.filter(dispatched_mask(log["sys_flag"]))
    queues = dispatched.group_by(["topic", "queue_id"]).aggregate([("queue_offset", "max")])
    max_offsets = {(r["topic"], r["queue_id"]): r["queue_offset_max"] + 1 for r in queues.to_pylist()}
    return next_commit_log_offset, segment, max_offsets


def rows_to_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Commit log rows (dicts) as an Arrow table with the ``commitlog`` schema."""
    rows = list(rows)
    schema = COMMITLOG.arrow_schema
    columns = {}
    for name in schema.names:
        values = [r[name] for r in rows]
        if name == "properties":
            values = [list(v.items()) for v in values]
        columns[name] = pa.array(values, type=schema.field(name).type)
    return pa.table(columns, schema=schema)
