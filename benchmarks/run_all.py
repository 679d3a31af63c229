"""Every job of the nightly pipeline, full and incremental, against its floor and a DuckDB peer.

    python benchmarks/run_all.py [--messages 2000000 | --large | --sizes N,N,... | --lake DIR [--lake DIR ...]]
                                 [--engine bridge|delta-spark|both] [--seed 1] [--keep DIR]
                                 [--json PATH] [--perturb-peer JOB]

All figures come from one run, on one lake, in one Spark session (``local[*]``) on one lake engine,
``--engine bridge`` (the default) or ``delta-spark`` (:func:`jobs.lake.build_session` adds the Delta
jar and confs): every job and its floor read and write through it. The compaction is the same on
both engines (it packs files with Arrow and commits them with the broker's put-if-absent
committer, :func:`jobs.lake.compact`), and so is its floor (Arrow, no commit).

**Both engines** (``--engine both``): a process holds one Spark session, so the lake is written
once (``<work dir>/source``) and each engine runs in a child process of its own (this script with
``--engine E --lake <work dir>/source``), one after the other, on a copy of that lake: both measure
the same data. Each child writes the increment into its copy with the same seed (the same messages
and transactions; only the times the brokers stamp differ). Each child prints its own table; then
one table puts both side by side: per job, each engine's full seconds, floor, DuckDB peer and
incremental seconds, the ratios delta-spark/bridge of the full and incremental seconds, and the
nightly's totals. With ``--sizes``, the same per size, then each engine's growth. ``--lake DIR``
runs one engine on a copy of such a kept source lake, or of one ``benchmarks/nightly_lake.py``
wrote; ``--lake`` once per size runs on a copy of each, then prints the growth over them (writing
a 2M users' lake takes longer than every job on it, so the lakes are written once).

**The lake.** (1) The feature traffic, first and on an empty lake: :func:`run_workload` of
:data:`FEATURE_MESSAGES` messages with its consumer groups (pulls and offset commits),
:data:`TRANSACTIONS` transactions with their check rounds, and the failing push consumers (retries,
delays, dead letters) on a simulated clock that ends before real time. (2) The bulk: ``--messages``
messages through two ASYNC_FLUSH brokers, streamed as ``send_batch`` calls of 1,000 messages
(:func:`benchmarks.consume_queue.write_messages`). The feature traffic comes first because its
retry groups consume their topics from the first offset: after the bulk they would have to consume
hundreds of thousands of messages in Python. Segments are :func:`segment_size` bytes (RocketMQ's
default is 1 GiB) so that the bulk seals segments and the compaction has work to do.

**The users' shape** (``--shape users``): ``--messages`` messages of the workload's whole mix
through three brokers, as a user's lake grows (:mod:`nightly_lake`): ordered, batched and delayed
sends, consumer groups that pull and commit their offsets many times, 3 transactions per 1,000
messages with check-backs, and push consumers failing into retries and dead letters; its increment
is 1 % of that mix, its consumers committing again, with no new retries.

**Full runs**, in the nightly order, each a first run on the lake (``full=True`` where the job has
it): ``compact_commitlog``, ``rebuild_consume_queue``, ``consumer_offsets``,
``resolve_transactions``, ``route_dlq``, ``report``. After each, its floor and its peer. The jobs
whose full run can run again on the same lake doing the same work (:data:`WARMED`) run once first,
and so does their floor, untimed: the JVM compiles a new query's code on its first run, and the
report imports its drawing library on its first plot, which a nightly pays once in its session,
not per job (as ``benchmarks/consume_queue.py`` takes the best of warm runs). Their outputs are
removed before the timed run (the report's page too), so that it does the whole work again. The
compaction cannot run again: its second run would have nothing to do. A job whose warm run took
under :data:`SHORT_RUN_SECONDS` is timed :data:`SHORT_RUN_REPEATS` times, each run followed by its
floor, and the table shows the median run and the median floor: a few tens of milliseconds of the
machine's noise would otherwise decide its ratio (the JSON keeps every sample).

- **floor**: the job's I/O with no logic between (:func:`plan_floor`): the job's inputs read the
  way the job reads them at this size (Spark scans that need every value of the columns the job
  scans, delta-rs reads on the driver of what it reads there; the job's own limits decide which)
  and every table the job writes, written into a fresh lake root through the same
  :class:`jobs.lake.Lake` call the job uses (Spark's ``overwrite`` or ``overwrite_rows`` from the
  driver, with the same application transaction), plus its ``job_runs`` row. The report's floor
  also looks up its previous run (the one job that does so on a first run too) and writes its
  page's files and its plots, drawn from the rows the job drew them from (the page's encoding, as
  Parquet is a table's). The rows written and drawn are the job's own, read before the floor's
  clock starts.
  After each timed run, the tables whose Delta version the job moved are checked against those
  its floor wrote: a floor that leaves one out gets no ratio and fails the run. The consume queue
  reuses the floor of ``benchmarks/consume_queue.py``; the compaction's is Arrow reading and
  writing the files it packs (the log's bins and the offset commits' small files), with no Delta
  commit, so its tables are not checked (:func:`time_compaction_floor`);
- **peer**: the same computation as DuckDB SQL over the Parquet files of the inputs' active Delta
  versions (file lists and partition values from the Delta log), then every column of every table
  it computes compared with the job's (``benchmarks/peers.py``, ``benchmarks/compare.py``): the
  consume queue with its integrity findings and tails, the consumer offsets, the transaction
  states, the retry chains and dead letters, and the report's hour tables. What a peer cannot
  compute faithfully is printed with the outcome (the CRC check of the findings; the extracts
  ``transaction_records`` and ``retry_records``; the report's page). The compaction has none (a
  Delta commit of remove/add actions is no query). A peer that differs gets no ratio: its note
  says which columns differ, examples of differing rows follow the table, and the run ends with
  exit status 1. ``--perturb-peer JOB`` changes one value of JOB's peer result before the
  comparison (:data:`peers.PERTURBED`), only to show that this gate works.

**Incremental runs**: 1 % more bulk messages, :data:`NEW_TRANSACTIONS` more transactions and one
offset commit per queue of ``cg-orders``; then every job again at one T, in the nightly's order (the
compaction only on files the other jobs had read, as the nightly does). No new retries: the retry
groups would consume the whole bulk (see above). Then **reruns**: every job once more with no new
data and the same T, as a second nightly would. A job whose incremental run took longer than its
full run then runs in full once more (**full after**) on the lake with the increment: the full run
it must not cost more than, on the same data, started with the Delta snapshots the process kept
when the incremental run started (the logs that run read first are not read again for free). A job
computed as of a time T runs right after its incremental run, as a user's ``--full`` does, on the
lake as it is, at T + 1 ms (then its incremental run again, untimed); when its incremental run took
under :data:`SHORT_RUN_SECONDS`, the two alternate :data:`SHORT_RUN_REPEATS` times, the job's tables
and ``job_runs`` rolled back to their versions before the incremental run each time, and both rows
show their medians (the first incremental run alone reads the increment's files cold); the others after the reruns,
on the lake without their tables. The table ends with the nightly's incremental total (and its share of the
full nightly), the total from scratch of the DuckDB peers that agree with their jobs against those
jobs' incremental total, and the rerun's total.

**Growth** (``--sizes 500000,1000000,2000000,5000000``): the whole run once per size, each on a lake
of its own, then per job and mode the seconds at every size and the exponent ``k`` of the
least-squares fit ``seconds ~ messages^k`` (1 is linear; above 1.1 is flagged), beside the same
fit of its floor's seconds: a job reading files that grow faster than the messages (the users'
shape's offset commits) grows as its floor does, and the flag says whether it grows faster.

Every job's stdout goes to ``<root>/logs``; the Spark UI's REST API gives each job's stages, so
the table's last lines say which stages dominate the slowest job.

**Exit status**: 1 when a peer differs from its job or a floor leaves out a table its job writes
(after the table, the comparisons and the JSON), else 0. With ``--engine both``, 1 when either
engine's run ends with a status other than 0; the JSON then holds both engines' figures, each
under its engine's name, and the side-by-side table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from compare import PeerOutcome
from consume_queue import SPARK_CONF
from deltalake import DeltaTable
from floors import compaction_bins, packed_commit_files, time_full_floor
from measured import ENGINES, JOBS, Measured, fmt, growth_rows, machine, print_growth
from nightly_lake import (
    FEATURE_MESSAGES,
    LAKE_FACTS,
    SHAPES,
    append_increment,
    copy_lake,
    describe,
    lake_size,
    read_lake_facts,
    write_lake,
)
from peers import (
    PERTURBED,
    time_consume_queue_peer,
    time_offsets_peer,
    time_report_peer,
    time_resolve_peer,
    time_route_peer,
)
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from two_engines import both, growth_both

from jobs.compact_commitlog import CompactConfig
from jobs.compact_commitlog import run as run_compact
from jobs.consumer_offsets import ConsumerOffsetsConfig
from jobs.consumer_offsets import run as run_offsets
from jobs.dlq.job import RouteDlqConfig
from jobs.dlq.job import run as run_route
from jobs.lake import Lake, SnapshotState, build_session, restore_snapshots, snapshot_state
from jobs.lake.snapshots import table_version
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as run_rebuild
from jobs.report import ReportConfig
from jobs.report import run as run_report
from jobs.resolve_transactions import ResolveTransactionsConfig
from jobs.resolve_transactions import run as run_resolve
from jobs.runs import JobRun
from schemas.catalog import (
    COMMIT_HOURS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUME_QUEUE_INTEGRITY,
    CONSUME_QUEUE_TAILS,
    CONSUMER_OFFSETS,
    DLQ,
    JOB_RUNS,
    QUEUE_HOURS,
    RETRY_CHAINS,
    RETRY_RECORDS,
    TABLES,
    TRANSACTION_RECORDS,
    TRANSACTION_STATE,
)

DEFAULT_MESSAGES = 2_000_000
LARGE_MESSAGES = 10_000_000
BOTH = "both"
# the UI stays on (unlike consume_queue.py) because its REST API times each stage; port 0: any free port
CONF = {**SPARK_CONF, "spark.ui.enabled": "true", "spark.ui.port": "0"}
WARMED = ("rebuild_consume_queue", "consumer_offsets", "resolve_transactions", "route_dlq", "report")
# a warm run shorter than this is timed this many times, with its floor after each: the medians are
# shown, a few tens of milliseconds of the machine's noise is a large share of such a run
SHORT_RUN_SECONDS = 2.0
SHORT_RUN_REPEATS = 3
TIMED_JOBS = ("consumer_offsets", "resolve_transactions", "route_dlq")  # computed as of a time T, with --full
NO_PEER = {
    "compact_commitlog": "n/a: a Delta commit of remove/add actions (dataChange=false) is no SQL query",
}
JOB_OUTPUTS = {
    "rebuild_consume_queue": (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS),
    "consumer_offsets": (CONSUMER_OFFSETS,),
    "resolve_transactions": (TRANSACTION_RECORDS, TRANSACTION_STATE),
    "route_dlq": (RETRY_RECORDS, RETRY_CHAINS, DLQ),
    "report": (QUEUE_HOURS, COMMIT_HOURS),
}
"""The tables each job writes besides ``job_runs`` (the warm-up's are deleted before the timed run;
the tables a timed run wrote are also found from the Delta versions it moved, and every floor must
write them all)."""
PeerCall = Callable[[Path, Path, int, bool], PeerOutcome]
PEERS: dict[str, PeerCall] = {
    "rebuild_consume_queue": lambda lake, out, as_of, perturb: time_consume_queue_peer(lake, out, perturb).outcome,
    "consumer_offsets": lambda lake, out, as_of, perturb: time_offsets_peer(
        lake, out / "offsets.parquet", as_of, perturb
    ),
    "resolve_transactions": lambda lake, out, as_of, perturb: time_resolve_peer(
        lake, out / "state.parquet", as_of, perturb
    ),
    "route_dlq": time_route_peer,
    "report": lambda lake, out, as_of, perturb: time_report_peer(lake, out, perturb),
}


def now_ms() -> int:
    """The wall clock, epoch milliseconds."""
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------------------------
# The jobs
# ---------------------------------------------------------------------------------------------


JobCall = Callable[[SparkSession], JobRun]


def job_call(name: str, lake: Path, full: bool, as_of: int, root: Path, up_to: int | None, engine: str) -> JobCall:
    """The run of job ``name`` as of ``as_of`` on lake engine ``engine`` (full: a first run,
    ``full=True`` where the job has it); the compaction only packs files active at commit log
    version ``up_to`` (None: all)."""
    mode = "full" if full else "incremental"
    configs: dict[str, JobCall] = {
        "compact_commitlog": lambda s: run_compact(s, CompactConfig(lake, files_up_to_version=up_to, engine=engine)),
        "rebuild_consume_queue": lambda s: run_rebuild(s, RebuildConfig(lake, full=full, engine=engine)),
        "consumer_offsets": lambda s: run_offsets(s, ConsumerOffsetsConfig(lake, as_of, engine=engine, full=full)),
        "resolve_transactions": lambda s: run_resolve(
            s, ResolveTransactionsConfig(lake, as_of, engine=engine, full=full)
        ),
        "route_dlq": lambda s: run_route(s, RouteDlqConfig(lake, as_of, full=full, engine=engine)),
        "report": lambda s: run_report(s, ReportConfig(lake, as_of, out=root / "reports" / mode, engine=engine)),
    }
    return configs[name]


def time_job(
    spark: SparkSession, name: str, mode: str, call: JobCall, logs: Path, group: str | None = None
) -> Measured:
    """Seconds of one run of a job, its stdout kept in ``logs``; a FAILED run raises. Its Spark jobs
    run in the job group ``group`` (default ``<name>:<mode>``), by which its stages are found."""
    group = group or f"{name}:{mode}"
    spark.sparkContext.setJobGroup(group, f"{name} {mode}")
    buffer = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(buffer):
        job_run = call(spark)
    seconds = time.perf_counter() - started
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{name}-{mode}.txt").write_text(buffer.getvalue())
    if job_run.status not in ("SUCCEEDED", "NOOP"):
        raise RuntimeError(f"{name} ({mode}) ended {job_run.status}: {job_run.message}")
    return Measured(
        name,
        mode,
        seconds,
        status=job_run.status,
        message=job_run.message or "",
        row_counts=dict(job_run.row_counts),
        group=group,
    )


# ---------------------------------------------------------------------------------------------
# Where the time goes
# ---------------------------------------------------------------------------------------------


def _rest(spark: SparkSession, what: str) -> list[dict[str, Any]]:
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/{what}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return list(json.load(response))


def _instant(text: str) -> float:
    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def spark_time(spark: SparkSession, group: str) -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds during which a Spark job of ``group`` ran, and the group's completed stages,
    longest first: name (action and Python call site), seconds, tasks, input bytes."""
    try:
        jobs = [j for j in _rest(spark, "jobs") if j.get("jobGroup") == group]
        stages = _rest(spark, "stages?status=complete")
    except OSError:
        return float("nan"), []
    done = [j for j in jobs if "completionTime" in j]
    spans = sorted((_instant(j["submissionTime"]), _instant(j["completionTime"])) for j in done)
    seconds, reached = 0.0, float("-inf")
    for start, end in spans:  # the union of the jobs' spans: a job may run while another waits
        seconds += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    ids = {s for j in jobs for s in j["stageIds"]}
    mine = [
        {
            "name": s["name"].split(" at ")[0] + " at " + Path(s["name"].split(" at ")[-1]).name,
            "seconds": round(_instant(s["completionTime"]) - _instant(s["submissionTime"]), 2),
            "tasks": s["numTasks"],
            "input_bytes": s.get("inputBytes", 0),
            "shuffle_write_bytes": s.get("shuffleWriteBytes", 0),
        }
        for s in stages
        if s["stageId"] in ids and "completionTime" in s
    ]
    return seconds, sorted(mine, key=lambda s: -s["seconds"])


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--messages", type=int, default=DEFAULT_MESSAGES, help="bulk messages (default 2,000,000)")
    size.add_argument("--large", action="store_true", help=f"{LARGE_MESSAGES:,} bulk messages")
    size.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        help="bulk message counts, comma-separated (at least two): one run each, then how every job's time grows",
    )
    size.add_argument(
        "--lake",
        type=Path,
        action="append",
        default=None,
        metavar="DIR",
        help=f"run on a copy of the lake an --engine {BOTH} run wrote (DIR/lake, with DIR/{LAKE_FACTS} saying what "
        f"it holds; its bulk size and seed count) instead of writing one: with --keep, <work dir>/source; or one "
        f"that nightly_lake.py wrote; given once per size (at least two sizes), the growth over those lakes",
    )
    parser.add_argument(
        "--engine",
        choices=(*ENGINES, BOTH),
        default="bridge",
        help=f"the lake engine of the jobs and their floors (default: bridge); {BOTH}: the lake written once, then "
        "each engine in a process of its own on a copy of it, and one table with both side by side",
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="benchmark",
        help="the lake: benchmark (feature traffic, then --messages bulk messages in batches; the default) or "
        "users (--messages messages of the workload's whole mix through 3 brokers: transactions, retries and "
        "dead letters, many offset commits)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="work directory to keep (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="figures as JSON (default: <work dir>/run_all.json)")
    parser.add_argument(
        "--perturb-peer",
        choices=sorted(PERTURBED),
        default=None,
        metavar="JOB",
        help="change one value of JOB's peer result before it is compared (only to show that a peer that "
        "differs is caught: the run then ends with exit status 1); one of %(choices)s",
    )
    args = parser.parse_args(argv)
    sources = [path.resolve() for path in args.lake or []]
    for source in sources:
        if not ((source / "lake").is_dir() and (source / LAKE_FACTS).is_file()):
            parser.error(
                f"--lake {source}: no lake/ and {LAKE_FACTS} there; give the directory 'source' that a run "
                f"with --engine {BOTH} --keep DIR leaves in DIR, or one that nightly_lake.py wrote"
            )
    if len(sources) > 1:
        sized = sorted((lake_size(read_lake_facts(source)), source) for source in sources)
        shapes = {str(read_lake_facts(source).get("shape", "benchmark")) for source in sources}
        if len(shapes) > 1:
            parser.error(f"--lake: lakes of shapes {sorted(shapes)}; the growth is over lakes of one shape")
        if len({messages for messages, _ in sized}) < len(sized):
            parser.error(f"--lake: two of the lakes hold the same number of messages: {sized}")
        if args.engine == BOTH:
            parser.error(f"--lake given {len(sources)} times runs one engine: --engine bridge or delta-spark")
    source = sources[0] if len(sources) == 1 else None
    facts = read_lake_facts(source) if source else {}
    messages = facts.get("bulk_messages", LARGE_MESSAGES if args.large else args.messages)
    seed = facts.get("seed", args.seed)  # a run on a copy writes the increment every copy gets
    shape = facts.get("shape", args.shape)
    if shape == "users":
        messages = facts.get("feature_messages", messages)
    root = (args.keep or Path(tempfile.mkdtemp(prefix="run-all-bench-"))).resolve()
    json_path = args.json or root / "run_all.json"
    try:
        if args.engine == BOTH and args.sizes:
            return growth_both(root, args.sizes, seed, json_path, args.perturb_peer, shape)
        if args.engine == BOTH:
            return both(root, messages, seed, json_path, args.perturb_peer, source, shape)[0]
        if len(sources) > 1:
            runs = [(messages, source) for messages, source in sized]
            return _growth(root, runs, seed, json_path, args.engine, args.perturb_peer, shape)
        if args.sizes:
            runs = [(messages, None) for messages in args.sizes]
            return _growth(root, runs, seed, json_path, args.engine, args.perturb_peer, shape)
        return exit_status(_bench(root, messages, seed, json_path, args.engine, args.perturb_peer, source, shape))
    finally:
        if args.keep is None:  # the figures and the jobs' stdout stay, next to where the lakes were
            discard_work(root)


def discard_work(root: Path) -> None:
    """Delete what a run left under ``root`` but its figures (``*.json``) and the jobs' stdout
    (``logs``), in ``root`` and in its runs' directories (per size, per engine, the source lake's)."""
    for child in root.iterdir():
        if child.name == "logs" or child.suffix == ".json":
            continue
        if child.is_dir() and (child.name in (*ENGINES, "source") or child.name.startswith("size-")):
            discard_work(child)
        elif child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _sizes(text: str) -> list[int]:
    """``--sizes``: at least two distinct positive message counts, in increasing order."""
    try:
        sizes = sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes={text!r}: not a comma-separated list of integers") from None
    if len(sizes) < 2 or sizes[0] <= 0:
        raise argparse.ArgumentTypeError(f"--sizes={text!r}: give at least two positive message counts")
    return sizes


def exit_status(rows: Sequence[Measured]) -> int:
    """0 when every peer computed what its job wrote and every floor wrote what its job writes,
    else 1 (after the table, which says what failed)."""
    failed = [f"{r.job} ({r.mode})" for r in rows if r.failed]
    if failed:
        print(f"\nexit status 1: the ratios of {', '.join(failed)} are not measured against an equal computation")
        return 1
    return 0


def _growth(
    root: Path,
    runs: Sequence[tuple[int, Path | None]],
    seed: int,
    json_path: Path,
    engine: str,
    perturb: str | None = None,
    shape: str = "benchmark",
) -> int:
    """One run per size on ``engine`` (``runs``: the size, and the kept lake to copy or None to
    write one), then the growth table; the figures of every size go to ``json_path``."""
    measured: dict[int, list[Measured]] = {}
    for messages, source in runs:
        print(f"\n=== {messages:,} messages ===", flush=True)
        figures = json_path.with_suffix(f".{messages}.json")
        facts = read_lake_facts(source) if source else {}
        lake_seed, lake_shape = int(facts.get("seed", seed)), str(facts.get("shape", shape))
        measured[messages] = _bench(
            root / f"size-{messages}", messages, lake_seed, figures, engine, perturb, source, lake_shape
        )
    sizes = [messages for messages, _ in runs]
    growth = growth_rows(measured)
    print_growth(growth, sizes, engine)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    summary = {"engine": engine, "sizes": sizes, "growth": growth, "machine": machine()}
    json_path.write_text(json.dumps(summary, indent=2))
    print(f"\nfigures: {json_path}")
    return exit_status([row for rows in measured.values() for row in rows])


def _bench(
    root: Path,
    messages: int,
    seed: int,
    json_path: Path,
    engine: str,
    perturb: str | None = None,
    source: Path | None = None,
    shape: str = "benchmark",
) -> list[Measured]:
    """One run on ``engine``: on a new lake of ``shape``, or on a copy of the one in ``source``
    (:func:`nightly_lake.write_source`, whose shape counts)."""
    lake, logs = root / "lake", root / "logs"
    if source is None:
        what = f"{FEATURE_MESSAGES:,} feature messages, then {messages:,} bulk messages"
        if shape == "users":
            what = f"{messages:,} messages in the users' shape"
        print(f"writing the lake: {what}", flush=True)
        written = write_lake(lake, messages, seed, shape)
        print(f"lake written: {json.dumps(written)}", flush=True)
    else:
        written = copy_lake(source, lake)
    spark = build_session("bench-run-all", master="local[*]", engine=engine, extra_conf=CONF)
    spark.sparkContext.setLogLevel("ERROR")
    Lake(spark, lake, engine).read(COMMITLOG).select("store_size").agg(F.sum("store_size")).collect()  # warm-up
    rows = _full_runs(spark, lake, root, logs, engine, perturb)
    processed = DeltaTable(str(lake / COMMITLOG.path)).version()
    increment = append_increment(lake, messages, seed, written.get("shape", "benchmark"))
    print(f"increment written: {json.dumps(increment)}", flush=True)
    as_of = now_ms()
    full = {r.job: r.seconds for r in rows}
    incremental, starts = _incremental_runs(spark, lake, root, logs, engine, processed, full, as_of)
    rows += incremental
    rows += _reruns(spark, lake, root, logs, engine, as_of)
    rows += _full_after(spark, lake, root, logs, engine, as_of, rows, starts)
    for row in rows:
        row.spark_seconds, row.stages = spark_time(spark, row.group)
    spark.stop()
    print_table(rows, messages, written, increment, engine)
    figures = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "engine": engine,
        "messages": messages,
        "lake_source": None if source is None else str(source),
        "machine": machine(),
        "lake": written,
        "increment": increment,
        "rows": [{k: v for k, v in vars(r).items()} for r in rows],
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(figures, indent=2, default=str))
    print(f"\nfigures: {json_path}")
    return rows


