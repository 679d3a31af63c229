"""The rebuild_consume_queue job: its transforms on hand-built rows, its incremental reads, its runs.

Transform tests build a few commit log rows whose sizes, CRCs and offsets are right by
construction (RocketMQ's length formula, zlib's CRC, the broker's segment roll), then break one
thing. Run tests write real Delta tables under tmp_path; the slow test runs the real broker.
"""

from __future__ import annotations

import itertools
import random
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.common import body_crc, java_string_hash, tags_code
from broker_model.common import constants as c
from broker_model.common.codec import decode_properties
from broker_model.store.delta_commits import commit_path
from jobs.lake import IncrementalReadError, Lake
from jobs.log_chains import CHAIN_COLUMNS, Chains, segment_sizes
from jobs.rebuild_consume_queue import (
    APP_ID,
    DRIVER_INCREMENT_BYTES,
    RebuildConfig,
    build_checked_records,
    build_consume_queue,
    build_integrity_report,
    build_log_context,
    build_queue_context,
    build_segment_sizes,
    main,
    plan_run,
    queue_starts,
    run,
)
from jobs.rebuild_consume_queue.transforms import (
    segment_size_of,
    with_delay_level,
    with_literal_tags_code,
    with_segment_size,
)
from jobs.rules import delay_level
from jobs.rules import java_string_hash as spark_java_hash
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUME_QUEUE_INTEGRITY,
    CONSUME_QUEUE_TAILS,
    TableSpec,
    spark_schema,
)
from schemas.errors import LakeError
from tests.builders import SEGMENT_SIZE, commitlog_frame, commitlog_record, commitlog_table, laid_out
from tests.helpers import ENGINE, assert_frames_equal, canonical_rows

SEGMENT = SEGMENT_SIZE  # segment size of the hand-built logs (laid_out's default)
T0 = 1_700_000_000_000
V = 7  # the commit log version the transform tests report


# ---------------------------------------------------------------------------------------------
# Hand-built commit log rows
# ---------------------------------------------------------------------------------------------


def _record(
    queue_offset: int = 0, *, properties: dict[str, str] | None = None, store_timestamp: int = T0, **columns: Any
) -> dict[str, Any]:
    """A commit log row of these tests (no offset yet): WAIT set, born 5 ms before it is stored."""
    return commitlog_record(
        queue_offset=queue_offset,
        properties={"WAIT": "true", **(properties or {})},
        store_timestamp=store_timestamp,
        born_timestamp=store_timestamp - 5,
        **columns,
    )


def _frame(spark: SparkSession, spec: TableSpec, rows: Iterable[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(list(rows), spark_schema(spec))


def _brokers(spark: SparkSession, *rows: tuple[str, int, int]) -> DataFrame:
    """``brokers`` rows from (broker_name, segment_size, started_timestamp)."""
    full = [(name, "10.0.0.1:10911", size, "ASYNC_FLUSH", started, "1@host") for name, size, started in rows]
    return _frame(spark, BROKERS, full)


def _report(spark: SparkSession, records: list[dict[str, Any]], segment_size: int = SEGMENT) -> DataFrame:
    checked_df = commitlog_frame(spark, records).transform(build_checked_records)
    sizes_df = build_segment_sizes(_brokers(spark, ("broker-a", segment_size, T0), ("broker-b", segment_size, T0)))
    return build_integrity_report(checked_df, sizes_df, V)


def _findings(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    """Expected findings from (broker, topic, queue_id, queue_offset, commit_log_offset, problem, detail)."""
    return _frame(spark, CONSUME_QUEUE_INTEGRITY, [(*r, V) for r in rows])


def _record_finding(offset: int, problem: str, detail: str, broker: str = "broker-a") -> tuple[Any, ...]:
    return (broker, None, None, None, offset, problem, detail)


# ---------------------------------------------------------------------------------------------
# Pure Python: the run plan
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("processed", "findings_processed", "tails_processed", "latest", "full", "expected"),
    [
        (None, None, None, 0, False, ("full", None, 0)),  # first run
        (None, None, None, 5, True, ("full", None, 5)),
        (5, 5, 5, 5, False, ("noop", 5, 5)),  # nothing new
        (5, 5, 5, 5, True, ("noop", 5, 5)),  # --full on processed versions changes nothing either
        (3, 3, 3, 5, False, ("incremental", 3, 5)),
        (3, 3, 3, 5, True, ("full", 3, 5)),
        (5, 3, 3, 5, False, ("full", 5, 5)),  # consume-queue rows of 4..5 committed, findings not: rebuild
        (3, None, None, 5, False, ("full", 3, 5)),
        (5, 5, 3, 5, False, ("full", 5, 5)),  # consume-queue rows and findings of 4..5 committed, tails not: rebuild
        (3, 3, None, 5, False, ("full", 3, 5)),  # a lake built before the tails table
    ],
)
def test_the_plan_follows_the_versions_the_outputs_record(
    processed: int | None,
    findings_processed: int | None,
    tails_processed: int | None,
    latest: int,
    full: bool,
    expected: tuple[Any, ...],
) -> None:
    plan = plan_run(processed, findings_processed, tails_processed, latest, full)
    assert (plan.mode, plan.processed, plan.target) == expected
    assert ("delete the consume_queue" in plan.reason) == (plan.mode == "noop" and full)  # says how to force it


def test_queue_starts_are_the_first_record_and_the_first_unit_of_each_queue() -> None:
    prepared, commit, rollback = c.TRANSACTION_PREPARED_TYPE, c.TRANSACTION_COMMIT_TYPE, c.TRANSACTION_ROLLBACK_TYPE
    rows = [
        ("broker-a", "T", 0, 7, 700, prepared),
        ("broker-a", "T", 0, 5, 900, 0),
        ("broker-a", "T", 0, 6, 800, commit),
        ("broker-a", "T", 1, 3, 600, rollback),
        ("broker-b", "T", 0, 0, 50, 0),
    ]
    names = ("broker_name", "topic", "queue_id", "queue_offset", "commit_log_offset", "sys_flag")
    table = pa.Table.from_pylist(
        [dict(zip(names, r, strict=True)) for r in rows],
        schema=pa.schema([COMMITLOG.arrow_schema.field(n) for n in names]),
    )
    starts = sorted(queue_starts(table), key=lambda s: (s.broker_name, s.queue_id))
    assert [(s.broker_name, s.queue_id, s.first_offset, s.first_cq_row) for s in starts] == [
        ("broker-a", 0, 700, 5),
        ("broker-a", 1, 600, None),
        ("broker-b", 0, 50, 0),
    ]


@pytest.mark.parametrize(("processed", "findings_processed", "tails_processed"), [(6, 6, 6), (4, 6, 4), (4, 4, 6)])
def test_outputs_ahead_of_the_commit_log_are_refused(
    processed: int, findings_processed: int, tails_processed: int
) -> None:
    with pytest.raises(LakeError, match="it was replaced"):
        plan_run(processed, findings_processed, tails_processed, 5, False)


# ---------------------------------------------------------------------------------------------
# Column functions
# ---------------------------------------------------------------------------------------------

# docs/rocketmq.md (tags code), plus characters outside ASCII and the BMP (two UTF-16 consume-queue rows each)
HASH_CASES = [
    "TagA",
    "*",
    "123",
    "polygenelubricants",
    "",
    "a",
    "é",
    "日本語タグ",
    "😀",
    "a😀b",
    "𝄞" * 40,
    "\u0000",
    "x" * 500,
    "Ünïcödé||TagB",
]


def _spark_hashes(spark: SparkSession, texts: list[str | None]) -> list[int | None]:
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
    rows = df.select("i", spark_java_hash(F.col("t")).alias("h")).orderBy("i").collect()
    return [r["h"] for r in rows]


@pytest.mark.spark
def test_the_spark_hash_is_java_string_hash_code_on_known_values(spark: SparkSession) -> None:
    assert _spark_hashes(spark, [*HASH_CASES, None]) == [*[java_string_hash(t) for t in HASH_CASES], None]
    assert _spark_hashes(spark, ["TagA", "polygenelubricants"]) == [2598919, -2147483648]


@pytest.mark.spark
@settings(max_examples=4, deadline=None)
@given(st.lists(st.text(max_size=60), min_size=100, max_size=100))
def test_the_spark_hash_is_java_string_hash_code_on_any_text(spark: SparkSession, texts: list[str]) -> None:
    assert _spark_hashes(spark, list(texts)) == [java_string_hash(t) for t in texts]


@pytest.mark.spark
def test_the_delay_level_is_the_last_delay_entry_with_an_integer_value(spark: SparkSession) -> None:
    raws = [
        b"WAIT\x01true\x02DELAY\x013\x02",
        b"DELAY\x0117",  # first entry, no trailing separator (4.9 form)
        b"DELAY\x012\x02DELAY\x015\x02",  # a later duplicate wins
        b"DELAY\x01\x02KEYS\x01k",  # empty value: no entry
        b"XDELAY\x014\x02DELAYX\x014",  # other keys
        b"DELAY\x01soon",
        b"DELAY\x01-2",
        b"",
        b"DELAY\x014\x02DELAY\x01\x02",  # a later empty value is no entry: the one before stands
        b"DELAY\x016\x02KEYS\x01k\x02DELAY\x01",  # the same, last
        b"DELAY\x01\x017",  # a value may hold the name-value separator: not an integer
    ]
    df = spark.createDataFrame([(i, r) for i, r in enumerate(raws)], "i int, raw binary")
    levels = [r["level"] for r in df.select("i", delay_level(F.col("raw")).alias("level")).orderBy("i").collect()]
    assert levels == [3, 17, 5, None, None, None, -2, None, 4, 6, None]


# whole entries (a DELAY with a value, an empty one, another key) and the pieces that make them
_PROPERTY_PIECES = ["DELAY\x013\x02", "DELAY\x01\x02", "KEYS\x01k\x02", "DELAY\x01", "\x02", "\x01", "X", "1", "-", " "]


@pytest.mark.spark
@settings(max_examples=4, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_PROPERTY_PIECES), max_size=12).map("".join), min_size=200, max_size=200))
def test_the_delay_level_is_what_the_brokers_property_parsing_gives(spark: SparkSession, texts: list[str]) -> None:
    def level(text: str) -> int | None:
        value = decode_properties(text).get(c.PROPERTY_DELAY_TIME_LEVEL)
        if value is None or not re.fullmatch(r"[+-]?[0-9]+", value):
            return None
        return int(value) if -(1 << 31) <= int(value) < 1 << 31 else None

    df = spark.createDataFrame([(i, t.encode()) for i, t in enumerate(texts)], "i int, raw binary")
    levels = [r["level"] for r in df.select("i", delay_level(F.col("raw")).alias("level")).orderBy("i").collect()]
    assert levels == [level(t) for t in texts]


