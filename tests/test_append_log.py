"""The append writer of a Delta table shared by several writers: each commit lands on the next free
version, whatever the others committed meanwhile, and a protocol change by another writer stops it
before it commits."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from broker_model.store import AppendLog, delta_commits, ensure_table, retry_listing_gap
from broker_model.store.delta_commits import (
    LAST_CHECKPOINT,
    CommitTail,
    commit_path,
    has_later_commit,
    read_change,
    read_changes,
)
from schemas.catalog import TOPIC_CONFIG
from schemas.errors import UnsupportedTableError


def _rows(writer: str, n: int) -> pa.Table:
    return pa.Table.from_pylist(
        [{"broker_name": writer, "topic": f"T{n}", "queue_nums": 4, "perm": 6, "updated_timestamp": n}],
        schema=TOPIC_CONFIG.arrow_schema,
    )


def test_writers_sharing_a_table_take_every_version_once(tmp_path: Path) -> None:
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    writers = {name: AppendLog(path, TOPIC_CONFIG) for name in ("a", "b", "c")}
    taken: list[int] = []
    # uneven turns: a writer finds 0, 1 or several versions taken since its last commit
    for n, name in enumerate("aabacccbab" * 6):
        taken.append(writers[name].append(_rows(name, n)))
    assert taken == list(range(1, len(taken) + 1))  # version 0 is the table's creation
    table = DeltaTable(str(path))
    assert table.version() == len(taken)
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted(r["updated_timestamp"] for r in rows) == list(range(len(taken)))
    assert all(r["topic"] == f"T{r['updated_timestamp']}" for r in rows)


def test_a_protocol_change_by_another_writer_stops_the_commit(tmp_path: Path) -> None:
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    ours = AppendLog(path, TOPIC_CONFIG)
    ours.append(_rows("a", 0))
    theirs = AppendLog(path, TOPIC_CONFIG)
    theirs.append(_rows("b", 1))
    # another writer turns on a feature the append path does not write (change data feed)
    DeltaTable(str(path)).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    upgraded = DeltaTable(str(path)).version()
    adds = ours.write_files(_rows("a", 2))
    with pytest.raises(UnsupportedTableError, match="writer protocol"):
        ours.commit(adds)
    assert DeltaTable(str(path)).version() == upgraded
    assert len(DeltaTable(str(path)).to_pyarrow_table()) == 2


def test_a_writer_idle_past_a_log_cleanup_commits_after_the_newest_version(tmp_path: Path) -> None:
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    idle = AppendLog(path, TOPIC_CONFIG)
    assert idle.append(_rows("idle", 0)) == 1
    busy = AppendLog(path, TOPIC_CONFIG)
    for n in range(1, 10):
        busy.append(_rows("busy", n))
    DeltaTable(str(path)).create_checkpoint()  # at version 10; then the retention removes the oldest commits
    for version in range(6):
        commit_path(path, version).unlink()
    # the idle writer's next version (2) is free now, but a commit there would precede the checkpoint
    assert idle.append(_rows("idle", 10)) == 11
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert sorted(r["updated_timestamp"] for r in rows) == list(range(11))


@pytest.mark.parametrize("pointer", [True, False], ids=["with _last_checkpoint", "without _last_checkpoint"])
def test_a_follower_moves_on_by_new_commits_and_starts_over_after_a_log_cleanup(tmp_path: Path, pointer: bool) -> None:
    """A tail at the newest version finds nothing new; then each new commit; then, once a log
    cleanup removed the commit files it needs, it says so (None: read the table whole), with the
    log's ``_last_checkpoint`` or, without one, from a listing."""
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    writer = AppendLog(path, TOPIC_CONFIG)
    writer.append(_rows("a", 0))
    tail = CommitTail(path, 1)
    assert tail.poll() == [] and tail.version == 1
    writer.append(_rows("a", 1))
    writer.append(_rows("a", 2))
    assert [change.version for change in tail.poll() or []] == [2, 3] and tail.version == 3
    assert tail.poll() == []
    for n in range(3, 8):
        writer.append(_rows("a", n))  # versions 4 to 8
    DeltaTable(str(path)).create_checkpoint()  # at version 8
    for version in range(6):
        commit_path(path, version).unlink()  # the tail needs version 4
    if not pointer:
        (path / "_delta_log" / LAST_CHECKPOINT).unlink()
    assert has_later_commit(path, 4)
    assert tail.poll() is None
    assert not has_later_commit(path, 8)
    assert CommitTail(path, 8).poll() == []


