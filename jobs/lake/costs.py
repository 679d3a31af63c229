"""What a read on the driver will cost before it is made: the rows, data files and bytes of the
files it would read, summed from the Delta log (each add action's ``numRecords`` statistic and
size), so that a job chooses between moving its previous table on and computing it whole by what
each would read (docs/jobs.md, "Moving on or computing whole").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.lake.snapshots import file_location, file_statistic

FILE_ROWS = 4096
"""Rows that reading one more data file costs as much as: with delta-rs on 2 cores, 363 files of
offset commits (2,482 rows) read in 581 ms, 45 files of a consume queue (145,264 rows) in 64 ms:
about 1.6 ms a file and 0.4 µs a row."""


COMMIT_ROWS = 512
"""Rows that parsing one more commit file of a table's log costs as much as: the added files of
1,980 commits of a commit log listed in 388 ms on 2 cores, about 0.2 ms a commit."""


@dataclass(frozen=True)
class ReadCost:
    """The rows, data files and bytes a read goes through, and the log commits it parses first."""

    rows: int = 0
    files: int = 0
    bytes: int = 0
    commits: int = 0

    @property
    def weight(self) -> int:
        """The rows, with each file counted as :data:`FILE_ROWS` more and each commit as
        :data:`COMMIT_ROWS` more: what the read costs."""
        return self.rows + FILE_ROWS * self.files + COMMIT_ROWS * self.commits

    def __add__(self, other: ReadCost) -> ReadCost:
        return ReadCost(
            self.rows + other.rows,
            self.files + other.files,
            self.bytes + other.bytes,
            self.commits + other.commits,
        )

    def __str__(self) -> str:
        text = f"{self.rows:,} rows in {self.files:,} files"
        return f"{text} and {self.commits:,} log commits" if self.commits else text


def files_cost(table_dir: str, actions: pa.Table) -> ReadCost:
    """The cost of reading every file of ``actions`` (add actions with ``path``, ``size_bytes`` and,
    where the log has it, ``num_records``): a file without the statistic is counted from its
    Parquet footer."""
    if not actions.num_rows:
        return ReadCost()
    sizes = int(pc.sum(actions.column("size_bytes")).as_py() or 0)
    counts = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else None
    if counts is None:
        counts = [None] * actions.num_rows
    paths = actions.column("path").to_pylist()
    rows = sum(
        count if count is not None else pq.ParquetFile(file_location(table_dir, path)).metadata.num_rows
        for path, count in zip(paths, counts, strict=True)
    )
    return ReadCost(int(rows), actions.num_rows, sizes)


def overlapping(actions: pa.Table, ranges: Mapping[str, tuple[object, object]]) -> pa.Table:
    """The add actions whose ``min``/``max`` statistics of each column of ``ranges`` overlap its
    closed range ``(low, high)``; a file without a statistic may hold anything and is kept."""
    if not actions.num_rows or not ranges:
        return actions
    keep = [True] * actions.num_rows
    for column, (low, high) in ranges.items():
        lows, highs = file_statistic(actions, f"min.{column}"), file_statistic(actions, f"max.{column}")
        for index, (least, greatest) in enumerate(zip(lows, highs, strict=True)):
            if (greatest is not None and greatest < low) or (least is not None and least > high):
                keep[index] = False
    return actions.filter(pa.array(keep, pa.bool_()))