# ---------------------------------------------------------------------------------------------
# The consume queue
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_only_not_and_commit_records_get_a_unit(spark: SparkSession) -> None:
    prepared, commit = c.TRANSACTION_PREPARED_TYPE, c.TRANSACTION_COMMIT_TYPE
    rollback = c.TRANSACTION_ROLLBACK_TYPE
    flags = [0, prepared, commit, rollback, commit | c.COMPRESSED_FLAG, prepared | c.BORNHOST_V6_FLAG]
    records = laid_out(_record(i, sys_flag=f) for i, f in enumerate(flags))
    expected_df = _frame(
        spark,
        CONSUME_QUEUE,
        [
            ("broker-a", "TopicA", 0, r["queue_offset"], r["commit_log_offset"], r["store_size"], 0, T0)
            for r in records
            if r["sys_flag"] & 12 in (0, 8)
        ],
    )
    assert_frames_equal(build_consume_queue(commitlog_frame(spark, records)), expected_df)
    assert expected_df.count() == 3


@pytest.mark.spark
def test_tags_code_is_the_java_hash_of_tags_and_zero_without_tags(spark: SparkSession) -> None:
    tags = [None, "", "TagA", "polygenelubricants", "😀"]
    records = laid_out(_record(i, properties={"TAGS": t} if t is not None else {}) for i, t in enumerate(tags))
    cq_rows = commitlog_frame(spark, records).transform(build_consume_queue)
    codes = [r["tags_code"] for r in cq_rows.orderBy("queue_offset").collect()]
    assert codes == [0, 0, 2598919, -2147483648, java_string_hash("😀")]
    # the literal choice of the records pass (few distinct tags) gives the same codes; a value it
    # was not given codes 0, as a value missing from the join's table does
    leveled_df = commitlog_frame(spark, records).transform(with_delay_level)
    literal = with_literal_tags_code(leveled_df, tags).orderBy("queue_offset").select("tags_code").collect()
    assert [r["tags_code"] for r in literal] == codes
    partial = with_literal_tags_code(leveled_df, ["TagA"]).orderBy("queue_offset").select("tags_code").collect()
    assert [r["tags_code"] for r in partial] == [0, 0, 2598919, 0, 0]


@pytest.mark.spark
def test_on_the_schedule_topic_tags_code_is_the_delivery_time(spark: SparkSession) -> None:
    schedule = c.SCHEDULE_TOPIC
    cases = [
        (schedule, {"DELAY": "3", "TAGS": "TagA"}, T0 + 10_000),
        (schedule, {"DELAY": "25"}, T0 + 7_200_000),  # capped at level 18 (2 h)
        (schedule, {"DELAY": "18"}, T0 + 7_200_000),
        (schedule, {"DELAY": "1"}, T0 + 1_000),
        (schedule, {"DELAY": "0", "TAGS": "TagA"}, 2598919),  # level <= 0: the tags hash
        (schedule, {"DELAY": "-1"}, 0),
        (schedule, {"TAGS": "TagA"}, 2598919),  # no DELAY
        ("TopicA", {"DELAY": "3", "TAGS": "TagA"}, 2598919),  # DELAY elsewhere means nothing
    ]
    records = laid_out(_record(i, topic=t, properties=p) for i, (t, p, _) in enumerate(cases))
    cq_rows = commitlog_frame(spark, records).transform(build_consume_queue)
    assert [r["tags_code"] for r in cq_rows.orderBy("queue_offset").collect()] == [code for _, _, code in cases]


