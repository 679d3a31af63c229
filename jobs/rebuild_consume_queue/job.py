"""The ``rebuild_consume_queue`` job: consume queues rebuilt from the commit log with the broker's
dispatch rule, and an integrity report (gaps, duplicates, non-monotonic offsets, CRC and size
mismatches, records beyond their segment). Full or incremental: an incremental run reads only what
the commit log versions after the last processed one added, and checks it against
``consume_queue_tails``. See docs/jobs.md (rebuild_consume_queue, and its details).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import reduce
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from broker_model.common import QUEUE_KEY
from jobs.cli import job_parser, non_negative_int
from jobs.extract import DRIVER_INCREMENT_BYTES
from jobs.lake import IncrementalReadError, Lake, build_session
from jobs.log_chains import CHAIN_COLUMNS, Chains, segment_sizes
from jobs.rebuild_consume_queue.fold import DRIVER_COLUMNS, consume_queue_rows, has_record_problem
from jobs.rebuild_consume_queue.tails import START_COLUMNS, QueueStart, Tails, queue_starts
from jobs.rebuild_consume_queue.transforms import (
    PROBLEMS,
    QUEUE_PARTITION,
    build_checked_records,
    build_continuity_findings,
    build_findings,
    build_log_context,
    build_queue_context,
    failing,
    filter_dispatched,
    queue_checks,
    record_checks,
    segment_size_of,
    select_consume_queue,
    with_literal_tags_code,
    with_queue_order,
    with_segment_size,
    with_tags_code,
)
from jobs.rebuild_consume_queue.verify import store_dir_of, verify_broker, write_findings
from jobs.runs import CannotFold, JobRun, recorded_run, table_versions
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUME_QUEUE_INTEGRITY,
    CONSUME_QUEUE_TAILS,
    STORE_INGESTS,
    spark_schema,
)
from schemas.errors import LakeError

JOB = "rebuild_consume_queue"
APP_ID = JOB  # the Delta application transaction id; its version is the commit log version processed


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RebuildConfig:
    """Options of ``rebuild_consume_queue``: the lake root, a full rebuild or not, the lake engine,
    the most bytes of new commit log files an incremental run reads on the driver (0: none), the
    ingested brokers whose own consume queues to verify afterwards (:mod:`.verify`), and the store
    to read them from (None: the one each was last ingested from)."""

    lake: Path
    full: bool = False
    engine: str = "auto"
    driver_bytes: int = DRIVER_INCREMENT_BYTES
    verify_brokers: tuple[str, ...] = ()
    store_dir: Path | None = None


@dataclass(frozen=True)
class RebuildPlan:
    """What a run does: ``mode`` full, incremental or noop, over commit log versions
    ``processed + 1 .. target`` (``processed`` None: none processed yet)."""

    mode: str
    processed: int | None
    target: int
    reason: str


@dataclass
class RebuildSummary:
    """What a run wrote: consume-queue rows, queues with new rows, findings per problem; for an incremental
    run, what the new rows were checked against (``context``)."""

    cq_rows: int = 0
    queues: int = 0
    findings: dict[str, int] = field(default_factory=dict)
    context: str | None = None

    def row_counts(self) -> dict[str, int]:
        """The ``job_runs.row_counts`` of the run."""
        return {
            "consume_queue": self.cq_rows,
            "queues": self.queues,
            "consume_queue_integrity": sum(self.findings.values()),
            **self.findings,
        }

    def lines(self) -> list[str]:
        """The summary printed on stdout."""
        counts = [
            ("consume-queue rows written", self.cq_rows),
            ("queues", self.queues),
            ("findings", sum(self.findings.values())),
        ]
        kinds = [(f"  {problem}", self.findings.get(problem, 0)) for problem in PROBLEMS]
        checked = [f"  new rows checked against {self.context}"] if self.context else []
        return [*checked, *[f"  {name:<26}{count:>12}" for name, count in [*counts, *kinds]]]


# what a user does to have the job build its outputs again from the whole commit log
_DELETE_OUTPUTS = "delete the consume_queue, consume_queue_integrity and consume_queue_tails tables"


def plan_run(
    processed: int | None, findings_processed: int | None, tails_processed: int | None, latest: int, full: bool
) -> RebuildPlan:
    """The plan of a run, from the commit log versions the output tables record as processed.

    ``findings_processed`` or ``tails_processed`` below ``processed`` means a run committed its
    consume-queue rows but stopped before its findings or its tails (or the lake predates the tails table):
    the run rebuilds in full, whatever else is asked.

    Raises:
        LakeError: the outputs were built from a later commit log version than the latest one
            (the commit log was replaced).
    """
    built = max(-1 if v is None else v for v in (processed, findings_processed, tails_processed))
    if built > latest:
        raise LakeError(
            f"consume_queue was built from commitlog version {built}, but the commitlog is at version "
            f"{latest}: it was replaced; {_DELETE_OUTPUTS} and run again"
        )
    if processed is not None and (findings_processed is None or findings_processed < processed):
        return RebuildPlan("full", processed, latest, "the findings are behind the consume-queue rows (a run stopped)")
    if processed is not None and (tails_processed is None or tails_processed < processed):
        return RebuildPlan("full", processed, latest, "the tails are behind the consume-queue rows (a run stopped)")
    if processed is not None and processed >= latest:
        reason = f"commitlog version {latest} is already processed"
        if full:
            reason += f"; the outputs are complete, so --full writes nothing (to build them anyway, {_DELETE_OUTPUTS})"
        return RebuildPlan("noop", processed, latest, reason)
    if full or processed is None:
        return RebuildPlan("full", processed, latest, "--full" if full else "first run")
    return RebuildPlan("incremental", processed, latest, f"commitlog versions {processed + 1}..{latest}")


def run(spark: SparkSession, config: RebuildConfig) -> JobRun:
    """Rebuild (or extend) the consume queues, the integrity report and the tails; print and
    record the run.

    Raises:
        LakeError: the lake has no commit log, or the outputs are ahead of it (see :func:`plan_run`).
    """
    lake = Lake(spark, config.lake, config.engine)
    latest = lake.version(COMMITLOG)
    if latest is None:
        raise LakeError(f"no commitlog table under {config.lake}; write a workload first (python -m broker_model)")
    with recorded_run(lake, JOB) as job_run:
        cq_rows, findings, tails = (
            lake.transaction_version(spec, APP_ID)
            for spec in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS)
        )
        plan = plan_run(cq_rows, findings, tails, latest, config.full)
        job_run.input_versions = {COMMITLOG.name: plan.target}
        if config.verify_brokers:
            lake.add_missing_columns(STORE_INGESTS)  # a table an older release's ingest created
        stores = {name: config.store_dir or store_dir_of(lake, name) for name in config.verify_brokers}
        if plan.mode == "noop":
            print(f"{JOB}: nothing to do, {plan.reason} (lake {config.lake})")
            verified = _verify(lake, stores, plan.target, job_run)
            job_run.conclude("SUCCEEDED" if verified else "NOOP", plan.reason)
            return job_run
        plan, summary = _execute(lake, plan, config.driver_bytes)
        job_run.output_versions = table_versions(
            lake, [s.name for s in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS)]
        )
        job_run.row_counts = summary.row_counts()
        print(f"{JOB}: {plan.mode} rebuild ({plan.reason}) up to commitlog version {plan.target} (lake {config.lake})")
        print("\n".join(summary.lines()))
        _verify(lake, stores, plan.target, job_run)
        job_run.conclude("SUCCEEDED", f"{plan.mode} up to commitlog version {plan.target}: {plan.reason}")
    return job_run


def _verify(lake: Lake, stores: Mapping[str, Path], target: int, job_run: JobRun) -> bool:
    """Verify each broker's own consume queues (``stores``: broker -> store root) against the
    rebuilt ones, replace its findings, print and count them; whether any broker was verified."""
    for broker_name, store_dir in stores.items():
        verification = verify_broker(lake, broker_name, store_dir, target)
        write_findings(lake, verification)
        counts = verification.counts()
        job_run.output_versions[CONSUME_QUEUE_INTEGRITY.name] = lake.version(CONSUME_QUEUE_INTEGRITY) or 0
        job_run.row_counts[f"verified {broker_name}"] = verification.store_units
        job_run.row_counts.update({f"{broker_name} {p}": n for p, n in counts.items()})
        print(
            f"{JOB}: broker {broker_name!r}'s own consume queues ({verification.store_units} units in {store_dir}) "
            f"against the rebuilt ones: {sum(counts.values())} difference(s), {verification.unchecked} unit(s) "
            "not checkable (not ingested or dispatched yet, or deleted)"
        )
        print("\n".join(f"  {problem:<26}{count:>12}" for problem, count in counts.items()))
    return bool(stores)


# brokers (segment sizes) and distinct tags (tags codes) up to which the records pass chooses each
# row's value with a literal expression instead of a broadcast join
LITERAL_CHOICES = 64


def _execute(lake: Lake, plan: RebuildPlan, driver_bytes: int) -> tuple[RebuildPlan, RebuildSummary]:
    """Run ``plan``; an incremental plan whose new rows cannot be read alone becomes a full one.
    The tails commit last, with the same application transaction as the consume-queue rows and findings."""
    if plan.mode == "incremental":
        try:
            summary, tails = _incremental(lake, plan, driver_bytes)
            lake.overwrite_rows(CONSUME_QUEUE_TAILS, tails.to_arrow(plan.target), APP_ID, plan.target)
            return plan, summary
        except IncrementalReadError as err:
            print(f"{JOB}: cannot read the new commit log rows alone ({err}); rebuilding in full")
            plan = replace(plan, mode="full", reason=str(err))
    sizes = segment_sizes(lake.read_rows(BROKERS))
    # the tags, then the chains, are read on the driver while Spark plans the scan of the same files
    # and writes the consume-queue rows: the write needs only the segment sizes and the tags, the
    # chains are looked at after it
    with ThreadPoolExecutor(1, thread_name_prefix="chains") as pool:
        read_tags = pool.submit(_distinct_tags, lake, plan.target)
        read_chains = pool.submit(_full_chains, lake, plan.target, sizes)
        checked_df = build_checked_records(lake.read(COMMITLOG, version=plan.target))
        summary = _rebuild(lake, plan, checked_df, sizes, read_tags.result(), read_chains.result, None, None)
        chains = read_chains.result()
    tails = Tails(chains.queue_tails(), chains.log_tails())
    lake.overwrite_rows(CONSUME_QUEUE_TAILS, tails.to_arrow(plan.target), APP_ID, plan.target)
    return plan, summary


def _distinct_tags(lake: Lake, version: int) -> set[str | None]:
    """The distinct tags of the whole commit log at ``version``: one column, dictionary-encoded,
    so a few values per file (tens of milliseconds on a 1M-message log)."""
    tags: set[str | None] = set()
    for rows in lake.iter_row_chunks(COMMITLOG, ["tags"], version=version, dictionaries=("tags",)):
        tags.update(pc.unique(rows["tags"]).to_pylist())
    return tags


def _full_chains(lake: Lake, version: int, sizes: Mapping[str, int]) -> Chains:
    """The chains of the whole commit log at ``version``, of brokers with segments of ``sizes``."""
    chains = Chains(dict(sizes))
    # the strings as stored, dictionary-encoded: the chains group by them; chunks of consecutive
    # files of each broker, so that each chunk's runs are ranges of the log
    for rows in lake.iter_row_chunks(
        COMMITLOG,
        list(CHAIN_COLUMNS),
        version=version,
        dictionaries=("broker_name", "topic"),
        order_by="commit_log_offset",
    ):
        chains.add_part(rows)
    return chains


def _incremental(lake: Lake, plan: RebuildPlan, driver_bytes: int) -> tuple[RebuildSummary, Tails]:
    """Read the new rows and the context they are checked against, then rebuild from them.

    The context is the tails when every new row comes after them (the broker appends); else the
    old consume-queue rows and records next to the new ones, read from ``consume_queue`` and the commit log.
    New rows in files of at most ``driver_bytes`` are read on the driver whole; when they follow
    the tails and are clean, :func:`_driver_increment` writes them without Spark. Otherwise the
    Spark path checks them; its new rows and contexts are small (they grow with the new data, not
    with the log), so they are persisted: every check and the consume-queue rows pass reuse them.
    """
    processed = plan.processed if plan.processed is not None else -1
    old_tails = tails = Tails.from_arrow(lake.read_rows(CONSUME_QUEUE_TAILS))
    sizes = segment_sizes(lake.read_rows(BROKERS))
    on_driver = 0 < driver_bytes and lake.appended_size(COMMITLOG, processed, plan.target) <= driver_bytes
    new_rows = lake.read_appended_rows(
        COMMITLOG, DRIVER_COLUMNS if on_driver else START_COLUMNS, processed, plan.target
    )
    if on_driver:
        try:
            return _driver_increment(lake, plan, new_rows, old_tails, sizes)
        except CannotFold as why:
            print(f"{JOB}: the new rows go through Spark ({why})")
    persisted: list[DataFrame] = []

    def kept(df: DataFrame) -> DataFrame:
        persisted.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return persisted[-1]

    try:
        starts = queue_starts(new_rows)
        tails = tails.merged(Tails.of_rows(new_rows))
        checked_df = kept(build_checked_records(lake.read_appended(COMMITLOG, processed, plan.target)))
        if not starts:  # e.g. only compaction commits: nothing to check, the versions are still read
            empty_df = lake.spark.createDataFrame([], spark_schema(CONSUME_QUEUE))
            lake.append(CONSUME_QUEUE, empty_df, APP_ID, plan.target)
            return _write_findings(lake, plan, None, RebuildSummary()), tails
        chains = Chains(sizes)
        chains.add_part(new_rows)
        if old_tails.precede(starts):
            context = "the tails of their queues and brokers (consume_queue_tails)"
            queue_context_df, log_context_df = old_tails.contexts(lake.spark, starts)
        else:
            context = (
                "the old consume-queue rows and records from the one before them on (they do not all follow the tails)"
            )
            queue_context_df, log_context_df = _read_contexts(lake, starts, checked_df, processed, kept)
        chains.add_context_rows(
            None if queue_context_df is None else queue_context_df.toArrow(), log_context_df.toArrow()
        )
        tags = set(pc.unique(new_rows["tags"]).to_pylist())
        summary = _rebuild(lake, plan, checked_df, sizes, tags, lambda: chains, queue_context_df, log_context_df)
        return replace(summary, context=context), tails
    finally:
        for df in persisted:
            df.unpersist()


def _driver_increment(
    lake: Lake, plan: RebuildPlan, rows: pa.Table, old_tails: Tails, sizes: Mapping[str, int]
) -> tuple[RebuildSummary, Tails]:
    """Check and write the new ``rows`` (:data:`~jobs.rebuild_consume_queue.fold.DRIVER_COLUMNS`) on
    the driver, without Spark: their consume-queue rows appended with delta-rs, an empty findings
    commit, each with the application transaction.

    Raises:
        CannotFold: nothing written: the rows do not all follow the tails, a queue or broker is
            suspect, a record fails a check, or a row is one the driver does not decide on
            exactly as the Spark columns do; the Spark path then finds what is wrong.
    """
    starts = queue_starts(rows)
    if not old_tails.precede(starts):
        raise CannotFold("they do not all follow the tails of their queues and brokers")
    chains = Chains(sizes)
    chains.add_part(rows)
    chains.add_context(old_tails.queues, old_tails.logs)
    if chains.suspect_queues() or chains.suspect_brokers() or has_record_problem(rows, sizes):
        raise CannotFold("a queue, a broker's log or a record needs the checks of the Spark path")
    cq_rows = consume_queue_rows(rows)
    lake.append_rows(CONSUME_QUEUE, cq_rows, APP_ID, plan.target)
    lake.append_rows(CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_INTEGRITY.arrow_schema.empty_table(), APP_ID, plan.target)
    context = "the tails of their queues and brokers (consume_queue_tails), on the driver"
    summary = RebuildSummary(cq_rows=chains.new_cq_rows(), queues=chains.new_queues(), context=context)
    return summary, old_tails.merged(Tails.of_rows(rows))


def _read_contexts(
    lake: Lake, starts: list[QueueStart], checked_df: DataFrame, processed: int, kept: Callable[[DataFrame], DataFrame]
) -> tuple[DataFrame | None, DataFrame]:
    """(queue context, log context) of new rows that do not all follow the tails: the old consume-queue rows
    and records from the one before the first new one on, read from ``consume_queue`` and from
    the commit log as of version ``processed``."""
    bounds: dict[str, int] = {}
    for start in starts:
        bounds[start.broker_name] = min(bounds.get(start.broker_name, start.first_offset), start.first_offset)
    old_df = lake.read_around(COMMITLOG, "commit_log_offset", bounds, "broker_name", version=processed)
    log_context_df = kept(build_log_context(old_df, checked_df))
    queues = [s for s in starts if s.first_cq_row is not None]
    if not queues:
        return None, log_context_df
    cq_rows_df = kept(_read_cq_rows(lake, queues, "tail"))
    return kept(_queue_context(lake, queues, cq_rows_df, checked_df)), log_context_df


def _queue_context(lake: Lake, queues: list[QueueStart], cq_rows_df: DataFrame, checked_df: DataFrame) -> DataFrame:
    """The :func:`build_queue_context` of the new consume-queue rows, from ``cq_rows_df``: per queue, the rows
    from queue offset ``first_unit - 1`` on (see :func:`_read_queue_units`). Queues where that consume-queue row
    is missing (a gap before the new consume-queue rows) are read whole."""
    found = {
        (r["broker_name"], r["topic"], r["queue_id"])
        for r in cq_rows_df.where(_at_offset(queues, "before")).select(*QUEUE_KEY).distinct().collect()
    }
    gapped = [q for q in queues if q.first_cq_row and (q.broker_name, q.topic, q.queue_id) not in found]
    if gapped:
        cq_rows_df = cq_rows_df.unionByName(_read_cq_rows(lake, gapped, "head"))
    return build_queue_context(cq_rows_df, filter_dispatched(checked_df))


def _read_cq_rows(lake: Lake, queues: list[QueueStart], part: str) -> DataFrame:
    """The consume-queue rows of ``queues`` at or above (``part="tail"``) or below (``"head"``) queue offset
    ``first_unit - 1``, one read per topic so that the literal predicate reaches the Parquet reader:
    ``consume_queue`` files are written sorted by queue, so the page statistics skip the rest."""
    topics = sorted({q.topic for q in queues})
    reads = [
        lake.read(CONSUME_QUEUE, partition_filter={"topic": [topic]}).where(
            _at_offset([q for q in queues if q.topic == topic], part)
        )
        for topic in topics
    ]
    return reduce(DataFrame.unionByName, reads)


def _at_offset(queues: Sequence[QueueStart], part: str) -> Column:
    """Consume-queue rows of ``queues`` (any topic) relative to queue offset ``first_unit - 1``: ``"tail"`` at or
    above it, ``"head"`` below it, ``"before"`` at it; literal terms a Parquet reader can use."""
    terms = F.lit(False)
    for q in queues:
        bound, offset = (q.first_cq_row or 0) - 1, F.col("queue_offset")
        kept = {"tail": offset >= bound, "head": offset < bound, "before": offset == bound}[part]
        terms = terms | ((F.col("broker_name") == q.broker_name) & (F.col("queue_id") == q.queue_id) & kept)
    return terms


def _rebuild(
    lake: Lake,
    plan: RebuildPlan,
    checked_df: DataFrame,
    sizes: Mapping[str, int],
    tags: Iterable[str | None],
    chains_of: Callable[[], Chains],
    queue_context_df: DataFrame | None,
    log_context_df: DataFrame | None,
) -> RebuildSummary:
    """Write the consume-queue rows of ``checked_df`` while counting record problems, then the findings.

    ``sizes`` are the brokers' segment sizes, ``tags`` the rows' distinct tags; ``chains_of`` gives
    the runs of the same rows and their context (read on the driver, maybe while the consume-queue
    rows are written: it is called after them). The consume-queue rows pass reads the records with
    their bodies, counts record problems, and writes the consume-queue rows of each scan task sorted
    by queue: no shuffle. The findings
    are then computed only where something is wrong: the continuity of the brokers and the order
    of the queues the chains suspect, and the record checks when the consume-queue rows pass saw a record fail.
    """
    sizes_df = lake.spark.createDataFrame(
        sorted(sizes.items()), "broker_name string, segment_size long"
    )  # each broker's latest segment size (build_segment_sizes), from the brokers rows
    records = Observation(f"{JOB}-records")
    if len(sizes) <= LITERAL_CHOICES:
        sized_df = checked_df.withColumn("segment_size", segment_size_of(sizes))
    else:
        sized_df = with_segment_size(checked_df, sizes_df)
    cq_row_columns = [n for n in CONSUME_QUEUE.column_names if n != "tags_code"] + ["tags", "delay_level", "sys_flag"]
    # every record's checks as one flag in the generated code, then observed on rows that narrow: the
    # observation ends Spark's generated code and takes every row as it comes (docs/benchmarks.md)
    flagged_df = sized_df.select(*cq_row_columns, failing(record_checks()).cast("int").alias("_failed"))
    observed_df = flagged_df.observe(records, F.max("_failed").alias("failed")).drop("_failed")
    records_df = filter_dispatched(observed_df)
    distinct_tags = sorted({t for t in tags if t})
    if len(distinct_tags) <= LITERAL_CHOICES:
        coded_df = with_literal_tags_code(records_df, distinct_tags)
    else:
        coded_df = with_tags_code(records_df, lake.spark.createDataFrame([(t,) for t in distinct_tags], "tags string"))
    cq_rows_df = select_consume_queue(coded_df)
    write = lake.overwrite if plan.mode == "full" else lake.append
    written = write(
        CONSUME_QUEUE, cq_rows_df.sortWithinPartitions(*QUEUE_PARTITION, "queue_offset"), APP_ID, plan.target
    )
    # a full run whose consume-queue rows were committed by a run that stopped has no observation: check every record
    problems = written is None or bool(records.get["failed"])
    chains = chains_of()
    suspect_queues, suspect_brokers = chains.suspect_queues(), chains.suspect_brokers()
    summary = RebuildSummary(cq_rows=chains.new_cq_rows(), queues=chains.new_queues())
    findings: list[DataFrame] = []
    if suspect_brokers:
        findings.append(
            build_continuity_findings(checked_df, sizes_df, plan.target, log_context_df, brokers=suspect_brokers)
        )
    if suspect_queues:
        keys_df = lake.spark.createDataFrame(suspect_queues, "broker_name string, topic string, queue_id int")
        cq_rows_df = filter_dispatched(checked_df).join(F.broadcast(keys_df), list(QUEUE_KEY), "left_semi")
        context_df = (
            None
            if queue_context_df is None
            else queue_context_df.join(F.broadcast(keys_df), list(QUEUE_KEY), "left_semi")
        )
        findings.append(build_findings(with_queue_order(cq_rows_df, context_df), queue_checks(), plan.target))
    if problems:
        findings.append(build_findings(with_segment_size(checked_df, sizes_df), record_checks(), plan.target))
    return _write_findings(lake, plan, reduce(DataFrame.unionByName, findings) if findings else None, summary)


def _write_findings(
    lake: Lake, plan: RebuildPlan, findings_df: DataFrame | None, summary: RebuildSummary
) -> RebuildSummary:
    """Commit the findings (None: there are none) with the application transaction
    ``plan.target``; ``summary`` with the count of each problem."""
    write = lake.overwrite if plan.mode == "full" else lake.append
    if findings_df is None:  # an empty commit from the driver, no Spark job
        kinds: dict[str, int] = {}
        write_rows = lake.overwrite_rows if plan.mode == "full" else lake.append_rows
        write_rows(CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_INTEGRITY.arrow_schema.empty_table(), APP_ID, plan.target)
    else:
        findings_df = findings_df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            kinds = {r["problem"]: r["count"] for r in findings_df.groupBy("problem").count().collect()}
            write(CONSUME_QUEUE_INTEGRITY, findings_df, APP_ID, plan.target)
        finally:
            findings_df.unpersist()
    return replace(summary, findings=kinds)


def build_parser() -> argparse.ArgumentParser:
    """Options of ``rebuild_consume_queue``."""
    parser = job_parser(JOB, __doc__)
    parser.add_argument(
        "--full",
        action="store_true",
        help="rebuild the tables from the whole commit log instead of its new versions (when "
        "the commit log has a version not processed yet)",
    )
    parser.add_argument(
        "--driver-limit-mb",
        type=non_negative_int,
        default=DRIVER_INCREMENT_BYTES >> 20,
        help="an increment whose new commit log files hold at most this many MiB is checked and "
        "written on the driver, without Spark, when it is clean (0: always Spark; default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--verify-broker",
        action="append",
        default=[],
        metavar="NAME",
        help="after the rebuild, compare this ingested broker's own consume queues (its store's "
        "consumequeue/) with the rebuilt ones; the differences become BROKER_CQ_* findings (repeatable)",
    )
    parser.add_argument(
        "--store-dir",
        type=Path,
        default=None,
        help="the store root to read the consume queues of --verify-broker from (default: the one "
        "the broker was last ingested from)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv``, build the session, run."""
    args = build_parser().parse_args(argv)
    config = RebuildConfig(
        Path(args.lake),
        args.full,
        args.engine,
        args.driver_limit_mb << 20,
        tuple(args.verify_broker),
        args.store_dir,
    )
    spark = build_session("rmq-rebuild-consume-queue", engine=config.engine)
    job_run = run(spark, config)
    print(f"{JOB} {job_run.status} in {job_run.duration_ms} ms (run {job_run.run_id})")
    return 0
