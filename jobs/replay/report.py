"""The ordering report of a replay: what each sink holds read back, compared per queue with the source
(gaps, duplicates, order kept, complete), and printed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker_model.common import (
    QUEUE_KEY,
    QueueKey,
)
from jobs.cli import text_table
from jobs.lake import (
    Lake,
)
from jobs.replay.config import REPLAY_ID_PROPERTY, REPLAY_SOURCE_PROPERTY, REPLAYED_COLUMNS, SOURCE_SEPARATOR
from schemas.catalog import (
    REPLAY_REPORT,
    TableSpec,
)
from schemas.errors import UnsupportedTableError


def build_replayed_from_sink(sink_df: DataFrame, replay_id: str) -> DataFrame:
    """:data:`REPLAYED_COLUMNS` of a Delta sink's rows of ``replay_id``."""
    return sink_df.where(F.col("replay_id") == F.lit(replay_id)).select(
        F.col("source_broker_name").alias("broker_name"),
        F.col("source_topic").alias("topic"),
        F.col("source_queue_id").alias("queue_id"),
        F.col("source_queue_offset").alias("queue_offset"),
        "replay_batch",
        "replay_sequence",
    )


def build_replayed_from_topic(commitlog_df: DataFrame, replay_id: str, to_topic: str) -> DataFrame:
    """:data:`REPLAYED_COLUMNS` of the messages a broker sink stored for ``replay_id`` in
    ``to_topic``: the source from ``REPLAY_SOURCE``, the order from the target commit log offset
    (``replay_batch`` 0; one target broker per source queue makes it a total order per queue)."""
    mine = (F.col("topic") == F.lit(to_topic)) & (
        F.element_at(F.col("properties"), F.lit(REPLAY_ID_PROPERTY)) == F.lit(replay_id)
    )
    parts = F.split(F.element_at(F.col("properties"), F.lit(REPLAY_SOURCE_PROPERTY)), SOURCE_SEPARATOR)
    return commitlog_df.where(mine).select(
        parts.getItem(0).alias("broker_name"),
        parts.getItem(1).alias("topic"),
        parts.getItem(2).cast("int").alias("queue_id"),
        parts.getItem(3).cast("long").alias("queue_offset"),
        F.lit(0).cast("long").alias("replay_batch"),
        F.col("commit_log_offset").alias("replay_sequence"),
    )


_HASH_BASE = np.uint64(0x100000001B3)  # the running hash's multiplier: odd, so no offset is lost mod 2^64


def running_hash(offsets: np.ndarray) -> int:
    """The running hash of a sequence of offsets, in order: ``h = h * B + offset`` (mod 2^64) from
    0, computed at once as the sum of ``offset_i * B^(n-1-i)``. Equal sequences hash equal; a
    sequence hashes like its sorted copy only when it was in order (or by a 2^-64 chance)."""
    if len(offsets) == 0:
        return 0
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(len(offsets), _HASH_BASE, dtype=np.uint64))  # B^1 .. B^n
        powers = np.concatenate((np.ones(1, np.uint64), powers[:-1]))  # B^0 .. B^(n-1)
        return int(np.sum(offsets.astype(np.uint64) * powers[::-1], dtype=np.uint64))


def build_ordering_report(
    replayed: Iterable[pa.Table], expected: pa.Table, replay_id: str, run_id: str, sink: str, as_of: int
) -> list[dict[str, Any]]:
    """The ``replay_report`` rows, one per queue of ``expected`` or ``replayed``, sorted by queue.

    Args:
        replayed: chunks (one per sink data file, say) of :data:`REPLAYED_COLUMNS`, the rows the
            sink holds; the replay order of a queue is (``replay_batch``, ``replay_sequence``).
        expected: queue key and ``queue_offset``, one row per source message the report covers.

    Computed on the driver with numpy, chunk after chunk: each row leaves its offset, batch and
    sequence (24 bytes) until its queue is reported. ``order_preserved``: the running hash of the
    offsets in replay order equals the running hash of the same offsets sorted (the source order).
    ``gaps``: expected offsets up to ``last_offset`` the sink lacks. ``duplicates``: rows beyond
    the first of each offset. ``complete``: no gap, no duplicate, order preserved, and every
    expected offset replayed.
    """
    rows: dict[QueueKey, list[tuple[np.ndarray, ...]]] = {}
    for chunk in replayed:
        for key, columns in _by_queue(chunk, ["queue_offset", "replay_batch", "replay_sequence"]):
            rows.setdefault(key, []).append(columns)
    offsets = {key: values for key, (values,) in _by_queue(expected, ["queue_offset"])}
    report = []
    for key in sorted(rows.keys() | offsets.keys()):
        replay_order = np.empty(0, np.int64)
        if key in rows:
            offset, batch, sequence = (np.concatenate(column) for column in zip(*rows.pop(key), strict=True))
            replay_order = offset[np.lexsort((sequence, batch))]
        source = offsets.pop(key, np.empty(0, np.int64))
        report.append(
            _report_row(key, replay_order, source)
            | {"replay_id": replay_id, "run_id": run_id, "sink": sink, "report_timestamp": as_of}
        )
    return [{name: row[name] for name in REPLAY_REPORT.column_names} for row in report]


