"""The ``nightly`` pipeline: every job in order in one Spark session (compaction, consume queues,
offsets, transactions, dead letters, report) at T = the lake's newest data time, so a rerun without
new data changes no table; on an empty lake it first writes a demo workload. It sits above the jobs
it runs. See docs/jobs.md (nightly).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from jobs.cli import add_as_of, as_of_of, iso_utc, job_parser, run_spark_job, text_table
from jobs.lake import Lake, open_table
from jobs.runs import JobRun, recorded_run, table_versions
from schemas.catalog import (
    COMMITLOG,
    CONSUMER_OFFSET_COMMITS,
    DLQ_REDRIVES,
    QUEUE_HOURS,
    SUBSCRIPTION_GROUP,
    TABLES,
    TableSpec,
)
from schemas.errors import ValidationError

JOB = "nightly"
STEPS = (
    "compact_commitlog",
    "rebuild_consume_queue",
    "consumer_offsets",
    "resolve_transactions",
    "route_dlq",
    "report",
)
# the newest time of each input's rows, read from the Delta log's per-file statistics
DATA_TIMES: tuple[tuple[TableSpec, str], ...] = (
    (COMMITLOG, "store_timestamp"),
    (CONSUMER_OFFSET_COMMITS, "commit_timestamp"),
    (SUBSCRIPTION_GROUP, "updated_timestamp"),
    (DLQ_REDRIVES, "updated_timestamp"),
)


@dataclass(frozen=True)
class NightlyConfig:
    """Options of the nightly job.

    Attributes:
        lake: the lake root.
        as_of: T for the steps, epoch ms; None for the time of the lake's latest data.
        demo_messages: messages of the demo workload written into an empty lake, >= 1.
        demo_transactions: transactions of that workload, >= 0.
        seed: seed of that workload.
        out: the report's directory; None for the report's default.
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.

    Raises:
        ValidationError: a demo size out of range.
    """

    lake: Path
    as_of: int | None = None
    demo_messages: int = 20_000
    demo_transactions: int = 300
    seed: int = 1
    out: Path | None = None
    engine: str = "auto"

    def __post_init__(self) -> None:
        for name, minimum in (("demo_messages", 1), ("demo_transactions", 0)):
            value = getattr(self, name)
            if value < minimum:
                raise ValidationError(name, value, f"is below {minimum}", f"pass a value >= {minimum}")


def broker_summary(queue_hours: Iterable[Mapping[str, Any]], segments: Mapping[str, int]) -> list[dict[str, Any]]:
    """Per broker, from ``queue_hours`` rows and the number of commit log segments per broker:
    messages, bytes, segments, topics, and the first and last store times (ms)."""
    brokers: dict[str, dict[str, Any]] = {}
    topics: dict[str, set[str]] = {}
    for row in queue_hours:
        name = row["broker_name"]
        topics.setdefault(name, set()).add(row["topic"])
        seen = brokers.get(name)
        if seen is None:
            brokers[name] = {
                "broker_name": name,
                "messages": row["messages"],
                "bytes": row["bytes"],
                "segments": segments.get(name, 0),
                "topics": 0,
                "first_store_timestamp": row["first_store_timestamp"],
                "last_store_timestamp": row["last_store_timestamp"],
            }
            continue
        seen["messages"] += row["messages"]
        seen["bytes"] += row["bytes"]
        seen["first_store_timestamp"] = min(seen["first_store_timestamp"], row["first_store_timestamp"])
        seen["last_store_timestamp"] = max(seen["last_store_timestamp"], row["last_store_timestamp"])
    for name, row in brokers.items():
        row["topics"] = len(topics[name])
    return [brokers[name] for name in sorted(brokers)]


def segments_per_broker(lake: Lake) -> dict[str, int]:
    """The number of commit log segments holding data, per broker, from the Delta log's partition
    values (no data file is read)."""
    if not lake.exists(COMMITLOG):
        return {}
    actions = pa.table(open_table(str(lake.location(COMMITLOG)), None).get_add_actions(flatten=True))
    pairs = zip(actions["partition.broker_name"].to_pylist(), actions["partition.segment"].to_pylist(), strict=True)
    counted: dict[str, int] = {}
    for broker, _ in set(pairs):
        counted[broker] = counted.get(broker, 0) + 1
    return counted


def data_time(lake: Lake) -> int | None:
    """The newest time (epoch ms) of the lake's inputs (:data:`DATA_TIMES`), from the ``max``
    statistics of the Delta log's active files; None when no input has a row."""
    values = [lake.newest_value(spec, column) for spec, column in DATA_TIMES]
    return max((int(v) for v in values if v is not None), default=None)


