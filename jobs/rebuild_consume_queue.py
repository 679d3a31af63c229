"""The ``rebuild_consume_queue`` job: consume queues rebuilt from the commit log, and their integrity.

The broker's dispatch rule decides which records get a consume queue unit: a record whose
transaction type (``sys_flag & 12``) is NOT (0) or COMMIT (8); PREPARED (4) and ROLLBACK (12)
records get none (ROCKETMQ_FACTS 2.1). A unit carries the record's position, size, store time and
``tags_code`` (ROCKETMQ_FACTS 3.2): Java ``String.hashCode`` of TAGS, 0 without tags, and on
``SCHEDULE_TOPIC_XXXX`` the delivery time of the DELAY level instead.

The integrity report lists, one row per finding (``consume_queue_integrity``):

- ``GAP``: a queue's offsets are not contiguous from 0 (the first offset is not 0, or offsets are
  missing between two units);
- ``DUPLICATE_QUEUE_OFFSET``: two units of a queue hold the same queue offset;
- ``NON_MONOTONIC_OFFSET``: a unit's commit log offset is not above the one of the unit before it;
- ``CRC_MISMATCH``: ``body_crc`` is not the CRC-32 of the body masked to 31 bits;
- ``SIZE_MISMATCH``: ``store_size`` is not RocketMQ's record length of the record's body, topic
  and properties (or the magic code is unknown), or it does not lead to the broker's next record
  (the next record starts right after this one, or at the next segment when it did not fit in
  what was left of this one);
- ``BEYOND_SEGMENT``: the record (plus the 8-byte end-of-segment blank) overruns its segment, or
  its ``segment`` column is not the base of the segment its offset lies in.

Corrupt or foreign rows are reported, never dropped: every dispatched record gets its unit.

Full runs (``--full``, and the first run) overwrite the three tables. Incremental runs (the
default) read only the rows that commit log versions after the last processed one added, and
check them against the state already built. That state is ``consume_queue_tails``: the last unit
of every queue and the last record of every broker's log. When every new record and unit comes
after them (the broker appends), the new rows are checked against these rows alone; otherwise
(a new record goes back into a queue or a log) against the units of each queue from the one
before the new ones (from ``consume_queue``) and the records of each broker from the one before
the new ones (from the commit log as of the processed version). The processed commit log version
is a Delta application transaction (``rebuild_consume_queue``) committed with the rows of the
three tables, so a rerun with no new commit log version commits nothing. Findings already
recorded are never withdrawn by an incremental run; a full run recomputes them all.

The continuity of every queue and broker log is checked on the driver first, from the narrow
columns of the commit log read file by file (:mod:`jobs.log_chains`); the commit log is then
scanned once with its bodies: each scan task writes its units sorted by queue (no shuffle) while
an observation notes whether any record fails a check. The findings themselves are computed in
Spark only for the queues and brokers the driver suspects, and for the records when one failed.
The units commit first, the tails last; a run that stops before the findings or the tails commit
leaves them behind ``consume_queue``, and the next run rebuilds in full.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from broker_model.common import QUEUE_KEY, QueueKey, dispatched_mask
from broker_model.common import constants as c
from jobs.cli import job_parser
from jobs.driver_units import DRIVER_COLUMNS, Declined, consume_queue_units, has_record_problem
from jobs.lake import IncrementalReadError, Lake, build_session
from jobs.log_chains import CHAIN_COLUMNS, Chains, segment_sizes
from jobs.rules import consume_queue_tags_code, delay_level, is_dispatched, java_string_hash
from jobs.runs import JobRun, record_run, table_versions
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUME_QUEUE_INTEGRITY,
    CONSUME_QUEUE_TAILS,
    spark_schema,
)
from schemas.errors import LakeError

JOB = "rebuild_consume_queue"
APP_ID = JOB  # the Delta application transaction id; its version is the commit log version processed

PROBLEMS = (
    "GAP",
    "DUPLICATE_QUEUE_OFFSET",
    "NON_MONOTONIC_OFFSET",
    "CRC_MISMATCH",
    "SIZE_MISMATCH",
    "BEYOND_SEGMENT",
)

# calMsgLength with both hosts IPv4 and magic v1, without body, topic and property bytes
_FIXED_RECORD_LENGTH = 91
_IPV6_HOST_EXTRA = 12  # an IPv6 address takes 16 bytes instead of 4
# the property string entry holding DELAY (string2messageProperties: key, \x01, non-empty value)

# an increment whose new commit log files hold at most this many bytes (Parquet) is read, checked
# and written on the driver when it is clean: a few Spark jobs would cost more than the work
DRIVER_INCREMENT_BYTES = 256 << 20
# units are shuffled by queue with the topic first: they then come out sorted by topic, the
# partition column of consume_queue, and the write needs no sort of its own
_QUEUE_PARTITION = ("topic", "broker_name", "queue_id")
CHECKED_COLUMNS = (
    "broker_name",
    "segment",
    "topic",
    "queue_id",
    "queue_offset",
    "commit_log_offset",
    "store_size",
    "magic_code",
    "body_crc",
    "sys_flag",
    "store_timestamp",
    "tags",
    "delay_level",
    "computed_body_crc",
    "computed_store_size",
)

Check = tuple[str, Column, Column, bool]  # problem, condition, detail, whether the finding names a queue unit


# ---------------------------------------------------------------------------------------------
# Column functions
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# The consume queue
# ---------------------------------------------------------------------------------------------


def with_delay_level(commitlog_df: DataFrame) -> DataFrame:
    """``commitlog_df`` with ``delay_level`` (int): the DELAY of records on ``SCHEDULE_TOPIC_XXXX``
    (see :func:`delay_level`), null elsewhere. Needs ``topic`` and ``raw_properties``."""
    # the when keeps the property parsing off every record outside the schedule topic
    level = F.when(F.col("topic") == c.SCHEDULE_TOPIC, delay_level(F.col("raw_properties")))
    return commitlog_df.withColumn("delay_level", level)


def with_tags_code(records_df: DataFrame, tags_df: DataFrame | None = None) -> DataFrame:
    """``records_df`` with ``tags_code`` (long), the consume queue's tags code of each record.

    Needs ``tags``, ``store_timestamp`` and ``delay_level`` (:func:`with_delay_level`). With a
    level ``min(delay_level, 18) > 0`` (schedule topic only): ``store_timestamp`` plus the level's
    delay (ms). Otherwise the Java hash of ``tags``, 0 when null or empty.

    The hash is computed once per distinct tags value and broadcast: tags are the few categories
    consumers subscribe by, and a per-record hash costs more than the whole scan. ``tags_df``
    (a ``tags`` column) gives the values to hash when they are known already, else the distinct
    tags of ``records_df`` are used; a tags value missing from ``tags_df`` gets code 0.
    """
    codes_df = (
        (records_df if tags_df is None else tags_df)
        .select(F.col("tags").alias("_tags"))
        .where(F.length("_tags") > 0)
        .distinct()
        .select("_tags", java_string_hash(F.col("_tags")).alias("_tags_hash"))
    )
    coded_df = records_df.join(F.broadcast(codes_df), F.col("tags") == F.col("_tags"), how="left")
    tags_code = consume_queue_tags_code(F.col("_tags_hash"), F.col("delay_level"), F.col("store_timestamp"))
    return coded_df.withColumn("tags_code", tags_code).drop("_tags", "_tags_hash")


def filter_dispatched(records_df: DataFrame) -> DataFrame:
    """The records that get a consume queue unit (transaction type NOT or COMMIT); needs ``sys_flag``."""
    return records_df.where(is_dispatched(F.col("sys_flag")))


def select_consume_queue(coded_df: DataFrame) -> DataFrame:
    """The consume queue units of records that already carry ``tags_code`` (see :func:`with_tags_code`)."""
    return coded_df.transform(filter_dispatched).select(*CONSUME_QUEUE.column_names)


def build_consume_queue(commitlog_df: DataFrame) -> DataFrame:
    """The consume queue units of ``commitlog_df``, as the broker dispatches them.

    One unit per record whose transaction type is NOT or COMMIT, whatever else is wrong with it
    (the integrity report tells); columns exactly ``consume_queue``'s. Needs the commit log columns
    ``broker_name``, ``topic``, ``queue_id``, ``queue_offset``, ``commit_log_offset``,
    ``store_size``, ``sys_flag``, ``tags``, ``raw_properties`` and ``store_timestamp``.
    Deterministic: the same rows give the same units.
    """
    return commitlog_df.transform(with_delay_level).transform(with_tags_code).transform(select_consume_queue)


# ---------------------------------------------------------------------------------------------
# Checks of records and queue units
# ---------------------------------------------------------------------------------------------


def with_record_checks(commitlog_df: DataFrame) -> DataFrame:
    """``commitlog_df`` with what the record's own bytes say its CRC and length are.

    ``computed_body_crc`` (long): Spark's CRC-32 of ``body`` masked with 0x7FFFFFFF (``UtilAll.crc32``).
    ``computed_store_size`` (long): ``calMsgLength``, ``91 + body + UTF-8 topic + properties``
    bytes, +12 per IPv6 host (``sys_flag`` bits 16 and 32), +1 for magic v2; null when
    ``magic_code`` is neither v1 nor v2. Needs ``body``, ``topic``, ``raw_properties``,
    ``sys_flag`` and ``magic_code``.
    """
    sys_flag = F.col("sys_flag")
    magic = F.col("magic_code")
    ipv6_bytes = sum(
        (
            F.when(sys_flag.bitwiseAND(bit) != 0, _IPV6_HOST_EXTRA).otherwise(0)
            for bit in (c.BORNHOST_V6_FLAG, c.STOREHOSTADDRESS_V6_FLAG)
        ),
        F.lit(0),
    )
    topic_length_bytes = F.when(magic == c.MAGIC_CODE_V1, 0).when(magic == c.MAGIC_CODE_V2, 1)
    variable = F.length("body") + F.octet_length("topic") + F.length("raw_properties")
    size = F.lit(_FIXED_RECORD_LENGTH).cast("long") + variable.cast("long") + ipv6_bytes + topic_length_bytes
    return commitlog_df.withColumns(
        {"computed_body_crc": F.crc32("body").bitwiseAND(0x7FFFFFFF), "computed_store_size": size}
    )


def build_checked_records(commitlog_df: DataFrame) -> DataFrame:
    """The :data:`CHECKED_COLUMNS` of commit log records: their queue and position columns, the
    DELAY level and the CRC and length their bytes give (bodies and properties dropped)."""
    return commitlog_df.transform(with_delay_level).transform(with_record_checks).select(*CHECKED_COLUMNS)


def build_segment_sizes(brokers_df: DataFrame) -> DataFrame:
    """``(broker_name, segment_size)`` from each broker's latest ``brokers`` row (by start time)."""
    latest = F.max_by("segment_size", F.struct("started_timestamp", "segment_size"))
    return brokers_df.groupBy("broker_name").agg(latest.alias("segment_size")).select("broker_name", "segment_size")


