"""The main job: ``nightly``.

On an empty lake it first writes a demo workload through real brokers, then it summarises every
table of the lake (version, rows) and the commit log per broker and per topic, and records a
``job_runs`` row. Later capabilities (consume queues, offsets, transactions, dead letters) join
this pipeline as steps.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.lake_root import default_lake
from jobs.lake_io import Lake
from jobs.runs import JobRun, record_run, table_versions
from jobs.session import build_session
from schemas.catalog import COMMITLOG, TABLES


@dataclass(frozen=True)
class NightlyConfig:
    """Options of the nightly job."""

    lake: Path
    demo_messages: int = 20_000
    seed: int = 1
    engine: str = "auto"


def build_broker_summary(commitlog_df: DataFrame) -> DataFrame:
    """Per broker: messages, bytes, segments, topics, and the first and last store times (ms)."""
    return (
        commitlog_df.groupBy("broker_name")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum(F.col("store_size").cast("long")).alias("bytes"),
            F.countDistinct("segment").alias("segments"),
            F.countDistinct("topic").alias("topics"),
            F.min("store_timestamp").alias("first_store_timestamp"),
            F.max("store_timestamp").alias("last_store_timestamp"),
        )
        .select("broker_name", "messages", "bytes", "segments", "topics",
                "first_store_timestamp", "last_store_timestamp")
    )  # fmt: skip


def build_topic_summary(commitlog_df: DataFrame) -> DataFrame:
    """Per topic over all brokers: messages, bytes, queues ((broker, queue) pairs), brokers."""
    return (
        commitlog_df.groupBy("topic")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum(F.col("store_size").cast("long")).alias("bytes"),
            F.countDistinct("broker_name", "queue_id").alias("queues"),
            F.countDistinct("broker_name").alias("brokers"),
        )
        .select("topic", "messages", "bytes", "queues", "brokers")
    )


def run(spark: SparkSession, config: NightlyConfig) -> JobRun:
    """Run the pipeline on ``config.lake``; print the summary; record and return the run."""
    job_run = JobRun("nightly")
    lake = Lake(spark, config.lake, config.engine)
    if not lake.exists(COMMITLOG) or lake.read(COMMITLOG).limit(1).count() == 0:
        from broker_model.workload import run_workload

        report = run_workload(config.lake, config.demo_messages, config.seed)
        print(f"empty lake: wrote a demo workload, {report.summary()}")
    job_run.input_versions = table_versions(lake, list(TABLES))
    print(f"lake {config.lake} (engine {lake.engine})")
    for name in TABLES:
        if lake.exists(name):
            rows = lake.read(name).count()
            job_run.row_counts[name] = rows
            print(f"  {name:<26} version {job_run.input_versions.get(name, 0):>6}  rows {rows:>10}")
    commitlog_df = lake.read(COMMITLOG)
    _print_frame("commit log per broker", build_broker_summary(commitlog_df).orderBy("broker_name"))
    _print_frame("commit log per topic", build_topic_summary(commitlog_df).orderBy("topic"))
    record_run(lake, job_run.finish("SUCCEEDED"))
    return job_run


def _print_frame(title: str, df: DataFrame) -> None:
    rows = df.collect()
    names = df.columns
    widths = [max(len(n), *(len(str(r[n])) for r in rows)) if rows else len(n) for n in names]
    print(title)
    print("  " + "  ".join(n.rjust(w) for n, w in zip(names, widths, strict=True)))
    for row in rows:
        print("  " + "  ".join(str(row[n]).rjust(w) for n, w in zip(names, widths, strict=True)))


def build_parser() -> argparse.ArgumentParser:
    """Options of ``nightly``."""
    parser = argparse.ArgumentParser(prog="nightly", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    parser.add_argument("--demo-messages", type=int, default=20_000,
                        help="messages of the demo workload written into an empty lake")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1, help="seed of the demo workload")
    parser.add_argument("--engine", choices=["auto", "bridge", "delta-spark"], default="auto",
                        help="lake engine (auto: delta-spark when its classes load, else the bridge)")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv``, build the session, run."""
    args = build_parser().parse_args(argv)
    config = NightlyConfig(Path(args.lake), args.demo_messages, args.seed, args.engine)
    spark = build_session("rmq-nightly", engine=config.engine)
    job_run = run(spark, config)
    print(f"nightly {job_run.status} in {job_run.duration_ms} ms (run {job_run.run_id})")
    return 0
