"""The ``job_runs`` table: one row per job run, written by every job through :func:`recorded_run`.

A run's settings and the bounds it computed up to (``as_of``, ``through``, ...) are data: the
``parameters`` map of its row, each value JSON-encoded, read back decoded by
:func:`last_reusable`. Lakes written before that column existed gain it on first use; their
runs read back with no parameters, which every job treats as "no run to reuse or move on": the
full-run case.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from jobs.lake import Lake, ReadCost
from schemas.catalog import JOB_RUNS, TableSpec, spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

REUSABLE_STATUSES = ("SUCCEEDED", "NOOP")  # FAILED runs wrote nothing

Parameter = int | str | bool | None
"""A value of a run's ``parameters``: a setting or a bound, stored as its JSON text."""


class CannotFold(Exception):
    """An incremental step cannot give the full run's table exactly; the message says why, and the
    run computes from the whole inputs instead (and records why)."""


MOVE_ON_SHARE = 0.5
"""Moving on is taken while it reads at most this share of what computing whole reads (by
:attr:`ReadCost.weight`): beyond its reads it also merges by key in Python, which the whole
computation does in Arrow."""


MOVE_ON_FROM = 4_000_000
"""Moving on is tried only when computing whole reads at least this (by :attr:`ReadCost.weight`):
below, a whole computation takes well under a second on 2 cores, and the fixed costs of moving on
(more Delta logs loaded, the previous table read, lookups through many row filters, the merge in
Python) are about what it can save. On 500,000- and 1,000,000-message users' lakes, computing
``consumer_offsets`` whole read 608,006 and 1,173,273 (weighed) in 0.20-0.35 s; on the first, after
1,000 more messages, three runs that tried moving on took 457-549 ms against 264-362 ms for
computing whole on the same data (docs/jobs.md, "Moving on or computing whole")."""


class ReadBudget:
    """What a run may read to move its previous table on: at most ``share`` of what computing the
    table whole would read (:meth:`jobs.lake.Lake.read_cost`, by :attr:`ReadCost.weight`). Each read
    of the moving on is :meth:`spend`-ed before it is made; the one that would pass the limit stops
    it with :class:`CannotFold`, and the run computes whole, saying why."""

    def __init__(self, whole: ReadCost, share: float = MOVE_ON_SHARE, *, at_most: bool = False) -> None:
        """``at_most``: ``whole`` bounds what computing whole reads from above (a check made before
        the reads that tell exactly), and the refusal says so."""
        self.whole = whole
        self.share = share
        self.spent = ReadCost()
        self.at_most = at_most
        self.whole_name = "the most computing whole can read" if at_most else "computing whole"

    def require(self, least: int) -> None:
        """Refuse to move on when computing whole reads less than ``least`` (:data:`MOVE_ON_FROM`).

        Raises:
            CannotFold: it does.
        """
        if self.whole.weight < least:
            raise CannotFold(
                f"computing whole reads {'at most ' if self.at_most else ''}{self.whole} (weighed as "
                f"{self.whole.weight:,} rows), less than the {least:,} from which moving on is worth its fixed costs"
            )

    def spend(self, what: str, cost: ReadCost) -> None:
        """Count ``cost`` (a read named ``what``) before it is made.

        Raises:
            CannotFold: moving on would read more than its share of the whole computation.
        """
        self.spent += cost
        if self.spent.weight > self.share * self.whole.weight:
            raise CannotFold(
                f"moving on would read {self.spent} (with {what}: {cost}), more than {self.share:g} of "
                f"{self.whole_name}: {self.whole}"
            )

    def widen(self, cost: ReadCost) -> None:
        """Count ``cost`` into what computing whole reads: a read known only once the new rows are
        (the consume queue of a topic subscribed to for the first time)."""
        self.whole += cost

    def record(self, job_run: JobRun) -> None:
        """Put what moving on read and what the whole computation would have read into the run's
        record (``parameters``: ``read_rows``, ``read_files``, ``read_commits``, ``whole_rows``,
        ``whole_files``)."""
        job_run.parameters["read_rows"] = self.spent.rows
        job_run.parameters["read_files"] = self.spent.files
        job_run.parameters["read_commits"] = self.spent.commits
        job_run.parameters["whole_rows"] = self.whole.rows
        job_run.parameters["whole_files"] = self.whole.files


