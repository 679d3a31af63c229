"""Test helpers shared by the tests: one frame equality with fixed flags, Arrow row sets, a manual
clock, and waiting on a condition."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa.rows_comparer import assert_basic_rows_equality
from chispa.schema_comparer import assert_schema_equality
from pyspark.sql import DataFrame, Row

ENGINE = os.environ.get("RMQ_TEST_ENGINE", "bridge")
"""The lake engine of the test run's Spark session and of every job and ``Lake`` the tests make:
``bridge`` (the default) or ``delta-spark`` (``RMQ_TEST_ENGINE=delta-spark``; the session then fetches
the Delta jars with Ivy, see :func:`jobs.lake.session.delta_package`). A variable of its own, not
``RMQ_LAKE_ENGINE``: the job and broker processes the tests start must keep choosing for themselves."""


def seeds(first: int, *more: int) -> list[Any]:
    """The seeds of a seeded differential, split between the lake engines: the first on the
    delta-spark pass, the others on the bridge pass. Each pass runs the same job code on stories of
    its own (one seed proves the engine; the seeds of both passes together prove the job), so that
    the engine matrix fits CI's time."""
    return [
        pytest.param(first, marks=pytest.mark.engine("delta-spark")),
        *(pytest.param(seed, marks=pytest.mark.engine("bridge")) for seed in more),
    ]


DRIVER_LAKE = ENGINE == "bridge"
"""Whether a chain differential keeps its third lake, computed in full on the driver at every step:
on the bridge pass. On delta-spark its chained lake computes in full on the driver at its first step
and after each step of late rows, and the bridge pass compares every step's."""


def spark_reference(step: int, steps: int) -> bool:
    """Whether a chain differential computes its reference lake with the Spark transforms at
    ``step`` of ``steps``: at every step on the bridge pass, where the driver lake proves the driver
    equal to them at every step; on delta-spark at the last step only, the driver computing the
    reference in full at the others (a Spark run there took about 10 s a step against 0.2 s)."""
    return DRIVER_LAKE or step == steps - 1


def assert_frames_equal(actual_df: DataFrame, expected_df: DataFrame) -> None:
    """Assert same columns (in order), same types and same rows, any row order, nullability aside.

    The project's one set of flags: row order and nullability never matter, column order always
    does, maps are unordered. Each frame is collected once and its rows put in one order on the
    driver; chispa compares the schemas and the rows (its own ``ignore_row_order`` sorts both
    frames in Spark first: a shuffle per frame, 0.8 s a comparison on the tests' data).
    """
    assert_schema_equality(actual_df.schema, expected_df.schema, ignore_nullable=True)
    assert_basic_rows_equality(_in_one_order(actual_df), _in_one_order(expected_df))


def _in_one_order(df: DataFrame) -> list[Row]:
    """The rows of ``df``, sorted by a key that equal rows share (maps' entries sorted)."""
    return sorted(df.collect(), key=lambda row: repr(_order_key(row.asDict(recursive=True))))


def _order_key(value: Any) -> Any:
    if isinstance(value, dict):  # a struct or a map: its entries in key order
        return tuple(sorted(((repr(k), _order_key(v)) for k, v in value.items()), key=lambda kv: kv[0]))
    if isinstance(value, list):
        return [_order_key(v) for v in value]
    return value


def canonical_rows(table: pa.Table) -> list[Any]:
    """The rows of an Arrow table as a sorted list of comparable values.

    Structs become tuples of (field, value) in field order, maps become their entries sorted,
    NaN becomes the string "NaN" (so that equal tables compare equal), rows are sorted by repr.
    """
    return sorted((_canonical(row) for row in table.to_pylist()), key=repr)


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _canonical(v)) for k, v in value.items())
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        # pyarrow gives a map as a list of (key, value) tuples and a struct as a dict
        return ("map", sorted(((_canonical(k), _canonical(v)) for k, v in value), key=repr))
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


CLOCK_START = 1_800_000_000_000  # 2027-01-15T08:00:00Z, epoch ms


class ManualClock:
    """A broker (or producer) clock the test moves by setting ``now``, epoch milliseconds."""

    def __init__(self, now: int = CLOCK_START) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def column_encodings(table_dir: Path) -> tuple[set[str], set[str]]:
    """(every Parquet column path, the paths dictionary-encoded in some row group) over the
    data files under ``table_dir``."""
    encodings: dict[str, set[str]] = {}
    for file in table_dir.rglob("*.parquet"):
        metadata = pq.ParquetFile(file).metadata
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            for index in range(row_group.num_columns):
                chunk = row_group.column(index)
                encodings.setdefault(chunk.path_in_schema, set()).update(chunk.encodings)
    dictionary = {path for path, found in encodings.items() if found & {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}}
    return set(encodings), dictionary


WAIT_DEADLINE_S = 60.0  # generous: a loaded machine is slow, and the wait ends at the condition anyway


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition()`` held within ``seconds`` (checked every few milliseconds); True as
    soon as it holds."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def wait_until(condition: Callable[[], bool], what: str, deadline_s: float = WAIT_DEADLINE_S) -> None:
    """Return as soon as ``condition()`` holds (:func:`wait_for`); fail naming ``what`` once
    ``deadline_s`` has passed without it. Tests wait on conditions, never on fixed sleeps, and
    assert behaviour rather than speed."""
    if not wait_for(condition, deadline_s):
        raise AssertionError(f"waited {deadline_s} s for {what}")


def job_statuses(lake: Any) -> list[tuple[str, str]]:
    """The job runs of ``lake`` (a :class:`jobs.lake.Lake`) as (job, status), sorted: what two runs of
    the same jobs on twin lakes share (their ids, clocks, report folders and figures differ)."""
    rows = lake.read("job_runs").select("job", "status").collect()
    return sorted((row["job"], row["status"]) for row in rows)
