"""Extracts: small tables of decoded commit log records that a job keeps up to date incrementally.

A job that needs only a few kinds of records (transactions, retries and dead letters) decodes
them once into an extract table and appends the records of each new commit log version. The
extract's commits carry a Delta application transaction whose id is the job and whose version is
the commit log version read, so a rerun, or a restart after a crash between the extract and the
job's outputs, neither skips nor repeats a commit log version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame

from jobs.lake import IncrementalReadError, Lake
from schemas.catalog import COMMITLOG, TableSpec
from schemas.errors import LakeError, ValidationError

DRIVER_INCREMENT_BYTES = 256 << 20
"""An increment whose new commit log data files hold at most this many bytes (Parquet) is read on
the driver: a few Spark jobs would cost more than the work."""


@dataclass(frozen=True)
class DriverDecode:
    """How an extract's rows are made from a few commit log rows on the driver, without Spark.

    Attributes:
        columns: the commit log columns ``decode`` reads.
        decode: the extract's rows of those commit log rows, equal to the Spark ``build``'s.
        max_bytes: new data files up to this many bytes in all are decoded on the driver, larger
            increments with Spark.
    """

    columns: Sequence[str]
    decode: Callable[[pa.Table], pa.Table]
    max_bytes: int = DRIVER_INCREMENT_BYTES


def update_extract(
    lake: Lake,
    extract: TableSpec,
    app_id: str,
    build: Callable[[DataFrame], DataFrame],
    latest: int | None,
    full: bool = False,
    driver: DriverDecode | None = None,
) -> int:
    """Bring ``extract`` up to commit log version ``latest``; the number of rows written.

    Appends ``build`` of the rows that the commit log versions after the one ``extract`` records
    for ``app_id`` added, up to ``latest``, in one commit with the application transaction
    (``app_id``, ``latest``). Builds it from the whole commit log (an overwrite) on a first run,
    when ``full`` and the extract is behind, or when those versions cannot be read as appends
    (rows were removed, a commit file is gone). ``latest`` None (no commit log) writes nothing.
    With ``driver``, new versions whose data files are small enough are read and decoded on the
    driver and appended from there (no Spark job).

    Raises:
        LakeError: the extract was built from a later commit log version than ``latest`` (the
            commit log was replaced): delete the extract table and run again.
    """
    if latest is None:
        return 0
    processed = lake.transaction_version(extract, app_id)
    if processed is not None and processed > latest:
        raise LakeError(
            f"{extract.name} was built from commitlog version {processed}, but the commitlog is at version "
            f"{latest}: it was replaced; delete the {extract.name} table and run again"
        )
    if processed == latest:
        if full:
            print(f"{app_id}: {extract.name} already holds commitlog version {latest}; nothing to rebuild")
        return 0
    if processed is not None and not full:
        try:
            if driver is not None and lake.appended_size(COMMITLOG, processed, latest) <= driver.max_bytes:
                rows = driver.decode(lake.read_appended_rows(COMMITLOG, driver.columns, processed, latest))
                written = lake.append_rows(extract, rows, app_id, latest)
                return 0 if written is None else int(rows.num_rows)
            return _write(lake, extract, build(lake.read_appended(COMMITLOG, processed, latest)), app_id, latest, False)
        except IncrementalReadError as err:
            print(f"{app_id}: cannot read the new commit log rows alone ({err}); reading the whole commit log")
    return _write(lake, extract, build(lake.read(COMMITLOG, version=latest)), app_id, latest, True)


def _write(lake: Lake, extract: TableSpec, df: DataFrame, app_id: str, latest: int, overwrite: bool) -> int:
    """Write ``df`` once (no cached copy: caching the bodies cost more than the write) and count the
    rows the commit added from the Delta log's statistics; 0 when the application transaction
    already held ``latest`` (another run wrote it, nothing was written)."""
    write = lake.overwrite if overwrite else lake.append
    version = write(extract, df, app_id, latest)
    if version is None:
        return 0
    if overwrite or version == 0:
        return lake.row_count(extract, version)
    try:  # the rows of the commit's own add actions
        return lake.appended_cost(extract, version - 1, version).rows
    except (IncrementalReadError, ValidationError):
        return lake.row_count(extract, version) - lake.row_count(extract, version - 1)
