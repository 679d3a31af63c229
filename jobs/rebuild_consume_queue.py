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

The commit log is scanned once with its bodies: the records are shuffled by queue, checked there
and written as units in the same pass, while the problems are only counted; the findings
themselves are then computed from narrow columns (continuity), and from a second scan only when
that count is not zero. The units commit first, the tails last; a run that stops before the
findings or the tails commit leaves them behind ``consume_queue``, and the next run rebuilds in full.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
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

from broker_model import constants as c
from broker_model.errors import LakeError
from broker_model.lake_root import default_lake
from jobs.lake_io import IncrementalReadError, Lake
from jobs.runs import JobRun, record_run, table_versions
from jobs.session import build_session
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUME_QUEUE_INTEGRITY,
    CONSUME_QUEUE_TAILS,
    spark_schema,
)

JOB = "rebuild_consume_queue"
APP_ID = JOB  # the Delta application transaction id; its version is the commit log version processed

PROBLEMS = (
    "GAP", "DUPLICATE_QUEUE_OFFSET", "NON_MONOTONIC_OFFSET", "CRC_MISMATCH", "SIZE_MISMATCH", "BEYOND_SEGMENT",
)  # fmt: skip

_UINT32 = 1 << 32  # Java int arithmetic is modulo 2^32
_INT_SIGN = 1 << 31
_HASH_BITS = 0x7FFFFFFF  # 31-bit halves of xxhash64: sums of millions of them stay far below 2^63
# calMsgLength with both hosts IPv4 and magic v1, without body, topic and property bytes
_FIXED_RECORD_LENGTH = 91
_IPV6_HOST_EXTRA = 12  # an IPv6 address takes 16 bytes instead of 4
_UNKNOWN_DELAY_LEVEL_MILLIS = 1000  # ScheduleMessageService.computeDeliverTimestamp for a level not in the table
# the property string entry holding DELAY (string2messageProperties: key, \x01, non-empty value)
_SEP, _KV = c.PROPERTY_SEPARATOR, c.NAME_VALUE_SEPARATOR
_DELAY_PATTERN = f"(?:^|{_SEP}){c.PROPERTY_DELAY_TIME_LEVEL}{_KV}([^{_SEP}]+)"

QUEUE_KEYS = ("broker_name", "topic", "queue_id")
_DIGEST_KEYS = ("broker_name", "segment", "tags")
# units are shuffled by queue with the topic first: they then come out sorted by topic, the
# partition column of consume_queue, and the write needs no sort of its own
_QUEUE_PARTITION = ("topic", "broker_name", "queue_id")
CHECKED_COLUMNS = (
    "broker_name", "segment", "topic", "queue_id", "queue_offset", "commit_log_offset", "store_size",
    "magic_code", "body_crc", "sys_flag", "store_timestamp", "tags", "delay_level", "computed_body_crc",
    "computed_store_size",
)  # fmt: skip

Check = tuple[str, Column, Column, bool]  # problem, condition, detail, whether the finding names a queue unit


# ---------------------------------------------------------------------------------------------
# Column functions
# ---------------------------------------------------------------------------------------------


def java_string_hash(text: Column) -> Column:
    """Java ``String.hashCode`` of a string column, as a long (a signed 32-bit value).

    ``h = 31 * h + unit`` over the string's UTF-16 code units (a character outside the BMP is two
    surrogate units), modulo 2^32 in bigint arithmetic (no overflow under ANSI mode), then
    sign-extended. "" gives 0, null gives null.
    """
    units = F.regexp_extract_all(F.hex(F.encode(text, "UTF-16BE")), F.lit("([0-9A-F]{4})"), 1)
    unsigned = F.aggregate(
        units, F.lit(0).cast("long"), lambda h, unit: (h * 31 + F.conv(unit, 16, 10).cast("long")) % _UINT32
    )
    return (unsigned + _INT_SIGN) % _UINT32 - _INT_SIGN


def delay_level(raw_properties: Column) -> Column:
    """The DELAY property in a record's property bytes as an int; null when absent or not an integer.

    Parsed as the broker parses a stored record (``string2messageProperties``): entries are
    ``key\\x01value`` separated by ``\\x02``, a value is non-empty, the last DELAY entry wins.
    """
    values = F.regexp_extract_all(raw_properties.cast("string"), F.lit(_DELAY_PATTERN), 1)
    value = F.try_element_at(values, F.lit(-1))
    return F.when(value.rlike("^[+-]?[0-9]+$"), value.try_cast("int"))


