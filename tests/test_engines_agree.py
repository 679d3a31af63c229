"""The two engines on one broker workload: the nightly run on the bridge and on delta-spark writes
the same rows into every table, and each table, whichever engine wrote it, reads the same through
the bridge, delta-spark and delta-rs, at the protocol docs/lake.md#table-features lists.

Needs the Delta jars (both engines in one session), so it runs in the delta-spark leg of the
test matrix.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_model.tools import run_workload
from jobs.lake import Lake
from jobs.nightly import NightlyConfig
from jobs.nightly import run as nightly
from schemas.catalog import JOB_RUNS, TABLES
from tests.helpers import canonical_rows, job_statuses

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.engine("delta-spark")]
ENGINES = ("bridge", "delta-spark")
# what differs between two runs of the same job by design: the runs' ids, clocks and the files they wrote
PER_RUN_COLUMNS = {"run_id", "started_timestamp", "finished_timestamp", "duration_ms", "message"}


def _rows(lake: Lake, name: str) -> list[object]:
    frame = lake.read(name)
    return canonical_rows(frame.drop(*(c for c in frame.columns if c in PER_RUN_COLUMNS)).toArrow())


def test_the_nightly_on_either_engine_writes_the_same_tables_and_every_reader_reads_them_alike(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    run_workload(source, 1500, 5, consumers=True, transactions=20, retries=True)
    for engine in ENGINES:
        shutil.copytree(source, tmp_path / engine)
        config = NightlyConfig(tmp_path / engine, out=tmp_path / f"report-{engine}", engine=engine)
        assert nightly(spark, config).status == "SUCCEEDED"

    written = 0
    for name in TABLES:
        by_writer = {}
        for writer in ENGINES:
            location = Lake(spark, tmp_path / writer, writer).location(name)
            if not (location / "_delta_log").exists():
                continue
            protocol = DeltaTable(str(location)).protocol()
            assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), (name, writer)
            assert not protocol.reader_features and not protocol.writer_features, (name, writer)
            readers = {reader: _rows(Lake(spark, tmp_path / writer, reader), name) for reader in ENGINES}
            arrow = DeltaTable(str(location)).to_pyarrow_table()
            readers["delta-rs"] = canonical_rows(arrow.drop([c for c in arrow.column_names if c in PER_RUN_COLUMNS]))
            assert readers["bridge"] == readers["delta-spark"] == readers["delta-rs"], (name, writer)
            by_writer[writer] = readers["bridge"]
        assert len(by_writer) in (0, 2), name  # a table one engine wrote, the other wrote too
        if by_writer:
            written += 1
            if name == JOB_RUNS.name:  # the runs differ in their report folders and figures: which ran, and how
                by_writer = {writer: job_statuses(Lake(spark, tmp_path / writer, writer)) for writer in ENGINES}
            assert by_writer["bridge"] == by_writer["delta-spark"], name
    assert written >= 12  # the broker's tables and every job's
