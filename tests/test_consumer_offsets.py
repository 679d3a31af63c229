"""The consumer_offsets job: its transforms on hand-built frames, its view, and runs on real lakes.

Hand-built queues use small store times (100, 200, ...) so that every expected figure can be
checked by eye; ``E`` rows are consume-queue rows (broker, topic, queue id, queue offset,
store time), ``C`` rows offset commits (group, broker, topic, queue id, offset, commit time, source).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession

from jobs.cli import iso_utc
from jobs.consumer_offsets import (
    ConsumerOffsetsConfig,
    build_config,
    build_configured_queues,
    build_consumer_offsets,
    build_queue_bounds,
    format_progress,
    main,
    run,
    union_empty_queues,
)
from jobs.lake import Lake
from jobs.rules import build_current_offsets
from jobs.runs import MOVE_ON_FROM
from schemas.catalog import CONSUME_QUEUE, CONSUMER_OFFSET_COMMITS, CONSUMER_OFFSETS, TOPIC_CONFIG, spark_schema
from schemas.errors import ValidationError
from tests.helpers import ENGINE, assert_frames_equal

E = tuple[str, str, int, int, int]
C = tuple[str, str, str, int, int, int, str]

_CURRENT_SCHEMA = (
    "group string, broker_name string, topic string, queue_id int, consumer_offset long, "
    "commit_timestamp long, source string"
)
_BOUNDS_SCHEMA = "broker_name string, topic string, queue_id int, broker_min_offset long, broker_offset long"
_NOT_FOUND = "QUEUE_NOT_FOUND"
_AS_OF = 1000


def _commits(spark: SparkSession, rows: list[C]) -> DataFrame:
    """Offset commits with the catalog schema; reset rows carry audit columns, others nulls."""
    full = [
        (*row, "10.0.0.1@1", *(("r-1", 0, "test", "ops@host") if row[6] == "reset" else (None,) * 4)) for row in rows
    ]
    return spark.createDataFrame(full, spark_schema(CONSUMER_OFFSET_COMMITS))


def _entries(spark: SparkSession, rows: list[E]) -> DataFrame:
    """Consume queue entries with the catalog schema (physical offsets made up from the queue offset)."""
    full = [(b, t, q, o, 1_000_000 * q + 100 * o, 100, 0, ts) for b, t, q, o, ts in rows]
    return spark.createDataFrame(full, spark_schema(CONSUME_QUEUE))


def _offsets(spark: SparkSession, rows: list[tuple[object, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, spark_schema(CONSUMER_OFFSETS))


def _current(spark: SparkSession, rows: list[tuple[str, str, str, int, int]]) -> DataFrame:
    """Hand-built current offsets: (group, broker, topic, queue id, consumer offset)."""
    return spark.createDataFrame([(*row, 1, "consumer") for row in rows], _CURRENT_SCHEMA)


def _consumer_offsets(
    spark: SparkSession, current: list[tuple[str, str, str, int, int]], cq_rows: list[E], as_of: int = _AS_OF
) -> DataFrame:
    cq_rows_df = _entries(spark, cq_rows)
    return build_consumer_offsets(_current(spark, current), build_queue_bounds(cq_rows_df, as_of), cq_rows_df, as_of)


def _orders_q0(*times: int) -> list[E]:
    """Entries 0, 1, ... of queue (broker-a, Orders, 0) stored at ``times``."""
    return [("broker-a", "Orders", 0, offset, ts) for offset, ts in enumerate(times)]


# ---------------------------------------------------------------------------------------------
# build_current_offsets
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_current_offset_is_the_latest_commit_at_or_before_as_of(spark: SparkSession) -> None:
    commits_df = _commits(
        spark,
        [
            ("g", "broker-a", "Orders", 0, 5, 10, "consumer"),
            ("g", "broker-a", "Orders", 0, 9, 30, "consumer"),  # at as_of exactly: counts
            ("g", "broker-a", "Orders", 0, 8, 20, "consumer"),
            ("g", "broker-a", "Orders", 0, 12, 31, "consumer"),  # after as_of
            ("g", "broker-b", "Orders", 0, 1, 5, "consumer"),  # same queue id on another broker
            ("late", "broker-a", "Orders", 0, 3, 40, "consumer"),  # a group that commits only after as_of
        ],
    )
    expected_df = spark.createDataFrame(
        [("g", "broker-a", "Orders", 0, 9, 30, "consumer"), ("g", "broker-b", "Orders", 0, 1, 5, "consumer")],
        _CURRENT_SCHEMA,
    )
    assert_frames_equal(build_current_offsets(commits_df, as_of=30), expected_df)


@pytest.mark.spark
def test_current_offset_tie_goes_to_reset_then_to_the_larger_offset(spark: SparkSession) -> None:
    commits_df = _commits(
        spark,
        [
            ("g", "broker-a", "Orders", 0, 50, 10, "consumer"),
            ("g", "broker-a", "Orders", 0, 3, 10, "reset"),
            ("g", "broker-a", "Orders", 1, 7, 10, "consumer"),
            ("g", "broker-a", "Orders", 1, 4, 10, "consumer"),
        ],
    )
    expected_df = spark.createDataFrame(
        [("g", "broker-a", "Orders", 0, 3, 10, "reset"), ("g", "broker-a", "Orders", 1, 7, 10, "consumer")],
        _CURRENT_SCHEMA,
    )
    assert_frames_equal(build_current_offsets(commits_df, as_of=_AS_OF), expected_df)


# ---------------------------------------------------------------------------------------------
# build_queue_bounds
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_queue_bounds_span_the_entries_stored_at_or_before_as_of(spark: SparkSession) -> None:
    cq_rows_df = _entries(
        spark,
        [
            ("broker-a", "Orders", 0, 3, 100),  # the head (0..2) is gone: min offset 3
            ("broker-a", "Orders", 0, 4, 200),  # at as_of exactly: counts
            ("broker-a", "Orders", 0, 5, 300),
            ("broker-a", "Orders", 1, 0, 300),  # a queue whose entries all come after as_of
            ("broker-b", "Orders", 0, 0, 50),
        ],
    )
    expected_df = spark.createDataFrame(
        [("broker-a", "Orders", 0, 3, 5), ("broker-b", "Orders", 0, 0, 1)], _BOUNDS_SCHEMA
    )
    assert_frames_equal(build_queue_bounds(cq_rows_df, as_of=200), expected_df)


@pytest.mark.spark
def test_configured_queues_are_those_of_each_topics_latest_configuration_at_or_before_as_of(
    spark: SparkSession,
) -> None:
    topic_config_df = spark.createDataFrame(
        [
            ("broker-a", "Orders", 1, 6, 100, None),
            ("broker-a", "Orders", 3, 6, 200, "FIFO"),  # the latest at as_of: queues 0..2
            ("broker-a", "Orders", 8, 6, 201, "FIFO"),  # after as_of
            ("broker-b", "Gone", 0, 6, 100, None),  # no queue
        ],
        spark_schema(TOPIC_CONFIG),
    )
    expected_df = spark.createDataFrame(
        [("broker-a", "Orders", q) for q in range(3)], "broker_name string, topic string, queue_id int"
    )
    assert_frames_equal(build_configured_queues(topic_config_df, as_of=200), expected_df)


@pytest.mark.spark
def test_a_configured_queue_without_entries_is_an_empty_queue_listed_as_rocketmq_lists_it(spark: SparkSession) -> None:
    """RocketMQ's consumerProgress lists every queue of the group's topics: an empty one with broker
    offset 0 and diff 0. A commit on a queue the configuration does not have stays QUEUE_NOT_FOUND.
    The group's empty retry topic, which it never committed on, RocketMQ does not list."""
    cq_rows_df = _entries(spark, _orders_q0(100, 200))
    configured_df = spark.createDataFrame(
        [("broker-a", "Orders", q) for q in range(3)] + [("broker-a", "%RETRY%g", 0)],
        "broker_name string, topic string, queue_id int",
    )
    bounds_df = union_empty_queues(build_queue_bounds(cq_rows_df, _AS_OF), configured_df)
    current = [("g", "broker-a", "Orders", 0, 2), ("g", "broker-a", "Orders", 1, 0), ("g", "broker-a", "Orders", 7, 0)]
    actual_df = build_consumer_offsets(_current(spark, current), bounds_df, cq_rows_df, _AS_OF)
    expected_df = _offsets(
        spark,
        [
            ("g", "broker-a", "Orders", 0, 2, 0, 2, 0, 200, None, _AS_OF, None),
            ("g", "broker-a", "Orders", 1, 0, 0, 0, 0, None, None, _AS_OF, None),  # empty, committed 0
            ("g", "broker-a", "Orders", 2, None, 0, 0, 0, None, None, _AS_OF, None),  # empty, no commit
            ("g", "broker-a", "Orders", 7, 0, None, None, None, None, None, _AS_OF, _NOT_FOUND),
        ],
    )
    assert_frames_equal(actual_df, expected_df)


