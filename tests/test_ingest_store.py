"""``ingest-store``: a RocketMQ store's commit log ingested run after run, on stores the tests'
own writer lays out (:mod:`tests.rocketmq_store`): file rolls with blank markers, pre-allocated
zero tails, torn last records, retention, a corrupt record in the middle, another broker's store,
a rewound store, and a run killed at random points then run again.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_model.__main__ import main as broker_main
from broker_model.broker import Broker, BrokerConfig, SubscriptionGroupConfig
from broker_model.cli_exit import run_command
from broker_model.client import Producer
from broker_model.common import Message
from broker_model.store import MessageStore, commit_path, ensure_table, ingest_store, latest_version
from broker_model.store.store_configs import ConfigCounts, parse_fastjson
from broker_model.store.store_export import export_store
from broker_model.store.store_ingest import STORE_FILES, app_id, ingested_end
from broker_model.tools.admin import delete_group, update_group, update_topic
from broker_model.tools.reset import Strategy, TopicSelection
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as rebuild
from jobs.rebuild_consume_queue.verify import BROKER_PROBLEMS as VERIFY_PROBLEMS
from jobs.report import ReportConfig
from jobs.report import run as report
from jobs.reset_offsets import ResetConfig
from jobs.reset_offsets import main as reset_main
from jobs.reset_offsets import run as reset_run
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUME_QUEUE_INTEGRITY,
    CONSUMER_OFFSET_COMMITS,
    STORE_INGESTS,
    SUBSCRIPTION_GROUP,
    TOPIC_CONFIG,
)
from schemas.errors import CorruptRecordError, ValidationError
from tests.helpers import ENGINE, wait_until
from tests.rocketmq_store import StoreWriter, Written, java_hash, read_consume_queues

ROOT = Path(__file__).resolve().parent.parent
FILE = 8192


def _log(lake: Path, broker: str = "broker-x") -> list[dict[str, Any]]:
    table = DeltaTable(str(COMMITLOG.location(lake))).to_pyarrow_table(
        filters=[("broker_name", "=", broker)],
        columns=["commit_log_offset", "store_size", "topic", "queue_id", "queue_offset", "body", "store_timestamp"],
    )
    return sorted(table.to_pylist(), key=lambda r: r["commit_log_offset"])


def _expected(written: list[Written]) -> list[dict[str, Any]]:
    return [
        {
            "commit_log_offset": w.offset,
            "store_size": w.size,
            "topic": w.topic,
            "queue_id": w.queue_id,
            "queue_offset": w.queue_offset,
            "body": w.body,
            "store_timestamp": w.store_timestamp,
        }
        for w in written
    ]


def _ingests(lake: Path) -> list[dict[str, Any]]:
    rows = DeltaTable(str(STORE_INGESTS.location(lake))).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: r["commitlog_version"])


def _version(lake: Path) -> int:
    return DeltaTable(str(COMMITLOG.location(lake))).version()


def test_runs_ingest_only_what_the_store_gained_across_file_rolls(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(150)  # several files, each ended by a blank marker
    store.preallocate_next()
    assert len(store.files()) >= 4

    first = ingest_store(lake, "broker-x", store.root)

    assert (first.records, first.start, first.end, first.stop) == (150, 0, store.position, "END")
    assert _log(lake) == _expected(store.written)
    brokers = DeltaTable(str(BROKERS.location(lake))).to_pyarrow_table().to_pylist()
    assert [(b["broker_name"], b["store_host"], b["segment_size"]) for b in brokers] == [
        ("broker-x", "10.0.0.7:10911", FILE)
    ]
    topics = DeltaTable(str(TOPIC_CONFIG.location(lake))).to_pyarrow_table().to_pylist()
    assert {(t["topic"], t["queue_nums"]) for t in topics} == {("Orders", 4), ("Audit", 4)}

    nothing = ingest_store(lake, "broker-x", store.root)
    assert nothing.version is None and _version(lake) == first.version

    store.append_many(60, topics=("Orders", "Payments"))
    second = ingest_store(lake, "broker-x", store.root)

    assert (second.start, second.end, second.records) == (first.end, store.position, 60)
    assert _log(lake) == _expected(store.written)  # nothing twice, nothing skipped
    assert ingested_end(lake, "broker-x") == store.position
    assert [(r["from_offset"], r["end_offset"], r["records"], r["stop"]) for r in _ingests(lake)] == [
        (0, first.end, 150, "END"),
        (first.end, second.end, 60, "END"),
    ]
    topics = DeltaTable(str(TOPIC_CONFIG.location(lake))).to_pyarrow_table().to_pylist()
    assert ("Payments", 4) in {(t["topic"], t["queue_nums"]) for t in topics}


@pytest.mark.parametrize("trailing", [True, False], ids=["5.x", "4.9"])
def test_every_field_is_read_from_ipv6_and_long_topic_records(tmp_path: Path, trailing: bool) -> None:
    store = StoreWriter(tmp_path / "store", FILE, store_host="[fd00::7]:10911", trailing_separator=trailing)
    long_topic = "%RETRY%" + "g" * 130  # over 127 characters: magic v2
    store.append(long_topic, 0, b"retry body")
    store.append("Orders", 1, b"plain body", keys="order-1")
    lake = tmp_path / "lake"
    ingest_store(lake, "broker-v6", store.root)
    table = DeltaTable(str(COMMITLOG.location(lake))).to_pyarrow_table()
    rows = sorted(table.to_pylist(), key=lambda r: r["commit_log_offset"])
    assert [r["topic"] for r in rows] == [long_topic, "Orders"]
    assert [r["store_host"] for r in rows] == ["[fd00::7]:10911"] * 2
    assert rows[0]["magic_code"] == -626843477 and rows[1]["magic_code"] == -626843481
    assert rows[1]["keys"] == "order-1" and rows[1]["raw_properties"].endswith(b"\x02") == trailing


def test_a_torn_last_record_is_left_for_the_next_run(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(20)
    torn_at = store.torn()
    first = ingest_store(lake, "broker-x", store.root)
    assert (first.records, first.end, first.stop) == (20, torn_at, "TORN")
    assert "left for the next run" in first.summary()

    store.append_many(5)  # the broker finishes writing over the torn bytes
    second = ingest_store(lake, "broker-x", store.root)
    assert (second.start, second.records, second.stop) == (torn_at, 5, "END")
    assert _log(lake) == _expected(store.written)


def test_a_store_whose_first_file_is_not_at_zero_and_files_deleted_by_retention_are_lost_ranges(
    tmp_path: Path,
) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE, first_base=5 * FILE), tmp_path / "lake"
    store.append_many(10)
    first = ingest_store(lake, "broker-x", store.root)
    assert (first.start, first.lost) == (5 * FILE, (0, 5 * FILE))

    store.append_many(220)  # into later files; the rest of the first file and the next are never read
    store.delete_first()
    store.delete_first()
    kept_from = int(store.files()[0].name)
    second = ingest_store(lake, "broker-x", store.root)

    assert second.lost == (first.end, kept_from) and second.start == kept_from
    assert _log(lake) == _expected([w for w in store.written if w.offset < first.end or w.offset >= kept_from])
    assert [(r["lost_from"], r["lost_to"]) for r in _ingests(lake)] == [(0, 5 * FILE), (first.end, kept_from)]

    store.delete_first()  # every record of it was read: nothing lost
    store.append_many(3)
    third = ingest_store(lake, "broker-x", store.root)
    assert (third.lost, third.records) == (None, 3)


def test_a_corrupt_record_in_the_middle_stops_after_the_records_before_it(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(40)
    bad = store.written[25]
    store.flip(bad.offset + 90)  # a body byte (the body starts at byte 88 with IPv4 hosts): its CRC fails
    bad_file = store.commitlog / f"{bad.offset - bad.offset % FILE:020d}"

    with pytest.raises(CorruptRecordError) as raised:
        ingest_store(lake, "broker-x", store.root)

    assert raised.value.source == str(bad_file) and raised.value.position == bad.offset % FILE
    assert "body CRC" in str(raised.value)
    assert _log(lake) == _expected(store.written[:25])
    assert ingested_end(lake, "broker-x") == bad.offset
    assert _ingests(lake)[-1]["stop"] == "CORRUPT"
    with pytest.raises(CorruptRecordError):  # again on the next run, with nothing written
        ingest_store(lake, "broker-x", store.root)
    assert len(_ingests(lake)) == 1


def test_another_brokers_store_or_a_rewound_one_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(30)
    early = tmp_path / "early"
    shutil.copytree(store.root, early)
    store.append_many(30)
    ingest_store(lake, "broker-x", store.root)
    version = _version(lake)

    other = StoreWriter(tmp_path / "other", FILE, store_host="10.0.0.9:10911")
    other.clock += 1_000
    other.append_many(90)
    with pytest.raises(ValidationError, match="another broker"):
        ingest_store(lake, "broker-x", other.root)
    with pytest.raises(ValidationError, match="rewound"):
        ingest_store(lake, "broker-x", early)
    bigger = StoreWriter(tmp_path / "bigger", 2 * FILE)
    bigger.append_many(5)
    with pytest.raises(ValidationError, match="segments of 8192"):
        ingest_store(lake, "broker-x", bigger.root)
    assert _version(lake) == version and len(_ingests(lake)) == 1


def test_a_broker_written_by_this_product_is_not_continued_by_a_store(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    broker = Broker(BrokerConfig(lake, "broker-a", flush_mode="SYNC_FLUSH")).start()
    try:
        broker.ensure_topic("Orders", 2)
        Producer([broker], "p").send(Message.create("Orders", b"ours"))
    finally:
        broker.shutdown()
    store = StoreWriter(tmp_path / "store", FILE)
    store.append_many(3)
    with pytest.raises(ValidationError, match="no ingest-store run wrote"):
        ingest_store(lake, "broker-a", store.root)


def test_the_command_line_exit_statuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(12)
    assert broker_main(["ingest-store", "--lake", str(lake), "--broker-name", "broker-x", str(store.root)]) == 0
    assert "12 records" in capsys.readouterr().out
    assert broker_main(["ingest-store", "--lake", str(lake), "--broker-name", "broker-x", str(tmp_path)]) == 2
    assert "has no commitlog/ directory" in capsys.readouterr().err
    store.append_many(12)
    store.flip(store.written[15].offset + 90)
    assert broker_main(["ingest-store", "--lake", str(lake), "--broker-name", "broker-x", str(store.root)]) == 1
    assert "corrupt record in" in capsys.readouterr().err
    follow = ["ingest-store", "--lake", str(lake), "--broker-name", "broker-x", "--follow", "--interval", "0"]
    assert broker_main([*follow, str(store.root)]) == 2
    assert "--interval" in capsys.readouterr().err


def _data_files(lake: Path) -> set[Path]:
    return set((COMMITLOG.location(lake) / "broker_name=broker-x").rglob("*.parquet"))


def _kill_when(process: subprocess.Popen[bytes], reached: Callable[[], bool], deadline_s: float = 120) -> int:
    """SIGKILL ``process`` as soon as ``reached()`` holds (checked in a tight loop, so the kill
    lands within a moment of the progress it waits for); the process's return code. Fails when the
    process ended first or the deadline passed: a kill that did not land proves nothing."""
    deadline = time.monotonic() + deadline_s
    while not reached():
        assert process.poll() is None, (
            f"the run ended (exit {process.returncode}) before the point it was to be killed at"
        )
        assert time.monotonic() < deadline, "the run never reached the point it was to be killed at"
    process.send_signal(signal.SIGKILL)
    return process.wait(timeout=30)


@pytest.mark.subprocess
def test_runs_killed_mid_write_and_between_their_two_commits_neither_skip_nor_repeat_a_record(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each run is killed at a point its own progress shows: once the first data file of its
    chunks is written (nothing committed yet), or once its commit log commit exists (its
    ``store_ingests`` row not yet, or just, written). Every kill must land; the next run goes on."""
    store, lake = StoreWriter(tmp_path / "store", 1 << 20), tmp_path / "lake"
    store.append_many(20_000, size=60)
    code = (
        "import sys; from pathlib import Path; from broker_model.store import ingest_store; "
        "ingest_store(Path(sys.argv[1]), 'broker-x', Path(sys.argv[2]), chunk_rows=2_000)"
    )
    command = [sys.executable, "-c", code, str(lake), str(store.root)]
    landed = {"mid_write": 0, "between_commits": 0, "after_both_commits": 0}
    ensure_table(lake, COMMITLOG)  # as the first run does before anything else
    for point in ("mid_write", "between_commits", "mid_write", "between_commits"):
        before_files, before_version = _data_files(lake), _version(lake)
        next_commit = commit_path(COMMITLOG.location(lake), before_version + 1)
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if point == "mid_write":
            returncode = _kill_when(process, lambda known=before_files: bool(_data_files(lake) - known))
        else:
            returncode = _kill_when(process, next_commit.exists)
        assert returncode == -signal.SIGKILL  # the kill landed: the run had not ended
        assert next_commit.exists() == (point == "between_commits")  # a mid-write kill lands before the commit
        # a kill while the first run creates store_ingests may leave its folder without a commit
        rows = _ingests(lake) if commit_path(STORE_INGESTS.location(lake), 0).exists() else []
        recorded = any(r["commitlog_version"] == before_version + 1 for r in rows)
        landed["after_both_commits" if recorded else point] += 1
        store.append_many(500, size=60)
    request.config.pluginmanager.get_plugin("terminalreporter").write_line(f"ingest-store kills landed: {landed}")
    assert landed["mid_write"] == 2 and landed["between_commits"] + landed["after_both_commits"] == 2
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    log = _log(lake)
    offsets = [r["commit_log_offset"] for r in log]
    assert offsets == [w.offset for w in store.written]  # each once, in order, none missing
    ingests = _ingests(lake)
    assert ingests[-1]["end_offset"] == store.position == ingested_end(lake, "broker-x")
    assert sum(r["records"] for r in ingests) == len(store.written)  # every commit has its row
    commits = DeltaTable(str(COMMITLOG.location(lake))).transaction_version(app_id("broker-x"))
    assert commits == store.position
    sizes = pc.sum(DeltaTable(str(COMMITLOG.location(lake))).to_pyarrow_table(columns=["store_size"])["store_size"])
    assert sizes.as_py() == sum(w.size for w in store.written)