def with_segment_size(records_df: DataFrame, segment_sizes_df: DataFrame) -> DataFrame:
    """``records_df`` with ``segment_size`` (bytes) of its broker, from ``segment_sizes_df``
    (:func:`build_segment_sizes`); RocketMQ's default 1 GiB for a broker missing from it."""
    sizes_df = segment_sizes_df.select("broker_name", F.col("segment_size").alias("_segment_size"))
    joined_df = records_df.join(F.broadcast(sizes_df), on="broker_name", how="left")
    size = F.coalesce(F.col("_segment_size"), F.lit(c.DEFAULT_SEGMENT_SIZE).cast("long"))
    return joined_df.withColumn("segment_size", size).drop("_segment_size")


def record_checks() -> list[Check]:
    """CRC_MISMATCH, SIZE_MISMATCH (length formula) and BEYOND_SEGMENT, on the rows of
    :func:`build_checked_records` with :func:`with_segment_size`."""
    offset, size, segment = F.col("commit_log_offset"), F.col("store_size"), F.col("segment")
    segment_size, computed_size = F.col("segment_size"), F.col("computed_store_size")
    base = offset - offset % segment_size
    end = offset + size
    return [
        (
            "CRC_MISMATCH",
            F.col("computed_body_crc") != F.col("body_crc"),
            F.format_string("body_crc %d, but the body's CRC-32 & 0x7FFFFFFF is %d", "body_crc", "computed_body_crc"),
            False,
        ),
        (
            "SIZE_MISMATCH",
            computed_size.isNull(),
            F.format_string(
                f"magic_code %d is neither v1 ({c.MAGIC_CODE_V1}) nor v2 ({c.MAGIC_CODE_V2}): "
                "the record length cannot be checked",
                "magic_code",
            ),
            False,
        ),
        (
            "SIZE_MISMATCH",
            computed_size != size,
            F.format_string(
                "store_size %d, but RocketMQ's length of this body, topic and properties is %d", size, computed_size
            ),
            False,
        ),
        (
            "BEYOND_SEGMENT",
            segment != base,
            F.format_string(
                "segment %d, but offset %d lies in the segment at %d (segments of %d bytes)",
                segment,
                offset,
                base,
                segment_size,
            ),
            False,
        ),
        (
            "BEYOND_SEGMENT",
            end + c.END_FILE_MIN_BLANK_LENGTH > segment + segment_size,
            F.format_string(
                "the record ends at %d, leaving less than the 8-byte blank before the end of segment %d at %d",
                end,
                segment,
                segment + segment_size,
            ),
            False,
        ),
    ]


