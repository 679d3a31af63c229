"""rebuild_consume_queue against its floor and a DuckDB peer, and an incremental run, in one run.

    python benchmarks/consume_queue.py [--messages 5000000] [--seed 1] [--repeat 3] [--keep DIR]
                                       [--perturb-peer]

1. Writes ``--messages`` messages through two real ASYNC_FLUSH brokers, streamed as ``send_batch``
   calls of 1,000 messages (about 200-byte bodies, tags, keys) over the demo topics' queues.
2. **full**: ``rebuild_consume_queue --full`` on that lake, without its output tables.
3. **floor**: the job's I/O with no logic between, through the same Lake I/O into a fresh lake
   root: Spark reads the commit log columns the job reads and writes the consume queue's columns
   (``tags_code`` is a sum of the other inputs' lengths, so that Spark decodes every column the
   job reads); the brokers' rows are read on the driver (the job's segment sizes); the integrity
   findings and the tails are written as the job writes them (from the driver: an empty
   findings commit on a clean log, one row per queue and broker log; the job's own rows), and a
   ``job_runs`` row is appended. Full run and floor alternate, ``--repeat`` times each (default
   3), the full run first (its tails are what the floor writes); the fastest run of each counts
   (the first runs in a JVM also pay for compiling code, so each side needs warm samples).
4. **peer**: DuckDB over the very Parquet files of the Delta log's active version, partition values
   taken from the log (not from directory names): the consume queue (dispatch rule, Java tags
   hash, schedule-topic delivery times) as one SQL query written to Parquet; then the integrity
   findings (every check with its detail text, but no CRC: DuckDB has no CRC-32) and the tails as
   a second statement, timed apart (``benchmarks/peers.py``). Then the peer's three tables are
   compared with the job's on every column (``benchmarks/compare.py``); CRC_MISMATCH findings are
   left out of it, and the output says so. A peer that differs gets no ratio, the output says
   which columns differ with example rows, and the benchmark exits with status 1.
   ``--perturb-peer`` changes one value of the peer's consume queue before the comparison, to
   show that a difference is caught.
5. **incremental**: 1 % more messages through the brokers, then ``rebuild_consume_queue``.

Targets: full <= 1.5 x floor; incremental <= 10 % of full.
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
from peers import time_consume_queue_peer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.tools import TOPICS
from jobs.lake import Lake, build_session
from jobs.rebuild_consume_queue import APP_ID, RebuildConfig, run
from jobs.runs import JobRun, record_run
from schemas.catalog import BROKERS, COMMITLOG, CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS

JOB = "rebuild_consume_queue"
OUTPUTS = (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS)
# the commit log columns rebuild_consume_queue reads (with_tags_code, with_record_checks, CHECKED_COLUMNS)
JOB_INPUTS = (
    "broker_name",
    "segment",
    "commit_log_offset",
    "store_size",
    "magic_code",
    "body_crc",
    "queue_id",
    "queue_offset",
    "sys_flag",
    "store_timestamp",
    "body",
    "topic",
    "raw_properties",
    "tags",
)
SPARK_CONF = {
    "spark.driver.memory": "4g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def write_messages(lake: Path, messages: int, seed: int, first_key: int = 0) -> float:
    """Send ``messages`` messages over the demo topics (a topic per batch, in turn) through two
    ASYNC_FLUSH brokers (:func:`batches.send_batches`); the seconds until the last commit."""

    def topic_of(index: int) -> tuple[str, Sequence[str | None]]:
        topic, _, tags, _ = TOPICS[index % len(TOPICS)]
        return topic, tags

    return send_batches(lake, messages, seed, topic_of, first_key)


# ---------------------------------------------------------------------------------------------
# Spark: the job and its floor
# ---------------------------------------------------------------------------------------------


def time_job(spark: SparkSession, lake: Path, full: bool) -> float:
    """Seconds of one ``rebuild_consume_queue`` run (its stdout summary included); a full run
    starts from a lake without the job's output tables."""
    if full:
        for spec in OUTPUTS:
            shutil.rmtree(lake / spec.path, ignore_errors=True)
    started = time.perf_counter()
    job_run = run(spark, RebuildConfig(lake, full=full, engine="bridge"))
    elapsed = time.perf_counter() - started
    assert job_run.status == "SUCCEEDED", job_run.status
    return elapsed


def floor_units(commitlog_df: DataFrame) -> DataFrame:
    """The consume queue's columns straight from the job's inputs: no dispatch rule, no hash, no
    checks; ``tags_code`` sums what the other inputs hold so that Spark must decode them all."""
    touched = (
        F.length("body")
        + F.length("raw_properties")
        + F.coalesce(F.length("tags"), F.lit(0))
        + F.col("magic_code")
        + F.col("body_crc")
        + F.col("sys_flag")
        + F.col("segment")
    )
    return commitlog_df.select(*JOB_INPUTS).select(
        *[touched.cast("long").alias(n) if n == "tags_code" else F.col(n) for n in CONSUME_QUEUE.column_names]
    )