# ---------------------------------------------------------------------------------------------
# The integrity report, one check at a time
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_a_clean_log_with_segment_rolls_has_no_findings(spark: SparkSession) -> None:
    records = laid_out(_record(i, body=b"x" * 900, queue_id=i % 2) for i in range(10))
    for record in records:
        record["queue_offset"] //= 2
    assert {r["segment"] for r in records} == {0, 4096, 8192}  # three segments, two rolls
    assert _report(spark, records).count() == 0


@pytest.mark.spark
def test_gaps_include_a_queue_that_does_not_start_at_zero(spark: SparkSession) -> None:
    records = laid_out([_record(0), _record(1), _record(3), _record(2, queue_id=1), _record(3, queue_id=1)])
    o = [r["commit_log_offset"] for r in records]
    expected = _findings(
        spark,
        [
            ("broker-a", "TopicA", 0, 3, o[2], "GAP", "queue offsets 2..2 are missing"),
            ("broker-a", "TopicA", 1, 2, o[3], "GAP", "the queue starts at queue offset 2: offsets 0..1 are missing"),
        ],
    )
    assert_frames_equal(_report(spark, records), expected)


@pytest.mark.spark
def test_a_queue_offset_held_twice_is_a_duplicate(spark: SparkSession) -> None:
    # queue 0 of broker-b is another queue: the same offsets there are no duplicate
    records = laid_out([_record(0), _record(1), _record(1), _record(2)])
    other = laid_out([_record(0, broker_name="broker-b"), _record(1, broker_name="broker-b")])
    o = [r["commit_log_offset"] for r in records]
    expected = _findings(
        spark,
        [
            (
                "broker-a",
                "TopicA",
                0,
                1,
                o[2],
                "DUPLICATE_QUEUE_OFFSET",
                f"queue offset 1 is also held by commit log offset {o[1]}",
            ),
        ],
    )
    assert_frames_equal(_report(spark, records + other), expected)


@pytest.mark.spark
def test_a_unit_whose_commit_log_offset_goes_back_is_non_monotonic(spark: SparkSession) -> None:
    records = laid_out([_record(0), _record(2), _record(1), _record(3)])
    o = [r["commit_log_offset"] for r in records]
    # queue order 0, 1, 2, 3 visits offsets o0, o2, o1, o3: only consume-queue row 2 goes back
    expected = _findings(
        spark,
        [
            (
                "broker-a",
                "TopicA",
                0,
                2,
                o[1],
                "NON_MONOTONIC_OFFSET",
                f"commit log offset {o[1]} is not above {o[2]}, the one of queue offset 1",
            ),
        ],
    )
    assert_frames_equal(_report(spark, records), expected)


@pytest.mark.spark
def test_a_body_crc_that_is_not_the_masked_crc_of_the_body_is_a_mismatch(spark: SparkSession) -> None:
    # zlib.crc32(b"hello!q!") = 3167863075 has its top bit set: stored masked, 1020379427
    records = laid_out([_record(0, body=b"hello!q!"), _record(1, body=b""), _record(2, body=b"\x00\xff")])
    assert records[0]["body_crc"] == 1020379427 and records[1]["body_crc"] == 0
    stored, actual = body_crc(b"\x00\xfe"), body_crc(b"\x00\xff")
    records[2]["body_crc"] = stored
    o = records[2]["commit_log_offset"]
    expected = _findings(
        spark,
        [
            _record_finding(o, "CRC_MISMATCH", f"body_crc {stored}, but the body's CRC-32 & 0x7FFFFFFF is {actual}"),
        ],
    )
    assert_frames_equal(_report(spark, records), expected)


@pytest.mark.spark
def test_a_store_size_that_is_not_rocketmq_s_record_length_is_a_mismatch(spark: SparkSession) -> None:
    ipv6 = c.BORNHOST_V6_FLAG | c.STOREHOSTADDRESS_V6_FLAG
    records = [
        _record(0, sys_flag=ipv6),
        _record(0, magic_code=c.MAGIC_CODE_V2, topic="é" * 70),
        _record(1),
        _record(2),
    ]
    assert records[0]["store_size"] == records[2]["store_size"] + 24
    records[2] = {**records[2], "store_size": records[2]["store_size"] + 3}  # 3 bytes nothing accounts for
    records[3] = {**records[3], "magic_code": c.BLANK_MAGIC_CODE}
    records = laid_out(records)  # laid out with the stored sizes: the offsets agree with them
    o = [r["commit_log_offset"] for r in records]
    expected = _findings(
        spark,
        [
            _record_finding(
                o[2],
                "SIZE_MISMATCH",
                f"store_size {records[2]['store_size']}, but RocketMQ's length of "
                f"this body, topic and properties is {records[2]['store_size'] - 3}",
            ),
            _record_finding(
                o[3],
                "SIZE_MISMATCH",
                f"magic_code {c.BLANK_MAGIC_CODE} is neither v1 ({c.MAGIC_CODE_V1}) "
                f"nor v2 ({c.MAGIC_CODE_V2}): the record length cannot be checked",
            ),
        ],
    )
    assert_frames_equal(_report(spark, records), expected)


@pytest.mark.spark
def test_a_store_size_that_does_not_lead_to_the_next_record_is_a_mismatch(spark: SparkSession) -> None:
    records = laid_out(_record(i, body=b"x" * 900) for i in range(6))
    o = [r["commit_log_offset"] for r in records]
    size = records[0]["store_size"]
    assert o[4] == 4096 and o[3] + size + size + 8 > 4096  # the roll 3 -> 4 is right: 4 did not fit
    records[1] = {**records[1], "commit_log_offset": o[1] + 16}  # 16 bytes nobody accounts for
    records[5] = {**records[5], "commit_log_offset": 8192, "segment": 8192}  # rolled though it fitted
    expected = _findings(
        spark,
        [
            _record_finding(
                o[0],
                "SIZE_MISMATCH",
                f"the next record starts at {o[1] + 16}, not at {o[1]} (offset {o[0]} + store_size {size})",
            ),
            _record_finding(
                o[1] + 16,
                "SIZE_MISMATCH",
                f"the next record starts at {o[2]}, not at {o[2] + 16} (offset {o[1] + 16} + store_size {size})",
            ),
            _record_finding(
                o[4],
                "SIZE_MISMATCH",
                f"the next record starts the next segment at 8192 though {size} "
                f"bytes fitted after the end of this one at {o[5]}",
            ),
        ],
    )
    assert_frames_equal(_report(spark, records), expected)


