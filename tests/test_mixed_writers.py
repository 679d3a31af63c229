"""Mixed writers on one lake, for real: a broker process commits to the commit log (its own
put-if-absent commits, ``os.link``) while this process's Spark jobs, on the run's engine, compact
the commit log (delta-rs commits) and write their own tables (delta-spark or the bridge). Delta's
optimistic concurrency must hold across the implementations: no acknowledged send lost or
written twice, the commit log's versions contiguous, no reader ever seeing a torn snapshot, and
the tables the jobs kept up while the broker wrote equal to a rebuild from scratch afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import SparkSession

from broker_model.store import commit_path, latest_version, load_table
from broker_model.store.delta_commits import read_actions
from jobs.compact_commitlog import CompactConfig
from jobs.compact_commitlog import run as compact
from jobs.lake import Lake
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as rebuild
from schemas.catalog import COMMITLOG, CONSUME_QUEUE
from tests.helpers import ENGINE, canonical_rows, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.subprocess, pytest.mark.slow, pytest.mark.both_engines]
ROOT = Path(__file__).resolve().parent.parent
SEGMENT = 256 * 1024  # small segments: the broker seals several while the jobs run
ROUNDS = 3


class SnapshotWatcher(threading.Thread):
    """Loads the commit log with delta-rs again and again while the writers run, and records every
    snapshot that is torn: a commit log offset held twice, or fewer rows than a snapshot before.

    A load can also fail on a listing that caught a new commit but not the one before it (a
    directory listing is no snapshot of the directory, see docs/lake.md#readers-beside-a-writer);
    such loads are counted, and the product's pinned load (:func:`load_table`) must succeed right
    after each; they are not snapshots."""

    def __init__(self, table_dir: Path) -> None:
        super().__init__(daemon=True)
        self.table_dir, self.stop = table_dir, threading.Event()
        self.torn: list[tuple[int, int, int]] = []
        self.snapshots = self.listing_races = 0
        self.error: BaseException | None = None
        self._rows = -1

    def run(self) -> None:
        try:
            self._watch()
        except BaseException as error:  # the test asserts there was none
            self.error = error

    def _watch(self) -> None:
        while not self.stop.is_set():
            try:
                table = DeltaTable(str(self.table_dir))
            except DeltaError as error:
                if "contiguous" not in str(error):
                    raise
                self.listing_races += 1
                load_table(self.table_dir)  # pinned to the newest commit first: never refused (raises here)
                continue
            offsets = table.to_pyarrow_table(columns=["broker_name", "commit_log_offset"])
            unique = offsets.group_by(["broker_name", "commit_log_offset"]).aggregate([]).num_rows
            if unique != offsets.num_rows or offsets.num_rows < self._rows:
                self.torn.append((offsets.num_rows, unique, self._rows))
            self._rows, self.snapshots = offsets.num_rows, self.snapshots + 1


def test_a_broker_process_and_the_jobs_commit_to_one_lake_without_losing_a_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "tests" / "broker_process.py"), str(lake), "broker-a", "2", str(SEGMENT)]
    broker = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment)
    acks: list[str] = []
    assert broker.stdout is not None and broker.stdout.readline().strip() == "ready"
    reader = threading.Thread(
        target=lambda: acks.extend(line for line in broker.stdout or () if line.startswith("ack"))
    )
    reader.start()
    table_dir = COMMITLOG.location(lake)
    try:
        wait_until(lambda: latest_version(table_dir) >= 20, "the broker's first commits")
        watcher = SnapshotWatcher(table_dir)
        watcher.start()
        for _ in range(ROUNDS):  # every job commits while the broker does
            assert compact(spark, CompactConfig(lake, target_file_size=SEGMENT, engine=ENGINE)).status != "FAILED"
            assert rebuild(spark, RebuildConfig(lake, engine=ENGINE)).status == "SUCCEEDED"
        watcher.stop.set()
        watcher.join()
    finally:
        broker.kill()
        broker.wait()
        reader.join()

    acked = [fields for fields in (line.split() for line in acks) if len(fields) == 6]  # not a line cut by the kill
    stored = DeltaTable(str(table_dir)).to_pyarrow_table(columns=["uniq_key", "commit_log_offset"])
    by_key = dict(
        zip(stored.column("uniq_key").to_pylist(), stored.column("commit_log_offset").to_pylist(), strict=True)
    )
    assert watcher.error is None and watcher.torn == [] and watcher.snapshots > 3
    assert len(acked) > 100
    assert all(by_key.get(uniq_key) == int(offset) for _, uniq_key, offset, *_ in acked)  # none lost, at its offset
    assert pc.count_distinct(stored.column("commit_log_offset")).as_py() == stored.num_rows  # none written twice
    newest = latest_version(table_dir)
    for version in range(newest + 1):  # contiguous, every commit whole
        actions = read_actions(table_dir, version)
        assert actions is not None and all(json.dumps(a) for a in actions), commit_path(table_dir, version)
    compactions = sum("rmqJob" in json.dumps(read_actions(table_dir, v)) for v in range(newest + 1))
    assert compactions > 0  # a compaction landed among the broker's commits
    print(
        f"mixed writers on {ENGINE}: {len(acked)} acknowledged sends, {newest + 1} commit log versions "
        f"({compactions} of them compactions), {watcher.snapshots} snapshots read, "
        f"{watcher.listing_races} loads retried after a listing race"
    )

    assert rebuild(spark, RebuildConfig(lake, engine=ENGINE)).status == "SUCCEEDED"  # the last commits too
    kept_up = canonical_rows(Lake(spark, lake, ENGINE).read(CONSUME_QUEUE).toArrow())
    fresh = tmp_path / "fresh"
    shutil.copytree(lake, fresh, ignore=shutil.ignore_patterns("consume_queue*"))
    assert rebuild(spark, RebuildConfig(fresh, engine=ENGINE, full=True)).status == "SUCCEEDED"
    assert canonical_rows(Lake(spark, fresh, ENGINE).read(CONSUME_QUEUE).toArrow()) == kept_up