def time_floor(spark: SparkSession, lake: Path, floor_root: Path, engine: str = "bridge") -> float:
    """Seconds of the job's I/O with no logic, into a fresh lake root (module docstring, 3.): the
    commit log read and the consume queue written by Spark, the brokers read and the findings,
    the tails and a ``job_runs`` row written from the driver, as the job does. The findings and
    tails written are the job's latest (read before the clock starts; none before a first run);
    findings are written by Spark when there are some, as the job writes them. ``engine``: the
    lake engine of the reads and writes, the one the job ran with."""
    shutil.rmtree(floor_root, ignore_errors=True)
    source, target = Lake(spark, lake, engine), Lake(spark, floor_root, engine)
    tails = source.read_rows(CONSUME_QUEUE_TAILS)
    found = source.row_count(CONSUME_QUEUE_INTEGRITY)
    findings_df = source.read(CONSUME_QUEUE_INTEGRITY).persist() if found else None
    if findings_df is not None:
        findings_df.count()
    try:
        started = time.perf_counter()
        version = source.version(COMMITLOG)
        assert version is not None, "no commit log"
        source.read_rows(BROKERS)
        target.overwrite(CONSUME_QUEUE, floor_units(source.read(COMMITLOG, version=version)), APP_ID, version)
        if findings_df is None:
            empty = CONSUME_QUEUE_INTEGRITY.arrow_schema.empty_table()
            target.overwrite_rows(CONSUME_QUEUE_INTEGRITY, empty, APP_ID, version)
        else:
            target.overwrite(CONSUME_QUEUE_INTEGRITY, findings_df, APP_ID, version)
        target.overwrite_rows(CONSUME_QUEUE_TAILS, tails, APP_ID, version)
        record_run(target, JobRun(JOB).finish("SUCCEEDED", "floor"))
        return time.perf_counter() - started
    finally:
        if findings_df is not None:
            findings_df.unpersist()


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures and ratios; 1 when the peer differs from the job."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the floor and the full rebuild each")
    parser.add_argument("--keep", type=Path, default=None, help="work directory to keep (default: a temp dir)")
    parser.add_argument(
        "--perturb-peer",
        action="store_true",
        help="change one value of the peer's consume queue before the comparison (proves the gate: exit status 1)",
    )
    args = parser.parse_args(argv)
    root = (args.keep or Path(tempfile.mkdtemp(prefix="cq-bench-"))).resolve()
    try:
        return _bench(root, args.messages, args.seed, max(1, args.repeat), args.perturb_peer)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _bench(root: Path, messages: int, seed: int, repeat: int, perturb: bool) -> int:
    lake = root / "lake"
    write_seconds = write_messages(lake, messages, seed)
    print(
        f"workload: {messages:,} messages in {write_seconds:.1f} s ({messages / write_seconds:,.0f} msg/s), "
        f"{len(list((lake / 'commitlog' / '_delta_log').glob('*.json')))} commits",
        flush=True,
    )
    spark = build_session("bench-consume-queue", master="local[*]", engine="bridge", extra_conf=SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    Lake(spark, lake, "bridge").read(COMMITLOG).select("store_size").agg(F.sum("store_size")).collect()  # warm-up
    # each measured alternately: the first runs of a JVM also pay for compiling code
    floors: list[float] = []
    fulls: list[float] = []
    for _ in range(repeat):
        fulls.append(time_job(spark, lake, full=True))
        floors.append(time_floor(spark, lake, root / "floor"))
    floor, full = min(floors), min(fulls)
    peer = time_consume_queue_peer(lake, root / "peer", perturb)
    new = max(1, messages // 100)
    new_write_seconds = write_messages(lake, new, seed + 1, first_key=messages)
    incremental = time_job(spark, lake, full=False)
    spark.stop()
    cq_rows = peer.outcome.checks[0].peer_rows
    verdict = "same as the job on every column" if peer.outcome.same else peer.outcome.note()
    rows = [
        (f"full rebuild (rebuild_consume_queue --full), best of {repeat}", full, _runs(fulls)),
        (f"floor (the job's reads and writes), best of {repeat}", floor, _runs(floors)),
        ("DuckDB peer: consume queue, one query", peer.units_seconds, f"{cq_rows:,} rows"),
        ("DuckDB peer: integrity checks (no CRC) and tails", peer.checks_seconds, verdict),
        (f"incremental after {new:,} new messages (1 %)", incremental, f"written in {new_write_seconds:.1f} s"),
    ]
    print(f"\n{messages:,} messages, {os.cpu_count() or 1} cores")
    for name, seconds, note in rows:
        print(f"  {name:<52}{seconds:>8.1f} s   {note}")
    print(f"  full / floor        {full / floor:6.2f}   (target <= 1.50)")
    if peer.outcome.same:
        print(f"  full / DuckDB peer  {full / peer.outcome.seconds:6.2f}   (consume queue, checks and tails)")
    else:
        print(f"  full / DuckDB peer       -   ({peer.outcome.note()})")
    print(f"  incremental / full  {incremental / full:6.2%}   (target <= 10 %)")
    print("\npeer against the job, every column:")
    print("\n".join(f"  {line}" for line in peer.outcome.lines()))
    if not peer.outcome.same:
        print("\nthe peer differs from the job: exit status 1")
        return 1
    return 0


def _runs(seconds: list[float]) -> str:
    """The runs in order, e.g. ``14.2 s, 8.1 s, 8.3 s``."""
    return ", ".join(f"{s:.1f} s" for s in seconds)


if __name__ == "__main__":
    raise SystemExit(main())
