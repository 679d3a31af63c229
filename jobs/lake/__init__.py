"""The one door to Delta on the Spark side: :class:`Lake` reads and writes the catalog's tables through one of
two engines (the bridge, or delta-spark where its JVM classes are present), and builds the Spark session
that knows which (see docs/architecture.md).
"""

from __future__ import annotations

from jobs.lake.bridge import WrittenFile, WrittenFiles, commit_data_files, write_data_files
from jobs.lake.compaction import (
    Bin,
    CompactSummary,
    DataFile,
    batches,
    commit_bins,
    commitlog_files,
    compact,
    eligible_paths,
    list_files,
    plan_bins,
    plan_compaction,
    sealed_segments,
    write_bins,
)
from jobs.lake.conform import conform_to_catalog
from jobs.lake.delta_log import IncrementalReadError, open_table
from jobs.lake.facade import Lake
from jobs.lake.session import ENGINE_CONF, ENGINES, build_session, detect_engine, resolve_engine, stop_spark

__all__ = [
    "ENGINES",
    "ENGINE_CONF",
    "Bin",
    "CompactSummary",
    "DataFile",
    "IncrementalReadError",
    "Lake",
    "WrittenFile",
    "WrittenFiles",
    "batches",
    "build_session",
    "commit_bins",
    "commit_data_files",
    "commitlog_files",
    "compact",
    "conform_to_catalog",
    "detect_engine",
    "eligible_paths",
    "list_files",
    "open_table",
    "plan_bins",
    "plan_compaction",
    "resolve_engine",
    "sealed_segments",
    "stop_spark",
    "write_bins",
    "write_data_files",
]
