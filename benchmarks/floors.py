"""The floors of ``benchmarks/run_all.py``: each job's I/O with no logic between, and its seconds.

A job's floor reads its inputs the way the job reads them at the lake's size (Spark scans that need
every value of the columns the job scans, delta-rs reads on the driver of what it reads there) and
writes every table the job writes, into a fresh lake root through the same :class:`jobs.lake.Lake`
call (:func:`plan_floor`, :func:`time_scan_floor`), with its ``job_runs`` row and, where the job
makes it on a first run (:data:`LOOKS_UP_PREVIOUS_RUN`), the lookup of its previous run. The
report's floor also draws its plots, from the rows the report drew them from: they are its page's
encoding, as Parquet is a table's. The compaction's floor reads and writes with Arrow the files the
job packs, with no Delta commit (:func:`time_compaction_floor`); the consume queue's floor is
``time_floor`` of ``benchmarks/consume_queue.py``.
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from consume_queue import time_floor
from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from broker_model.store.delta_tables import SMALL_FILE_BYTES, SMALL_TABLE_FILES
from jobs import hours
from jobs.compact_commitlog import CompactConfig
from jobs.consumer_offsets.fold import CQ_CODED_COLUMNS, CQ_ROW_COLUMNS, subscribed_topics
from jobs.consumer_offsets.job import DRIVER_ROWS as OFFSETS_DRIVER_ROWS
from jobs.consumer_offsets.job import TOPIC_CONFIG_COLUMNS
from jobs.dlq.decode import RETRY_SOURCE_COLUMNS as ROUTE_DLQ_INPUTS
from jobs.dlq.job import APP_ID as ROUTE_APP_ID
from jobs.dlq.job import DRIVER_RECORDS as ROUTE_DRIVER_RECORDS
from jobs.hours import APP_ID as HOURS_APP_ID
from jobs.lake import Lake
from jobs.lake.compaction import Bin, eligible_paths, list_files, plan_bins
from jobs.report import PlotCache
from jobs.report.job import DEFAULT_SAMPLES, build_sections
from jobs.report.job import INPUTS as REPORT_INPUTS
from jobs.report.plots import Plot
from jobs.resolve_transactions import TRANSACTION_SOURCE_COLUMNS as TRANSACTION_INPUTS
from jobs.resolve_transactions.job import APP_ID as RESOLVE_APP_ID
from jobs.resolve_transactions.job import DRIVER_RECORDS as RESOLVE_DRIVER_RECORDS
from jobs.runs import JobRun, last_reusable, record_run, table_versions
from schemas.catalog import (
    BROKERS,
    COMMIT_HOURS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUME_QUEUE_INTEGRITY,
    CONSUMER_OFFSET_COMMITS,
    CONSUMER_OFFSETS,
    DLQ,
    DLQ_REDRIVES,
    JOB_RUNS,
    OFFSET_COMMIT_COLUMNS,
    QUEUE_HOURS,
    RETRY_CHAINS,
    RETRY_RECORDS,
    SUBSCRIPTION_GROUP,
    TOPIC_CONFIG,
    TRANSACTION_RECORDS,
    TRANSACTION_STATE,
    TableSpec,
)


def touched(df: DataFrame, columns: Sequence[str]) -> Column:
    """A long that needs every value of ``columns``: the sum over rows of their lengths or values,
    each row's total taken modulo a prime (a sum of epoch-ms times overflows a long at 5M rows)."""
    types = {f.name: f.dataType for f in df.schema.fields}
    parts: list[Column] = []
    for name in columns:
        kind = types[name]
        if isinstance(kind, T.MapType | T.ArrayType):
            parts.append(F.size(name))
        elif isinstance(kind, T.StringType | T.BinaryType):
            parts.append(F.length(name))
        else:
            parts.append(F.col(name).cast("long"))
    total = parts[0]
    for part in parts[1:]:
        total = total + F.coalesce(part, F.lit(0))
    return F.sum((F.coalesce(total, F.lit(0)) % _TOUCHED_MODULUS).cast("long"))


_TOUCHED_MODULUS = 1_000_003