# -- the config files ----------------------------------------------------------------------------


def test_fastjson_text_with_bare_integer_keys_parses_and_strings_are_left_alone() -> None:
    text = '{"offsetTable":{"T@G":{0:5, "1":7,\n -2 :9}},"note":"{3:4}, 5:6","list":[1,2]}'
    assert parse_fastjson(text, "x.json") == {
        "offsetTable": {"T@G": {"0": 5, "1": 7, "-2": 9}},
        "note": "{3:4}, 5:6",
        "list": [1, 2],
    }
    with pytest.raises(ValidationError, match=r"x\.json.*line 2, column 10"):
        parse_fastjson('{0:1,\n "a": [1,,2]}', "x.json")


OFFSETS = '{"offsetTable":{"Orders@cg-a":{0:12,1:7},"%RETRY%cg-a@cg-a":{0:1},"Audit@cg-b":{"2":30}},"dataVersion":{}}'
TOPICS = (
    '{"topicConfigTable":{"Orders":{"topicName":"Orders","readQueueNums":4,"writeQueueNums":4,"perm":6},'
    '"Audit":{"topicName":"Audit","readQueueNums":8,"writeQueueNums":4,"perm":4,"attributes":{"message.type":"FIFO"}}}}'
)
GROUPS = (
    '{"subscriptionGroupTable":{"cg-a":{"groupName":"cg-a","retryMaxTimes":3,"retryQueueNums":1,'
    '"consumeEnable":true,"consumeMessageOrderly":true,'
    '"groupRetryPolicy":{"type":"CUSTOMIZED","customizedRetryPolicy":{"next":[1000,2000]}}}}}'
)


