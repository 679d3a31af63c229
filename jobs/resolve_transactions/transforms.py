"""Transaction state as DataFrame transforms: the half, op, final and discard records of the commit
log, joined into one state per transaction as of T, with the anomalies. See docs/jobs.md
(resolve_transactions) and docs/rocketmq.md (transactions).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from broker_model.broker import FILE_RESERVED_MS, REMOVE_TAG, TRANSACTION_CHECK_MAX, TRANSACTION_TIMEOUT_MS
from broker_model.common import constants as c
from schemas.catalog import TRANSACTION_RECORDS, TRANSACTION_STATE

HALF, OP, FINAL, DISCARD = "HALF", "OP", "FINAL", "DISCARD"  # transaction_records kinds

OFFSET_SEPARATOR = ","  # 5.1+ op bodies list several half queue offsets
UNKNOWN_OFFSET = -1  # an offset the log does not give (op without half, listed offset not a number)
NO_IMMUNITY = -1  # getLong's "not a number": CHECK_IMMUNITY_TIME_IN_SECONDS then falls back to the timeout

COMMITTED, ROLLED_BACK, DISCARDED, EXPIRED, PENDING, CHECK_DUE = (
    "COMMITTED",
    "ROLLED_BACK",
    "DISCARDED",
    "EXPIRED",
    "PENDING",
    "CHECK_DUE",
)
STATES = (COMMITTED, ROLLED_BACK, DISCARDED, EXPIRED, PENDING, CHECK_DUE)  # precedence order
OP_WITHOUT_HALF, FINAL_WITHOUT_OP, DOUBLE_COMMIT, OP_ON_REPUT_COPY, DUPLICATE_HALF = (
    "OP_WITHOUT_HALF",
    "FINAL_WITHOUT_OP",
    "DOUBLE_COMMIT",
    "OP_ON_REPUT_COPY",
    "DUPLICATE_HALF",
)
ANOMALIES = (OP_WITHOUT_HALF, FINAL_WITHOUT_OP, DOUBLE_COMMIT, OP_ON_REPUT_COPY, DUPLICATE_HALF)  # fixed order

TRANSACTION_KEY = ("broker_name", "half_commit_log_offset")
RECORD_FACTS = ("broker_name", "queue_id", "queue_offset", "commit_log_offset", "born_timestamp", "store_timestamp")
"""The columns a transaction record copies from its commit log record as they are."""
HALF_COLUMNS = (
    *RECORD_FACTS,
    "producer_group",
    "uniq_key",
    "real_topic",
    "real_queue_id",
    "check_times",
    "prepared_queue_offset",
    "has_check_immunity",
    "check_immunity_ms",
)
OP_COLUMNS = (
    "broker_name",
    "queue_id",
    "op_queue_offset",
    "op_commit_log_offset",
    "store_timestamp",
    "removes",
    "half_queue_offset",
)
FINAL_COLUMNS = (
    "broker_name",
    "final_commit_log_offset",
    "prepared_transaction_offset",
    "topic",
    "queue_id",
    "store_timestamp",
    "producer_group",
    "uniq_key",
)
DISCARD_COLUMNS = (
    "broker_name",
    "discard_commit_log_offset",
    "store_timestamp",
    "producer_group",
    "uniq_key",
    "check_times",
)
# what a transaction row takes from its original half record
ORIGINAL_COLUMNS = (
    *TRANSACTION_KEY,
    "queue_offset",
    "producer_group",
    "uniq_key",
    "real_topic",
    "real_queue_id",
    "born_timestamp",
    "has_check_immunity",
    "check_immunity_ms",
)
# the commit log columns build_transaction_records reads
TRANSACTION_SOURCE_COLUMNS = (
    "broker_name",
    "queue_id",
    "queue_offset",
    "commit_log_offset",
    "sys_flag",
    "born_timestamp",
    "store_timestamp",
    "prepared_transaction_offset",
    "body",
    "topic",
    "properties",
    "tags",
    "uniq_key",
)


# ---------------------------------------------------------------------------------------------
# Record kinds
# ---------------------------------------------------------------------------------------------


def transaction_type(sys_flag: Column) -> Column:
    """``sys_flag & 12``: MessageSysFlag's transaction type (0 NOT, 4 PREPARED, 8 COMMIT, 12 ROLLBACK)."""
    return sys_flag.bitwiseAND(F.lit(c.TRANSACTION_ROLLBACK_TYPE))


