"""Retry chains and dead letters as DataFrame transforms: the retry, schedule and DLQ records of the
commit log, one chain per (group, original message), its state and policy, and the ``dlq`` table's
rows. See docs/jobs.md (route_dlq).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from broker_model.common import constants as c
from broker_model.common import create_msg_id, parse_host
from schemas.catalog import (
    RETRY_CHAINS,
    RETRY_RECORDS,
)

PENDING, SENT = "PENDING", "SENT"  # dlq_redrives states
SCHEDULED, RETRY, DEAD_LETTER = "SCHEDULED", "RETRY", "DLQ"  # retry_records kinds
DELIVERED, CONSUMED, DEAD = "DELIVERED", "CONSUMED", "DEAD"  # chain states besides SCHEDULED
MAX_RECONSUME_TIMES, CONSUMER_REQUESTED, POLICY, POLICY_NOT_WRITTEN = (
    "MAX_RECONSUME_TIMES",
    "CONSUMER_REQUESTED",
    "POLICY",
    "POLICY_NOT_WRITTEN",
)

STATES = (SCHEDULED, DELIVERED, CONSUMED, DEAD)


REASONS = (MAX_RECONSUME_TIMES, CONSUMER_REQUESTED, POLICY, POLICY_NOT_WRITTEN)


RETRY_COPIED_COLUMNS = (
    "broker_name",
    "topic",
    "queue_id",
    "queue_offset",
    "commit_log_offset",
    "msg_id",
    "uniq_key",
    "keys",
)
"""The commit log columns a retry record copies as they are."""


PROPERTY_ROUTED_BY = "DLQ_ROUTED_BY"  # on a %DLQ% record a tool wrote on the group's behalf


CHAIN_KEY = ("group", "origin_msg_id")


KIND_RANK = {SCHEDULED: 0, RETRY: 1, DEAD_LETTER: 2}  # order of the copies of one reconsume count


def _property(name: str) -> Column:
    return F.try_element_at(F.col("properties"), F.lit(name))


def build_retry_records(commitlog_df: DataFrame) -> DataFrame:
    """The ``retry_records`` rows of commit log rows: their send-back records, decoded.

    One pass, no shuffle. SCHEDULED: a record of the schedule topic whose ``REAL_TOPIC`` is a
    retry topic; RETRY: a record of a ``%RETRY%`` topic; DLQ: a record of a ``%DLQ%`` topic.
    ``group`` is the topic (or ``REAL_TOPIC``) without its prefix, except in a RocketMQ 5 POP
    retry topic (:func:`pop_retry_topic_of`), where it is ``ORIGIN_GROUP``; ``origin_msg_id`` and
    ``origin_topic`` are ``ORIGIN_MESSAGE_ID`` and ``RETRY_TOPIC`` (null when absent or blank; a
    ``RETRY_TOPIC`` that is a POP retry topic, as a POP dead letter's is, gives the topic it retries;
    a POP retry without ``RETRY_TOPIC`` names its topic after the group);
    ``routed_by`` is ``DLQ_ROUTED_BY`` on DLQ records. ``body`` and ``properties`` are kept on
    RETRY and DLQ records only. Other records give no row.

    Returns:
        Exactly the catalog columns of ``retry_records``.
    """
    topic, real_topic = F.col("topic"), _property(c.PROPERTY_REAL_TOPIC)
    scheduled_retry = (topic == F.lit(c.SCHEDULE_TOPIC)) & real_topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX)
    kind = (
        F.when(scheduled_retry, F.lit(SCHEDULED))
        .when(topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX), F.lit(RETRY))
        .when(topic.startswith(c.DLQ_GROUP_TOPIC_PREFIX), F.lit(DEAD_LETTER))
    )
    target = F.when(topic == F.lit(c.SCHEDULE_TOPIC), real_topic).otherwise(topic)
    origin_group = _property(c.PROPERTY_ORIGIN_GROUP)
    pop_topic = pop_retry_topic_of(target, origin_group)
    group = F.when(pop_topic.isNotNull(), origin_group).otherwise(F.regexp_replace(target, r"^%(RETRY|DLQ)%", ""))
    retry_topic = F.nullif(F.trim(_property(c.PROPERTY_RETRY_TOPIC)), F.lit(""))
    kept = F.col("kind") != F.lit(SCHEDULED)
    return (
        commitlog_df.select("*", kind.alias("kind"))
        .where(F.col("kind").isNotNull())
        .select(
            "kind",
            group.alias("group"),
            *RETRY_COPIED_COLUMNS,
            F.nullif(F.trim(_property(c.PROPERTY_ORIGIN_MESSAGE_ID)), F.lit("")).alias("origin_msg_id"),
            F.coalesce(pop_retry_topic_of(retry_topic, origin_group), retry_topic, pop_topic).alias("origin_topic"),
            "reconsume_times",
            "born_timestamp",
            "store_timestamp",
            F.when(F.col("kind") == F.lit(DEAD_LETTER), _property(PROPERTY_ROUTED_BY)).alias("routed_by"),
            F.when(kept, F.col("body")).alias("body"),
            F.when(kept, F.col("properties")).alias("properties"),
        )
        .select(*RETRY_RECORDS.column_names)
    )


def pop_retry_topic_of(target: Column, origin_group: Column) -> Column:
    """The topic a RocketMQ 5 POP retry topic ``target`` retries, null when it is none.

    POP consumers (RocketMQ 5 gRPC clients) get unacknowledged messages back through
    ``%RETRY%<group>_<topic>`` (``+`` instead of ``_`` with ``enableRetryTopicV2``), and the revived
    copy carries ``ORIGIN_GROUP``: the topic is what follows ``%RETRY%<ORIGIN_GROUP>`` and one
    separator. Group and topic names may hold ``_``, so without ``ORIGIN_GROUP`` the name cannot be split.
    """
    prefix = F.concat(F.lit(c.RETRY_GROUP_TOPIC_PREFIX), origin_group)
    rest = target.substr(F.length(prefix) + F.lit(2), F.length(target))
    named = F.exists(
        F.array(*[F.lit(separator) for separator in c.POP_RETRY_SEPARATORS]),
        lambda separator: target.startswith(F.concat(prefix, separator)),
    )
    return F.when(origin_group.isNotNull() & (origin_group != F.lit("")) & named & (rest != F.lit("")), rest)


def build_policies(subscription_group_df: DataFrame, as_of: int) -> DataFrame:
    """Per (``broker_name``, ``group``): ``retry_max_times`` of the latest setting at or before
    ``as_of`` (greatest ``updated_timestamp``; groups without one are left out: 16 applies)."""
    latest = F.max_by("retry_max_times", "updated_timestamp").alias("retry_max_times")
    return (
        subscription_group_df.where(F.col("updated_timestamp") <= F.lit(as_of))
        .groupBy("broker_name", "group")
        .agg(latest)
        .select("broker_name", "group", "retry_max_times")
    )


def build_origin_hosts(brokers: Sequence[tuple[str, str]], spark: SparkSession) -> DataFrame:
    """Per broker: ``host_prefix``, the part of an offset message id before the commit log offset
    (store IP and port as uppercase hex), from (``broker_name``, ``store_host``) pairs."""
    rows = sorted({(create_msg_id(parse_host(host), 0)[:-16], name) for name, host in brokers})
    return spark.createDataFrame(rows, "host_prefix string, broker_name string")


def with_chain_key(records_df: DataFrame) -> DataFrame:
    """Replace a missing ``origin_msg_id`` by the record's ``uniq_key``, else its ``msg_id``
    (a copy sent back through a client's producer carries the client id, or nothing)."""
    return records_df.withColumn("origin_msg_id", F.coalesce("origin_msg_id", "uniq_key", "msg_id"))


def build_retry_chains(
    records_df: DataFrame,
    policies_df: DataFrame,
    offsets_df: DataFrame,
    origins_df: DataFrame,
    as_of: int,
) -> DataFrame:
    """The ``retry_chains`` table as of ``as_of``.

    Args:
        records_df: ``retry_records`` rows (any time; later ones are ignored).
        policies_df: :func:`build_policies` as of ``as_of``.
        offsets_df: :func:`jobs.rules.build_current_offsets` as of ``as_of``.
        origins_df: :func:`build_origins`: the original record of chains, where known.
        as_of: epoch milliseconds.

    Returns:
        Exactly the catalog columns, one row per (group, origin_msg_id). The latest send-back
        record is the greatest by (reconsume times, SCHEDULED < RETRY < DLQ, store time, commit
        log offset): a total order. ``attempts``: the original (reconsume times 0, when found),
        then every RETRY record, ordered by reconsume times, store time and commit log offset.
    """
    chained_df = with_chain_key(records_df.where(F.col("store_timestamp") <= F.lit(as_of)))
    rank = F.create_map(*[F.lit(x) for pair in KIND_RANK.items() for x in pair])[F.col("kind")]
    latest = F.max_by(
        F.struct("kind", "broker_name", "topic", "queue_id", "queue_offset", "reconsume_times", "store_timestamp"),
        F.struct("reconsume_times", rank, "store_timestamp", "commit_log_offset"),
    )
    attempt = F.struct("broker_name", "topic", "commit_log_offset", "reconsume_times", "store_timestamp")
    chains_df = chained_df.groupBy(*CHAIN_KEY).agg(
        latest.alias("latest"),
        F.min("uniq_key").alias("uniq_key"),
        F.min("keys").alias("keys"),
        F.min("origin_topic").alias("origin_topic"),
        F.min_by("broker_name", "commit_log_offset").alias("broker_name"),
        F.array_sort(F.collect_list(F.when(F.col("kind") == F.lit(RETRY), attempt))).alias("retries"),
        F.min("store_timestamp").alias("first_failure_timestamp"),
    )
    topic_queue = F.struct(F.col("latest.topic").alias("topic"), F.col("latest.queue_id").alias("queue_id"))
    return (
        chains_df.withColumn("topic_queue", topic_queue)
        .join(origins_df, on=list(CHAIN_KEY), how="left")
        .join(policies_df, on=["broker_name", "group"], how="left")
        .join(_retry_queue_offsets(offsets_df), on=["group", "broker_name", "topic_queue"], how="left")
        .select(
            *CHAIN_KEY,
            "uniq_key",
            "keys",
            "origin_topic",
            "broker_name",
            F.concat(
                F.when(F.col("origin").isNotNull(), F.array("origin")).otherwise(F.array()),
                _by_reconsume_times(F.col("retries")),
            ).alias("attempts"),
            F.col("latest.reconsume_times").alias("last_reconsume_times"),
            "first_failure_timestamp",
            F.col("latest.store_timestamp").alias("last_timestamp"),
            _chain_state().alias("state"),
            F.coalesce("retry_max_times", F.lit(c.RETRY_MAX_TIMES)).alias("max_reconsume_times"),
        )
        .withColumn("exhausted", _exhausted())
        .select(*RETRY_CHAINS.column_names[:-1], F.lit(as_of).cast("long").alias("as_of"))
        .select(*RETRY_CHAINS.column_names)
    )


def _by_reconsume_times(retries: Column) -> Column:
    """Attempts ordered by (reconsume times, store time, commit log offset)."""
    keyed = F.transform(
        retries,
        lambda a: F.struct(
            a["reconsume_times"].alias("k0"),
            a["store_timestamp"].alias("k1"),
            a["commit_log_offset"].alias("k2"),
            a.alias("a"),
        ),
    )
    return F.transform(F.array_sort(keyed), lambda k: k["a"])


def _retry_queue_offsets(offsets_df: DataFrame) -> DataFrame:
    """The groups' committed offsets of retry queues, keyed for the chains' latest record."""
    return offsets_df.select(
        "group", "broker_name", F.struct("topic", "queue_id").alias("topic_queue"), "consumer_offset"
    )


def _chain_state() -> Column:
    latest = F.col("latest")
    consumed = F.coalesce(F.col("consumer_offset") > latest["queue_offset"], F.lit(False))
    return (
        F.when(latest["kind"] == F.lit(DEAD_LETTER), F.lit(DEAD))
        .when(latest["kind"] == F.lit(SCHEDULED), F.lit(SCHEDULED))
        .when(consumed, F.lit(CONSUMED))
        .otherwise(F.lit(DELIVERED))
    )


def _exhausted() -> Column:
    waiting = F.col("state").isin(SCHEDULED, DELIVERED)
    return waiting & (F.col("last_reconsume_times") >= F.col("max_reconsume_times"))


def build_origins(originals_df: DataFrame, chain_keys_df: DataFrame, hosts_df: DataFrame) -> DataFrame:
    """The original record of each chain as an attempt (reconsume times 0), where the log has it.

    Args:
        originals_df: commit log rows (``broker_name``, ``commit_log_offset``, ``topic``,
            ``store_timestamp``) that may hold the originals.
        chain_keys_df: ``group`` and ``origin_msg_id`` of the chains.
        hosts_df: :func:`build_origin_hosts`.

    Returns:
        ``group``, ``origin_msg_id``, ``origin`` (an attempt struct); chains whose origin id is
        not an offset message id of a known broker, or whose record is not in ``originals_df``,
        are left out.
    """
    decoded_df = decoded_origins(chain_keys_df, hosts_df)
    attempt = F.struct(
        "broker_name", "topic", "commit_log_offset", F.lit(0).cast("int").alias("reconsume_times"), "store_timestamp"
    )
    return decoded_df.join(originals_df, on=["broker_name", "commit_log_offset"], how="inner").select(
        *CHAIN_KEY, attempt.alias("origin")
    )


def decoded_origins(chain_keys_df: DataFrame, hosts_df: DataFrame) -> DataFrame:
    """Chain keys with the broker and commit log offset their origin id names (offset message ids
    of known brokers only: a client id or another broker's id matches no host prefix)."""
    origin = F.col("origin_msg_id")
    offset_hex = F.when(F.length(origin) > F.lit(16), F.substring(origin, -16, 16))
    return chain_keys_df.select(
        *CHAIN_KEY,
        F.expr("substring(origin_msg_id, 1, length(origin_msg_id) - 16)").alias("host_prefix"),
        F.conv(offset_hex, 16, 10).try_cast("long").alias("commit_log_offset"),
    ).join(F.broadcast(hosts_df), on="host_prefix", how="inner")


def build_dlq(records_df: DataFrame, chains_df: DataFrame, redrives_df: DataFrame, as_of: int) -> DataFrame:
    """The ``dlq`` table as of ``as_of`` (docs/jobs.md, route_dlq, "The three tables").

    Args:
        records_df: ``retry_records`` rows.
        chains_df: :func:`build_retry_chains` as of ``as_of``.
        redrives_df: ``dlq_redrives`` rows.

    Returns:
        Exactly the catalog columns: one row per DLQ record stored at or before ``as_of``, plus one
        ``POLICY_NOT_WRITTEN`` row per exhausted DELIVERED chain (its latest retry record).
    """
    chained_df = with_chain_key(records_df.where(F.col("store_timestamp") <= F.lit(as_of)))
    chain_df = chains_df.select(
        *CHAIN_KEY, "attempts", "first_failure_timestamp", "max_reconsume_times", "exhausted", "state"
    )
    dead_df = chained_df.where(F.col("kind") == F.lit(DEAD_LETTER)).join(chain_df, on=list(CHAIN_KEY), how="left")
    reason = (
        F.when(F.col("routed_by").isNotNull(), F.lit(POLICY))
        .when(
            F.col("reconsume_times") - 1 >= F.coalesce("max_reconsume_times", F.lit(c.RETRY_MAX_TIMES)),
            F.lit(MAX_RECONSUME_TIMES),
        )
        .otherwise(F.lit(CONSUMER_REQUESTED))
    )
    dead_rows_df = dead_df.select("*", reason.alias("reason"), F.col("store_timestamp").alias("dlq_timestamp"))
    latest_retry = Window.partitionBy(*CHAIN_KEY).orderBy(
        F.col("reconsume_times").desc(), F.col("store_timestamp").desc(), F.col("commit_log_offset").desc()
    )
    pending_df = (
        chained_df.where(F.col("kind") == F.lit(RETRY))
        .join(
            chain_df.where(F.col("exhausted") & (F.col("state") == F.lit(DELIVERED))), on=list(CHAIN_KEY), how="inner"
        )
        .withColumn("_n", F.row_number().over(latest_retry))
        .where(F.col("_n") == 1)
        .select("*", F.lit(POLICY_NOT_WRITTEN).alias("reason"), F.lit(None).cast("long").alias("dlq_timestamp"))
    )
    rows_df = dead_rows_df.unionByName(pending_df, allowMissingColumns=True)
    return rows_df.join(_redrive_states(redrives_df), on=["broker_name", "msg_id"], how="left").select(
        "group",
        "broker_name",
        "msg_id",
        "uniq_key",
        "origin_msg_id",
        "origin_topic",
        "reconsume_times",
        "first_failure_timestamp",
        "dlq_timestamp",
        "body",
        "properties",
        "attempts",
        "reason",
        "redrive_state",
    )


def _redrive_states(redrives_df: DataFrame) -> DataFrame:
    """Per dead letter: ``<state> <request_id>`` of its latest ``dlq_redrives`` row."""
    latest = F.max_by(
        F.concat_ws(" ", "state", "request_id"), F.struct("updated_timestamp", "state", "request_id")
    ).alias("redrive_state")
    return redrives_df.groupBy("broker_name", "msg_id").agg(latest)