def with_queue_order(units_df: DataFrame, context_df: DataFrame | None = None) -> DataFrame:
    """The new units ``units_df`` and the context units, shuffled by queue, each with the unit before it.

    Adds ``_new`` (false for context units) and ``_prior_offset``, ``_prior_log_offset``,
    ``_prior_new``: the queue offset, commit log offset and ``_new`` of the unit before in the
    queue, ordered by ``(queue_offset, commit_log_offset, _new)`` (units equal on all three are
    the same record twice, interchangeable for every check); null for a queue's first unit.

    Args:
        units_df: units of new records (dispatched rows, with at least the queue columns).
        context_df: units already checked (``consume_queue`` columns) that precede or interleave
            the new ones (see :func:`build_queue_context`); None when there are none.
    """
    rows_df = units_df.withColumn("_new", F.lit(True))
    if context_df is not None:
        rows_df = rows_df.unionByName(_as_context_units(context_df, rows_df.schema))
    window = Window.partitionBy(*_QUEUE_PARTITION).orderBy("queue_offset", "commit_log_offset", "_new")
    priors = {
        f"_prior_{n}": F.lag(c_).over(window)
        for n, c_ in (("offset", "queue_offset"), ("log_offset", "commit_log_offset"), ("new", "_new"))
    }
    return rows_df.repartition(*_QUEUE_PARTITION).withColumns(priors)


def _as_context_units(context_df: DataFrame, schema: StructType) -> DataFrame:
    """Context units in the shape of the new rows: columns they lack are null, ``_new`` false."""
    present = set(context_df.columns)
    columns = [
        F.col(f.name) if f.name in present else F.lit(None).cast(f.dataType).alias(f.name)
        for f in schema.fields
        if f.name != "_new"
    ]
    return context_df.select(*columns, F.lit(False).alias("_new"))


def queue_checks() -> list[Check]:
    """GAP, DUPLICATE_QUEUE_OFFSET and NON_MONOTONIC_OFFSET, on the rows of :func:`with_queue_order`
    that are new or follow a new unit; a queue's first unit must have queue offset 0."""
    offset, log_offset = F.col("queue_offset"), F.col("commit_log_offset")
    prior_offset, prior_log_offset = F.col("_prior_offset"), F.col("_prior_log_offset")
    checked = F.col("_new") | F.coalesce(F.col("_prior_new"), F.lit(False))
    return [
        (
            "GAP",
            checked & prior_offset.isNull() & (offset != 0),
            F.format_string("the queue starts at queue offset %d: offsets 0..%d are missing", offset, offset - 1),
            True,
        ),
        (
            "GAP",
            checked & (offset > prior_offset + 1),
            F.format_string("queue offsets %d..%d are missing", prior_offset + 1, offset - 1),
            True,
        ),
        (
            "DUPLICATE_QUEUE_OFFSET",
            checked & (offset == prior_offset),
            F.format_string("queue offset %d is also held by commit log offset %d", offset, prior_log_offset),
            True,
        ),
        (
            "NON_MONOTONIC_OFFSET",
            checked & (offset > prior_offset) & (log_offset <= prior_log_offset),
            F.format_string(
                "commit log offset %d is not above %d, the one of queue offset %d",
                log_offset,
                prior_log_offset,
                prior_offset,
            ),
            True,
        ),
    ]


def build_integrity_report(
    checked_df: DataFrame,
    segment_sizes_df: DataFrame,
    commitlog_version: int,
    queue_context_df: DataFrame | None = None,
    log_context_df: DataFrame | None = None,
) -> DataFrame:
    """Every integrity finding about the records of ``checked_df``, as ``consume_queue_integrity`` rows.

    Args:
        checked_df: the records to check (:func:`build_checked_records`).
        segment_sizes_df: ``(broker_name, segment_size)``; brokers missing from it are taken to
            use RocketMQ's default 1 GiB segments.
        commitlog_version: the commit log version the check covers, written on every finding.
        queue_context_df: units already checked (see :func:`with_queue_order`); None for a full check.
        log_context_df: records already checked (see :func:`build_continuity_findings`); None for
            a full check.

    Returns:
        One row per finding; a record or unit with several problems has several rows. A finding
        about a record alone (CRC_MISMATCH, SIZE_MISMATCH, BEYOND_SEGMENT) has null topic,
        queue_id and queue_offset. Context rows are only checked against new neighbours.
    """
    sized_df = with_segment_size(checked_df, segment_sizes_df)
    return (
        build_findings(sized_df, record_checks(), commitlog_version)
        .unionByName(
            build_findings(
                with_queue_order(filter_dispatched(checked_df), queue_context_df), queue_checks(), commitlog_version
            )
        )
        .unionByName(build_continuity_findings(checked_df, segment_sizes_df, commitlog_version, log_context_df))
    )