def is_half_record() -> Column:
    """A record of the half topic with transaction type NOT (the broker resets it on the half)."""
    is_half_topic = F.col("topic") == F.lit(c.RMQ_SYS_TRANS_HALF_TOPIC)
    return is_half_topic & (transaction_type(F.col("sys_flag")) == F.lit(c.TRANSACTION_NOT_TYPE))


def is_op_record() -> Column:
    """A record of the op topic, whatever its tag."""
    return F.col("topic") == F.lit(c.RMQ_SYS_TRANS_OP_HALF_TOPIC)


def is_final_record() -> Column:
    """A record with transaction type COMMIT outside the retry, dead letter, schedule and timer topics: the
    message an end transaction wrote to the real topic. (A send-back copies the sys flag, so the
    retries and the dead letter of a committed message keep the COMMIT type.)"""
    topic = F.col("topic")
    copied = (
        topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX)
        | topic.startswith(c.DLQ_GROUP_TOPIC_PREFIX)
        | (topic == F.lit(c.SCHEDULE_TOPIC))
        | (topic == F.lit(c.TIMER_TOPIC))
    )
    return (transaction_type(F.col("sys_flag")) == F.lit(c.TRANSACTION_COMMIT_TYPE)) & ~copied


def is_discard_record() -> Column:
    """A record of the discard topic (``TRANS_CHECK_MAX_TIME_TOPIC``)."""
    return F.col("topic") == F.lit(c.TRANS_CHECK_MAX_TIME_TOPIC)


def removes() -> Column:
    """Whether an op record ends halves: its tag is ``d`` (false when the tag is absent)."""
    return F.coalesce(F.col("tags") == F.lit(REMOVE_TAG), F.lit(False))


def _property(name: str) -> Column:
    """The property ``name`` of the record, null when absent."""
    return F.try_element_at(F.col("properties"), F.lit(name))


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------


