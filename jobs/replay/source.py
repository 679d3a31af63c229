"""The replay's source: the commit log records of the chosen queues (the broker's dispatch rule),
summarized per queue on the driver, checked to be in commit log order, and ordered for the sinks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker_model.common import (
    QUEUE_KEY,
    QueueKey,
    dispatched_mask,
)
from broker_model.common import constants as c
from jobs.log_chains import group_codes
from jobs.replay.config import MESSAGE_COLUMNS, SOURCE_COLUMNS, TopicQueues
from jobs.replay.plan import QueueBounds
from jobs.rules import build_current_offsets, is_dispatched


def filter_source_records(commitlog_df: DataFrame, topics: Sequence[TopicQueues]) -> DataFrame:
    """Dispatched records (transaction type NOT or COMMIT) of ``topics`` (and their queue ids);
    every record of a dispatched kind when ``topics`` is empty. Columns unchanged."""
    dispatched = commitlog_df.where(is_dispatched(F.col("sys_flag")))
    if not topics:
        return dispatched
    wanted = F.lit(False)
    for selected in topics:
        term = F.col("topic") == F.lit(selected.topic)
        if selected.queue_ids is not None:
            term = term & F.col("queue_id").isin(*selected.queue_ids)
        wanted = wanted | term
    return dispatched.where(wanted)


BOUND_COLUMNS = ("min_offset", "max_offset", "time_start", "time_end")


def bound_aggregates(from_time: int | None, to_time: int | None) -> list[Column]:
    def first_at(moment: int | None) -> Column:
        if moment is None:
            return F.lit(None).cast("long")
        return F.min(F.when(F.col("store_timestamp") >= F.lit(moment), F.col("queue_offset")))

    return [
        F.min("queue_offset").alias("min_offset"),
        (F.max("queue_offset") + F.lit(1)).alias("max_offset"),
        first_at(from_time).alias("time_start"),
        first_at(to_time).alias("time_end"),
    ]


# the commit log columns a source summary reads
SUMMARY_COLUMNS = (
    "broker_name",
    "topic",
    "queue_id",
    "queue_offset",
    "store_timestamp",
    "sys_flag",
    "commit_log_offset",
)


def summarize_source(
    chunks: Iterable[pa.Table], topics: Sequence[TopicQueues], from_time: int | None, to_time: int | None
) -> pa.Table:
    """Per chunk of commit log rows (:data:`SUMMARY_COLUMNS`, one chunk per data file) and queue,
    the source records' bounds: ``min_offset``, ``max_offset`` (largest + 1), the first offsets
    stored at or after ``from_time`` and ``to_time`` (``time_start``, ``time_end``; null when none
    is, or when the time is None), ``offsets``, the chunk's queue offsets of the queue, and what
    :func:`queues_out_of_log_order` needs: the least and greatest commit log offsets
    (``min_log_offset``, ``max_log_offset``) and ``in_log_order``, whether the queue's offsets
    never fall as the commit log offset rises within the chunk.

    The source records are those :func:`filter_source_records` keeps. Computed on the driver with
    pyarrow, chunk after chunk: a file's narrow columns at a time, and 8 bytes per source record.
    """
    parts = []
    for rows in chunks:
        rows = rows.filter(_source_mask(rows, topics))
        if rows.num_rows == 0:
            continue
        offset, stored = rows["queue_offset"], rows["store_timestamp"]
        for name, moment in (("time_start", from_time), ("time_end", to_time)):
            at_or_after = (
                pa.nulls(rows.num_rows, pa.int64())
                if moment is None
                else pc.if_else(pc.greater_equal(stored, moment), offset, pa.scalar(None, pa.int64()))
            )
            rows = rows.append_column(name, at_or_after)
        rows = rows.append_column("_falls", pa.array(_falls_in_log_order(rows), pa.bool_()))
        grouped = rows.group_by(list(QUEUE_KEY), use_threads=False).aggregate(
            [
                ("queue_offset", "min"),
                ("queue_offset", "max"),
                ("time_start", "min"),
                ("time_end", "min"),
                ("queue_offset", "list"),
                ("commit_log_offset", "min"),
                ("commit_log_offset", "max"),
                ("_falls", "any"),
            ]
        )
        parts.append(
            pa.table(
                {
                    **{k: grouped[k] for k in QUEUE_KEY},
                    "min_offset": grouped["queue_offset_min"],
                    "max_offset": pc.add(grouped["queue_offset_max"], 1),
                    "time_start": grouped["time_start_min"],
                    "time_end": grouped["time_end_min"],
                    "offsets": grouped["queue_offset_list"],
                    "min_log_offset": grouped["commit_log_offset_min"],
                    "max_log_offset": grouped["commit_log_offset_max"],
                    "in_log_order": pc.invert(grouped["_falls_any"]),
                }
            )
        )
    return pa.concat_tables(parts) if parts else _SUMMARY_SCHEMA.empty_table()


_SUMMARY_SCHEMA = pa.schema(
    [
        ("broker_name", pa.string()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("min_offset", pa.int64()),
        ("max_offset", pa.int64()),
        ("time_start", pa.int64()),
        ("time_end", pa.int64()),
        ("offsets", pa.list_(pa.int64())),
        ("min_log_offset", pa.int64()),
        ("max_log_offset", pa.int64()),
        ("in_log_order", pa.bool_()),
    ]
)


def _falls_in_log_order(rows: pa.Table) -> np.ndarray:
    """Per row of ``rows``: whether its queue offset is below the one of the record before it in its
    queue by ``commit_log_offset`` (ties: the same record twice, or a corrupt log; taken as falling)."""
    groups = group_codes(rows, QUEUE_KEY)
    log_offset = np.asarray(rows["commit_log_offset"].to_numpy(), dtype=np.int64)
    offset = np.asarray(rows["queue_offset"].to_numpy(), dtype=np.int64)
    order = np.lexsort((log_offset, groups))
    same_queue = groups[order][1:] == groups[order][:-1]
    bad = same_queue & ((offset[order][1:] < offset[order][:-1]) | (log_offset[order][1:] == log_offset[order][:-1]))
    falls = np.zeros(rows.num_rows, dtype=bool)
    falls[order[1:]] = bad
    return falls


def queues_out_of_log_order(summary: pa.Table) -> list[QueueKey]:
    """The queues of ``summary`` (rows of :func:`summarize_source`) whose records, taken in commit
    log order, are not in queue order: a chunk where a queue offset falls, or two chunks whose
    commit log ranges of the queue overlap or whose queue offsets fall from one to the next.

    A broker writes each queue's records at rising commit log offsets, so for a log it wrote the
    list is empty; then the commit log offset orders every queue as its queue offsets do (ties of
    equal queue offsets by commit log offset, as the replay order breaks them)."""
    runs: dict[QueueKey, list[tuple[int, int, int, int, bool]]] = {}
    for r in summary.select(
        [*QUEUE_KEY, "min_log_offset", "max_log_offset", "min_offset", "max_offset", "in_log_order"]
    ).to_pylist():
        key = (r["broker_name"], r["topic"], r["queue_id"])
        runs.setdefault(key, []).append(
            (r["min_log_offset"], r["max_log_offset"], r["min_offset"], r["max_offset"] - 1, r["in_log_order"])
        )
    out = []
    for key, chunks in sorted(runs.items()):
        chunks.sort()
        seams = all(before[1] < after[0] and before[3] <= after[2] for before, after in pairwise(chunks))
        if not (seams and all(chunk[4] for chunk in chunks)):
            out.append(key)
    return out


def _source_mask(rows: pa.Table, topics: Sequence[TopicQueues]) -> pa.ChunkedArray | pa.Array:
    """:func:`filter_source_records` over Arrow rows: dispatched records of ``topics`` (and their
    queue ids), every dispatched record when ``topics`` is empty."""
    mask = dispatched_mask(rows["sys_flag"])
    if not topics:
        return mask
    wanted = None
    for selected in topics:
        term = pc.equal(rows["topic"], selected.topic)
        if selected.queue_ids is not None:
            term = pc.and_(term, pc.is_in(rows["queue_id"], pa.array(selected.queue_ids, pa.int32())))
        wanted = term if wanted is None else pc.or_(wanted, term)
    return pc.and_(mask, wanted)


def merge_queue_bounds(summary: pa.Table) -> list[QueueBounds]:
    """The bounds of each queue of ``summary`` (rows of :func:`summarize_source`, several per
    queue), sorted by queue; nulls are skipped, as Spark's ``min`` skips them."""
    aggregates = [(n, "max" if n == "max_offset" else "min") for n in BOUND_COLUMNS]
    merged = summary.group_by(list(QUEUE_KEY), use_threads=False).aggregate(aggregates)
    rows = merged.to_pylist()
    bounds = [
        QueueBounds(r["broker_name"], r["topic"], r["queue_id"], *[r[f"{n}_{f}"] for n, f in aggregates]) for r in rows
    ]
    return sorted(bounds, key=lambda b: b.key)


