"""The ``route_dlq`` job: retry chains, the ``dlq`` table, and each group's retry policy, as of T.

A consumer that fails on a message sends it back (ROCKETMQ_FACTS section 7.3): the broker stores
a copy with ``reconsume_times + 1`` that waits in ``SCHEDULE_TOPIC_XXXX`` (``REAL_TOPIC`` =
``%RETRY%<group>``) until its delay level's time, is then delivered to ``%RETRY%<group>``, and
when the count reached the limit goes to ``%DLQ%<group>`` instead. Every copy keeps
``ORIGIN_MESSAGE_ID`` (the offset message id of the first stored copy) and ``RETRY_TOPIC`` (the
topic it was sent to), so the copies of one message for one group form a chain keyed by
(``group``, ``origin_msg_id``).

- ``retry_records``: the send-back records, decoded once, appended per new commit log version
  (:mod:`jobs.extract`): SCHEDULED (waiting in the schedule topic), RETRY (delivered to the retry
  topic), DLQ (a dead letter). Bodies and properties are kept for RETRY and DLQ records only.
- ``retry_chains``: one row per chain as of T: the original and every delivered retry as
  ``attempts`` (oldest first), where the latest send-back record is (``state``: SCHEDULED,
  DELIVERED, CONSUMED when the group's committed offset of its retry queue passed it, DEAD), the
  group's ``retry_max_times`` as of T (``subscription_group``, default 16) and ``exhausted``:
  not DEAD although ``last_reconsume_times`` reached that limit (the policy was lowered, or the
  consumer is gone).
- ``dlq``: one row per dead letter record, with its chain's attempts and first failure time.
  ``reason``: ``POLICY`` when this job wrote it (property ``DLQ_ROUTED_BY``);
  ``MAX_RECONSUME_TIMES`` when the failed copy's count (``reconsume_times - 1``) reached the
  group's limit; else ``CONSUMER_REQUESTED`` (a negative delay level, or a client limit below the
  group's). Exhausted chains whose latest copy was delivered and not consumed are listed too, with
  ``reason`` ``POLICY_NOT_WRITTEN``, the retry record's ids and no ``dlq_timestamp``, until a run
  with ``--execute`` writes their ``%DLQ%`` records. ``redrive_state`` is the latest
  ``dlq_redrives`` row of the dead letter (``SENT <request>`` or ``PENDING <request>``).

Only records stored at or before T count; offsets and group settings as of T.

``--execute`` routes the exhausted, delivered, unconsumed chains: for each of their brokers it
starts that broker in this process (its broker name lock keeps a running broker out, so stop it
first), skips a chain whose ``%DLQ%`` record the broker already holds, and sends the latest retry
record back with a negative delay level and ``DLQ_ROUTED_BY=route_dlq``: once per chain, whatever
crashes in between, since the next run finds the record in the log. T is then the time after
the routing (``--as-of`` is refused with ``--execute``).

Idempotence: ``job_runs`` keeps the input versions and T; a run with the same inputs and T while
both output tables are at the versions that run left writes nothing (NOOP). Inputs at later
versions that only commits changing no row reached (a compaction) are the same inputs
(:func:`jobs.runs.same_inputs`).
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from broker_model.common import constants as c
from broker_model.common import create_msg_id, parse_host
from jobs.cli import as_of_of, iso_utc, job_parser, run_spark_job, text_table
from jobs.extract import update_extract
from jobs.lake import Lake
from jobs.rules import build_current_offsets
from jobs.runs import JobRun, latest_reusable_run, read_or_empty, record_run, same_inputs, table_versions
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUMER_OFFSET_COMMITS,
    DLQ,
    DLQ_REDRIVES,
    RETRY_CHAINS,
    RETRY_RECORDS,
    SUBSCRIPTION_GROUP,
    spark_schema,
)
from schemas.errors import LakeError, ValidationError

JOB = "route_dlq"
APP_ID = JOB  # application transaction id of retry_records: the commit log version read
SCHEDULED, RETRY, DEAD_LETTER = "SCHEDULED", "RETRY", "DLQ"  # retry_records kinds
DELIVERED, CONSUMED, DEAD = "DELIVERED", "CONSUMED", "DEAD"  # chain states besides SCHEDULED
STATES = (SCHEDULED, DELIVERED, CONSUMED, DEAD)
MAX_RECONSUME_TIMES, CONSUMER_REQUESTED, POLICY, POLICY_NOT_WRITTEN = (
    "MAX_RECONSUME_TIMES",
    "CONSUMER_REQUESTED",
    "POLICY",
    "POLICY_NOT_WRITTEN",
)
REASONS = (MAX_RECONSUME_TIMES, CONSUMER_REQUESTED, POLICY, POLICY_NOT_WRITTEN)
PROPERTY_ROUTED_BY = "DLQ_ROUTED_BY"  # on a %DLQ% record a tool wrote on the group's behalf
CHAIN_KEY = ("group", "origin_msg_id")
_KIND_RANK = {SCHEDULED: 0, RETRY: 1, DEAD_LETTER: 2}  # order of the copies of one reconsume count
_PARAMETERS = re.compile(r"^(as_of=-?\d+)(?:;|$)")


@dataclass(frozen=True)
class RouteDlqConfig:
    """Options of the job.

    Attributes:
        lake: the lake root.
        as_of: the time T, epoch milliseconds (with ``execute``, the time routing starts; the
            job moves it past the records it writes).
        execute: write the ``%DLQ%`` records of exhausted chains through their brokers.
        full: rebuild ``retry_records`` from the whole commit log when it is behind.
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.
        show: how many exhausted chains the summary lists, >= 0.

    Raises:
        ValidationError: ``show`` below 0.
    """

    lake: Path
    as_of: int
    execute: bool = False
    full: bool = False
    engine: str = "auto"
    show: int = 20

    def __post_init__(self) -> None:
        if self.show < 0:
            raise ValidationError("show", self.show, "is below 0", "pass a value >= 0")

    @property
    def parameters(self) -> str:
        """The settings that decide the output, at the start of the job_runs message."""
        return f"as_of={self.as_of}"


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------


def _property(name: str) -> Column:
    return F.try_element_at(F.col("properties"), F.lit(name))


def build_retry_records(commitlog_df: DataFrame) -> DataFrame:
    """The ``retry_records`` rows of commit log rows: their send-back records, decoded.

    One pass, no shuffle. SCHEDULED: a record of the schedule topic whose ``REAL_TOPIC`` is a
    retry topic; RETRY: a record of a ``%RETRY%`` topic; DLQ: a record of a ``%DLQ%`` topic.
    ``group`` is the topic (or ``REAL_TOPIC``) without its prefix; ``origin_msg_id`` and
    ``origin_topic`` are ``ORIGIN_MESSAGE_ID`` and ``RETRY_TOPIC`` (null when absent or blank);
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
    group = F.regexp_replace(target, r"^%(RETRY|DLQ)%", "")
    kept = F.col("kind") != F.lit(SCHEDULED)
    return (
        commitlog_df.select("*", kind.alias("kind"))
        .where(F.col("kind").isNotNull())
        .select(
            "kind",
            group.alias("group"),
            "broker_name",
            "topic",
            "queue_id",
            "queue_offset",
            "commit_log_offset",
            "msg_id",
            "uniq_key",
            "keys",
            F.nullif(F.trim(_property(c.PROPERTY_ORIGIN_MESSAGE_ID)), F.lit("")).alias("origin_msg_id"),
            F.nullif(F.trim(_property(c.PROPERTY_RETRY_TOPIC)), F.lit("")).alias("origin_topic"),
            "reconsume_times",
            "born_timestamp",
            "store_timestamp",
            F.when(F.col("kind") == F.lit(DEAD_LETTER), _property(PROPERTY_ROUTED_BY)).alias("routed_by"),
            F.when(kept, F.col("body")).alias("body"),
            F.when(kept, F.col("properties")).alias("properties"),
        )
        .select(*RETRY_RECORDS.column_names)
    )


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
    rank = F.create_map(*[F.lit(x) for pair in _KIND_RANK.items() for x in pair])[F.col("kind")]
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
    decoded_df = _decoded_origins(chain_keys_df, hosts_df)
    attempt = F.struct(
        "broker_name", "topic", "commit_log_offset", F.lit(0).cast("int").alias("reconsume_times"), "store_timestamp"
    )
    return decoded_df.join(originals_df, on=["broker_name", "commit_log_offset"], how="inner").select(
        *CHAIN_KEY, attempt.alias("origin")
    )