def build_transaction_records(commitlog_df: DataFrame) -> DataFrame:
    """The ``transaction_records`` rows of commit log rows: their transaction records, decoded.

    One pass, no shuffle. ``kind`` is the first that applies of HALF (:func:`is_half_record`),
    OP, DISCARD, FINAL; other records give no row. Op records give one row per half queue offset
    their UTF-8 body lists, split on ``,`` (``"7"`` and ``"5,6,9,"`` both work; empty entries are
    dropped; an entry that is not a number gives -1; no entry gives one row with a null
    ``half_queue_offset``: the op ends nothing, as in RocketMQ). Properties are decoded per kind
    (``producer_group`` PGROUP; HALF: ``real_topic`` REAL_TOPIC, ``real_queue_id`` REAL_QID,
    ``check_times`` TRANSACTION_CHECK_TIMES (null on an original), ``prepared_queue_offset``
    TRAN_PREPARED_QUEUE_OFFSET, ``has_check_immunity`` and ``check_immunity_ms`` from
    CHECK_IMMUNITY_TIME_IN_SECONDS * 1000, null when not a number, -1 or overflowing; DISCARD:
    ``check_times``); a number that does not parse is null, never an error. Columns of another
    kind are null.

    Args:
        commitlog_df: commit log rows (at least :data:`TRANSACTION_SOURCE_COLUMNS`).

    Returns:
        Exactly the catalog columns of ``transaction_records``.
    """
    kind = (
        F.when(is_half_record(), F.lit(HALF))
        .when(is_op_record(), F.lit(OP))
        .when(is_discard_record(), F.lit(DISCARD))
        .when(is_final_record(), F.lit(FINAL))
    )
    immunity_seconds = _property(c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS).try_cast("long")
    immunity_ms = F.when(immunity_seconds != F.lit(NO_IMMUNITY), F.try_multiply(immunity_seconds, F.lit(1000)))
    listed = F.filter(F.split(F.col("body").cast("string"), OFFSET_SEPARATOR), lambda e: e != F.lit(""))
    is_half, is_op, is_final = (F.col("kind") == F.lit(k) for k in (HALF, OP, FINAL))
    has_check_times = is_half | (F.col("kind") == F.lit(DISCARD))
    listed_offset = F.col("listed_offset")
    kinded_df = commitlog_df.select(*TRANSACTION_SOURCE_COLUMNS, kind.alias("kind")).where(F.col("kind").isNotNull())
    return (
        kinded_df.select("*", F.explode_outer(F.when(is_op, listed)).alias("listed_offset"))
        .select(
            "kind",
            *RECORD_FACTS,
            "topic",
            _property(c.PROPERTY_PRODUCER_GROUP).alias("producer_group"),
            "uniq_key",
            F.when(is_half, _property(c.PROPERTY_REAL_TOPIC)).alias("real_topic"),
            F.when(is_half, _property(c.PROPERTY_REAL_QUEUE_ID).try_cast("int")).alias("real_queue_id"),
            F.when(has_check_times, _property(c.PROPERTY_TRANSACTION_CHECK_TIMES).try_cast("int")).alias("check_times"),
            F.when(is_half, _property(c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET).try_cast("long")).alias(
                "prepared_queue_offset"
            ),
            F.when(is_half, _property(c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS).isNotNull()).alias(
                "has_check_immunity"
            ),
            F.when(is_half, immunity_ms).cast("long").alias("check_immunity_ms"),
            F.when(is_op, removes()).alias("removes"),
            F.when(listed_offset.isNotNull(), F.coalesce(listed_offset.try_cast("long"), F.lit(UNKNOWN_OFFSET)))
            .cast("long")
            .alias("half_queue_offset"),
            F.when(is_final, F.col("prepared_transaction_offset")).alias("prepared_transaction_offset"),
        )
        .select(*TRANSACTION_RECORDS.column_names)
    )


def _of_kind(records_df: DataFrame, kind: str, columns: Sequence[str | Column]) -> DataFrame:
    return records_df.where(F.col("kind") == F.lit(kind)).select(*columns)


def halves_of(records_df: DataFrame) -> DataFrame:
    """The half records of ``transaction_records`` rows, as :func:`build_half_records` gives them."""
    return _of_kind(records_df, HALF, HALF_COLUMNS)


def ops_of(records_df: DataFrame) -> DataFrame:
    """The op rows of ``transaction_records`` rows, as :func:`build_ops` gives them."""
    op_offsets = [
        F.col("queue_offset").alias("op_queue_offset"),
        F.col("commit_log_offset").alias("op_commit_log_offset"),
    ]
    return _of_kind(records_df, OP, ["broker_name", "queue_id", *op_offsets, *OP_COLUMNS[4:]])


def finals_of(records_df: DataFrame) -> DataFrame:
    """The final records of ``transaction_records`` rows, as :func:`build_finals` gives them."""
    offset = F.col("commit_log_offset").alias("final_commit_log_offset")
    return _of_kind(records_df, FINAL, ["broker_name", offset, *FINAL_COLUMNS[2:]])


def discards_of(records_df: DataFrame) -> DataFrame:
    """The discard records of ``transaction_records`` rows, as :func:`build_discards` gives them."""
    offset = F.col("commit_log_offset").alias("discard_commit_log_offset")
    return _of_kind(records_df, DISCARD, ["broker_name", offset, *DISCARD_COLUMNS[2:]])