def delay_millis(level: Column) -> Column:
    """The delay (ms) of a level in 1..18; ``computeDeliverTimestamp``'s +1000 ms for any other level."""
    table = F.create_map(*[F.lit(x) for i, ms in enumerate(c.DELAY_LEVEL_MILLIS, 1) for x in (i, ms)])
    return F.coalesce(F.try_element_at(table, level).cast("long"), F.lit(_UNKNOWN_DELAY_LEVEL_MILLIS).cast("long"))


def dispatched_mask(sys_flag: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """:func:`is_dispatched` over an Arrow column of ``sys_flag`` values, for rows read on the driver."""
    transaction_type = pc.bit_wise_and(sys_flag, c.TRANSACTION_ROLLBACK_TYPE)
    return pc.is_in(transaction_type, pa.array([c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE], pa.int32()))


def is_dispatched(sys_flag: Column) -> Column:
    """True when the record's transaction type (``sys_flag & 12``) is NOT (0) or COMMIT (8)."""
    return sys_flag.bitwiseAND(c.TRANSACTION_ROLLBACK_TYPE).isin(c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE)


def _hash_half(value: Column, high: bool) -> Column:
    hashed = F.xxhash64(value)
    return (F.shiftrightunsigned(hashed, 32) if high else hashed).bitwiseAND(_HASH_BITS)


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
        (records_df if tags_df is None else tags_df).select(F.col("tags").alias("_tags"))
        .where(F.length("_tags") > 0)
        .distinct()
        .select("_tags", java_string_hash(F.col("_tags")).alias("_tags_hash"))
    )  # fmt: skip
    coded_df = records_df.join(F.broadcast(codes_df), F.col("tags") == F.col("_tags"), how="left")
    raw_level = F.col("delay_level")
    level = F.when(raw_level > c.MAX_DELAY_LEVEL, F.lit(c.MAX_DELAY_LEVEL)).otherwise(raw_level)
    scheduled_code = F.when(level > 0, F.col("store_timestamp") + delay_millis(level))
    tags_code = F.coalesce(scheduled_code, F.col("_tags_hash"), F.lit(0).cast("long"))
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
        (F.when(sys_flag.bitwiseAND(bit) != 0, _IPV6_HOST_EXTRA).otherwise(0)
         for bit in (c.BORNHOST_V6_FLAG, c.STOREHOSTADDRESS_V6_FLAG)),
        F.lit(0),
    )  # fmt: skip
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
        ("CRC_MISMATCH", F.col("computed_body_crc") != F.col("body_crc"),
         F.format_string("body_crc %d, but the body's CRC-32 & 0x7FFFFFFF is %d", "body_crc", "computed_body_crc"),
         False),
        ("SIZE_MISMATCH", computed_size.isNull(),
         F.format_string(f"magic_code %d is neither v1 ({c.MAGIC_CODE_V1}) nor v2 ({c.MAGIC_CODE_V2}): "
                         "the record length cannot be checked", "magic_code"), False),
        ("SIZE_MISMATCH", computed_size != size,
         F.format_string("store_size %d, but RocketMQ's length of this body, topic and properties is %d",
                         size, computed_size), False),
        ("BEYOND_SEGMENT", segment != base,
         F.format_string("segment %d, but offset %d lies in the segment at %d (segments of %d bytes)",
                         segment, offset, base, segment_size), False),
        ("BEYOND_SEGMENT", end + c.END_FILE_MIN_BLANK_LENGTH > segment + segment_size,
         F.format_string("the record ends at %d, leaving less than the 8-byte blank before the end of "
                         "segment %d at %d", end, segment, segment + segment_size), False),
    ]  # fmt: skip


def with_queue_order(units_df: DataFrame, context_df: DataFrame | None = None) -> DataFrame:
    """The new units ``units_df`` and the context units, shuffled by queue, each with the unit before it.

    Adds ``_new`` (false for context units) and ``_prior_offset``, ``_prior_log_offset``,
    ``_prior_new``: the queue offset, commit log offset and ``_new`` of the unit before in the
    queue, ordered by ``(queue_offset, commit_log_offset, _new)`` (units equal on all three are
    the same record twice, interchangeable for every check); null for a queue's first unit; and
    ``_last_in_queue``, true for the queue's last unit in that order. The
    shuffle puts the topic first, so the rows come out sorted by topic (the partition column of
    ``consume_queue``) and a write of them needs no sort of its own.

    Args:
        units_df: units of new records (dispatched rows, with at least the queue columns).
        context_df: units already checked (``consume_queue`` columns) that precede or interleave
            the new ones (see :func:`build_queue_context`); None when there are none.
    """
    rows_df = units_df.withColumn("_new", F.lit(True))
    if context_df is not None:
        rows_df = rows_df.unionByName(_as_context_units(context_df, rows_df.schema))
    window = Window.partitionBy(*_QUEUE_PARTITION).orderBy("queue_offset", "commit_log_offset", "_new")
    priors = {f"_prior_{n}": F.lag(c_).over(window)
              for n, c_ in (("offset", "queue_offset"), ("log_offset", "commit_log_offset"), ("new", "_new"))}
    last = F.lead("queue_offset").over(window).isNull()
    return rows_df.repartition(*_QUEUE_PARTITION).withColumns({**priors, "_last_in_queue": last})


