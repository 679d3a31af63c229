"""The ``job_runs`` table: one row per job run, written by every job."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from jobs.lake import Lake
from schemas.catalog import JOB_RUNS, TableSpec, spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

REUSABLE_STATUSES = ("SUCCEEDED", "NOOP")  # FAILED runs wrote nothing


@dataclass
class JobRun:
    """A run being timed; :meth:`finish` fills in status and duration."""

    job: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_timestamp: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    input_versions: dict[str, int] = field(default_factory=dict)
    output_versions: dict[str, int] = field(default_factory=dict)
    row_counts: dict[str, int] = field(default_factory=dict)
    status: str = "RUNNING"
    duration_ms: int = 0
    message: str | None = None

    def finish(self, status: str, message: str | None = None) -> JobRun:
        """Mark the run ended with ``status`` (SUCCEEDED, NOOP or FAILED)."""
        self.status = status
        self.message = message
        self.duration_ms = time.time_ns() // 1_000_000 - self.started_timestamp
        return self


def table_versions(lake: Lake, names: Mapping[str, object] | list[str]) -> dict[str, int]:
    """The current Delta version of each named table that exists."""
    versions = {name: lake.version(name) for name in names}
    return {name: version for name, version in versions.items() if version is not None}


def record_run(lake: Lake, run: JobRun) -> int | None:
    """Append ``run`` to ``job_runs``; returns the committed version."""
    row = {
        "run_id": run.run_id,
        "job": run.job,
        "started_timestamp": run.started_timestamp,
        "duration_ms": run.duration_ms,
        "status": run.status,
        "input_versions": run.input_versions,
        "output_versions": run.output_versions,
        "row_counts": run.row_counts,
        "message": run.message,
    }
    # one row: appended from the driver (a commit, not a Spark job); maps as Arrow takes them
    maps = {"input_versions": run.input_versions, "output_versions": run.output_versions, "row_counts": run.row_counts}
    row.update({name: list(value.items()) for name, value in maps.items()})
    return lake.append_rows(JOB_RUNS, pa.Table.from_pylist([row], schema=JOB_RUNS.arrow_schema))


def message_number(message: str | None, name: str) -> int | None:
    """The integer a run recorded as ``name=<n>`` among the ``; ``-separated parts of its
    ``message`` (``as_of``, ``through``), None when absent."""
    found = re.search(rf"(?:^|; ){re.escape(name)}=(-?\d+)(?:;|$)", message or "")
    return int(found.group(1)) if found else None


def latest_reusable_run(lake: Lake, job: str) -> dict[str, Any] | None:
    """The latest SUCCEEDED or NOOP ``job_runs`` row of ``job`` (by start time, then run id) as a
    dict, None when there is none. A job whose inputs and settings equal that run's, while its
    outputs are still at the versions that run left, has nothing to compute. Read on the driver."""
    filters = [("job", "=", job), ("status", "in", list(REUSABLE_STATUSES))]
    rows = lake.read_rows(JOB_RUNS, filters=filters).to_pylist()
    if not rows:
        return None
    row: dict[str, Any] = max(rows, key=lambda r: (r["started_timestamp"], r["run_id"]))
    for name in ("input_versions", "output_versions", "row_counts"):
        row[name] = dict(row[name] or ())
    return row


def same_inputs(lake: Lake, recorded: Mapping[str, int], current: Mapping[str, int]) -> bool:
    """Whether a run that recorded the input versions ``recorded`` read the data ``current``
    holds: the same tables, each at the same version or at versions no commit between changed a
    row of (:meth:`Lake.same_data`; a compaction of the commit log changes none)."""
    return recorded.keys() == current.keys() and all(
        lake.same_data(name, recorded[name], version) for name, version in current.items()
    )


def read_or_empty(lake: Lake, spec: TableSpec, versions: Mapping[str, int]) -> DataFrame:
    """``spec`` at ``versions[spec.name]``, or an empty frame with its schema when ``versions``
    has no entry (the table did not exist when the run recorded its inputs)."""
    if spec.name not in versions:
        return lake.spark.createDataFrame([], spark_schema(spec))
    return lake.read(spec, version=versions[spec.name])
