"""The compact_commitlog job: the plan on hand-built file lists, and runs on logs the real broker wrote.

The lake tests write the commit log through real brokers with SYNC_FLUSH (one commit, so one
small file, per send) and small segments, then compact it and check that every row is unchanged,
that one commit with dataChange=false actions was made, that the open segments were not touched,
and that the broker and the incremental consume queue rebuild carry on as if nothing happened.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_model.broker import Broker, BrokerConfig
from broker_model.client import Producer, PullConsumer
from broker_model.common import Message, MessageQueue
from broker_model.store import AppendLog, FileAction, append_log, file_rows, latest_version
from broker_model.store.delta_commits import commit_path
from jobs.compact_commitlog import CompactConfig, build_config, run
from jobs.consumer_offsets import ConsumerOffsetsConfig
from jobs.consumer_offsets import run as consumer_offsets
from jobs.lake import Lake, open_table
from jobs.lake.compaction import (
    Bin,
    DataFile,
    batches,
    commit_bins,
    list_files,
    plan_bins,
    write_bins,
)
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as rebuild
from jobs.replay import SUMMARY_COLUMNS, queues_out_of_log_order, summarize_source
from schemas.catalog import COMMITLOG, CONSUMER_OFFSET_COMMITS, CONSUMER_OFFSETS
from schemas.errors import CommitConflictError, LakeError, ValidationError
from tests.builders import commitlog_record, commitlog_table
from tests.helpers import ENGINE, canonical_rows, wait_until

SEGMENT_SIZE = 16384
MIB = 1024 * 1024

pytestmark = pytest.mark.both_engines


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


def _file(name: str, size: int, broker: str = "broker-a", segment: int = 0, first: int | None = 0) -> DataFile:
    return DataFile(name, size, broker, segment, first, 1)


def test_the_plan_packs_runs_of_adjacent_small_files_in_offset_order_in_every_segment() -> None:
    files = [
        _file("s0-c", 30, first=300),
        _file("s0-a", 30, first=100),
        _file("s0-b", 50, first=200),
        _file("s0-big", 80, first=0),  # at least 0.75 * 100: left alone
        _file("s1-one", 10, segment=1000, first=1000),  # a single small file: nothing to gain
        _file("s2-a", 60, segment=2000, first=2000),
        _file("s2-b", 60, segment=2000, first=2100),
        _file("s3-a", 10, segment=3000, first=3000),
        _file("s3-big", 90, segment=3000, first=3100),
        _file("s3-b", 10, segment=3000, first=3200),  # a large file between two small ones: no bin spans it
        _file("open-a", 1, segment=4000, first=4000),
        _file("open-b", 1, segment=4000, first=4100),  # the last
    ]
    bins = plan_bins(files, target_file_size=100, min_file_fraction=0.75)
    # s0: a+b fill 80 of 100, c does not fit; the bin of c alone is dropped; s2: 60+60 > 100
    assert [[f.path for f in b.files] for b in bins] == [["s0-a", "s0-b"], ["open-a", "open-b"]]
    # files kept out by their version end a run as large files do
    eligible = {"s0-a", "s0-c", "open-a", "open-b"}
    assert [[f.path for f in b.files] for b in plan_bins(files, 100, 0.75, eligible)] == [["open-a", "open-b"]]


def test_the_plan_puts_files_without_statistics_last_and_bins_them_among_themselves() -> None:
    files = [
        _file("x", 10, first=None),
        _file("w", 10, first=None),
        _file("y", 10, first=50),
        _file("z", 10, first=10),
        _file("next", 1, segment=9),
    ]
    bins = plan_bins(files, target_file_size=1000, min_file_fraction=0.5)
    assert [[f.path for f in b.files] for b in bins] == [["z", "y"], ["w", "x"]]


def test_batches_never_split_a_segment_across_commits() -> None:
    def bin_of(segment: int) -> Bin:
        return Bin("broker-a", segment, (_file("f", 1, segment=segment), _file("g", 1, segment=segment)))

    bins = [bin_of(0), bin_of(0), bin_of(1), bin_of(2), bin_of(2), bin_of(3)]
    grouped = batches(bins, segments_per_commit=2)
    assert [[b.segment for b in batch] for batch in grouped] == [[0, 0, 1], [2, 2, 3]]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--target-file-size", "0"], "target_file_size"),
        (["--min-file-fraction", "1.5"], "min_file_fraction"),
        (["--min-file-fraction", "0"], "min_file_fraction"),
        (["--segments-per-commit", "0"], "segments_per_commit"),
        (["--files-up-to-version", "-1"], "files_up_to_version"),
    ],
)
def test_bad_options_are_refused_before_any_work(argv: list[str], field: str) -> None:
    with pytest.raises(ValidationError, match=f"^{field}="):
        build_config(["--lake", "unused", *argv])


# ---------------------------------------------------------------------------------------------
# Runs on a broker-written log
# ---------------------------------------------------------------------------------------------


def _start(lake_root: Path, store_cache_bytes: int = 256 << 20) -> list[Broker]:
    def config(name: str, host: str) -> BrokerConfig:
        return BrokerConfig(
            lake_root,
            name,
            store_host=host,
            segment_size=SEGMENT_SIZE,
            flush_mode="SYNC_FLUSH",
            store_cache_bytes=store_cache_bytes,
        )

    brokers = [Broker(config(*named)) for named in (("broker-a", "127.0.0.1:10911"), ("broker-b", "127.0.0.2:10911"))]
    for broker in brokers:
        broker.start().ensure_topic("Orders", 4)
    return brokers


def _send(brokers: list[Broker], first: int, count: int) -> None:
    producer = Producer(brokers, "compaction-test", client_port=41000 + first)
    for i in range(first, first + count):
        producer.send(Message.create("Orders", f"order {i};".encode() * 25, tags="created", keys=[f"order-{i}"]))


@pytest.fixture(scope="module")
def broker_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake with 240 messages, one file per send, four 16 KiB segments per broker (3 sealed)."""
    root = tmp_path_factory.mktemp("broker-lake")
    brokers = _start(root)
    try:
        _send(brokers, 0, 240)
    finally:
        for broker in brokers:
            broker.shutdown()
    return root


