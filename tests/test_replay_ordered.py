"""The replay_ordered job: range planning and handler statuses in pure Python, its transforms on
hand-built rows, and, on a lake written by the real broker, a replay into each kind of sink that
is killed (SIGKILL of the driver) after its first batch and run again.

The kill tests check what the issue asks for: after the rerun the sink holds every source message
exactly once, in source queue order per queue, and the ordering report says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from broker_model.client import ConsumeOrderlyStatus, select_by_hash
from broker_model.common import Message, MessageQueue
from broker_model.common import constants as c
from broker_model.store import MessageExt, read_table
from broker_model.store.delta_commits import log_dir as delta_log_dir
from jobs.lake import Lake, delta_package
from jobs.replay import (
    REPLAYED_COLUMNS,
    SUMMARY_COLUMNS,
    Progress,
    QueueBounds,
    QueueRange,
    ReplayConfig,
    ReplayContext,
    TopicQueues,
    batch_count,
    build_config,
    build_dlq_selection,
    build_ordering_report,
    build_source_rows,
    deliver,
    filter_source_records,
    format_source,
    merge_queue_bounds,
    parse_source,
    plan_ranges,
    progress_after,
    queues_out_of_log_order,
    read_progress,
    run,
    running_hash,
    select_queue_id,
    summarize_source,
    write_progress,
)
from schemas.catalog import COMMITLOG, CONSUMER_OFFSET_COMMITS, REPLAY_PROGRESS, REPLAY_REPORT
from schemas.errors import ValidationError
from tests import replay_handlers
from tests.builders import commitlog_frame, commitlog_record, commitlog_table
from tests.helpers import ENGINE, assert_frames_equal

LAKE = Path("/lake")
REPO = Path(__file__).resolve().parent.parent
KEY = ("broker-a", "Orders", 0)


def _config(**overrides: Any) -> ReplayConfig:
    options: dict[str, Any] = {
        "replay_id": "r1",
        "lake": LAKE,
        "source": "queues",
        "topics": (TopicQueues("Orders"),),
        "to_table": Path("/sink"),
    }
    options.update(overrides)
    return ReplayConfig(**options)


# ---------------------------------------------------------------------------------------------
# Pure Python: ranges, batches, selector, statuses
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "bound", "expected"),
    [
        ({}, QueueBounds(*KEY, 3, 20), (3, 20)),
        ({"from_offset": 5, "to_offset": 12}, QueueBounds(*KEY, 0, 20), (5, 12)),
        ({"from_offset": 0, "to_offset": 99}, QueueBounds(*KEY, 3, 20), (3, 20)),  # clamped to the queue
        ({"from_time": 1, "to_time": 2}, QueueBounds(*KEY, 0, 20, time_start=4, time_end=9), (4, 9)),
        ({"from_time": 1, "to_time": 2}, QueueBounds(*KEY, 0, 20, time_start=None, time_end=None), (20, 20)),
        ({"source": "backlog", "group": "cg", "topics": ()}, QueueBounds(*KEY, 0, 20, committed=7), (7, 20)),
        ({"source": "backlog", "group": "cg", "topics": ()}, QueueBounds(*KEY, 0, 20, committed=30), (20, 20)),
    ],
)
def test_a_queue_range_comes_from_offsets_times_or_the_committed_offset(
    overrides: dict[str, Any], bound: QueueBounds, expected: tuple[int, int]
) -> None:
    (queue,) = plan_ranges([bound], _config(**overrides), {})
    assert (queue.first, queue.resume, queue.end) == (expected[0], expected[0], expected[1])


def test_progress_pins_the_start_and_a_run_resumes_after_progress_or_sink() -> None:
    bound = QueueBounds(*KEY, 0, 50)
    progress = {KEY: Progress(first=10, last=14, updated_timestamp=1)}
    (from_progress,) = plan_ranges([bound], _config(from_offset=0), progress)
    (from_sink,) = plan_ranges([bound], _config(from_offset=0), progress, {KEY: 19})
    assert (from_progress.first, from_progress.resume) == (10, 15)
    assert (from_sink.first, from_sink.resume) == (10, 20)


def test_batches_cover_every_queue_by_whole_batches_and_progress_stops_at_the_end() -> None:
    ranges = [QueueRange(*KEY, first=0, resume=4, end=11), QueueRange("broker-b", "Orders", 0, 0, 2, 3)]
    assert batch_count(ranges, 3) == 3
    assert progress_after(ranges, 1, 3) == {KEY: 6, ("broker-b", "Orders", 0): 2}
    assert progress_after(ranges, 3, 3) == {KEY: 10, ("broker-b", "Orders", 0): 2}


@pytest.mark.spark
def test_progress_rows_give_the_pinned_first_offset_and_the_last_offset_per_queue(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    assert read_progress(lake, "r1") == {}
    write_progress(lake, "r1", {KEY: 9, ("broker-b", "Orders", 0): -1})
    write_progress(lake, "r1", {KEY: 12})
    write_progress(lake, "r2", {KEY: 99})
    progress = read_progress(lake, "r1")
    assert {k: (p.first, p.last) for k, p in progress.items()} == {KEY: (10, 12), ("broker-b", "Orders", 0): (0, -1)}


@pytest.mark.parametrize("value", ["order-1", "order-42", "", "polygenelubricants", "中文"])
def test_the_selector_picks_the_queue_select_message_queue_by_hash_picks(value: str) -> None:
    queues = [MessageQueue("broker-a", "Target", q) for q in range(6)]
    expected = select_by_hash(queues, Message("Target", b"x"), value).queue_id
    assert select_queue_id(value, 3, 6) == expected
    assert select_queue_id(None, 9, 6) == 3


def test_the_source_property_names_broker_topic_queue_and_offset() -> None:
    text = format_source(("broker-a", "%DLQ%cg", 0), 17)
    assert text == "broker-a/%DLQ%cg/0/17"
    assert parse_source(text) == (("broker-a", "%DLQ%cg", 0), 17)
    assert parse_source("broker-a/Orders/x/1") is None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"replay_id": "bad id"}, "--replay-id"),
        ({"to_topic": "T"}, "sink"),
        ({"to_table": None, "to_topic": "Orders"}, "--to-topic"),
        ({"from_offset": 5, "to_offset": 5}, "--to-offset"),
        ({"from_offset": 1, "from_time": 5}, "--from-time"),
        ({"source": "dlq", "topics": (), "from_offset": 3}, "--from-offset"),
        ({"to_table": None, "handler": "no-colon"}, "--handler"),
        ({"selector_property": "ORDER_ID"}, "--selector-property"),
        ({"batch_rows": 0}, "--batch-rows"),
    ],
)
def test_bad_options_are_refused_naming_the_option(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        _config(**overrides)
    assert raised.value.field == field


def _message(offset: int) -> MessageExt:
    return MessageExt(
        "broker-a", "Orders", 0, offset, 100 * offset, 100, b"x", 0, 0, {}, 0, "h:1", 0, "h:2", 0, 0, 0, "id"
    )


def _handler(answers: list[Any], seen: list[list[int]]) -> Callable[[list[MessageExt], ReplayContext], Any]:
    def handle(messages: list[MessageExt], context: ReplayContext) -> Any:
        context.suspend_current_queue_time_millis = 10
        seen.append([m.queue_offset for m in messages])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return handle


def test_suspend_rollback_and_errors_deliver_the_same_batch_again_until_success() -> None:
    seen: list[list[int]] = []
    answers = [ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT, "ROLLBACK", RuntimeError("down"), None, "COMMIT"]
    assert deliver(_handler(answers, seen), [_message(5), _message(6)], "r1", 0, max_attempts=5) is None
    assert seen == [[5, 6]] * 5


def test_a_batch_never_advanced_fails_its_queue_after_max_attempts() -> None:
    seen: list[list[int]] = []
    failure = deliver(_handler([ConsumeOrderlyStatus.ROLLBACK] * 3, seen), [_message(1)], "r1", 4, max_attempts=3)
    assert failure is not None and "3 deliveries of batch 4" in failure and "ROLLBACK" in failure
    assert len(seen) == 3


# ---------------------------------------------------------------------------------------------
# Transforms on hand-built rows
# ---------------------------------------------------------------------------------------------

_RANGES_SCHEMA = "broker_name string, topic string, queue_id int, resume long, end long, first_batch long"


def _records(rows: list[tuple[str, str, int, int, int]]) -> list[dict[str, Any]]:
    """Commit log rows from (broker, topic, queue_id, queue_offset, sys_flag), each at commit log
    offset 1000 * queue_offset + queue_id."""
    return [
        commitlog_record(broker_name=b, topic=t, queue_id=q, queue_offset=o, sys_flag=f, commit_log_offset=1000 * o + q)
        for b, t, q, o, f in rows
    ]


@pytest.mark.spark
def test_source_rows_are_dispatched_records_in_range_numbered_by_batch(spark: SparkSession) -> None:
    records = _records(
        [
            ("broker-a", "Orders", 0, 3, 0),
            ("broker-a", "Orders", 0, 4, c.TRANSACTION_COMMIT_TYPE),
            ("broker-a", "Orders", 0, 5, c.TRANSACTION_PREPARED_TYPE),
            ("broker-a", "Orders", 0, 6, 0),
            ("broker-a", "Orders", 0, 9, 0),
            ("broker-a", "Orders", 1, 4, 0),
        ]
    )
    dispatched_df = filter_source_records(commitlog_frame(spark, records), [TopicQueues("Orders", (0,))])
    ranges_df = spark.createDataFrame([("broker-a", "Orders", 0, 4, 9, 7)], _RANGES_SCHEMA)
    rows_df = build_source_rows(dispatched_df, ranges_df, batch_rows=2).select("queue_offset", "replay_batch")
    assert_frames_equal(rows_df, spark.createDataFrame([(4, 7), (6, 8)], "queue_offset long, replay_batch long"))


def test_the_report_finds_gaps_duplicates_reordering_and_missing_queues() -> None:
    replayed = [
        *[("broker-a", "T", 0, o, o // 2, 10 + o) for o in range(4)],  # perfect
        *[("broker-a", "T", 1, o, 0, o) for o in (0, 1, 3)],  # offset 2 missing
        *[("broker-a", "T", 2, o, 0, i) for i, o in enumerate((0, 1, 1, 2))],  # offset 1 twice
        *[("broker-a", "T", 3, o, b, s) for o, b, s in ((0, 0, 0), (2, 0, 1), (1, 1, 0))],  # 2 before 1
    ]
    expected = [("broker-a", "T", q, o) for q in range(5) for o in range(4 if q != 3 else 3)]
    columns = list(zip(*replayed, strict=True))
    replayed_table = pa.Table.from_arrays(
        [
            pa.array(c, t)
            for c, t in zip(columns, (pa.string(), pa.string(), pa.int32(), *[pa.int64()] * 3), strict=True)
        ],
        names=list(REPLAYED_COLUMNS),
    )
    expected_table = pa.Table.from_pylist(
        [dict(zip(("broker_name", "topic", "queue_id", "queue_offset"), row, strict=True)) for row in expected],
        pa.schema(
            [
                ("broker_name", pa.string()),
                ("topic", pa.string()),
                ("queue_id", pa.int32()),
                ("queue_offset", pa.int64()),
            ]
        ),
    )
    # the sink's rows in two chunks (as from two data files), each queue's rows split between them
    chunks = [replayed_table.take(list(range(0, 14, 2))), replayed_table.take(list(range(1, 14, 2)))]
    report = build_ordering_report(chunks, expected_table, "r1", "run-1", "table:/sink", 5)
    rows = {r["queue_id"]: r for r in report}
    brief = {
        q: (
            r["rows"],
            r["first_offset"],
            r["last_offset"],
            r["gaps"],
            r["duplicates"],
            r["order_preserved"],
            r["complete"],
        )
        for q, r in rows.items()
    }
    assert brief == {
        0: (4, 0, 3, 0, 0, True, True),
        1: (3, 0, 3, 1, 0, True, False),
        2: (4, 0, 2, 0, 1, True, False),
        3: (3, 0, 2, 0, 0, False, False),
        4: (0, None, None, 0, 0, True, False),
    }
    assert [list(r) for r in report] == [REPLAY_REPORT.column_names] * 5
    assert [r["queue_id"] for r in report] == [0, 1, 2, 3, 4]
    assert pa.Table.from_pylist(report, REPLAY_REPORT.arrow_schema).num_rows == 5  # the table's types fit


def test_the_source_summary_keeps_dispatched_records_of_the_topics_and_finds_the_time_bounds() -> None:
    prepared, commit = c.TRANSACTION_PREPARED_TYPE, c.TRANSACTION_COMMIT_TYPE
    records = [  # broker, topic, queue id, queue offset, store timestamp, sys_flag
        *[("broker-a", "Orders", 0, o, 100 + 10 * o, 0) for o in range(6)],
        ("broker-a", "Orders", 0, 0, 135, prepared),  # a half message: not dispatched
        ("broker-a", "Orders", 0, 6, 170, commit),
        *[("broker-a", "Orders", 1, o, 100 + o, 0) for o in range(3)],  # queue 1 is not asked for
        *[("broker-b", "Orders", 0, o, 150 + o, 0) for o in range(2)],  # stored before the window ends
        ("broker-a", "Other", 0, 0, 100, 0),
    ]
    table = _summary_rows([(*r, 100 * i) for i, r in enumerate(records)])  # commit log offsets in list order
    chunks = [table.slice(0, 4), table.slice(4)]  # queue broker-a/Orders/0 in both chunks, as in two files

    summary = summarize_source(chunks, [TopicQueues("Orders", (0,))], from_time=125, to_time=160)

    assert summary.num_rows == 3
    assert queues_out_of_log_order(summary) == []
    assert merge_queue_bounds(summary) == [
        QueueBounds("broker-a", "Orders", 0, 0, 7, time_start=3, time_end=6),
        QueueBounds("broker-b", "Orders", 0, 0, 2, time_start=0, time_end=None),
    ]
    offsets = {}
    for row in summary.to_pylist():
        offsets.setdefault((row["broker_name"], row["queue_id"]), []).extend(row["offsets"])
    assert {k: sorted(v) for k, v in offsets.items()} == {("broker-a", 0): list(range(7)), ("broker-b", 0): [0, 1]}


def _summary_rows(records: list[tuple[Any, ...]]) -> pa.Table:
    """Commit log rows of :data:`SUMMARY_COLUMNS` from (broker, topic, queue id, queue offset, store
    timestamp, sys_flag, commit log offset) tuples."""
    rows = [commitlog_record(**dict(zip(SUMMARY_COLUMNS, record, strict=True))) for record in records]
    return commitlog_table(rows).select(list(SUMMARY_COLUMNS))


@pytest.mark.parametrize(
    ("chunks", "unordered"),
    [
        # (queue offset, commit log offset) of queue 0's records, per chunk (data file)
        pytest.param([[(0, 10), (1, 20)], [(2, 30), (3, 40)]], False, id="rising across two files"),
        pytest.param([[(2, 30), (3, 40)], [(0, 10), (1, 20)]], False, id="files listed out of log order"),
        pytest.param([[(0, 10), (2, 20), (1, 30)]], True, id="an offset falls within a file"),
        pytest.param([[(1, 20), (0, 10)]], False, id="a file not stored in log order but rising"),
        pytest.param([[(0, 10), (3, 40)], [(1, 20), (2, 30)]], True, id="two files' log ranges interleave"),
        pytest.param([[(0, 10), (2, 20)], [(1, 30), (3, 40)]], True, id="an offset falls at the seam"),
        pytest.param([[(0, 10), (1, 10)]], True, id="two records at one commit log offset"),
        pytest.param([[(0, 10), (0, 20), (1, 30)]], False, id="a duplicate queue offset later in the log"),
    ],
)
def test_the_log_order_check_finds_queues_whose_records_are_not_in_queue_order_by_commit_log_offset(
    chunks: list[list[tuple[int, int]]], unordered: bool
) -> None:
    other = [("broker-a", "Orders", 1, i, 0, 0, 1000 + i) for i in range(3)]  # a queue in order beside it
    tables = [
        _summary_rows([("broker-a", "Orders", 0, o, 0, 0, log) for o, log in chunk] + (other if i else []))
        for i, chunk in enumerate(chunks)
    ]

    summary = summarize_source(tables, [TopicQueues("Orders")], None, None)

    assert queues_out_of_log_order(summary) == ([("broker-a", "Orders", 0)] if unordered else [])


def test_the_running_hash_is_the_chain_it_names() -> None:
    offsets = np.array([5, 0, 2**40, 3], dtype=np.int64)
    chained = 0
    for offset in offsets.tolist():
        chained = (chained * 0x100000001B3 + offset) % 2**64
    assert running_hash(offsets) == chained
    assert running_hash(np.sort(offsets)) != chained
    assert running_hash(np.empty(0, np.int64)) == 0


@pytest.mark.spark
def test_dead_letters_are_found_in_their_dlq_queue_by_broker_and_msg_id(spark: SparkSession) -> None:
    records = _records(
        [
            ("broker-a", "%DLQ%cg", 0, 0, 0),
            ("broker-a", "%DLQ%cg", 0, 1, 0),
            ("broker-a", "%DLQ%other", 0, 0, 0),  # at log offset 0 as well: the msg_id of %DLQ%cg offset 0
            ("broker-b", "%DLQ%cg", 0, 1, 0),
        ]
    )
    dlq_df = spark.createDataFrame(
        [
            ("cg", "broker-a", records[1]["msg_id"]),
            ("cg", "broker-b", records[3]["msg_id"]),
            ("other", "broker-a", records[2]["msg_id"]),
        ],
        "group string, broker_name string, msg_id string",
    )
    selection_df = build_dlq_selection(dlq_df, commitlog_frame(spark, records), ["cg"])
    expected_df = spark.createDataFrame(
        [("broker-a", "%DLQ%cg", 0, 1), ("broker-b", "%DLQ%cg", 0, 1)],
        "broker_name string, topic string, queue_id int, queue_offset long",
    )
    assert_frames_equal(selection_df, expected_df)


# ---------------------------------------------------------------------------------------------
# A real lake, and replays killed after their first batch
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workload_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 messages written through two real brokers, with consumer groups' commits."""
    from broker_model.tools import run_workload

    lake = tmp_path_factory.mktemp("replay") / "lake"
    run_workload(lake, 2000, seed=7)
    return lake