@pytest.mark.spark
def test_a_record_overrunning_its_segment_or_in_the_wrong_one_is_beyond_segment(spark: SparkSession) -> None:
    records = laid_out(_record(i, body=b"x" * 900) for i in range(4))
    size = records[0]["store_size"]
    # offset 4096 - 8 - size leaves exactly the 8-byte blank: fine; 4 bytes later it does not
    records[2] = {**records[2], "commit_log_offset": 4096 - 8 - size}
    records[3] = {**records[3], "commit_log_offset": 4096 - 4 - size, "segment": 0}
    records.append(_record(9, queue_id=9, commit_log_offset=5000, segment=0))  # lies in segment 4096
    expected = _findings(
        spark,
        [
            _record_finding(
                4092 - size,
                "BEYOND_SEGMENT",
                "the record ends at 4092, leaving less than the 8-byte blank before the end of segment 0 at 4096",
            ),
            _record_finding(
                5000,
                "BEYOND_SEGMENT",
                "segment 0, but offset 5000 lies in the segment at 4096 (segments of 4096 bytes)",
            ),
            _record_finding(
                5000,
                "BEYOND_SEGMENT",
                f"the record ends at {5000 + records[4]['store_size']}, leaving "
                "less than the 8-byte blank before the end of segment 0 at 4096",
            ),
        ],
    )
    report = _report(spark, records).where(F.col("problem") == "BEYOND_SEGMENT")
    assert_frames_equal(report, expected)


@pytest.mark.spark
def test_the_segment_size_is_the_latest_one_of_the_broker_else_one_gib(spark: SparkSession) -> None:
    brokers_df = _brokers(spark, ("broker-a", 4096, T0), ("broker-a", 8192, T0 + 1), ("broker-b", 16384, T0))
    sizes = {r["broker_name"]: r["segment_size"] for r in build_segment_sizes(brokers_df).collect()}
    assert sizes == {"broker-a": 8192, "broker-b": 16384}
    # a record at 5000 in segment 4096 is right for 4 KiB segments, wrong for 8 KiB and for 1 GiB
    record = _record(0, commit_log_offset=5000, segment=4096)
    lone = {**record, "broker_name": "broker-z"}
    checked_df = commitlog_frame(spark, [record, lone]).transform(build_checked_records)
    report = build_integrity_report(checked_df, build_segment_sizes(brokers_df), V)
    assert sorted(r["broker_name"] for r in report.where(F.col("problem") == "BEYOND_SEGMENT").collect()) == [
        "broker-a",
        "broker-z",
    ]
    # the literal choice the records pass uses for few brokers gives the join's sizes
    rows_df = commitlog_frame(spark, [record, lone, {**record, "broker_name": "broker-b"}])
    joined = with_segment_size(rows_df, build_segment_sizes(brokers_df)).select("broker_name", "segment_size")
    chosen = rows_df.select("broker_name", segment_size_of(segment_sizes(brokers_df.toArrow())).alias("segment_size"))
    assert sorted(joined.collect()) == sorted(chosen.collect())
    assert sorted(r["segment_size"] for r in chosen.collect()) == [8192, 16384, c.DEFAULT_SEGMENT_SIZE]


_QUEUE_PROBLEMS = ("GAP", "DUPLICATE_QUEUE_OFFSET", "NON_MONOTONIC_OFFSET")