def _as_context_units(context_df: DataFrame, schema: StructType) -> DataFrame:
    """Context units in the shape of the new rows: columns they lack are null, ``_new`` false."""
    present = set(context_df.columns)
    columns = [
        F.col(f.name) if f.name in present else F.lit(None).cast(f.dataType).alias(f.name)
        for f in schema.fields if f.name != "_new"
    ]  # fmt: skip
    return context_df.select(*columns, F.lit(False).alias("_new"))


def queue_checks() -> list[Check]:
    """GAP, DUPLICATE_QUEUE_OFFSET and NON_MONOTONIC_OFFSET, on the rows of :func:`with_queue_order`
    that are new or follow a new unit; a queue's first unit must have queue offset 0."""
    offset, log_offset = F.col("queue_offset"), F.col("commit_log_offset")
    prior_offset, prior_log_offset = F.col("_prior_offset"), F.col("_prior_log_offset")
    checked = F.col("_new") | F.coalesce(F.col("_prior_new"), F.lit(False))
    return [
        ("GAP", checked & prior_offset.isNull() & (offset != 0),
         F.format_string("the queue starts at queue offset %d: offsets 0..%d are missing", offset, offset - 1), True),
        ("GAP", checked & (offset > prior_offset + 1),
         F.format_string("queue offsets %d..%d are missing", prior_offset + 1, offset - 1), True),
        ("DUPLICATE_QUEUE_OFFSET", checked & (offset == prior_offset),
         F.format_string("queue offset %d is also held by commit log offset %d", offset, prior_log_offset), True),
        ("NON_MONOTONIC_OFFSET", checked & (offset > prior_offset) & (log_offset <= prior_log_offset),
         F.format_string("commit log offset %d is not above %d, the one of queue offset %d",
                         log_offset, prior_log_offset, prior_offset), True),
    ]  # fmt: skip


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
        .unionByName(build_findings(with_queue_order(filter_dispatched(checked_df), queue_context_df),
                                    queue_checks(), commitlog_version))
        .unionByName(build_continuity_findings(checked_df, segment_sizes_df, commitlog_version, log_context_df))
    )  # fmt: skip


def build_findings(df: DataFrame, checks: list[Check], commitlog_version: int) -> DataFrame:
    """One ``consume_queue_integrity`` row per true check of each row of ``df``."""
    names = ("topic", "queue_id", "queue_offset")
    null_queue = [F.lit(None).cast("string"), F.lit(None).cast("int"), F.lit(None).cast("long")]
    flagged = [
        F.when(condition, F.struct(F.lit(problem).alias("problem"), detail.alias("detail"),
                                   *[(F.col(n) if in_queue else v).alias(n) for n, v in zip(names, null_queue,
                                                                                               strict=True)]))
        for problem, condition, detail, in_queue in checks
    ]  # fmt: skip
    any_flag = F.lit(False)
    for _, condition, _, _ in checks:
        any_flag = any_flag | F.coalesce(condition, F.lit(False))
    return (
        df.where(any_flag)
        .select("broker_name", "commit_log_offset", F.explode(F.array(*flagged)).alias("_finding"))
        .where(F.col("_finding").isNotNull())
        .select("broker_name", "_finding.topic", "_finding.queue_id", "_finding.queue_offset", "commit_log_offset",
                "_finding.problem", "_finding.detail", F.lit(commitlog_version).cast("long").alias("commitlog_version"))
    )  # fmt: skip


def check_counts(checks: list[Check], prefix: str) -> list[Column]:
    """Per check, the number of rows it flags (aggregates named ``<prefix><i>``)."""
    return [_count_of(condition).alias(f"{prefix}{i}") for i, (_, condition, _, _) in enumerate(checks)]