@dataclass
class JobRun:
    """A run being timed; :func:`recorded_run` records it when its body ends.

    Attributes:
        parameters: the run's settings and bounds by name (``as_of``, ``through``, ...).
        status, message: what the run records when it ends without an error (:meth:`conclude`).
        packs: tables whose read files are packed once the run is recorded, with the version the
            run read (:meth:`Lake.pack_read_files`).
    """

    job: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_timestamp: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    input_versions: dict[str, int] = field(default_factory=dict)
    output_versions: dict[str, int] = field(default_factory=dict)
    row_counts: dict[str, int] = field(default_factory=dict)
    parameters: dict[str, Parameter] = field(default_factory=dict)
    status: str = "RUNNING"
    duration_ms: int = 0
    message: str | None = None
    packs: dict[str, int] = field(default_factory=dict)

    def conclude(self, status: str, message: str | None = None) -> None:
        """Say how the run ends when its body returns: SUCCEEDED, NOOP or FAILED, and a summary."""
        self.status, self.message = status, message

    def finish(self, status: str, message: str | None = None) -> JobRun:
        """Mark the run ended with ``status`` (SUCCEEDED, NOOP or FAILED)."""
        self.status = status
        self.message = message
        self.duration_ms = time.time_ns() // 1_000_000 - self.started_timestamp
        return self


@contextmanager
def recorded_run(lake: Lake, job: str, parameters: Mapping[str, Parameter] | None = None) -> Iterator[JobRun]:
    """A run of ``job`` with ``parameters``, recorded in ``job_runs`` when the block ends.

    The block fills in the run (versions, counts, more parameters) and says how it ends with
    :meth:`JobRun.conclude` (SUCCEEDED when it says nothing). An exception is recorded as a FAILED
    run with the error's type and text, after the run's message when the block set one (what it
    was doing), then re-raised. After a recorded end, the files of the
    tables in :attr:`JobRun.packs` that the run read are packed.
    """
    job_run = JobRun(job, parameters=dict(parameters or {}))
    try:
        yield job_run
    except BaseException as err:
        failure = f"{type(err).__name__}: {err}"
        record_run(lake, job_run.finish("FAILED", f"{job_run.message}: {failure}" if job_run.message else failure))
        raise
    status = job_run.status if job_run.status != "RUNNING" else "SUCCEEDED"
    record_run(lake, job_run.finish(status, job_run.message))
    for name, version in job_run.packs.items():
        lake.pack_read_files(name, version)


def table_versions(lake: Lake, names: Mapping[str, object] | list[str]) -> dict[str, int]:
    """The current Delta version of each named table that exists."""
    versions = {name: lake.version(name) for name in names}
    return {name: version for name, version in versions.items() if version is not None}


def record_run(lake: Lake, run: JobRun) -> int | None:
    """Append ``run`` to ``job_runs``; returns the committed version."""
    upgrade_job_runs(lake)
    row = {
        "run_id": run.run_id,
        "job": run.job,
        "started_timestamp": run.started_timestamp,
        "duration_ms": run.duration_ms,
        "status": run.status,
        "message": run.message,
    }
    # one row: appended from the driver (a commit, not a Spark job); maps as Arrow takes them
    maps = {"input_versions": run.input_versions, "output_versions": run.output_versions, "row_counts": run.row_counts}
    row.update({name: list(value.items()) for name, value in maps.items()})
    row["parameters"] = [(name, json.dumps(value)) for name, value in run.parameters.items()]
    return lake.append_rows(JOB_RUNS, pa.Table.from_pylist([row], schema=JOB_RUNS.arrow_schema))


def upgrade_job_runs(lake: Lake) -> None:
    """Give a ``job_runs`` table of an older lake the catalog's columns it lacks (``parameters``)."""
    lake.add_missing_columns(JOB_RUNS)


def last_reusable(lake: Lake, job: str) -> dict[str, Any] | None:
    """The latest SUCCEEDED or NOOP ``job_runs`` row of ``job`` (by start time, then run id) as a
    dict, its maps as dicts and its ``parameters`` decoded (empty for a run recorded before the
    column existed); None when there is none. A job whose inputs and settings equal that run's,
    while its outputs are still at the versions that run left, has nothing to compute. Read on
    the driver."""
    upgrade_job_runs(lake)
    filters = [("job", "=", job), ("status", "in", list(REUSABLE_STATUSES))]
    rows = lake.read_rows(JOB_RUNS, filters=filters).to_pylist()
    if not rows:
        return None
    row: dict[str, Any] = max(rows, key=lambda r: (r["started_timestamp"], r["run_id"]))
    for name in ("input_versions", "output_versions", "row_counts"):
        row[name] = dict(row[name] or ())
    row["parameters"] = {name: json.loads(value) for name, value in row["parameters"] or ()}
    return row


def can_reuse(
    lake: Lake,
    previous: Mapping[str, Any] | None,
    input_versions: Mapping[str, int],
    outputs: Sequence[str],
    parameters: Mapping[str, Parameter],
) -> bool:
    """Whether a rerun has nothing to compute: ``previous`` (:func:`last_reusable`) left every
    table of ``outputs`` at its current version, recorded these ``parameters`` (each of them; it
    may have recorded more), and read the data ``input_versions`` holds (:func:`same_inputs`)."""
    if previous is None:
        return False
    for name in outputs:
        current = lake.version(name)
        if current is None or previous["output_versions"].get(name) != current:
            return False
    if any(previous["parameters"].get(name) != value for name, value in parameters.items()):
        return False
    return same_inputs(lake, previous["input_versions"], input_versions)


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