def run(spark: SparkSession, config: NightlyConfig) -> JobRun:
    """Run the pipeline on ``config.lake`` (module docstring); print each step's output and a
    summary with the report's path; record and return the nightly run.

    Raises:
        Exception: the failing step's error, after the nightly FAILED row is recorded.
    """
    lake = Lake(spark, config.lake, config.engine)
    if not lake.exists(COMMITLOG) or lake.read(COMMITLOG).limit(1).count() == 0:
        from broker_model.tools import run_workload

        report = run_workload(
            config.lake,
            config.demo_messages,
            config.seed,
            consumers=True,
            transactions=config.demo_transactions,
            retries=True,
        )
        print(f"empty lake: wrote a demo workload, {report.summary()}")
    as_of = config.as_of if config.as_of is not None else data_time(lake) or time.time_ns() // 1_000_000
    print(f"{JOB}: lake {config.lake} (engine {lake.engine}), as of {iso_utc(as_of)} ({as_of})")
    with recorded_run(lake, JOB, {"as_of": as_of}) as job_run:
        job_run.input_versions = table_versions(lake, list(TABLES))
        done: list[tuple[str, JobRun]] = []
        for step in STEPS:
            print(f"--- {step}")
            try:
                done.append((step, _STEP_RUNNERS[step](spark, config, as_of)))
            except Exception as err:
                print(f"{JOB}: step {step} failed ({type(err).__name__}: {err}); the steps before it are committed")
                job_run.message = f"step {step} failed"
                raise
        from jobs.report import page_of

        report_path = page_of(done[-1][1])
        _print_steps(done)
        from jobs import hours

        summary_versions = hours.update(lake)
        queue_hours = (
            lake.read_rows(QUEUE_HOURS, version=summary_versions[QUEUE_HOURS.name]).to_pylist()
            if QUEUE_HOURS.name in summary_versions
            else []
        )
        _print_rows("commit log per broker", BROKER_COLUMNS, broker_summary(queue_hours, segments_per_broker(lake)))
        print(f"report: {report_path}")
        job_run.output_versions = table_versions(lake, list(TABLES))
        job_run.row_counts = {step: sum(run.row_counts.values()) for step, run in done}
        job_run.parameters["page"] = report_path
        job_run.conclude("SUCCEEDED", ", ".join(f"{step} {run.status}" for step, run in done))
    return job_run


def _compact(spark: SparkSession, config: NightlyConfig, as_of: int) -> JobRun:
    from jobs.compact_commitlog import CompactConfig
    from jobs.compact_commitlog import run as compact

    # by default compaction leaves the files an incremental step has not read yet
    return compact(spark, CompactConfig(config.lake, engine=config.engine))


def _rebuild(spark: SparkSession, config: NightlyConfig, as_of: int) -> JobRun:
    from jobs.rebuild_consume_queue import RebuildConfig
    from jobs.rebuild_consume_queue import run as rebuild

    return rebuild(spark, RebuildConfig(config.lake, engine=config.engine))