def _count_of(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


# ---------------------------------------------------------------------------------------------
# Continuity of each broker's log
# ---------------------------------------------------------------------------------------------


def build_log_digest(records_df: DataFrame, context_df: DataFrame | None = None) -> DataFrame:
    """A small summary of the records per (broker_name, segment, tags), from one pass without sort.

    Columns: ``broker_name``, ``segment`` (the record's ``segment`` column), ``tags``, ``_first``
    (smallest offset), ``_first_size`` (its store_size), ``_end`` (greatest offset + store_size),
    ``_smallest`` (smallest store_size), ``_sum0``/``_sum1`` (sums of ``h(end) - h(offset)`` for
    two 31-bit halves of xxhash64). :func:`build_untiled_brokers` and :func:`with_tags_code` read it.
    Needs ``broker_name``, ``segment``, ``commit_log_offset``, ``store_size`` and ``tags``;
    context records (without tags) count too. :func:`digest_by_file` gives the same figures per
    data file, and :func:`merge_log_digests` merges them.
    """
    columns = ["broker_name", "segment", "commit_log_offset", "store_size", "tags"]
    marked_df = _marked(records_df, context_df, columns)
    return marked_df.groupBy(*_DIGEST_KEYS).agg(*_digest_aggregates())


def digest_by_file(rows_df: DataFrame) -> DataFrame:
    """:func:`build_log_digest` figures per (``_file``, tags), for :meth:`Lake.read_aggregated_by_file`."""
    return rows_df.groupBy("_file", "tags").agg(*_digest_aggregates())


def merge_log_digests(digest_df: DataFrame) -> DataFrame:
    """Digests of parts of the log (e.g. files) merged per (broker_name, segment, tags)."""
    return digest_df.groupBy(*_DIGEST_KEYS).agg(
        F.min("_first").alias("_first"), F.min_by("_first_size", "_first").alias("_first_size"),
        F.max("_end").alias("_end"), F.min("_smallest").alias("_smallest"), F.sum("_sum0").alias("_sum0"),
        F.sum("_sum1").alias("_sum1"),
    )  # fmt: skip


def _digest_aggregates() -> list[Column]:
    offset, end = F.col("commit_log_offset"), F.col("commit_log_offset") + F.col("store_size")
    return [
        F.min(offset).alias("_first"), F.min_by("store_size", offset).alias("_first_size"), F.max(end).alias("_end"),
        F.min("store_size").alias("_smallest"),
        *[F.sum(_hash_half(end, high) - _hash_half(offset, high)).alias(f"_sum{int(high)}") for high in (False, True)],
    ]  # fmt: skip


def build_untiled_brokers(digest_df: DataFrame, segment_sizes_df: DataFrame) -> DataFrame:
    """``broker_name`` of the brokers whose records might not follow each other exactly.

    From :func:`build_log_digest`, no sort of records. A segment passes when its records lie in
    it (with room for the 8-byte blank), their sizes are positive, and they tile ``[first offset,
    last end)`` exactly: the starts and ends telescope, ``sum(h(end) - h(offset)) == h(last end)
    - h(first offset)`` (a broken segment passes only if 62 bits of hash sums collide, about
    2^-62). Consecutive non-empty segments must then meet as the roll rule says. Brokers listed
    here are checked record by record; the others have no continuity finding.
    """
    sized_df = with_segment_size(merge_log_digests(digest_df.withColumn("tags", F.lit(None).cast("string"))),
                                 segment_sizes_df)  # fmt: skip
    first, last_end = F.col("_first"), F.col("_end")
    segment_end = F.col("segment") + F.col("segment_size")
    inside = (first >= F.col("segment")) & (last_end + c.END_FILE_MIN_BLANK_LENGTH <= segment_end)
    fine = (F.col("_smallest") > 0) & inside
    for high in (False, True):
        fine = fine & (F.col(f"_sum{int(high)}") == _hash_half(last_end, high) - _hash_half(first, high))
    by_segment = Window.partitionBy("broker_name").orderBy("segment")
    next_df = sized_df.withColumns(
        {"_next_first": F.lead(first).over(by_segment), "_next_size": F.lead("_first_size").over(by_segment)}
    )
    next_first, next_size = F.col("_next_first"), F.col("_next_size")
    meets = next_first.isNull() | (next_first == last_end) | (
        (next_first == segment_end) & (last_end + next_size + c.END_FILE_MIN_BLANK_LENGTH > segment_end)
    )
    return next_df.where(~(fine & meets)).select("broker_name").distinct()


def build_continuity_findings(
    records_df: DataFrame,
    segment_sizes_df: DataFrame,
    commitlog_version: int,
    context_df: DataFrame | None = None,
    digest_df: DataFrame | None = None,
    untiled: Sequence[str] | None = None,
) -> DataFrame:
    """SIZE_MISMATCH findings of records whose ``store_size`` does not lead to the broker's next record.

    The next record (by ``commit_log_offset``, within the broker) must start at ``offset +
    store_size``, or at the next segment's base when it did not fit in what this record left of
    its segment (``end + next size + 8 > segment end``); the broker's last record is not checked.
    ``context_df`` holds records already checked (:func:`build_log_context`): one of them is only
    checked when its next record is new. Needs ``broker_name``, ``segment``,
    ``commit_log_offset``, ``store_size`` and ``tags``.

    Only the brokers that :func:`build_untiled_brokers` lists (from ``digest_df``, the
    :func:`build_log_digest` of the same rows, built when not given; or ``untiled``, when the
    caller has that list already) are sorted record by record.
    """
    marked_df = _marked(records_df, context_df, ["broker_name", "commit_log_offset", "store_size"])
    if untiled is not None:
        suspect_df = marked_df.where(F.col("broker_name").isin(*untiled))
    else:
        digest_df = digest_df if digest_df is not None else build_log_digest(records_df, context_df)
        untiled_df = build_untiled_brokers(digest_df, segment_sizes_df)
        suspect_df = marked_df.join(F.broadcast(untiled_df), on="broker_name", how="left_semi")
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
        F.format_string("the next record starts the next segment at %d though %d bytes fitted after the end "
                        "of this one at %d", segment_end, next_size, end),
    ).otherwise(
        F.format_string("the next record starts at %d, not at %d (offset %d + store_size %d)",
                        next_offset, end, offset, size)
    )  # fmt: skip
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
    units_df = consume_queue_df.select(*QUEUE_KEYS, "queue_offset", "commit_log_offset")
    return _context(units_df, entries_df, list(QUEUE_KEYS), ["queue_offset", "commit_log_offset"])


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
    """Options of ``rebuild_consume_queue``: the lake root, a full rebuild or not, the lake engine."""

    lake: Path
    full: bool = False
    engine: str = "auto"


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
        return {"consume_queue": self.entries, "queues": self.queues,
                "consume_queue_integrity": sum(self.findings.values()), **self.findings}  # fmt: skip

    def lines(self) -> list[str]:
        """The summary printed on stdout."""
        counts = [("entries written", self.entries), ("queues", self.queues), ("findings", sum(self.findings.values()))]
        kinds = [(f"  {problem}", self.findings.get(problem, 0)) for problem in PROBLEMS]
        checked = [f"  new rows checked against {self.context}"] if self.context else []
        return [*checked, *[f"  {name:<26}{count:>12}" for name, count in [*counts, *kinds]]]


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
            f"{latest}: it was replaced; delete the consume_queue, consume_queue_integrity and "
            "consume_queue_tails tables and run again"
        )
    if processed is not None and (findings_processed is None or findings_processed < processed):
        return RebuildPlan("full", processed, latest, "the findings are behind the units (a run stopped)")
    if processed is not None and (tails_processed is None or tails_processed < processed):
        return RebuildPlan("full", processed, latest, "the tails are behind the units (a run stopped)")
    if processed is not None and processed >= latest:
        return RebuildPlan("noop", processed, latest, f"commitlog version {latest} is already processed")
    if full or processed is None:
        return RebuildPlan("full", processed, latest, "--full" if full else "first run")
    return RebuildPlan("incremental", processed, latest, f"commitlog versions {processed + 1}..{latest}")