def build_findings(df: DataFrame, checks: list[Check], commitlog_version: int) -> DataFrame:
    """One ``consume_queue_integrity`` row per true check of each row of ``df``."""
    names = ("topic", "queue_id", "queue_offset")
    null_queue = [F.lit(None).cast("string"), F.lit(None).cast("int"), F.lit(None).cast("long")]
    flagged = [
        F.when(
            condition,
            F.struct(
                F.lit(problem).alias("problem"),
                detail.alias("detail"),
                *[(F.col(n) if in_queue else v).alias(n) for n, v in zip(names, null_queue, strict=True)],
            ),
        )
        for problem, condition, detail, in_queue in checks
    ]
    return (
        df.where(failing(checks))
        .select("broker_name", "commit_log_offset", F.explode(F.array(*flagged)).alias("_finding"))
        .where(F.col("_finding").isNotNull())
        .select(
            "broker_name",
            "_finding.topic",
            "_finding.queue_id",
            "_finding.queue_offset",
            "commit_log_offset",
            "_finding.problem",
            "_finding.detail",
            F.lit(commitlog_version).cast("long").alias("commitlog_version"),
        )
    )


def failing(checks: list[Check]) -> Column:
    """Whether a row fails any of ``checks`` (a check whose condition is null does not fail)."""
    any_flag = F.lit(False)
    for _, condition, _, _ in checks:
        any_flag = any_flag | F.coalesce(condition, F.lit(False))
    return any_flag


# ---------------------------------------------------------------------------------------------
# Continuity of each broker's log
# ---------------------------------------------------------------------------------------------


def build_continuity_findings(
    records_df: DataFrame,
    segment_sizes_df: DataFrame,
    commitlog_version: int,
    context_df: DataFrame | None = None,
    brokers: Sequence[str] | None = None,
) -> DataFrame:
    """SIZE_MISMATCH findings of records whose ``store_size`` does not lead to the broker's next record.

    The next record (by ``commit_log_offset``, within the broker) must start at ``offset +
    store_size``, or at the next segment's base when it did not fit in what this record left of
    its segment (``end + next size + 8 > segment end``); the broker's last record is not checked.
    ``context_df`` holds records already checked (:func:`build_log_context`): one of them is only
    checked when its next record is new. Needs ``broker_name``, ``segment``,
    ``commit_log_offset``, ``store_size`` and ``tags``. Only the records of ``brokers`` are
    sorted and checked (None: every broker's); the job passes the brokers its
    :class:`~jobs.log_chains.Chains` suspect.
    """
    marked_df = _marked(records_df, context_df, ["broker_name", "commit_log_offset", "store_size"])
    suspect_df = marked_df if brokers is None else marked_df.where(F.col("broker_name").isin(*brokers))
    window = Window.partitionBy("broker_name").orderBy("commit_log_offset", "store_size", "_new")
    next_df = with_segment_size(suspect_df, segment_sizes_df).withColumns(
        {f"_next_{n}": F.lead(n).over(window) for n in ("commit_log_offset", "store_size", "_new")}
    )
    offset, size = F.col("commit_log_offset"), F.col("store_size")
    next_offset, next_size = F.col("_next_commit_log_offset"), F.col("_next_store_size")
    segment_end = offset - offset % F.col("segment_size") + F.col("segment_size")
    end = offset + size
    rolled = (next_offset == segment_end) & (end + next_size + c.END_FILE_MIN_BLANK_LENGTH > segment_end)
    bad = (F.col("_new") | F.col("_next__new")) & ~((next_offset == end) | rolled)
    detail = F.when(
        next_offset == segment_end,
        F.format_string(
            "the next record starts the next segment at %d though %d bytes fitted after the end of this one at %d",
            segment_end,
            next_size,
            end,
        ),
    ).otherwise(
        F.format_string(
            "the next record starts at %d, not at %d (offset %d + store_size %d)", next_offset, end, offset, size
        )
    )
    return build_findings(next_df, [("SIZE_MISMATCH", bad, detail, False)], commitlog_version)


def _marked(new_df: DataFrame, context_df: DataFrame | None, columns: Sequence[str]) -> DataFrame:
    """``columns`` of the new rows with ``_new`` true, and of the context rows with ``_new`` false
    (null for columns the context lacks)."""
    marked_df = new_df.select(*columns, F.lit(True).alias("_new"))
    if context_df is None:
        return marked_df
    types = {f.name: f.dataType for f in marked_df.schema.fields}
    present = set(context_df.columns)
    context = [F.col(n) if n in present else F.lit(None).cast(types[n]).alias(n) for n in columns]
    return marked_df.unionByName(context_df.select(*context, F.lit(False).alias("_new")))


# ---------------------------------------------------------------------------------------------
# Context of an incremental run
# ---------------------------------------------------------------------------------------------


def build_queue_context(consume_queue_df: DataFrame, entries_df: DataFrame) -> DataFrame:
    """The units of ``consume_queue_df`` the queue checks of the new units ``entries_df`` need.

    Per queue of ``entries_df``: the unit just before its first new unit in
    ``(queue_offset, commit_log_offset)`` order, and every unit from there on (none after it when
    the new units only append). Columns: broker_name, topic, queue_id, queue_offset, commit_log_offset.
    """
    units_df = consume_queue_df.select(*QUEUE_KEY, "queue_offset", "commit_log_offset")
    return _context(units_df, entries_df, list(QUEUE_KEY), ["queue_offset", "commit_log_offset"])