def _rows(lake: Path, spec: Any) -> list[dict[str, Any]]:
    return DeltaTable(str(spec.location(lake))).to_pyarrow_table().to_pylist()


def test_config_files_are_snapshots_that_append_only_what_changed(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(10)
    store.config("consumerOffset.json", OFFSETS, mtime_ms=1_700_000_100_000)
    store.config("topics.json", TOPICS, mtime_ms=1_700_000_100_001)
    store.config("subscriptionGroup.json", GROUPS, mtime_ms=1_700_000_100_002)
    store.config("delayOffset.json", '{"offsetTable":{1:5,3:0}}')

    first = ingest_store(lake, "broker-x", store.root)

    # Orders came with 4 queues from its records already: only Audit changes
    assert (first.configs.offsets, first.configs.topics, first.configs.groups, first.configs.delay) == (4, 1, 1, True)
    commits = {
        (r["group"], r["topic"], r["queue_id"]): (r["offset"], r["commit_timestamp"])
        for r in _rows(lake, CONSUMER_OFFSET_COMMITS)
    }
    assert commits == {
        ("cg-a", "Orders", 0): (12, 1_700_000_100_000),
        ("cg-a", "Orders", 1): (7, 1_700_000_100_000),
        ("cg-a", "%RETRY%cg-a", 0): (1, 1_700_000_100_000),
        ("cg-b", "Audit", 2): (30, 1_700_000_100_000),
    }
    topics = {
        r["topic"]: (r["queue_nums"], r["perm"], r["message_type"])
        for r in sorted(_rows(lake, TOPIC_CONFIG), key=lambda r: r["updated_timestamp"])
    }
    assert topics == {"Orders": (4, 6, None), "Audit": (8, 4, "FIFO")}
    (group,) = _rows(lake, SUBSCRIPTION_GROUP)
    assert (group["group"], group["retry_max_times"], group["consume_message_orderly"]) == ("cg-a", 3, True)
    assert (group["retry_policy"], group["retry_next_ms"]) == ("CUSTOMIZED", [1000, 2000])
    assert json.loads((lake / "_config" / "broker-x" / "delayOffset.json").read_text()) == {
        "offsetTable": {"1": 5, "3": 0}
    }

    again = ingest_store(lake, "broker-x", store.root)
    assert again.configs == ConfigCounts() and len(_rows(lake, CONSUMER_OFFSET_COMMITS)) == 4
    assert delete_group(lake, "cg-a", ["broker-x"]) == ["broker-x"]  # the store's file still holds it
    assert ingest_store(lake, "broker-x", store.root).configs.groups == 1
    latest = max(_rows(lake, SUBSCRIPTION_GROUP), key=lambda r: r["updated_timestamp"])
    assert (latest["deleted"], latest["retry_max_times"]) == (False, 3)

    store.config("consumerOffset.json", OFFSETS.replace("0:12", "0:15"), mtime_ms=1_700_000_200_000)
    (store.root / "config" / "consumerOffset.json").unlink()  # a crash inside string2File: .bak stays
    assert ingest_store(lake, "broker-x", store.root).configs.offsets == 0  # the .bak holds the old offsets
    store.config("consumerOffset.json", OFFSETS.replace("0:12", "0:15"), mtime_ms=1_700_000_200_000)
    moved = ingest_store(lake, "broker-x", store.root)
    assert moved.configs.offsets == 1
    latest = max(
        (r for r in _rows(lake, CONSUMER_OFFSET_COMMITS) if r["topic"] == "Orders" and r["queue_id"] == 0),
        key=lambda r: r["commit_timestamp"],
    )
    assert (latest["offset"], latest["commit_timestamp"]) == (15, 1_700_000_200_000)


def test_a_malformed_config_file_is_named_and_nothing_of_the_run_is_written(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(10)
    ingest_store(lake, "broker-x", store.root)
    version = _version(lake)
    store.append_many(10)
    path = store.config("topics.json", '{"topicConfigTable":{"Orders":{"readQueueNums":4,}}')
    store.config("consumerOffset.json", OFFSETS)

    with pytest.raises(ValidationError, match=rf"{path}.*line 1, column 50"):
        ingest_store(lake, "broker-x", store.root)
    assert _version(lake) == version and not CONSUMER_OFFSET_COMMITS.location(lake).exists()
    assert broker_main(["ingest-store", "--lake", str(lake), "--broker-name", "broker-x", str(store.root)]) == 2


def test_a_broker_of_ours_does_not_start_under_an_ingested_name(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(5)
    ingest_store(lake, "broker-x", store.root)
    with pytest.raises(ValidationError, match="ingest-store"):
        Broker(BrokerConfig(lake, "broker-x", segment_size=FILE)).start()
    assert ingest_store(lake, "broker-x", store.root).version is None  # the name lock was released


@pytest.mark.subprocess
def test_follow_tails_a_store_being_written_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    lake, root, out = tmp_path / "lake", tmp_path / "store", tmp_path / "written.json"
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.store_writer_process", str(root), str(64 * 1024), str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    command = [sys.executable, "-m", "broker_model", "ingest-store", "--lake", str(lake), "--broker-name", "live"]
    follower = subprocess.Popen(
        [*command, "--follow", "--interval", "0.2", str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    wait_until(lambda: latest_version(STORE_INGESTS.location(lake)) >= 2, "three cycles of the follower with records")
    writer.send_signal(signal.SIGTERM)
    assert writer.wait(timeout=30) == 0
    follower.send_signal(signal.SIGTERM)
    output, _ = follower.communicate(timeout=60)

    assert follower.returncode == 0
    lines = output.splitlines()
    assert len(lines) >= 3 and lines[-1].startswith("ingest-store 'live': stopped, ingested up to offset")
    written = json.loads(out.read_text())
    assert [r["commit_log_offset"] for r in _log(lake, "live")] == written  # exactly what the writer finished
    assert len(_ingests(lake)) == len(lines) - 1  # one commit per cycle that found records


# -- the broker's own consume queues ---------------------------------------------------------------


def _set_unit(store: StoreWriter, topic: str, queue_id: int, queue_offset: int, unit: tuple[int, int, int]) -> None:
    store.unit(topic, queue_id, queue_offset, *unit)


@pytest.mark.spark
def test_verify_broker_reports_every_difference_of_the_brokers_own_consume_queues(
    spark: SparkSession, tmp_path: Path
) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE, cq_units_per_file=8), tmp_path / "lake"
    store.append_many(120)
    ingest_store(lake, "broker-x", store.root)
    config = RebuildConfig(lake, engine=ENGINE, verify_brokers=("broker-x",))

    clean = rebuild(spark, config)
    assert clean.row_counts["verified broker-x"] == 120
    assert sum(clean.row_counts[f"broker-x {p}"] for p in VERIFY_PROBLEMS) == 0

    orders = [w for w in store.written if (w.topic, w.queue_id) == ("Orders", 0)]
    audit = [w for w in store.written if (w.topic, w.queue_id) == ("Audit", 1)]
    tags = java_hash("TagA")
    _set_unit(store, "Orders", 0, 2, (orders[2].offset, orders[2].size + 1, tags))  # wrong size
    _set_unit(store, "Audit", 1, 0, (audit[0].offset, audit[0].size, tags + 1))  # wrong tags code
    _set_unit(store, "Audit", 1, 1, (audit[2].offset, audit[2].size, tags))  # another record
    last = orders[-1]
    _set_unit(store, "Orders", 0, last.queue_offset, (0, 0, 0))  # the queue's last unit gone
    _set_unit(store, "Audit", 1, len(audit), (orders[5].offset, orders[5].size, tags))  # one unit too many
    _set_unit(store, "Orders", 7, 0, (store.position + FILE * 40, 90, tags))  # past the log's files

    found = rebuild(spark, config)
    integrity = DeltaTable(str(CONSUME_QUEUE_INTEGRITY.location(lake))).to_pyarrow_table().to_pylist()
    problems = sorted((r["problem"], r["topic"], r["queue_id"], r["queue_offset"]) for r in integrity)
    assert problems == [
        ("BROKER_CQ_BEYOND_LOG", "Orders", 7, 0),
        ("BROKER_CQ_EXTRA", "Audit", 1, len(audit)),
        ("BROKER_CQ_MISSING", "Orders", 0, last.queue_offset),
        ("BROKER_CQ_OFFSET", "Audit", 1, 1),
        ("BROKER_CQ_SIZE", "Orders", 0, 2),
        ("BROKER_CQ_TAGS", "Audit", 1, 0),
    ]
    assert found.row_counts["broker-x BROKER_CQ_SIZE"] == 1
    assert all(str(store.root) in r["detail"] for r in integrity)

    rebuild(spark, config)  # verified again: the findings are replaced, not added
    assert len(DeltaTable(str(CONSUME_QUEUE_INTEGRITY.location(lake))).to_pyarrow_table()) == 6


def test_export_store_writes_a_store_that_ingests_back_and_refuses_a_used_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    broker = Broker(BrokerConfig(lake, "broker-a", segment_size=FILE, flush_mode="SYNC_FLUSH")).start()
    try:
        broker.ensure_topic("Orders", 2)
        update_topic(lake, "Orders", ["broker-a"], 2, attributes={"message.type": "NORMAL"})
        update_group(lake, SubscriptionGroupConfig("cg", retry_policy="EXPONENTIAL", retry_multiplier=4), ["broker-a"])
        producer = Producer([broker], "p")
        for i in range(60):
            producer.send(Message.create("Orders", f"order {i}".encode() * 9, tags="created"))
        broker.commit_offset("cg", "Orders", 1, 7)
    finally:
        broker.shutdown()
    out = tmp_path / "store"
    assert broker_main(["export-store", "--lake", str(lake), "--broker-name", "broker-a", str(out)]) == 0
    assert "60 records" in capsys.readouterr().out
    assert (out / "config" / "consumerOffset.json").read_text().count('"Orders@cg":{1:7}') == 1  # bare keys
    assert sorted(p.name for p in (out / "consumequeue" / "Orders").iterdir()) == ["0", "1"]
    assert broker_main(["export-store", "--lake", str(lake), "--broker-name", "broker-a", str(out)]) == 2

    topics = parse_fastjson((out / "config" / "topics.json").read_text(), "topics.json")["topicConfigTable"]
    assert topics["Orders"]["attributes"] == {"message.type": "NORMAL"}
    groups = parse_fastjson((out / "config" / "subscriptionGroup.json").read_text(), "g")["subscriptionGroupTable"]
    exponential = {"initial": 5000, "max": 7_200_000, "multiplier": 4}
    assert groups["cg"]["groupRetryPolicy"] == {"type": "EXPONENTIAL", "exponentialRetryPolicy": exponential}

    again = tmp_path / "again"
    assert ingest_store(again, "broker-a", out).records == 60
    assert _log(again, "broker-a") == _log(lake, "broker-a")
    latest = max(_rows(again, TOPIC_CONFIG), key=lambda r: r["updated_timestamp"])  # after the first-seen row
    assert (latest["topic"], latest["message_type"]) == ("Orders", "NORMAL")
    (group,) = _rows(again, SUBSCRIPTION_GROUP)
    assert (group["retry_policy"], group["retry_initial_ms"], group["retry_multiplier"]) == ("EXPONENTIAL", 5000, 4)


# -- the way back: a reset written into the broker's own file ------------------------------------


def _reset(lake: Path, store: Path, *extra: str) -> int:
    argv = ["--lake", str(lake), "--group", "cg-a", "--topic", "Orders", "--to-earliest", "--execute", *extra]
    return run_command(lambda: reset_main([*argv, "--broker-config", str(store)]))


def test_a_reset_is_written_into_the_stopped_brokers_consumer_offsets_with_a_backup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(40)
    before = store.config("consumerOffset.json", OFFSETS)
    ingest_store(lake, "broker-x", store.root)
    original = before.read_text()

    assert _reset(lake, store.root) == 0
    assert "wrote 4 offset(s) of broker broker-x" in capsys.readouterr().out  # Orders has 4 queues

    written = parse_fastjson(before.read_text(), str(before))
    assert written["offsetTable"]["Orders@cg-a"] == {"0": 0, "1": 0, "2": 0, "3": 0}
    assert written["offsetTable"]["Audit@cg-b"] == {"2": 30} and "dataVersion" in written
    assert (store.root / "config" / "consumerOffset.json.bak").read_text() == original
    resets = [r for r in _rows(lake, CONSUMER_OFFSET_COMMITS) if r["source"] == "reset"]
    assert sorted((r["queue_id"], r["offset"]) for r in resets) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert ingest_store(lake, "broker-x", store.root).configs.offsets == 0  # the file agrees with the lake


@pytest.mark.subprocess
def test_a_reset_is_refused_while_the_broker_holds_its_lock_file(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(40)
    path = store.config("consumerOffset.json", OFFSETS)
    ingest_store(lake, "broker-x", store.root)
    holder = subprocess.Popen(  # as DefaultMessageStore.start: a lock on the lock file's first byte
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'a+'); fcntl.lockf(f, fcntl.LOCK_EX, 1, 0); "
            "print('locked', flush=True); sys.stdin.read()",
            str(store.root / "lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        content, commits = path.read_text(), len(_rows(lake, CONSUMER_OFFSET_COMMITS))
        assert _reset(lake, store.root) == 2
        assert path.read_text() == content and len(_rows(lake, CONSUMER_OFFSET_COMMITS)) == commits
    finally:
        holder.communicate("", timeout=10)
    assert _reset(lake, store.root) == 0  # stopped: the lock is free again


@pytest.mark.spark
def test_records_of_rocketmq_5_system_topics_are_kept_and_pop_ones_and_timer_files_listed_as_not_interpreted(
    spark: SparkSession, tmp_path: Path
) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(12)
    for i in range(5):
        store.append("rmq_sys_wheel_timer", 0, b"timer %d" % i)
    for i in range(3):
        store.append("rmq_sys_REVIVE_LOG_DefaultCluster", i % 2, b'{"ck": %d}' % i)
    (store.root / "timerwheel").write_bytes(bytes(64))  # RocketMQ 5's timer state: no run reads it
    ingest_store(lake, "broker-x", store.root)

    rebuild(spark, RebuildConfig(lake, engine=ENGINE))
    units = DeltaTable(str(lake / "consume_queue")).to_pyarrow_table(columns=["topic"])["topic"].to_pylist()
    assert (units.count("rmq_sys_wheel_timer"), units.count("rmq_sys_REVIVE_LOG_DefaultCluster")) == (5, 3)
    assert units.count("Orders") == 6  # the business topics count as before

    out = tmp_path / "report"
    assert report(spark, ReportConfig(lake, time.time_ns() // 1_000_000, out, engine=ENGINE)).status == "SUCCEEDED"
    page = (out / "report.html").read_text()
    section = page[page.index("RocketMQ 5 system topics: stored, not interpreted yet") :]
    assert "rmq_sys_REVIVE_LOG_DefaultCluster" in section and "POP checkpoints and acks" in section
    assert "rmq_sys_wheel_timer" not in section.split("RocketMQ store files")[0]  # timer entries are interpreted
    files = page[page.index("RocketMQ store files: kept by the broker, not read into the lake") :]
    assert "timerwheel" in files and "RocketMQ 5 timer wheel" in files  # listed, not lost


def test_what_the_store_holds_besides_the_log_and_the_read_config_files_is_listed_with_its_bytes(
    tmp_path: Path,
) -> None:
    """RocketMQ 5 writes files no run reads (the timer wheel and log, the index, the timer's
    checkpoint, ...): each run's ``store_ingests`` row lists them, so that they are known, not lost.
    A table an older release created, without the column, gains it."""
    store, lake = StoreWriter(tmp_path / "store", FILE), tmp_path / "lake"
    store.append_many(5)
    store.config("topics.json", '{"topicConfigTable":{}}')
    root = store.root
    (root / "timerwheel").write_bytes(bytes(96))
    (root / "timerlog").mkdir()
    (root / "timerlog" / "00000000000000000000").write_bytes(bytes(40))
    (root / "timerlog" / "00000000000004194304").write_bytes(bytes(2))
    (root / "lock").write_bytes(b"")
    (root / "config" / "timercheck").write_bytes(bytes(16))
    (root / "config" / "topics.json.bak").write_text("{}")  # read: the fallback copy of a read file
    (root / "config" / "topics.json.tmp").write_text("{")  # being written: not listed
    old_schema = pa.schema([f for f in STORE_INGESTS.arrow_schema if f.name != "unread"])
    DeltaTable.create(str(STORE_INGESTS.location(lake)), schema=old_schema)

    ingest_store(lake, "broker-x", root)

    unread = dict(_ingests(lake)[-1]["unread"])
    assert unread == {"config/timercheck": 16, "lock": 0, "timerlog/": 42, "timerwheel": 96}
    assert set(unread) - set(STORE_FILES) == set()  # each known, with what it holds


def test_a_run_killed_between_its_commit_and_its_ingest_row_gets_the_row_from_the_next_run(tmp_path: Path) -> None:
    store, lake = StoreWriter(tmp_path / "store", FILE, first_base=2 * FILE), tmp_path / "lake"
    store.append_many(30)
    first = ingest_store(lake, "broker-x", store.root)
    written = _ingests(lake)
    # the state a first run killed right after its commitlog commit leaves: no store_ingests yet
    shutil.rmtree(STORE_INGESTS.location(lake))

    store.append_many(5)
    second = ingest_store(lake, "broker-x", store.root)

    rows = _ingests(lake)
    assert [{k: v for k, v in r.items() if k != "ingested_timestamp"} for r in rows[:1]] == [
        {k: v for k, v in r.items() if k != "ingested_timestamp"} for r in written
    ]
    assert rows[0]["lost_to"] == 2 * FILE and rows[0]["end_offset"] == first.end
    assert [(r["from_offset"], r["records"]) for r in rows] == [(2 * FILE, 30), (first.end, 5)]
    assert second.records == 5


def test_a_store_after_retention_keeps_its_queue_offsets_for_every_reader_of_the_lake(tmp_path: Path) -> None:
    """A store whose oldest files retention deleted: its queues start far above 0. The lake's
    message store serves them from their first stored offset (``getMinOffsetInQueue``) to their
    end, a reset to the latest moves a group to that end, and ``export-store`` writes the queues
    back at their offsets."""
    store, lake = StoreWriter(tmp_path / "store", FILE, first_base=3 * FILE), tmp_path / "lake"
    store.append_many(40)
    ends = {queue: end for queue, end in store.queue_offsets.items() if queue[0] == "Orders"}
    firsts = {(w.topic, w.queue_id): w.queue_offset for w in reversed(store.written)}
    assert min(firsts.values()) >= 10  # the queues of a real store after retention do not restart at 0
    committed = {queue_id: firsts[("Orders", queue_id)] + 1 for queue_id in range(4)}
    table = ",".join(f"{q}:{o}" for q, o in committed.items())
    store.config("consumerOffset.json", f'{{"offsetTable":{{"Orders@cg-bar":{{{table}}}}}}}')
    assert ingest_store(lake, "broker-x", store.root).lost == (0, 3 * FILE)

    messages = MessageStore(lake, "broker-x").load()
    for (topic, queue_id), end in ends.items():
        first = firsts[(topic, queue_id)]
        assert (messages.min_offset(topic, queue_id), messages.max_offset(topic, queue_id)) == (first, end)
        stored = [w for w in store.written if (w.topic, w.queue_id) == (topic, queue_id)]
        got = [messages.message_at(topic, queue_id, offset) for offset in range(first, end)]
        assert [m.body if m is not None else None for m in got] == [w.body for w in stored]
        assert messages.message_at(topic, queue_id, first - 1) is None
    assert not messages.skipped

    to_latest = ResetConfig(
        lake, ("cg-bar",), (TopicSelection("Orders"),), False, Strategy("to_latest"), None, False, None, None
    )
    plan = reset_run(to_latest)
    assert {r.queue_id: (r.min_offset, r.max_offset, r.current, r.target) for r in plan} == {
        q: (firsts[("Orders", q)], ends[("Orders", q)], committed[q], ends[("Orders", q)]) for q in range(4)
    }
    assert all(r.redelivered == 0 for r in plan)  # to the latest never moves a group back

    out = tmp_path / "exported"
    export_store(lake, "broker-x", out, cq_units_per_file=16)
    for (topic, queue_id), end in ends.items():
        units = read_consume_queues(out)[(topic, queue_id)]
        assert min(units) == firsts[(topic, queue_id)] and max(units) == end - 1
        kept = {w.queue_offset: w.offset for w in store.written if (w.topic, w.queue_id) == (topic, queue_id)}
        assert {offset: units[offset][0] for offset in kept} == kept