QueueKey = tuple[str, str, int]


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
        greatest ``(queue_offset, commit_log_offset)`` dispatched record. Needs
        :data:`_LOG_TAIL_COLUMNS`, and with ``units`` also ``topic``, ``queue_id``,
        ``queue_offset`` and ``sys_flag``."""
        tails = cls()
        for r in rows.to_pylist():
            record = (r["commit_log_offset"], r["store_size"], r["segment"])
            tails.logs[r["broker_name"]] = max(tails.logs.get(r["broker_name"], record), record)
            dispatched = units and r["sys_flag"] & c.TRANSACTION_ROLLBACK_TYPE in (
                c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE)  # fmt: skip
            if dispatched:
                key, unit = (r["broker_name"], r["topic"], r["queue_id"]), (r["queue_offset"], r["commit_log_offset"])
                tails.queues[key] = max(tails.queues.get(key, unit), unit)
        return tails

    def to_arrow(self, commitlog_version: int) -> pa.Table:
        """The ``consume_queue_tails`` rows of these tails."""
        rows = [
            {"kind": "QUEUE", "broker_name": b, "topic": t, "queue_id": q, "queue_offset": qo, "segment": None,
             "commit_log_offset": clo, "store_size": None, "commitlog_version": commitlog_version}
            for (b, t, q), (qo, clo) in sorted(self.queues.items())
        ] + [
            {"kind": "LOG", "broker_name": b, "topic": None, "queue_id": None, "queue_offset": None,
             "segment": segment, "commit_log_offset": clo, "store_size": size, "commitlog_version": commitlog_version}
            for b, (clo, size, segment) in sorted(self.logs.items())
        ]  # fmt: skip
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


def build_queue_tails(units_df: DataFrame) -> DataFrame:
    """Per queue of ``units_df`` (consume queue units), its last unit in ``(queue_offset,
    commit_log_offset)`` order: the queue key, ``queue_offset``, ``commit_log_offset``."""
    last = F.max(F.struct("queue_offset", "commit_log_offset")).alias("_last")
    return units_df.groupBy(*QUEUE_KEYS).agg(last).select(*QUEUE_KEYS, "_last.queue_offset", "_last.commit_log_offset")


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
    units, findings, tails = (lake.transaction_version(spec, APP_ID)
                              for spec in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS))  # fmt: skip
    plan = plan_run(units, findings, tails, latest, config.full)
    job_run.input_versions = {COMMITLOG.name: plan.target}
    if plan.mode == "noop":
        print(f"{JOB}: nothing to do, {plan.reason} (lake {config.lake})")
        record_run(lake, job_run.finish("NOOP", plan.reason))
        return job_run
    plan, summary = _execute(lake, plan)
    job_run.output_versions = table_versions(lake, [s.name for s in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY,
                                                                     CONSUME_QUEUE_TAILS)])  # fmt: skip
    job_run.row_counts = summary.row_counts()
    print(f"{JOB}: {plan.mode} rebuild ({plan.reason}) up to commitlog version {plan.target} (lake {config.lake})")
    print("\n".join(summary.lines()))
    record_run(lake, job_run.finish("SUCCEEDED", f"{plan.mode} up to commitlog version {plan.target}"))
    return job_run


def _execute(lake: Lake, plan: RebuildPlan) -> tuple[RebuildPlan, RebuildSummary]:
    """Run ``plan``; an incremental plan whose new rows cannot be read alone becomes a full one.
    The tails commit last, with the same application transaction as the units and findings."""
    if plan.mode == "incremental":
        try:
            summary, tails = _incremental(lake, plan)
            lake.overwrite_rows(CONSUME_QUEUE_TAILS, tails.to_arrow(plan.target), APP_ID, plan.target)
            return plan, summary
        except IncrementalReadError as err:
            print(f"{JOB}: cannot read the new commit log rows alone ({err}); rebuilding in full")
            plan = replace(plan, mode="full", reason=str(err))
    checked_df = build_checked_records(lake.read(COMMITLOG, version=plan.target))
    columns = ["commit_log_offset", "store_size", "tags"]
    digest_df = merge_log_digests(lake.read_aggregated_by_file(COMMITLOG, columns, digest_by_file, plan.target))
    summary, last_units = _rebuild(lake, plan, checked_df, digest_df, None, None)
    last_records = lake.read_max_rows(COMMITLOG, "commit_log_offset", "broker_name", _LOG_TAIL_COLUMNS, plan.target)
    tails = Tails(last_units, Tails.of_rows(last_records, units=False).logs)
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


_START_COLUMNS = (*QUEUE_KEYS, "queue_offset", "commit_log_offset", "sys_flag", "store_size", "segment")
_LOG_TAIL_COLUMNS = ("broker_name", "segment", "commit_log_offset", "store_size")


def queue_starts(rows: pa.Table) -> list[QueueStart]:
    """The :class:`QueueStart` of every queue of commit log ``rows`` (:data:`_START_COLUMNS`, an
    Arrow table read on the driver: the new rows of an incremental run are few, and their starts
    decide what the Spark work reads). Units are the dispatched records (:func:`is_dispatched`)."""
    units = pc.if_else(dispatched_mask(rows["sys_flag"]), rows["queue_offset"], pa.scalar(None, pa.int64()))
    keyed = rows.select(list(QUEUE_KEYS)).append_column("first_offset", rows["commit_log_offset"])
    keyed = keyed.append_column("first_unit", units)
    grouped = keyed.group_by(list(QUEUE_KEYS)).aggregate([("first_offset", "min"), ("first_unit", "min")])
    return [QueueStart(r["broker_name"], r["topic"], r["queue_id"], r["first_offset_min"], r["first_unit_min"])
            for r in grouped.to_pylist()]  # fmt: skip


def _incremental(lake: Lake, plan: RebuildPlan) -> tuple[RebuildSummary, Tails]:
    """Read the new rows and the context they are checked against, then rebuild from them.

    The context is the tails when every new row comes after them (the broker appends); else the
    old units and records next to the new ones, read from ``consume_queue`` and the commit log.
    The new rows and the contexts are small (they grow with the new data, not with the log), so
    they are persisted: every check and the units pass reuse them.
    """
    processed = plan.processed if plan.processed is not None else -1
    old_tails = tails = Tails.from_arrow(lake.read_rows(CONSUME_QUEUE_TAILS))
    persisted: list[DataFrame] = []

    def kept(df: DataFrame) -> DataFrame:
        persisted.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return persisted[-1]

    try:
        new_rows = lake.read_appended_rows(COMMITLOG, _START_COLUMNS, processed, plan.target)
        starts = queue_starts(new_rows)
        tails = tails.merged(Tails.of_rows(new_rows))
        checked_df = kept(build_checked_records(lake.read_appended(COMMITLOG, processed, plan.target)))
        if not starts:  # e.g. only compaction commits: nothing to check, the versions are still read
            empty_df = lake.spark.createDataFrame([], spark_schema(CONSUME_QUEUE))
            lake.append(CONSUME_QUEUE, empty_df, APP_ID, plan.target)
            return _write_findings(lake, plan, None, {}), tails
        if old_tails.precede(starts):
            context = "the tails of their queues and brokers (consume_queue_tails)"
            queue_context_df, log_context_df = old_tails.contexts(lake.spark, starts)
        else:
            context = "the old units and records from the one before them on (they do not all follow the tails)"
            queue_context_df, log_context_df = _read_contexts(lake, starts, checked_df, processed, kept)
        digest_df = build_log_digest(checked_df, log_context_df)
        summary, _ = _rebuild(lake, plan, checked_df, digest_df, queue_context_df, log_context_df)
        return replace(summary, context=context), tails
    finally:
        for df in persisted:
            df.unpersist()


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
    found = {(r["broker_name"], r["topic"], r["queue_id"]) for r in units_df.where(
        _at_offset(queues, "before")).select(*QUEUE_KEYS).distinct().collect()}  # fmt: skip
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
            _at_offset([q for q in queues if q.topic == topic], part))
        for topic in topics
    ]  # fmt: skip
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
    digest_df: DataFrame,
    queue_context_df: DataFrame | None,
    log_context_df: DataFrame | None,
) -> tuple[RebuildSummary, dict[QueueKey, tuple[int, int]]]:
    """Write the units of ``checked_df`` while counting problems, then the findings; the last
    ``(queue_offset, commit_log_offset)`` unit of each queue of the new rows and their contexts
    (the queue tails of a full run; an incremental run has them from its driver rows already).

    ``digest_df`` (:func:`build_log_digest` of the same records and the log context) is computed
    once, by a narrow pass: it gives the distinct tags and the continuity check. The units pass
    reads the records with their bodies, counts record problems, shuffles the units by queue,
    counts queue problems, collects the last unit of each queue and writes the units. The
    findings are the continuity findings, plus the record and queue findings, recomputed only
    when the units pass counted one.
    """
    sizes_df = _segment_sizes(lake)
    digest_df = digest_df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        units_df, observations = _observed_units(checked_df, sizes_df, digest_df, queue_context_df)
        write = lake.overwrite if plan.mode == "full" else lake.append
        written = write(CONSUME_QUEUE, units_df, APP_ID, plan.target)
        counts = {k: v for o in observations for k, v in o.get.items()} if written is not None else None
        if counts is not None:
            last_units = [(r["broker_name"], r["topic"], r["queue_id"], r["queue_offset"], r["commit_log_offset"])
                          for r in counts.pop("tails")]  # fmt: skip
        else:  # a full run whose units were committed by a run that stopped: the table has them
            last_units = [tuple(r) for r in build_queue_tails(lake.read(CONSUME_QUEUE)).collect()]
        queue_tails = {(b, t, q): (qo, clo) for b, t, q, qo, clo in last_units}
        untiled = [r["broker_name"] for r in build_untiled_brokers(digest_df, sizes_df).collect()]
        problems = counts is None or any(v for k, v in counts.items() if k.startswith("check"))
        if not untiled and not problems:  # every log tiles and no check counted a problem: no finding
            return _write_findings(lake, plan, None, counts), queue_tails
        findings_df = build_continuity_findings(checked_df, sizes_df, plan.target, log_context_df, untiled=untiled)
        if problems:
            sized_df = with_segment_size(checked_df, sizes_df)
            ordered_df = with_queue_order(filter_dispatched(checked_df), queue_context_df)
            findings_df = findings_df.unionByName(build_findings(sized_df, record_checks(), plan.target)).unionByName(
                build_findings(ordered_df, queue_checks(), plan.target)
            )  # fmt: skip
        return _write_findings(lake, plan, findings_df, counts), queue_tails
    finally:
        digest_df.unpersist()


def _observed_units(
    checked_df: DataFrame, sizes_df: DataFrame, digest_df: DataFrame, queue_context_df: DataFrame | None
) -> tuple[DataFrame, list[Observation]]:
    """The units to write, observed: record problems counted before the shuffle, queue problems
    and the last unit of each queue (``tails``) after it; the units' tags codes come from the
    digest's tags."""
    records = Observation(f"{JOB}-records")
    sized_df = with_segment_size(checked_df, sizes_df).observe(records, *check_counts(record_checks(), "check_r"))
    unit_columns = [n for n in CONSUME_QUEUE.column_names if n != "tags_code"] + ["tags", "delay_level", "sys_flag"]
    ordered_df = with_queue_order(filter_dispatched(sized_df).select(*unit_columns), queue_context_df)
    queues = Observation(f"{JOB}-queues")
    first_unit = F.col("_new") & ~F.coalesce(F.col("_prior_new"), F.lit(False))
    observed_df = ordered_df.observe(
        queues, *check_counts(queue_checks(), "check_q"), _count_of(F.col("_new")).alias("units"),
        _count_of(first_unit).alias("queues"),
        F.collect_list(F.when(F.col("_last_in_queue"), F.struct(*QUEUE_KEYS, "queue_offset", "commit_log_offset")))
        .alias("tails"),
    )  # fmt: skip
    units_df = observed_df.where(F.col("_new")).transform(lambda df: with_tags_code(df, digest_df))
    return select_consume_queue(units_df), [records, queues]