def build_log_context(commitlog_df: DataFrame, records_df: DataFrame) -> DataFrame:
    """The records of ``commitlog_df`` the continuity check of the new ``records_df`` needs.

    Per broker of ``records_df``: the record just before its first new record by
    ``commit_log_offset``, and every record from there on. Columns: broker_name, segment,
    commit_log_offset, store_size.
    """
    old_df = commitlog_df.select("broker_name", "segment", "commit_log_offset", "store_size")
    return _context(old_df, records_df, ["broker_name"], ["commit_log_offset"])


def _context(old_df: DataFrame, new_df: DataFrame, keys: list[str], order: list[str]) -> DataFrame:
    first_df = new_df.groupBy(*keys).agg(F.min(F.struct(*order)).alias("_first"))
    candidates_df = old_df.withColumn("_order", F.struct(*order)).join(F.broadcast(first_df), on=keys, how="inner")
    before_df = candidates_df.where(F.col("_order") < F.col("_first"))
    last_df = before_df.groupBy(*keys).agg(F.max("_order").alias("_last"))
    return (
        candidates_df.join(F.broadcast(last_df), on=keys, how="left")
        .where(F.col("_order") >= F.coalesce(F.col("_last"), F.col("_first")))
        .select(*old_df.columns)
    )


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RebuildConfig:
    """Options of ``rebuild_consume_queue``: the lake root, a full rebuild or not, the lake engine,
    and the most bytes of new commit log files an incremental run reads on the driver (0: none)."""

    lake: Path
    full: bool = False
    engine: str = "auto"
    driver_bytes: int = DRIVER_INCREMENT_BYTES


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
    """What a run wrote: units, queues with new units, findings per problem; for an incremental
    run, what the new rows were checked against (``context``)."""

    entries: int = 0
    queues: int = 0
    findings: dict[str, int] = field(default_factory=dict)
    context: str | None = None

    def row_counts(self) -> dict[str, int]:
        """The ``job_runs.row_counts`` of the run."""
        return {
            "consume_queue": self.entries,
            "queues": self.queues,
            "consume_queue_integrity": sum(self.findings.values()),
            **self.findings,
        }

    def lines(self) -> list[str]:
        """The summary printed on stdout."""
        counts = [("entries written", self.entries), ("queues", self.queues), ("findings", sum(self.findings.values()))]
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
    units but stopped before its findings or its tails (or the lake predates the tails table):
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
        return RebuildPlan("full", processed, latest, "the findings are behind the units (a run stopped)")
    if processed is not None and (tails_processed is None or tails_processed < processed):
        return RebuildPlan("full", processed, latest, "the tails are behind the units (a run stopped)")
    if processed is not None and processed >= latest:
        reason = f"commitlog version {latest} is already processed"
        if full:
            reason += f"; the outputs are complete, so --full writes nothing (to build them anyway, {_DELETE_OUTPUTS})"
        return RebuildPlan("noop", processed, latest, reason)
    if full or processed is None:
        return RebuildPlan("full", processed, latest, "--full" if full else "first run")
    return RebuildPlan("incremental", processed, latest, f"commitlog versions {processed + 1}..{latest}")


@dataclass(frozen=True)
class Tails:
    """Where the consume queue and the commit log end (``consume_queue_tails``): per queue, the
    ``(queue_offset, commit_log_offset)`` of its last unit; per broker, the ``(commit_log_offset,
    store_size, segment)`` of its last record. An incremental run whose new rows all come after
    them checks the new rows against these rows alone instead of reading old units and records."""

    queues: dict[QueueKey, tuple[int, int]] = field(default_factory=dict)
    logs: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @classmethod
    def from_arrow(cls, table: Any) -> Tails:
        """The tails of ``consume_queue_tails`` rows (an Arrow table)."""
        tails = cls()
        for r in table.to_pylist():
            if r["kind"] == "QUEUE":
                key = (r["broker_name"], r["topic"], r["queue_id"])
                tails.queues[key] = (r["queue_offset"], r["commit_log_offset"])
            else:
                tails.logs[r["broker_name"]] = (r["commit_log_offset"], r["store_size"], r["segment"])
        return tails

    @classmethod
    def of_rows(cls, rows: pa.Table, units: bool = True) -> Tails:
        """The tails of commit log ``rows`` (an Arrow table read on the driver): each broker's
        greatest ``(commit_log_offset, store_size)`` record, and with ``units`` each queue's
        greatest ``(queue_offset, commit_log_offset)`` dispatched record. Needs ``broker_name``,
        ``segment``, ``commit_log_offset`` and ``store_size``, and with ``units`` also ``topic``,
        ``queue_id``, ``queue_offset`` and ``sys_flag``."""
        tails = cls()
        for r in rows.to_pylist():
            record = (r["commit_log_offset"], r["store_size"], r["segment"])
            tails.logs[r["broker_name"]] = max(tails.logs.get(r["broker_name"], record), record)
            dispatched = units and r["sys_flag"] & c.TRANSACTION_ROLLBACK_TYPE in (
                c.TRANSACTION_NOT_TYPE,
                c.TRANSACTION_COMMIT_TYPE,
            )
            if dispatched:
                key, unit = (r["broker_name"], r["topic"], r["queue_id"]), (r["queue_offset"], r["commit_log_offset"])
                tails.queues[key] = max(tails.queues.get(key, unit), unit)
        return tails

    def to_arrow(self, commitlog_version: int) -> pa.Table:
        """The ``consume_queue_tails`` rows of these tails."""
        rows = [
            {
                "kind": "QUEUE",
                "broker_name": b,
                "topic": t,
                "queue_id": q,
                "queue_offset": qo,
                "segment": None,
                "commit_log_offset": clo,
                "store_size": None,
                "commitlog_version": commitlog_version,
            }
            for (b, t, q), (qo, clo) in sorted(self.queues.items())
        ] + [
            {
                "kind": "LOG",
                "broker_name": b,
                "topic": None,
                "queue_id": None,
                "queue_offset": None,
                "segment": segment,
                "commit_log_offset": clo,
                "store_size": size,
                "commitlog_version": commitlog_version,
            }
            for b, (clo, size, segment) in sorted(self.logs.items())
        ]
        return pa.Table.from_pylist(rows, schema=CONSUME_QUEUE_TAILS.arrow_schema)

    def merged(self, later: Tails) -> Tails:
        """These tails moved on by ``later`` (the tails of rows checked after them), per key the greater."""
        queues = {k: max(v, later.queues[k]) if k in later.queues else v for k, v in self.queues.items()}
        logs = {k: max(v, later.logs[k]) if k in later.logs else v for k, v in self.logs.items()}
        return Tails({**later.queues, **queues}, {**later.logs, **logs})

    def precede(self, starts: Sequence[QueueStart]) -> bool:
        """Whether every new record and unit comes after these tails: each broker's first new
        record after its last record, each queue's first new unit after its last unit. Then the
        context of the new rows is exactly the tails of their queues and brokers."""
        for start in starts:
            log = self.logs.get(start.broker_name)
            if log is not None and start.first_offset <= log[0]:
                return False
            unit = self.queues.get((start.broker_name, start.topic, start.queue_id))
            if unit is not None and start.first_unit is not None and start.first_unit <= unit[0]:
                return False
        return True

    def contexts(self, spark: SparkSession, starts: Sequence[QueueStart]) -> tuple[DataFrame | None, DataFrame]:
        """(queue context, log context) of the new rows of ``starts`` when :meth:`precede` holds:
        the last unit of their queues, the last record of their brokers (driver rows)."""
        queues = {(s.broker_name, s.topic, s.queue_id) for s in starts if s.first_unit is not None}
        brokers = {s.broker_name for s in starts}
        unit_rows = [(*k, *self.queues[k]) for k in sorted(queues) if k in self.queues]
        log_rows = [(b, segment, clo, size) for b, (clo, size, segment) in sorted(self.logs.items()) if b in brokers]
        queue_context_df = spark.createDataFrame(unit_rows, _UNIT_CONTEXT_SCHEMA) if unit_rows else None
        return queue_context_df, spark.createDataFrame(log_rows, _LOG_CONTEXT_SCHEMA)