def _offsets(spark: SparkSession, config: NightlyConfig, as_of: int) -> JobRun:
    from jobs.consumer_offsets import ConsumerOffsetsConfig
    from jobs.consumer_offsets import run as offsets

    return offsets(spark, ConsumerOffsetsConfig(config.lake, as_of, engine=config.engine))


def _transactions(spark: SparkSession, config: NightlyConfig, as_of: int) -> JobRun:
    from jobs.resolve_transactions import ResolveTransactionsConfig
    from jobs.resolve_transactions import run as resolve

    return resolve(spark, ResolveTransactionsConfig(config.lake, as_of, engine=config.engine, show=5))


def _dlq(spark: SparkSession, config: NightlyConfig, as_of: int) -> JobRun:
    from jobs.dlq.job import RouteDlqConfig
    from jobs.dlq.job import run as route

    return route(spark, RouteDlqConfig(config.lake, as_of, engine=config.engine, show=5))


def _report(spark: SparkSession, config: NightlyConfig, as_of: int) -> JobRun:
    from jobs.report import ReportConfig
    from jobs.report import run as report

    return report(spark, ReportConfig(config.lake, as_of, config.out, engine=config.engine))


_STEP_RUNNERS: dict[str, Callable[[SparkSession, NightlyConfig, int], JobRun]] = {
    "compact_commitlog": _compact,
    "rebuild_consume_queue": _rebuild,
    "consumer_offsets": _offsets,
    "resolve_transactions": _transactions,
    "route_dlq": _dlq,
    "report": _report,
}


def _print_steps(done: Sequence[tuple[str, JobRun]]) -> None:
    rows = [("#Step", "#Status", "#Seconds", "#Figures")]
    rows += [(step, run.status, f"{(run.duration_ms or 0) / 1000:.1f}", _figures(run.row_counts)) for step, run in done]
    print(f"{JOB} steps")
    print("\n".join("  " + line for line in text_table(rows)))


def _figures(row_counts: dict[str, int], shown: int = 4) -> str:
    """The first ``shown`` of a run's row counts as ``name=value``."""
    items = [f"{name}={value}" for name, value in list(row_counts.items())[:shown]]
    return ", ".join(items) + (", ..." if len(row_counts) > shown else "")


BROKER_COLUMNS = (
    "broker_name",
    "messages",
    "bytes",
    "segments",
    "topics",
    "first_store_timestamp",
    "last_store_timestamp",
)


def _print_rows(title: str, names: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    widths = [max(len(n), *(len(str(r[n])) for r in rows)) if rows else len(n) for n in names]
    print(title)
    print("  " + "  ".join(n.rjust(w) for n, w in zip(names, widths, strict=True)))
    for row in rows:
        print("  " + "  ".join(str(row[n]).rjust(w) for n, w in zip(names, widths, strict=True)))


def build_parser() -> argparse.ArgumentParser:
    """Options of ``nightly``."""
    parser = job_parser(JOB, __doc__)
    add_as_of(
        parser, "T for every step: epoch ms or ISO-8601 with a zone (default: the time of the lake's latest data)"
    )
    parser.add_argument("--out", help="directory of the report (default: <lake>/../reports/<UTC date of T>)")
    parser.add_argument(
        "--demo-messages", type=int, default=20_000, help="messages of the demo workload written into an empty lake"
    )
    parser.add_argument("--demo-transactions", type=int, default=300, help="transactions of the demo workload")
    parser.add_argument("--seed", type=int, default=1, help="seed of the demo workload")
    return parser


def build_config(argv: Sequence[str] | None = None) -> NightlyConfig:
    """The config of ``argv``.

    Raises:
        ValidationError: a bad ``--as-of`` or demo size.
    """
    args = build_parser().parse_args(argv)
    as_of = as_of_of(args.as_of) if args.as_of is not None else None
    out = Path(args.out) if args.out else None
    return NightlyConfig(
        Path(args.lake), as_of, args.demo_messages, args.demo_transactions, args.seed, out, args.engine
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv``, build the session, run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