def _decoded_origins(chain_keys_df: DataFrame, hosts_df: DataFrame) -> DataFrame:
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
    """The ``dlq`` table as of ``as_of`` (module docstring).

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


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


@dataclass
class RouteSummary:
    """What a run prints."""

    as_of: int
    chains: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    exhausted: list[dict[str, Any]] = field(default_factory=list)
    exhausted_total: int = 0
    routed: int = 0


def run(spark: SparkSession, config: RouteDlqConfig) -> JobRun:
    """Update ``retry_records``, route when asked, compute ``retry_chains`` and ``dlq`` as of T,
    print the summary, record the run (module docstring).

    Raises:
        LakeError: ``retry_records`` is ahead of the commit log (it was replaced), or a broker to
            route through cannot start (e.g. it is running elsewhere).

    Returns:
        The recorded run; ``row_counts`` has ``new_retry_records``, ``routed``, ``retry_chains``
        and ``dlq``.
    """
    lake = Lake(spark, config.lake, config.engine)
    job_run = JobRun(JOB)
    as_of = config.as_of
    try:
        new = update_extract(lake, RETRY_RECORDS, APP_ID, build_retry_records, lake.version(COMMITLOG), config.full)
        routed = 0
        if config.execute:
            routed = route_exhausted(lake, _candidates(lake, as_of, table_versions(lake, _INPUTS)))
            as_of = max(as_of, time.time_ns() // 1_000_000)
            new += update_extract(lake, RETRY_RECORDS, APP_ID, build_retry_records, lake.version(COMMITLOG))
        job_run.input_versions = table_versions(lake, _INPUTS)
        parameters = f"as_of={as_of}"
        reused = _reusable_run(lake, job_run.input_versions, parameters)
        if reused is None:
            job_run.output_versions = _compute_and_write(lake, job_run.input_versions, as_of)
        else:
            job_run.output_versions = reused
        job_run.row_counts.update({"new_retry_records": new, "routed": routed})
        summary = summarize(lake, job_run.output_versions, as_of, config.show)
        summary.routed = routed
        job_run.row_counts.update(
            {RETRY_CHAINS.name: sum(summary.chains.values()), DLQ.name: sum(summary.dead_letters.values())}
        )
        print("\n".join(format_summary(summary)))
    except Exception as err:
        record_run(lake, job_run.finish("FAILED", f"as_of={as_of}; {type(err).__name__}: {err}"))
        raise
    status = "NOOP" if reused is not None else "SUCCEEDED"
    done = "inputs unchanged, nothing written" if reused is not None else "retry_chains and dlq overwritten"
    record_run(lake, job_run.finish(status, f"{parameters}; {done}"))
    return job_run


_INPUTS = [
    COMMITLOG.name,
    RETRY_RECORDS.name,
    SUBSCRIPTION_GROUP.name,
    CONSUMER_OFFSET_COMMITS.name,
    BROKERS.name,
    DLQ_REDRIVES.name,
]


def _frames(lake: Lake, versions: Mapping[str, int], as_of: int) -> tuple[DataFrame, DataFrame]:
    """``retry_records`` (persisted by the caller) and ``retry_chains`` as of ``as_of``."""
    records_df = read_or_empty(lake, RETRY_RECORDS, versions).persist(StorageLevel.MEMORY_AND_DISK)
    policies_df = build_policies(read_or_empty(lake, SUBSCRIPTION_GROUP, versions), as_of)
    offsets_df = build_current_offsets(read_or_empty(lake, CONSUMER_OFFSET_COMMITS, versions), as_of)
    origins_df = _origins(lake, versions, records_df, as_of)
    return records_df, build_retry_chains(records_df, policies_df, offsets_df, origins_df, as_of)


def _origins(lake: Lake, versions: Mapping[str, int], records_df: DataFrame, as_of: int) -> DataFrame:
    """The chains' original records, reading only the commit log segments that can hold them."""
    spark = lake.spark
    empty = spark.createDataFrame([], f"group string, origin_msg_id string, origin {_ATTEMPT_DDL}")
    if BROKERS.name not in versions or COMMITLOG.name not in versions:
        return empty
    brokers = [
        (r["broker_name"], r["store_host"], r["segment_size"])
        for r in lake.read(BROKERS, version=versions[BROKERS.name])
        .groupBy("broker_name")
        .agg(
            F.max_by("store_host", "started_timestamp").alias("store_host"),
            F.max_by("segment_size", "started_timestamp").alias("segment_size"),
        )
        .collect()
    ]
    hosts_df = build_origin_hosts([(name, host) for name, host, _ in brokers], spark)
    keys_df = with_chain_key(records_df.where(F.col("store_timestamp") <= F.lit(as_of))).select(*CHAIN_KEY).distinct()
    sizes = {name: size for name, _, size in brokers}
    decoded_df = _decoded_origins(keys_df, hosts_df).select("broker_name", "commit_log_offset").distinct()
    segments = {
        (r["broker_name"], r["commit_log_offset"] - r["commit_log_offset"] % sizes[r["broker_name"]])
        for r in decoded_df.collect()
    }
    if not segments:
        return empty
    filter_ = {"broker_name": sorted({b for b, _ in segments}), "segment": sorted({s for _, s in segments})}
    originals_df = lake.read(COMMITLOG, version=versions[COMMITLOG.name], partition_filter=filter_).select(
        "broker_name", "commit_log_offset", "topic", "store_timestamp"
    )
    return build_origins(originals_df, keys_df, hosts_df)


