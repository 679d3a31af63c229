"""rebuild_consume_queue against its floor and a DuckDB peer, and an incremental run, in one run.

    python benchmarks/consume_queue.py [--messages 5000000] [--seed 1] [--repeat 3] [--keep DIR]

1. Writes ``--messages`` messages through two real ASYNC_FLUSH brokers, streamed as ``send_batch``
   calls of 1,000 messages (about 200-byte bodies, tags, keys) over the demo topics' queues.
2. **floor**: Spark reads the commit log columns the job reads and writes the consume queue's
   columns (and an empty integrity table) through the same Lake I/O, with no logic: ``tags_code``
   is a sum of the other inputs' lengths, so that Spark decodes every column the job reads.
3. **full**: ``rebuild_consume_queue --full`` on that lake, without its output tables.
   Floor and full run alternately, ``--repeat`` times each (default 3); the fastest run of each
   counts (the first runs in a JVM also pay for compiling code, so each side needs warm samples).
4. **peer**: DuckDB over the very Parquet files of the Delta log's active version, partition values
   taken from the log (not from directory names): the consume queue (dispatch rule, Java tags
   hash, schedule-topic delivery times) as one SQL query written to Parquet; then the integrity
   checks as a second query (no CRC: DuckDB has no CRC-32), timed apart.
5. **incremental**: 1 % more messages through the brokers, then ``rebuild_consume_queue``.

Targets: full <= 1.5 x floor; incremental <= 10 % of full.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote

import duckdb
import pyarrow as pa
from batches import send_batches
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.common import constants as c
from broker_model.tools import TOPICS
from jobs.lake import Lake, build_session
from jobs.rebuild_consume_queue import RebuildConfig, run
from schemas.catalog import COMMITLOG, CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, spark_schema

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


# ---------------------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------------------


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
        for spec in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY):
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


def time_floor(spark: SparkSession, lake: Path, floor_root: Path) -> float:
    """Seconds to read the job's input columns and write the consume queue (and an empty integrity
    table) through the Lake I/O, into a fresh lake root."""
    shutil.rmtree(floor_root, ignore_errors=True)
    started = time.perf_counter()
    source, target = Lake(spark, lake, "bridge"), Lake(spark, floor_root, "bridge")
    target.overwrite(CONSUME_QUEUE_INTEGRITY, spark.createDataFrame([], spark_schema(CONSUME_QUEUE_INTEGRITY)))
    target.overwrite(CONSUME_QUEUE, floor_units(source.read(COMMITLOG)))
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# DuckDB: the peer
# ---------------------------------------------------------------------------------------------

# Java String.hashCode over UTF-16 consume-queue rows from code points: a code point above the BMP is the
# surrogate pair (hi, lo), i.e. two steps h*31+hi, h*31+lo, folded into h*961 + hi*31 + lo.
_JAVA_HASH = """
  (list_reduce(
     list_transform(string_split(tags, ''), lambda ch: unicode(ch)::BIGINT),
     lambda h, cp: CASE WHEN cp < 65536 THEN (h * 31 + cp) % 4294967296
                   ELSE (h * 961 + (55296 + ((cp - 65536) >> 10)) * 31 + (56320 + ((cp - 65536) & 1023)))
                        % 4294967296 END,
     0::BIGINT) + 2147483648) % 4294967296 - 2147483648
"""
_DELAY_MILLIS = "[" + ", ".join(str(ms) for ms in c.DELAY_LEVEL_MILLIS) + "]"

_LOG = """
  SELECT f.broker_name, f.segment, p.* EXCLUDE (filename)
  FROM read_parquet($files, filename = true) p JOIN files f ON p.filename = f.location
