"""The one door to Delta on the Spark side: :class:`Lake` reads and writes the catalog's tables through one of
two engines (the bridge, or delta-spark where its JVM classes are present), and builds the Spark session
that knows which (see docs/architecture.md).
"""

from __future__ import annotations

from jobs.lake.bridge import WrittenFile, WrittenFiles, commit_data_files, write_data_files
from jobs.lake.conform import conform_to_catalog, create_table
from jobs.lake.delta_log import IncrementalReadError, check_bridge_can_read, file_location, local_directory, open_table
from jobs.lake.delta_spark import replace_where
from jobs.lake.facade import Lake
from jobs.lake.session import ENGINE_CONF, ENGINES, build_session, detect_engine, resolve_engine

__all__ = [
    "ENGINES",
    "ENGINE_CONF",
    "IncrementalReadError",
    "Lake",
    "WrittenFile",
    "WrittenFiles",
    "build_session",
    "check_bridge_can_read",
    "commit_data_files",
    "conform_to_catalog",
    "create_table",
    "detect_engine",
    "file_location",
    "local_directory",
    "open_table",
    "replace_where",
    "resolve_engine",
    "write_data_files",
]
