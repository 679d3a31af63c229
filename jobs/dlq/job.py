"""The ``route_dlq`` job: retry chains per (group, original message) from the commit log, the ``dlq``
table of dead letters, and exhausted retries routed to their group's DLQ topic (each group's retry
policy as of T). Incremental and idempotent through ``job_runs``. See docs/jobs.md (route_dlq).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.common import constants as c
from jobs.cli import add_as_of, add_driver_limit, as_of_of, iso_utc, job_parser, run_spark_job, text_table
from jobs.dlq.decode import RETRY_SOURCE_COLUMNS, decode_retry_records
from jobs.dlq.reads import Outcome, compute_every_chain, move_on
from jobs.dlq.transforms import (
    CHAIN_KEY,
    POLICY_NOT_WRITTEN,
    PROPERTY_ROUTED_BY,
    RETRY,
    STATES,
    build_dlq,
    build_origin_hosts,
    build_origins,
    build_policies,
    build_retry_chains,
    build_retry_records,
    decoded_origins,
    with_chain_key,
)
from jobs.extract import DriverDecode, update_extract
from jobs.lake import Lake
from jobs.rules import build_current_offsets
from jobs.runs import CannotFold, JobRun, can_reuse, last_reusable, read_or_empty, recorded_run, table_versions
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
# up to this many retry records, every chain is computed on the driver, in Arrow: at 376,030
# records (a 1M-message lake of failing consumers) the full run took 5 s, the Spark joins 23 s;
# about 0.3 KB of driver memory a record, 300 MB at this limit (docs/jobs.md, route_dlq)
DRIVER_RECORDS = 1_000_000
DRIVER_DECODE = DriverDecode(RETRY_SOURCE_COLUMNS, decode_retry_records)  # small increments of retry_records


@dataclass(frozen=True)
class RouteDlqConfig:
    """Options of the job.

    Attributes:
        lake: the lake root.
        as_of: the time T, epoch milliseconds (with ``execute``, the time routing starts; the
            job moves it past the records it writes).
        execute: write the ``%DLQ%`` records of exhausted chains through their brokers.
        full: rebuild ``retry_records`` from the whole commit log when it is behind, and compute
            every chain instead of moving the previous tables on.
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.
        show: how many exhausted chains the summary lists, >= 0.
        driver_records: compute every chain on the driver while ``retry_records`` holds at most
            this many rows, >= 0 (0: always with Spark).

    Raises:
        ValidationError: ``show`` or ``driver_records`` below 0.
    """

    lake: Path
    as_of: int
    execute: bool = False
    full: bool = False
    engine: str = "auto"
    show: int = 20
    driver_records: int = DRIVER_RECORDS

    def __post_init__(self) -> None:
        if self.show < 0:
            raise ValidationError("show", self.show, "is below 0", "pass a value >= 0")
        if self.driver_records < 0:
            raise ValidationError("driver_records", self.driver_records, "is below 0", "pass a value >= 0")

    @property
    def parameters(self) -> str:
        """The settings that decide the output, at the start of the job_runs message."""
        return f"as_of={self.as_of}"


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

    The tables are the previous run's moved on by what changed since, when that gives what
    computing every chain gives (:mod:`jobs.dlq.fold`); else every chain is computed, on the
    driver while ``retry_records`` holds at most ``config.driver_records`` rows, else with Spark.

    Raises:
        LakeError: ``retry_records`` is ahead of the commit log (it was replaced), or a broker to
            route through cannot start (e.g. it is running elsewhere).

    Returns:
        The recorded run; ``row_counts`` has ``new_retry_records``, ``routed``, ``retry_chains``
        and ``dlq``.
    """
    lake = Lake(spark, config.lake, config.engine)
    as_of = config.as_of
    with recorded_run(lake, JOB, {"as_of": as_of}) as job_run:
        lake.add_missing_columns(SUBSCRIPTION_GROUP)  # a table an older release's broker created
        new = update_extract(
            lake, RETRY_RECORDS, APP_ID, build_retry_records, lake.version(COMMITLOG), config.full, DRIVER_DECODE
        )
        routed = 0
        if config.execute:
            routed = route_exhausted(lake, _candidates(lake, as_of, table_versions(lake, _INPUTS)))
            as_of = max(as_of, time.time_ns() // 1_000_000)
            job_run.parameters["as_of"] = as_of
            new += update_extract(
                lake, RETRY_RECORDS, APP_ID, build_retry_records, lake.version(COMMITLOG), driver=DRIVER_DECODE
            )
        job_run.input_versions = table_versions(lake, _INPUTS)
        outputs = table_versions(lake, [RETRY_CHAINS.name, DLQ.name])
        previous_run = last_reusable(lake, JOB) if len(outputs) == 2 else None
        if previous_run is not None and previous_run["output_versions"] != outputs:
            previous_run = None  # the outputs were written since: nothing to reuse or move on
        through: int | None
        if can_reuse(lake, previous_run, job_run.input_versions, [RETRY_CHAINS.name, DLQ.name], {"as_of": as_of}):
            assert previous_run is not None
            job_run.conclude("NOOP", "inputs unchanged, nothing written")
            job_run.output_versions = outputs
            through = previous_run["parameters"].get("through")
        else:
            job_run.output_versions, through, how = _compute_and_write(
                lake, job_run.input_versions, as_of, config, previous_run
            )
            job_run.conclude("SUCCEEDED", how)
        if through is not None:
            job_run.parameters["through"] = through
        job_run.row_counts.update({"new_retry_records": new, "routed": routed})
        summary = summarize(lake, job_run.output_versions, as_of, config.show)
        summary.routed = routed
        job_run.row_counts.update(
            {RETRY_CHAINS.name: sum(summary.chains.values()), DLQ.name: sum(summary.dead_letters.values())}
        )
        print("\n".join(format_summary(summary)))
        read = job_run.input_versions.get(RETRY_RECORDS.name)
        if read is not None:  # the next run reads the records appended after this version
            job_run.packs[RETRY_RECORDS.name] = read
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
    decoded_df = (
        decoded_origins(keys_df, hosts_df)
        .where(F.col("commit_log_offset").isNotNull())
        .select("broker_name", "commit_log_offset")
        .distinct()
    )
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


def _compute_and_write(
    lake: Lake,
    versions: Mapping[str, int],
    as_of: int,
    config: RouteDlqConfig,
    previous_run: Mapping[str, Any] | None,
) -> tuple[dict[str, int], int | None, str]:
    """Write ``retry_chains`` and ``dlq`` as of ``as_of``: (output versions, through, how)."""
    how = "retry_chains and dlq overwritten"
    if previous_run is not None and not config.full:
        try:
            moved = move_on(lake, previous_run, versions, as_of)
            kept = None if moved.dead_letters_changed else previous_run["output_versions"][DLQ.name]
            return _write_rows(lake, moved, kept), moved.through, "retry_chains and dlq moved on by what changed"
        except CannotFold as why:
            print(f"{JOB}: computing every chain again: {why}")
            how = f"computed in full: {why}"
    counted = versions.get(RETRY_RECORDS.name)
    if (lake.row_count(RETRY_RECORDS, counted) if counted is not None else 0) <= config.driver_records:
        outcome = compute_every_chain(lake, versions, as_of)
        return _write_rows(lake, outcome, None), outcome.through, how
    return _write_with_spark(lake, versions, as_of), _newest(lake, versions), how


def _write_rows(lake: Lake, outcome: Outcome, dlq_version: int | None) -> dict[str, int]:
    """Overwrite ``retry_chains`` with the outcome's rows, and ``dlq`` unless ``dlq_version`` keeps it."""
    chains_version = lake.overwrite_rows(RETRY_CHAINS, outcome.chains)
    if dlq_version is None:
        dlq_version = lake.overwrite_rows(DLQ, outcome.dead_letters)
    if chains_version is None or dlq_version is None:
        raise LakeError("an overwrite of retry_chains or dlq committed no version; run the job again")
    return {RETRY_CHAINS.name: chains_version, DLQ.name: dlq_version}


def _write_with_spark(lake: Lake, versions: Mapping[str, int], as_of: int) -> dict[str, int]:
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


def _newest(lake: Lake, versions: Mapping[str, int]) -> int | None:
    """The greatest store time of ``retry_records`` and commit time of ``consumer_offset_commits``
    (all topics: a bound of the retry queue commits) from the Delta log's statistics; -1 for none,
    None when a file lacks the statistic."""
    newest = -1
    for spec, column in ((RETRY_RECORDS, "store_timestamp"), (CONSUMER_OFFSET_COMMITS, "commit_timestamp")):
        version = versions.get(spec.name)
        if version is None or not lake.row_count(spec, version):
            continue
        value = lake.newest_value(spec, column, version, strict=True)
        if value is None:
            return None
        newest = max(newest, int(value))
    return newest


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
    from broker_model.broker import start_lake_brokers
    from schemas.errors import BrokerError

    routed = 0
    by_broker: dict[str, list[Mapping[str, Any]]] = {}
    for candidate in candidates:
        by_broker.setdefault(candidate["broker_name"], []).append(candidate)
    for broker_name, chains in sorted(by_broker.items()):
        try:
            broker = start_lake_brokers(lake.root, [broker_name])[broker_name]
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


def summarize(lake: Lake, versions: Mapping[str, int], as_of: int, show: int) -> RouteSummary:
    """Chains per state, dead letters per (group, reason), the ``show`` oldest exhausted chains."""
    columns = [*CHAIN_KEY, "origin_topic", "last_reconsume_times", "max_reconsume_times", "state", "exhausted"]
    chains = lake.read_rows(RETRY_CHAINS, [*columns, "first_failure_timestamp"], version=versions[RETRY_CHAINS.name])
    dead = lake.read_rows(DLQ, ["group", "reason"], version=versions[DLQ.name])
    summary = RouteSummary(as_of)
    summary.chains = dict(Counter(chains.column("state").to_pylist()))
    pairs = zip(dead.column("group").to_pylist(), dead.column("reason").to_pylist(), strict=True)
    summary.dead_letters = dict(Counter(pairs))
    exhausted = chains.filter(pc.field("exhausted"))
    summary.exhausted_total = exhausted.num_rows
    if show:
        order = [("first_failure_timestamp", "ascending"), *((k, "ascending") for k in CHAIN_KEY)]
        summary.exhausted = exhausted.sort_by(order).slice(0, show).to_pylist()
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
    add_as_of(parser)
    parser.add_argument(
        "--execute",
        action="store_true",
        help="write the %%DLQ%% records of exhausted chains through their brokers (stop them first)",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="rebuild retry_records from the whole commit log and compute every chain",
    )
    parser.add_argument("--show", type=int, default=20, help="exhausted chains to list (default 20)")
    add_driver_limit(parser, "--driver-records", DRIVER_RECORDS, "retry records")
    return parser


def build_config(argv: Sequence[str] | None = None) -> RouteDlqConfig:
    """The config of ``argv``.

    Raises:
        ValidationError: a bad ``--as-of``, ``--as-of`` with ``--execute``, or a bad ``--show`` or
            ``--driver-records``.
    """
    args = build_parser().parse_args(argv)
    if args.execute and args.as_of is not None:
        raise ValidationError(
            "--as-of", args.as_of, "cannot be combined with --execute", "route the log as it is now: leave out --as-of"
        )
    as_of = as_of_of(args.as_of)
    return RouteDlqConfig(Path(args.lake), as_of, args.execute, args.full, args.engine, args.show, args.driver_records)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` before starting Spark, then run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
