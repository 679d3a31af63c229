"""``FileRows``: the rows of the log's data files, a row group at a time, in a small cache."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from broker_model.store.file_rows import FileRows


def _file(directory: Path, name: str, first: int, count: int) -> pa.Table:
    rows = pa.table({"n": list(range(first, first + count)), "text": [f"row-{i}" for i in range(first, first + count)]})
    pq.write_table(rows, directory / name, row_group_size=3)  # row groups of 3 rows, as a writer may cut them
    return rows


def test_rows_handed_over_by_a_commit_are_read_again_from_their_file_once_evicted(tmp_path: Path) -> None:
    """A commit hands its rows over as one table, while its file holds several row groups: once the
    cache lets that table go, the rows are read from the file by its own row groups."""
    mine = _file(tmp_path, "a.parquet", 0, 10)
    _file(tmp_path, "b.parquet", 100, 10)
    reader = FileRows(tmp_path, cache_bytes=1)  # room for one row group: every other read evicts
    committed = reader.add("a.parquet", "a.parquet", mine)
    other = reader.add("b.parquet", "b.parquet")
    assert reader.rows(committed, [8, 2, 9]) == {"n": [8, 2, 9], "text": ["row-8", "row-2", "row-9"]}
    assert reader.rows(other, [1])["n"] == [101]  # the commit's table leaves the cache
    assert reader.rows(committed, [7, 9, 1, 4]) == {"n": [7, 9, 1, 4], "text": ["row-7", "row-9", "row-1", "row-4"]}
    assert reader.rows(other, [9])["n"] == [109]
    assert [reader.row(committed, i)["n"] for i in (9, 8, 3)] == [9, 8, 3]


def test_a_forgotten_file_is_no_longer_read_and_its_id_stays_taken(tmp_path: Path) -> None:
    _file(tmp_path, "a.parquet", 0, 5)
    reader = FileRows(tmp_path, cache_bytes=1 << 20)
    first = reader.add("a.parquet", "a")
    assert reader.row(first, 4)["text"] == "row-4"
    reader.forget([first])
    (tmp_path / "a.parquet").unlink()
    _file(tmp_path, "b.parquet", 50, 5)
    second = reader.add("b.parquet", "b")
    assert second != first and reader.id_of("b") == second and reader.id_of("a") == first
    assert reader.rows(second, [0, 4])["n"] == [50, 54]
