"""The consume queue and its integrity as DataFrame transforms: the consume-queue rows of commit log
records (the broker's dispatch rule and tags code), the checks of records and queues, and the
findings of the integrity report. See docs/jobs.md (rebuild_consume_queue).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from broker_model.common import QUEUE_KEY
from broker_model.common import constants as c
from broker_model.common.codec import java_string_hash as java_string_hash_of
from broker_model.store import FIXED_RECORD_LENGTH, IPV6_HOST_EXTRA
from jobs.rules import consume_queue_tags_code, delay_level, is_dispatched, java_string_hash
from schemas.catalog import (
    CONSUME_QUEUE,
)

PROBLEMS = (
    "GAP",
    "DUPLICATE_QUEUE_OFFSET",
    "NON_MONOTONIC_OFFSET",
    "CRC_MISMATCH",
    "SIZE_MISMATCH",
    "BEYOND_SEGMENT",
)


# consume-queue rows are shuffled by queue with the topic first: they then come out sorted by topic, the
# partition column of consume_queue, and the write needs no sort of its own
QUEUE_PARTITION = ("topic", "broker_name", "queue_id")


RECORD_PLACE_COLUMNS = (
    "broker_name",
    "segment",
    "topic",
    "queue_id",
    "queue_offset",
    "commit_log_offset",
    "store_size",
)
"""Where a record is: its broker and segment, its queue position and its byte range."""

CHECKED_COLUMNS = (
    *RECORD_PLACE_COLUMNS,
    "magic_code",
    "body_crc",
    "sys_flag",
    "store_timestamp",
    "tags",
    "delay_level",
    "computed_body_crc",
    "computed_store_size",
)


Check = tuple[str, Column, Column, bool]  # problem, condition, detail, whether the finding names a queue row


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


def with_literal_tags_code(records_df: DataFrame, tags: Iterable[str | None]) -> DataFrame:
    """:func:`with_tags_code` for records whose distinct ``tags`` are known and few: each value's
    Java hash is computed on the driver (:func:`~broker_model.common.codec.java_string_hash`) and
    chosen by a literal expression, with no join; a tags value not among ``tags`` gets code 0."""
    tags_hash = F.lit(None).cast("long")
    for value in sorted(t for t in set(tags) if t):
        tags_hash = F.when(F.col("tags") == value, F.lit(java_string_hash_of(value)).cast("long")).otherwise(tags_hash)
    tags_code = consume_queue_tags_code(tags_hash, F.col("delay_level"), F.col("store_timestamp"))
    return records_df.withColumn("tags_code", tags_code)


def filter_dispatched(records_df: DataFrame) -> DataFrame:
    """The records that get a consume-queue row (transaction type NOT or COMMIT); needs ``sys_flag``."""
    return records_df.where(is_dispatched(F.col("sys_flag")))


def select_consume_queue(coded_df: DataFrame) -> DataFrame:
    """The consume-queue rows of records that already carry ``tags_code`` (see :func:`with_tags_code`)."""
    return coded_df.transform(filter_dispatched).select(*CONSUME_QUEUE.column_names)


def build_consume_queue(commitlog_df: DataFrame) -> DataFrame:
    """The consume-queue rows of ``commitlog_df``, as the broker dispatches them.

    One consume-queue row per record whose transaction type is NOT or COMMIT, whatever else is wrong with it
    (the integrity report tells); columns exactly ``consume_queue``'s. Needs the commit log columns
    ``broker_name``, ``topic``, ``queue_id``, ``queue_offset``, ``commit_log_offset``,
    ``store_size``, ``sys_flag``, ``tags``, ``raw_properties`` and ``store_timestamp``.
    Deterministic: the same rows give the same consume-queue rows.
    """
    return commitlog_df.transform(with_delay_level).transform(with_tags_code).transform(select_consume_queue)


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
            F.when(sys_flag.bitwiseAND(bit) != 0, IPV6_HOST_EXTRA).otherwise(0)
            for bit in (c.BORNHOST_V6_FLAG, c.STOREHOSTADDRESS_V6_FLAG)
        ),
        F.lit(0),
    )
    topic_length_bytes = F.when(magic == c.MAGIC_CODE_V1, 0).when(magic == c.MAGIC_CODE_V2, 1)
    variable = F.length("body") + F.octet_length("topic") + F.length("raw_properties")
    size = F.lit(FIXED_RECORD_LENGTH).cast("long") + variable.cast("long") + ipv6_bytes + topic_length_bytes
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


def segment_size_of(sizes: Mapping[str, int]) -> Column:
    """The segment size (bytes) of each row's broker, a literal choice over ``broker_name`` from
    ``sizes`` (broker -> size, as :func:`build_segment_sizes` gives it); RocketMQ's default 1 GiB
    for a broker missing from it. For a few brokers: no join, nothing to broadcast."""
    size = F.lit(c.DEFAULT_SEGMENT_SIZE).cast("long")
    for broker, segment_size in sorted(sizes.items()):
        size = F.when(F.col("broker_name") == broker, F.lit(segment_size).cast("long")).otherwise(size)
    return size


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


def with_queue_order(cq_rows_df: DataFrame, context_df: DataFrame | None = None) -> DataFrame:
    """The new consume-queue rows ``cq_rows_df`` and the context rows, shuffled by queue, each with the row
    before it.

    Adds ``_new`` (false for context consume-queue rows) and ``_prior_offset``, ``_prior_log_offset``,
    ``_prior_new``: the queue offset, commit log offset and ``_new`` of the consume-queue row before in the
    queue, ordered by ``(queue_offset, commit_log_offset, _new)`` (consume-queue rows equal on all three are
    the same record twice, interchangeable for every check); null for a queue's first consume-queue row.

    Args:
        units_df: consume-queue rows of new records (dispatched rows, with at least the queue columns).
        context_df: consume-queue rows already checked (``consume_queue`` columns) that precede or interleave
            the new ones (see :func:`build_queue_context`); None when there are none.
    """
    rows_df = cq_rows_df.withColumn("_new", F.lit(True))
    if context_df is not None:
        rows_df = rows_df.unionByName(_as_context_cq_rows(context_df, rows_df.schema))
    window = Window.partitionBy(*QUEUE_PARTITION).orderBy("queue_offset", "commit_log_offset", "_new")
    priors = {
        f"_prior_{n}": F.lag(c_).over(window)
        for n, c_ in (("offset", "queue_offset"), ("log_offset", "commit_log_offset"), ("new", "_new"))
    }
    return rows_df.repartition(*QUEUE_PARTITION).withColumns(priors)


def _as_context_cq_rows(context_df: DataFrame, schema: StructType) -> DataFrame:
    """Context consume-queue rows in the shape of the new rows: columns they lack are null, ``_new`` false."""
    present = set(context_df.columns)
    columns = [
        F.col(f.name) if f.name in present else F.lit(None).cast(f.dataType).alias(f.name)
        for f in schema.fields
        if f.name != "_new"
    ]
    return context_df.select(*columns, F.lit(False).alias("_new"))


def queue_checks() -> list[Check]:
    """GAP, DUPLICATE_QUEUE_OFFSET and NON_MONOTONIC_OFFSET, on the rows of :func:`with_queue_order`
    that are new or follow a new consume-queue row; a queue's first consume-queue row must have queue offset 0."""
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
        queue_context_df: consume-queue rows already checked (see :func:`with_queue_order`); None for a full check.
        log_context_df: records already checked (see :func:`build_continuity_findings`); None for
            a full check.

    Returns:
        One row per finding; a record or consume-queue row with several problems has several rows. A finding
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
    next_commit_log_offset, next_size = F.col("_next_commit_log_offset"), F.col("_next_store_size")
    segment_end = offset - offset % F.col("segment_size") + F.col("segment_size")
    end = offset + size
    rolled = (next_commit_log_offset == segment_end) & (end + next_size + c.END_FILE_MIN_BLANK_LENGTH > segment_end)
    bad = (F.col("_new") | F.col("_next__new")) & ~((next_commit_log_offset == end) | rolled)
    detail = F.when(
        next_commit_log_offset == segment_end,
        F.format_string(
            "the next record starts the next segment at %d though %d bytes fitted after the end of this one at %d",
            segment_end,
            next_size,
            end,
        ),
    ).otherwise(
        F.format_string(
            "the next record starts at %d, not at %d (offset %d + store_size %d)",
            next_commit_log_offset,
            end,
            offset,
            size,
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


def build_queue_context(consume_queue_df: DataFrame, cq_rows_df: DataFrame) -> DataFrame:
    """The consume-queue rows of ``consume_queue_df`` the queue checks of the new rows ``cq_rows_df`` need.

    Per queue of ``cq_rows_df``: the consume-queue row just before its first new consume-queue row in
    ``(queue_offset, commit_log_offset)`` order, and every consume-queue row from there on (none after it when
    the new consume-queue rows only append). Columns: broker_name, topic, queue_id, queue_offset, commit_log_offset.
    """
    old_df = consume_queue_df.select(*QUEUE_KEY, "queue_offset", "commit_log_offset")
    return _context(old_df, cq_rows_df, list(QUEUE_KEY), ["queue_offset", "commit_log_offset"])


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
