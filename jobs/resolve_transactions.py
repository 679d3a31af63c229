"""The ``resolve_transactions`` job: one state per transactional message, as of a time T.

RocketMQ keeps no transaction table: a transaction is a set of commit log records, all of one
broker (ROCKETMQ_FACTS section 8), and this job joins them back together.

- **Half records** (topic ``RMQ_SYS_TRANS_HALF_TOPIC``, transaction type NOT): the original half
  message, and the re-put copies each check round writes before a check-back (same properties,
  same ``UNIQ_KEY`` and ``born_timestamp``, plus ``TRANSACTION_CHECK_TIMES``). A transaction is
  identified by (``broker_name``, ``PGROUP``, ``UNIQ_KEY``); its original is the earliest half
  record (smallest ``commit_log_offset``), and every later one resolves to it. A half record
  without ``UNIQ_KEY`` cannot be linked to copies and is a transaction of its own.
- **Op records** (topic ``RMQ_SYS_TRANS_OP_HALF_TOPIC``, tag ``d``): the body lists the half queue
  offsets the op ends, ``"123"`` or the 5.1+ form ``"5,6,9,"``. An op may end the original or a
  copy (a check-back answer carries the copy's offsets). Ops with another tag are ignored, as
  RocketMQ ignores them, and counted in the summary.
- **Final records** (transaction type COMMIT, in the real topic): ``prepared_transaction_offset``
  is the commit log offset of the half record that was ended, original or copy.
- **Discard records** (topic ``TRANS_CHECK_MAX_TIME_TOPIC``): a copy of the half message, same
  ``UNIQ_KEY`` and ``PGROUP``, written when the check limit (or the file reserve time) is reached.

Only records stored at or before T (``store_timestamp <= T``) count. With
``age = T - born_timestamp`` of the original, the state is the first that applies:

1. ``COMMITTED``: an op ends the original or a copy, and a final record was written for one of them;
2. ``ROLLED_BACK``: an op, no final record;
3. ``DISCARDED``: no op; a discard record, or ``check_times >= check_max`` (the next check round
   discards it without another check-back);
4. ``EXPIRED``: no op; ``age > reserve_ms`` (RocketMQ's ``needSkip``: never checked again);
5. ``PENDING``: no op; inside the check window: ``age < immunity`` when the original carries
   ``CHECK_IMMUNITY_TIME_IN_SECONDS`` (immunity = seconds * 1000, or ``timeout_ms`` when the value
   is not a number or is -1; no ``timeout_ms`` minimum, as in ``TransactionalMessageServiceImpl``),
   else ``0 <= age < timeout_ms`` (a half born after T, by the producer's clock, is checked at once);
6. ``CHECK_DUE``: none of the above: the check service makes a check-back at T.

An op beats everything (the transaction ended, even after a discard); DISCARDED beats EXPIRED,
since a discard record or the check limit is the more specific fact.

``anomaly`` lists, joined with ``,`` in this fixed order (null when none):

- ``OP_WITHOUT_HALF``: an op names a half queue offset that no half record of its broker has
  (the half predates the lake, or the log is damaged). Each such (broker, half queue offset) gets
  a row of its own: ``uniq_key``, ``producer_group``, the real topic, ``born_timestamp`` and
  ``check_times`` null, ``half_commit_log_offset`` -1 (unknown), ``state`` ROLLED_BACK (the op
  ended it and no final record can be matched without the half), ``op_queue_offset`` the first
  such op. An op entry that is not a number gets ``half_queue_offset`` -1.
- ``FINAL_WITHOUT_OP``: a final record but no op (the broker died between the two writes); the
  state is then decided as without op.
- ``DOUBLE_COMMIT``: two or more final records for one transaction.
- ``OP_ON_REPUT_COPY``: the first op ends a re-put copy rather than the original. Expected after a
  check-back answer: information, not an error.
- ``DUPLICATE_HALF``: a later half record of the transaction is no re-put copy (it has neither
  ``TRANSACTION_CHECK_TIMES`` nor ``TRAN_PREPARED_QUEUE_OFFSET``): the half was sent twice with one
  ``UNIQ_KEY`` (a producer send retry). It is resolved as a copy.

Idempotence: the job_runs row stores the commit log version in ``input_versions`` and T and the
check settings in ``message`` (``as_of=...; timeout_ms=...; check_max=...; reserve_ms=...``). A run
whose inputs and settings equal those of the latest SUCCEEDED or NOOP run of this job, while
``transaction_state`` is still at the version that run wrote or kept, writes nothing and records a
NOOP run; inputs at later versions that only commits changing no row reached (a compaction) are
equal (:func:`jobs.runs.same_inputs`). Leaving out ``--as-of`` means "now", a new T on every run.

Incremental: the job keeps ``transaction_records``, the transaction records of the commit log
already decoded (one row per half, final and discard record, one per half queue offset an op
lists; no bodies). A run appends the records of the commit log versions it has not seen, read
from those versions' added files alone, in one commit carrying the Delta application transaction
(``resolve_transactions``, commit log version), so a rerun or a restart after a crash neither
skips nor repeats a version. The states are then recomputed from ``transaction_records`` and
``transaction_state`` is overwritten: every state depends on T through the age of pending
transactions, and a new record can change a transaction decided long ago (a second final
record), but this input holds only transaction records, not the whole log. ``--full`` (or a
commit log version that cannot be read as appends, e.g. after rows were deleted) rebuilds
``transaction_records`` from the whole commit log; when it already holds the latest version
there is nothing to rebuild.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from broker_model.broker import FILE_RESERVED_MS, REMOVE_TAG, TRANSACTION_CHECK_MAX, TRANSACTION_TIMEOUT_MS
from broker_model.common import constants as c
from jobs.cli import as_of_of, format_age, iso_utc, job_parser, run_spark_job, text_table
from jobs.extract import update_extract
from jobs.lake import Lake
from jobs.runs import JobRun, latest_reusable_run, read_or_empty, record_run, same_inputs, table_versions
from schemas.catalog import COMMITLOG, TRANSACTION_RECORDS, TRANSACTION_STATE
from schemas.errors import LakeError, ValidationError

JOB = "resolve_transactions"
APP_ID = JOB  # the Delta application transaction id of transaction_records: the commit log version read
HALF, OP, FINAL, DISCARD = "HALF", "OP", "FINAL", "DISCARD"  # transaction_records kinds

OFFSET_SEPARATOR = ","  # 5.1+ op bodies list several half queue offsets
UNKNOWN_OFFSET = -1  # an offset the log does not give (op without half, op entry not a number)
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
HALF_COLUMNS = (
    "broker_name",
    "queue_id",
    "queue_offset",
    "commit_log_offset",
    "born_timestamp",
    "store_timestamp",
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
RECORD_COLUMNS = (
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

_PARAMETERS = re.compile(r"^(as_of=-?\d+; timeout_ms=\d+; check_max=\d+; reserve_ms=\d+)(?:;|$)")


@dataclass(frozen=True)
class ResolveTransactionsConfig:
    """Options of the job.

    Attributes:
        lake: the lake root.
        as_of: the time T the states are computed for, epoch milliseconds.
        timeout_ms: the broker's transaction timeout (``transactionTimeOut``), ms, >= 0.
        check_max: the broker's check limit (``transactionCheckMax``), >= 1.
        reserve_ms: the broker's file reserve time, ms, >= 0; older halves are EXPIRED.
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.
        show: how many CHECK_DUE transactions the summary lists (the oldest first), >= 0.
        full: rebuild ``transaction_records`` from the whole commit log instead of appending the
            records of the commit log versions not read yet.

    Raises:
        ValidationError: a setting out of range.
    """

    lake: Path
    as_of: int
    timeout_ms: int = TRANSACTION_TIMEOUT_MS
    check_max: int = TRANSACTION_CHECK_MAX
    reserve_ms: int = FILE_RESERVED_MS
    engine: str = "auto"
    show: int = 20
    full: bool = False

    def __post_init__(self) -> None:
        for name, minimum in (("timeout_ms", 0), ("check_max", 1), ("reserve_ms", 0), ("show", 0)):
            value = getattr(self, name)
            if value < minimum:
                raise ValidationError(name, value, f"is below {minimum}", f"pass a value >= {minimum}")

    @property
    def parameters(self) -> str:
        """The settings that decide the output, as recorded at the start of the job_runs message."""
        return (
            f"as_of={self.as_of}; timeout_ms={self.timeout_ms}; check_max={self.check_max}; "
            f"reserve_ms={self.reserve_ms}"
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
    """A record with transaction type COMMIT outside the retry, dead letter and schedule topics: the
    message an end transaction wrote to the real topic. (A send-back copies the sys flag, so the
    retries and the dead letter of a committed message keep the COMMIT type.)"""
    topic = F.col("topic")
    copied = (
        topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX)
        | topic.startswith(c.DLQ_GROUP_TOPIC_PREFIX)
        | (topic == F.lit(c.SCHEDULE_TOPIC))
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
        commitlog_df: commit log rows (at least :data:`RECORD_COLUMNS`).

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
    entries = F.filter(F.split(F.decode(F.col("body"), "UTF-8"), OFFSET_SEPARATOR), lambda e: e != F.lit(""))
    is_half, is_op, is_final = (F.col("kind") == F.lit(k) for k in (HALF, OP, FINAL))
    has_check_times = is_half | (F.col("kind") == F.lit(DISCARD))
    entry = F.col("entry")
    kinded_df = commitlog_df.select(*RECORD_COLUMNS, kind.alias("kind")).where(F.col("kind").isNotNull())
    return (
        kinded_df.select("*", F.explode_outer(F.when(is_op, entries)).alias("entry"))
        .select(
            "kind",
            "broker_name",
            "queue_id",
            "queue_offset",
            "commit_log_offset",
            "born_timestamp",
            "store_timestamp",
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
            F.when(entry.isNotNull(), F.coalesce(entry.try_cast("long"), F.lit(UNKNOWN_OFFSET)))
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
        without half; states, precedence and anomalies as in the module docstring.
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
    """The state of a resolved transaction row, by the precedence of the module docstring."""
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


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


@dataclass
class TransactionSummary:
    """What a run prints: counts per state and per anomaly, the check-backs due, ignored ops."""

    as_of: int
    states: dict[str, int] = field(default_factory=dict)
    anomalies: dict[str, int] = field(default_factory=dict)
    check_due: list[dict[str, Any]] = field(default_factory=list)
    ignored_ops: int | None = None


def run(spark: SparkSession, config: ResolveTransactionsConfig) -> JobRun:
    """Bring ``transaction_records`` up to the commit log, compute ``transaction_state`` as of
    ``config.as_of``, print the summary, record the run.

    Reads the current version of ``commitlog`` (a missing table counts as empty), appends the
    transaction records of its versions not read yet (module docstring), overwrites
    ``transaction_state`` unless the run is a no-op, and appends one ``job_runs`` row: SUCCEEDED
    or NOOP with the input versions (``commitlog``, ``transaction_records``), the output version
    and row counts (``new_transaction_records``, ``half_records``, ``op_records``,
    ``ignored_op_records``, ``final_records``, ``discard_records`` stored at or before T,
    ``transaction_state``), or FAILED before re-raising.

    Raises:
        LakeError: ``transaction_records`` was built from a later commit log version than the
            latest one (the commit log was replaced; delete ``transaction_records``).

    Returns:
        The recorded run.
    """
    lake = Lake(spark, config.lake, config.engine)
    job_run = JobRun(JOB)
    job_run.input_versions = table_versions(lake, [COMMITLOG.name])
    try:
        latest = job_run.input_versions.get(COMMITLOG.name)
        new_records = update_extract(lake, TRANSACTION_RECORDS, APP_ID, build_transaction_records, latest, config.full)
        job_run.input_versions.update(table_versions(lake, [TRANSACTION_RECORDS.name]))
        previous = _reusable_run(lake, job_run.input_versions, config.parameters)
        status = "SUCCEEDED" if previous is None else "NOOP"
        if previous is None:
            version = _compute_and_write(lake, job_run, config)
        else:
            version, job_run.row_counts = previous
        job_run.row_counts["new_transaction_records"] = new_records
        job_run.output_versions[TRANSACTION_STATE.name] = version
        summary = summarize(lake.read(TRANSACTION_STATE, version=version), config.as_of, config.show)
        summary.ignored_ops = job_run.row_counts.get("ignored_op_records")
        job_run.row_counts[TRANSACTION_STATE.name] = sum(summary.states.values())
        print("\n".join(format_summary(summary)))
    except Exception as err:
        record_run(lake, job_run.finish("FAILED", f"{config.parameters}; {type(err).__name__}: {err}"))
        raise
    done = "inputs and settings unchanged, nothing written" if status == "NOOP" else "transaction_state overwritten"
    record_run(lake, job_run.finish(status, f"{config.parameters}; {done}"))
    return job_run


def _compute_and_write(lake: Lake, job_run: JobRun, config: ResolveTransactionsConfig) -> int:
    """Compute the states from ``transaction_records`` at the recorded version, overwrite; the
    committed version."""
    records_df = read_or_empty(lake, TRANSACTION_RECORDS, job_run.input_versions)
    records_df = records_df.where(F.col("store_timestamp") <= F.lit(config.as_of)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        state_df = build_transaction_state(
            halves_of(records_df),
            ops_of(records_df),
            finals_of(records_df),
            discards_of(records_df),
            config.as_of,
            config.timeout_ms,
            config.check_max,
            config.reserve_ms,
        )
        version = lake.overwrite(TRANSACTION_STATE, state_df)
        job_run.row_counts.update(_record_counts(records_df))
    finally:
        records_df.unpersist()
    if version is None:
        raise LakeError(f"the overwrite of {lake.location(TRANSACTION_STATE)} committed no version; run the job again")
    return version


def _record_counts(records_df: DataFrame) -> dict[str, int]:
    """Records read, by kind, in one pass (an op record counts once, whatever its body lists)."""
    kind = F.col("kind")
    op = F.when(kind == F.lit(OP), F.struct("broker_name", "commit_log_offset"))
    ignored = F.when((kind == F.lit(OP)) & ~F.col("removes"), F.struct("broker_name", "commit_log_offset"))
    counts = {
        "half_records": F.count_if(kind == F.lit(HALF)),
        "op_records": F.count_distinct(op),
        "ignored_op_records": F.count_distinct(ignored),
        "final_records": F.count_if(kind == F.lit(FINAL)),
        "discard_records": F.count_if(kind == F.lit(DISCARD)),
    }
    row = records_df.select(*[value.alias(name) for name, value in counts.items()]).first()
    return {name: int(row[name]) if row is not None else 0 for name in counts}


def _reusable_run(lake: Lake, input_versions: Mapping[str, int], parameters: str) -> tuple[int, dict[str, int]] | None:
    """The current ``transaction_state`` version and the row counts of the latest reusable run,
    when that run had these inputs and settings and wrote (or kept) that very version; else None."""
    current = lake.version(TRANSACTION_STATE)
    if current is None:
        return None
    previous = latest_reusable_run(lake, JOB)
    if previous is None:
        return None
    unchanged = same_inputs(lake, previous["input_versions"], input_versions)
    same_output = previous["output_versions"].get(TRANSACTION_STATE.name) == current
    if unchanged and same_output and parameters_of_message(previous["message"]) == parameters:
        return current, previous["row_counts"]
    return None


def parameters_of_message(message: str | None) -> str | None:
    """The settings a run of this job recorded at the start of its job_runs ``message``, or None."""
    found = _PARAMETERS.match(message or "")
    return found.group(1) if found else None


def summarize(state_df: DataFrame, as_of: int, show: int) -> TransactionSummary:
    """Count ``transaction_state`` rows per state and per anomaly; list the ``show`` oldest CHECK_DUE rows."""
    states = {row["state"]: int(row["count"]) for row in state_df.groupBy("state").count().collect()}
    anomaly_df = state_df.select(F.explode(F.split(F.col("anomaly"), ",")).alias("anomaly"))
    anomalies = {row["anomaly"]: int(row["count"]) for row in anomaly_df.groupBy("anomaly").count().collect()}
    due_df = state_df.where(F.col("state") == F.lit(CHECK_DUE)).orderBy(
        "born_timestamp", "broker_name", "half_commit_log_offset"
    )
    due = [row.asDict() for row in due_df.limit(show).collect()] if show else []
    return TransactionSummary(as_of, states, anomalies, due)


# ---------------------------------------------------------------------------------------------
# The printed summary
# ---------------------------------------------------------------------------------------------

_DUE_HEADER = ("#Broker Name", "#Producer Group", "#Uniq Key", "#Real Topic", "#QID", "#Half Offset", "#Checks", "#Age")


def format_summary(summary: TransactionSummary) -> list[str]:
    """The lines of a run's summary.

    Every state with its count (0 included) in precedence order, the anomaly counts in
    :data:`ANOMALIES` order (``none`` when there are none), the op records ignored for their tag
    (when known), then the CHECK_DUE transactions listed (oldest first) with producer group and
    age at ``as_of``, and how many more there are.
    """
    total = sum(summary.states.values())
    lines = [f"transaction state as of {iso_utc(summary.as_of)} ({summary.as_of}): {total} transactions"]
    lines += text_table([(state, str(summary.states.get(state, 0))) for state in STATES])
    found = [f"{name} {summary.anomalies[name]}" for name in ANOMALIES if summary.anomalies.get(name)]
    lines.append("anomalies: " + (", ".join(found) if found else "none"))
    if summary.ignored_ops:
        lines.append(f'op records ignored (tag is not "{REMOVE_TAG}"): {summary.ignored_ops}')
    due_total = summary.states.get(CHECK_DUE, 0)
    lines.append(f"check-back due now: {due_total}")
    if summary.check_due:
        lines += text_table([_DUE_HEADER, *(_due_cells(row, summary.as_of) for row in summary.check_due)])
    if due_total > len(summary.check_due):
        lines.append(f"... and {due_total - len(summary.check_due)} more")
    return lines


def _due_cells(row: Mapping[str, Any], as_of: int) -> tuple[str, ...]:
    return (
        row["broker_name"],
        row["producer_group"] or "-",
        row["uniq_key"] or "-",
        row["real_topic"] or "-",
        "-" if row["real_queue_id"] is None else str(row["real_queue_id"]),
        str(row["half_queue_offset"]),
        str(row["check_times"]),
        format_age(as_of - row["born_timestamp"]),
    )


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options of ``resolve_transactions``."""
    parser = job_parser(JOB, __doc__)
    parser.add_argument(
        "--as-of", help="time T: epoch ms or ISO-8601 with a zone, e.g. 2026-11-22T02:00:00Z (default: now)"
    )
    parser.add_argument(
        "--timeout-ms",
        type=int,
        default=TRANSACTION_TIMEOUT_MS,
        help=f"broker transactionTimeOut, ms (default {TRANSACTION_TIMEOUT_MS})",
    )
    parser.add_argument(
        "--check-max",
        type=int,
        default=TRANSACTION_CHECK_MAX,
        help=f"broker transactionCheckMax (default {TRANSACTION_CHECK_MAX})",
    )
    parser.add_argument(
        "--reserve-ms",
        type=int,
        default=FILE_RESERVED_MS,
        help=f"broker file reserve time, ms (default {FILE_RESERVED_MS}, 72 h)",
    )
    parser.add_argument("--show", type=int, default=20, help="CHECK_DUE transactions to list (default 20)")
    parser.add_argument(
        "--full",
        action="store_true",
        help="rebuild transaction_records from the whole commit log when it is behind (default: "
        "read only the new versions)",
    )
    return parser


def build_config(argv: Sequence[str] | None = None) -> ResolveTransactionsConfig:
    """The config of ``argv``; ``--as-of`` defaults to the current time.

    Raises:
        ValidationError: ``--as-of`` is neither epoch ms nor ISO-8601 with a zone, or a setting is
            out of range.
        SystemExit: argparse usage errors and ``--help``.
    """
    args = build_parser().parse_args(argv)
    as_of = as_of_of(args.as_of)
    return ResolveTransactionsConfig(
        Path(args.lake), as_of, args.timeout_ms, args.check_max, args.reserve_ms, args.engine, args.show, args.full
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` (before starting Spark), build the session, run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
