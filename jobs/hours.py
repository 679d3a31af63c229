"""The hourly summaries of the lake that the report and the nightly draw from instead of scanning the
log: ``queue_hours`` (records, bytes and the dispatched end offset of every queue per hour of store
time) and ``commit_hours`` (each group's latest offset commit of every queue per hour of commit
time). Each run adds the rows its source gained since the version recorded as the table's
application transaction, or builds the summary from the whole source when that reads less. See
docs/jobs.md (report) and docs/tables.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker_model.common import QUEUE_KEY, uninterpreted_topic
from broker_model.common.rules import dispatched_mask
from jobs.extract import DRIVER_INCREMENT_BYTES
from jobs.lake import IncrementalReadError, Lake, ReadCost, decoded
from jobs.rules import is_dispatched
from jobs.runs import CannotFold, ReadBudget
from schemas.catalog import (
    COMMIT_HOURS,
    COMMITLOG,
    CONSUMER_OFFSET_COMMITS,
    OFFSET_COMMIT_COLUMNS,
    QUEUE_HOURS,
    TableSpec,
)
from schemas.errors import LakeError

APP_ID = "report"  # application transaction of both tables: the version of their source folded in
HOUR_MS = 3_600_000
QUEUE_HOUR = (*QUEUE_KEY, "hour")  # the key of queue_hours
COMMIT_HOUR = ("group", *QUEUE_KEY, "hour")  # the key of commit_hours
# source rows up to which a summary built from a whole source is aggregated on the driver, a chunk
# of files at a time (memory holds one chunk and the summary), else with Spark
DRIVER_SOURCE_ROWS = 50_000_000
LOG_COLUMNS = (*QUEUE_KEY, "queue_offset", "sys_flag", "store_timestamp", "store_size")

Row = dict[str, Any]


def update(lake: Lake, driver_rows: int = DRIVER_SOURCE_ROWS, choices: dict[str, str] | None = None) -> dict[str, int]:
    """Bring ``queue_hours`` and ``commit_hours`` up to the latest versions of ``commitlog`` and
    ``consumer_offset_commits``; the versions of the summaries (a summary of an absent source is
    left absent). Each summary is moved on by the rows its source gained while that reads at most
    :data:`jobs.runs.MOVE_ON_SHARE` of what building it from the whole source reads (by
    :attr:`ReadCost.weight`, the log commits to parse counted), else built whole: on the driver,
    chunk by chunk, while the source holds at most ``driver_rows`` rows, else with Spark.
    ``choices`` receives, per summary written, how it was built and why.

    Raises:
        LakeError: a summary was built from a later version of its source than the latest one
            (the source was replaced; delete the summary).
    """
    versions = {}
    for target, source in ((QUEUE_HOURS, COMMITLOG), (COMMIT_HOURS, CONSUMER_OFFSET_COMMITS)):
        version = _update(lake, target, source, driver_rows, choices if choices is not None else {})
        if version is not None:
            versions[target.name] = version
    return versions


def _update(lake: Lake, target: TableSpec, source: TableSpec, driver_rows: int, choices: dict[str, str]) -> int | None:
    latest = lake.version(source)
    if latest is None:
        return lake.version(target)
    done = lake.transaction_version(target, APP_ID) if lake.exists(target) else None
    if done == latest:
        return lake.version(target)
    if done is not None and done > latest:
        raise LakeError(
            f"{target.name} was built from {source.name} version {done}, after its latest version {latest}: "
            f"{source.name} was replaced; delete {lake.location(target)}"
        )
    summary: pa.Table | None = None
    if done is None:
        choices[target.name] = "built whole: no summary yet"
    else:
        try:
            summary, choices[target.name] = _moved_on(lake, target, source, done, latest)
        except (CannotFold, IncrementalReadError) as why:
            choices[target.name] = f"built whole: {why}"
    if summary is None:
        summary = _whole(lake, source, latest, driver_rows)
    version = lake.overwrite_rows(target, summary, app_id=APP_ID, app_version=latest)
    return version if version is not None else lake.version(target)


def _moved_on(lake: Lake, target: TableSpec, source: TableSpec, done: int, latest: int) -> tuple[pa.Table, str]:
    """``target`` (built from ``source`` up to version ``done``) moved on to ``latest`` by the rows
    appended since, added to it in Arrow as the chunks of a whole source are; and what that read.

    Raises:
        CannotFold: moving on would read more than its share of what building whole reads, or
            more bytes than :data:`jobs.extract.DRIVER_INCREMENT_BYTES` (nothing was read).
        IncrementalReadError: the versions since ``done`` do not only append.
    """
    budget = ReadBudget(lake.read_cost(source, latest))
    # the commits since are parsed before their files are known: an offset commit every few seconds
    # leaves thousands, and then the source's checkpoint and few packed files are the cheaper read
    budget.spend("the log commits since the summary's version", ReadCost(commits=latest - done))
    appended = lake.appended_cost(source, done, latest)
    if appended.bytes > DRIVER_INCREMENT_BYTES:
        raise CannotFold(f"the rows appended since are {appended.bytes:,} bytes, above {DRIVER_INCREMENT_BYTES:,}")
    budget.spend("the rows appended since", appended)
    summarize = summarize_log if source is COMMITLOG else summarize_commits
    new = lake.read_appended_rows(source, source_columns(source), done, latest)
    summary = summarize([lake.read_rows(target), summarize([new])])
    return summary, f"moved on: read {budget.spent}, building whole would read {budget.whole}"


def _whole(lake: Lake, source: TableSpec, version: int, driver_rows: int) -> pa.Table:
    """The summary of a whole source version: on the driver while it holds at most ``driver_rows``
    rows, else aggregated with Spark."""
    summarize = summarize_log if source is COMMITLOG else summarize_commits
    if on_driver(lake, source, version, driver_rows):
        summary = summarize([])
        for chunk in source_chunks(lake, source, version):  # the sum so far and one chunk's add up
            summary = summarize([summary, summarize([chunk])])
        return summary
    df = lake.read(source, version=version)
    built = build_queue_hours(df) if source is COMMITLOG else build_commit_hours(df)
    target = QUEUE_HOURS if source is COMMITLOG else COMMIT_HOURS
    return pa.Table.from_pylist([row.asDict() for row in built.collect()], schema=target.arrow_schema)


def source_columns(source: TableSpec) -> list[str]:
    """The columns of ``commitlog`` or ``consumer_offset_commits`` a summary is built from."""
    return list(LOG_COLUMNS) if source is COMMITLOG else list(OFFSET_COMMIT_COLUMNS)


def on_driver(lake: Lake, source: TableSpec, version: int | None = None, driver_rows: int = DRIVER_SOURCE_ROWS) -> bool:
    """Whether a summary of the whole ``source`` (at ``version``) is built on the driver (else with Spark)."""
    return lake.row_count(source, version) <= driver_rows


def source_chunks(lake: Lake, source: TableSpec, version: int | None = None) -> Iterator[pa.Table]:
    """The summarized columns of the whole ``source``, read on the driver a chunk of files at a time."""
    return lake.iter_row_chunks(source, source_columns(source), version, dictionaries=("broker_name", "topic"))


def _hour_column(epoch_ms: pa.ChunkedArray) -> pa.ChunkedArray:
    """The start of the UTC hour of each value (a floored remainder, as Spark's ``pmod``)."""
    least = pc.min(epoch_ms).as_py()
    if least is None or least >= 0:  # no time before 1970: the quotient truncated is the floor
        return pc.multiply(pc.divide(epoch_ms, HOUR_MS), HOUR_MS)
    remainder = pc.subtract(epoch_ms, pc.multiply(pc.divide(epoch_ms, HOUR_MS), HOUR_MS))
    floored = pc.if_else(pc.less(remainder, 0), pc.add(remainder, HOUR_MS), remainder)
    return pc.subtract(epoch_ms, floored)


def summarize_log(parts: Sequence[pa.Table]) -> pa.Table:
    """``queue_hours`` rows (as :func:`build_queue_hours`) of commit log rows (``broker_name``,
    ``topic``, ``queue_id``, ``queue_offset``, ``sys_flag``, ``store_timestamp``, ``store_size``),
    or of ``queue_hours`` rows that summed parts of a log: the summaries of parts add up."""
    if not parts:
        return QUEUE_HOURS.arrow_schema.empty_table()
    # one part (a chunk of the log) is grouped by its dictionary codes, decoding only the summary's
    # few rows; parts to add up are decoded first, their dictionaries may differ
    if len(parts) == 1:
        table = parts[0].unify_dictionaries()
    else:
        table = pa.concat_tables([decoded(part) for part in parts], promote_options="permissive")
    if "messages" not in table.column_names:  # log rows: one message each
        times = table.column("store_timestamp")
        ends = pc.if_else(
            dispatched_mask(table.column("sys_flag")),
            pc.add(table.column("queue_offset"), 1),
            pa.scalar(None, pa.int64()),
        )
        table = pa.table(
            {
                **{k: table.column(k) for k in QUEUE_KEY},
                "hour": _hour_column(times),
                "messages": pa.array(np.ones(table.num_rows, np.int64)),
                "bytes": table.column("store_size").cast(pa.int64()),
                "end_offset": ends,
                "first_store_timestamp": times,
                "last_store_timestamp": times,
            }
        )
    summed = decoded(
        table.group_by(list(QUEUE_HOUR)).aggregate(
            [
                ("messages", "sum"),
                ("bytes", "sum"),
                ("end_offset", "max"),
                ("first_store_timestamp", "min"),
                ("last_store_timestamp", "max"),
            ]
        )
    )
    return pa.table(
        [summed.column(n) for n in (*QUEUE_HOUR, "messages_sum", "bytes_sum", "end_offset_max")]
        + [summed.column("first_store_timestamp_min"), summed.column("last_store_timestamp_max")],
        schema=QUEUE_HOURS.arrow_schema,
    )


def summarize_commits(parts: Sequence[pa.Table]) -> pa.Table:
    """``commit_hours`` rows (as :func:`build_commit_hours`) of offset commits, or of ``commit_hours``
    rows of parts of them: the latest of the parts' latest is the latest."""
    if not parts:
        return COMMIT_HOURS.arrow_schema.empty_table()
    table = pa.concat_tables([decoded(part) for part in parts], promote_options="permissive")
    if "hour" not in table.column_names:  # offset commits
        times = table.column("commit_timestamp")
        table = pa.table(
            {
                "group": table.column("group"),
                **{k: table.column(k) for k in QUEUE_KEY},
                "hour": _hour_column(times),
                "commit_timestamp": times,
                "is_reset": pc.equal(table.column("source"), "reset"),
                "offset": table.column("offset"),
            }
        )
    order = [(k, "ascending") for k in (*COMMIT_HOUR, "commit_timestamp", "is_reset", "offset")]
    # "last" skips nulls: right because commit_hours' columns hold none
    latest = (
        table.sort_by(order)
        .group_by(list(COMMIT_HOUR), use_threads=False)
        .aggregate([("commit_timestamp", "last"), ("is_reset", "last"), ("offset", "last")])
    )
    return pa.table(
        [latest.column(n) for n in COMMIT_HOUR]
        + [latest.column(f"{n}_last") for n in ("commit_timestamp", "is_reset", "offset")],
        schema=COMMIT_HOURS.arrow_schema,
    )


def build_queue_hours(commitlog_df: DataFrame) -> DataFrame:
    """The ``queue_hours`` rows of commit log rows."""
    hour = (F.col("store_timestamp") - F.pmod(F.col("store_timestamp"), F.lit(HOUR_MS))).alias("hour")
    dispatched_end = F.max(F.when(is_dispatched(F.col("sys_flag")), F.col("queue_offset") + 1))
    return (
        commitlog_df.groupBy(*QUEUE_KEY, hour)
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum(F.col("store_size").cast("long")).alias("bytes"),
            dispatched_end.alias("end_offset"),
            F.min("store_timestamp").alias("first_store_timestamp"),
            F.max("store_timestamp").alias("last_store_timestamp"),
        )
        .select(*QUEUE_HOURS.column_names)
    )