def _segment_sizes(lake: Lake) -> DataFrame:
    """The segment size of every broker of the lake (none when the lake has no ``brokers`` table)."""
    if lake.exists(BROKERS):
        return build_segment_sizes(lake.read(BROKERS))
    return lake.spark.createDataFrame([], "broker_name string, segment_size long")


def _write_findings(
    lake: Lake, plan: RebuildPlan, findings_df: DataFrame | None, counts: dict[str, int] | None
) -> RebuildSummary:
    """Commit the findings (None: there are none) with the application transaction
    ``plan.target``; the run's summary."""
    write = lake.overwrite if plan.mode == "full" else lake.append
    if findings_df is None:
        kinds: dict[str, int] = {}
        write(CONSUME_QUEUE_INTEGRITY, lake.spark.createDataFrame([], spark_schema(CONSUME_QUEUE_INTEGRITY)),
              APP_ID, plan.target)  # fmt: skip
    else:
        findings_df = findings_df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            kinds = {r["problem"]: r["count"] for r in findings_df.groupBy("problem").count().collect()}
            write(CONSUME_QUEUE_INTEGRITY, findings_df, APP_ID, plan.target)
        finally:
            findings_df.unpersist()
    counts = counts or {}
    return RebuildSummary(entries=counts.get("units", 0), queues=counts.get("queues", 0), findings=kinds)


def build_parser() -> argparse.ArgumentParser:
    """Options of ``rebuild_consume_queue``."""
    parser = argparse.ArgumentParser(prog=JOB, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    parser.add_argument("--full", action="store_true",
                        help="rebuild both tables from the whole commit log instead of its new versions")  # fmt: skip
    parser.add_argument("--engine", choices=["auto", "bridge", "delta-spark"], default="auto",
                        help="lake engine (auto: delta-spark when its classes load, else the bridge)")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv``, build the session, run."""
    args = build_parser().parse_args(argv)
    config = RebuildConfig(Path(args.lake), args.full, args.engine)
    spark = build_session("rmq-rebuild-consume-queue", engine=config.engine)
    job_run = run(spark, config)
    print(f"{JOB} {job_run.status} in {job_run.duration_ms} ms (run {job_run.run_id})")
    return 0