_UNIT_CONTEXT_SCHEMA = "broker_name string, topic string, queue_id int, queue_offset long, commit_log_offset long"
_LOG_CONTEXT_SCHEMA = "broker_name string, segment long, commit_log_offset long, store_size int"


def run(spark: SparkSession, config: RebuildConfig) -> JobRun:
    """Rebuild (or extend) the consume queues, the integrity report and the tails; print and
    record the run.

    Raises:
        LakeError: the lake has no commit log, or the outputs are ahead of it (see :func:`plan_run`).
    """
    job_run = JobRun(JOB)
    lake = Lake(spark, config.lake, config.engine)
    latest = lake.version(COMMITLOG)
    if latest is None:
        raise LakeError(f"no commitlog table under {config.lake}; write a workload first (python -m broker_model)")
    units, findings, tails = (
        lake.transaction_version(spec, APP_ID) for spec in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS)
    )
    plan = plan_run(units, findings, tails, latest, config.full)
    job_run.input_versions = {COMMITLOG.name: plan.target}
    if plan.mode == "noop":
        print(f"{JOB}: nothing to do, {plan.reason} (lake {config.lake})")
        record_run(lake, job_run.finish("NOOP", plan.reason))
        return job_run
    plan, summary = _execute(lake, plan, config.driver_bytes)
    job_run.output_versions = table_versions(
        lake, [s.name for s in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS)]
    )
    job_run.row_counts = summary.row_counts()
    print(f"{JOB}: {plan.mode} rebuild ({plan.reason}) up to commitlog version {plan.target} (lake {config.lake})")
    print("\n".join(summary.lines()))
    record_run(lake, job_run.finish("SUCCEEDED", f"{plan.mode} up to commitlog version {plan.target}"))
    return job_run


def _execute(lake: Lake, plan: RebuildPlan, driver_bytes: int) -> tuple[RebuildPlan, RebuildSummary]:
    """Run ``plan``; an incremental plan whose new rows cannot be read alone becomes a full one.
    The tails commit last, with the same application transaction as the units and findings."""
    if plan.mode == "incremental":
        try:
            summary, tails = _incremental(lake, plan, driver_bytes)
            lake.overwrite_rows(CONSUME_QUEUE_TAILS, tails.to_arrow(plan.target), APP_ID, plan.target)
            return plan, summary
        except IncrementalReadError as err:
            print(f"{JOB}: cannot read the new commit log rows alone ({err}); rebuilding in full")
            plan = replace(plan, mode="full", reason=str(err))
    chains = Chains(segment_sizes(lake.read_rows(BROKERS)))
    tags: set[str | None] = set()
    # the strings as stored, dictionary-encoded: the chains group by them, the tags are few
    for rows in lake.iter_file_rows(
        COMMITLOG, [*CHAIN_COLUMNS, "tags"], version=plan.target, dictionaries=("broker_name", "topic", "tags")
    ):
        chains.add_part(rows)
        tags.update(pc.unique(rows["tags"]).to_pylist())
    checked_df = build_checked_records(lake.read(COMMITLOG, version=plan.target))
    summary = _rebuild(lake, plan, checked_df, chains, tags, None, None)
    tails = Tails(chains.queue_tails(), chains.log_tails())
    lake.overwrite_rows(CONSUME_QUEUE_TAILS, tails.to_arrow(plan.target), APP_ID, plan.target)
    return plan, summary