# jobs that look up their previous run whatever the lake holds (a rerun may have nothing to do); the
# other jobs look it up only when their output table is there, and a timed full run starts without it
LOOKS_UP_PREVIOUS_RUN = ("report",)


@dataclass
class FloorPlan:
    """A job's I/O at this lake's size, the way the job does it, with no logic between: Spark scans
    that need every value of the columns the job reads with Spark (:func:`touched`), reads on the
    driver (delta-rs) of what the job reads there, and every table the job writes, written with the
    API the job writes it with (Spark's ``Lake.overwrite``, or ``Lake.overwrite_rows`` from the
    driver) and the same application transaction, plus its ``job_runs`` row and any other file."""

    scans: list[tuple[TableSpec, tuple[str, ...]]] = field(default_factory=list)
    reads: list[Callable[[], object]] = field(default_factory=list)
    spark_writes: list[tuple[TableSpec, tuple[str, int] | None]] = field(default_factory=list)
    row_writes: list[tuple[TableSpec, tuple[str, int] | None]] = field(default_factory=list)
    files: Path | None = None  # a directory of files the job writes (the report's page), copied whole
    drawings: list[tuple[Plot, Sequence[Mapping[str, object]]]] = field(default_factory=list)


class PlotRows(PlotCache):
    """A plot cache that draws nothing: it keeps each plot the report draws with the rows it draws
    it from, for the report's floor to draw them (:func:`plan_floor`)."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(out_dir)
        self.wanted: list[tuple[Plot, Sequence[Mapping[str, object]]]] = []

    def draw(self, name: str, plot: Plot, rows: Sequence[Mapping[str, object]]) -> tuple[str, bytes]:
        self.wanted.append((plot, rows))
        return name, b""


def plan_floor(name: str, lake: Lake, as_of: int, pages: Path) -> FloorPlan:
    """The floor of a full run of job ``name`` (not the compaction, see :func:`time_compaction_floor`;
    nor the consume queue, see ``benchmarks/consume_queue.py``) on ``lake`` as it is now: the path
    the job takes at this size (driver or Spark) decided by the job's own limits. What the jobs
    read back of the extracts they wrote themselves is not read again: the floor does each input
    and output once. ``pages``: where the report wrote its page."""
    log_version = lake.version(COMMITLOG)
    if name == "consumer_offsets":
        counted = lake.row_count(CONSUMER_OFFSET_COMMITS) + lake.row_count(CONSUME_QUEUE)
        if counted > OFFSETS_DRIVER_ROWS:
            return FloorPlan(
                scans=[
                    (CONSUMER_OFFSET_COMMITS, OFFSET_COMMIT_COLUMNS),
                    (CONSUME_QUEUE, CQ_ROW_COLUMNS),
                    (TOPIC_CONFIG, TOPIC_CONFIG_COLUMNS),
                ],
                spark_writes=[(CONSUMER_OFFSETS, None)],
            )
        commits = lake.read_rows(CONSUMER_OFFSET_COMMITS, OFFSET_COMMIT_COLUMNS)
        topics = sorted(subscribed_topics(commits, as_of))
        version = lake.version(CONSUME_QUEUE)
        return FloorPlan(
            reads=[
                lambda: lake.read_rows(CONSUMER_OFFSET_COMMITS, OFFSET_COMMIT_COLUMNS),
                lambda: sum(
                    t.num_rows
                    for t in lake.iter_row_chunks(
                        CONSUME_QUEUE, CQ_ROW_COLUMNS, version, CQ_CODED_COLUMNS, partition_filter={"topic": topics}
                    )
                ),
                *(
                    [functools.partial(lake.read_rows, TOPIC_CONFIG, TOPIC_CONFIG_COLUMNS)]
                    if lake.exists(TOPIC_CONFIG)
                    else []
                ),
            ],
            row_writes=[(CONSUMER_OFFSETS, None)],
        )
    if name == "resolve_transactions":
        extract = (TRANSACTION_RECORDS, (RESOLVE_APP_ID, log_version) if log_version is not None else None)
        plan = FloorPlan(scans=[(COMMITLOG, TRANSACTION_INPUTS)], spark_writes=[extract])
        if lake.row_count(TRANSACTION_RECORDS) > RESOLVE_DRIVER_RECORDS:
            plan.spark_writes.append((TRANSACTION_STATE, None))
        else:
            plan.row_writes.append((TRANSACTION_STATE, None))
        return plan
    if name == "route_dlq":
        extract = (RETRY_RECORDS, (ROUTE_APP_ID, log_version) if log_version is not None else None)
        plan = FloorPlan(scans=[(COMMITLOG, ROUTE_DLQ_INPUTS)], spark_writes=[extract])
        small = (SUBSCRIPTION_GROUP, CONSUMER_OFFSET_COMMITS, BROKERS, DLQ_REDRIVES)
        if lake.row_count(RETRY_RECORDS) > ROUTE_DRIVER_RECORDS:
            plan.scans += [(spec, tuple(spec.column_names)) for spec in small if lake.exists(spec)]
            plan.spark_writes += [(RETRY_CHAINS, None), (DLQ, None)]
        else:
            plan.reads += [functools.partial(lake.read_rows, spec) for spec in small]
            plan.row_writes += [(RETRY_CHAINS, None), (DLQ, None)]
        return plan
    if name == "report":
        commits_version = lake.version(CONSUMER_OFFSET_COMMITS)
        page_reads: list[tuple[TableSpec, Sequence[str] | None]] = [
            (CONSUMER_OFFSETS, None),
            (DLQ, ["group", "dlq_timestamp"]),
            (TRANSACTION_STATE, ["state", "anomaly"]),
            (CONSUME_QUEUE_INTEGRITY, None),
            (JOB_RUNS, ["job", "status", "started_timestamp", "duration_ms", "message", "run_id"]),
        ]
        plan = FloorPlan(reads=[functools.partial(lake.read_rows, spec, columns) for spec, columns in page_reads])
        for spec in (COMMITLOG, CONSUMER_OFFSET_COMMITS):  # read as jobs.hours reads them for a summary
            if lake.exists(spec) and hours.on_driver(lake, spec):
                plan.reads.append(functools.partial(_count_chunks, lake, spec))
            else:
                plan.scans.append((spec, tuple(hours.source_columns(spec))))
        plan.row_writes = [
            (QUEUE_HOURS, (HOURS_APP_ID, log_version) if log_version is not None else None),
            (COMMIT_HOURS, (HOURS_APP_ID, commits_version) if commits_version is not None else None),
        ]
        plan.files = pages
        # the page's plots are its encoding, as Parquet is a table's: drawn from the rows the job
        # drew them from, gathered here before the clock starts
        plotted = PlotRows(pages)
        build_sections(
            lake,
            table_versions(lake, [s.name for s in (*REPORT_INPUTS, QUEUE_HOURS, COMMIT_HOURS)]),
            DEFAULT_SAMPLES,
            plotted,
        )
        plan.drawings = plotted.wanted
        return plan
    raise ValueError(f"no floor plan for {name}")


def _count_chunks(lake: Lake, spec: TableSpec) -> int:
    """Rows of the whole table read on the driver in chunks, as :mod:`jobs.hours` reads them."""
    return sum(t.num_rows for t in hours.source_chunks(lake, spec))


def time_scan_floor(
    spark: SparkSession, name: str, lake: Path, floor_root: Path, as_of: int, pages: Path, engine: str
) -> float:
    """Seconds of the job's I/O (:func:`plan_floor`) into a fresh lake root, through ``Lake`` calls
    on ``engine``, the job's engine. The rows written are the job's own, read from its tables
    before the clock starts (Spark writes from a persisted frame, driver writes from Arrow)."""
    shutil.rmtree(floor_root, ignore_errors=True)
    spark.sparkContext.setJobGroup(f"floor:{name}", f"floor of {name}")
    source, target = Lake(spark, lake, engine), Lake(spark, floor_root, engine)
    plan = plan_floor(name, source, as_of, pages)
    frames = {spec.name: source.read(spec).persist() for spec, _ in plan.spark_writes}
    for frame in frames.values():
        frame.count()
    rows = {spec.name: source.read_rows(spec) for spec, _ in plan.row_writes}
    page = {path.name: path.read_bytes() for path in sorted(plan.files.iterdir())} if plan.files else {}
    try:
        started = time.perf_counter()
        if name in LOOKS_UP_PREVIOUS_RUN:
            last_reusable(source, name)
        for read in plan.reads:
            read()
        for spec, columns in plan.scans:
            if source.exists(spec):
                df = source.read(spec)
                df.select(touched(df, columns)).collect()
        for spec, app in plan.spark_writes:
            target.overwrite(spec, frames[spec.name], *(app or ()))
        for spec, app in plan.row_writes:
            target.overwrite_rows(spec, rows[spec.name], *(app or ()))
        for plot, plot_rows in plan.drawings:
            plot(plot_rows)
        if page:
            (floor_root / "page").mkdir(parents=True)
            for file_name, data in page.items():
                (floor_root / "page" / file_name).write_bytes(data)
        record_run(target, JobRun(name).finish("SUCCEEDED", "floor"))
        return time.perf_counter() - started
    finally:
        for frame in frames.values():
            frame.unpersist()


def compaction_bins(lake: Path, up_to: int | None) -> list[Bin]:
    """The bins ``compact_commitlog`` (default sizes) would rewrite now."""
    table_dir = str(lake / COMMITLOG.path)
    dt = DeltaTable(table_dir)
    config = CompactConfig(lake)
    return plan_bins(
        list_files(dt), config.target_file_size, config.min_file_fraction, eligible_paths(table_dir, dt, up_to)
    )


def packed_commit_files(lake: Path) -> list[Path]:
    """The files of ``consumer_offset_commits`` that ``compact_commitlog`` packs besides the log
    (:func:`jobs.compact_commitlog.pack_offset_commits`) on a lake none of its readers has read
    yet, as in the full runs: every small file of the latest version when there are more than
    ``SMALL_TABLE_FILES`` of them (:func:`broker_model.store.delta_tables.pack_small_files`), else none."""
    table_dir = lake / CONSUMER_OFFSET_COMMITS.path
    if not DeltaTable.is_deltatable(str(table_dir)):
        return []
    actions = pa.table(DeltaTable(str(table_dir)).get_add_actions(flatten=True)).to_pylist()
    small = [table_dir / unquote(a["path"]) for a in actions if a["size_bytes"] < SMALL_FILE_BYTES]
    return small if len(small) > SMALL_TABLE_FILES else []


def time_compaction_floor(lake: Path, bins: Sequence[Bin], commit_files: Sequence[Path], floor_dir: Path) -> float:
    """Seconds to read each bin's files with Arrow and write them as one Parquet file (the
    compaction's engine), and the same for the offset commits' small files the job packs
    (:func:`packed_commit_files`), without the job's sort, type checks, statistics or Delta
    commits: the floor writes the files, not the tables."""
    shutil.rmtree(floor_dir, ignore_errors=True)
    floor_dir.mkdir(parents=True)
    table_dir = lake / COMMITLOG.path
    started = time.perf_counter()
    for index, one in enumerate(bins):
        parts = [pq.read_table(table_dir / unquote(f.path), columns=COMMITLOG.data_columns) for f in one.files]
        pq.write_table(pa.concat_tables(parts), floor_dir / f"bin-{index}.parquet", compression="snappy")
    if commit_files:
        parts = [pq.read_table(path) for path in commit_files]
        commits = pa.concat_tables(parts, promote_options="default")
        pq.write_table(commits, floor_dir / "offset-commits.parquet", compression="snappy")
    return time.perf_counter() - started


def time_full_floor(
    spark: SparkSession,
    name: str,
    lake: Path,
    root: Path,
    engine: str,
    as_of: int,
    bins: Sequence[Bin],
    commit_files: Sequence[Path],
) -> float:
    """Seconds of the floor of job ``name``'s full run, written under ``root/floor/name`` (the
    report's page read from ``root/reports/full``), whichever kind of floor the job has."""
    floor_root = root / "floor" / name
    if name == "compact_commitlog":
        return time_compaction_floor(lake, bins, commit_files, floor_root)
    if name == "rebuild_consume_queue":
        spark.sparkContext.setJobGroup(f"floor:{name}", f"floor of {name}")
        return time_floor(spark, lake, floor_root, engine)
    return time_scan_floor(spark, name, lake, floor_root, as_of, root / "reports" / "full", engine)
