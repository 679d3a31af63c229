"""Reading a table's data files on the driver with pyarrow, without a Spark job: one file at a
time, or many files through one dataset scan; partition columns from the Delta log's values,
every column typed as the catalog says.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyarrow.fs import LocalFileSystem

from broker_model.store.delta_files import partition_expression
from jobs.lake.snapshots import RowFilters, active_files, conjunctions, file_location, files_that_may_match
from schemas.catalog import TableSpec


def read_files(
    table_dir: str,
    files: pa.Table,
    spec: TableSpec,
    columns: Sequence[str],
    row_filter: ds.Expression | None = None,
) -> pa.Table:
    """``columns`` of the rows of ``files`` (the shape of :func:`~jobs.lake.snapshots.active_files`), read with pyarrow
    on the driver, in the order of ``files``; partition columns from the log's values, every column
    typed as the catalog says, and a column a file lacks (added to the table after the file was
    written) as nulls; only the rows ``row_filter`` keeps, when given. The files go through one
    dataset scan (:func:`scan_chunks`: they are opened and decoded in pyarrow's threads, which costs
    far less per small file than a reader per file)."""
    if files.num_rows == 0:
        return _read_schema(spec, columns, ()).empty_table()
    unknown_counts = files.append_column("num_records", pa.array(np.zeros(files.num_rows, np.int64)))
    chunks = list(scan_chunks(table_dir, unknown_counts, spec, columns, (), 0, row_filter))
    return pa.concat_tables(chunks) if len(chunks) > 1 else chunks[0]


def read_matching(
    table_dir: str, actions: pa.Table, spec: TableSpec, columns: Sequence[str], filters: RowFilters
) -> pa.Table:
    """``columns`` of the rows of the files of ``actions`` (:func:`~jobs.lake.snapshots.add_actions`)
    that match ``filters``, as :func:`read_files` reads them: the files that cannot match are left
    out first (:func:`~jobs.lake.snapshots.files_that_may_match`, in Arrow over the log's actions,
    where delta-rs's reader builds a dataset fragment for every file), the rest scanned with the
    filters (``pyarrow.parquet.filters_to_expression``, as delta-rs reads them)."""
    files = active_files(files_that_may_match(actions, filters, spec.partition_by), spec.partition_by)
    used = [column for conjunction in conjunctions(filters) for column, _, _ in conjunction]
    read = list(dict.fromkeys([*columns, *used]))
    return read_files(table_dir, files, spec, read, pq.filters_to_expression(list(filters))).select(list(columns))


class FileReader:
    """Reads the ``i``-th file of ``files`` (the shape of :func:`~jobs.lake.snapshots.active_files`): ``columns`` of its
    rows where every data column of ``equal`` has its value (a filter the Parquet reader applies),
    partition columns from the log's values, ``dictionaries`` as :meth:`Lake.iter_file_rows` says."""

    def __init__(
        self,
        table_dir: str,
        files: pa.Table,
        spec: TableSpec,
        columns: Sequence[str],
        equal: Mapping[str, Any] | None = None,
        dictionaries: Sequence[str] = (),
    ) -> None:
        self.table_dir, self.files, self.spec, self.columns = table_dir, files, spec, list(columns)
        self.paths = files.column("path").to_pylist()
        self.dictionaries = dictionaries
        self.data_columns = [c for c in columns if c not in spec.partition_by]
        self.target = _read_schema(spec, columns, dictionaries)
        self.filters = [(column, "=", value) for column, value in (equal or {}).items()] or None
        self.read_dictionary = [c for c in dictionaries if c in self.data_columns] or None

    def __call__(self, i: int) -> pa.Table:
        location = file_location(self.table_dir, self.paths[i])
        if self.filters is None and self.data_columns:
            part = pq.ParquetFile(location, read_dictionary=self.read_dictionary).read(columns=self.data_columns)
        else:
            part = pq.read_table(
                location, columns=self.data_columns, filters=self.filters, read_dictionary=self.read_dictionary
            )
        for column in (c for c in self.columns if c in self.spec.partition_by):
            value = self.files.column(f"partition.{column}")[i]
            if column in self.dictionaries:
                indices = pa.array(np.zeros(part.num_rows, np.int32))
                constant: pa.Array = pa.DictionaryArray.from_arrays(indices, pa.array([value.as_py()], pa.string()))
            else:
                constant = pa.repeat(value, part.num_rows).cast(value.type)
            part = part.append_column(self.target.field(column), constant)
        return part.select(self.columns).cast(self.target).unify_dictionaries()


def scan_chunks(
    table_dir: str,
    files: pa.Table,
    spec: TableSpec,
    columns: Sequence[str],
    dictionaries: Sequence[str],
    chunk_rows: int,
    row_filter: ds.Expression | None = None,
) -> Iterator[pa.Table]:
    """``columns`` of the rows of ``files`` (the shape of :func:`~jobs.lake.snapshots.ordered_files`) as tables of
    consecutive files holding about ``chunk_rows`` rows together (a file is never split), each
    read by pyarrow's dataset scanner, several files at once in its threads: partition columns from
    the log's values, ``dictionaries`` as :meth:`Lake.iter_file_rows` says (one dictionary per
    column and chunk), only the rows ``row_filter`` keeps when given."""
    if files.num_rows == 0:  # a table without data files has no partition columns to read either
        return
    schema = spec.arrow_schema
    read_coded = [c for c in dictionaries if c not in spec.partition_by]
    target = _read_schema(spec, columns, dictionaries)
    # a partition column asked for dictionary-encoded is materialized so by the scanner, one value per file
    scanned = pa.schema([target.field(c) if c in dictionaries else schema.field(c) for c in columns])
    file_format = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=read_coded))
    paths = files.column("path").to_pylist()
    counts = files.column("num_records").to_pylist()
    values = {c: files.column(f"partition.{c}") for c in spec.partition_by}
    start = 0
    while start < len(paths):
        end, held = start + 1, counts[start]
        while end < len(paths) and end - start < _CHUNK_FILES and held + counts[end] <= chunk_rows:
            held += counts[end]
            end += 1
        partitions = [partition_expression(values, i) for i in range(start, end)]
        dataset = ds.FileSystemDataset.from_paths(
            [file_location(table_dir, p) for p in paths[start:end]],
            schema=scanned,
            format=file_format,
            filesystem=LocalFileSystem(),
            partitions=partitions,
        )
        yield _typed_chunk(dataset.to_table(columns=list(columns), filter=row_filter, use_threads=True), target)
        start = end


_CHUNK_FILES = 4096  # files of one chunk at most (a log without row counts still reads in chunks)


def decoded(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary columns decoded (as read without ``dictionaries``)."""
    return table.cast(
        pa.schema(
            [
                pa.field(f.name, f.type.value_type, f.nullable) if pa.types.is_dictionary(f.type) else f
                for f in table.schema
            ]
        )
    )


def _typed_chunk(chunk: pa.Table, target: pa.Schema) -> pa.Table:
    for index, field_ in enumerate(target):
        if field_.type != chunk.schema.field(index).type:  # a partition column asked for dictionary-encoded
            chunk = chunk.set_column(index, field_, pc.dictionary_encode(chunk.column(index)).cast(field_.type))
    return chunk.unify_dictionaries()


def _read_schema(spec: TableSpec, columns: Sequence[str], dictionaries: Sequence[str]) -> pa.Schema:
    """The catalog schema of ``columns``, the string columns in ``dictionaries`` dictionary-encoded."""
    schema, coded = spec.arrow_schema, pa.dictionary(pa.int32(), pa.string())
    return pa.schema([schema.field(c).with_type(coded) if c in dictionaries else schema.field(c) for c in columns])