def _chain_scenarios() -> dict[str, list[dict[str, Any]]]:
    """Logs of two brokers (two queues each, segment rolls), clean or broken in one way."""
    clean = laid_out(_record(i // 2, queue_id=i % 2, body=b"x" * 900) for i in range(10))
    other = laid_out(_record(i, broker_name="broker-b", topic="%RETRY%g", body=b"x" * 300) for i in range(12))
    mid = clean[4]["commit_log_offset"]
    return {
        "clean": clean + other,
        "a record overlaps the one before": [
            *clean[:3],
            {**clean[3], "commit_log_offset": clean[3]["commit_log_offset"] - 1},
            *clean[4:],
            *other,
        ],
        "a segment rolled early": [*clean[:5], *laid_out(clean[5:], start=mid + SEGMENT), *other],
        "a record is missing": clean + other[:4] + other[5:],
        "a queue offset is held twice": [*clean, *other[:7], {**other[7], "queue_offset": 6}, *other[8:]],
        "a unit goes back in the log": [
            *clean,
            *other[:7],
            {**other[7], "queue_offset": 8},
            {**other[8], "queue_offset": 7},
            *other[9:],
        ],
        "a queue does not start at 0": [
            {**r, "queue_offset": r["queue_offset"] + 1} if r["queue_id"] else r for r in clean
        ]
        + other,
        "a prepared record keeps a queue offset": [*clean, *other[:5], {**other[5], "sys_flag": 4}, *other[6:]],
    }


def _chain_suspects(
    records: list[dict[str, Any]], cuts: list[int], step: int, encoded: bool = False
) -> tuple[list[Any], list[str]]:
    """The suspects of ``records`` cut into parts at ``cuts``, each part's rows in ``step`` order;
    ``encoded``: broker and topic as dictionaries holding every value twice (rows use either copy)."""
    schema = pa.schema([COMMITLOG.arrow_schema.field(n) for n in CHAIN_COLUMNS])
    chains = Chains({"broker-a": SEGMENT, "broker-b": SEGMENT})
    for start, end in zip([0, *cuts], [*cuts, len(records)], strict=True):
        rows = pa.Table.from_pylist([{n: r[n] for n in CHAIN_COLUMNS} for r in records[start:end][::step]], schema)
        for name in ("broker_name", "topic") if encoded else ():
            values = sorted(set(rows[name].to_pylist()))
            indices = [values.index(v) + len(values) * (i % 2) for i, v in enumerate(rows[name].to_pylist())]
            coded = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(values * 2, pa.string()))
            rows = rows.set_column(rows.schema.get_field_index(name), name, coded)
        chains.add_part(rows)
    return chains.suspect_queues(), chains.suspect_brokers()


@pytest.mark.spark
@pytest.mark.parametrize("scenario", list(_chain_scenarios()))
def test_the_driver_chains_suspect_exactly_where_the_spark_checks_find_something(
    spark: SparkSession, scenario: str
) -> None:
    records = _chain_scenarios()[scenario]
    findings = _report(spark, records).collect()
    queues = sorted(
        {(f["broker_name"], f["topic"], f["queue_id"]) for f in findings if f["problem"] in _QUEUE_PROBLEMS}
    )
    brokers = sorted({f["broker_name"] for f in findings if f["detail"].startswith("the next record")})
    assert (queues or brokers) if scenario.startswith("a ") else not (queues or brokers)
    rng = random.Random(scenario)
    # the log cut into parts (data files of consecutive records) anywhere, rows in and out of log order
    # broker and topic as read from Parquet dictionaries or not
    for parts, step, encoded in itertools.product((1, 2, 3, 5, len(records)), (1, -1), (False, True)):
        cuts = sorted(rng.sample(range(1, len(records)), parts - 1))
        assert _chain_suspects(records, cuts, step, encoded) == (queues, brokers), (cuts, step, encoded)
        # chunks of files in (broker, offset) order: a part may end in one broker and go on in the next
        by_broker = sorted(records, key=lambda r: (r["broker_name"], r["commit_log_offset"]))
        assert _chain_suspects(by_broker, cuts, step, encoded) == (queues, brokers), (cuts, step, encoded)


@pytest.mark.parametrize("encoded", [False, True], ids=["plain", "dictionary"])
def test_a_foreign_row_without_a_topic_is_a_queue_of_its_own_to_the_chains(encoded: bool) -> None:
    records = laid_out(_record(i) for i in range(4))
    records[2] = {**records[2], "topic": None, "queue_offset": 0}
    schema = pa.schema([COMMITLOG.arrow_schema.field(n).with_nullable(True) for n in CHAIN_COLUMNS])
    rows = pa.Table.from_pylist([{n: r[n] for n in CHAIN_COLUMNS} for r in records], schema)
    if encoded:
        rows = rows.set_column(rows.schema.get_field_index("topic"), "topic", pc.dictionary_encode(rows["topic"]))
    chains = Chains({"broker-a": SEGMENT})

    chains.add_part(rows)

    assert chains.queue_tails() == {
        ("broker-a", "TopicA", 0): (3, records[3]["commit_log_offset"]),
        ("broker-a", None, 0): (0, records[2]["commit_log_offset"]),
    }
    assert chains.suspect_queues() == [("broker-a", "TopicA", 0)]  # its offset 2 is the foreign row's


def test_a_context_run_needs_no_start_at_zero_and_only_seams_with_new_runs_are_checked() -> None:
    chains = Chains({"broker-a": SEGMENT})
    old = laid_out(_record(i) for i in range(6))
    last = old[5]
    chains.add_context(
        {("broker-a", "TopicA", 0): (5, last["commit_log_offset"])},
        {"broker-a": (last["commit_log_offset"], last["store_size"], last["segment"])},
    )
    new = laid_out((_record(i) for i in (6, 7)), start=old[5]["commit_log_offset"] + old[5]["store_size"])
    schema = pa.schema([COMMITLOG.arrow_schema.field(n) for n in CHAIN_COLUMNS])
    chains.add_part(pa.Table.from_pylist([{n: r[n] for n in CHAIN_COLUMNS} for r in new], schema))
    assert (chains.suspect_queues(), chains.suspect_brokers()) == ([], [])
    assert (chains.new_cq_rows(), chains.new_queues()) == (2, 1)
    assert chains.queue_tails() == {("broker-a", "TopicA", 0): (7, new[1]["commit_log_offset"])}
    # two old consume-queue rows out of order are not this run's finding; a new consume-queue row after a gap is
    chains.add_context_rows(
        pa.Table.from_pylist(
            [
                {
                    "broker_name": "broker-a",
                    "topic": "TopicA",
                    "queue_id": 0,
                    "queue_offset": 2,
                    "commit_log_offset": 9,
                },
                {
                    "broker_name": "broker-a",
                    "topic": "TopicA",
                    "queue_id": 0,
                    "queue_offset": 4,
                    "commit_log_offset": 8,
                },
            ]
        ),
        None,
    )
    assert chains.suspect_queues() == []
    gapped = laid_out([_record(9)], start=new[1]["commit_log_offset"] + new[1]["store_size"])
    chains.add_part(pa.Table.from_pylist([{n: r[n] for n in CHAIN_COLUMNS} for r in gapped], schema))
    assert (chains.suspect_queues(), chains.suspect_brokers()) == ([("broker-a", "TopicA", 0)], [])


# ---------------------------------------------------------------------------------------------
# Context of an incremental check
# ---------------------------------------------------------------------------------------------


def _cq_rows(spark: SparkSession, records: list[dict[str, Any]]) -> DataFrame:
    return build_consume_queue(commitlog_frame(spark, records))


@pytest.mark.spark
def test_the_queue_context_is_the_unit_before_the_new_ones_and_any_unit_after_it(spark: SparkSession) -> None:
    old = laid_out([_record(i) for i in range(5)] + [_record(0, queue_id=1)])
    new = laid_out([_record(5), _record(2), _record(1, queue_id=1), _record(0, queue_id=2)], start=10_000)
    context = build_queue_context(_cq_rows(spark, old), _cq_rows(spark, new))
    # queue 0: the first new row (offset 2) sorts after old row 2 (a lower commit log offset), the
    # row before it, and before rows 3 and 4; queue 1: row 0; queue 2: nothing old
    expected_df = spark.createDataFrame([(0, 2), (0, 3), (0, 4), (1, 0)], "queue_id int, queue_offset long")
    assert_frames_equal(context.select("queue_id", "queue_offset"), expected_df)


@pytest.mark.spark
def test_the_log_context_is_the_record_before_the_new_ones_and_any_record_after_it(spark: SparkSession) -> None:
    old = laid_out([_record(i) for i in range(4)]) + laid_out([_record(0, broker_name="broker-b")])
    new = laid_out([_record(4)], start=old[3]["commit_log_offset"] + old[3]["store_size"])
    new_b = [_record(1, broker_name="broker-b")]  # a second record at broker-b's offset 0
    context = build_log_context(commitlog_frame(spark, old), commitlog_frame(spark, new + new_b))
    expected_df = spark.createDataFrame(
        [("broker-a", old[3]["commit_log_offset"]), ("broker-b", 0)], "broker_name string, commit_log_offset long"
    )
    assert_frames_equal(context.select("broker_name", "commit_log_offset"), expected_df)


@pytest.mark.spark
def test_new_rows_are_checked_against_their_context_and_old_rows_only_against_new_ones(spark: SparkSession) -> None:
    old = laid_out([_record(0), _record(1), _record(2)])
    new = laid_out([_record(4), _record(1)], start=old[2]["commit_log_offset"] + old[2]["store_size"])
    all_df = commitlog_frame(spark, old + new).transform(build_checked_records)
    new_df = commitlog_frame(spark, new).transform(build_checked_records)
    sizes_df = build_segment_sizes(_brokers(spark, ("broker-a", SEGMENT, T0)))
    queue_context = build_queue_context(_cq_rows(spark, old), _cq_rows(spark, new))
    log_context = build_log_context(commitlog_frame(spark, old), new_df)
    incremental = build_integrity_report(new_df, sizes_df, V, queue_context, log_context)
    full = build_integrity_report(all_df, sizes_df, V)
    # new row 1 duplicates old row 1, old row 2 now follows it and goes back, new row 4 leaves a gap
    assert sorted(r["problem"] for r in full.collect()) == ["DUPLICATE_QUEUE_OFFSET", "GAP", "NON_MONOTONIC_OFFSET"]
    assert_frames_equal(incremental, full)


# ---------------------------------------------------------------------------------------------
# Incremental reads of the lake
# ---------------------------------------------------------------------------------------------


def _append_log(lake: Lake, spark: SparkSession, records: list[dict[str, Any]]) -> int:
    """Append ``records`` to the commit log from the driver, as a broker does; the new version."""
    version = lake.append_rows(COMMITLOG, commitlog_table(records))
    assert version is not None
    return version


@pytest.mark.spark
def test_read_appended_reads_the_rows_of_later_commits_only(spark: SparkSession, tmp_path: Path) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    first = laid_out(_record(i) for i in range(3))
    second = laid_out([_record(3), _record(4)], start=5000)
    third = laid_out([_record(0, broker_name="broker-b")])
    v1 = _append_log(lake, spark, first)
    _append_log(lake, spark, second)
    v3 = _append_log(lake, spark, third)
    assert_frames_equal(lake.read_appended(COMMITLOG, v1), commitlog_frame(spark, second + third))
    assert_frames_equal(lake.read_appended(COMMITLOG, v1, v1 + 1), commitlog_frame(spark, second))
    assert lake.read_appended(COMMITLOG, v3).count() == 0


@pytest.mark.spark
def test_read_appended_refuses_a_range_it_cannot_read_as_appends(spark: SparkSession, tmp_path: Path) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    v1 = _append_log(lake, spark, laid_out([_record(0)]))
    v2 = _append_log(lake, spark, laid_out([_record(1)], start=100))
    lake.overwrite(COMMITLOG, commitlog_frame(spark, laid_out([_record(0)])))
    with pytest.raises(IncrementalReadError, match=" removed "):
        lake.read_appended(COMMITLOG, v2)
    DeltaTable(str(tmp_path / "commitlog")).create_checkpoint()
    commit_path(tmp_path / "commitlog", v2).unlink()  # log cleanup
    with pytest.raises(IncrementalReadError, match="is gone"):
        lake.read_appended(COMMITLOG, v1)


@pytest.mark.spark
def test_read_around_reads_the_files_next_to_the_bounds_only(spark: SparkSession, tmp_path: Path) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    for start in (0, 1000, 2000, 3000):  # one file per commit, offsets start..start+2*size
        _append_log(lake, spark, laid_out([_record(0), _record(1)], start=start))
    _append_log(lake, spark, laid_out([_record(0, broker_name="broker-b")]))
    rows = lake.read_around(COMMITLOG, "commit_log_offset", {"broker-a": 2050}, "broker_name").collect()
    # the greatest offset below 2050 is in the file starting at 2000; the files after it may hold more
    assert sorted({r["commit_log_offset"] // 1000 * 1000 for r in rows}) == [2000, 3000]
    assert {r["broker_name"] for r in rows} == {"broker-a"}


@pytest.mark.spark
def test_read_max_rows_reads_the_greatest_rows_of_each_broker_from_their_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    first = laid_out([_record(0), _record(1)])
    _append_log(lake, spark, first)
    second = laid_out([_record(2)], start=first[-1]["commit_log_offset"] + first[-1]["store_size"])
    _append_log(lake, spark, second)
    twin = {**second[0], "body": b"longer body", "store_size": second[0]["store_size"] + 6}  # same offset
    _append_log(lake, spark, [twin, *laid_out([_record(0, broker_name="broker-b")], start=9000)])
    columns = ["broker_name", "segment", "commit_log_offset", "store_size"]
    rows = lake.read_max_rows(COMMITLOG, "commit_log_offset", "broker_name", columns).to_pylist()
    got = sorted((r["broker_name"], r["segment"], r["commit_log_offset"], r["store_size"]) for r in rows)
    offset = second[0]["commit_log_offset"]
    assert got == [
        ("broker-a", second[0]["segment"], offset, second[0]["store_size"]),
        ("broker-a", second[0]["segment"], offset, twin["store_size"]),
        ("broker-b", 8192, 9000, first[0]["store_size"]),
    ]


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def _versions(lake: Lake) -> dict[str, int | None]:
    return {s.name: lake.version(s) for s in (COMMITLOG, CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY)}


def _sorted_rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _clean_and_corrupt_appends() -> list[list[dict[str, Any]]]:
    """Three commit log appends of broker-a; the third holds a duplicate queue offset, a bad CRC,
    a gap and a record in the wrong segment."""
    first = laid_out(_record(i, queue_id=i % 2, body=b"y" * 700) for i in range(8))
    second = laid_out(
        (_record(i, queue_id=i % 2, body=b"y" * 700) for i in range(8, 12)),
        start=first[-1]["commit_log_offset"] + first[-1]["store_size"],
    )
    end = second[-1]["commit_log_offset"] + second[-1]["store_size"]
    third = laid_out([_record(5), _record(7, queue_id=1), _record(6)], start=end)
    third[0]["body_crc"] ^= 1
    third[2]["segment"] += 1
    for record in [*first, *second]:
        record["queue_offset"] //= 2
    return [first, second, third]


def _twin_lakes(spark: SparkSession, tmp_path: Path) -> tuple[Lake, Lake]:
    """Two lakes with broker-a's 4 KiB segments: one rebuilt incrementally, one in full."""
    lakes = Lake(spark, tmp_path / "inc", ENGINE), Lake(spark, tmp_path / "full", ENGINE)
    for lake in lakes:
        lake.append(BROKERS, _brokers(spark, ("broker-a", SEGMENT, T0)))
    return lakes


@pytest.mark.spark
@pytest.mark.parametrize("driver_bytes", [0, DRIVER_INCREMENT_BYTES], ids=["spark", "driver"])
@pytest.mark.both_engines
def test_incremental_runs_give_what_a_full_rebuild_gives_and_a_rerun_commits_nothing(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], driver_bytes: int
) -> None:
    incremental, full = _twin_lakes(spark, tmp_path)
    for records in _clean_and_corrupt_appends():
        _append_log(incremental, spark, records)
        _append_log(full, spark, records)
        config = RebuildConfig(incremental.root, engine=ENGINE, driver_bytes=driver_bytes)
        assert run(spark, config).status == "SUCCEEDED"
    out = capsys.readouterr().out
    # the second append follows the tails; the third goes back into queue 0 (a duplicate offset)
    assert "incremental rebuild" in out and "checked against the tails" in out and "checked against the old" in out
    assert ("on the driver" in out) == bool(driver_bytes)  # the clean second append, without Spark
    run(spark, RebuildConfig(full.root, full=True, engine=ENGINE))
    for spec in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS):
        assert_frames_equal(incremental.read(spec), full.read(spec))
    problems = sorted(r["problem"] for r in full.read(CONSUME_QUEUE_INTEGRITY).collect())
    assert problems == ["BEYOND_SEGMENT", "CRC_MISMATCH", "DUPLICATE_QUEUE_OFFSET", "GAP"]
    assert incremental.transaction_version(CONSUME_QUEUE, APP_ID) == incremental.version(COMMITLOG)

    before = _versions(incremental)
    again = run(spark, RebuildConfig(incremental.root, engine=ENGINE, driver_bytes=driver_bytes))
    assert (again.status, _versions(incremental)) == ("NOOP", before)
    assert "nothing to do" in capsys.readouterr().out

    # a commit that adds no rows (as a compaction's), from delta-rs: delta-spark commits nothing for an empty frame
    empty = incremental.append_rows(COMMITLOG, COMMITLOG.arrow_schema.empty_table())
    quiet = run(spark, RebuildConfig(incremental.root, engine=ENGINE, driver_bytes=driver_bytes))
    assert (quiet.status, quiet.row_counts["consume_queue"], quiet.row_counts["consume_queue_integrity"]) == (
        "SUCCEEDED",
        0,
        0,
    )
    for spec in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS):
        assert incremental.transaction_version(spec, APP_ID) == empty
    assert_frames_equal(incremental.read(CONSUME_QUEUE), full.read(CONSUME_QUEUE))