def build_half_records(commitlog_df: DataFrame) -> DataFrame:
    """The half records (originals and re-put copies) of commit log rows, properties decoded.

    Returns:
        :data:`HALF_COLUMNS`, one row per record of ``RMQ_SYS_TRANS_HALF_TOPIC`` with transaction
        type NOT, decoded as :func:`build_transaction_records` says.
    """
    return halves_of(build_transaction_records(commitlog_df))


def build_ops(commitlog_df: DataFrame) -> DataFrame:
    """The op records of commit log rows, one row per half queue offset their body lists.

    Returns:
        :data:`OP_COLUMNS`: ``op_queue_offset`` and ``op_commit_log_offset`` place the op record,
        ``removes`` is whether its tag is ``d`` (other ops are kept so they can be counted, and
        ignored by :func:`build_transaction_state`), ``half_queue_offset`` as
        :func:`build_transaction_records` says.
    """
    return ops_of(build_transaction_records(commitlog_df))


def build_finals(commitlog_df: DataFrame) -> DataFrame:
    """The final (committed) records: transaction type COMMIT, in their real topic.

    Returns:
        :data:`FINAL_COLUMNS`; ``final_commit_log_offset`` is the record's own commit log offset,
        ``prepared_transaction_offset`` the commit log offset of the half record it ended.
    """
    return finals_of(build_transaction_records(commitlog_df))


def build_discards(commitlog_df: DataFrame) -> DataFrame:
    """The discard records: copies of half messages in ``TRANS_CHECK_MAX_TIME_TOPIC``.

    Returns:
        :data:`DISCARD_COLUMNS`; ``check_times`` is the copy's TRANSACTION_CHECK_TIMES (int, null
        when absent or not a number).
    """
    return discards_of(build_transaction_records(commitlog_df))


def build_transaction_state(
    half_df: DataFrame,
    ops_df: DataFrame,
    finals_df: DataFrame,
    discards_df: DataFrame,
    as_of: int,
    timeout_ms: int = TRANSACTION_TIMEOUT_MS,
    check_max: int = TRANSACTION_CHECK_MAX,
    reserve_ms: int = FILE_RESERVED_MS,
) -> DataFrame:
    """The ``transaction_state`` table as of ``as_of``: one row per transaction.

    Args:
        half_df, ops_df, finals_df, discards_df: :func:`build_half_records`, :func:`build_ops`,
            :func:`build_finals`, :func:`build_discards` (any time range; records stored after
            ``as_of`` are ignored).
        as_of: epoch milliseconds, written to every row.
        timeout_ms, check_max, reserve_ms: the broker's check settings.

    Returns:
        Exactly the catalog columns of ``transaction_state``: one row per (``broker_name``,
        original half record), plus one row per (``broker_name``, half queue offset) of ops
        without half; states, precedence and anomalies as docs/jobs.md (resolve_transactions,
        "States" and "Anomalies") gives them.
        ``check_times`` is the highest TRANSACTION_CHECK_TIMES of the transaction's half records
        (0 without copies); ``op_queue_offset`` the smallest op record queue offset that ends the
        transaction; ``final_commit_log_offset`` the smallest final record's commit log offset.

    Determinism: every figure is a min, max or count over a group, so the output is a function of
    the input rows alone.
    """
    halves_df = half_df.where(F.col("store_timestamp") <= F.lit(as_of)).transform(with_half_commit_log_offset)
    removing_ops_df = ops_df.where(
        (F.col("store_timestamp") <= F.lit(as_of)) & F.col("removes") & F.col("half_queue_offset").isNotNull()
    )
    originals_df = halves_df.where(~F.col("is_copy")).select(*ORIGINAL_COLUMNS)
    resolved_df = (
        originals_df.join(_copies_summary(halves_df), on=list(TRANSACTION_KEY), how="left")
        .join(_first_ops(halves_df, removing_ops_df), on=list(TRANSACTION_KEY), how="left")
        .join(_finals_summary(halves_df, finals_df, as_of), on=list(TRANSACTION_KEY), how="left")
        .join(_discarded(originals_df, discards_df, as_of), on=list(TRANSACTION_KEY), how="left")
    )
    states_df = resolved_df.select(
        "broker_name",
        "producer_group",
        "uniq_key",
        F.col("queue_offset").alias("half_queue_offset"),
        "half_commit_log_offset",
        "real_topic",
        "real_queue_id",
        _state(as_of, timeout_ms, check_max, reserve_ms).alias("state"),
        "check_times",
        "op_queue_offset",
        "final_commit_log_offset",
        "born_timestamp",
        F.lit(as_of).cast("long").alias("as_of"),
        _anomaly().alias("anomaly"),
    )
    return states_df.unionByName(_ops_without_half(halves_df, removing_ops_df, as_of)).select(
        *TRANSACTION_STATE.column_names
    )