def test_a_delta_rs_call_refused_for_a_listing_gap_is_run_again_and_other_errors_are_not() -> None:
    calls: list[int] = []

    def gap_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise DeltaError("Generic error: Expected contiguous commit files, got a gap at version 7")
        return "committed"

    assert retry_listing_gap(gap_twice) == "committed" and len(calls) == 3
    calls.clear()
    with pytest.raises(DeltaError, match="contiguous"):  # a gap that stays is reported after the attempts
        retry_listing_gap(gap_twice, attempts=1)
    assert len(calls) == 1
    other: list[int] = []

    def conflict() -> None:
        other.append(1)
        raise DeltaError("Transaction failed: a concurrent transaction deleted the same data")

    with pytest.raises(DeltaError, match="concurrent"):
        retry_listing_gap(conflict)
    assert len(other) == 1  # not a listing gap: not run again


def _added(path: Path, after: int, last: int) -> list[list[str]]:
    return [[a.log_path for a in change.added] if change else [] for change in read_changes(path, after, last)]


def test_read_changes_parses_a_commit_once_and_not_a_table_written_again_in_the_same_directory(
    tmp_path: Path,
) -> None:
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    log = AppendLog(path, TOPIC_CONFIG)
    for n in range(3):
        log.append(_rows("a", n))
    first = _added(path, 0, 3)
    assert [len(files) for files in first] == [1, 1, 1]
    assert first == [[a.log_path for a in read_change(path, v).added] for v in (1, 2, 3)]  # type: ignore[union-attr]
    # a commit file never changes once written, so a commit read before is not read again: this one,
    # rewritten behind the log's back, still reads as it was
    commit_path(path, 2).write_text(commit_path(path, 3).read_text())
    assert _added(path, 0, 3) == first
    # the table removed and written again in the same directory: its commits are read anew
    shutil.rmtree(path)
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    log = AppendLog(path, TOPIC_CONFIG)
    for n in range(3):
        log.append(_rows("b", n))
    again = _added(path, 0, 3)
    assert again == [[a.log_path for a in read_change(path, v).added] for v in (1, 2, 3)]  # type: ignore[union-attr]
    assert not {f for files in again for f in files} & {f for files in first for f in files}
    # without its first commit file (a log cleanup) the table cannot be told apart: nothing is reused
    commit_path(path, 0).unlink()
    commit_path(path, 2).write_text(commit_path(path, 3).read_text())
    assert _added(path, 0, 3) == [again[0], again[2], again[2]]
    commit_path(path, 3).unlink()
    assert list(read_changes(path, 2, 3)) == [None]  # an absent commit file


def test_a_commit_read_before_and_removed_since_is_absent(tmp_path: Path) -> None:
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    log = AppendLog(path, TOPIC_CONFIG)
    for n in range(3):
        log.append(_rows("a", n))
    assert None not in list(read_changes(path, 0, 3))
    commit_path(path, 2).unlink()  # a log cleanup
    assert [change is None for change in read_changes(path, 0, 3)] == [False, True, False]


def test_read_changes_keeps_the_commits_read_last_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delta_commits._parsed, "limit", 4)  # two commits of one file each
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    log = AppendLog(path, TOPIC_CONFIG)
    for n in range(4):
        log.append(_rows("a", n))
    first = _added(path, 0, 4)
    assert delta_commits._parsed.held == 4
    # both rewritten behind the log's back: the oldest was dropped and reads anew, the last is kept
    for version in (1, 4):
        commit_path(path, version).write_text(commit_path(path, 2).read_text())
    assert _added(path, 3, 4) == [first[3]]
    assert _added(path, 0, 1) == [first[1]]
    assert delta_commits._parsed.held == 4


def test_the_checkpoint_interval_doubles_as_the_active_files_double(tmp_path: Path) -> None:
    # an interval of 1 commit: it doubles at 2 x 50 active files, again at 200, at 400
    path = ensure_table(tmp_path, TOPIC_CONFIG)
    writer = AppendLog(path, TOPIC_CONFIG, fsync=False, checkpoint_interval=1)
    for n in range(520):
        writer.append(_rows("a", n))  # a file a commit, as a broker's commits before a compaction
        writer.wait_for_checkpoint()
    log = path / "_delta_log"
    checkpoints = sorted(int(p.name[:20]) for p in log.glob("*.checkpoint.parquet"))
    gaps = {version: later - version for version, later in itertools.pairwise(checkpoints)}
    # every commit until a checkpoint counts 100 files, then every 2nd, 4th and 8th version
    assert all(gap == 1 for version, gap in gaps.items() if version < 99), gaps
    assert {gaps[v] for v in gaps if 110 <= v < 190} == {2}, gaps
    assert {gaps[v] for v in gaps if 210 <= v < 390} == {4}, gaps
    assert {gaps[v] for v in gaps if 410 <= v < 500} == {8}, gaps
    assert len(checkpoints) < 100 + 50 + 50 + 20, len(checkpoints)
    table = DeltaTable(str(path))
    assert table.version() == 520 and len(table.to_pyarrow_table()) == 520
