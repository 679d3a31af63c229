"""The ``resolve_transactions`` job: every transaction (half message, its re-put copies, op, final and
discard records) resolved into one state as of T, the check-backs due, and anomalies; incremental
through ``transaction_records``. See docs/jobs.md (resolve_transactions).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.broker import FILE_RESERVED_MS, REMOVE_TAG, TRANSACTION_CHECK_MAX, TRANSACTION_TIMEOUT_MS
from broker_model.common import RecordKey
from jobs.cli import add_as_of, add_driver_limit, as_of_of, format_age, iso_utc, job_parser, run_spark_job, text_table
from jobs.extract import DriverDecode, update_extract
from jobs.lake import IncrementalReadError, Lake
from jobs.resolve_transactions.decode import decode_transaction_records
from jobs.resolve_transactions.fold import (
    COUNTED,
    HalfPosition,
    Previous,
    Settings,
    TransactionKey,
    check_foldable,
    fold,
)
from jobs.resolve_transactions.transforms import (
    ANOMALIES,
    CHECK_DUE,
    DISCARD,
    FINAL,
    HALF,
    OP,
    STATES,
    TRANSACTION_SOURCE_COLUMNS,
    build_transaction_records,
    build_transaction_state,
    discards_of,
    finals_of,
    halves_of,
    ops_of,
)
from jobs.runs import CannotFold, JobRun, can_reuse, last_reusable, read_or_empty, recorded_run, table_versions
from schemas.catalog import COMMITLOG, TRANSACTION_RECORDS, TRANSACTION_STATE
from schemas.errors import LakeError, ValidationError

JOB = "resolve_transactions"
APP_ID = JOB  # the Delta application transaction id of transaction_records: the commit log version read
DRIVER_DECODE = DriverDecode(TRANSACTION_SOURCE_COLUMNS, decode_transaction_records)
# up to this many transaction records, deciding every transaction on the driver (about 5 us a
# record) costs less than the Spark joins' fixed cost
DRIVER_RECORDS = 250_000


@dataclass(frozen=True)
class ResolveTransactionsConfig:
    """Options of the job.

    Attributes:
        lake: the lake root.
        as_of: the time T the states are computed for, epoch milliseconds.
        timeout_ms: the broker's transaction timeout (``transactionTimeOut``), ms, >= 0.
        check_max: the broker's check limit (``transactionCheckMax``), >= 1.
        reserve_ms: the broker's file reserve time, ms, >= 0; older halves are EXPIRED.
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.
        show: how many CHECK_DUE transactions the summary lists (the oldest first), >= 0.
        full: rebuild ``transaction_records`` from the whole commit log instead of appending the
            records of the commit log versions not read yet, and decide every transaction.
        driver_records: every transaction is decided on the driver, without Spark, when
            ``transaction_records`` holds at most this many rows (0: always with Spark), >= 0.

    Raises:
        ValidationError: a setting out of range.
    """

    lake: Path
    as_of: int
    timeout_ms: int = TRANSACTION_TIMEOUT_MS
    check_max: int = TRANSACTION_CHECK_MAX
    reserve_ms: int = FILE_RESERVED_MS
    engine: str = "auto"
    show: int = 20
    full: bool = False
    driver_records: int = DRIVER_RECORDS

    def __post_init__(self) -> None:
        for name, minimum in (
            ("timeout_ms", 0),
            ("check_max", 1),
            ("reserve_ms", 0),
            ("show", 0),
            ("driver_records", 0),
        ):
            value = getattr(self, name)
            if value < minimum:
                raise ValidationError(name, value, f"is below {minimum}", f"pass a value >= {minimum}")

    @property
    def parameters(self) -> dict[str, int]:
        """The settings that decide the output, as the run records them."""
        return {"as_of": self.as_of, **self.check_settings}

    @property
    def check_settings(self) -> dict[str, int]:
        """The check settings (the parameters besides ``as_of``)."""
        return {"timeout_ms": self.timeout_ms, "check_max": self.check_max, "reserve_ms": self.reserve_ms}


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


@dataclass
class TransactionSummary:
    """What a run prints: counts per state and per anomaly, the check-backs due, ignored ops."""

    as_of: int
    states: dict[str, int] = field(default_factory=dict)
    anomalies: dict[str, int] = field(default_factory=dict)
    check_due: list[dict[str, Any]] = field(default_factory=list)
    ignored_ops: int | None = None


def run(spark: SparkSession, config: ResolveTransactionsConfig) -> JobRun:
    """Bring ``transaction_records`` up to the commit log, compute ``transaction_state`` as of
    ``config.as_of``, print the summary, record the run.

    Reads the current version of ``commitlog`` (a missing table counts as empty) and appends the
    transaction records of its versions not read yet (docs/jobs.md, resolve_transactions,
    "transaction_records"). A no-op when the latest run had the same inputs and settings; else the
    previous table moved on by the records appended since, when that gives the full run's table
    exactly (:mod:`.fold`); else (or with ``config.full``) computed from the whole
    ``transaction_records`` with Spark. Appends one ``job_runs`` row: SUCCEEDED or NOOP with the
    input versions (``commitlog``, ``transaction_records``), the output version and row counts
    (``new_transaction_records``, ``half_records``, ``op_records``, ``ignored_op_records``,
    ``final_records``, ``discard_records`` stored at or before T, ``transaction_state``), or FAILED
    before re-raising.

    Raises:
        LakeError: ``transaction_records`` was built from a later commit log version than the
            latest one (the commit log was replaced; delete ``transaction_records``).

    Returns:
        The recorded run.
    """
    lake = Lake(spark, config.lake, config.engine)
    with recorded_run(lake, JOB, config.parameters) as job_run:
        job_run.input_versions = table_versions(lake, [COMMITLOG.name])
        latest = job_run.input_versions.get(COMMITLOG.name)
        new_records = update_extract(
            lake, TRANSACTION_RECORDS, APP_ID, build_transaction_records, latest, config.full, DRIVER_DECODE
        )
        job_run.input_versions.update(table_versions(lake, [TRANSACTION_RECORDS.name]))
        previous_run = last_reusable(lake, JOB) if lake.version(TRANSACTION_STATE) is not None else None
        reusable = can_reuse(lake, previous_run, job_run.input_versions, [TRANSACTION_STATE.name], config.parameters)
        version: int | None = None
        through: int | None = None
        if reusable and previous_run is not None:
            job_run.conclude("NOOP", "inputs and settings unchanged, nothing written")
            version, job_run.row_counts = lake.version(TRANSACTION_STATE), dict(previous_run["row_counts"])
            through = previous_run["parameters"].get("through")
        elif not config.full and previous_run is not None:
            try:
                version, through = _fold_and_write(lake, job_run, previous_run, config)
                job_run.conclude("SUCCEEDED", "transaction_state moved on by the new records")
            except CannotFold as why:
                print(f"{JOB}: deciding every transaction again: {why}")
                job_run.message = f"computed in full: {why}"
        if version is None:
            version, through = _compute_and_write(lake, job_run, config)
            job_run.conclude("SUCCEEDED", job_run.message or "transaction_state overwritten")
        if through is not None:
            job_run.parameters["through"] = through
        job_run.row_counts["new_transaction_records"] = new_records
        job_run.output_versions[TRANSACTION_STATE.name] = version
        summary = summarize(lake.read_rows(TRANSACTION_STATE, version=version), config.as_of, config.show)
        summary.ignored_ops = job_run.row_counts.get("ignored_op_records")
        job_run.row_counts[TRANSACTION_STATE.name] = sum(summary.states.values())
        print("\n".join(format_summary(summary)))
        read = job_run.input_versions.get(TRANSACTION_RECORDS.name)
        if read is not None:  # the next run reads the records appended after this version
            job_run.packs[TRANSACTION_RECORDS.name] = read
    return job_run


def _compute_and_write(lake: Lake, job_run: JobRun, config: ResolveTransactionsConfig) -> tuple[int, int | None]:
    """Decide every transaction from ``transaction_records`` at the recorded version (on the driver
    when it holds at most ``config.driver_records`` rows, else with Spark), overwrite; the committed
    version and the greatest record store time (None when the statistics cannot tell)."""
    counted = job_run.input_versions.get(TRANSACTION_RECORDS.name)
    records = lake.row_count(TRANSACTION_RECORDS, counted) if counted is not None else 0
    if records <= config.driver_records:
        version = _decide_on_driver(lake, job_run, config, counted)
    else:
        version = _decide_with_spark(lake, job_run, config)
    if version is None:
        raise LakeError(f"the overwrite of {lake.location(TRANSACTION_STATE)} committed no version; run the job again")
    if counted is None:
        return version, -1
    newest = lake.newest_value(TRANSACTION_RECORDS, "store_timestamp", counted, strict=True)
    if newest is None:
        return version, None if records else -1
    return version, int(newest)


def _decide_on_driver(
    lake: Lake, job_run: JobRun, config: ResolveTransactionsConfig, version: int | None
) -> int | None:
    """Every transaction decided by :func:`fold` from no previous table: every record is new, so
    nothing is looked up."""
    records = lake.read_rows(TRANSACTION_RECORDS, version=version) if version is not None else _NO_RECORDS
    settings = Settings(config.timeout_ms, config.check_max, config.reserve_ms)
    nothing = Previous([], config.as_of, -1, dict.fromkeys(COUNTED, 0))
    rows, counts = fold(nothing, config.as_of, settings, records, _nothing_at, _nothing_linked)
    job_run.row_counts.update(counts)
    return lake.overwrite_rows(TRANSACTION_STATE, pa.Table.from_pylist(rows, schema=TRANSACTION_STATE.arrow_schema))


_NO_RECORDS = TRANSACTION_RECORDS.arrow_schema.empty_table()


def _nothing_at(positions: set[HalfPosition], offsets: set[RecordKey]) -> pa.Table:
    return _NO_RECORDS


def _nothing_linked(offsets: set[RecordKey], keys: set[TransactionKey]) -> pa.Table:
    return _NO_RECORDS


def _decide_with_spark(lake: Lake, job_run: JobRun, config: ResolveTransactionsConfig) -> int | None:
    records_df = read_or_empty(lake, TRANSACTION_RECORDS, job_run.input_versions)
    records_df = records_df.where(F.col("store_timestamp") <= F.lit(config.as_of)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        state_df = build_transaction_state(
            halves_of(records_df),
            ops_of(records_df),
            finals_of(records_df),
            discards_of(records_df),
            config.as_of,
            config.timeout_ms,
            config.check_max,
            config.reserve_ms,
        )
        version = lake.overwrite(TRANSACTION_STATE, state_df)
        job_run.row_counts.update(_record_counts(records_df))
    finally:
        records_df.unpersist()
    return version


def _fold_and_write(
    lake: Lake, job_run: JobRun, previous_run: Mapping[str, Any], config: ResolveTransactionsConfig
) -> tuple[int, int]:
    """The previous table moved on to ``config.as_of`` and written (version, greatest record store
    time).

    Raises:
        CannotFold: why it cannot be (then nothing is written).
    """
    before = previous_run["input_versions"].get(TRANSACTION_RECORDS.name)
    now = job_run.input_versions.get(TRANSACTION_RECORDS.name)
    recorded = previous_run["parameters"]
    as_of, through = recorded.get("as_of"), recorded.get("through")
    output_version = previous_run["output_versions"].get(TRANSACTION_STATE.name)
    if before is None or now is None:
        raise CannotFold("no transaction_records version was recorded")
    if {name: recorded.get(name) for name in config.check_settings} != config.check_settings:
        raise CannotFold("the check settings differ from the previous run's")
    if as_of is None or through is None:
        raise CannotFold("the previous run recorded no as_of and through")
    if output_version != lake.version(TRANSACTION_STATE):
        raise CannotFold("the previous run left no table to move on")
    previous = Previous(
        lake.read_rows(TRANSACTION_STATE, version=output_version).to_pylist(),
        as_of,
        through,
        previous_run["row_counts"],
    )
    check_foldable(previous, config.as_of)
    try:
        new = lake.read_appended_rows(TRANSACTION_RECORDS, TRANSACTION_RECORDS.column_names, before, now)
    except (IncrementalReadError, ValidationError) as err:
        raise CannotFold(str(err)) from err
    settings = Settings(config.timeout_ms, config.check_max, config.reserve_ms)
    rows, counts = fold(previous, config.as_of, settings, new, _half_lookup(lake, now), _link_lookup(lake, now))
    version = lake.overwrite_rows(TRANSACTION_STATE, pa.Table.from_pylist(rows, schema=TRANSACTION_STATE.arrow_schema))
    if version is None:
        raise LakeError(f"the overwrite of {lake.location(TRANSACTION_STATE)} committed no version; run the job again")
    job_run.row_counts.update(counts)
    newest = pc.max(new["store_timestamp"]).as_py() if new.num_rows else None
    return version, max(through, newest) if newest is not None else through


def _half_lookup(lake: Lake, version: int) -> Callable[[set[HalfPosition], set[RecordKey]], pa.Table]:
    """The HALF rows of ``transaction_records`` (at ``version``) at positions or commit log offsets."""

    def lookup(positions: set[HalfPosition], offsets: set[RecordKey]) -> pa.Table:
        filters = [[("kind", "=", HALF), *_within("queue_offset", {p[2] for p in positions})]] if positions else []
        if offsets:
            filters.append([("kind", "=", HALF), *_within("commit_log_offset", {o[1] for o in offsets})])
        rows = lake.read_rows(TRANSACTION_RECORDS, filters=filters, version=version)
        keep = [
            (r["broker_name"], r["queue_id"], r["queue_offset"]) in positions
            or (r["broker_name"], r["commit_log_offset"]) in offsets
            for r in rows.select(["broker_name", "queue_id", "queue_offset", "commit_log_offset"]).to_pylist()
        ]
        return rows.filter(pa.array(keep, pa.bool_()))

    return lookup


def _link_lookup(lake: Lake, version: int) -> Callable[[set[RecordKey], set[TransactionKey]], pa.Table]:
    """The FINAL rows naming commit log offsets and the DISCARD rows of keys among
    ``transaction_records`` (at ``version``)."""

    def lookup(offsets: set[RecordKey], keys: set[TransactionKey]) -> pa.Table:
        filters = []
        if offsets:
            filters.append([("kind", "=", FINAL), *_within("prepared_transaction_offset", {o[1] for o in offsets})])
        if keys:
            filters.append([("kind", "=", DISCARD), ("uniq_key", "in", sorted({k[2] for k in keys}))])
        if not filters:
            return TRANSACTION_RECORDS.arrow_schema.empty_table()
        rows = lake.read_rows(TRANSACTION_RECORDS, filters=filters, version=version)
        keep = [
            (r["broker_name"], r["prepared_transaction_offset"]) in offsets
            if r["kind"] == FINAL
            else (r["broker_name"], r["producer_group"], r["uniq_key"]) in keys
            for r in rows.to_pylist()
        ]
        return rows.filter(pa.array(keep, pa.bool_()))

    return lookup


def _within(column: str, values: set[int]) -> list[tuple[str, str, Any]]:
    """Filters keeping ``values`` of ``column``: the range first, which file statistics prune by."""
    return [(column, ">=", min(values)), (column, "<=", max(values)), (column, "in", sorted(values))]


def _record_counts(records_df: DataFrame) -> dict[str, int]:
    """Records read, by kind, in one pass (an op record counts once, whatever its body lists)."""
    kind = F.col("kind")
    op = F.when(kind == F.lit(OP), F.struct("broker_name", "commit_log_offset"))
    ignored = F.when((kind == F.lit(OP)) & ~F.col("removes"), F.struct("broker_name", "commit_log_offset"))
    counts = {
        "half_records": F.count_if(kind == F.lit(HALF)),
        "op_records": F.count_distinct(op),
        "ignored_op_records": F.count_distinct(ignored),
        "final_records": F.count_if(kind == F.lit(FINAL)),
        "discard_records": F.count_if(kind == F.lit(DISCARD)),
    }
    row = records_df.select(*[value.alias(name) for name, value in counts.items()]).first()
    return {name: int(row[name]) if row is not None else 0 for name in counts}


def summarize(state: pa.Table, as_of: int, show: int) -> TransactionSummary:
    """Count ``transaction_state`` rows per state and per anomaly; list the ``show`` oldest CHECK_DUE
    rows (by born time, broker, half commit log offset). On the driver: the table holds one row per
    transaction, not per record."""
    counted = state.group_by("state").aggregate([("state", "count")]).to_pylist()
    states = {row["state"]: int(row["state_count"]) for row in counted}
    flags = pc.list_flatten(pc.split_pattern(state["anomaly"].drop_null(), ","))
    anomalies = {str(item["values"]): int(item["counts"]) for item in pc.value_counts(flags).to_pylist()}
    due_rows = state.filter(pc.equal(state["state"], CHECK_DUE))
    order = [("born_timestamp", "ascending"), ("broker_name", "ascending"), ("half_commit_log_offset", "ascending")]
    due = due_rows.sort_by(order).slice(0, show).to_pylist() if show else []
    return TransactionSummary(as_of, states, anomalies, due)


# ---------------------------------------------------------------------------------------------
# The printed summary
# ---------------------------------------------------------------------------------------------

_DUE_HEADER = ("#Broker Name", "#Producer Group", "#Uniq Key", "#Real Topic", "#QID", "#Half Offset", "#Checks", "#Age")


def format_summary(summary: TransactionSummary) -> list[str]:
    """The lines of a run's summary.

    Every state with its count (0 included) in precedence order, the anomaly counts in
    :data:`ANOMALIES` order (``none`` when there are none), the op records ignored for their tag
    (when known), then the CHECK_DUE transactions listed (oldest first) with producer group and
    age at ``as_of``, and how many more there are.
    """
    total = sum(summary.states.values())
    lines = [f"transaction state as of {iso_utc(summary.as_of)} ({summary.as_of}): {total} transactions"]
    lines += text_table([(state, str(summary.states.get(state, 0))) for state in STATES])
    found = [f"{name} {summary.anomalies[name]}" for name in ANOMALIES if summary.anomalies.get(name)]
    lines.append("anomalies: " + (", ".join(found) if found else "none"))
    if summary.ignored_ops:
        lines.append(f'op records ignored (tag is not "{REMOVE_TAG}"): {summary.ignored_ops}')
    due_total = summary.states.get(CHECK_DUE, 0)
    lines.append(f"check-back due now: {due_total}")
    if summary.check_due:
        lines += text_table([_DUE_HEADER, *(_due_cells(row, summary.as_of) for row in summary.check_due)])
    if due_total > len(summary.check_due):
        lines.append(f"... and {due_total - len(summary.check_due)} more")
    return lines


def _due_cells(row: Mapping[str, Any], as_of: int) -> tuple[str, ...]:
    return (
        row["broker_name"],
        row["producer_group"] or "-",
        row["uniq_key"] or "-",
        row["real_topic"] or "-",
        "-" if row["real_queue_id"] is None else str(row["real_queue_id"]),
        str(row["half_queue_offset"]),
        str(row["check_times"]),
        format_age(as_of - row["born_timestamp"]),
    )


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options of ``resolve_transactions``."""
    parser = job_parser(JOB, __doc__)
    add_as_of(parser)
    parser.add_argument(
        "--timeout-ms",
        type=int,
        default=TRANSACTION_TIMEOUT_MS,
        help=f"broker transactionTimeOut, ms (default {TRANSACTION_TIMEOUT_MS})",
    )
    parser.add_argument(
        "--check-max",
        type=int,
        default=TRANSACTION_CHECK_MAX,
        help=f"broker transactionCheckMax (default {TRANSACTION_CHECK_MAX})",
    )
    parser.add_argument(
        "--reserve-ms",
        type=int,
        default=FILE_RESERVED_MS,
        help=f"broker file reserve time, ms (default {FILE_RESERVED_MS}, 72 h)",
    )
    parser.add_argument("--show", type=int, default=20, help="CHECK_DUE transactions to list (default 20)")
    parser.add_argument(
        "--full",
        action="store_true",
        help="rebuild transaction_records from the whole commit log when it is behind and decide every "
        "transaction (default: read only the new versions, decide only the transactions they touch)",
    )
    add_driver_limit(parser, "--driver-records", DRIVER_RECORDS, "transaction records")
    return parser


def build_config(argv: Sequence[str] | None = None) -> ResolveTransactionsConfig:
    """The config of ``argv``; ``--as-of`` defaults to the current time.

    Raises:
        ValidationError: ``--as-of`` is neither epoch ms nor ISO-8601 with a zone, or a setting is
            out of range.
        SystemExit: argparse usage errors and ``--help``.
    """
    args = build_parser().parse_args(argv)
    as_of = as_of_of(args.as_of)
    return ResolveTransactionsConfig(
        Path(args.lake),
        as_of,
        args.timeout_ms,
        args.check_max,
        args.reserve_ms,
        args.engine,
        args.show,
        args.full,
        args.driver_records,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` (before starting Spark), build the session, run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