def with_half_commit_log_offset(halves_df: DataFrame) -> DataFrame:
    """Add ``half_commit_log_offset`` (the original's commit log offset) and ``is_copy`` to half records.

    The original of a transaction (``broker_name``, ``producer_group``, ``uniq_key``) is its
    record with the smallest commit log offset; a record without ``uniq_key`` is its own original.
    """
    alone = F.when(F.col("uniq_key").isNull(), F.col("commit_log_offset")).alias("alone")
    transaction = Window.partitionBy("broker_name", "producer_group", "uniq_key", "alone")
    original = F.min("commit_log_offset").over(transaction)
    return (
        halves_df.select("*", alone)
        .withColumn("half_commit_log_offset", original)
        .withColumn("is_copy", F.col("commit_log_offset") != F.col("half_commit_log_offset"))
        .drop("alone")
    )


def _copies_summary(halves_df: DataFrame) -> DataFrame:
    """Per transaction: ``check_times`` (highest, 0 without copies) and ``has_duplicate``."""
    duplicate = F.col("is_copy") & F.col("check_times").isNull() & F.col("prepared_queue_offset").isNull()
    return halves_df.groupBy(*TRANSACTION_KEY).agg(
        F.coalesce(F.max("check_times"), F.lit(0)).alias("check_times"),
        F.max(duplicate).alias("has_duplicate"),
    )


def _members(halves_df: DataFrame) -> DataFrame:
    """Every half record as a member of its transaction, keyed by its queue position."""
    return halves_df.select(
        "broker_name",
        "queue_id",
        F.col("queue_offset").alias("half_queue_offset"),
        "half_commit_log_offset",
        "is_copy",
    )


def _first_ops(halves_df: DataFrame, removing_ops_df: DataFrame) -> DataFrame:
    """Per transaction ended by an op: ``op_queue_offset`` of the first op, ``op_on_copy``."""
    first = F.min(F.struct("op_queue_offset", "is_copy"))
    return (
        removing_ops_df.join(_members(halves_df), on=["broker_name", "queue_id", "half_queue_offset"], how="inner")
        .groupBy(*TRANSACTION_KEY)
        .agg(first.alias("op"))
        .select(*TRANSACTION_KEY, "op.op_queue_offset", F.col("op.is_copy").alias("op_on_copy"))
    )


def _finals_summary(halves_df: DataFrame, finals_df: DataFrame, as_of: int) -> DataFrame:
    """Per transaction with final records: the first one's offset and ``final_count``."""
    ended_df = halves_df.select(
        "broker_name", F.col("commit_log_offset").alias("prepared_transaction_offset"), "half_commit_log_offset"
    )
    return (
        finals_df.where(F.col("store_timestamp") <= F.lit(as_of))
        .join(ended_df, on=["broker_name", "prepared_transaction_offset"], how="inner")
        .groupBy(*TRANSACTION_KEY)
        .agg(F.min("final_commit_log_offset").alias("final_commit_log_offset"), F.count("*").alias("final_count"))
    )