def _full_runs(
    spark: SparkSession, lake: Path, root: Path, logs: Path, engine: str, perturb: str | None = None
) -> list[Measured]:
    as_of = now_ms()
    rows: list[Measured] = []
    for name in JOBS:
        bins = compaction_bins(lake, None) if name == "compact_commitlog" else []
        commit_files = packed_commit_files(lake) if name == "compact_commitlog" else []
        pages = root / "reports" / "full"
        print(f"full: {name}", flush=True)

        repeats = 1
        if name in WARMED:  # untimed: the job and its floor once, so that both are timed warm
            warm = time_job(spark, name, "warm-up", job_call(name, lake, True, as_of, root, None, engine), logs)
            time_full_floor(spark, name, lake, root, engine, as_of, bins, commit_files)
            repeats = SHORT_RUN_REPEATS if warm.seconds < SHORT_RUN_SECONDS else 1
        runs: list[tuple[Measured, float]] = []
        for attempt in range(repeats):
            if name in WARMED:  # a run on unchanged inputs writes nothing: each timed run is a first one
                for spec in JOB_OUTPUTS[name]:  # a summary of an absent source is absent too
                    shutil.rmtree(lake / spec.path, ignore_errors=True)
                if name == "report":  # nor does a report whose page is there: the timed one draws every plot
                    shutil.rmtree(pages)
            before = table_versions(lake)
            call = job_call(name, lake, True, as_of, root, None, engine)
            run = time_job(spark, name, "full", call, logs, group=f"{name}:full:{attempt}")
            run.writes = sorted(n for n, v in table_versions(lake).items() if v != before.get(n) and n != JOB_RUNS.name)
            runs.append((run, time_full_floor(spark, name, lake, root, engine, as_of, bins, commit_files)))
        row = sorted(runs, key=lambda r: r[0].seconds)[len(runs) // 2][0]  # the median run, and the median floor
        row.floor = statistics.median(f for _, f in runs)
        row.samples, row.floor_samples = [r.seconds for r, _ in runs], [f for _, f in runs]
        notes = [row.status]
        if repeats > 1:
            notes.append(f"median of {repeats} runs and of {repeats} floors")
        if name == "compact_commitlog":
            notes.append(
                f"{len(bins)} bins, {sum(len(b.files) for b in bins)} files; floor: those files and the "
                f"{len(commit_files)} offset-commit files the job packs, read and written with Arrow, no commit"
            )
        elif name == "report":  # the floor draws the plots too (plan_floor): the message says how long they took
            notes.append(row.message)
        if name != "compact_commitlog":  # its floor writes the files, commits nothing (time_compaction_floor)
            row.floor_lacks = [t for t in row.writes if t not in table_versions(root / "floor" / name)]
            if row.floor_lacks:
                notes.append(f"floor does not write {', '.join(row.floor_lacks)}")
        if name in PEERS:
            outcome = PEERS[name](lake, root / "peer" / name, as_of, perturb == name)
            row.peer, row.peer_same, row.peer_report = outcome.seconds, outcome.same, outcome.lines()
            notes.append(outcome.note())
        else:
            notes.append(f"peer {NO_PEER[name]}")
        row.notes = "; ".join(notes)
        rows.append(row)
    return rows


def table_versions(root: Path) -> dict[str, int]:
    """The Delta version of every catalog table under ``root`` that exists."""
    versions = {spec.name: table_version(str(root / spec.path)) for spec in TABLES.values()}
    return {name: version for name, version in versions.items() if version >= 0}


def _incremental_runs(
    spark: SparkSession,
    lake: Path,
    root: Path,
    logs: Path,
    engine: str,
    processed: int,
    full: dict[str, float],
    as_of: int,
) -> tuple[list[Measured], dict[str, SnapshotState]]:
    """Every job once after the increment, in the nightly's order and at one T, as the nightly runs
    them; and the Delta snapshots the process kept when each run started, from which the job's full
    run after the increment starts (a log the incremental run read is not read again for free).

    A job computed as of T whose incremental run took longer than its full run on the lake before
    the increment runs in full at once (**full after**, :func:`_full_after_now`), on the lake its
    incremental run read, before a later job or the reruns pack the files it read."""
    rows: list[Measured] = []
    starts: dict[str, SnapshotState] = {}
    for name in JOBS:
        print(f"incremental: {name}", flush=True)
        starts[name] = snapshot_state()
        logs_before = [TableLog.of(lake / spec.path) for spec in (*JOB_OUTPUTS.get(name, ()), JOB_RUNS)]
        row = time_job(spark, name, "incremental", job_call(name, lake, False, as_of, root, processed, engine), logs)
        row.notes = f"{row.status}; {row.seconds / full[name]:.0%} of full"
        rows.append(row)
        if name in TIMED_JOBS and row.seconds > full[name]:
            rows.append(_full_after_now(spark, lake, root, logs, engine, as_of, row, starts[name], logs_before))
    return rows, starts


@dataclass(frozen=True)
class TableLog:
    """A Delta table's log at one moment, to roll the table back to (a benchmark's own way back
    to a state it timed a run from: the data files written since stay, unreferenced)."""

    table_dir: Path
    version: int  # -1: no table
    last_checkpoint: bytes | None

    @classmethod
    def of(cls, table_dir: Path) -> TableLog:
        pointer = table_dir / "_delta_log" / "_last_checkpoint"
        return cls(table_dir, table_version(str(table_dir)), pointer.read_bytes() if pointer.exists() else None)

    def roll_back(self) -> None:
        """Remove the commits and checkpoints after :attr:`version` (the whole table when there was
        none); the files of the commits kept are left as they were, so a process's kept snapshots
        of them stay valid."""
        if self.version < 0:
            shutil.rmtree(self.table_dir, ignore_errors=True)
            return
        log = self.table_dir / "_delta_log"
        for path in log.iterdir():
            number = path.name.split(".", 1)[0]
            if number.isdigit() and int(number) > self.version:
                path.unlink()
        pointer = log / "_last_checkpoint"
        if self.last_checkpoint is None:
            pointer.unlink(missing_ok=True)
        elif not pointer.exists() or pointer.read_bytes() != self.last_checkpoint:
            pointer.write_bytes(self.last_checkpoint)


def _full_after_now(
    spark: SparkSession,
    lake: Path,
    root: Path,
    logs: Path,
    engine: str,
    as_of: int,
    incremental: Measured,
    start: SnapshotState,
    logs_before: Sequence[TableLog],
) -> Measured:
    """The full run after the increment of a job computed as of T, right after its incremental run:
    as a user's ``--full`` run, on the lake as it is (its tables and its previous runs' records,
    which every run reads to know whether it has anything to do), at T + 1 ms so that it is not a
    no-op, from the Delta snapshots of the incremental run's start (``start``). A short job's
    incremental run (under :data:`SHORT_RUN_SECONDS`) and this full run then alternate until each
    ran :data:`SHORT_RUN_REPEATS` times, the job's tables and ``job_runs`` rolled back to
    ``logs_before`` before each incremental run; ``incremental`` and the row returned get the
    medians. Last, the incremental run again, untimed, so that the job's tables are what the
    nightly leaves."""
    job = incremental.job
    print(f"full after the increment: {job}", flush=True)
    pairs = SHORT_RUN_REPEATS if incremental.seconds < SHORT_RUN_SECONDS else 1
    incrementals, fulls = [incremental], []
    for pair in range(pairs):
        if pair:
            for table_log in logs_before:
                table_log.roll_back()
            restore_snapshots(start)
            call = job_call(job, lake, False, as_of, root, None, engine)
            incrementals.append(time_job(spark, job, "incremental", call, logs, group=f"{job}:incremental:{pair}"))
        restore_snapshots(start)
        call = job_call(job, lake, True, as_of + 1, root, None, engine)
        fulls.append(time_job(spark, job, "full after", call, logs, group=f"{job}:full after:{pair}"))
    time_job(spark, job, "again", job_call(job, lake, False, as_of, root, None, engine), logs)
    row = _median_run(fulls)
    if pairs > 1:
        median = _median_run(incrementals)
        incremental.seconds, incremental.group = median.seconds, median.group
        incremental.samples = [r.seconds for r in incrementals]
        incremental.notes += f"; median of {pairs} runs, alternating with the full run after the increment"
    _note_full_after(incremental, row)
    return row


def _median_run(runs: Sequence[Measured]) -> Measured:
    """The run of median seconds, with every run's seconds as its samples."""
    row = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]
    row.samples = [r.seconds for r in runs] if len(runs) > 1 else []
    return row


