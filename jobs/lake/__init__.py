"""The one door to Delta on the Spark side: :class:`Lake` reads and writes the catalog's tables through
one of two engines (the bridge, or delta-spark where its JVM classes are present), and builds the
Spark session that knows which (see docs/architecture.md and docs/lake.md).

The modules behind it: ``facade`` (:class:`Lake`), ``engine`` (the engine contract), ``bridge`` and
``delta_spark`` (the two engines), ``snapshots`` (tables loaded once per version, their files),
``driver_reads`` (data files read on the driver), ``conform`` (frames conformed to the catalog),
``costs`` (what a read will go through, from the log), ``compaction`` (the commit log's small files
rewritten), ``packing`` (the small files appenders leave, packed in groups no reader's range splits)
and ``session`` (the Spark session).
"""

from __future__ import annotations

from jobs.lake.bridge import WrittenFile, WrittenFiles
from jobs.lake.compaction import CompactSummary, commitlog_files, compact, plan_compaction
from jobs.lake.conform import conform_to_catalog
from jobs.lake.costs import ReadCost
from jobs.lake.driver_reads import decoded
from jobs.lake.facade import Lake
from jobs.lake.packing import pack_appended
from jobs.lake.session import (
    DELTA_CONF,
    ENGINE_CONF,
    ENGINES,
    build_session,
    delta_package,
    detect_engine,
    resolve_engine,
    stop_spark,
    with_delta_jars,
)
from jobs.lake.snapshots import IncrementalReadError, SnapshotState, open_table, restore_snapshots, snapshot_state

__all__ = [
    "DELTA_CONF",
    "ENGINES",
    "ENGINE_CONF",
    "CompactSummary",
    "IncrementalReadError",
    "Lake",
    "ReadCost",
    "SnapshotState",
    "WrittenFile",
    "WrittenFiles",
    "build_session",
    "commitlog_files",
    "compact",
    "conform_to_catalog",
    "decoded",
    "delta_package",
    "detect_engine",
    "open_table",
    "pack_appended",
    "plan_compaction",
    "resolve_engine",
    "restore_snapshots",
    "snapshot_state",
    "stop_spark",
    "with_delta_jars",
]
