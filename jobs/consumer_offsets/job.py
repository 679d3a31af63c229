"""The ``consumer_offsets`` job: committed offsets and lag per consumer group and queue as of a time
T (RocketMQ's ``mqadmin consumerProgress`` figures), from ``consumer_offset_commits`` and
``consume_queue`` (and ``topic_config`` for the queues that are empty). A rerun on the same inputs
and T changes nothing; a run after new rows moves the previous table on by them when that gives the
same table. See docs/jobs.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from broker_model.common import RETRY_GROUP_TOPIC_PREFIX, QueueKey
from jobs.cli import (
    add_as_of,
    add_driver_limit,
    as_of_of,
    iso_utc,
    job_parser,
    non_negative_int,
    run_spark_job,
    text_table,
)
from jobs.consumer_offsets.fold import (
    CQ_CODED_COLUMNS,
    CQ_ROW_COLUMNS,
    Previous,
    check_foldable,
    compute,
    configured_queues,
    fold,
    latest_time,
    row_times_at,
    subscribed_topics,
)
from jobs.consumer_offsets.transforms import (
    build_configured_queues,
    build_consumer_offsets,
    build_queue_bounds,
    union_empty_queues,
)
from jobs.lake import IncrementalReadError, Lake, ReadCost
from jobs.rules import build_current_offsets
from jobs.runs import (
    MOVE_ON_FROM,
    MOVE_ON_SHARE,
    CannotFold,
    JobRun,
    ReadBudget,
    can_reuse,
    last_reusable,
    read_or_empty,
    recorded_run,
    table_versions,
)
from schemas.catalog import (
    CONSUME_QUEUE,
    CONSUMER_OFFSET_COMMITS,
    CONSUMER_OFFSETS,
    OFFSET_COMMIT_COLUMNS,
    TOPIC_CONFIG,
)
from schemas.errors import LakeError, ValidationError

JOB = "consumer_offsets"
INPUTS = (CONSUMER_OFFSET_COMMITS, CONSUME_QUEUE)
INPUT_NAMES = tuple(spec.name for spec in INPUTS)
# read whole by every run: which queues exist without a consume-queue row (an empty queue)
CONFIG_INPUTS = (TOPIC_CONFIG,)
TOPIC_CONFIG_COLUMNS = ("broker_name", "topic", "queue_nums", "updated_timestamp")
# input rows up to which a whole computation runs on the driver: it holds one chunk of the consume
# queue at a time, so the bound is one of time (one driver against a cluster), not of memory
DRIVER_ROWS = 50_000_000


@dataclass(frozen=True)
class ConsumerOffsetsConfig:
    """Options of the job.

    Attributes:
        lake: the lake root.
        as_of: the time T the figures are computed for, epoch milliseconds.
        groups: groups to print (empty: all); the table always holds every group.
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.
        full: compute from the whole inputs even when the previous table could be moved on.
        driver_rows: compute from the whole inputs on the driver while ``consumer_offset_commits``
            and ``consume_queue`` hold at most this many rows together, >= 0 (0: always Spark).
        move_on_share: move the previous table on only while that reads at most this share of
            what computing whole reads (:class:`jobs.runs.ReadBudget`), >= 0.
        move_on_from: try moving on only when computing whole reads at least this
            (:attr:`ReadCost.weight`, :data:`jobs.runs.MOVE_ON_FROM`), >= 0.

    Raises:
        ValidationError: ``driver_rows``, ``move_on_share`` or ``move_on_from`` below 0.
    """

    lake: Path
    as_of: int
    groups: tuple[str, ...] = ()
    engine: str = "auto"
    full: bool = False
    driver_rows: int = DRIVER_ROWS
    move_on_share: float = MOVE_ON_SHARE
    move_on_from: int = MOVE_ON_FROM

    def __post_init__(self) -> None:
        if self.driver_rows < 0:
            raise ValidationError("driver_rows", self.driver_rows, "is below 0", "pass a value >= 0")
        if not self.move_on_share >= 0:
            raise ValidationError("move_on_share", self.move_on_share, "is not a number >= 0", "pass a value >= 0")
        if self.move_on_from < 0:
            raise ValidationError("move_on_from", self.move_on_from, "is below 0", "pass a value >= 0")


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


def run(spark: SparkSession, config: ConsumerOffsetsConfig) -> JobRun:
    """Compute ``consumer_offsets`` as of ``config.as_of``, print the progress view, record the run.

    Reads the current versions of ``consumer_offset_commits``, ``consume_queue`` and
    ``topic_config`` (a missing table counts as empty, giving an empty output table). A no-op when
    the latest run had the same inputs and T; else the previous table moved on by the rows
    appended since, when that gives the full run's table exactly (:func:`check_foldable`); else
    (or with ``config.full``) computed from the whole inputs, on the driver while they hold at
    most ``config.driver_rows`` rows, else with Spark. Appends one ``job_runs`` row: SUCCEEDED or
    NOOP with the input versions, the output
    version and row counts, or FAILED before re-raising.

    Returns:
        The recorded run.
    """
    lake = Lake(spark, config.lake, config.engine)
    with recorded_run(lake, JOB, {"as_of": config.as_of}) as job_run:
        lake.add_missing_columns(TOPIC_CONFIG)  # a table an older release's broker created
        job_run.input_versions = table_versions(lake, [spec.name for spec in (*INPUTS, *CONFIG_INPUTS)])
        previous = _previous_run(lake)
        parameters = {"as_of": config.as_of}
        reusable = can_reuse(lake, previous, job_run.input_versions, [CONSUMER_OFFSETS.name], parameters)
        version = lake.version(CONSUMER_OFFSETS) if reusable else None
        through: int | None = None
        written: pa.Table | None = None  # the rows a run wrote from the driver, not read back
        if version is not None and previous is not None:
            job_run.conclude("NOOP", "inputs and as_of unchanged, nothing written")
            through = previous["parameters"].get("through")
        if version is None and not config.full and previous is not None:
            try:
                version, through, written = _fold_and_write(lake, job_run, previous, config)
                job_run.parameters["plan"] = "moved on"
                job_run.conclude("SUCCEEDED", job_run.message)
            except CannotFold as why:
                print(f"{JOB}: computing from the whole inputs: {why}")
                job_run.message = f"computed in full: {why}"
        if version is None:
            job_run.parameters["plan"] = "whole"
            version, through, written = _compute_and_write(lake, job_run, config.as_of, config.driver_rows)
            job_run.conclude("SUCCEEDED", job_run.message or "consumer_offsets overwritten")
        if through is not None:
            job_run.parameters["through"] = through
        offsets = written if written is not None else lake.read_rows(CONSUMER_OFFSETS, version=version)
        job_run.output_versions[CONSUMER_OFFSETS.name] = version
        job_run.row_counts[CONSUMER_OFFSETS.name] = offsets.num_rows
        print("\n".join(format_progress(_progress_rows(offsets, config.groups), config.as_of, config.groups)))
    return job_run


def _compute_and_write(
    lake: Lake, job_run: JobRun, as_of: int, driver_rows: int
) -> tuple[int, int | None, pa.Table | None]:
    """Read the inputs at the recorded versions, compute (on the driver while they hold at most
    ``driver_rows`` rows, else with Spark), overwrite; the committed version, the greatest input
    time (from the Delta statistics; None when they cannot bound every row) and the rows written
    from the driver (None from Spark)."""
    for spec in INPUTS:
        counted = job_run.input_versions.get(spec.name)
        job_run.row_counts[spec.name] = lake.row_count(spec, counted) if counted is not None else 0
    written = None
    if sum(job_run.row_counts[spec.name] for spec in INPUTS) <= driver_rows:
        written = _compute_on_driver(lake, job_run.input_versions, as_of)
        version = lake.overwrite_rows(CONSUMER_OFFSETS, written)
    else:
        commits_df = read_or_empty(lake, CONSUMER_OFFSET_COMMITS, job_run.input_versions)
        queue_df = read_or_empty(lake, CONSUME_QUEUE, job_run.input_versions)
        configured_df = build_configured_queues(read_or_empty(lake, TOPIC_CONFIG, job_run.input_versions), as_of)
        current_df = build_current_offsets(commits_df, as_of)
        bounds_df = union_empty_queues(build_queue_bounds(queue_df, as_of), configured_df)
        offsets_df = build_consumer_offsets(current_df, bounds_df, queue_df, as_of)
        version = lake.overwrite(CONSUMER_OFFSETS, offsets_df)
    if version is None:
        raise LakeError(f"the overwrite of {lake.location(CONSUMER_OFFSETS)} committed no version; run the job again")
    return version, _newest_input_time(lake, job_run.input_versions), written


def _compute_on_driver(lake: Lake, versions: Mapping[str, int], as_of: int) -> pa.Table:
    """:func:`~jobs.consumer_offsets.fold.compute` of every commit and of the consume-queue rows of
    the subscribed topics (partitions of other topics are not read), for the driver to write."""
    commits_version, cq_version = versions.get(CONSUMER_OFFSET_COMMITS.name), versions.get(CONSUME_QUEUE.name)
    commits = (
        lake.read_rows(CONSUMER_OFFSET_COMMITS, OFFSET_COMMIT_COLUMNS, version=commits_version)
        if commits_version is not None
        else CONSUMER_OFFSET_COMMITS.arrow_schema.empty_table().select(list(OFFSET_COMMIT_COLUMNS))
    )
    topics = sorted(subscribed_topics(commits, as_of))
    cq_chunks = (
        lake.iter_row_chunks(
            CONSUME_QUEUE, CQ_ROW_COLUMNS, cq_version, CQ_CODED_COLUMNS, partition_filter={"topic": topics}
        )
        if cq_version is not None and topics
        else iter(())
    )
    rows = compute(as_of, commits, cq_chunks, configured_queues(_topic_config(lake, versions), as_of))
    return pa.Table.from_pylist(rows, schema=CONSUMER_OFFSETS.arrow_schema)


def _topic_config(lake: Lake, versions: Mapping[str, int]) -> pa.Table:
    """The ``topic_config`` rows at the recorded version (none when the table is missing)."""
    version = versions.get(TOPIC_CONFIG.name)
    if version is None:
        return TOPIC_CONFIG.arrow_schema.empty_table().select(list(TOPIC_CONFIG_COLUMNS))
    return lake.read_rows(TOPIC_CONFIG, TOPIC_CONFIG_COLUMNS, version=version)


def _newest_input_time(lake: Lake, versions: Mapping[str, int]) -> int | None:
    """The greatest commit and store time in the inputs at ``versions`` (-1 for empty tables);
    None when unknown or when there is no input table."""
    times = []
    for spec, column in ((CONSUMER_OFFSET_COMMITS, "commit_timestamp"), (CONSUME_QUEUE, "store_timestamp")):
        if spec.name not in versions:
            continue
        newest = lake.newest_value(spec, column, versions[spec.name], strict=True)
        if newest is None and lake.row_count(spec, versions[spec.name]):
            return None
        times.append(newest if newest is not None else -1)
    return max(times) if times else None


def _fold_and_write(
    lake: Lake, job_run: JobRun, previous_run: Mapping[str, Any], config: ConsumerOffsetsConfig
) -> tuple[int, int, pa.Table]:
    """The previous table moved on to ``config.as_of`` and written (version, greatest input time, the
    rows), reading at most ``config.move_on_share`` of what the whole computation would
    (:class:`ReadBudget`, recorded in the run), and only when that reads at least
    ``config.move_on_from``.

    Raises:
        CannotFold: why it cannot be, or would cost more (then nothing is written).
    """
    before, now = previous_run["input_versions"], job_run.input_versions
    if not set(INPUT_NAMES) <= set(before) or not set(INPUT_NAMES) <= set(now):
        raise CannotFold("an input table was missing")
    previous_as_of, through = previous_run["parameters"].get("as_of"), previous_run["parameters"].get("through")
    output_version = previous_run["output_versions"].get(CONSUMER_OFFSETS.name)
    if previous_as_of is None or through is None:
        raise CannotFold("the previous run recorded no as_of and through")
    recorded = _recorded_whole_rows(previous_run)
    if recorded is not None and recorded < config.move_on_from:  # known before any log is loaded
        raise CannotFold(
            f"computing whole read {recorded:,} rows at the previous run, less than the {config.move_on_from:,} "
            "from which moving on is worth its fixed costs"
        )
    if output_version != lake.version(CONSUMER_OFFSETS):
        raise CannotFold("the previous run left no table to move on")
    commits_range = (before[CONSUMER_OFFSET_COMMITS.name], now[CONSUMER_OFFSET_COMMITS.name])
    cq_range = (before[CONSUME_QUEUE.name], now[CONSUME_QUEUE.name])
    cq_version = now[CONSUME_QUEUE.name]
    commits_whole = lake.read_cost(CONSUMER_OFFSET_COMMITS, now[CONSUMER_OFFSET_COMMITS.name])
    # first, before anything is read, the reads against the most computing whole can read (every
    # topic's consume queue): a run that cannot move on pays for little more than its log. A bound:
    # consume_queue is partitioned by topic, so the topics computing whole reads (known, then
    # first subscribed) are files of it, never more than all of them
    as_of, share = config.as_of, config.move_on_share
    bound = ReadBudget(commits_whole + lake.read_cost(CONSUME_QUEUE, cq_version), share, at_most=True)
    bound.require(config.move_on_from)
    # the previous table as its run counted it, at least one file: its log is loaded (a snapshot the
    # whole computation never needs) only once moving on is still the cheaper
    previous_rows = previous_run["row_counts"].get(CONSUMER_OFFSETS.name)
    reads = [("the previous table", ReadCost(rows=previous_rows or 0, files=1 if previous_rows else 0))]
    # the commits since the previous run are parsed before their files are known: a group that
    # commits its offsets every few seconds leaves thousands between two nightly runs
    log_commits = commits_range[1] - commits_range[0] + cq_range[1] - cq_range[0]
    reads.append(("the log commits since the previous run", ReadCost(commits=max(log_commits, 0))))
    for what, cost in reads:
        bound.spend(what, cost)
    reads[0] = ("the previous table", lake.read_cost(CONSUMER_OFFSETS, output_version))
    try:
        reads.append(("the new offset commits", lake.appended_cost(CONSUMER_OFFSET_COMMITS, *commits_range)))
        reads.append(("the new consume-queue rows", lake.appended_cost(CONSUME_QUEUE, *cq_range)))
    except (IncrementalReadError, ValidationError) as err:
        raise CannotFold(str(err)) from err
    for what, cost in reads[2:]:
        bound.spend(what, cost)
    previous = Previous(lake.read_rows(CONSUMER_OFFSETS, version=output_version).to_pylist(), previous_as_of, through)
    # what computing whole reads of the topics known so far; those the new commits subscribe to
    # are added once they are read
    topics = {row["topic"] for row in previous.rows}
    topics |= {RETRY_GROUP_TOPIC_PREFIX + row["group"] for row in previous.rows}
    budget = ReadBudget(commits_whole + lake.read_cost(CONSUME_QUEUE, cq_version, {"topic": sorted(topics)}), share)
    budget.require(config.move_on_from)
    for what, cost in reads[:2]:
        budget.spend(what, cost)
    try:
        commits = lake.read_appended_rows(CONSUMER_OFFSET_COMMITS, OFFSET_COMMIT_COLUMNS, *commits_range)
    except (IncrementalReadError, ValidationError) as err:
        raise CannotFold(str(err)) from err
    check_foldable(previous, as_of, commits)
    first_topics = sorted(subscribed_topics(commits, as_of) - topics)
    if first_topics:
        budget.widen(lake.read_cost(CONSUME_QUEUE, cq_version, {"topic": first_topics}))
    for what, cost in reads[2:]:
        budget.spend(what, cost)
    try:
        cq_rows = lake.read_appended_rows(CONSUME_QUEUE, CQ_ROW_COLUMNS, *cq_range)
    except (IncrementalReadError, ValidationError) as err:
        raise CannotFold(str(err)) from err

    def read_topics(first: set[str]) -> pa.Table:
        budget.spend(
            "the topics subscribed to for the first time",
            lake.read_cost(CONSUME_QUEUE, cq_version, {"topic": sorted(first)}),
        )
        return lake.read_rows(CONSUME_QUEUE, CQ_ROW_COLUMNS, [("topic", "in", sorted(first))], cq_version)

    def lookup(wanted: Mapping[QueueKey, set[int]]) -> dict[tuple[QueueKey, int], int]:
        return cq_row_times(lake, cq_version, wanted, as_of, budget)

    configured = configured_queues(_topic_config(lake, now), as_of)  # whole: the queues that may be empty at as_of
    rows = fold(previous, as_of, commits, cq_rows, read_topics, lookup, configured)
    written = pa.Table.from_pylist(rows, schema=CONSUMER_OFFSETS.arrow_schema)
    version = lake.overwrite_rows(CONSUMER_OFFSETS, written)
    if version is None:
        raise LakeError(f"the overwrite of {lake.location(CONSUMER_OFFSETS)} committed no version; run the job again")
    budget.record(job_run)
    job_run.message = f"moved on: read {budget.spent}, computing whole would read {budget.whole}"
    job_run.row_counts[f"new {CONSUMER_OFFSET_COMMITS.name}"] = commits.num_rows
    job_run.row_counts[f"new {CONSUME_QUEUE.name}"] = cq_rows.num_rows
    newest = latest_time((commits, "commit_timestamp"), (cq_rows, "store_timestamp"))
    return version, max(through, newest if newest is not None else through), written


def _recorded_whole_rows(previous_run: Mapping[str, Any]) -> int | None:
    """The rows computing whole read, or would have read, at ``previous_run``: the ``whole_rows`` a
    run that moved on recorded, else the input rows a run that computed whole counted; None when
    it recorded neither."""
    whole = previous_run["parameters"].get("whole_rows")
    if whole is not None:
        return int(whole)
    counts = [previous_run["row_counts"].get(spec.name) for spec in INPUTS]
    return sum(counts) if all(count is not None for count in counts) else None


def cq_row_times(
    lake: Lake, version: int, wanted: Mapping[QueueKey, set[int]], as_of: int, budget: ReadBudget | None = None
) -> dict[tuple[QueueKey, int], int]:
    """The earliest store time at or before ``as_of`` of the consume-queue rows (at ``version``)
    at the ``wanted`` queue offsets of each queue; offsets without such a row are absent. Reads the
    files of each queue's topic whose offsets may reach the queue's wanted ones (counted in
    ``budget`` first), and of those only the rows of each queue between its least and greatest
    wanted offset."""
    spans: dict[str, tuple[int, int]] = {}
    for (_, topic, _), offsets in wanted.items():
        low, high = spans.get(topic, (min(offsets), max(offsets)))
        spans[topic] = (min(low, *offsets), max(high, *offsets))
    if budget is not None:
        for topic, span in sorted(spans.items()):
            cost = lake.read_cost(CONSUME_QUEUE, version, {"topic": [topic]}, {"queue_offset": span})
            budget.spend(f"the rows at the offsets moved commits point at in {topic}", cost)
    filters = [
        [
            ("topic", "=", topic),
            ("broker_name", "=", broker),
            ("queue_id", "=", queue_id),
            ("queue_offset", ">=", min(offsets)),
            ("queue_offset", "<=", max(offsets)),
            ("store_timestamp", "<=", as_of),
        ]
        for (broker, topic, queue_id), offsets in sorted(wanted.items())
    ]
    return row_times_at(lake.read_rows(CONSUME_QUEUE, CQ_ROW_COLUMNS, filters, version), wanted)


def _previous_run(lake: Lake) -> dict[str, Any] | None:
    return last_reusable(lake, JOB) if lake.version(CONSUMER_OFFSETS) is not None else None


def _progress_rows(offsets: pa.Table, groups: Sequence[str]) -> list[dict[str, Any]]:
    rows = offsets.to_pylist()
    return [row for row in rows if row["group"] in groups] if groups else rows


# ---------------------------------------------------------------------------------------------
# The printed view
# ---------------------------------------------------------------------------------------------

_HEADER = ("#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime", "#Note")


def format_progress(rows: Sequence[Mapping[str, Any]], as_of: int, groups: Sequence[str] = ()) -> list[str]:
    """The lines of a consumerProgress-like view of ``consumer_offsets`` rows, per group.

    Per group (sorted by name): a title, then one line per queue sorted by (topic, broker_name,
    queue_id) as RocketMQ sorts message queues, then ``Diff Total`` (sum of the known diffs).
    A null consumer offset prints as 0 (as RocketMQ prints a missing offset) with the note
    ``no commit``; unknown bounds print as ``-``; times are UTC ISO-8601, ``N/A`` when null.
    Each group of ``groups`` without rows gets a line saying so.
    """
    lines = [f"consumer progress as of {iso_utc(as_of)} ({as_of})"]
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_group.setdefault(row["group"], []).append(row)
    for group in sorted(by_group):
        queue_rows = sorted(by_group[group], key=lambda r: (r["topic"], r["broker_name"], r["queue_id"]))
        lines += ["", f"Group: {group}", *text_table([_HEADER, *(_cells(r) for r in queue_rows)])]
        lines.append(f"Diff Total: {sum(r['diff'] for r in queue_rows if r['diff'] is not None)}")
    lines += [f"Group: {group}: no offsets as of {iso_utc(as_of)}" for group in groups if group not in by_group]
    return lines


def _cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    note = row["anomaly"] or ("no commit" if row["consumer_offset"] is None else "")
    return (
        row["topic"],
        row["broker_name"],
        str(row["queue_id"]),
        _or_dash(row["broker_offset"]),
        str(row["consumer_offset"] if row["consumer_offset"] is not None else 0),
        _or_dash(row["diff"]),
        iso_utc(row["last_timestamp"]) if row["last_timestamp"] is not None else "N/A",
        note,
    )


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options of ``consumer_offsets``."""
    parser = job_parser(JOB, __doc__)
    add_as_of(parser)
    parser.add_argument(
        "--group",
        action="append",
        default=[],
        help="print only this group (repeatable); the table always holds every group",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="compute from the whole inputs instead of moving the previous table on by the new rows",
    )
    add_driver_limit(parser, "--driver-rows", DRIVER_ROWS, "input rows")
    parser.add_argument(
        "--move-on-share",
        type=float,
        default=MOVE_ON_SHARE,
        help="move the previous table on only while that reads at most this share of what computing whole "
        "reads (rows, each file counted as 4,096 rows; default %(default)s)",
    )
    parser.add_argument(
        "--move-on-from",
        type=non_negative_int,
        default=MOVE_ON_FROM,
        help="try moving the previous table on only when computing whole reads at least this many rows (each "
        "file counted as 4,096 rows; default %(default)s)",
    )
    return parser


def build_config(argv: Sequence[str] | None = None) -> ConsumerOffsetsConfig:
    """The config of ``argv``; ``--as-of`` defaults to the current time.

    Raises:
        ValidationError: ``--as-of`` is neither epoch ms nor ISO-8601 with a zone, or a bad
            ``--driver-rows``.
        SystemExit: argparse usage errors and ``--help``.
    """
    args = build_parser().parse_args(argv)
    as_of = as_of_of(args.as_of)
    groups = tuple(dict.fromkeys(args.group))
    return ConsumerOffsetsConfig(
        Path(args.lake),
        as_of,
        groups,
        args.engine,
        args.full,
        args.driver_rows,
        args.move_on_share,
        args.move_on_from,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` (before starting Spark), build the session, run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
