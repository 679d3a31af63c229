"""The broker (online) and the Spark jobs (batch) agree on one seeded workload.

A 10,000-message workload over two brokers with consumer groups that commit at random points
(some queues never consumed); then ``rebuild_consume_queue`` and ``consumer_offsets`` are checked
against what the broker itself reports (pull bounds, ``query_offset``, entry store times) and
against an independent recomputation from the commit log in this test.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_model.broker import Broker, BrokerConfig
from broker_model.common import constants as c
from broker_model.common import java_string_hash
from broker_model.tools import run_workload
from jobs.consumer_offsets import ConsumerOffsetsConfig
from jobs.consumer_offsets import run as run_offsets
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as run_rebuild
from tests.helpers import ENGINE

pytestmark = [pytest.mark.spark, pytest.mark.slow]
BROKERS = ("broker-a", "broker-b")


def _rows(lake: Path, table: str) -> list[dict[str, Any]]:
    return DeltaTable(str(lake / table)).to_pyarrow_table().to_pylist()


def _expected_queue(lake: Path) -> dict[tuple[str, str, int, int], tuple[int, int, int, int]]:
    """(broker, topic, queue, queue offset) -> (commit log offset, size, tags code, store time),
    recomputed from the commit log with RocketMQ's dispatch rule."""
    entries = {}
    for row in sorted(_rows(lake, "commitlog"), key=lambda r: (r["broker_name"], r["commit_log_offset"])):
        if row["sys_flag"] & c.TRANSACTION_ROLLBACK_TYPE not in (c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE):
            continue
        code = java_string_hash(row["tags"]) if row["tags"] else 0
        delay = dict(row["properties"]).get(c.PROPERTY_DELAY_TIME_LEVEL)
        if row["topic"] == c.SCHEDULE_TOPIC and delay and int(delay) > 0:
            code = row["store_timestamp"] + c.DELAY_LEVEL_MILLIS[min(int(delay), c.MAX_DELAY_LEVEL) - 1]
        key = (row["broker_name"], row["topic"], row["queue_id"], row["queue_offset"])
        entries[key] = (row["commit_log_offset"], row["store_size"], code, row["store_timestamp"])
    return entries


def _offsets_as_of(lake: Path, as_of: int) -> dict[tuple[str, str, str, int], int]:
    latest: dict[tuple[str, str, str, int], tuple[int, int]] = {}
    for row in _rows(lake, "consumer_offset_commits"):
        key = (row["group"], row["broker_name"], row["topic"], row["queue_id"])
        if row["commit_timestamp"] <= as_of and (key not in latest or row["commit_timestamp"] > latest[key][1]):
            latest[key] = (row["offset"], row["commit_timestamp"])
    return {key: value[0] for key, value in latest.items()}


def test_jobs_agree_with_the_broker_and_an_independent_recomputation(spark: SparkSession, tmp_path: Path) -> None:
    report = run_workload(tmp_path, 10_000, seed=33, brokers=2, threads=4, segment_size=256 * 1024)
    assert report.messages == 10_000 and sum(report.consumed.values()) > 0
    as_of = time.time_ns() // 1_000_000
    run_rebuild(spark, RebuildConfig(tmp_path, engine=ENGINE))
    run_offsets(spark, ConsumerOffsetsConfig(tmp_path, as_of, engine=ENGINE))

    # 1. consume queue = the recomputation, and its bounds = the broker's pull bounds
    expected = _expected_queue(tmp_path)
    built = {
        (r["broker_name"], r["topic"], r["queue_id"], r["queue_offset"]): (
            r["commit_log_offset"],
            r["store_size"],
            r["tags_code"],
            r["store_timestamp"],
        )
        for r in _rows(tmp_path, "consume_queue")
    }
    assert built == expected
    sizes: dict[tuple[str, str, int], int] = defaultdict(int)
    for broker_name, topic, queue_id, _ in built:
        sizes[(broker_name, topic, queue_id)] += 1
    assert _rows(tmp_path, "consume_queue_integrity") == []

    brokers = {name: Broker(BrokerConfig(tmp_path, name)).start() for name in BROKERS}
    try:
        for (broker_name, topic, queue_id), count in sizes.items():
            pulled = brokers[broker_name].pull(topic, queue_id, 0, max_msgs=1)
            assert (pulled.min_offset, pulled.max_offset) == (0, count), (broker_name, topic, queue_id)

        # 2. consumer offsets = the broker's query_offset, lag from the broker's own bounds
        offsets_rows = _rows(tmp_path, "consumer_offsets")
        lag = {(r["group"], r["broker_name"], r["topic"], r["queue_id"]): r for r in offsets_rows}
        committed = _offsets_as_of(tmp_path, as_of)
        assert committed and set(committed) <= set(lag)
        for (group, broker_name, topic, queue_id), offset in committed.items():
            broker = brokers[broker_name]
            row = lag[(group, broker_name, topic, queue_id)]
            assert row["consumer_offset"] == offset == broker.query_offset(group, topic, queue_id)
            assert row["broker_offset"] == broker.store.max_offset(topic, queue_id)
            assert row["diff"] == row["broker_offset"] - offset
            last = broker.store.store_timestamp(topic, queue_id, offset - 1) if offset > 0 else None
            assert row["last_timestamp"] == last
            assert row["anomaly"] is None
        never = [k for k, r in lag.items() if r["consumer_offset"] is None]
        assert never, "some queues of consumed topics are never consumed"
        assert all(lag[k]["diff"] == lag[k]["broker_offset"] for k in never)
    finally:
        for broker in brokers.values():
            broker.shutdown()

    # 3. rerunning both jobs on the same input commits nothing
    versions = {t: DeltaTable(str(tmp_path / t)).version() for t in ("consume_queue", "consumer_offsets")}
    run_rebuild(spark, RebuildConfig(tmp_path, engine=ENGINE))
    run_offsets(spark, ConsumerOffsetsConfig(tmp_path, as_of, engine=ENGINE))
    assert {t: DeltaTable(str(tmp_path / t)).version() for t in versions} == versions


def test_lag_as_of_a_past_time_is_what_the_commit_history_said_then(spark: SparkSession, tmp_path: Path) -> None:
    run_workload(tmp_path, 3_000, seed=34, brokers=2, threads=2, segment_size=256 * 1024)
    times = sorted({r["commit_timestamp"] for r in _rows(tmp_path, "consumer_offset_commits")})
    assert len(times) > 3
    past = times[len(times) // 2]
    run_rebuild(spark, RebuildConfig(tmp_path, engine=ENGINE))
    run_offsets(spark, ConsumerOffsetsConfig(tmp_path, past, engine=ENGINE))
    committed = _offsets_as_of(tmp_path, past)
    lag = {(r["group"], r["broker_name"], r["topic"], r["queue_id"]): r for r in _rows(tmp_path, "consumer_offsets")}
    assert {k: r["consumer_offset"] for k, r in lag.items() if r["consumer_offset"] is not None} == committed
    assert all(r["as_of"] == past for r in lag.values())