@pytest.fixture
def lake(workload_lake: Path, tmp_path: Path) -> Path:
    """A copy of the workload lake this test may write to."""
    copy = tmp_path / "lake"
    shutil.copytree(workload_lake, copy, ignore=shutil.ignore_patterns("_locks"))
    return copy


def source_offsets(
    lake: Path, topics: set[str], queue_ids: set[int] | None = None
) -> dict[tuple[str, str, int], list[int]]:
    """Queue offsets of the dispatched records of ``topics``, per queue, in queue order."""
    rows = read_table(lake, COMMITLOG, ["broker_name", "topic", "queue_id", "queue_offset", "sys_flag"]).to_pylist()
    queues: dict[tuple[str, str, int], list[int]] = {}
    for row in rows:
        dispatched = row["sys_flag"] & c.TRANSACTION_ROLLBACK_TYPE in (0, c.TRANSACTION_COMMIT_TYPE)
        if row["topic"] in topics and dispatched and (queue_ids is None or row["queue_id"] in queue_ids):
            queues.setdefault((row["broker_name"], row["topic"], row["queue_id"]), []).append(row["queue_offset"])
    return {key: sorted(offsets) for key, offsets in queues.items()}


# a job process started by a test runs on the tests' engine: with delta-spark it needs the jars too
CHILD_ENV = {"PYSPARK_SUBMIT_ARGS": f"--packages {delta_package()} pyspark-shell"} if ENGINE == "delta-spark" else {}