_ATTEMPT_DDL = (
    "struct<broker_name: string, topic: string, commit_log_offset: bigint, reconsume_times: int, "
    "store_timestamp: bigint>"
)


def _compute_and_write(lake: Lake, versions: Mapping[str, int], as_of: int) -> dict[str, int]:
    records_df, chains_df = _frames(lake, versions, as_of)
    chains_df = chains_df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        chains_version = lake.overwrite(RETRY_CHAINS, chains_df)
        redrives_df = read_or_empty(lake, DLQ_REDRIVES, versions)
        dlq_version = lake.overwrite(DLQ, build_dlq(records_df, chains_df, redrives_df, as_of))
    finally:
        chains_df.unpersist()
        records_df.unpersist()
    if chains_version is None or dlq_version is None:
        raise LakeError("an overwrite of retry_chains or dlq committed no version; run the job again")
    return {RETRY_CHAINS.name: chains_version, DLQ.name: dlq_version}


def _candidates(lake: Lake, as_of: int, versions: Mapping[str, int]) -> list[dict[str, Any]]:
    """The exhausted, delivered chains with their latest retry record, as of ``as_of``."""
    records_df, chains_df = _frames(lake, versions, as_of)
    try:
        pending_df = build_dlq(
            records_df, chains_df, records_df.sparkSession.createDataFrame([], spark_schema(DLQ_REDRIVES)), as_of
        ).where(F.col("reason") == F.lit(POLICY_NOT_WRITTEN))
        rows = (
            pending_df.join(
                records_df.where(F.col("kind") == F.lit(RETRY)).select("broker_name", "msg_id", "commit_log_offset"),
                on=["broker_name", "msg_id"],
                how="inner",
            )
            .select("group", "broker_name", "msg_id", "origin_msg_id", "commit_log_offset")
            .collect()
        )
    finally:
        records_df.unpersist()
    return [row.asDict() for row in rows]