# ---------------------------------------------------------------------------------------------
# build_consumer_offsets
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_lag_of_a_consumer_inside_the_queue(spark: SparkSession) -> None:
    actual_df = _consumer_offsets(spark, [("g", "broker-a", "Orders", 0, 2)], _orders_q0(100, 200, 300, 400))
    expected_df = _offsets(spark, [("g", "broker-a", "Orders", 0, 2, 0, 4, 2, 200, 300, _AS_OF, None)])
    assert_frames_equal(actual_df, expected_df)


@pytest.mark.spark
def test_caught_up_consumer_has_no_diff_and_no_unconsumed_message(spark: SparkSession) -> None:
    actual_df = _consumer_offsets(spark, [("g", "broker-a", "Orders", 0, 3)], _orders_q0(100, 200, 300))
    expected_df = _offsets(spark, [("g", "broker-a", "Orders", 0, 3, 0, 3, 0, 300, None, _AS_OF, None)])
    assert_frames_equal(actual_df, expected_df)


@pytest.mark.spark
def test_commit_beyond_the_queue_end_keeps_its_negative_diff(spark: SparkSession) -> None:
    cq_rows = _orders_q0(100, 200, 300, 400, 2000, 2100)  # 4 and 5 are stored after as_of: they do not count
    actual_df = _consumer_offsets(spark, [("g", "broker-a", "Orders", 0, 6)], cq_rows)
    expected_df = _offsets(spark, [("g", "broker-a", "Orders", 0, 6, 0, 4, -2, None, None, _AS_OF, None)])
    assert_frames_equal(actual_df, expected_df)