@dataclass(frozen=True)
class QueueStart:
    """Where the new records of an incremental run start in one queue: the smallest commit log
    offset of its records and the smallest queue offset of its units (None without units)."""

    broker_name: str
    topic: str
    queue_id: int
    first_offset: int
    first_unit: int | None


_START_COLUMNS = (*CHAIN_COLUMNS, "tags")


def queue_starts(rows: pa.Table) -> list[QueueStart]:
    """The :class:`QueueStart` of every queue of commit log ``rows`` (:data:`_START_COLUMNS`, an
    Arrow table read on the driver: the new rows of an incremental run are few, and their starts
    decide what the Spark work reads). Units are the dispatched records (:func:`is_dispatched`)."""
    units = pc.if_else(dispatched_mask(rows["sys_flag"]), rows["queue_offset"], pa.scalar(None, pa.int64()))
    keyed = rows.select(list(QUEUE_KEY)).append_column("first_offset", rows["commit_log_offset"])
    keyed = keyed.append_column("first_unit", units)
    grouped = keyed.group_by(list(QUEUE_KEY)).aggregate([("first_offset", "min"), ("first_unit", "min")])
    return [
        QueueStart(r["broker_name"], r["topic"], r["queue_id"], r["first_offset_min"], r["first_unit_min"])
        for r in grouped.to_pylist()
    ]


def _incremental(lake: Lake, plan: RebuildPlan, driver_bytes: int) -> tuple[RebuildSummary, Tails]:
    """Read the new rows and the context they are checked against, then rebuild from them.

    The context is the tails when every new row comes after them (the broker appends); else the
    old units and records next to the new ones, read from ``consume_queue`` and the commit log.
    New rows in files of at most ``driver_bytes`` are read on the driver whole; when they follow
    the tails and are clean, :func:`_driver_increment` writes them without Spark. Otherwise the
    Spark path checks them; its new rows and contexts are small (they grow with the new data, not
    with the log), so they are persisted: every check and the units pass reuse them.
    """
    processed = plan.processed if plan.processed is not None else -1
    old_tails = tails = Tails.from_arrow(lake.read_rows(CONSUME_QUEUE_TAILS))
    sizes = segment_sizes(lake.read_rows(BROKERS))
    on_driver = 0 < driver_bytes and lake.appended_size(COMMITLOG, processed, plan.target) <= driver_bytes
    new_rows = lake.read_appended_rows(
        COMMITLOG, DRIVER_COLUMNS if on_driver else _START_COLUMNS, processed, plan.target
    )
    if on_driver:
        done = _driver_increment(lake, plan, new_rows, old_tails, sizes)
        if done is not None:
            return done
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
            context = "the old units and records from the one before them on (they do not all follow the tails)"
            queue_context_df, log_context_df = _read_contexts(lake, starts, checked_df, processed, kept)
        chains.add_context_rows(
            None if queue_context_df is None else queue_context_df.toArrow(), log_context_df.toArrow()
        )
        tags = set(pc.unique(new_rows["tags"]).to_pylist())
        summary = _rebuild(lake, plan, checked_df, chains, tags, queue_context_df, log_context_df)
        return replace(summary, context=context), tails
    finally:
        for df in persisted:
            df.unpersist()


def _driver_increment(
    lake: Lake, plan: RebuildPlan, rows: pa.Table, old_tails: Tails, sizes: Mapping[str, int]
) -> tuple[RebuildSummary, Tails] | None:
    """Check and write the new ``rows`` (:data:`~jobs.driver_units.DRIVER_COLUMNS`) on the driver,
    without Spark: their units appended with delta-rs, an empty findings commit, each with the
    application transaction. None (nothing written) when the rows do not all follow the tails,
    or a queue or broker is suspect, or a record fails a check, or a row is one the driver
    declines: the Spark path then finds what is wrong."""
    starts = queue_starts(rows)
    if not old_tails.precede(starts):
        return None
    chains = Chains(sizes)
    chains.add_part(rows)
    chains.add_context(old_tails.queues, old_tails.logs)
    if chains.suspect_queues() or chains.suspect_brokers() or has_record_problem(rows, sizes):
        return None
    try:
        units = consume_queue_units(rows)
    except Declined as err:
        print(f"{JOB}: the new rows go through Spark ({err})")
        return None
    lake.append_rows(CONSUME_QUEUE, units, APP_ID, plan.target)
    lake.append_rows(CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_INTEGRITY.arrow_schema.empty_table(), APP_ID, plan.target)
    context = "the tails of their queues and brokers (consume_queue_tails), on the driver"
    summary = RebuildSummary(entries=chains.new_units(), queues=chains.new_queues(), context=context)
    return summary, old_tails.merged(Tails.of_rows(rows))


def _read_contexts(
    lake: Lake, starts: list[QueueStart], checked_df: DataFrame, processed: int, kept: Callable[[DataFrame], DataFrame]
) -> tuple[DataFrame | None, DataFrame]:
    """(queue context, log context) of new rows that do not all follow the tails: the old units
    and records from the one before the first new one on, read from ``consume_queue`` and from
    the commit log as of version ``processed``."""
    bounds: dict[str, int] = {}
    for start in starts:
        bounds[start.broker_name] = min(bounds.get(start.broker_name, start.first_offset), start.first_offset)
    old_df = lake.read_around(COMMITLOG, "commit_log_offset", bounds, "broker_name", version=processed)
    log_context_df = kept(build_log_context(old_df, checked_df))
    queues = [s for s in starts if s.first_unit is not None]
    if not queues:
        return None, log_context_df
    units_df = kept(_read_queue_units(lake, queues, "tail"))
    return kept(_queue_context(lake, queues, units_df, checked_df)), log_context_df