def route_exhausted(lake: Lake, candidates: Sequence[Mapping[str, Any]]) -> int:
    """Write the ``%DLQ%`` record of every candidate chain through its broker, started here; the
    number written. A chain whose ``%DLQ%<group>`` queue already holds a record with its origin id
    is skipped (it was routed by a run that stopped before its outputs, or by its consumer).

    Raises:
        LakeError: a broker cannot start (another process holds its name).
    """
    from broker_model.broker import Broker, BrokerConfig
    from schemas.errors import BrokerError

    routed = 0
    by_broker: dict[str, list[Mapping[str, Any]]] = {}
    for candidate in candidates:
        by_broker.setdefault(candidate["broker_name"], []).append(candidate)
    hosts = _store_hosts(lake)
    for broker_name, chains in sorted(by_broker.items()):
        config = BrokerConfig(lake.root, broker_name, hosts[broker_name], flush_mode="SYNC_FLUSH")
        try:
            broker = Broker(config).start()
        except BrokerError as err:
            raise LakeError(f"cannot route through broker {broker_name!r}: {err}; stop it and run again") from err
        try:
            for chain in chains:
                if chain["origin_msg_id"] in _dead_origins(broker, chain["group"]):
                    continue
                broker.consumer_send_back(
                    chain["group"], chain["commit_log_offset"], delay_level=-1, properties={PROPERTY_ROUTED_BY: JOB}
                )
                routed += 1
        finally:
            broker.shutdown()
    return routed


def _dead_origins(broker: Any, group: str) -> set[str]:
    """Origin ids (or uniq keys) of the records in the broker's ``%DLQ%<group>`` queue."""
    topic = c.DLQ_GROUP_TOPIC_PREFIX + group
    found: set[str] = set()
    for offset in range(broker.store.min_offset(topic, 0), broker.store.max_offset(topic, 0)):
        message = broker.store.message_at(topic, 0, offset, decompress=False)
        if message is not None:
            origin = message.properties.get(c.PROPERTY_ORIGIN_MESSAGE_ID) or message.uniq_key or message.msg_id
            found.add(origin)
    return found