@pytest.mark.spark
def test_commit_below_the_first_entry_is_unconsumed_from_the_first_entry(spark: SparkSession) -> None:
    cq_rows = [("broker-a", "Orders", 0, 2, 300), ("broker-a", "Orders", 0, 3, 400)]  # 0 and 1 are gone
    actual_df = _consumer_offsets(spark, [("g", "broker-a", "Orders", 0, 1)], cq_rows)
    expected_df = _offsets(spark, [("g", "broker-a", "Orders", 0, 1, 2, 4, 3, None, 300, _AS_OF, None)])
    assert_frames_equal(actual_df, expected_df)


@pytest.mark.spark
def test_commit_on_a_queue_without_entries_as_of_t_is_reported_not_dropped(spark: SparkSession) -> None:
    cq_rows = [*_orders_q0(100), ("broker-a", "Gone", 0, 0, 2000)]  # Gone's only entry comes after as_of
    current = [("g", "broker-a", "Orders", 0, 1), ("g", "broker-a", "Gone", 0, 5)]
    expected_df = _offsets(
        spark,
        [
            ("g", "broker-a", "Orders", 0, 1, 0, 1, 0, 100, None, _AS_OF, None),
            ("g", "broker-a", "Gone", 0, 5, None, None, None, None, None, _AS_OF, _NOT_FOUND),
        ],
    )
    assert_frames_equal(_consumer_offsets(spark, current, cq_rows), expected_df)