def _increments() -> dict[str, list[dict[str, Any]]]:
    """Appends after :func:`_base_log`, clean or broken in one way: the driver path writes the
    clean ones and leaves the others to Spark."""
    base = _base_log()
    start = base[-1]["commit_log_offset"] + base[-1]["store_size"]

    def laid(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return laid_out(records, start=start)

    delayed = {"DELAY": "3", "TAGS": "late"}
    clean = laid([_record(4), _record(4, queue_id=1, properties={"TAGS": "b"}), _record(5)])
    return {
        "clean": clean,
        "clean, delayed and retried": laid(
            [
                _record(0, topic=c.SCHEDULE_TOPIC, properties=delayed),
                _record(0, topic="%RETRY%g", queue_id=0),
                _record(4),
            ]
        ),
        "a bad body CRC": [{**clean[0], "body_crc": clean[0]["body_crc"] ^ 1}, *clean[1:]],
        "an unknown magic code": [{**clean[0], "magic_code": 7}, *clean[1:]],
        "a wrong segment column": [*clean[:2], {**clean[2], "segment": clean[2]["segment"] + SEGMENT}],
        "a store size that is not the record's length": [*clean[:2], {**clean[2], "store_size": 999}],
        "a record beyond its segment": [
            _record(4, body=b"z" * 3000, commit_log_offset=start, segment=start - start % SEGMENT)
        ],
        "a record missing": [clean[0], clean[2]],
        "a queue offset held twice": laid([_record(3), _record(4, queue_id=1)]),
        "a gap": laid([_record(6), _record(4, queue_id=1)]),
        "clean, with a DELAY that is not a plain integer (no level: the tags hash)": laid(
            [_record(0, topic=c.SCHEDULE_TOPIC, properties={"DELAY": " 3"})]
        ),
        "clean, with a prepared record": laid(
            [_record(4, sys_flag=c.TRANSACTION_PREPARED_TYPE), _record(4, queue_id=1)]
        ),
    }


def _base_log() -> list[dict[str, Any]]:
    return laid_out(_record(i // 2, queue_id=i % 2, body=b"y" * 400) for i in range(8))


@pytest.fixture(scope="module")
def based_twins(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twin lakes (:func:`_twin_lakes`) holding :func:`_base_log`, the incremental one rebuilt
    once: made once for the module, copied by each test that adds an increment."""
    root = tmp_path_factory.mktemp("based-twins")
    incremental, full = _twin_lakes(spark, root)
    for lake in (incremental, full):
        _append_log(lake, spark, _base_log())
    run(spark, RebuildConfig(incremental.root, engine=ENGINE))
    return root


@pytest.mark.spark
@pytest.mark.parametrize("increment", list(_increments()))
def test_an_increment_on_the_driver_gives_what_a_full_rebuild_gives(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], increment: str, based_twins: Path
) -> None:
    shutil.copytree(based_twins, tmp_path, dirs_exist_ok=True)
    incremental, full = Lake(spark, tmp_path / "inc", ENGINE), Lake(spark, tmp_path / "full", ENGINE)
    for lake in (incremental, full):
        _append_log(lake, spark, _increments()[increment])
    capsys.readouterr()
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    assert run(spark, RebuildConfig(incremental.root, engine=ENGINE)).status == "SUCCEEDED"
    spark_jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup()) - jobs_before
    on_driver = "on the driver" in capsys.readouterr().out
    assert on_driver == increment.startswith("clean")
    assert (spark_jobs == 0) == on_driver
    run(spark, RebuildConfig(full.root, full=True, engine=ENGINE))
    for spec in (CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, CONSUME_QUEUE_TAILS):
        # read on the driver: two Spark reads and collects per table took longer than both runs
        actual, expected = incremental.read_rows(spec), full.read_rows(spec)
        assert actual.schema == expected.schema == spec.arrow_schema, spec.name
        assert canonical_rows(actual) == canonical_rows(expected), spec.name
    assert bool(incremental.row_count(CONSUME_QUEUE_INTEGRITY)) == increment.startswith(("a ", "an "))


@pytest.mark.spark
def test_a_run_that_stopped_before_its_tails_is_completed_in_full_and_rewrites_them(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    lake.append(BROKERS, _brokers(spark, ("broker-a", SEGMENT, T0)))
    first, second, _ = _clean_and_corrupt_appends()
    _append_log(lake, spark, first)
    run(spark, RebuildConfig(tmp_path, engine=ENGINE))
    _append_log(lake, spark, second)
    run(spark, RebuildConfig(tmp_path, engine=ENGINE))
    tails = _sorted_rows(lake.read(CONSUME_QUEUE_TAILS))
    # the last consume-queue row of queues 0 and 1 (offsets 0..5 each), the last record of broker-a
    last = second[-1]
    assert [(r[0], r[3], r[4]) for r in tails] == [("LOG", None, None), ("QUEUE", 0, 5), ("QUEUE", 1, 5)]
    assert tails[0][5:8] == (last["segment"], last["commit_log_offset"], last["store_size"])
    shutil.rmtree(tmp_path / "consume_queue_tails")  # what a run that stopped before its tails commit leaves
    units_version = lake.version(CONSUME_QUEUE)
    capsys.readouterr()
    assert run(spark, RebuildConfig(tmp_path, engine=ENGINE)).status == "SUCCEEDED"
    assert "full rebuild (the tails are behind the consume-queue rows" in capsys.readouterr().out
    assert lake.version(CONSUME_QUEUE) == units_version  # the consume-queue rows were complete: not written again
    assert _sorted_rows(lake.read(CONSUME_QUEUE_TAILS)) == tails


@pytest.mark.spark
def test_an_incremental_run_without_the_commit_files_rebuilds_in_full(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    first, second, _ = _clean_and_corrupt_appends()
    _append_log(lake, spark, first)
    run(spark, RebuildConfig(tmp_path, engine=ENGINE))
    version = _append_log(lake, spark, second)
    DeltaTable(str(tmp_path / "commitlog")).create_checkpoint()
    commit_path(tmp_path / "commitlog", version).unlink()  # log cleanup
    assert run(spark, RebuildConfig(tmp_path, engine=ENGINE)).status == "SUCCEEDED"
    assert "rebuilding in full" in capsys.readouterr().out
    assert lake.read(CONSUME_QUEUE).count() == len(first) + len(second)
    assert lake.transaction_version(CONSUME_QUEUE, APP_ID) == version


@pytest.mark.spark
def test_a_run_that_stopped_between_its_units_and_its_findings_is_completed_in_full(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lake(spark, tmp_path, ENGINE)
    lake.append(BROKERS, _brokers(spark, ("broker-a", SEGMENT, T0)))
    first, second, third = _clean_and_corrupt_appends()
    _append_log(lake, spark, first + second)
    run(spark, RebuildConfig(tmp_path, engine=ENGINE))
    version = _append_log(lake, spark, third)
    # what a run that stopped after its first commit leaves: the consume-queue rows of `third`, no findings
    lake.append(CONSUME_QUEUE, build_consume_queue(commitlog_frame(spark, third)), APP_ID, version)
    units_version = lake.version(CONSUME_QUEUE)
    run(spark, RebuildConfig(tmp_path, engine=ENGINE))
    assert lake.version(CONSUME_QUEUE) == units_version  # the consume-queue rows were complete: not written again
    problems = sorted(r["problem"] for r in lake.read(CONSUME_QUEUE_INTEGRITY).collect())
    assert problems == ["BEYOND_SEGMENT", "CRC_MISMATCH", "DUPLICATE_QUEUE_OFFSET", "GAP"]
    assert lake.transaction_version(CONSUME_QUEUE_INTEGRITY, APP_ID) == version
    assert lake.read(CONSUME_QUEUE).count() == len(first) + len(second) + len(third)


# ---------------------------------------------------------------------------------------------
# End to end: the real broker, the real job
# ---------------------------------------------------------------------------------------------


def _expected_units(lake_root: Path) -> set[tuple[Any, ...]]:
    """The consume queue recomputed in Python from the commit log read with delta-rs."""
    rows = DeltaTable(str(lake_root / "commitlog")).to_pyarrow_table().to_pylist()
    cq_rows = set()
    for row in rows:
        if row["sys_flag"] & c.TRANSACTION_ROLLBACK_TYPE not in (c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE):
            continue
        properties = dict(row["properties"])
        code = tags_code(row["tags"])
        if row["topic"] == c.SCHEDULE_TOPIC and "DELAY" in properties:
            level = min(int(properties["DELAY"]), c.MAX_DELAY_LEVEL)
            code = row["store_timestamp"] + c.DELAY_LEVEL_MILLIS[level - 1] if level > 0 else code
        cq_rows.add(
            (
                row["broker_name"],
                row["topic"],
                row["queue_id"],
                row["queue_offset"],
                row["commit_log_offset"],
                row["store_size"],
                code,
                row["store_timestamp"],
            )
        )
    return cq_rows


def _expected_tails(lake_root: Path) -> set[tuple[Any, ...]]:
    """The consume_queue_tails rows recomputed in Python: each queue's greatest (queue offset,
    commit log offset) consume-queue row, each broker's greatest (offset, size) record."""
    version = DeltaTable(str(lake_root / "commitlog")).version()
    queues: dict[tuple[str, str, int], tuple[int, int]] = {}
    for cq_row in _expected_units(lake_root):
        key = cq_row[:3]
        queues[key] = max(queues.get(key, cq_row[3:5]), cq_row[3:5])
    logs: dict[str, tuple[int, int, int]] = {}
    for row in DeltaTable(str(lake_root / "commitlog")).to_pyarrow_table().to_pylist():
        record = (row["commit_log_offset"], row["store_size"], row["segment"])
        logs[row["broker_name"]] = max(logs.get(row["broker_name"], record), record)
    return {("QUEUE", *k, qo, None, clo, None, version) for k, (qo, clo) in queues.items()} | {
        ("LOG", b, None, None, None, segment, clo, size, version) for b, (clo, size, segment) in logs.items()
    }


def _tails_of(lake_root: Path) -> set[tuple[Any, ...]]:
    table = DeltaTable(str(lake_root / "consume_queue_tails")).to_pyarrow_table()
    return {tuple(r[n] for n in CONSUME_QUEUE_TAILS.column_names) for r in table.to_pylist()}


def _units_of(lake_root: Path) -> list[tuple[Any, ...]]:
    table = DeltaTable(str(lake_root / "consume_queue")).to_pyarrow_table()
    return [tuple(r[n] for n in CONSUME_QUEUE.column_names) for r in table.to_pylist()]


def _corrupt_copy(source: Path, target: Path, spark: SparkSession) -> int:
    """Copy the lake and append to broker-a a record duplicating the last consume-queue row's queue offset,
    with a wrong body CRC, right after broker-a's last record; returns the new commit log version."""
    shutil.copytree(source, target)
    rows = DeltaTable(str(target / "commitlog")).to_pyarrow_table().to_pylist()
    last = max((r for r in rows if r["broker_name"] == "broker-a"), key=lambda r: r["commit_log_offset"])
    segment_size = 16384
    record = {**last, "properties": dict(last["properties"]), "body_crc": last["body_crc"] ^ 1}
    placed = laid_out([record], segment_size, start=last["commit_log_offset"] + last["store_size"])
    return _append_log(Lake(spark, target, ENGINE), spark, placed)


@pytest.mark.slow
@pytest.mark.spark
def test_the_job_on_a_broker_workload_and_on_a_corrupted_copy(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from broker_model.tools import run_workload

    lake_root = tmp_path / "lake"
    run_workload(lake_root, 3000, seed=11, segment_size=16384)
    try:
        assert main(["--lake", str(lake_root), "--engine", ENGINE]) == 0
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")  # main's session builder set the job default
    out = capsys.readouterr().out
    cq_rows = _units_of(lake_root)
    assert re.search(rf"consume-queue rows written +{len(cq_rows)}\n", out) and re.search(r"findings +0\n", out)
    assert len(cq_rows) == len(set(cq_rows)) and set(cq_rows) == _expected_units(lake_root)
    assert DeltaTable(str(lake_root / "consume_queue_integrity")).to_pyarrow_table().num_rows == 0
    assert _tails_of(lake_root) == _expected_tails(lake_root)

    corrupt = tmp_path / "corrupt"
    version = _corrupt_copy(lake_root, corrupt, spark)
    assert run(spark, RebuildConfig(corrupt, engine=ENGINE)).status == "SUCCEEDED"
    findings = DeltaTable(str(corrupt / "consume_queue_integrity")).to_pyarrow_table().to_pylist()
    assert sorted((f["problem"], f["commitlog_version"]) for f in findings) == [
        ("CRC_MISMATCH", version),
        ("DUPLICATE_QUEUE_OFFSET", version),
    ]
    assert set(_units_of(corrupt)) == _expected_units(corrupt)

    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(corrupt / "commitlog", rebuilt / "commitlog")
    shutil.copytree(corrupt / "brokers", rebuilt / "brokers")
    run(spark, RebuildConfig(rebuilt, full=True, engine=ENGINE))
    for name in ("consume_queue", "consume_queue_integrity", "consume_queue_tails"):
        incremental_rows = DeltaTable(str(corrupt / name)).to_pyarrow_table().to_pylist()
        full_rows = DeltaTable(str(rebuilt / name)).to_pyarrow_table().to_pylist()
        assert sorted(map(repr, incremental_rows)) == sorted(map(repr, full_rows))