def build_backlog_starts(commits_df: DataFrame, group: str, as_of: int) -> DataFrame:
    """The group's latest committed offset (the next to consume) per queue at ``as_of``:
    ``broker_name``, ``topic``, ``queue_id``, ``committed``."""
    current_df = build_current_offsets(commits_df.where(F.col("group") == F.lit(group)), as_of)
    return current_df.select(*QUEUE_KEY, F.col("consumer_offset").alias("committed"))


def build_dlq_selection(dlq_df: DataFrame, records_df: DataFrame, groups: Sequence[str]) -> DataFrame:
    """The queue positions of the dead letters of ``dlq_df`` (of ``groups``; all when empty): their
    records in ``records_df`` matched on (``broker_name``, ``msg_id``). Columns: queue key and
    ``queue_offset``, one row per distinct position."""
    chosen_df = dlq_df if not groups else dlq_df.where(F.col("group").isin(*groups))
    letters_df = chosen_df.select("broker_name", "msg_id").distinct()
    dead_df = records_df.where(F.col("topic").startswith(c.DLQ_GROUP_TOPIC_PREFIX))
    return (
        dead_df.join(letters_df, on=["broker_name", "msg_id"], how="left_semi")
        .select(*QUEUE_KEY, "queue_offset")
        .distinct()
    )


