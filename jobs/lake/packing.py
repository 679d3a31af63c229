"""Packing the small files that appenders leave in a table its jobs read incrementally (a broker
appends one file of offset commits per flush), in groups no reader's range splits: for each range
of versions between the versions the readers have read, the small files appended in it are written
as one file per partition and committed in their place with every action ``dataChange`` false.
A reader whose range holds a whole group reads the packed file as those appends
(:func:`jobs.lake.snapshots.appended_files`), and a reader past it skips it, so no reader goes back
to a whole read. See docs/jobs.md (compact_commitlog).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import pyarrow as pa

from broker_model.store import AddFile, AppendLog, FileAction
from broker_model.store.delta_tables import SMALL_FILE_BYTES, SMALL_TABLE_FILES
from jobs.lake.driver_reads import read_files
from jobs.lake.facade import Lake
from jobs.lake.snapshots import (
    IncrementalReadError,
    add_actions,
    appended_files,
    bridge_can_read,
    delta_string,
    file_location,
    local_or_none,
    log_schema,
    open_table,
)
from schemas.catalog import TableSpec
from schemas.errors import CommitConflictError


def pack_appended(lake: Lake, spec: TableSpec, read_versions: Sequence[int]) -> list[int]:
    """Pack the small files appended to ``spec`` after the least of ``read_versions`` (the versions
    its incremental readers have read), one group per range between consecutive versions and one
    after the greatest: a group is packed when a partition of it holds more than
    :data:`SMALL_TABLE_FILES` small files (below :data:`SMALL_FILE_BYTES`) still active. The
    versions committed, in order; none for a table that is absent, not local, not read exactly by
    the bridge or with columns the catalog lacks, a range that cannot be read as appends, or a
    commit that conflicted (another packing of the same files: the next run
    tries again)."""
    table_dir = local_or_none(str(lake.location(spec)))
    if table_dir is None or not read_versions or lake.version(spec) is None:
        return []
    current = open_table(table_dir)
    if not bridge_can_read(current) or set(log_schema(current).fieldNames()) != set(spec.column_names):
        return []  # files it cannot read exactly, or columns the catalog does not know, are left as they are
    bounds = sorted(set(read_versions))
    committed = []
    for low, high in zip(bounds, [*bounds[1:], None], strict=True):
        latest = open_table(table_dir)
        top = latest.version() if high is None else high
        if top <= low:
            continue
        try:
            appended = appended_files(table_dir, low, top, spec)
        except IncrementalReadError:
            continue
        active = set(add_actions(latest).column("path").to_pylist())
        keep = [path in active and size < SMALL_FILE_BYTES for path, size in _paths_and_sizes(appended)]
        small = appended.filter(pa.array(keep, pa.bool_()))
        groups = _by_partition(small, spec)
        packed = [g for g in groups if g.num_rows > SMALL_TABLE_FILES]
        if packed:
            version = _rewrite(table_dir, spec, packed, latest.version())
            if version is not None:
                committed.append(version)
    return committed


def _paths_and_sizes(files: pa.Table) -> list[tuple[str, int]]:
    return list(zip(files.column("path").to_pylist(), files.column("size_bytes").to_pylist(), strict=True))


def _by_partition(files: pa.Table, spec: TableSpec) -> list[pa.Table]:
    """``files`` split by partition values (one table for an unpartitioned table)."""
    if not spec.partition_by or not files.num_rows:
        return [files] if files.num_rows else []
    keys = [tuple(files.column(f"partition.{c}")[i].as_py() for c in spec.partition_by) for i in range(files.num_rows)]
    groups: dict[tuple[object, ...], list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return [files.take(pa.array(indices)) for indices in groups.values()]


def _rewrite(table_dir: str, spec: TableSpec, groups: Sequence[pa.Table], read_version: int) -> int | None:
    """Each group's rows written as one file per partition, committed in place of the group's files
    in one data-neutral commit; None when another commit removed one of them first (nothing is
    committed, the files written are deleted). Files written for a commit that failed otherwise
    stay: whether it landed cannot be told from here, and a file no commit names is never read."""
    writer = AppendLog(table_dir, spec)
    written: list[AddFile] = []
    removes: list[FileAction] = []
    try:
        for group in groups:
            written += writer.write_files(read_files(table_dir, group, spec, spec.column_names))
            for index in range(group.num_rows):
                values = {c: delta_string(group.column(f"partition.{c}")[index].as_py()) for c in spec.partition_by}
                size = group.column("size_bytes")[index].as_py()
                removes.append(FileAction(group.column("path")[index].as_py(), values, size, False))
    except BaseException:
        _delete(table_dir, written)
        raise
    try:
        return writer.rewrite(written, removes, read_version, {"rmqJob": "pack_appended"})
    except CommitConflictError:
        _delete(table_dir, written)
        return None


def _delete(table_dir: str, written: Sequence[AddFile]) -> None:
    for added in written:
        with contextlib.suppress(FileNotFoundError):
            os.remove(file_location(table_dir, added.path))