def _queue_context(lake: Lake, queues: list[QueueStart], units_df: DataFrame, checked_df: DataFrame) -> DataFrame:
    """The :func:`build_queue_context` of the new units, from ``units_df``: per queue, the units
    from queue offset ``first_unit - 1`` on (see :func:`_read_queue_units`). Queues where that unit
    is missing (a gap before the new units) are read whole."""
    found = {
        (r["broker_name"], r["topic"], r["queue_id"])
        for r in units_df.where(_at_offset(queues, "before")).select(*QUEUE_KEY).distinct().collect()
    }
    gapped = [q for q in queues if q.first_unit and (q.broker_name, q.topic, q.queue_id) not in found]
    if gapped:
        units_df = units_df.unionByName(_read_queue_units(lake, gapped, "head"))
    return build_queue_context(units_df, filter_dispatched(checked_df))


def _read_queue_units(lake: Lake, queues: list[QueueStart], part: str) -> DataFrame:
    """The units of ``queues`` at or above (``part="tail"``) or below (``"head"``) queue offset
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
    """Units of ``queues`` (any topic) relative to queue offset ``first_unit - 1``: ``"tail"`` at or
    above it, ``"head"`` below it, ``"before"`` at it; literal terms a Parquet reader can use."""
    terms = F.lit(False)
    for q in queues:
        bound, offset = (q.first_unit or 0) - 1, F.col("queue_offset")
        kept = {"tail": offset >= bound, "head": offset < bound, "before": offset == bound}[part]
        terms = terms | ((F.col("broker_name") == q.broker_name) & (F.col("queue_id") == q.queue_id) & kept)
    return terms


def _rebuild(
    lake: Lake,
    plan: RebuildPlan,
    checked_df: DataFrame,
    chains: Chains,
    tags: Iterable[str | None],
    queue_context_df: DataFrame | None,
    log_context_df: DataFrame | None,
) -> RebuildSummary:
    """Write the units of ``checked_df`` while counting record problems, then the findings.

    ``chains`` holds the runs of the same rows and their context (read on the driver), ``tags``
    their distinct tags. The units pass reads the records with their bodies, counts record
    problems, and writes the units of each scan task sorted by queue: no shuffle. The findings
    are then computed only where something is wrong: the continuity of the brokers and the order
    of the queues the chains suspect, and the record checks when the units pass saw a record fail.
    """
    sizes_df = _segment_sizes(lake)
    records = Observation(f"{JOB}-records")
    # one aggregate of one flag: the observation's per-row cost grows with its aggregates
    failed = F.max(failing(record_checks()).cast("int")).alias("failed")
    sized_df = with_segment_size(checked_df, sizes_df).observe(records, failed)
    tags_df = lake.spark.createDataFrame([(t,) for t in sorted(t for t in tags if t)], "tags string")
    unit_columns = [n for n in CONSUME_QUEUE.column_names if n != "tags_code"] + ["tags", "delay_level", "sys_flag"]
    units_df = select_consume_queue(with_tags_code(filter_dispatched(sized_df).select(*unit_columns), tags_df))
    write = lake.overwrite if plan.mode == "full" else lake.append
    written = write(
        CONSUME_QUEUE, units_df.sortWithinPartitions(*_QUEUE_PARTITION, "queue_offset"), APP_ID, plan.target
    )
    # a full run whose units were committed by a run that stopped has no observation: check every record
    problems = written is None or bool(records.get["failed"])
    suspect_queues, suspect_brokers = chains.suspect_queues(), chains.suspect_brokers()
    summary = RebuildSummary(entries=chains.new_units(), queues=chains.new_queues())
    findings: list[DataFrame] = []
    if suspect_brokers:
        findings.append(
            build_continuity_findings(checked_df, sizes_df, plan.target, log_context_df, brokers=suspect_brokers)
        )
    if suspect_queues:
        keys_df = lake.spark.createDataFrame(suspect_queues, "broker_name string, topic string, queue_id int")
        units_df = filter_dispatched(checked_df).join(F.broadcast(keys_df), list(QUEUE_KEY), "left_semi")
        context_df = (
            None
            if queue_context_df is None
            else queue_context_df.join(F.broadcast(keys_df), list(QUEUE_KEY), "left_semi")
        )
        findings.append(build_findings(with_queue_order(units_df, context_df), queue_checks(), plan.target))
    if problems:
        findings.append(build_findings(with_segment_size(checked_df, sizes_df), record_checks(), plan.target))
    return _write_findings(lake, plan, reduce(DataFrame.unionByName, findings) if findings else None, summary)


def _segment_sizes(lake: Lake) -> DataFrame:
    """The segment size of every broker of the lake (none when the lake has no ``brokers`` table)."""
    if lake.exists(BROKERS):
        return build_segment_sizes(lake.read(BROKERS))
    return lake.spark.createDataFrame([], "broker_name string, segment_size long")


def _write_findings(
    lake: Lake, plan: RebuildPlan, findings_df: DataFrame | None, summary: RebuildSummary
) -> RebuildSummary:
    """Commit the findings (None: there are none) with the application transaction
    ``plan.target``; ``summary`` with the count of each problem."""
    write = lake.overwrite if plan.mode == "full" else lake.append
    if findings_df is None:
        kinds: dict[str, int] = {}
        write(
            CONSUME_QUEUE_INTEGRITY,
            lake.spark.createDataFrame([], spark_schema(CONSUME_QUEUE_INTEGRITY)),
            APP_ID,
            plan.target,
        )
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
        type=_non_negative,
        default=DRIVER_INCREMENT_BYTES >> 20,
        help="an increment whose new commit log files hold at most this many MiB is checked and "
        "written on the driver, without Spark, when it is clean (0: always Spark; default: "
        "%(default)s)",
    )
    return parser


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"--driver-limit-mb must be 0 or more, not {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv``, build the session, run."""
    args = build_parser().parse_args(argv)
    config = RebuildConfig(Path(args.lake), args.full, args.engine, args.driver_limit_mb << 20)
    spark = build_session("rmq-rebuild-consume-queue", engine=config.engine)
    job_run = run(spark, config)
    print(f"{JOB} {job_run.status} in {job_run.duration_ms} ms (run {job_run.run_id})")
    return 0