def _note_full_after(incremental: Measured, full_after: Measured) -> None:
    """Say in both rows what share of the full run after the increment the incremental run took."""
    share = f"{incremental.seconds / full_after.seconds:.0%}"
    full_after.notes = f"{full_after.status}; the lake with the increment: the incremental run took {share} of this"
    incremental.notes += f"; {share} of a full run after the increment"


def _reruns(spark: SparkSession, lake: Path, root: Path, logs: Path, engine: str, as_of: int) -> list[Measured]:
    """Every job once more with no new data and the same T: the nightly's rerun."""
    rows: list[Measured] = []
    for name in JOBS:
        print(f"rerun: {name}", flush=True)
        row = time_job(spark, name, "rerun", job_call(name, lake, False, as_of, root, None, engine), logs)
        row.notes = row.status
        rows.append(row)
    return rows


def _full_after(
    spark: SparkSession,
    lake: Path,
    root: Path,
    logs: Path,
    engine: str,
    as_of: int,
    rows: Sequence[Measured],
    starts: Mapping[str, SnapshotState],
) -> list[Measured]:
    """Once the reruns are done, a full run on the lake with the increment of every job not computed
    as of a time (those ran at once, :func:`_full_after_now`) whose incremental run took longer than
    its full run on the lake before it: whether the incremental run cost more than computing the
    same lake in full, on the lake without the job's tables (its ``--full`` on complete outputs
    writes nothing), with the Delta snapshots the process kept when the incremental run started
    (``starts``)."""
    full = {r.job: r.seconds for r in rows if r.mode == "full"}
    slower = [r for r in rows if r.mode == "incremental" and r.seconds > full[r.job] and r.job not in TIMED_JOBS]
    again: list[Measured] = []
    for incremental in slower:
        print(f"full after the increment: {incremental.job}", flush=True)
        for spec in JOB_OUTPUTS[incremental.job]:
            shutil.rmtree(lake / spec.path, ignore_errors=True)
        call = job_call(incremental.job, lake, True, as_of, root, None, engine)
        restore_snapshots(starts[incremental.job])
        row = time_job(spark, incremental.job, "full after", call, logs)
        _note_full_after(incremental, row)
        again.append(row)
    return again