@pytest.mark.spark
def test_retry_queues_of_committing_groups_are_listed_without_a_commit(spark: SparkSession) -> None:
    cq_rows = [
        *_orders_q0(100),
        ("broker-a", "%RETRY%g", 0, 0, 150),
        ("broker-a", "%RETRY%g", 0, 1, 250),
        ("broker-a", "%RETRY%h", 0, 0, 150),  # retry topic of a group without commits: not listed
    ]
    expected_df = _offsets(
        spark,
        [
            ("g", "broker-a", "Orders", 0, 1, 0, 1, 0, 100, None, _AS_OF, None),
            # no commit: counted from 0 as RocketMQ shows it, so diff = broker_offset
            ("g", "broker-a", "%RETRY%g", 0, None, 0, 2, 2, None, 150, _AS_OF, None),
        ],
    )
    assert_frames_equal(_consumer_offsets(spark, [("g", "broker-a", "Orders", 0, 1)], cq_rows), expected_df)


@pytest.mark.spark
def test_never_consumed_queues_of_a_consumed_topic_are_listed(spark: SparkSession) -> None:
    cq_rows = [
        *_orders_q0(100),
        ("broker-a", "Orders", 1, 0, 120),
        ("broker-b", "Orders", 0, 4, 130),  # another broker's queue, head gone
        ("broker-b", "Audit", 0, 0, 140),  # a topic the group does not consume
    ]
    expected_df = _offsets(
        spark,
        [
            ("g", "broker-a", "Orders", 0, 1, 0, 1, 0, 100, None, _AS_OF, None),
            ("g", "broker-a", "Orders", 1, None, 0, 1, 1, None, 120, _AS_OF, None),
            ("g", "broker-b", "Orders", 0, None, 4, 5, 5, None, 130, _AS_OF, None),
        ],
    )
    assert_frames_equal(_consumer_offsets(spark, [("g", "broker-a", "Orders", 0, 1)], cq_rows), expected_df)


@pytest.mark.spark
def test_gaps_and_duplicate_entries_still_give_one_row_per_queue(spark: SparkSession) -> None:
    cq_rows = [
        ("broker-a", "Orders", 0, 0, 100),
        ("broker-a", "Orders", 0, 1, 160),
        ("broker-a", "Orders", 0, 1, 150),  # duplicate queue offset: the earlier store time wins
        ("broker-a", "Orders", 0, 3, 400),  # offset 2 is missing
    ]
    current = [("dup", "broker-a", "Orders", 0, 2), ("gap", "broker-a", "Orders", 0, 3)]
    expected_df = _offsets(
        spark,
        [
            ("dup", "broker-a", "Orders", 0, 2, 0, 4, 2, 150, None, _AS_OF, None),
            ("gap", "broker-a", "Orders", 0, 3, 0, 4, 1, None, 400, _AS_OF, None),
        ],
    )
    assert_frames_equal(_consumer_offsets(spark, current, cq_rows), expected_df)


_TIMELINE_COMMITS: list[C] = [
    ("g", "broker-a", "Orders", 0, 1, 150, "consumer"),
    ("g", "broker-a", "Orders", 0, 3, 350, "consumer"),
]

_TIMELINE = [
    (50, []),  # before any commit: no group, no row
    (150, [("g", "broker-a", "Orders", 0, 1, 0, 1, 0, 100, None, 150, None)]),
    (250, [("g", "broker-a", "Orders", 0, 1, 0, 2, 1, 100, 200, 250, None)]),
    (350, [("g", "broker-a", "Orders", 0, 3, 0, 3, 0, 300, None, 350, None)]),
    (1000, [("g", "broker-a", "Orders", 0, 3, 0, 4, 1, 300, 400, 1000, None)]),
]