def build_commit_hours(commits_df: DataFrame) -> DataFrame:
    """The ``commit_hours`` rows of offset commits: the latest per group, queue and hour by
    (commit time, a reset first, the larger offset)."""
    hour = (F.col("commit_timestamp") - F.pmod(F.col("commit_timestamp"), F.lit(HOUR_MS))).alias("hour")
    latest = F.max(F.struct("commit_timestamp", (F.col("source") == F.lit("reset")).alias("is_reset"), "offset"))
    return (
        commits_df.groupBy("group", *QUEUE_KEY, hour)
        .agg(latest.alias("latest"))
        .select("group", *QUEUE_KEY, "hour", "latest.commit_timestamp", "latest.is_reset", "latest.offset")
        .select(*COMMIT_HOURS.column_names)
    )


# ---------------------------------------------------------------------------------------------
# What the report and the nightly draw
# ---------------------------------------------------------------------------------------------


def lag_over_time(
    queue_hours: Sequence[Mapping[str, Any]], commit_hours: Sequence[Mapping[str, Any]], samples: int
) -> list[Row]:
    """Each group's total lag at the end of the hours from the log's first to its last, at most
    ``samples`` of them (every k-th hour, the last one always).

    At the end T of an hour, for every queue a group has committed on by T: the queue's end offset
    by T (the greatest dispatched queue offset stored by T, plus one; 0 before the first) minus the
    group's latest committed offset by T (by commit time, a reset winning a tie, then the larger
    offset); the lag sums those queues.

    Returns:
        ``group``, ``sample`` (index), ``as_of`` (the hour's last millisecond), ``lag``; from the
        group's first commit on.
    """
    if not queue_hours:
        return []
    first = min(r["hour"] for r in queue_hours)
    last = max(r["hour"] for r in queue_hours)
    count = (last - first) // HOUR_MS + 1
    stride = -(-count // samples)
    points = sorted({first + HOUR_MS * i for i in range(count - 1, -1, -stride)})
    ends: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for row in queue_hours:
        if row["end_offset"] is not None:
            ends.setdefault(tuple(row[k] for k in QUEUE_KEY), []).append((row["hour"], row["end_offset"]))
    commits: dict[tuple[Any, ...], list[tuple[int, tuple[int, bool, int]]]] = {}
    for row in commit_hours:
        order = (row["commit_timestamp"], row["is_reset"], row["offset"])
        commits.setdefault((row["group"], *(row[k] for k in QUEUE_KEY)), []).append((row["hour"], order))
    lags: dict[tuple[str, int], int] = {}
    for (group, *queue), history in commits.items():
        history.sort()
        end_history = sorted(ends.get(tuple(queue), []))
        latest: tuple[int, bool, int] | None = None
        end, at_commit, at_end = 0, 0, 0
        for index, point in enumerate(points):
            while at_commit < len(history) and history[at_commit][0] <= point:
                latest = max(latest, history[at_commit][1]) if latest is not None else history[at_commit][1]
                at_commit += 1
            while at_end < len(end_history) and end_history[at_end][0] <= point:
                end = max(end, end_history[at_end][1])
                at_end += 1
            if latest is not None:
                lags[(group, index)] = lags.get((group, index), 0) + end - latest[2]
    return [
        {"group": group, "sample": index, "as_of": points[index] + HOUR_MS - 1, "lag": lag}
        for (group, index), lag in sorted(lags.items())
    ]


def topic_traffic(queue_hours: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per topic and hour: ``messages`` and ``bytes``."""
    totals: dict[tuple[str, int], list[int]] = {}
    for row in queue_hours:
        total = totals.setdefault((row["topic"], row["hour"]), [0, 0])
        total[0] += row["messages"]
        total[1] += row["bytes"]
    return [{"topic": t, "hour": h, "messages": m, "bytes": b} for (t, h), (m, b) in sorted(totals.items())]


def uninterpreted_traffic(queue_hours: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per broker and RocketMQ 5 system topic not interpreted yet (:func:`uninterpreted_topic`):
    what it holds, ``messages``, ``bytes`` and the first and last store times."""
    totals: dict[tuple[str, str], Row] = {}
    for row in queue_hours:
        holds = uninterpreted_topic(row["topic"])
        if holds is None:
            continue
        total = totals.setdefault(
            (row["broker_name"], row["topic"]),
            {"holds": holds, "messages": 0, "bytes": 0, "first_store_timestamp": None, "last_store_timestamp": None},
        )
        total["messages"] += row["messages"]
        total["bytes"] += row["bytes"]
        first, last = total["first_store_timestamp"], total["last_store_timestamp"]
        total["first_store_timestamp"] = min(row["first_store_timestamp"], first or row["first_store_timestamp"])
        total["last_store_timestamp"] = max(row["last_store_timestamp"], last or row["last_store_timestamp"])
    return [{"broker_name": b, "topic": t, **total} for (b, t), total in sorted(totals.items())]