def _store_hosts(lake: Lake) -> dict[str, str]:
    rows = lake.read(BROKERS).groupBy("broker_name").agg(F.max_by("store_host", "started_timestamp").alias("host"))
    return {row["broker_name"]: row["host"] for row in rows.collect()}


def _reusable_run(lake: Lake, input_versions: Mapping[str, int], parameters: str) -> dict[str, int] | None:
    """The output versions of the latest reusable run with these inputs and T, when both outputs
    are still at those versions; else None."""
    current = table_versions(lake, [RETRY_CHAINS.name, DLQ.name])
    previous = latest_reusable_run(lake, JOB) if len(current) == 2 else None
    if previous is None:
        return None
    found = _PARAMETERS.match(previous["message"] or "")
    same = same_inputs(lake, previous["input_versions"], input_versions) and previous["output_versions"] == current
    return current if same and found is not None and found.group(1) == parameters else None


def summarize(lake: Lake, versions: Mapping[str, int], as_of: int, show: int) -> RouteSummary:
    """Chains per state, dead letters per (group, reason), the ``show`` oldest exhausted chains."""
    chains_df = lake.read(RETRY_CHAINS, version=versions[RETRY_CHAINS.name])
    dlq_df = lake.read(DLQ, version=versions[DLQ.name])
    summary = RouteSummary(as_of)
    summary.chains = {r["state"]: int(r["count"]) for r in chains_df.groupBy("state").count().collect()}
    summary.dead_letters = {
        (r["group"], r["reason"]): int(r["count"]) for r in dlq_df.groupBy("group", "reason").count().collect()
    }
    exhausted_df = chains_df.where(F.col("exhausted"))
    summary.exhausted_total = exhausted_df.count()
    if show:
        summary.exhausted = [
            r.asDict() for r in exhausted_df.orderBy("first_failure_timestamp", *CHAIN_KEY).limit(show).collect()
        ]
    return summary


def format_summary(summary: RouteSummary) -> list[str]:
    """The lines a run prints."""
    total = sum(summary.chains.values())
    lines = [f"retry chains as of {iso_utc(summary.as_of)} ({summary.as_of}): {total}"]
    lines += text_table([(state, str(summary.chains.get(state, 0))) for state in STATES])
    lines.append(f"dead letters: {sum(summary.dead_letters.values())}")
    if summary.dead_letters:
        rows = sorted(summary.dead_letters.items())
        lines += text_table([("#Group", "#Reason", "#Count"), *((g, r, str(n)) for (g, r), n in rows)])
    if summary.routed:
        lines.append(f"routed to %DLQ% by this run: {summary.routed}")
    hint = " (run with --execute to write their %DLQ% records)" if summary.exhausted_total else ""
    lines.append(f"exhausted, not dead-lettered: {summary.exhausted_total}{hint}")
    if summary.exhausted:
        header = ("#Group", "#Origin Msg Id", "#Topic", "#Reconsumed", "#Max", "#State", "#First Failure")
        lines += text_table(
            [
                header,
                *(
                    (
                        r["group"],
                        r["origin_msg_id"],
                        r["origin_topic"] or "-",
                        str(r["last_reconsume_times"]),
                        str(r["max_reconsume_times"]),
                        r["state"],
                        iso_utc(r["first_failure_timestamp"]),
                    )
                    for r in summary.exhausted
                ),
            ]
        )
    return lines


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options of ``route_dlq``."""
    parser = job_parser(JOB, __doc__)
    parser.add_argument("--as-of", help="time T: epoch ms or ISO-8601 with a zone (default: now)")
    parser.add_argument(
        "--execute",
        action="store_true",
        help="write the %%DLQ%% records of exhausted chains through their brokers (stop them first)",
    )
    parser.add_argument("--full", action="store_true", help="rebuild retry_records from the whole commit log")
    parser.add_argument("--show", type=int, default=20, help="exhausted chains to list (default 20)")
    return parser


def build_config(argv: Sequence[str] | None = None) -> RouteDlqConfig:
    """The config of ``argv``.

    Raises:
        ValidationError: a bad ``--as-of``, ``--as-of`` with ``--execute``, or a bad ``--show``.
    """
    args = build_parser().parse_args(argv)
    if args.execute and args.as_of is not None:
        raise ValidationError(
            "--as-of", args.as_of, "cannot be combined with --execute", "route the log as it is now: leave out --as-of"
        )
    as_of = as_of_of(args.as_of)
    return RouteDlqConfig(Path(args.lake), as_of, args.execute, args.full, args.engine, args.show)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` before starting Spark, then run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