@pytest.mark.spark
@pytest.mark.parametrize(("as_of", "expected"), _TIMELINE, ids=[f"as_of={t}" for t, _ in _TIMELINE])
def test_lag_as_of_a_past_time_counts_only_commits_and_entries_until_then(
    spark: SparkSession, as_of: int, expected: list[tuple[object, ...]]
) -> None:
    cq_rows_df = _entries(spark, _orders_q0(100, 200, 300, 400))
    current_df = build_current_offsets(_commits(spark, _TIMELINE_COMMITS), as_of)
    actual_df = build_consumer_offsets(current_df, build_queue_bounds(cq_rows_df, as_of), cq_rows_df, as_of)
    assert_frames_equal(actual_df, _offsets(spark, expected))


# ---------------------------------------------------------------------------------------------
# The printed view, the run message, the command line (no Spark)
# ---------------------------------------------------------------------------------------------


def _row(
    group: str,
    topic: str,
    queue_id: int,
    consumer: int | None,
    broker: int | None,
    diff: int | None,
    last: int | None = None,
    anomaly: str | None = None,
) -> dict[str, object]:
    return {
        "group": group,
        "broker_name": "broker-a",
        "topic": topic,
        "queue_id": queue_id,
        "consumer_offset": consumer,
        "broker_offset": broker,
        "diff": diff,
        "last_timestamp": last,
        "anomaly": anomaly,
    }


def test_progress_view_sorts_queues_per_group_and_totals_the_known_diffs() -> None:
    rows = [
        _row("g", "Orders", 1, 3, 5, 2, last=1_700_000_000_000),
        _row("g", "%RETRY%g", 0, None, 4, 4),
        _row("g", "Gone", 0, 7, None, None, anomaly=_NOT_FOUND),
        _row("a", "Orders", 0, 9, 5, -4),
    ]
    lines = format_progress(rows, as_of=1_700_000_000_000, groups=["g", "missing"])

    assert lines[0] == "consumer progress as of 2023-11-14T22:13:20.000Z (1700000000000)"
    assert [line for line in lines if line.startswith(("Group", "Diff Total"))] == [
        "Group: a",
        "Diff Total: -4",
        "Group: g",
        "Diff Total: 6",
        "Group: missing: no offsets as of 2023-11-14T22:13:20.000Z",
    ]
    g_lines = lines[lines.index("Group: g") + 2 : lines.index("Diff Total: 6")]
    assert [line.split()[:6] for line in g_lines] == [
        ["%RETRY%g", "broker-a", "0", "4", "0", "4"],
        ["Gone", "broker-a", "0", "-", "7", "-"],
        ["Orders", "broker-a", "1", "5", "3", "2"],
    ]
    assert g_lines[0].split()[6:] == ["N/A", "no", "commit"]
    assert g_lines[1].split()[6:] == ["N/A", _NOT_FOUND]
    assert g_lines[2].split()[6:] == ["2023-11-14T22:13:20.000Z"]


@pytest.mark.parametrize(
    ("epoch_ms", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
    ],
)
def test_iso_utc_prints_milliseconds_in_utc(epoch_ms: int, text: str) -> None:
    assert iso_utc(epoch_ms) == text


def test_command_line_takes_iso_instants_and_repeated_groups() -> None:
    config = build_config(
        ["--lake", "/l", "--as-of", "2026-11-22T10:00:00+08:00", "--group", "b", "--group", "a", "--group", "b"]
    )
    assert config == ConsumerOffsetsConfig(Path("/l"), 1_795_312_800_000, ("b", "a"), "auto")