def build_source_rows(
    records_df: DataFrame, ranges_df: DataFrame, batch_rows: int, selection_df: DataFrame | None = None
) -> DataFrame:
    """The source messages of a run with their batch number.

    Args:
        records_df: dispatched commit log records (:func:`filter_source_records`).
        ranges_df: one row per queue: queue key, ``resume``, ``end`` (exclusive), ``first_batch``.
        batch_rows: queue offsets per queue and batch.
        selection_df: when given (DLQ sources), only the positions it lists (queue key, ``queue_offset``).

    Returns:
        :data:`SOURCE_COLUMNS` plus ``replay_batch`` = ``first_batch + (queue_offset - resume) // batch_rows``.
    """
    rows_df = filter_in_ranges(records_df, ranges_df)
    if selection_df is not None:
        rows_df = rows_df.join(selection_df, on=[*QUEUE_KEY, "queue_offset"], how="left_semi")
    batch = F.col("first_batch") + F.floor((F.col("queue_offset") - F.col("resume")) / F.lit(batch_rows))
    return rows_df.select(*SOURCE_COLUMNS, batch.cast("long").alias("replay_batch"))


def filter_in_ranges(rows_df: DataFrame, ranges_df: DataFrame) -> DataFrame:
    """The rows of ``rows_df`` whose queue offset lies in their queue's ``[resume, end)`` of
    ``ranges_df`` (broadcast), with the columns of both."""
    in_range = (F.col("queue_offset") >= F.col("resume")) & (F.col("queue_offset") < F.col("end"))
    return rows_df.join(F.broadcast(ranges_df), on=list(QUEUE_KEY), how="inner").where(in_range)


def order_by_log(source_df: DataFrame) -> DataFrame:
    """``source_df`` with ``replay_sequence`` = ``commit_log_offset``, each partition sorted by
    batch and sequence: no shuffle, every scan task writes its own rows.

    Only for sources whose commit log order is each queue's order (:func:`queues_out_of_log_order`
    found none): then the sequence orders every queue's rows of a batch by queue offset, and each
    task's rows of a queue are in that order too. The batch is the sort prefix and the writer's
    partition key."""
    sequenced_df = source_df.withColumn("replay_sequence", F.col("commit_log_offset"))
    return sequenced_df.sortWithinPartitions("replay_batch", "replay_sequence")


def order_within_queues(source_df: DataFrame, partitions: int) -> DataFrame:
    """``source_df`` shuffled by queue (a queue's rows in one partition), sorted within each
    partition by batch, queue offset and commit log offset, with ``replay_sequence`` the row's
    position in that order (the write order). For any source: no global sort, queues in parallel,
    each queue's rows in offset order within a batch (queues sharing a partition interleave)."""
    ordered_df = source_df.repartition(partitions, *QUEUE_KEY).sortWithinPartitions(
        "replay_batch", "queue_offset", "commit_log_offset"
    )
    return ordered_df.withColumn("replay_sequence", F.monotonically_increasing_id())


def build_sink_rows(ordered_df: DataFrame, replay_id: str) -> DataFrame:
    """The Delta sink's rows of ``ordered_df`` (:func:`order_by_log` or :func:`order_within_queues`),
    columns exactly the sink's, in the same order."""
    renamed = {name: f"source_{name}" for name in (*QUEUE_KEY, "queue_offset", "commit_log_offset")}
    return ordered_df.select(
        F.lit(replay_id).alias("replay_id"),
        F.col("replay_batch"),
        F.col("replay_sequence"),
        *[F.col(name).alias(alias) for name, alias in renamed.items()],
        *MESSAGE_COLUMNS,
    )
