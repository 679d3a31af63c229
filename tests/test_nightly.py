"""The nightly job: its summary transforms on hand-built frames, and one run on a real lake."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from jobs.lake import Lake
from jobs.nightly import STEPS, NightlyConfig, data_time, run
from schemas.catalog import CONSUMER_OFFSET_COMMITS, TABLES, spark_schema
from tests.helpers import ENGINE

pytestmark = [pytest.mark.spark, pytest.mark.both_engines]


def _data_versions(lake: Lake) -> dict[str, int | None]:
    return {name: lake.version(name) for name in TABLES if name != "job_runs"}


@pytest.mark.slow
def test_nightly_writes_a_demo_workload_runs_every_step_and_a_rerun_changes_no_table(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = NightlyConfig(
        tmp_path / "lake", demo_messages=1500, demo_transactions=20, seed=3, out=tmp_path / "report", engine=ENGINE
    )
    job_run = run(spark, config)
    out = capsys.readouterr().out
    lake = Lake(spark, tmp_path / "lake", ENGINE)

    assert job_run.status == "SUCCEEDED"
    assert "empty lake: wrote a demo workload" in out and "commit log per broker" in out
    assert f"report: {tmp_path / 'report' / 'report.html'}" in out
    assert (tmp_path / "report" / "report.html").stat().st_size > 10_000
    runs = [(r["job"], r["status"]) for r in lake.read("job_runs").orderBy("started_timestamp", "run_id").collect()]
    assert [job for job, _ in runs] == ["nightly", *STEPS]  # ordered by start
    assert all(status in ("SUCCEEDED", "NOOP") for _, status in runs)
    for name in ("consume_queue", "consumer_offsets", "transaction_state", "retry_chains", "dlq"):
        assert lake.read(name).count() > 0, name
    assert lake.read("dlq").count() >= 5  # the demo's always-failing messages
    before = _data_versions(lake)

    second = run(spark, NightlyConfig(tmp_path / "lake", out=tmp_path / "report", engine=ENGINE))

    assert second.status == "SUCCEEDED"
    assert _data_versions(lake) == before  # no new data: every step is a no-op
    statuses = [r["status"] for r in lake.read("job_runs").orderBy("started_timestamp", "run_id").collect()]
    assert statuses[len(STEPS) + 1 :] == ["SUCCEEDED", *["NOOP"] * len(STEPS)]  # the report is not drawn again

    (tmp_path / "blocked").write_text("a file where the report directory should be")
    with pytest.raises(Exception, match="blocked"):
        run(spark, NightlyConfig(tmp_path / "lake", out=tmp_path / "blocked", engine=ENGINE))
    assert "step report failed" in capsys.readouterr().out
    last = lake.read("job_runs").orderBy("started_timestamp", "run_id").collect()[-len(STEPS) - 1 :]
    assert [(r["job"], r["status"]) for r in last][:: len(STEPS)] == [("nightly", "FAILED"), ("report", "FAILED")]
    assert "step report failed" in (last[0]["message"] or "")
    assert _data_versions(lake) == before

    # new messages, read by one run; the next run compacts their files, and the steps see the same rows
    _send_orders(tmp_path / "lake", 40)
    assert run(spark, NightlyConfig(tmp_path / "lake", out=tmp_path / "report", engine=ENGINE)).status == "SUCCEEDED"
    files_before = len(DeltaTable(str(tmp_path / "lake" / "commitlog")).file_uris())
    units_before = lake.read("consume_queue").count()

    fourth = run(spark, NightlyConfig(tmp_path / "lake", out=tmp_path / "report", engine=ENGINE))

    assert fourth.status == "SUCCEEDED"
    last = lake.read("job_runs").orderBy("started_timestamp", "run_id").collect()[-len(STEPS) - 1 :]
    assert [(r["job"], r["status"]) for r in last] == [
        ("nightly", "SUCCEEDED"),
        ("compact_commitlog", "SUCCEEDED"),
        ("rebuild_consume_queue", "SUCCEEDED"),
        ("consumer_offsets", "NOOP"),
        ("resolve_transactions", "NOOP"),
        ("route_dlq", "NOOP"),
        ("report", "SUCCEEDED"),
    ]
    assert len(DeltaTable(str(tmp_path / "lake" / "commitlog")).file_uris()) < files_before
    assert lake.read("consume_queue").count() == units_before  # the rebuild only recorded the version


def _send_orders(lake: Path, messages: int) -> None:
    """Send ``messages`` single messages to Orders through the demo's brokers (a file each)."""
    from broker_model.client import Producer
    from broker_model.common import Message
    from broker_model.tools import start_brokers

    brokers = start_brokers(lake, 2, flush_mode="SYNC_FLUSH")
    try:
        producer = Producer(brokers, "nightly-test")
        for i in range(messages):
            producer.send(Message.create("Orders", f"late-{i}".encode()))
    finally:
        for broker in brokers:
            broker.shutdown()


def test_data_time_is_the_newest_row_time_from_the_log_statistics(spark: SparkSession, tmp_path: Path) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    assert data_time(lake) is None
    commits = spark.createDataFrame(
        [
            ("g", "broker-a", "T", 0, 5, 1_000, "consumer", None, None, None, None, None),
            ("g", "broker-a", "T", 1, 7, 3_000, "consumer", None, None, None, None, None),
        ],
        spark_schema(CONSUMER_OFFSET_COMMITS),
    )
    lake.append(CONSUMER_OFFSET_COMMITS, commits)
    assert data_time(lake) == 3_000