def kill_when(args: list[str], ready: Callable[[], bool], env: dict[str, str] | None = None) -> None:
    """Run the job in a child process, SIGKILL it once ``ready()`` holds; fail if it ends first."""
    child = subprocess.Popen(
        [sys.executable, "-m", "jobs", "replay_ordered", *args],
        cwd=REPO,
        env={**os.environ, **CHILD_ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + (600 if ENGINE == "delta-spark" else 240)  # delta-spark: Ivy and a bigger JVM first
    try:
        while not ready():
            if child.poll() is not None:
                pytest.fail(
                    f"the replay ended before it could be killed:\n{child.stdout.read() if child.stdout else ''}"
                )
            if time.monotonic() > deadline:
                pytest.fail("the replay did not reach the kill point in time")
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()


def progress_rows(lake: Path, replay_id: str) -> list[dict[str, Any]]:
    """The replay's rows of ``replay_progress`` (none when the table is missing)."""
    if not delta_log_dir(lake / REPLAY_PROGRESS.path).exists():
        return []
    table = read_table(lake, REPLAY_PROGRESS)
    return table.filter(pc.equal(table["replay_id"], replay_id)).to_pylist()


def latest_report(lake: Path, replay_id: str) -> list[dict[str, Any]]:
    """The report rows of the replay's latest run."""
    rows = [r for r in read_table(lake, REPLAY_REPORT).to_pylist() if r["replay_id"] == replay_id]
    latest = max(rows, key=lambda r: r["report_timestamp"])["run_id"]
    return [r for r in rows if r["run_id"] == latest]


def _assert_report_complete(lake: Path, replay_id: str, expected: dict[tuple[str, str, int], list[int]]) -> None:
    report = {(r["broker_name"], r["topic"], r["queue_id"]): r for r in latest_report(lake, replay_id)}
    assert set(report) == set(expected)
    assert all(
        r["complete"] and r["order_preserved"] and not r["gaps"] and not r["duplicates"] for r in report.values()
    )
    assert {k: r["rows"] for k, r in report.items()} == {k: len(v) for k, v in expected.items()}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.spark
@pytest.mark.both_engines
def test_a_table_replay_killed_after_its_first_batch_ends_with_every_message_once_in_order(
    spark: SparkSession, lake: Path
) -> None:
    sink = lake / "replayed"
    args = [
        "--lake",
        str(lake),
        "--replay-id",
        "t1",
        "--topic",
        "Orders",
        "--from-offset",
        "2",
        "--to-offset",
        "32",
        "--to-table",
        str(sink),
        "--batch-rows",
        "2",
        "--engine",
        ENGINE,
    ]
    kill_when(args, lambda: _sink_version(sink, "t1") is not None)
    committed = _sink_version(sink, "t1")
    assert committed is not None and committed < 14  # killed before its 15th and last batch

    job_run = run(spark, build_config(args))

    expected = {k: [o for o in v if 2 <= o < 32] for k, v in source_offsets(lake, {"Orders"}).items()}
    assert _replay_orders(_sink_rows(sink)) == expected
    assert job_run.status == "SUCCEEDED"
    _assert_report_complete(lake, "t1", expected)
    assert all(_in_queue_order(file) for file in _sink_files(sink))  # rows stored in replay order too


@pytest.mark.slow
@pytest.mark.spark
def test_a_log_out_of_queue_order_is_replayed_in_queue_order_through_the_shuffle(
    spark: SparkSession, lake: Path, capsys: pytest.CaptureFixture[str], handler_out: Path
) -> None:
    def replay(replay_id: str, *sink: str) -> None:
        args = [
            "--lake",
            str(lake),
            "--replay-id",
            replay_id,
            "--topic",
            "Orders:0",
            *sink,
            "--batch-rows",
            "4",
            "--engine",
            ENGINE,
        ]
        assert run(spark, build_config(args)).status == "SUCCEEDED"

    replay("clean", "--to-table", str(lake / "clean"))  # a log the broker wrote: no shuffle
    assert "do not hold" not in capsys.readouterr().out
    clean = _sink_rows(lake / "clean", "source_commit_log_offset")
    assert all(r["replay_sequence"] == r["source_commit_log_offset"] for r in clean)
    _swap_queue_offsets(lake, ("broker-a", "Orders", 0), 1, 2)  # offset 2 now comes before 1, in one batch

    replay("swapped", "--to-table", str(lake / "swapped"))
    fell_back = capsys.readouterr().out
    replay("handled", "--handler", "tests.replay_handlers:record")  # the driver orders a handler's rows itself

    assert "do not hold broker-a/Orders/0 in queue order" in fell_back
    assert "do not hold" not in capsys.readouterr().out
    expected = source_offsets(lake, {"Orders"}, {0})
    for orders in (_replay_orders(clean), _replay_orders(_sink_rows(lake / "swapped")), _handled(handler_out)):
        assert orders == expected  # each queue in queue order: 0, 1, 2, ...
    _assert_report_complete(lake, "swapped", expected)
    assert all(_in_queue_order(file) for file in _sink_files(lake / "swapped"))


def _replay_orders(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], list[int]]:
    """Per source queue, the queue offsets of sink ``rows`` in replay order (batch, sequence)."""
    queues: dict[tuple[str, str, int], list[tuple[int, int, int]]] = {}
    for r in rows:
        key = (r["source_broker_name"], r["source_topic"], r["source_queue_id"])
        queues.setdefault(key, []).append((r["replay_batch"], r["replay_sequence"], r["source_queue_offset"]))
    return {key: [offset for _, _, offset in sorted(replayed)] for key, replayed in queues.items()}


def _swap_queue_offsets(lake: Path, key: tuple[str, str, int], a: int, b: int) -> None:
    """Rewrite the commit log with the queue offsets ``a`` and ``b`` of queue ``key`` swapped."""
    from deltalake import DeltaTable, write_deltalake

    table = DeltaTable(str(lake / COMMITLOG.path)).to_pyarrow_table()
    in_queue = pc.and_(
        pc.and_(pc.equal(table["broker_name"], key[0]), pc.equal(table["topic"], key[1])),
        pc.equal(table["queue_id"], key[2]),
    )
    offset = table["queue_offset"]
    swapped = pc.if_else(
        pc.and_(in_queue, pc.equal(offset, a)), b, pc.if_else(pc.and_(in_queue, pc.equal(offset, b)), a, offset)
    )
    table = table.set_column(table.schema.get_field_index("queue_offset"), "queue_offset", swapped)
    write_deltalake(
        str(lake / COMMITLOG.path),
        table.cast(COMMITLOG.arrow_schema),
        mode="overwrite",
        partition_by=list(COMMITLOG.partition_by),
    )


def _sink_files(sink: Path) -> list[Path]:
    from deltalake import DeltaTable

    return [Path(uri.removeprefix("file://")) for uri in DeltaTable(str(sink)).file_uris()]


def _in_queue_order(file: Path) -> bool:
    """Whether, in the file's row order, each source queue's offsets and sequence numbers rise."""
    import pyarrow.parquet as pq

    columns = ["source_broker_name", "source_queue_id", "source_queue_offset", "replay_sequence"]
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for row in pq.read_table(file, columns=columns).to_pylist():
        key = (row["source_broker_name"], row["source_queue_id"])
        position = (row["source_queue_offset"], row["replay_sequence"])
        if key in last and not (last[key][0] < position[0] and last[key][1] < position[1]):
            return False
        last[key] = position
    return True


def _sink_version(sink: Path, replay_id: str) -> int | None:
    from deltalake import DeltaTable

    return DeltaTable(str(sink)).transaction_version(replay_id) if DeltaTable.is_deltatable(str(sink)) else None


def _sink_rows(sink: Path, *extra: str) -> list[dict[str, Any]]:
    """The sink's rows: source queue and offset, batch and sequence, and the ``extra`` columns."""
    from deltalake import DeltaTable

    columns = [
        "source_broker_name",
        "source_topic",
        "source_queue_id",
        "source_queue_offset",
        "replay_batch",
        "replay_sequence",
        *extra,
    ]
    return DeltaTable(str(sink)).to_pyarrow_table(columns=columns).to_pylist()


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.spark
@pytest.mark.both_engines
def test_a_topic_replay_of_a_backlog_killed_mid_way_sends_every_message_once_in_order(
    spark: SparkSession, lake: Path
) -> None:
    args = [
        "--lake",
        str(lake),
        "--replay-id",
        "b1",
        "--group",
        "cg-orders",
        "--to-topic",
        "OrdersReplay",
        "--selector-property",
        "KEYS",
        "--batch-rows",
        "3",
        "--engine",
        ENGINE,
    ]
    commits = sorted(
        (r for r in read_table(lake, CONSUMER_OFFSET_COMMITS).to_pylist() if r["group"] == "cg-orders"),
        key=lambda r: (r["commit_timestamp"], r["offset"]),
    )
    starts = {(r["broker_name"], r["topic"], r["queue_id"]): r["offset"] for r in commits}  # the latest commit wins
    kill_when(
        args,
        lambda: any(
            r["last_offset"] >= starts[(r["broker_name"], r["topic"], r["queue_id"])] for r in progress_rows(lake, "b1")
        ),
    )

    job_run = run(spark, build_config(args))

    expected = {k: [o for o in v if o >= starts[k]] for k, v in source_offsets(lake, {"Orders"}).items() if k in starts}
    expected = {k: v for k, v in expected.items() if v}
    log = read_table(lake, COMMITLOG, ["broker_name", "topic", "commit_log_offset", "properties"]).to_pylist()
    replayed: dict[tuple[str, str, int], list[tuple[str, int, int]]] = {}
    for row in log:
        properties = dict(row["properties"])
        if row["topic"] == "OrdersReplay" and properties.get("REPLAY_ID") == "b1":
            source = parse_source(properties["REPLAY_SOURCE"])
            assert source is not None
            replayed.setdefault(source[0], []).append((row["broker_name"], row["commit_log_offset"], source[1]))
    assert {k: [o for _, _, o in sorted(v)] for k, v in replayed.items()} == expected
    assert job_run.status == "SUCCEEDED"
    _assert_report_complete(lake, "b1", expected)


@pytest.fixture
def handler_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The file the test handlers record to, in this process and in the job's child process."""
    out = tmp_path / "handled.txt"
    monkeypatch.setenv("REPLAY_TEST_OUT", str(out))
    replay_handlers.reset()
    yield out
    replay_handlers.reset()


def _handled(out: Path) -> dict[tuple[str, str, int], list[int]]:
    queues: dict[tuple[str, str, int], list[int]] = {}
    for line in out.read_text().splitlines():
        broker, topic, queue_id, offset = line.split()
        queues.setdefault((broker, topic, int(queue_id)), []).append(int(offset))
    return queues


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.spark
def test_a_handler_replay_killed_mid_way_is_resumed_and_an_idempotent_handler_sees_each_message_once(
    spark: SparkSession, lake: Path, handler_out: Path
) -> None:
    args = [
        "--lake",
        str(lake),
        "--replay-id",
        "h1",
        "--topic",
        "Payments:0,1",
        "--handler",
        "tests.replay_handlers:record",
        "--batch-rows",
        "4",
        "--engine",
        ENGINE,
    ]
    kill_when(
        args,
        lambda: handler_out.exists() and len(handler_out.read_text().splitlines()) >= 16,
        env={"REPLAY_TEST_SLEEP_MS": "150"},
    )
    expected = source_offsets(lake, {"Payments"}, {0, 1})
    assert sum(map(len, _handled(handler_out).values())) < sum(map(len, expected.values()))

    job_run = run(spark, build_config(args))

    assert _handled(handler_out) == expected
    assert job_run.status == "SUCCEEDED"
    report = latest_report(lake, "h1")  # this run's deliveries: from where the progress stood
    assert all(
        r["order_preserved"]
        and r["complete"]
        and r["last_offset"] == expected[(r["broker_name"], r["topic"], r["queue_id"])][-1]
        for r in report
    )


@pytest.mark.slow
@pytest.mark.spark
def test_a_queue_whose_handler_keeps_suspending_fails_alone_while_the_others_complete(
    spark: SparkSession, lake: Path, handler_out: Path
) -> None:
    args = [
        "--lake",
        str(lake),
        "--replay-id",
        "s1",
        "--topic",
        "Notifications",
        "--broker",
        "broker-a",
        "--handler",
        "tests.replay_handlers:stubborn",
        "--batch-rows",
        "50",
        "--max-attempts",
        "3",
    ]
    job_run = run(spark, build_config(args))

    expected = source_offsets(lake, {"Notifications"})
    handled = _handled(handler_out)
    assert job_run.status == "FAILED" and "broker-a/Notifications/0" in (job_run.message or "")
    assert handled == {k: v for k, v in expected.items() if k[0] == "broker-a" and k[2] != 0}
    progress = {(r["queue_id"], r["last_offset"]) for r in progress_rows(lake, "s1")}
    assert (0, -1) in progress and not any(q == 0 and last >= 0 for q, last in progress)