def test_command_line_refuses_an_as_of_without_a_zone_before_starting_spark() -> None:
    with pytest.raises(ValidationError, match=r"--as-of.*no time zone"):
        main(["--as-of", "2026-11-22T02:00:00"])


def test_command_line_takes_the_driver_limit_and_refuses_a_negative_one() -> None:
    assert build_config(["--lake", "/l", "--as-of", "0", "--driver-rows", "0"]).driver_rows == 0
    with pytest.raises(ValidationError, match="driver_rows"):
        build_config(["--lake", "/l", "--as-of", "0", "--driver-rows", "-1"])


def test_command_line_takes_the_move_on_share_and_refuses_a_negative_or_nan_one() -> None:
    assert build_config(["--lake", "/l", "--as-of", "0"]).move_on_share == 0.5
    assert build_config(["--lake", "/l", "--as-of", "0", "--move-on-share", "2"]).move_on_share == 2.0
    for bad in ("-0.1", "nan"):
        with pytest.raises(ValidationError, match="move_on_share"):
            build_config(["--lake", "/l", "--as-of", "0", "--move-on-share", bad])


def test_command_line_takes_the_size_moving_on_starts_at_and_refuses_a_negative_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert build_config(["--lake", "/l", "--as-of", "0"]).move_on_from == MOVE_ON_FROM == 4_000_000
    assert build_config(["--lake", "/l", "--as-of", "0", "--move-on-from", "0"]).move_on_from == 0
    with pytest.raises(SystemExit) as exit_info:
        build_config(["--lake", "/l", "--as-of", "0", "--move-on-from", "-1"])
    assert exit_info.value.code == 2
    assert "--move-on-from: -1 is below 0" in capsys.readouterr().err
    with pytest.raises(ValidationError, match="move_on_from"):
        ConsumerOffsetsConfig(Path("/l"), 0, move_on_from=-1)


# ---------------------------------------------------------------------------------------------
# run() on real Delta tables
# ---------------------------------------------------------------------------------------------


def _runs(lake: Lake) -> list[tuple[str, str | None, dict[str, str] | None]]:
    rows = lake.read("job_runs").orderBy("started_timestamp", "run_id").collect()
    return [(r["status"], r["message"], r["parameters"]) for r in rows]


@pytest.mark.spark
def test_run_on_a_lake_without_inputs_writes_an_empty_table(spark: SparkSession, tmp_path: Path) -> None:
    job_run = run(spark, ConsumerOffsetsConfig(tmp_path, as_of=_AS_OF, engine=ENGINE))

    lake = Lake(spark, tmp_path, ENGINE)
    assert lake.read(CONSUMER_OFFSETS).count() == 0
    assert (job_run.status, job_run.input_versions) == ("SUCCEEDED", {})
    assert job_run.row_counts == {"consumer_offset_commits": 0, "consume_queue": 0, "consumer_offsets": 0}
    assert _runs(lake) == [("SUCCEEDED", "consumer_offsets overwritten", {"as_of": "1000", "plan": '"whole"'})]


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path) -> Lake:
    """A lake with two commits of group g and four entries of (broker-a, Orders, 0)."""
    lake = Lake(spark, tmp_path, ENGINE)
    lake.append(CONSUMER_OFFSET_COMMITS, _commits(spark, _TIMELINE_COMMITS))
    lake.append(CONSUME_QUEUE, _entries(spark, _orders_q0(100, 200, 300, 400)))
    return lake


@pytest.mark.spark
def test_rerun_with_the_same_inputs_and_as_of_commits_nothing(spark: SparkSession, lake: Lake) -> None:
    config = ConsumerOffsetsConfig(lake.root, as_of=_AS_OF, engine=ENGINE)
    first = run(spark, config)
    version = lake.version(CONSUMER_OFFSETS)
    assert first.status == "SUCCEEDED"
    assert first.input_versions == {
        "consumer_offset_commits": lake.version(CONSUMER_OFFSET_COMMITS),
        "consume_queue": lake.version(CONSUME_QUEUE),
    }
    assert_frames_equal(lake.read(CONSUMER_OFFSETS), _offsets(spark, [_TIMELINE[-1][1][0]]))

    second = run(spark, config)

    assert second.status == "NOOP"
    assert lake.version(CONSUMER_OFFSETS) == version
    assert second.output_versions == {"consumer_offsets": version}
    assert [status for status, _, _ in _runs(lake)] == ["SUCCEEDED", "NOOP"]