def _discarded(originals_df: DataFrame, discards_df: DataFrame, as_of: int) -> DataFrame:
    """The transactions with a discard record (same broker, producer group and uniq key)."""
    keys_df = originals_df.select("broker_name", "producer_group", "uniq_key", "half_commit_log_offset")
    return (
        discards_df.where(F.col("store_timestamp") <= F.lit(as_of))
        .join(keys_df, on=["broker_name", "producer_group", "uniq_key"], how="inner")
        .select(*TRANSACTION_KEY)
        .distinct()
        .select(*TRANSACTION_KEY, F.lit(True).alias("has_discard"))
    )


def _ops_without_half(halves_df: DataFrame, removing_ops_df: DataFrame, as_of: int) -> DataFrame:
    """One ROLLED_BACK row per (broker, half queue offset) that ops name and no half record has."""
    members_df = _members(halves_df)
    orphans_df = removing_ops_df.join(members_df, on=["broker_name", "queue_id", "half_queue_offset"], how="left_anti")
    null_string, null_long = F.lit(None).cast("string"), F.lit(None).cast("long")
    return (
        orphans_df.groupBy("broker_name", "half_queue_offset")
        .agg(F.min("op_queue_offset").alias("op_queue_offset"))
        .select(
            "broker_name",
            null_string.alias("producer_group"),
            null_string.alias("uniq_key"),
            "half_queue_offset",
            F.lit(UNKNOWN_OFFSET).cast("long").alias("half_commit_log_offset"),
            null_string.alias("real_topic"),
            F.lit(None).cast("int").alias("real_queue_id"),
            F.lit(ROLLED_BACK).alias("state"),
            F.lit(None).cast("int").alias("check_times"),
            "op_queue_offset",
            null_long.alias("final_commit_log_offset"),
            null_long.alias("born_timestamp"),
            F.lit(as_of).cast("long").alias("as_of"),
            F.lit(OP_WITHOUT_HALF).alias("anomaly"),
        )
    )


def _state(as_of: int, timeout_ms: int, check_max: int, reserve_ms: int) -> Column:
    """The state of a resolved transaction row, by the precedence of docs/jobs.md (resolve_transactions, "States")."""
    age = F.lit(as_of) - F.col("born_timestamp")
    has_op = F.col("op_queue_offset").isNotNull()
    has_final = F.col("final_count").isNotNull()
    discarded = F.coalesce(F.col("has_discard"), F.lit(False)) | (F.col("check_times") >= F.lit(check_max))
    immunity = F.coalesce(F.col("check_immunity_ms"), F.lit(timeout_ms))
    in_immunity = F.col("has_check_immunity") & (age < immunity)
    in_timeout = ~F.col("has_check_immunity") & (age >= F.lit(0)) & (age < F.lit(timeout_ms))
    return (
        F.when(has_op & has_final, F.lit(COMMITTED))
        .when(has_op, F.lit(ROLLED_BACK))
        .when(discarded, F.lit(DISCARDED))
        .when(age > F.lit(reserve_ms), F.lit(EXPIRED))
        .when(in_immunity | in_timeout, F.lit(PENDING))
        .otherwise(F.lit(CHECK_DUE))
    )


def _anomaly() -> Column:
    """The anomalies of a resolved transaction row, in :data:`ANOMALIES` order, null when none."""
    has_op = F.col("op_queue_offset").isNotNull()
    flags = [
        F.when(F.col("final_count").isNotNull() & ~has_op, F.lit(FINAL_WITHOUT_OP)),
        F.when(F.col("final_count") >= F.lit(2), F.lit(DOUBLE_COMMIT)),
        F.when(F.col("op_on_copy"), F.lit(OP_ON_REPUT_COPY)),
        F.when(F.col("has_duplicate"), F.lit(DUPLICATE_HALF)),
    ]
    return F.nullif(F.concat_ws(",", *flags), F.lit(""))
