"""The data files of a Delta snapshot, read with pyarrow: the active files with their partition
values (from the Delta log, through delta-rs), and one dataset scan over many of them.

Reading a table of thousands of small files (a broker's commit log, a table appended to row by row)
through delta-rs's own reader costs tens of seconds; one pyarrow dataset scan over the same files,
several at a time in its threads, costs a small part of that. Rows come file by file, in the
order of the file list, each file's rows in their stored order.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from pyarrow.fs import LocalFileSystem

from schemas.catalog import TableSpec

FILE_COLUMN = "__filename"  # pyarrow's special field: the file a row was read from


def snapshot_files(
    table: DeltaTable, spec: TableSpec, partitions: Mapping[str, Sequence[Any]] | None = None
) -> pa.Table:
    """The active files of ``table``: ``path`` (relative to the table, decoded), ``num_records``
    and ``partition.<col>`` typed as ``spec`` declares, only those whose partition values are in
    every list of ``partitions`` (``{partition column: [values]}``), in the log's order."""
    actions = pa.table(table.get_add_actions(flatten=True))
    columns = {"path": pa.array([unquote(p) for p in actions.column("path").to_pylist()], pa.string())}
    count = actions.column("num_records") if "num_records" in actions.column_names else None
    columns["num_records"] = pa.array([None] * actions.num_rows, pa.int64()) if count is None else count
    for name in spec.partition_by:
        columns[f"partition.{name}"] = actions.column(f"partition.{name}").cast(spec.arrow_schema.field(name).type)
    files = pa.table(columns)
    for name, values in (partitions or {}).items():
        typed = pa.array(list(values), spec.arrow_schema.field(name).type)
        files = files.filter(pc.fill_null(pc.is_in(files.column(f"partition.{name}"), typed), False))
    return files


def scan_files(table_dir: str | Path, files: pa.Table, spec: TableSpec, columns: Sequence[str]) -> pa.Table:
    """``columns`` of every row of ``files`` (:func:`snapshot_files`), typed as ``spec`` declares,
    partition columns from the log's values; with :data:`FILE_COLUMN` among ``columns``, the
    table-relative path each row was read from."""
    schema = spec.arrow_schema
    wanted = [c for c in columns if c != FILE_COLUMN]
    if files.num_rows == 0:
        empty = schema.empty_table().select(wanted)
        return empty.append_column(FILE_COLUMN, pa.array([], pa.string())) if FILE_COLUMN in columns else empty
    root = Path(table_dir)
    paths = [str(root / p) for p in files.column("path").to_pylist()]
    values = {name: files.column(f"partition.{name}") for name in spec.partition_by}
    dataset = ds.FileSystemDataset.from_paths(
        paths,
        schema=pa.schema([schema.field(c) for c in wanted]),
        format=ds.ParquetFileFormat(),
        filesystem=LocalFileSystem(),
        partitions=[partition_expression(values, i) for i in range(files.num_rows)],
    )
    projection = [*wanted, FILE_COLUMN] if FILE_COLUMN in columns else wanted
    table = dataset.to_table(columns=projection, use_threads=True)
    if FILE_COLUMN in columns:
        prefix = len(str(root)) + 1
        relative = pc.utf8_slice_codeunits(table.column(FILE_COLUMN), prefix)
        table = table.set_column(table.schema.get_field_index(FILE_COLUMN), FILE_COLUMN, relative)
    return table.select(list(columns))


def rows_within_files(file_column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """For rows read file by file (:func:`scan_files`), each row's index within its file."""
    codes = pc.dictionary_encode(file_column).combine_chunks().indices.to_numpy(zero_copy_only=False)
    if len(codes) == 0:
        return np.zeros(0, np.int32)
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    lengths = np.diff(np.r_[starts, len(codes)])
    return (np.arange(len(codes)) - np.repeat(starts, lengths)).astype(np.int32)


def partition_expression(values: Mapping[str, pa.ChunkedArray], i: int) -> ds.Expression:
    """What the ``i``-th file's partition values say of its rows, for the dataset scanner."""
    terms = [ds.field(c).is_null() if v[i].as_py() is None else ds.field(c) == v[i] for c, v in values.items()]
    return functools.reduce(operator.and_, terms) if terms else ds.scalar(True)