"""

UNITS_SQL = f"""
COPY (
  WITH log AS ({_LOG}),
  codes AS (SELECT tags, {_JAVA_HASH} AS tags_hash FROM (SELECT DISTINCT tags FROM log WHERE length(tags) > 0)),
  delayed AS (
    SELECT *, CASE WHEN topic = '{c.SCHEDULE_TOPIC}' THEN TRY_CAST(regexp_extract_all(
             decode(raw_properties), '(?:^|\\x02)DELAY\\x01([^\\x02]+)', 1)[-1] AS INTEGER) END AS delay
    FROM log WHERE (sys_flag & 12) IN (0, 8)),
  leveled AS (SELECT *, CASE WHEN delay > 18 THEN 18 ELSE delay END AS level FROM delayed)
  SELECT l.broker_name, l.topic, l.queue_id, l.queue_offset, l.commit_log_offset, l.store_size,
         CASE WHEN l.level > 0 THEN l.store_timestamp + {_DELAY_MILLIS}[l.level] ELSE coalesce(k.tags_hash, 0) END
           AS tags_code,
         l.store_timestamp
  FROM leveled l LEFT JOIN codes k ON l.tags = k.tags
) TO '$out' (FORMAT parquet, PARTITION_BY (topic), OVERWRITE_OR_IGNORE)
"""

CHECKS_SQL = f"""
COPY (
  WITH log AS ({_LOG}),
  sized AS (
    SELECT *, 91 + octet_length(body) + strlen(topic) + octet_length(raw_properties)
              + CASE WHEN sys_flag & 16 <> 0 THEN 12 ELSE 0 END + CASE WHEN sys_flag & 32 <> 0 THEN 12 ELSE 0 END
              + CASE WHEN magic_code = {c.MAGIC_CODE_V2} THEN 1 ELSE 0 END AS computed_size,
           $segment_size AS segment_size
    FROM log),
  queued AS (
    SELECT broker_name, topic, queue_id, queue_offset, commit_log_offset,
           lag(queue_offset) OVER q AS prior_offset, lag(commit_log_offset) OVER q AS prior_log_offset
    FROM log WHERE (sys_flag & 12) IN (0, 8)
    WINDOW q AS (PARTITION BY broker_name, topic, queue_id ORDER BY queue_offset, commit_log_offset)),
  chained AS (
    SELECT *, lead(commit_log_offset) OVER b AS next_offset, lead(store_size) OVER b AS next_size,
           commit_log_offset - commit_log_offset % segment_size + segment_size AS segment_end
    FROM sized WINDOW b AS (PARTITION BY broker_name ORDER BY commit_log_offset))
  SELECT broker_name, commit_log_offset, 'SIZE_MISMATCH' AS problem FROM sized WHERE computed_size <> store_size
  UNION ALL SELECT broker_name, commit_log_offset, 'BEYOND_SEGMENT' FROM sized
    WHERE segment <> commit_log_offset - commit_log_offset % segment_size
       OR commit_log_offset + store_size + 8 > segment + segment_size
  UNION ALL SELECT broker_name, commit_log_offset, 'SIZE_MISMATCH' FROM chained
    WHERE next_offset IS NOT NULL AND next_offset <> commit_log_offset + store_size
      AND NOT (next_offset = segment_end AND commit_log_offset + store_size + next_size + 8 > segment_end)
  UNION ALL SELECT broker_name, commit_log_offset, CASE
      WHEN prior_offset IS NULL OR queue_offset > prior_offset + 1 THEN 'GAP'
      WHEN queue_offset = prior_offset THEN 'DUPLICATE_QUEUE_OFFSET' ELSE 'NON_MONOTONIC_OFFSET' END
    FROM queued
    WHERE (prior_offset IS NULL AND queue_offset <> 0) OR queue_offset > prior_offset + 1
       OR queue_offset = prior_offset OR commit_log_offset <= prior_log_offset
) TO '$findings' (FORMAT parquet)
"""


def delta_files(table_dir: Path) -> pa.Table:
    """The active files of a Delta table: absolute ``location`` and typed partition values."""
    actions = pa.table(DeltaTable(str(table_dir)).get_add_actions(flatten=True))
    locations = [f"{table_dir}/{unquote(p)}" for p in actions.column("path").to_pylist()]
    return pa.table(
        {
            "location": pa.array(locations, pa.string()),
            "broker_name": actions.column("partition.broker_name"),
            "segment": actions.column("partition.segment"),
        }
    )


def time_peer(lake: Path, out_dir: Path, segment_size: int) -> tuple[float, float, int, int]:
    """(seconds of the consume-queue rows query, seconds of the checks query, consume-queue rows, findings)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    con = duckdb.connect()
    files = delta_files(lake / COMMITLOG.path)
    con.register("files", files)
    listing = "[" + ", ".join("'" + loc.replace("'", "''") + "'" for loc in files.column("location").to_pylist()) + "]"
    started = time.perf_counter()
    con.execute(UNITS_SQL.replace("$files", listing).replace("$out", str(out_dir / "units")))
    units_seconds = time.perf_counter() - started
    started = time.perf_counter()
    checks = CHECKS_SQL.replace("$files", listing).replace("$segment_size", str(segment_size))
    con.execute(checks.replace("$findings", str(out_dir / "findings.parquet")))
    checks_seconds = time.perf_counter() - started
    cq_rows = con.execute(f"SELECT count(*) FROM read_parquet('{out_dir}/units/**/*.parquet')").fetchone()
    findings = con.execute(f"SELECT count(*) FROM read_parquet('{out_dir}/findings.parquet')").fetchone()
    return units_seconds, checks_seconds, int(cq_rows[0]) if cq_rows else -1, int(findings[0]) if findings else -1


