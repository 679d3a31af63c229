"""replay_ordered into a Delta table against its floor, in one run.

    python benchmarks/replay.py [--messages 2000000] [--batch-rows 10000] [--seed 1] [--repeat 3] [--keep DIR]

1. Writes ``--messages`` messages through two real ASYNC_FLUSH brokers into topic ``Replay``
   (8 queues on each broker: 16 queues), as ``send_batch`` calls of 1,000 messages with
   ~200-byte bodies, tags and keys, round robin over the queues.
2. **replay**: ``replay_ordered --topic Replay --to-table ...`` (a fresh replay id and sink): the
   queue ranges, the per-queue ordered write, one commit per batch with its progress, the
   ordering report read back from the sink.
3. **floor**: Spark reads the same source rows (the commit log's dispatched records of the
   topic) and writes the sink's columns to a Delta table through the same Lake I/O, with no
   ordering, batches, progress or report.

Replay and floor run alternately, ``--repeat`` times each (default 3); the fastest run of each
counts (the first runs in a JVM also pay for compiling code, so each side needs warm samples).
Target: replay <= 2 x floor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from batches import send_batches
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.lake import Lake, build_session
from jobs.replay import MESSAGE_COLUMNS, ReplayConfig, TopicQueues, run, sink_spec
from jobs.rules import is_dispatched
from schemas.catalog import COMMITLOG

TOPIC = "Replay"
QUEUES_PER_BROKER = 8
TAGS = ("created", "paid", "shipped")
SPARK_CONF = {
    "spark.driver.memory": "4g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def write_messages(lake: Path, messages: int, seed: int) -> float:
    """Send ``messages`` messages to ``Replay`` (its queues created first) through two ASYNC_FLUSH
    brokers (:func:`batches.send_batches`); the seconds until the last commit."""
    return send_batches(lake, messages, seed, lambda _: (TOPIC, TAGS), queues=[(TOPIC, QUEUES_PER_BROKER)])


def time_replay(spark: SparkSession, lake: Path, sink: Path, replay_id: str, batch_rows: int) -> tuple[float, int]:
    """(seconds, rows) of one replay_ordered run into a fresh Delta table (report printed)."""
    shutil.rmtree(sink, ignore_errors=True)
    config = ReplayConfig(
        replay_id, lake, "queues", topics=(TopicQueues(TOPIC),), to_table=sink, batch_rows=batch_rows, engine="bridge"
    )
    started = time.perf_counter()
    job_run = run(spark, config)
    elapsed = time.perf_counter() - started
    assert job_run.status == "SUCCEEDED", job_run.status
    return elapsed, job_run.row_counts["replayed"]


def time_floor(spark: SparkSession, lake: Path, sink: Path) -> float:
    """Seconds to read the topic's dispatched records and write the sink's columns, no logic."""
    shutil.rmtree(sink, ignore_errors=True)
    started = time.perf_counter()
    log = Lake(spark, lake, "bridge")
    records_df = log.read(COMMITLOG).where(is_dispatched(F.col("sys_flag")) & (F.col("topic") == F.lit(TOPIC)))
    floor_df = records_df.select(
        F.lit("floor").alias("replay_id"),
        F.lit(0).cast("long").alias("replay_batch"),
        F.lit(0).cast("long").alias("replay_sequence"),
        F.col("broker_name").alias("source_broker_name"),
        F.col("topic").alias("source_topic"),
        F.col("queue_id").alias("source_queue_id"),
        F.col("queue_offset").alias("source_queue_offset"),
        F.col("commit_log_offset").alias("source_commit_log_offset"),
        *MESSAGE_COLUMNS,
    )
    log.overwrite(sink_spec(sink), floor_df)
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the floor and the replay each")
    parser.add_argument("--keep", type=Path, default=None, help="work directory to keep (default: a temp dir)")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="replay-bench-"))
    try:
        return _bench(root.absolute(), args.messages, args.batch_rows, args.seed, max(1, args.repeat))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _bench(root: Path, messages: int, batch_rows: int, seed: int, repeat: int) -> int:
    lake = root / "lake"
    if not (lake / COMMITLOG.path).exists():
        seconds = write_messages(lake, messages, seed)
        print(f"workload: {messages:,} messages over {2 * QUEUES_PER_BROKER} queues in {seconds:.1f} s", flush=True)
    spark = build_session("bench-replay", master="local[*]", engine="bridge", extra_conf=SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    Lake(spark, lake, "bridge").read(COMMITLOG).select(F.sum("store_size")).collect()  # warm-up
    floors: list[float] = []
    replays: list[float] = []
    rows = 0
    for attempt in range(repeat):
        floors.append(time_floor(spark, lake, root / "floor"))
        replay_id = f"bench-{time.time_ns()}"  # a new replay each time: a kept lake holds the old ones' progress
        seconds, rows = time_replay(spark, lake, root / f"sink-{attempt}", replay_id, batch_rows)
        replays.append(seconds)
    spark.stop()
    floor, replay = min(floors), min(replays)
    batches = -(-rows // (2 * QUEUES_PER_BROKER * batch_rows))
    print(
        f"\n{rows:,} messages over {2 * QUEUES_PER_BROKER} queues, {os.cpu_count()} cores, "
        f"--batch-rows {batch_rows} (about {batches} batches)"
    )
    runs = {name: ", ".join(f"{s:.1f} s" for s in values) for name, values in (("replay", replays), ("floor", floors))}
    print(
        f"  {f'replay into a Delta table, best of {repeat}':<52}{replay:>8.1f} s  {rows / replay:>10,.0f} msg/s   "
        f"({runs['replay']})"
    )
    print(
        f"  {f'floor (read the rows, write them), best of {repeat}':<52}{floor:>8.1f} s  "
        f"{rows / floor:>10,.0f} msg/s   ({runs['floor']})"
    )
    print(f"  replay / floor  {replay / floor:5.2f}   (target <= 2.00)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