@pytest.fixture
def lake_root(broker_lake: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of :func:`broker_lake`."""
    root = tmp_path / "lake"
    shutil.copytree(broker_lake, root)
    yield root


def _rows(root: Path) -> list[Any]:
    return canonical_rows(DeltaTable(str(root / "commitlog")).to_pyarrow_table())


def _files_by_segment(root: Path) -> dict[tuple[str, int], set[str]]:
    grouped: dict[tuple[str, int], set[str]] = {}
    for data_file in list_files(open_table(str(root / "commitlog"))):
        grouped.setdefault(data_file.segment_key, set()).add(data_file.path)
    return grouped


def _commit_actions(root: Path, version: int) -> list[dict[str, Any]]:
    text = commit_path(root / "commitlog", version).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.spark
def test_compaction_rewrites_every_segment_and_changes_no_row(spark: SparkSession, lake_root: Path) -> None:
    lake = Lake(spark, lake_root, ENGINE)
    rows_before, files_before, version_before = _rows(lake_root), _files_by_segment(lake_root), lake.version(COMMITLOG)
    assert all(len(files_before[k]) > 1 for k in files_before)
    broker_schema = pq.read_schema(lake_root / "commitlog" / next(iter(files_before[("broker-a", 0)])))

    job_run = run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE))

    assert job_run.status == "SUCCEEDED" and lake.version(COMMITLOG) == version_before + 1
    assert _rows(lake_root) == rows_before  # every column, bodies included
    files_after = _files_by_segment(lake_root)
    assert all(len(files) == 1 for files in files_after.values())  # the segments being written too
    assert job_run.row_counts["segments_compacted"] == len(files_before)
    assert job_run.row_counts["files_after"] == sum(map(len, files_after.values()))
    actions = _commit_actions(lake_root, version_before + 1)
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert changes and all(change["dataChange"] is False for change in changes)
    for (path,) in files_after.values():
        table = pq.read_table(lake_root / "commitlog" / path)
        offsets = table.column("commit_log_offset").to_pylist()
        assert offsets == sorted(offsets)
        # the broker's own schema: NOT NULL columns stay NOT NULL, so its readers concatenate both kinds
        assert table.schema.remove_metadata() == broker_schema.remove_metadata()
    assert lake.read_appended(COMMITLOG, version_before).count() == 0
    # the log still holds every queue in queue order file by file (the replay needs no shuffle)
    chunks = lake.iter_file_rows(COMMITLOG, SUMMARY_COLUMNS)
    assert queues_out_of_log_order(summarize_source(chunks, [], None, None)) == []

    again = run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE))
    assert again.status == "NOOP" and lake.version(COMMITLOG) == version_before + 1


@pytest.mark.spark
def test_the_incremental_rebuild_after_compaction_and_new_messages_processes_only_the_new_ones(
    spark: SparkSession, lake_root: Path
) -> None:
    lake = Lake(spark, lake_root, ENGINE)
    assert rebuild(spark, RebuildConfig(lake_root, engine=ENGINE)).status == "SUCCEEDED"
    processed = lake.version(COMMITLOG)
    assert processed is not None
    units_before = canonical_rows(DeltaTable(str(lake_root / "consume_queue")).to_pyarrow_table())
    run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE))
    assert lake.read_appended(COMMITLOG, processed).count() == 0  # the compacted rows are not new

    brokers = _start(lake_root)  # recovery reads the compacted log
    try:
        _send(brokers, 240, 12)
    finally:
        for broker in brokers:
            broker.shutdown()
    with_new = rebuild(spark, RebuildConfig(lake_root, engine=ENGINE))
    assert with_new.message is not None and with_new.message.startswith("incremental")
    assert with_new.row_counts["consume_queue"] == 12
    units = canonical_rows(DeltaTable(str(lake_root / "consume_queue")).to_pyarrow_table())
    assert len(units) == len(units_before) + 12 and set(map(repr, units_before)) <= set(map(repr, units))
    assert with_new.row_counts["consume_queue_integrity"] == 0


@pytest.mark.spark
def test_by_default_compaction_leaves_the_files_an_incremental_job_has_not_read(
    spark: SparkSession, lake_root: Path
) -> None:
    assert rebuild(spark, RebuildConfig(lake_root, engine=ENGINE)).status == "SUCCEEDED"
    read = Lake(spark, lake_root, ENGINE).version(COMMITLOG)
    brokers = _start(lake_root)
    try:
        _send(brokers, 240, 12)  # twelve new files in the live segments; the other readers never ran
    finally:
        for broker in brokers:
            broker.shutdown()
    new_files = {f.path for f in list_files(open_table(str(lake_root / "commitlog")))} - {
        f.path for f in list_files(open_table(str(lake_root / "commitlog"), read))
    }

    job_run = run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE))

    assert job_run.status == "SUCCEEDED" and len(new_files) == 12
    assert new_files <= {f.path for f in list_files(open_table(str(lake_root / "commitlog")))}
    with_new = rebuild(spark, RebuildConfig(lake_root, engine=ENGINE))
    assert with_new.message is not None and with_new.message.startswith("incremental")
    assert with_new.row_counts["consume_queue"] == 12


@pytest.mark.spark
def test_a_broker_commit_between_the_writes_and_the_commit_does_not_conflict(
    spark: SparkSession, lake_root: Path
) -> None:
    table_dir = str(lake_root / "commitlog")
    brokers = _start(lake_root)
    try:
        version_before = open_table(table_dir).version()
        bins = plan_bins(list_files(open_table(table_dir)), MIB, 0.75)
        written = write_bins(AppendLog(table_dir, COMMITLOG), table_dir, bins)
        _send(brokers, 240, 3)  # three broker commits land before the compaction commits
        version = commit_bins(AppendLog(table_dir, COMMITLOG), table_dir, bins, written, "test-run")
        assert version == version_before + 4
        _send(brokers, 243, 3)
        # the broker's store reloads the rewritten files and serves a message of a compacted segment
        consumer = PullConsumer(brokers, "cg-compaction")
        result = consumer.pull(MessageQueue("broker-a", "Orders", 0), 0, max_nums=4)
        assert result.messages and result.messages[0].queue_offset == 0
    finally:
        for broker in brokers:
            broker.shutdown()
    rows = DeltaTable(table_dir).to_pyarrow_table().select(["broker_name", "commit_log_offset"]).to_pylist()
    assert len(rows) == 246 and len({(r["broker_name"], r["commit_log_offset"]) for r in rows}) == 246


def _pulled_bodies(brokers: list[Broker]) -> dict[tuple[str, int], list[bytes]]:
    """Every message body of every Orders queue, pulled through the brokers' stores in batches."""
    bodies: dict[tuple[str, int], list[bytes]] = {}
    for broker in brokers:
        for queue_id in range(4):
            pulled, offset = [], 0
            while offset < broker.store.max_offset("Orders", queue_id):
                result = broker.store.get_message("Orders", queue_id, offset, max_msgs=32)
                pulled += [m.body for m in result.messages]
                offset = result.next_begin_offset
            bodies[(broker.broker_name, queue_id)] = pulled
    return bodies


def _queue_bodies(brokers: list[Broker]) -> dict[tuple[str, int], list[bytes]]:
    """Every message body of every Orders queue, read through the brokers' own stores."""
    bodies: dict[tuple[str, int], list[bytes]] = {}
    for broker in brokers:
        for queue_id in range(4):
            messages = [
                broker.store.message_at("Orders", queue_id, q)
                for q in range(broker.store.max_offset("Orders", queue_id))
            ]
            bodies[(broker.broker_name, queue_id)] = [m.body for m in messages if m is not None]
    return bodies


@pytest.mark.spark
@pytest.mark.parametrize("busy", [True, False], ids=["a broker commit follows", "the brokers stay idle"])
@pytest.mark.parametrize("first", ["pull", "message_at"])
def test_running_brokers_follow_a_compaction_of_their_live_segments_without_indexing_their_logs_again(
    spark: SparkSession, lake_root: Path, busy: bool, first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle brokers meet the replaced files gone at their first read, and follow the log then:
    through a pull's batched read (every row of a file in one take) or through ``message_at``."""
    monkeypatch.setattr(file_rows, "SLICED_ROWS", 0)
    brokers = _start(lake_root, store_cache_bytes=1)  # about one file in memory: reads go to the files
    try:
        before, loads = _queue_bodies(brokers), [b.store.loads for b in brokers]
        assert run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE)).status == "SUCCEEDED"
        # the files the compaction replaced are deleted: the stores must find the rows in the new ones
        DeltaTable(str(lake_root / "commitlog")).vacuum(
            retention_hours=0, dry_run=False, enforce_retention_duration=False
        )
        if busy:
            _send(brokers, 240, 4)

        if first == "pull":
            pulled, after = _pulled_bodies(brokers), _queue_bodies(brokers)
        else:
            after, pulled = _queue_bodies(brokers), _pulled_bodies(brokers)

        assert [b.store.loads for b in brokers] == loads
    finally:
        for broker in brokers:
            broker.shutdown()
    assert all(after[key][: len(bodies)] == bodies for key, bodies in before.items())
    assert sum(map(len, after.values())) == sum(map(len, before.values())) + (4 if busy else 0)
    assert pulled == after


