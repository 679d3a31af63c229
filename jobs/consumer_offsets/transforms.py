"""The Spark transforms of ``consumer_offsets``: queue bounds, listed queues and the table as of T."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from broker_model.common import GROUP_QUEUE_KEY, QUEUE_KEY, RETRY_GROUP_TOPIC_PREFIX

QUEUE_NOT_FOUND = "QUEUE_NOT_FOUND"
QUEUE_BOUNDS_COLUMNS = (*QUEUE_KEY, "broker_min_offset", "broker_offset")


def build_queue_bounds(consume_queue_df: DataFrame, as_of: int) -> DataFrame:
    """Per queue, the bounds of its consume-queue rows stored at or before ``as_of``.

    Args:
        consume_queue_df: rows of ``consume_queue`` (at least the queue key, ``queue_offset`` and
            ``store_timestamp``).
        as_of: epoch milliseconds; consume-queue rows with ``store_timestamp <= as_of`` count.

    Returns:
        :data:`QUEUE_BOUNDS_COLUMNS`: ``broker_min_offset`` is the smallest queue offset,
        ``broker_offset`` the largest plus one (the next offset to be written). A queue with no
        such consume-queue row has no row.
    """
    return (
        filter_cq_rows_as_of(consume_queue_df, as_of)
        .groupBy(*QUEUE_KEY)
        .agg(
            F.min("queue_offset").alias("broker_min_offset"),
            (F.max("queue_offset") + F.lit(1)).alias("broker_offset"),
        )
        .select(*QUEUE_BOUNDS_COLUMNS)
    )


def build_configured_queues(topic_config_df: DataFrame, as_of: int) -> DataFrame:
    """The queues the topic configuration knows at ``as_of``.

    Args:
        topic_config_df: rows of ``topic_config`` (at least ``broker_name``, ``topic``,
            ``queue_nums`` and ``updated_timestamp``).
        as_of: epoch milliseconds; rows with ``updated_timestamp <= as_of`` count.

    Returns:
        :data:`~broker_model.common.QUEUE_KEY` columns: queue ids ``0 .. queue_nums - 1`` of each
        (broker, topic)'s latest row (the greatest ``updated_timestamp``, then ``queue_nums``).
    """
    latest = F.max(F.struct("updated_timestamp", "queue_nums")).alias("latest")
    return (
        topic_config_df.where(F.col("updated_timestamp") <= F.lit(as_of))
        .groupBy("broker_name", "topic")
        .agg(latest)
        .where(F.col("latest.queue_nums") > F.lit(0))
        .select(
            "broker_name", "topic", F.explode(F.sequence(F.lit(0), F.col("latest.queue_nums") - 1)).alias("queue_id")
        )
        .select(*QUEUE_KEY)
    )


def union_empty_queues(bounds_df: DataFrame, configured_df: DataFrame) -> DataFrame:
    """``bounds_df`` plus the configured queues it lacks, as empty queues.

    Args:
        bounds_df: :func:`build_queue_bounds`.
        configured_df: :func:`build_configured_queues`.

    Returns:
        :data:`QUEUE_BOUNDS_COLUMNS`: every row of ``bounds_df``, and ``broker_min_offset`` and
        ``broker_offset`` 0 for each configured queue without consume-queue rows (RocketMQ's min
        and max offsets of an empty queue).
    """
    empty_df = configured_df.join(bounds_df.select(*QUEUE_KEY), on=list(QUEUE_KEY), how="left_anti").select(
        *QUEUE_KEY,
        F.lit(0).cast("long").alias("broker_min_offset"),
        F.lit(0).cast("long").alias("broker_offset"),
    )
    return bounds_df.unionByName(empty_df).select(*QUEUE_BOUNDS_COLUMNS)


def filter_cq_rows_as_of(consume_queue_df: DataFrame, as_of: int) -> DataFrame:
    """The consume-queue rows stored at or before ``as_of`` (epoch ms), columns unchanged."""
    return consume_queue_df.where(F.col("store_timestamp") <= F.lit(as_of))


def build_consumer_offsets(
    current_df: DataFrame, bounds_df: DataFrame, consume_queue_df: DataFrame, as_of: int
) -> DataFrame:
    """The ``consumer_offsets`` table: offsets and lag per (group, broker_name, topic, queue_id).

    Args:
        current_df: :func:`build_current_offsets` at ``as_of``.
        bounds_df: :func:`build_queue_bounds` at ``as_of``.
        consume_queue_df: rows of ``consume_queue``; rows stored after ``as_of`` are ignored.
        as_of: epoch milliseconds, written to every row.

    Returns:
        Exactly the ``consumer_offsets`` catalog columns, one row per listed queue (which queues
        are listed: docs/jobs.md, consumer_offsets, "Which queues get a row").
        With ``c = coalesce(consumer_offset, 0)``:
        ``diff = broker_offset - c`` (negative when a commit is beyond the queue's end; null for
        QUEUE_NOT_FOUND); ``last_timestamp`` is the store time of the consume-queue row at
        ``consumer_offset - 1`` (null when there is none: no commit, an offset at or below the
        first row or beyond the last, a gap); ``oldest_unconsumed_timestamp`` is the store time
        of the row at ``greatest(c, broker_min_offset)`` when ``c < broker_offset`` (an offset
        below the first row is served from the first row on, as RocketMQ moves it there).
        Should the consume queue hold two rows at one queue offset, the earlier store time is
        taken, so each key still has exactly one row.
    """
    rows_df = build_listed_queues(current_df, bounds_df).join(bounds_df, on=list(QUEUE_KEY), how="left")
    cq_rows_df = filter_cq_rows_as_of(consume_queue_df, as_of)
    counted = F.coalesce(F.col("consumer_offset"), F.lit(0).cast("long"))
    last_df = _cq_row_times(rows_df, cq_rows_df, F.col("consumer_offset") - F.lit(1), "last_timestamp")
    unconsumed_df = rows_df.where(counted < F.col("broker_offset"))
    oldest_df = _cq_row_times(
        unconsumed_df, cq_rows_df, F.greatest(counted, F.col("broker_min_offset")), "oldest_unconsumed_timestamp"
    )
    return (
        rows_df.join(last_df, on=list(GROUP_QUEUE_KEY), how="left")
        .join(oldest_df, on=list(GROUP_QUEUE_KEY), how="left")
        .select(
            *GROUP_QUEUE_KEY,
            "consumer_offset",
            "broker_min_offset",
            "broker_offset",
            (F.col("broker_offset") - counted).alias("diff"),
            "last_timestamp",
            "oldest_unconsumed_timestamp",
            F.lit(as_of).cast("long").alias("as_of"),
            _anomaly().alias("anomaly"),
        )
    )


def build_listed_queues(current_df: DataFrame, bounds_df: DataFrame) -> DataFrame:
    """The committed queues plus, per group, every queue of its topics and the queues of its retry
    topic that hold rows.

    Args:
        current_df: :func:`build_current_offsets`.
        bounds_df: :func:`build_queue_bounds`, or with :func:`union_empty_queues`; only its
            queues are added, and of the retry topic only those with rows (``broker_offset > 0``):
            RocketMQ lists a topic once the group has an offset on it, and the lake adds the retry
            messages not consumed yet as lag.

    Returns:
        ``group, broker_name, topic, queue_id, consumer_offset``, one row per key; added queues
        have a null ``consumer_offset``.
    """
    retry_topic = F.concat(F.lit(RETRY_GROUP_TOPIC_PREFIX), F.col("group")).alias("topic")
    queues_df = bounds_df.select(*QUEUE_KEY)
    held_df = bounds_df.where(F.col("broker_offset") > F.lit(0)).select(*QUEUE_KEY)
    committed_df = current_df.select("group", "topic").distinct().join(queues_df, on="topic", how="inner")
    retries_df = current_df.select("group", retry_topic).distinct().join(held_df, on="topic", how="inner")
    listed_df = committed_df.select(*GROUP_QUEUE_KEY).unionByName(retries_df.select(*GROUP_QUEUE_KEY)).distinct()
    return (
        current_df.select(*GROUP_QUEUE_KEY, "consumer_offset")
        .join(listed_df, on=list(GROUP_QUEUE_KEY), how="full")
        .select(*GROUP_QUEUE_KEY, "consumer_offset")
    )


def _cq_row_times(rows_df: DataFrame, cq_rows_df: DataFrame, queue_offset: Column, name: str) -> DataFrame:
    """``group`` + queue key + ``name``: the store time of the consume-queue row at ``queue_offset`` of each row.

    An equi-join on (broker_name, topic, queue_id, queue_offset), not a per-row lookup; rows
    without such a row are absent; duplicate rows resolve to the earliest store time.
    """
    wanted_df = rows_df.select(*GROUP_QUEUE_KEY, queue_offset.alias("queue_offset"))
    found_df = wanted_df.join(
        cq_rows_df.select(*QUEUE_KEY, "queue_offset", "store_timestamp"),
        on=[*QUEUE_KEY, "queue_offset"],
        how="inner",
    )
    return found_df.groupBy(*GROUP_QUEUE_KEY).agg(F.min("store_timestamp").alias(name)).select(*GROUP_QUEUE_KEY, name)


def _anomaly() -> Column:
    return F.when(F.col("broker_offset").isNull(), F.lit(QUEUE_NOT_FOUND)).otherwise(F.lit(None).cast("string"))
