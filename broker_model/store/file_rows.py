"""The rows of a broker's commit log files as its reads take them.

A :class:`FileRows` knows each data file by an id and a row by (file id, row). It reads a file a
row group at a time (a compacted file holds a whole segment's rows; a pull wants a few of them) and
keeps row groups decoded within a byte budget, most recently used last; it keeps each file's footer
once read. Rows come out as Python values: a read of one row makes the run of :data:`RUN_ROWS` rows
around it into values when a second row of that run is read (a scan reads a queue in order), and a
batch of rows of one file is taken with one ``take`` per row group (a pull's rows lie scattered among
other queues' rows). The caller serializes every call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

RUN_ROWS = 256  # rows of a file made into Python values together when one of them is read
SLICED_ROWS = 8  # rows of one file a batched read takes as one-row slices; more go in one take
RUN_CACHE_BYTES = 32 << 20  # Arrow bytes of the runs of rows kept as Python values


class FileRows:
    """Rows of the data files under ``table_dir``, read and kept decoded per row group within
    ``cache_bytes`` (at least the row group read last)."""

    def __init__(self, table_dir: Path, cache_bytes: int) -> None:
        self.table_dir = table_dir
        self.cache_bytes = cache_bytes
        self._paths: list[str] = []  # file id -> path relative to the table
        self._ids: dict[str, int] = {}  # the key a caller knows a file by -> file id
        self._footers: dict[int, tuple[pq.FileMetaData | None, np.ndarray]] = {}  # footer, row group starts
        self._groups: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()  # (file id, row group) -> rows
        self._group_bytes = 0
        self._runs: OrderedDict[tuple[int, int], tuple[dict[str, list[Any]], int]] = OrderedDict()
        self._run_bytes = 0
        self._last_run: tuple[int, int] | None = None  # the run of the last row read alone

    def clear(self) -> None:
        """Forget every file."""
        self._paths.clear()
        self._ids.clear()
        self._footers.clear()
        self._groups.clear()
        self._group_bytes = 0
        self._forget_runs()

    def add(self, path: str, key: str, rows: pa.Table | None = None) -> int:
        """A new id for the file at ``path`` (relative to the table), known as ``key``; ``rows``: its
        rows when the caller holds them (a commit of this process), kept as its one row group."""
        file_id = len(self._paths)
        self._paths.append(path)
        self._ids[key] = file_id
        if rows is not None:
            self._footers[file_id] = (None, np.array([0, rows.num_rows], dtype=np.int64))
            self._remember((file_id, 0), rows)
        return file_id

    def id_of(self, key: str) -> int | None:
        """The id of the file known as ``key``, None when there is none."""
        return self._ids.get(key)

    def forget(self, file_ids: Iterable[int]) -> None:
        """Drop what is kept of files that are gone (a rewrite moved their rows to other files)."""
        gone = set(file_ids)
        if not gone:
            return
        for key in [key for key in self._groups if key[0] in gone]:
            self._group_bytes -= self._groups.pop(key).nbytes
        for file_id in gone:
            self._footers.pop(file_id, None)
        self._forget_runs()

    def row(self, file_id: int, row: int) -> dict[str, Any]:
        """Row ``row`` of file ``file_id``: taken alone when its run of :data:`RUN_ROWS` rows was not
        read just before, else from the run made into Python values."""
        key = (file_id, row // RUN_ROWS)
        if key not in self._runs and key != self._last_run:  # a row alone, as far as we know
            self._last_run = key
            return {name: values[0] for name, values in self.rows(file_id, [row]).items()}
        columns, first = self._run_of(file_id, row)
        return {name: values[row - first] for name, values in columns.items()}

    def rows(self, file_id: int, rows: Sequence[int]) -> dict[str, list[Any]]:
        """Rows ``rows`` of file ``file_id`` as Python values per column, in that order: a few as
        one-row slices, more in one ``take`` per row group (which costs about 1 ms however few it
        takes)."""
        if len(rows) <= SLICED_ROWS:
            pieces = [self._slice(file_id, row, 1) for row in rows]
            values = [piece.to_pydict() for piece in pieces]
            return {name: [value[name][0] for value in values] for name in pieces[0].column_names}
        starts = self._starts(file_id)
        wanted = np.asarray(rows, dtype=np.int64)
        groups = np.searchsorted(starts, wanted, side="right") - 1
        if (groups == groups[0]).all():
            group = int(groups[0])
            taken: dict[str, list[Any]] = self._read_group(file_id, group).take(wanted - starts[group]).to_pydict()
            return taken
        order = np.argsort(groups, kind="stable")
        parts = [
            self._read_group(file_id, int(group)).take(wanted[order][groups[order] == group] - starts[group])
            for group in np.unique(groups)
        ]
        together = pa.concat_tables(parts)  # the rows in ``order``
        in_order: dict[str, list[Any]] = together.take(np.argsort(order)).to_pydict()
        return in_order

    def _footer(self, file_id: int) -> tuple[pq.FileMetaData | None, np.ndarray]:
        """The file's footer (None for rows the caller handed over) and the first row of each of its
        row groups, then its row count; read from the file the first time."""
        known = self._footers.get(file_id)
        if known is None:
            meta = pq.ParquetFile(self.table_dir / self._paths[file_id]).metadata
            counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            known = (meta, np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64))
            self._footers[file_id] = known
        return known

    def _starts(self, file_id: int) -> np.ndarray:
        return self._footer(file_id)[1]

    def _read_group(self, file_id: int, group: int) -> pa.Table:
        """Row group ``group`` of file ``file_id``, decoded."""
        key = (file_id, group)
        cached = self._groups.get(key)
        if cached is not None:
            self._groups.move_to_end(key)
            return cached
        meta, _ = self._footer(file_id)
        table = pq.ParquetFile(self.table_dir / self._paths[file_id], metadata=meta).read_row_group(group)
        self._remember(key, table)
        return table

    def _remember(self, key: tuple[int, int], table: pa.Table) -> None:
        self._groups[key] = table
        self._group_bytes += table.nbytes
        while self._group_bytes > self.cache_bytes and len(self._groups) > 1:
            (file_id, _), evicted = self._groups.popitem(last=False)
            self._group_bytes -= evicted.nbytes
            if file_id in self._footers and self._footers[file_id][0] is None:
                # rows handed over as one group: the file itself may hold several, read its footer
                del self._footers[file_id]

    def _slice(self, file_id: int, start: int, length: int) -> pa.Table:
        """Rows ``start`` to ``start + length`` of file ``file_id`` (fewer at its end), read from the
        row groups that hold them."""
        starts = self._starts(file_id)
        end = min(start + length, int(starts[-1]))
        first = int(np.searchsorted(starts, start, side="right")) - 1
        pieces = []
        for group in range(first, len(starts) - 1):
            if starts[group] >= end:
                break
            at = max(start - int(starts[group]), 0)
            pieces.append(self._read_group(file_id, group).slice(at, end - int(starts[group]) - at))
        return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)

    def _run_of(self, file_id: int, row: int) -> tuple[dict[str, list[Any]], int]:
        """The run of :data:`RUN_ROWS` rows of file ``file_id`` holding ``row``, as Python values per
        column, and the run's first row."""
        key = (file_id, row // RUN_ROWS)
        cached = self._runs.get(key)
        if cached is not None:
            self._runs.move_to_end(key)
            return cached[0], key[1] * RUN_ROWS
        piece = self._slice(file_id, key[1] * RUN_ROWS, RUN_ROWS)
        self._runs[key] = (piece.to_pydict(), piece.nbytes)
        self._run_bytes += piece.nbytes
        while self._run_bytes > RUN_CACHE_BYTES and len(self._runs) > 1:
            _, (_, size) = self._runs.popitem(last=False)
            self._run_bytes -= size
        return self._runs[key][0], key[1] * RUN_ROWS

    def _forget_runs(self) -> None:
        self._runs.clear()
        self._run_bytes = 0
        self._last_run = None