@pytest.mark.spark
def test_brokers_read_compacted_files_a_row_group_at_a_time(
    spark: SparkSession, lake_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compacted file holds a segment's rows in many row groups; pulls (their rows of a file taken
    from several row groups) and single reads (runs of rows across row groups) find every row, with
    room in memory for about one row group."""
    monkeypatch.setattr(append_log, "ROW_GROUP_BYTES", 4096)  # a few rows per row group
    monkeypatch.setattr(file_rows, "SLICED_ROWS", 0)  # a pull's rows of a file in one take per row group
    brokers = _start(lake_root, store_cache_bytes=4096)
    try:
        before = _queue_bodies(brokers)
        assert run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE)).status == "SUCCEEDED"
        groups = [
            pq.ParquetFile(lake_root / "commitlog" / unquote(f.path)).metadata.num_row_groups
            for f in list_files(open_table(str(lake_root / "commitlog")))
        ]
        assert max(groups) > 5
        DeltaTable(str(lake_root / "commitlog")).vacuum(  # the stores must read the compacted files
            retention_hours=0, dry_run=False, enforce_retention_duration=False
        )
        pulled, after = _pulled_bodies(brokers), _queue_bodies(brokers)
    finally:
        for broker in brokers:
            broker.shutdown()
    assert pulled == after == before
    assert sum(map(len, before.values())) == 240


@pytest.mark.spark
def test_the_broker_keeps_sending_while_the_job_runs(spark: SparkSession, lake_root: Path) -> None:
    rows_before = _rows(lake_root)
    brokers = _start(lake_root)
    errors: list[BaseException] = []

    def send() -> None:
        try:
            _send(brokers, 240, 60)
        except BaseException as err:
            errors.append(err)

    sender = threading.Thread(target=send)
    try:
        sender.start()
        job_run = run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE))
        sender.join()
    finally:
        sender.join()
        for broker in brokers:
            broker.shutdown()
    assert not errors and job_run.status == "SUCCEEDED"
    rows = DeltaTable(str(lake_root / "commitlog")).to_pyarrow_table()
    assert rows.num_rows == len(rows_before) + 60
    old = rows.filter(pa.compute.is_in(rows.column("keys"), pa.array([f"order-{i}" for i in range(240)])))
    assert canonical_rows(old) == rows_before


@pytest.mark.spark
def test_a_second_compaction_of_the_same_files_fails_and_commits_nothing(spark: SparkSession, lake_root: Path) -> None:
    table_dir = str(lake_root / "commitlog")
    rows_before = _rows(lake_root)
    bins = plan_bins(list_files(open_table(table_dir)), MIB, 0.75)
    writer = AppendLog(table_dir, COMMITLOG)
    first, second = write_bins(writer, table_dir, bins), write_bins(writer, table_dir, bins)
    version = commit_bins(writer, table_dir, bins, first, "first")
    with pytest.raises(LakeError, match="removed by another writer"):
        commit_bins(writer, table_dir, bins, second, "second")
    assert open_table(table_dir).version() == version and _rows(lake_root) == rows_before


@pytest.mark.spark
@pytest.mark.parametrize("late", [False, True], ids=["read-after-the-other", "put-while-the-other-landed"])
def test_a_rewrite_of_files_another_rewrite_removed_after_its_read_commits_nothing(
    spark: SparkSession, lake_root: Path, late: bool
) -> None:
    """The conflict is found by reading the commits after the rewrite's read version: before the
    put (the other rewrite landed first), or in the catch-up of a put that lost its version."""
    table_dir = str(lake_root / "commitlog")
    rows_before, read_version = _rows(lake_root), open_table(table_dir).version()
    bins = plan_bins(list_files(open_table(table_dir)), MIB, 0.75)
    removes = [FileAction(f.path, b.partition_values, f.size, False) for b in bins for f in b.files]
    first_writer, second_writer = AppendLog(table_dir, COMMITLOG), AppendLog(table_dir, COMMITLOG)
    first, second = write_bins(first_writer, table_dir, bins), write_bins(second_writer, table_dir, bins)
    appended = commitlog_table([commitlog_record(broker_name="broker-z", segment=0, commit_log_offset=0)])
    AppendLog(table_dir, COMMITLOG).append(appended)  # a broker's append in between: no conflict
    version = first_writer.rewrite(first, removes, read_version)
    if not late:
        second_writer = AppendLog(table_dir, COMMITLOG)  # starts at the newest version: reads back to read_version
    with pytest.raises(CommitConflictError, match=rf"version {version} of .* removed .* after version {read_version}"):
        second_writer.rewrite(second, removes, read_version)
    assert latest_version(table_dir) == version and len(_rows(lake_root)) == len(rows_before) + 1


@pytest.mark.spark
def test_a_run_killed_before_its_commit_leaves_invisible_files_that_vacuum_deletes(
    spark: SparkSession, lake_root: Path
) -> None:
    table_dir = str(lake_root / "commitlog")
    rows_before, version_before = _rows(lake_root), open_table(table_dir).version()
    bins = plan_bins(list_files(open_table(table_dir)), MIB, 0.75)
    orphans = write_bins(AppendLog(table_dir, COMMITLOG), table_dir, bins)  # then the process dies
    assert open_table(table_dir).version() == version_before and _rows(lake_root) == rows_before

    assert run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE)).status == "SUCCEEDED"
    deleted = DeltaTable(table_dir).vacuum(
        retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True
    )
    assert {a.path for a in orphans} <= set(deleted)
    assert _rows(lake_root) == rows_before


@pytest.mark.spark
def test_files_newer_than_the_given_version_are_left_for_a_later_run(spark: SparkSession, lake_root: Path) -> None:
    lake = Lake(spark, lake_root, ENGINE)
    old_version = 40  # about the first 40 sends: the first segments only
    active_then = {f.path for f in list_files(open_table(str(lake_root / "commitlog"), old_version))}
    job_run = run(spark, CompactConfig(lake_root, target_file_size=MIB, files_up_to_version=old_version, engine=ENGINE))
    assert job_run.status == "SUCCEEDED"
    version = lake.version(COMMITLOG)
    assert version is not None
    removed = {a["remove"]["path"] for a in _commit_actions(lake_root, version) if "remove" in a}
    assert removed and removed <= active_then


@pytest.mark.spark
def test_the_offset_commits_are_packed_in_groups_no_reader_splits_and_the_readers_move_on(
    spark: SparkSession, lake_root: Path, tmp_path: Path
) -> None:
    assert rebuild(spark, RebuildConfig(lake_root, engine=ENGINE)).status == "SUCCEEDED"
    brokers = _start(lake_root)

    def commit(first: int, count: int) -> None:  # one persisted commit, so one file, each
        for i in range(first, first + count):
            brokers[0].commit_offset("packers", "Orders", i % 4, i)
            assert brokers[0].offsets.persist() is not None

    every_time = math.inf  # moving on whenever it is exact: the test is of what it reads
    try:
        commit(0, 20)
        first = consumer_offsets(
            spark,
            ConsumerOffsetsConfig(lake_root, _now_ms() + 1, engine=ENGINE, move_on_share=every_time, move_on_from=0),
        )
        read = first.input_versions[CONSUMER_OFFSET_COMMITS.name]
        wait_until(lambda: _now_ms() > first.parameters["as_of"], "a clock after that run's T")  # later commits
        commit(20, 20)
    finally:
        for broker in brokers:
            broker.shutdown()
    commits_dir = str(lake_root / CONSUMER_OFFSET_COMMITS.name)
    active_then = _file_names(DeltaTable(commits_dir, version=read))
    appended_later = _file_names(DeltaTable(commits_dir)) - active_then
    assert len(active_then) >= 20 and len(appended_later) == 20
    before_run = DeltaTable(commits_dir).version()

    job_run = run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE))

    # two rewrites, every action dataChange false: the files the reader had read, then those after
    packed = job_run.output_versions[CONSUMER_OFFSET_COMMITS.name]
    removed_by = {}
    for version in range(before_run + 1, packed + 1):
        actions = [json.loads(line) for line in commit_path(commits_dir, version).read_text().splitlines()]
        assert all(a[k]["dataChange"] is False for a in actions for k in ("add", "remove") if k in a)
        removed_by[version] = {Path(a["remove"]["path"]).name for a in actions if "remove" in a}
    assert sorted(removed_by.values(), key=len) == sorted([active_then, appended_later], key=len)
    assert len(_file_names(DeltaTable(commits_dir))) == 2

    moved_on = consumer_offsets(
        spark, ConsumerOffsetsConfig(lake_root, _now_ms() + 1, engine=ENGINE, move_on_share=every_time, move_on_from=0)
    )
    # the packed file of the later commits read as those appends: only what came after the first run
    assert moved_on.row_counts.get(f"new {CONSUMER_OFFSET_COMMITS.name}") == 20, moved_on.message
    assert moved_on.parameters["read_files"] < 20, moved_on.parameters
    table = canonical_rows(DeltaTable(str(lake_root / CONSUMER_OFFSETS.name)).to_pyarrow_table())
    as_of = moved_on.parameters["as_of"]
    assert isinstance(as_of, int)
    fresh = tmp_path / "fresh"  # the same inputs, no earlier run: one full run
    shutil.copytree(lake_root, fresh, ignore=shutil.ignore_patterns(CONSUMER_OFFSETS.name, "job_runs"))
    assert consumer_offsets(spark, ConsumerOffsetsConfig(fresh, as_of, engine=ENGINE)).status == "SUCCEEDED"
    assert canonical_rows(DeltaTable(str(fresh / CONSUMER_OFFSETS.name)).to_pyarrow_table()) == table
    assert run(spark, CompactConfig(lake_root, target_file_size=MIB, engine=ENGINE)).status == "NOOP"


def _file_names(table: DeltaTable) -> set[str]:  # of an unpartitioned table
    return {Path(uri).name for uri in table.file_uris()}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
