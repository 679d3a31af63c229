"""The lake I/O on real Delta tables under tmp_path, on the run's engine (the bridge or
delta-spark: RMQ_TEST_ENGINE). delta-rs is the independent reader and writer the engines are
checked against.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from broker_model.store import ensure_table
from broker_model.store.delta_commits import commit_path
from jobs.lake import ENGINE_CONF, IncrementalReadError, Lake, detect_engine, pack_appended, resolve_engine, session
from jobs.lake.bridge import commit_data_files, write_data_files
from jobs.lake.snapshots import add_actions, files_that_may_match
from schemas.catalog import (
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUMER_OFFSET_COMMITS,
    PLAIN_ENCODED_COLUMNS,
    TableSpec,
    spark_schema,
)
from schemas.errors import LakeError, ValidationError
from tests.builders import T0, commitlog_frame, commitlog_record, commitlog_table
from tests.helpers import ENGINE, assert_frames_equal, canonical_rows, column_encodings

pytestmark = [pytest.mark.spark, pytest.mark.both_engines]

# topic names as RocketMQ makes them ('%' in retry/DLQ topics) plus characters that need escaping
# in Hive-style directories and URL-encoding in the Delta log
TOPICS = ("TopicA", "%RETRY%group-a", "odd topic+=#é")


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path) -> Lake:
    return Lake(spark, tmp_path / "lake", engine=ENGINE)


def _frame(spark: SparkSession, spec: TableSpec, rows: list[tuple[object, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, spark_schema(spec))


def _offset_commits(spark: SparkSession) -> DataFrame:
    rows = [
        ("cg", "broker-a", "TopicA", 0, 10, 1_700_000_000_000, "consumer", "10.0.0.1@1", None, None, None, None),
        ("cg", "broker-a", "TopicA", 1, 0, 1_700_000_000_001, "reset", None, "r-1", 7, "re-read", "ops@host"),
        (
            "cg-2",
            "broker-b",
            "%RETRY%cg-2",
            3,
            2**40,
            1_700_000_000_002,
            "replay",
            "10.0.0.2@7",
            None,
            None,
            None,
            None,
        ),
    ]
    return _frame(spark, CONSUMER_OFFSET_COMMITS, rows)


def _queue_units(spark: SparkSession, topics: tuple[str, ...] = TOPICS, base: int = 0) -> DataFrame:
    rows = [
        ("broker-a", topic, queue_id, offset, base + 1000 * t + offset, 120, -7, 1_700_000_000_000 + offset)
        for t, topic in enumerate(topics)
        for queue_id in (0, 1)
        for offset in (0, 1)
    ]
    return _frame(spark, CONSUME_QUEUE, rows)


def _record(
    broker: str, segment: int, offset: int, body: bytes, properties: dict[str, str], **columns: Any
) -> dict[str, Any]:
    return commitlog_record(
        broker_name=broker,
        segment=segment,
        commit_log_offset=offset,
        queue_offset=offset // 100,
        body=body,
        properties=properties,
        born_timestamp=1_700_000_000_000,
        store_timestamp=1_700_000_000_005,
        **columns,
    )


def _commitlog(spark: SparkSession) -> DataFrame:
    rows = [
        _record("broker-a", 0, 0, b"\x00\x01binary\xff", {"TAGS": "t1", "UNIQ_KEY": "u1"}),
        _record("broker-a", 0, 200, b"", {}),
        _record("broker-a", 4096, 4096, b"x" * 300, {"KEYS": "k1 k2", "DELAY": "3"}),
        _record("broker b/%é", 0, 0, b"\xde\xad", {"TAGS": "t2"}),
    ]
    return commitlog_frame(spark, rows)


def _delta_rs_rows(path: Path, version: int | None = None) -> list[object]:
    return canonical_rows(DeltaTable(str(path), version=version).to_pyarrow_table())


def _bridge_dirs(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.name.startswith("bridge-")}


# 1. round trips -----------------------------------------------------------------------------


def test_round_trip_of_an_unpartitioned_table(lake: Lake, spark: SparkSession) -> None:
    written_df = _offset_commits(spark)
    assert lake.append("consumer_offset_commits", written_df) == 1

    read_df = lake.read("consumer_offset_commits")

    assert [f.dataType for f in read_df.schema] == [f.dataType for f in spark_schema(CONSUMER_OFFSET_COMMITS)]
    assert_frames_equal(read_df, written_df)


def test_round_trip_of_partitioned_tables_with_map_and_binary_columns(lake: Lake, spark: SparkSession) -> None:
    commitlog_df, queue_df = _commitlog(spark), _queue_units(spark)
    lake.append("commitlog", commitlog_df)
    lake.append("consume_queue", queue_df)

    read_df = lake.read("commitlog")

    assert read_df.columns == COMMITLOG.column_names
    assert [f.dataType for f in read_df.schema] == [f.dataType for f in spark_schema(COMMITLOG)]
    assert_frames_equal(read_df, commitlog_df)
    assert_frames_equal(lake.read("consume_queue"), queue_df)


def test_columns_come_back_in_catalog_order_whatever_order_was_written(lake: Lake, spark: SparkSession) -> None:
    queue_df = _queue_units(spark)
    lake.append("consume_queue", queue_df.select(*reversed(queue_df.columns)))

    assert_frames_equal(lake.read("consume_queue"), queue_df)


def test_an_empty_table_reads_as_an_empty_frame_with_the_catalog_schema(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark))
    lake.overwrite("consume_queue", _queue_units(spark).limit(0))

    read_df = lake.read("consume_queue")

    assert read_df.count() == 0
    assert [f.dataType for f in read_df.schema] == [f.dataType for f in spark_schema(CONSUME_QUEUE)]


# 2. delta-rs reads what the bridge writes, the bridge reads what delta-rs writes --------------


@pytest.mark.parametrize("spec", [COMMITLOG, CONSUME_QUEUE, CONSUMER_OFFSET_COMMITS], ids=lambda s: s.name)
def test_delta_rs_reads_a_bridge_written_table_identically(lake: Lake, spark: SparkSession, spec: TableSpec) -> None:
    frames = {"commitlog": _commitlog, "consume_queue": _queue_units, "consumer_offset_commits": _offset_commits}
    written_df = frames[spec.name](spark)
    lake.append(spec, written_df)

    delta_rs = DeltaTable(str(lake.location(spec))).to_pyarrow_table()

    assert delta_rs.schema.names == spec.column_names
    assert canonical_rows(delta_rs.select(spec.column_names)) == canonical_rows(written_df.toArrow())


def test_the_bridge_reads_a_delta_rs_written_table_identically(lake: Lake, spark: SparkSession) -> None:
    expected = _queue_units(spark).toArrow().cast(CONSUME_QUEUE.arrow_schema)
    path = lake.location("consume_queue")
    write_deltalake(str(path), expected, partition_by=list(CONSUME_QUEUE.partition_by))
    write_deltalake(str(path), expected.slice(0, 3), mode="append", partition_by=list(CONSUME_QUEUE.partition_by))

    read_df = lake.read("consume_queue")

    assert canonical_rows(read_df.toArrow()) == canonical_rows(pa.concat_tables([expected, expected.slice(0, 3)]))


def test_message_bodies_ids_and_property_values_are_written_without_a_dictionary(
    lake: Lake, spark: SparkSession
) -> None:
    # every value repeats, so that a dictionary would pay off and be kept wherever it is allowed
    properties = [{"TAGS": "t1", "KEYS": "k", "UNIQ_KEY": f"u{i}"} for i in range(3)]
    rows = [
        _record("broker-a", 0, 200 * i, bytes([i % 3]) * 50, properties[i % 3], msg_id=f"ID{i % 3}") for i in range(200)
    ]
    lake.append("commitlog", commitlog_frame(spark, rows))

    paths, dictionary = column_encodings(lake.location(COMMITLOG))
    assert set(PLAIN_ENCODED_COLUMNS) <= paths - dictionary
    assert {"topic", "born_host", "properties.key_value.key", "tags"} <= dictionary


def test_file_rows_come_one_table_per_data_file_filtered_by_partition_and_value(
    lake: Lake, spark: SparkSession
) -> None:
    assert list(lake.iter_file_rows("commitlog", ["commit_log_offset"])) == []  # no table yet
    lake.append("commitlog", _commitlog(spark))
    files = len(list(lake.location(COMMITLOG).rglob("*.parquet")))
    columns = ["broker_name", "segment", "commit_log_offset"]

    every = list(lake.iter_file_rows("commitlog", columns))
    of_a = list(lake.iter_file_rows("commitlog", columns, partition_filter={"broker_name": ["broker-a"]}))
    at_200 = list(lake.iter_file_rows("commitlog", columns, equal={"commit_log_offset": 200}))

    assert len(every) == files and all(t.column_names == columns for t in every)
    assert sorted(r for t in every for r in zip(*t.to_pydict().values(), strict=True)) == [
        ("broker b/%é", 0, 0),
        ("broker-a", 0, 0),
        ("broker-a", 0, 200),
        ("broker-a", 4096, 4096),
    ]
    assert {r["broker_name"] for t in of_a for r in t.to_pylist()} == {"broker-a"}
    assert [r for t in at_200 for r in t.to_pylist()] == [
        {"broker_name": "broker-a", "segment": 0, "commit_log_offset": 200}
    ]
    with pytest.raises(ValidationError, match="equal"):
        lake.iter_file_rows("commitlog", columns, equal={"broker_name": "broker-a"})  # a partition column
    with pytest.raises(ValidationError, match="no_such"):
        lake.iter_file_rows("commitlog", ["no_such"])


def test_file_rows_come_dictionary_encoded_where_asked_with_the_same_values(lake: Lake, spark: SparkSession) -> None:
    lake.append("commitlog", _commitlog(spark))
    columns = ["broker_name", "topic", "commit_log_offset"]

    plain = list(lake.iter_file_rows("commitlog", columns))
    coded = list(lake.iter_file_rows("commitlog", columns, dictionaries=["broker_name", "topic"]))

    assert [t.to_pylist() for t in coded] == [t.to_pylist() for t in plain]
    for table in coded:
        assert [pa.types.is_dictionary(f.type) for f in table.schema] == [True, True, False]
        assert table["broker_name"].chunk(0).dictionary.to_pylist() == [table["broker_name"][0].as_py()]
    with pytest.raises(ValidationError, match="dictionaries"):
        lake.iter_file_rows("commitlog", columns, dictionaries=["commit_log_offset"])  # not a string column
    with pytest.raises(ValidationError, match="dictionaries"):
        lake.iter_file_rows("commitlog", columns, dictionaries=["tags"])  # not one of the columns read


def test_row_chunks_hold_every_row_once_with_partition_values_from_the_log(lake: Lake, spark: SparkSession) -> None:
    assert list(lake.iter_row_chunks("commitlog", ["commit_log_offset"])) == []  # no table yet
    ensure_table(lake.root, COMMITLOG)
    assert list(lake.iter_row_chunks("commitlog", ["broker_name", "commit_log_offset"])) == []  # no data file yet
    lake.append("commitlog", _commitlog(spark))
    version = lake.version(COMMITLOG)
    lake.append("commitlog", _commitlog(spark).where("broker_name = 'broker-a'"))  # a later version
    columns = ["broker_name", "segment", "topic", "commit_log_offset"]

    def rows(tables: list[pa.Table]) -> list[tuple[object, ...]]:
        return sorted(r for t in tables for r in zip(*t.to_pydict().values(), strict=True))

    files = list(lake.iter_file_rows("commitlog", columns, version=version))
    chunks = list(lake.iter_row_chunks("commitlog", columns, version=version))
    singles = list(lake.iter_row_chunks("commitlog", columns, version=version, chunk_rows=1))
    coded = list(lake.iter_row_chunks("commitlog", columns, version=version, dictionaries=["broker_name", "topic"]))

    assert len(chunks) == 1 and len(singles) == len(files) > 1  # chunks hold whole files
    assert rows(chunks) == rows(singles) == rows(files) == rows(coded)
    assert {r[0] for r in rows(chunks)} == {"broker b/%é", "broker-a"}  # a value its directory name escapes
    assert [pa.types.is_dictionary(f.type) for f in coded[0].schema] == [True, False, True, False]
    assert len(rows(list(lake.iter_row_chunks("commitlog", columns)))) == 2 * len(rows(chunks)) - 1
    with pytest.raises(ValidationError, match="chunk_rows"):
        lake.iter_row_chunks("commitlog", columns, chunk_rows=0)
    with pytest.raises(ValidationError, match="dictionaries"):
        lake.iter_row_chunks("commitlog", columns, dictionaries=["segment"])  # not a string column
    with pytest.raises(ValidationError, match="no_such"):
        lake.iter_row_chunks("commitlog", ["no_such"])
    with pytest.raises(ValidationError, match="order_by"):
        lake.iter_row_chunks("commitlog", columns, order_by="broker_name")  # a partition column

    kept = list(
        lake.iter_row_chunks("commitlog", columns, version=version, partition_filter={"broker_name": ["broker-a"]})
    )
    assert rows(kept) == [r for r in rows(chunks) if r[0] == "broker-a"] != []
    assert list(lake.iter_row_chunks("commitlog", columns, partition_filter={"broker_name": []})) == []
    with pytest.raises(ValidationError, match="partition_filter"):
        lake.iter_row_chunks("commitlog", columns, partition_filter={"topic": ["TopicA"]})  # not a partition column


def test_row_chunks_in_order_hold_consecutive_files_of_each_partition(lake: Lake, spark: SparkSession) -> None:
    # files of one broker whose log order is not their offset order: the later commits hold the earlier records
    for offsets in ([400, 500], [0, 100], [200, 300]):
        lake.append("commitlog", commitlog_frame(spark, [_record("broker-a", 0, o, b"x", {}) for o in offsets]))
    lake.append("commitlog", commitlog_frame(spark, [_record("broker-b", 0, o, b"x", {}) for o in (0, 100)]))
    columns = ["broker_name", "commit_log_offset"]

    ordered = list(lake.iter_row_chunks("commitlog", columns, chunk_rows=4, order_by="commit_log_offset"))

    assert [
        t.sort_by([("broker_name", "ascending"), ("commit_log_offset", "ascending")]).to_pylist() for t in ordered
    ] == [
        [{"broker_name": "broker-a", "commit_log_offset": o} for o in (0, 100, 200, 300)],
        [{"broker_name": "broker-a", "commit_log_offset": o} for o in (400, 500)]
        + [{"broker_name": "broker-b", "commit_log_offset": o} for o in (0, 100)],
    ]


def test_versions_hold_the_same_data_when_only_compactions_and_empty_commits_lie_between(
    lake: Lake, spark: SparkSession
) -> None:
    lake.append("commitlog", _commitlog(spark))  # version 1 (0 created the table)
    lake.append("commitlog", _commitlog(spark).limit(1))  # 2: a row more, in a file of its own
    DeltaTable(str(lake.location(COMMITLOG))).optimize.compact()  # 3: files rewritten, dataChange=false
    lake.append_rows("commitlog", COMMITLOG.arrow_schema.empty_table(), "app", 1)  # 4: a transaction only
    assert lake.version("commitlog") == 4

    assert lake.same_data("commitlog", 2, 4) and lake.same_data("commitlog", 3, 3)
    assert not lake.same_data("commitlog", 1, 4)  # version 2 added a row
    assert not lake.same_data("commitlog", 4, 2)  # backwards
    commit_path(lake.location(COMMITLOG), 3).unlink()  # the log cleaned up
    assert not lake.same_data("commitlog", 2, 4)


def test_bridge_stats_are_the_exact_bounds_of_each_file(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark, topics=("TopicA",)).coalesce(1))

    actions = pa.table(DeltaTable(str(lake.location("consume_queue"))).get_add_actions(flatten=True)).to_pylist()

    assert [(a["num_records"], a["min.commit_log_offset"], a["max.commit_log_offset"]) for a in actions] == [(4, 0, 1)]
    assert actions[0]["null_count.queue_id"] == 0
    assert actions[0]["partition.topic"] == "TopicA"


# 3. an interrupted write changes nothing ------------------------------------------------------


def test_files_written_without_a_commit_leave_the_table_unchanged(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark))
    path = lake.location("consume_queue")
    before = _delta_rs_rows(path)

    written = write_data_files(_queue_units(spark, base=50_000), str(path), CONSUME_QUEUE.partition_by)

    assert written.files and all((path / f.path).is_file() for f in written.files)
    assert lake.version("consume_queue") == 1
    assert _delta_rs_rows(path) == before
    assert canonical_rows(lake.read("consume_queue").toArrow()) == before


def test_committing_the_written_files_is_what_makes_them_visible(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark))
    path = lake.location("consume_queue")
    written = write_data_files(_queue_units(spark, base=50_000), str(path), CONSUME_QUEUE.partition_by)

    commit_data_files(str(path), written, "append", None, None)

    assert lake.read("consume_queue").count() == 24


@pytest.mark.engine("bridge")
def test_a_failed_commit_removes_its_files_and_leaves_the_table_unchanged(lake: Lake, spark: SparkSession) -> None:
    path = lake.location("consume_queue")
    DeltaTable.create(
        str(path), CONSUME_QUEUE.arrow_schema, partition_by=["topic"], configuration={"delta.appendOnly": "true"}
    )
    lake.append("consume_queue", _queue_units(spark))
    before, dirs = _delta_rs_rows(path), _bridge_dirs(path)

    with pytest.raises(LakeError, match="refused the commit"):
        lake.overwrite("consume_queue", _queue_units(spark, base=50_000))

    assert _bridge_dirs(path) == dirs
    assert _delta_rs_rows(path) == before


def test_rows_outside_the_replaced_partitions_are_refused_before_the_commit(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark))
    path = lake.location("consume_queue")
    before, dirs = _delta_rs_rows(path), _bridge_dirs(path)

    with pytest.raises(ValidationError, match="outside the partitions"):
        lake.overwrite_partitions("consume_queue", _queue_units(spark), [{"topic": "TopicA"}])

    assert _bridge_dirs(path) == dirs
    assert _delta_rs_rows(path) == before


# 4. partition pruning -------------------------------------------------------------------------


def test_a_partition_filter_reads_only_the_matching_files(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark).repartition(2))
    actions = pa.table(DeltaTable(str(lake.location("consume_queue"))).get_add_actions(flatten=True)).to_pylist()
    retry_files = [a for a in actions if a["partition.topic"] == "%RETRY%group-a"]

    read_df = lake.read("consume_queue", partition_filter={"topic": ["%RETRY%group-a"]})

    assert len(read_df.inputFiles()) == len(retry_files) < len(actions)
    assert {r.topic for r in read_df.select("topic").distinct().collect()} == {"%RETRY%group-a"}
    assert read_df.count() == 4


def test_filtered_reads_give_what_delta_rs_gives_and_skip_files_that_cannot_match(lake: Lake) -> None:
    # 24 appends of two brokers' segments: filters on partition columns, on integer statistics and
    # on strings, in every operator, alone, together and as alternatives, against delta-rs's reading
    rng = random.Random(3)
    offset = {"broker-a": 0, "broker-b": 0}
    for _ in range(24):
        records = []
        for _ in range(rng.randrange(1, 30)):
            broker = rng.choice(list(offset))
            records.append(
                commitlog_record(
                    broker_name=broker,
                    topic=rng.choice(TOPICS),
                    queue_id=rng.randrange(4),
                    commit_log_offset=offset[broker],
                    segment=offset[broker] - offset[broker] % 4_000,
                    store_timestamp=T0 + offset[broker],
                )
            )
            offset[broker] += rng.randrange(50, 150)
        lake.append_rows(COMMITLOG, commitlog_table(records))
    columns = ["broker_name", "segment", "topic", "queue_id", "commit_log_offset"]
    some = lambda n: sorted(rng.sample(range(0, 12_000, 7), n))  # noqa: E731
    filters: list[Any] = [
        [("segment", "in", [0, 8_000]), ("commit_log_offset", "in", some(40))],
        [("broker_name", "=", "broker-b"), ("commit_log_offset", ">=", 6_000)],
        [("commit_log_offset", "<", 900), ("topic", "!=", "TopicA")],
        [("segment", "not in", [0]), ("commit_log_offset", "<=", 5_000), ("queue_id", "=", 2)],
        [[("broker_name", "=", "broker-a"), ("commit_log_offset", "in", some(10))], [("topic", ">=", "TopicA")]],
        [("commit_log_offset", "=", 10**15)],
        [("topic", "in", ["odd topic+=#é"]), ("store_timestamp", ">", T0 + 3_000)],
        [("commit_log_offset", "in", [])],
    ]
    dt = DeltaTable(str(lake.location(COMMITLOG)))
    actions = add_actions(dt)
    lows, highs = (
        actions.column("min.commit_log_offset").to_pylist(),
        actions.column("max.commit_log_offset").to_pylist(),
    )
    filters += [  # the bounds of files themselves: a file holds its min and its max
        [("commit_log_offset", "in", [highs[0], lows[1]])],
        [("commit_log_offset", "=", highs[2])],
        [("commit_log_offset", "<", lows[3] + 1), ("commit_log_offset", ">", highs[3] - 1)],
        [("commit_log_offset", ">=", highs[4]), ("commit_log_offset", "<=", highs[4])],
        [("commit_log_offset", "<=", lows[5]), ("commit_log_offset", ">=", lows[5])],
    ]
    for case in filters:
        expected = canonical_rows(dt.to_pyarrow_table(columns=columns, filters=case))
        assert canonical_rows(lake.read_rows(COMMITLOG, columns, case)) == expected, case
    kept = files_that_may_match(actions, filters[0], COMMITLOG.partition_by)
    assert 0 < kept.num_rows < actions.num_rows // 2
    assert files_that_may_match(actions, filters[5], COMMITLOG.partition_by).num_rows == 0
    assert files_that_may_match(actions, filters[2], ["segment"]).num_rows < actions.num_rows


def test_a_filter_on_a_column_that_is_not_a_partition_column_is_refused(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark))

    with pytest.raises(ValidationError, match="queue_id"):
        lake.read("consume_queue", partition_filter={"queue_id": [0]})


# 5. append, overwrite, partition overwrite, time travel ----------------------------------------


def test_append_overwrite_partition_overwrite_and_time_travel(lake: Lake, spark: SparkSession) -> None:
    first_df, second_df = _queue_units(spark), _queue_units(spark, base=10_000)
    retry_df = _queue_units(spark, topics=("%RETRY%group-a", "odd topic+=#é"), base=20_000)

    assert lake.append("consume_queue", first_df) == 1
    assert lake.append("consume_queue", second_df) == 2
    assert (
        lake.overwrite_partitions("consume_queue", retry_df, [{"topic": "%RETRY%group-a"}, {"topic": "odd topic+=#é"}])
        == 3
    )
    assert lake.overwrite("consume_queue", second_df) == 4

    assert_frames_equal(lake.read("consume_queue", version=1), first_df)
    assert_frames_equal(lake.read("consume_queue", version=2), first_df.unionByName(second_df))
    kept_df = first_df.unionByName(second_df).where("topic = 'TopicA'")
    assert_frames_equal(lake.read("consume_queue", version=3), kept_df.unionByName(retry_df))
    assert_frames_equal(lake.read("consume_queue"), second_df)
    assert lake.version("consume_queue") == 4
    assert canonical_rows(lake.read("consume_queue", version=3).toArrow()) == _delta_rs_rows(
        lake.location("consume_queue"), version=3
    )


def test_a_partition_overwrite_by_a_subset_of_the_partition_columns(lake: Lake, spark: SparkSession) -> None:
    lake.append("commitlog", _commitlog(spark))
    replacement_df = _commitlog(spark).where("broker_name = 'broker-a' AND segment = 0")

    lake.overwrite_partitions("commitlog", replacement_df.limit(1), [{"broker_name": "broker-a"}])

    expected_df = spark.createDataFrame([("broker b/%é", 0), ("broker-a", 0)], "broker_name string, segment long")
    assert_frames_equal(lake.read("commitlog").select("broker_name", "segment"), expected_df)


def test_reading_a_version_the_table_does_not_have_is_a_lake_error(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark))

    with pytest.raises(LakeError, match="version 7"):
        lake.read("consume_queue", version=7)


def test_a_missing_table_has_no_version_and_cannot_be_read(lake: Lake) -> None:
    assert lake.version("consume_queue") is None
    assert not lake.exists("consume_queue")
    with pytest.raises(LakeError, match="no Delta table"):
        lake.read("consume_queue")


# 6. idempotent commits -------------------------------------------------------------------------


def test_the_same_application_transaction_writes_once(lake: Lake, spark: SparkSession) -> None:
    queue_df = _queue_units(spark)

    first = lake.append("consume_queue", queue_df, app_id="replay-1", app_version=5)
    again = lake.append("consume_queue", queue_df, app_id="replay-1", app_version=5)
    older = lake.overwrite("consume_queue", queue_df.limit(1), app_id="replay-1", app_version=4)

    assert (first, again, older) == (1, None, None)
    assert lake.version("consume_queue") == 1
    assert lake.read("consume_queue").count() == 12
    assert lake.transaction_version("consume_queue", "replay-1") == 5


def test_a_higher_transaction_version_writes_again(lake: Lake, spark: SparkSession) -> None:
    queue_df = _queue_units(spark)
    lake.append("consume_queue", queue_df, app_id="replay-1", app_version=5)

    assert (
        lake.overwrite_partitions(
            "consume_queue", queue_df.where("topic = 'TopicA'"), [{"topic": "TopicA"}], app_id="replay-1", app_version=6
        )
        == 2
    )
    assert lake.transaction_version("consume_queue", "replay-1") == 6
    assert lake.transaction_version("consume_queue", "other") is None
    assert lake.read("consume_queue").count() == 12


def test_half_an_application_transaction_is_refused(lake: Lake, spark: SparkSession) -> None:
    with pytest.raises(ValidationError, match="app_version"):
        lake.append("consume_queue", _queue_units(spark), app_id="replay-1")


# validation of written frames ------------------------------------------------------------------


def test_a_missing_column_is_named(lake: Lake, spark: SparkSession) -> None:
    with pytest.raises(ValidationError, match="tags_code"):
        lake.append("consume_queue", _queue_units(spark).drop("tags_code"))
    assert not lake.exists("consume_queue")


def test_an_extra_column_is_named(lake: Lake, spark: SparkSession) -> None:
    with pytest.raises(ValidationError, match="surprise"):
        lake.append("consume_queue", _queue_units(spark).withColumn("surprise", F.col("queue_id")))


def test_a_column_of_the_wrong_type_is_named(lake: Lake, spark: SparkSession) -> None:
    wrong_df = _queue_units(spark).withColumn("queue_id", F.col("queue_id").cast("long"))

    with pytest.raises(ValidationError, match=r"consume_queue\.queue_id"):
        lake.append("consume_queue", wrong_df)


def test_a_null_in_a_not_null_column_commits_nothing(lake: Lake, spark: SparkSession) -> None:
    lake.append("consume_queue", _queue_units(spark))
    path = lake.location("consume_queue")
    dirs = _bridge_dirs(path)
    rows = [("broker-a", "TopicA", 0, 9, 9, 1, None, 9)]
    nullable_schema = StructType([StructField(f.name, f.dataType) for f in spark_schema(CONSUME_QUEUE)])

    with pytest.raises(ValidationError, match=r"consume_queue\.tags_code"):
        lake.append("consume_queue", spark.createDataFrame(rows, nullable_schema))

    assert lake.version("consume_queue") == 1
    assert _bridge_dirs(path) == dirs


def test_an_empty_string_in_a_not_null_partition_column_commits_nothing(lake: Lake, spark: SparkSession) -> None:
    with pytest.raises(ValidationError, match=r"consume_queue\.topic"):
        lake.append("consume_queue", _queue_units(spark, topics=("",)))
    assert lake.version("consume_queue") == 0


def test_a_table_that_differs_from_the_catalog_is_refused(lake: Lake, spark: SparkSession) -> None:
    other = pa.table({"broker_name": ["b"], "topic": ["t"]})
    write_deltalake(str(lake.location("consume_queue")), other, partition_by=["topic"])

    with pytest.raises(LakeError, match="does not match catalog table 'consume_queue'"):
        lake.append("consume_queue", _queue_units(spark))
    with pytest.raises(LakeError, match="queue_id"):
        lake.read("consume_queue")


# engine selection ------------------------------------------------------------------------------


@pytest.mark.engine("bridge")
def test_without_delta_jars_the_engine_is_the_bridge(spark: SparkSession) -> None:
    assert detect_engine(spark) == "bridge"
    assert session._DETECTED[spark.sparkContext] == "bridge"  # looked up once per Spark context
    assert resolve_engine(spark, "auto") == "bridge"
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get(ENGINE_CONF) == "bridge"


@pytest.mark.engine("delta-spark")
def test_with_delta_jars_auto_is_delta_spark(spark: SparkSession) -> None:
    assert detect_engine(spark) == "delta-spark"
    assert session._DETECTED[spark.sparkContext] == "delta-spark"
    assert resolve_engine(spark, "auto") == "delta-spark"
    assert resolve_engine(spark, "bridge") == "bridge"
    assert spark.conf.get(ENGINE_CONF) == "delta-spark"
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"


@pytest.mark.engine("bridge")
def test_asking_for_delta_spark_without_the_jars_is_a_lake_error(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(LakeError, match=r"io\.delta\.tables\.DeltaTable"):
        Lake(spark, tmp_path, engine="delta-spark")


def test_an_unknown_engine_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="duckdb"):
        Lake(spark, tmp_path, engine="duckdb")


def test_appended_rows_are_shared_between_lakes_and_never_taken_from_a_replaced_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    import shutil

    from tests.builders import commitlog_table

    def records(first: int, topic: str) -> pa.Table:
        return commitlog_table(
            [commitlog_record(topic=topic, queue_offset=i, commit_log_offset=i * 300) for i in range(first, first + 3)]
        )

    root = tmp_path / "lake"
    Lake(spark, root, ENGINE).append_rows(COMMITLOG, records(0, "Orders"))
    Lake(spark, root, ENGINE).append_rows(COMMITLOG, records(3, "Orders"))
    one, other = Lake(spark, root, ENGINE), Lake(spark, root, ENGINE)
    first = one.version(COMMITLOG)
    assert first is not None
    narrow = one.read_appended_rows(COMMITLOG, ["queue_offset", "topic"], first - 1, first)
    wide = other.read_appended_rows(COMMITLOG, ["body", "queue_offset"], first - 1, first)
    assert narrow.column("queue_offset").to_pylist() == wide.column("queue_offset").to_pylist() == [3, 4, 5]
    assert narrow.column_names == ["queue_offset", "topic"] and wide.column_names == ["body", "queue_offset"]

    shutil.rmtree(root)  # the same path and versions, other rows
    Lake(spark, root, ENGINE).append_rows(COMMITLOG, records(0, "Audit"))
    Lake(spark, root, ENGINE).append_rows(COMMITLOG, records(7, "Audit"))
    again = Lake(spark, root, ENGINE).read_appended_rows(COMMITLOG, ["queue_offset", "topic"], first - 1, first)
    assert again.to_pylist() == [{"queue_offset": i, "topic": "Audit"} for i in (7, 8, 9)]


def test_an_appended_range_read_in_this_process_costs_its_rows_and_no_file(spark: SparkSession, tmp_path: Path) -> None:
    """A nightly's jobs read the same new rows one after another: once one has read them, moving on
    by them reads no file, and the cost says so; a range not read yet costs its files."""
    from tests.builders import commitlog_table

    root = tmp_path / "lake"
    for first in (0, 3, 6):
        rows = [commitlog_record(queue_offset=i, commit_log_offset=i * 300) for i in range(first, first + 3)]
        Lake(spark, root, ENGINE).append_rows(COMMITLOG, commitlog_table(rows))
    reader, planner = Lake(spark, root, ENGINE), Lake(spark, root, ENGINE)
    latest = reader.version(COMMITLOG)
    assert latest is not None
    before = planner.appended_cost(COMMITLOG, latest - 2, latest)
    assert (before.rows, before.files) == (6, 2) and before.bytes > 0
    reader.read_appended_rows(COMMITLOG, ["queue_offset"], latest - 2, latest)
    after = planner.appended_cost(COMMITLOG, latest - 2, latest)
    assert (after.rows, after.files, after.bytes) == (6, 0, before.bytes)
    other = planner.appended_cost(COMMITLOG, latest - 1, latest)  # another range: its files count
    assert (other.rows, other.files) == (3, 1)


def _run_row(i: int) -> dict[str, Any]:
    return {
        "run_id": f"run-{i}",
        "job": "probe",
        "started_timestamp": 1_700_000_000_000 + i,
        "duration_ms": i,
        "status": "SUCCEEDED",
        "input_versions": [("commitlog", i)],
        "output_versions": [],
        "row_counts": [],
        "message": None,
    }


def test_a_kept_snapshot_is_served_until_a_commit_follows_it_and_never_for_a_table_written_anew(
    spark: SparkSession, tmp_path: Path
) -> None:
    import shutil

    from jobs.lake.snapshots import open_table, table_version
    from schemas.catalog import JOB_RUNS

    root = tmp_path / "lake"
    lake = Lake(spark, root, ENGINE)
    table_dir = str(lake.location(JOB_RUNS))
    lake.append_rows(JOB_RUNS, pa.Table.from_pylist([_run_row(0)], schema=JOB_RUNS.arrow_schema))
    first = open_table(table_dir)
    assert open_table(table_dir) is first and table_version(table_dir) == first.version() == 1

    lake.append_rows(JOB_RUNS, pa.Table.from_pylist([_run_row(1)], schema=JOB_RUNS.arrow_schema))
    second = open_table(table_dir)
    assert second is not first and second.version() == table_version(table_dir) == 2
    assert open_table(table_dir, 1) is first  # a committed version is still that version
    assert sorted(second.to_pyarrow_table(columns=["run_id"]).column("run_id").to_pylist()) == ["run-0", "run-1"]

    second.load_as_version(1)  # a caller moving the shared object: it is not served as version 2 again
    assert open_table(table_dir).version() == 2 and open_table(table_dir) is not second

    shutil.rmtree(root)  # the same path and versions, other rows
    again = Lake(spark, root, ENGINE)
    again.append_rows(JOB_RUNS, pa.Table.from_pylist([_run_row(5)], schema=JOB_RUNS.arrow_schema))
    again.append_rows(JOB_RUNS, pa.Table.from_pylist([_run_row(6)], schema=JOB_RUNS.arrow_schema))
    assert table_version(table_dir) == 2
    assert sorted(open_table(table_dir).to_pyarrow_table(columns=["run_id"]).column("run_id").to_pylist()) == [
        "run-5",
        "run-6",
    ]
    assert open_table(table_dir, 1).to_pyarrow_table(columns=["run_id"]).column("run_id").to_pylist() == ["run-5"]


def test_a_table_is_there_as_delta_rs_says_with_its_first_commit_gone_after_a_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    from jobs.lake.snapshots import is_table
    from schemas.catalog import JOB_RUNS

    lake = Lake(spark, tmp_path / "lake", ENGINE)
    table_dir = lake.location(JOB_RUNS)
    assert not is_table(str(table_dir)) and not DeltaTable.is_deltatable(str(table_dir))
    (table_dir / "_delta_log").mkdir(parents=True)  # a log with no commit yet
    assert not is_table(str(table_dir)) and not DeltaTable.is_deltatable(str(table_dir))
    for i in range(3):
        lake.append_rows(JOB_RUNS, pa.Table.from_pylist([_run_row(i)], schema=JOB_RUNS.arrow_schema))
    assert is_table(str(table_dir)) and lake.exists(JOB_RUNS)
    DeltaTable(str(table_dir)).create_checkpoint()
    (table_dir / "_delta_log" / f"{0:020d}.json").unlink()  # a log cleanup's work
    assert is_table(str(table_dir)) and DeltaTable.is_deltatable(str(table_dir))
    (table_dir / "_delta_log" / "_last_checkpoint").unlink()  # found by listing the log
    assert is_table(str(table_dir)) and DeltaTable.is_deltatable(str(table_dir))


def test_the_kept_snapshots_restored_are_those_kept_then_and_later_loads_are_forgotten(
    spark: SparkSession, tmp_path: Path
) -> None:
    from jobs.lake import restore_snapshots, snapshot_state
    from jobs.lake.snapshots import open_table
    from schemas.catalog import JOB_RUNS

    lake = Lake(spark, tmp_path / "lake", ENGINE)
    table_dir = str(lake.location(JOB_RUNS))
    lake.append_rows(JOB_RUNS, pa.Table.from_pylist([_run_row(0)], schema=JOB_RUNS.arrow_schema))
    first = open_table(table_dir)
    before = snapshot_state()
    lake.append_rows(JOB_RUNS, pa.Table.from_pylist([_run_row(1)], schema=JOB_RUNS.arrow_schema))
    second = open_table(table_dir)
    assert open_table(table_dir, 2) is second
    restore_snapshots(before)
    assert open_table(table_dir, 1) is first  # kept then, kept now
    reloaded = open_table(table_dir, 2)  # loaded after the state was taken: loaded again
    assert reloaded is not second and reloaded.version() == 2
    assert open_table(table_dir) is reloaded


def test_small_files_piling_up_in_a_table_appended_row_by_row_are_packed_with_every_row_kept(
    spark: SparkSession, tmp_path: Path
) -> None:
    from broker_model.store import append_rows
    from broker_model.store.delta_tables import SMALL_TABLE_FILES
    from schemas.catalog import JOB_RUNS, TOPIC_CONFIG

    lake = Lake(spark, tmp_path / "lake", ENGINE)
    versions = []
    for i in range(SMALL_TABLE_FILES + 4):
        versions.append(lake.append_rows(JOB_RUNS, pa.Table.from_pylist([_run_row(i)], schema=JOB_RUNS.arrow_schema)))
    table = DeltaTable(str(lake.location(JOB_RUNS)))
    assert len(table.file_uris()) <= SMALL_TABLE_FILES
    assert sorted(lake.read_rows(JOB_RUNS, ["run_id"]).column("run_id").to_pylist()) == sorted(
        f"run-{i}" for i in range(SMALL_TABLE_FILES + 4)
    )
    packed = [h for h in table.history() if h["operation"] == "OPTIMIZE"]
    assert len(packed) == 1
    # the packing changed no row, but it rewrote appended files: a range across it is read whole
    appended, next_append = versions[SMALL_TABLE_FILES], versions[SMALL_TABLE_FILES + 1]
    assert appended is not None and next_append == appended + 2  # the packing lies between
    assert lake.same_data(JOB_RUNS, appended, appended + 1)
    with pytest.raises(IncrementalReadError):
        lake.read_appended_rows(JOB_RUNS, ["run_id"], appended - 1)

    topic_row = {c.name: None for c in TOPIC_CONFIG.columns}
    for i in range(SMALL_TABLE_FILES + 2):  # the broker's own appends (configuration, broker starts)
        row = {**topic_row, "broker_name": "b", "topic": f"T{i}", "queue_nums": 4, "perm": 6, "updated_timestamp": i}
        append_rows(tmp_path / "lake", TOPIC_CONFIG, pa.Table.from_pylist([row], schema=TOPIC_CONFIG.arrow_schema))
    configs = DeltaTable(str(lake.location(TOPIC_CONFIG)))
    assert len(configs.file_uris()) <= SMALL_TABLE_FILES
    assert configs.to_pyarrow_table().num_rows == SMALL_TABLE_FILES + 2


def _commit_rows(first: int, count: int) -> pa.Table:
    rows = [
        {
            "group": "cg",
            "broker_name": "broker-a",
            "topic": "TopicA",
            "queue_id": i % 4,
            "offset": i,
            "commit_timestamp": 1_700_000_000_000 + i,
            "source": "consumer",
            "client_id": "10.0.0.1@1",
        }
        for i in range(first, first + count)
    ]
    return pa.Table.from_pylist(rows, schema=CONSUMER_OFFSET_COMMITS.arrow_schema)


def test_appends_packed_in_groups_between_the_readers_versions_read_as_those_appends(lake: Lake) -> None:
    versions = []
    for i in range(60):  # a file per append, as a broker's offset flushes
        versions.append(lake.append_rows(CONSUMER_OFFSET_COMMITS, _commit_rows(i, 1)))
    early, late = versions[9], versions[29]  # the versions two readers have read

    committed = pack_appended(lake, CONSUMER_OFFSET_COMMITS, [early, late])

    assert len(committed) == 2  # (early, late] and (late, latest]: 20 files, then 30
    table = DeltaTable(str(lake.location(CONSUMER_OFFSET_COMMITS)))
    assert pa.table(table.get_add_actions()).num_rows == 10 + 1 + 1  # the 10 before early are not packed here
    for after, first in ((early, 10), (late, 30)):
        offsets = lake.read_appended_rows(CONSUMER_OFFSET_COMMITS, ["offset"], after).column("offset").to_pylist()
        assert sorted(offsets) == list(range(first, 60))
    assert sorted(lake.read_rows(CONSUMER_OFFSET_COMMITS, ["offset"]).column("offset").to_pylist()) == list(range(60))


def test_a_rewrite_of_appends_from_both_sides_of_a_readers_version_sends_it_back_to_a_whole_read(lake: Lake) -> None:
    versions = [lake.append_rows(CONSUMER_OFFSET_COMMITS, _commit_rows(i, 1)) for i in range(40)]
    assert pack_appended(lake, CONSUMER_OFFSET_COMMITS, [versions[1]])  # one group over (1, 39]

    with pytest.raises(IncrementalReadError, match="together with others"):
        lake.read_appended_rows(CONSUMER_OFFSET_COMMITS, ["offset"], versions[20])  # a reader inside the group
    offsets = lake.read_appended_rows(CONSUMER_OFFSET_COMMITS, ["offset"], versions[1]).column("offset").to_pylist()
    assert sorted(offsets) == list(range(2, 40))


def test_the_latest_version_is_known_when_a_log_cleanup_removed_the_commit_files_after_the_kept_one(
    lake: Lake,
) -> None:
    # the snapshot of version 1 is kept by the first read; a log cleanup then removes the commit
    # file of version 2, which a checkpoint holds
    lake.append_rows(CONSUMER_OFFSET_COMMITS, _commit_rows(0, 1))
    assert lake.read_rows(CONSUMER_OFFSET_COMMITS).num_rows == 1
    newest = lake.append_rows(CONSUMER_OFFSET_COMMITS, _commit_rows(1, 2))
    assert newest is not None and lake.version(CONSUMER_OFFSET_COMMITS) == newest
    table_dir = lake.location(CONSUMER_OFFSET_COMMITS)
    DeltaTable(str(table_dir)).create_checkpoint()
    commit_path(table_dir, newest).unlink()
    assert lake.version(CONSUMER_OFFSET_COMMITS) == newest
    assert lake.read_rows(CONSUMER_OFFSET_COMMITS).num_rows == 3
