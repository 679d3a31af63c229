"""``job_runs`` keeps a run's parameters as data: recorded by :func:`recorded_run`, read back typed
by :func:`previous_run`; a lake from before the ``parameters`` column gains it, and its old
runs count as runs with no parameters (the full-run case)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from jobs.consumer_offsets import ConsumerOffsetsConfig
from jobs.consumer_offsets import run as consumer_offsets
from jobs.lake import Lake
from jobs.runs import CannotFold, last_reusable, recorded_run
from schemas.catalog import CONSUME_QUEUE, CONSUMER_OFFSET_COMMITS, CONSUMER_OFFSETS, JOB_RUNS, spark_schema
from tests.helpers import ENGINE

pytestmark = pytest.mark.spark

_AS_OF = 5_000


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path) -> Lake:
    return Lake(spark, tmp_path, ENGINE)


def test_a_run_records_its_parameters_and_they_read_back_typed(lake: Lake) -> None:
    with recorded_run(lake, "probe", {"as_of": 7, "page": "/tmp/r.html", "full": False}) as job_run:
        job_run.parameters["through"] = -1
        job_run.conclude("NOOP", "nothing to do")

    previous = last_reusable(lake, "probe")
    assert previous is not None
    assert previous["parameters"] == {"as_of": 7, "page": "/tmp/r.html", "full": False, "through": -1}
    assert (previous["status"], previous["message"]) == ("NOOP", "nothing to do")


def test_a_failed_run_is_recorded_with_what_it_was_doing_and_the_error(lake: Lake) -> None:
    with pytest.raises(CannotFold, match="no way"), recorded_run(lake, "probe", {"as_of": 1}) as job_run:
        job_run.message = "step fold"
        raise CannotFold("no way")

    [row] = lake.read_rows(JOB_RUNS).to_pylist()
    assert (row["status"], row["message"], dict(row["parameters"])) == (
        "FAILED",
        "step fold: CannotFold: no way",
        {"as_of": "1"},
    )
    assert last_reusable(lake, "probe") is None  # a FAILED run is never reused


def _old_job_runs(lake: Lake, message: str, output_version: int, input_versions: dict[str, int]) -> None:
    """``job_runs`` as a lake written before the ``parameters`` column holds it: one run of
    ``consumer_offsets`` that kept its T in its message."""
    old_schema = pa.schema([field for field in JOB_RUNS.arrow_schema if field.name != "parameters"])
    row = {
        "run_id": "old",
        "job": "consumer_offsets",
        "started_timestamp": 1,
        "duration_ms": 1,
        "status": "SUCCEEDED",
        "input_versions": list(input_versions.items()),
        "output_versions": [(CONSUMER_OFFSETS.name, output_version)],
        "row_counts": [],
        "message": message,
    }
    rows = pa.Table.from_pylist([row], schema=old_schema)
    write_deltalake(str(lake.location(JOB_RUNS)), rows, mode="overwrite", schema_mode="overwrite")


def test_a_lake_from_before_the_parameters_column_computes_in_full_then_reuses(spark: SparkSession, lake: Lake) -> None:
    commit = ("g", "broker-a", "Orders", 0, 2, 1_000, "consumer", None, None, None, None, None)
    lake.append(CONSUMER_OFFSET_COMMITS, spark.createDataFrame([commit], spark_schema(CONSUMER_OFFSET_COMMITS)))
    cq_rows = [("broker-a", "Orders", 0, offset, 100 * offset, 10, 0, 500 + offset) for offset in range(4)]
    lake.append(CONSUME_QUEUE, spark.createDataFrame(cq_rows, spark_schema(CONSUME_QUEUE)))
    first = consumer_offsets(spark, ConsumerOffsetsConfig(lake.root, _AS_OF, engine=ENGINE))
    assert first.status == "SUCCEEDED"
    output_version = lake.version(CONSUMER_OFFSETS)
    assert output_version is not None
    # the lake as an older release left it: the same run, recorded with its T in the message only
    old_message = f"as_of={_AS_OF}; through=1000; consumer_offsets overwritten"
    _old_job_runs(lake, old_message, output_version, first.input_versions)
    assert "parameters" not in DeltaTable(str(lake.location(JOB_RUNS))).schema().to_arrow().names

    again = consumer_offsets(spark, ConsumerOffsetsConfig(lake.root, _AS_OF, engine=ENGINE))

    # the old run has no parameters, so nothing is reused or moved on: a full computation
    assert (again.status, again.message) == (
        "SUCCEEDED",
        "computed in full: the previous run recorded no as_of and through",
    )
    assert lake.version(CONSUMER_OFFSETS) == output_version + 1
    runs = {r["run_id"]: r for r in lake.read_rows(JOB_RUNS).to_pylist()}
    assert runs["old"]["parameters"] is None and runs["old"]["message"].startswith(f"as_of={_AS_OF}")
    assert dict(runs[again.run_id]["parameters"]) == {"as_of": str(_AS_OF), "plan": '"whole"', "through": "1000"}

    third = consumer_offsets(spark, ConsumerOffsetsConfig(lake.root, _AS_OF, engine=ENGINE))
    assert third.status == "NOOP"  # a run recorded with its parameters is reused


def test_a_single_file_written_before_a_column_was_added_reads_that_column_as_nulls(lake: Lake) -> None:
    _old_job_runs(lake, "as_of=1", 0, {})
    lake.add_missing_columns(JOB_RUNS)

    rows = lake.read_rows(JOB_RUNS)

    assert rows.num_rows == 1 and rows.column_names == list(JOB_RUNS.column_names)
    assert rows.column("parameters").to_pylist() == [None]
    assert rows.column("run_id").to_pylist() == ["old"]