def print_table(
    rows: Sequence[Measured], messages: int, written: dict[str, Any], increment: dict[str, Any], engine: str
) -> None:
    """The table of every job and mode on ``engine``, and what dominates the slowest job."""
    facts = machine()
    print(
        f"\nengine {engine}: {describe(messages, written, increment)}; {facts['cores']} cores, "
        f"{facts['memory_gib']} GiB, load {facts['load_average']}"
    )
    header = f"{'job':<22}{'mode':<12}{'seconds':>9}{'floor s':>9}{'peer s':>9}{'job/floor':>10}{'job/peer':>10}  notes"
    print(header)
    print("-" * len(header))
    for r in rows:
        # no ratio against a floor that leaves out a table, or a peer that computed something else
        ratio_floor = r.seconds / r.floor if r.floor and not r.floor_lacks else None
        ratio_peer = r.seconds / r.peer if r.peer and r.peer_same else None
        print(
            f"{r.job:<22}{r.mode:<12}{r.seconds:>9.1f}{fmt(r.floor):>9}{fmt(r.peer):>9}"
            f"{fmt(ratio_floor, '.2f'):>10}{fmt(ratio_peer, '.2f'):>10}  {r.notes}"
        )
    incremental = sum(r.seconds for r in rows if r.mode == "incremental")
    peers = [r for r in rows if r.mode == "full" and r.peer_same]
    differing = [r.job for r in rows if r.mode == "full" and r.peer_same is False]
    full = sum(r.seconds for r in rows if r.mode == "full")
    with_peer = {r.job for r in peers}
    same_outputs = sum(r.seconds for r in rows if r.mode == "incremental" and r.job in with_peer)
    print(
        f"\nnightly after the increment, every job: {incremental:.1f} s ({incremental / full:.1%} of the "
        f"full nightly's {full:.1f} s); DuckDB from scratch, the {len(peers)} jobs with a peer that agrees "
        f"({', '.join(r.job for r in peers)}): {sum(r.peer or 0 for r in peers):.1f} s, those jobs after the "
        f"increment: {same_outputs:.1f} s"
        + (f"; left out, their peer differs: {', '.join(differing)}" if differing else "")
    )
    print(f"nightly rerun without new data, every job: {sum(r.seconds for r in rows if r.mode == 'rerun'):.1f} s")
    slowest = max(rows, key=lambda r: r.seconds)
    print(
        f"\nslowest: {slowest.job} ({slowest.mode}) {slowest.seconds:.1f} s, of which a Spark job "
        f"ran during {fmt(slowest.spark_seconds)} s; its longest stages:"
    )
    for stage in (slowest.stages or [])[:5]:
        print(
            f"  {stage['seconds']:>7.1f} s  {stage['tasks']:>4} tasks  in {stage['input_bytes'] / 2**20:>8.1f} MiB  "
            f"shuffle {stage['shuffle_write_bytes'] / 2**20:>8.1f} MiB  {stage['name']}"
        )
    print("\npeers against the jobs' tables, every column (full runs):")
    for r in rows:
        if r.peer_report:
            print(f"  {r.job}:")
            print("\n".join(f"    {line}" for line in r.peer_report))


if __name__ == "__main__":
    raise SystemExit(main())