def units_digest(con: duckdb.DuckDBPyConnection, parquet_glob: str) -> tuple[int, int, int]:
    """(rows, sum of tags_code, sum of commit_log_offset * queue_offset) of consume queue files."""
    row = con.execute(
        "SELECT count(*), sum(tags_code), sum(commit_log_offset::HUGEINT * queue_offset) "
        f"FROM read_parquet('{parquet_glob}', union_by_name = true)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1] or 0), int(row[2] or 0)


def job_digest(lake: Path) -> tuple[int, int, int]:
    """:func:`units_digest` of the job's consume_queue (its active Delta files)."""
    table_dir = lake / CONSUME_QUEUE.path
    actions = pa.table(DeltaTable(str(table_dir)).get_add_actions(flatten=True))
    listing = ", ".join(f"'{table_dir}/{unquote(p)}'" for p in actions.column("path").to_pylist())
    row = (
        duckdb.connect()
        .execute(
            "SELECT count(*), sum(tags_code), sum(commit_log_offset::HUGEINT * queue_offset) "
            f"FROM read_parquet([{listing}])"
        )
        .fetchone()
    )
    assert row is not None
    return int(row[0]), int(row[1] or 0), int(row[2] or 0)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the floor and the full rebuild each")
    parser.add_argument("--keep", type=Path, default=None, help="work directory to keep (default: a temp dir)")
    args = parser.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="cq-bench-"))
    try:
        return _bench(root, args.messages, args.seed, max(1, args.repeat))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _bench(root: Path, messages: int, seed: int, repeat: int) -> int:
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
        floors.append(time_floor(spark, lake, root / "floor"))
        fulls.append(time_job(spark, lake, full=True))
    floor, full = min(floors), min(fulls)
    units_s, checks_s, peer_units, peer_findings = time_peer(lake, root / "peer", c.DEFAULT_SEGMENT_SIZE)
    peer_digest = units_digest(duckdb.connect(), f"{root}/peer/units/**/*.parquet")
    agree = peer_digest == job_digest(lake)
    new = max(1, messages // 100)
    new_write_seconds = write_messages(lake, new, seed + 1, first_key=messages)
    incremental = time_job(spark, lake, full=False)
    spark.stop()
    rows = [
        (f"full rebuild (rebuild_consume_queue --full), best of {repeat}", full, _runs(fulls)),
        (f"floor (scan {len(JOB_INPUTS)} columns, write units), best of {repeat}", floor, _runs(floors)),
        ("DuckDB peer: consume queue, one query", units_s, f"{peer_units:,} units, same as the job: {agree}"),
        ("DuckDB peer: integrity checks (no CRC)", checks_s, f"{peer_findings} findings"),
        (f"incremental after {new:,} new messages (1 %)", incremental, f"written in {new_write_seconds:.1f} s"),
    ]
    print(f"\n{messages:,} messages, {spark_cores()} cores")
    for name, seconds, note in rows:
        print(f"  {name:<52}{seconds:>8.1f} s   {note}")
    print(f"  full / floor        {full / floor:6.2f}   (target <= 1.50)")
    print(f"  full / DuckDB peer  {full / (units_s + checks_s):6.2f}   (units and checks)")
    print(f"  incremental / full  {incremental / full:6.2%}   (target <= 10 %)")
    return 0


def _runs(seconds: list[float]) -> str:
    """The runs in order, e.g. ``14.2 s, 8.1 s, 8.3 s``."""
    return ", ".join(f"{s:.1f} s" for s in seconds)


def spark_cores() -> int:
    """Cores of this machine (the local[*] master uses them all)."""
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    raise SystemExit(main())
