"""The lake's Delta tables on the broker side, through delta-rs: creating a table, reading it whole,
appending a few rows, and packing the small files such appends leave behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError, TableNotFoundError

from broker_model.store.delta_commits import load_table, log_dir, retry_listing_gap
from broker_model.store.delta_files import scan_files, snapshot_files
from schemas.catalog import TableSpec
from schemas.errors import LakeError, ValidationError


def ensure_table(lake_root: str | Path, spec: TableSpec) -> Path:
    """Create ``spec``'s table under ``lake_root`` unless it exists; return its path.

    Safe against a concurrent creator: losing the race is not an error.
    """
    path = spec.location(lake_root)
    if log_dir(path).is_dir() and any(log_dir(path).glob("*.json")):
        return path
    path.mkdir(parents=True, exist_ok=True)
    try:
        DeltaTable.create(
            str(path),
            schema=spec.arrow_schema,
            partition_by=list(spec.partition_by) or None,
            mode="ignore",
            name=spec.name,
        )
    except Exception as exc:  # a concurrent creator won: fine if the table is there now
        if not DeltaTable.is_deltatable(str(path)):
            raise LakeError(f"cannot create table {spec.name} at {path}: {exc}") from exc
    return path


def add_missing_columns(path: Path, spec: TableSpec) -> bool:
    """Add to the existing table at ``path`` the nullable catalog columns of ``spec`` it lacks (a
    table an older release created): one commit that changes no row, after which the rows written
    before read the new columns as null. Whether a column was added."""
    table = load_table(path)
    present = {field.name for field in table.schema().fields}
    missing = [column.name for column in spec.columns if column.nullable and column.name not in present]
    if not missing:
        return False
    fields = DeltaSchema.from_arrow(pa.schema([spec.arrow_schema.field(name) for name in missing])).fields
    table.alter.add_columns(list(fields))
    return True


def read_table(
    lake_root: str | Path,
    spec: TableSpec,
    columns: list[str] | None = None,
    partitions: list[tuple[str, str, Any]] | None = None,
) -> pa.Table:
    """Read ``columns`` (default: all) of ``spec``'s table at its latest version, only the files
    whose partition values pass ``partitions`` (``(partition column, "=", value)`` terms), in
    one pyarrow scan of the active files (:mod:`broker_model.store.delta_files`); an absent table
    reads as empty.

    Raises:
        ValidationError: a term of ``partitions`` on another column or with another operator.
    """
    path = spec.location(lake_root)
    try:
        table = load_table(path)
    except TableNotFoundError:
        schema = spec.arrow_schema
        return schema.empty_table().select(columns) if columns else schema.empty_table()
    wanted: dict[str, list[Any]] = {}
    for column, op, value in partitions or ():
        if column not in spec.partition_by or op != "=":
            raise ValidationError("partitions", (column, op, value), f"is not a partition filter of {spec.name!r}")
        wanted.setdefault(column, []).append(value)
    files = snapshot_files(table, spec, wanted)
    return scan_files(path, files, spec, columns or spec.column_names)


def append_rows(lake_root: str | Path, spec: TableSpec, rows: pa.Table) -> None:
    """Append a small table of rows with delta-rs (for rare writes such as configuration), then
    pack the table's small files when they have piled up (:func:`pack_small_files`). A nullable
    catalog column ``rows`` lack is written null; a table an older release created gets the
    nullable columns it lacks first (:func:`add_missing_columns`)."""
    path = ensure_table(lake_root, spec)
    add_missing_columns(path, spec)
    for column in spec.columns:
        if column.nullable and column.name not in rows.column_names:
            rows = rows.append_column(column.name, pa.nulls(rows.num_rows, spec.arrow_schema.field(column.name).type))
    retry_listing_gap(
        lambda: write_deltalake(
            str(path),
            rows.select(spec.column_names).cast(spec.arrow_schema),
            mode="append",
            partition_by=list(spec.partition_by) or None,
        )
    )
    pack_small_files(path)


# Files of one partition of a table written a few rows at a time (configuration, run records)
# beyond which they are packed: every reader opens each file, so a table appended to once per
# run or restart would otherwise cost its readers more every day.
SMALL_TABLE_FILES = 16
SMALL_FILE_BYTES = 8 << 20  # files below this size are packed, into files of about this size


def pack_small_files(
    path: str | Path, snapshot: DeltaTable | None = None, appended: int = 0, files_up_to: int | None = None
) -> int | None:
    """Pack the small files (below :data:`SMALL_FILE_BYTES`) of the table at ``path`` with
    delta-rs's compaction when a partition holds more than :data:`SMALL_TABLE_FILES` of them in
    ``snapshot`` (default: the table at ``files_up_to``) plus ``appended`` small files committed
    after it: one commit that rewrites them and changes no row (``dataChange`` false, so
    incremental readers skip it), and a checkpoint of it. With ``files_up_to``, only files active
    at that version are packed: the files appended after it stay as they are, for a reader that
    reads the table's appends from that version on. The version committed; None when no partition
    has that many files, or when a concurrent writer's commit conflicts (the next append tries
    again). ``snapshot`` is only read."""
    counted = snapshot if snapshot is not None else load_table(path, files_up_to)
    actions = pa.table(counted.get_add_actions(flatten=True))
    if actions.num_rows + appended > SMALL_TABLE_FILES:
        actions = actions.filter(pc.less(actions.column("size_bytes"), SMALL_FILE_BYTES))
    if actions.num_rows + appended <= SMALL_TABLE_FILES:
        return None
    keys = [name for name in actions.column_names if name.startswith("partition.")]
    counts = actions.group_by(keys).aggregate([("path", "count")]) if keys and actions.num_rows else None
    most = pc.max(counts.column("path_count")).as_py() if counts is not None else actions.num_rows
    if most + appended <= SMALL_TABLE_FILES:
        return None
    # compaction moves the table it runs on to its new version: never a snapshot shared by readers
    table = counted if snapshot is None else load_table(path, files_up_to)
    try:
        table.optimize.compact(target_size=SMALL_FILE_BYTES)
        # a checkpoint of the packed version: loading the table then replays at most the commits
        # of the next packing period, not up to Delta's checkpoint interval of 100
        table.create_checkpoint()
    except DeltaError:
        return None
    return table.version()
