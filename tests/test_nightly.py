"""The nightly job: its summary transforms on hand-built frames, and one run on a real lake."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from jobs.lake_io import Lake
from jobs.nightly import NightlyConfig, build_broker_summary, build_topic_summary, run
from tests.helpers import assert_frames_equal

pytestmark = pytest.mark.spark

_LOG_COLUMNS = "broker_name string, segment long, topic string, queue_id int, store_size int, store_timestamp long"


def test_broker_summary_counts_messages_bytes_segments_and_topics(spark: SparkSession) -> None:
    log_df = spark.createDataFrame(
        [
            ("broker-a", 0, "Orders", 0, 100, 10),
            ("broker-a", 4096, "Orders", 1, 200, 30),
            ("broker-a", 4096, "Audit", 0, 50, 20),
            ("broker-b", 0, "Orders", 0, 70, 5),
        ],
        _LOG_COLUMNS,
    )
    expected_df = spark.createDataFrame(
        [("broker-a", 3, 350, 2, 2, 10, 30), ("broker-b", 1, 70, 1, 1, 5, 5)],
        "broker_name string, messages long, bytes long, segments long, topics long, "
        "first_store_timestamp long, last_store_timestamp long",
    )
    assert_frames_equal(build_broker_summary(log_df), expected_df)


def test_topic_summary_counts_queues_per_broker_not_per_queue_id(spark: SparkSession) -> None:
    log_df = spark.createDataFrame(
        [
            ("broker-a", 0, "Orders", 0, 100, 1),
            ("broker-b", 0, "Orders", 0, 100, 2),  # queue 0 on another broker is another queue
            ("broker-b", 0, "Orders", 0, 100, 3),
        ],
        _LOG_COLUMNS,
    )
    expected_df = spark.createDataFrame([("Orders", 3, 300, 2, 2)], "topic string, messages long, bytes long, "
                                        "queues long, brokers long")  # fmt: skip
    assert_frames_equal(build_topic_summary(log_df), expected_df)


@pytest.mark.slow
def test_nightly_on_empty_lake_writes_demo_workload_and_records_its_run(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_run = run(spark, NightlyConfig(tmp_path, demo_messages=1500, seed=3, engine="bridge"))
    out = capsys.readouterr().out

    assert job_run.status == "SUCCEEDED"
    assert job_run.row_counts["commitlog"] == 1500
    assert "commit log per broker" in out and "broker-b" in out
    runs = DeltaTable(str(tmp_path / "job_runs")).to_pyarrow_table().to_pylist()
    assert [(r["job"], r["status"], r["run_id"]) for r in runs] == [("nightly", "SUCCEEDED", job_run.run_id)]
    assert dict(runs[0]["row_counts"])["commitlog"] == 1500

    second = run(spark, NightlyConfig(tmp_path, demo_messages=1500, seed=3, engine="bridge"))
    assert second.row_counts["commitlog"] == 1500  # a lake with data gets no second demo workload
    assert Lake(spark, tmp_path, "bridge").read("job_runs").count() == 2