def _by_queue(table: pa.Table, columns: Sequence[str]) -> Iterator[tuple[QueueKey, tuple[np.ndarray, ...]]]:
    """Per queue key of ``table``: the key and the numeric ``columns`` of its rows as numpy
    arrays, in table order."""
    if table.num_rows == 0:
        return
    grouped = table.group_by(list(QUEUE_KEY), use_threads=False).aggregate([(c, "list") for c in columns])
    for i in range(grouped.num_rows):
        key = (grouped["broker_name"][i].as_py(), grouped["topic"][i].as_py(), grouped["queue_id"][i].as_py())
        yield key, tuple(grouped[f"{c}_list"][i].values.to_numpy() for c in columns)


def _report_row(key: QueueKey, replay_order: np.ndarray, source: np.ndarray) -> dict[str, Any]:
    rows = len(replay_order)
    ordered = np.sort(replay_order)
    distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if rows else ordered
    last = int(ordered[-1]) if rows else None
    gaps = 0
    if rows:  # distinct source offsets up to the last one replayed, less those the sink holds
        wanted = np.unique(source[source <= last])
        at = np.minimum(np.searchsorted(distinct, wanted), len(distinct) - 1)
        gaps = int(np.count_nonzero(distinct[at] != wanted))
    duplicates = rows - len(distinct)
    preserved = running_hash(replay_order) == running_hash(ordered)
    return {
        "broker_name": key[0],
        "topic": key[1],
        "queue_id": key[2],
        "source_rows": len(source),
        "rows": rows,
        "first_offset": int(ordered[0]) if rows else None,
        "last_offset": last,
        "gaps": gaps,
        "duplicates": duplicates,
        "order_preserved": preserved,
        "complete": gaps == 0 and duplicates == 0 and preserved and rows - duplicates == len(source),
    }


REPLAYED_TYPES = (pa.string(), pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.int64())  # of REPLAYED_COLUMNS


def read_replayed_from_sink(lake: Lake, spec: TableSpec, replay_id: str) -> Iterator[pa.Table]:
    """:data:`REPLAYED_COLUMNS` of a Delta sink's rows of ``replay_id``, read on the driver with
    pyarrow one data file at a time (a sink the bridge cannot read: through Spark, as one table)."""
    columns = [
        "source_broker_name",
        "source_topic",
        "source_queue_id",
        "source_queue_offset",
        "replay_batch",
        "replay_sequence",
    ]
    try:
        chunks = lake.iter_file_rows(spec, columns, {"replay_id": replay_id})
    except UnsupportedTableError:
        return iter([build_replayed_from_sink(lake.read(spec), replay_id).toArrow()])
    return (chunk.rename_columns(list(REPLAYED_COLUMNS)) for chunk in chunks)


_REPORT_HEADER = (
    "broker_name",
    "topic",
    "queue_id",
    "source_rows",
    "rows",
    "first_offset",
    "last_offset",
    "gaps",
    "duplicates",
    "order_preserved",
    "complete",
)


def format_report(rows: Sequence[Mapping[str, Any]], replay_id: str, sink: str) -> list[str]:
    """The ordering report as printed: a header line, one line per queue, a total line."""
    lines = [f"ordering report of replay {replay_id!r} into {sink}: {len(rows)} queues"]
    cells = [_REPORT_HEADER] + [
        tuple(
            "-" if row[n] is None else str(row[n]).lower() if isinstance(row[n], bool) else str(row[n])
            for n in _REPORT_HEADER
        )
        for row in rows
    ]
    lines += text_table(cells)
    total = sum(int(row["rows"]) for row in rows)
    incomplete = [row for row in rows if not row["complete"]]
    verdict = "every queue complete, in order" if not incomplete else f"{len(incomplete)} queue(s) not complete"
    lines.append(f"total: {total} rows; {verdict}")
    return lines