@pytest.mark.spark
def test_rerun_after_a_new_commit_writes_a_new_version(spark: SparkSession, lake: Lake) -> None:
    config = ConsumerOffsetsConfig(lake.root, as_of=_AS_OF, engine=ENGINE)
    run(spark, config)
    version = lake.version(CONSUMER_OFFSETS)
    assert version is not None
    new_commit = _commits(spark, [("g", "broker-a", "Orders", 0, 4, 900, "consumer")])
    commits_version = lake.append(CONSUMER_OFFSET_COMMITS, new_commit)

    job_run = run(spark, config)

    assert job_run.status == "SUCCEEDED"
    assert lake.version(CONSUMER_OFFSETS) == version + 1
    assert job_run.input_versions["consumer_offset_commits"] == commits_version
    expected = [("g", "broker-a", "Orders", 0, 4, 0, 4, 0, 400, None, _AS_OF, None)]
    assert_frames_equal(lake.read(CONSUMER_OFFSETS), _offsets(spark, expected))


@pytest.mark.spark
@pytest.mark.parametrize("driver_rows", [0, 1_000], ids=["spark", "driver"])
def test_a_topic_config_of_an_older_release_is_read_after_it_gets_its_new_column(
    spark: SparkSession, lake: Lake, driver_rows: int
) -> None:
    old = pa.schema([field for field in TOPIC_CONFIG.arrow_schema if field.name != "message_type"])
    row = {"broker_name": "broker-a", "topic": "Orders", "queue_nums": 2, "perm": 6, "updated_timestamp": 50}
    write_deltalake(str(lake.location(TOPIC_CONFIG)), pa.Table.from_pylist([row], schema=old))

    job_run = run(spark, ConsumerOffsetsConfig(lake.root, as_of=_AS_OF, engine=ENGINE, driver_rows=driver_rows))

    assert job_run.status == "SUCCEEDED"
    assert "message_type" in lake.read(TOPIC_CONFIG).columns
    # queue 1 of Orders holds no message yet: listed from the old row, as an empty queue
    rows = {
        r["queue_id"]: (r["broker_offset"], r["consumer_offset"]) for r in lake.read_rows(CONSUMER_OFFSETS).to_pylist()
    }
    assert rows == {0: (4, 3), 1: (0, None)}


@pytest.mark.spark
def test_run_as_of_a_past_time_writes_and_prints_the_lag_seen_then(
    spark: SparkSession, lake: Lake, capsys: pytest.CaptureFixture[str]
) -> None:
    run(spark, ConsumerOffsetsConfig(lake.root, as_of=_AS_OF, engine=ENGINE))
    version = lake.version(CONSUMER_OFFSETS)
    assert version is not None
    capsys.readouterr()

    job_run = run(spark, ConsumerOffsetsConfig(lake.root, as_of=250, groups=("g", "other"), engine=ENGINE))
    out = capsys.readouterr().out

    assert job_run.status == "SUCCEEDED"  # same inputs, another as_of: computed again
    assert lake.version(CONSUMER_OFFSETS) == version + 1
    assert_frames_equal(lake.read(CONSUMER_OFFSETS), _offsets(spark, _TIMELINE[2][1]))
    assert "Orders  broker-a      0     2               1                 1      1970-01-01T00:00:00.100Z" in out
    assert "Diff Total: 1" in out
    assert "Group: other: no offsets as of 1970-01-01T00:00:00.250Z" in out
