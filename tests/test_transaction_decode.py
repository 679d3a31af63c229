"""The driver's decoding of transaction records (``jobs.resolve_transactions.decode``) against the
Spark one it stands in for on small increments: same rows on seeded random commit log rows, odd
property values and op bodies included."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from broker_model.common import constants as c
from jobs.resolve_transactions.decode import decode_transaction_records
from jobs.resolve_transactions.transforms import build_transaction_records
from schemas.catalog import TRANSACTION_RECORDS
from tests.builders import T0, commitlog_frame, commitlog_record, commitlog_table

NUMBERS = [
    "5", " 5", "+5", "3\x7f", "\x7f1", "\x802", "-1", "-0", "05", "5.0", "5.", "1e3", "", " ", "-", "+",
    "\t7\n", "\x005", "\xa05",
    "\uff19", "2147483647", "2147483648", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "9223372036854775", "9223372036854776", "0x10", "1_000",
]  # fmt: skip
BODIES = [
    b"", b"7", b"5\x7f", b"\x7f6,\x807", b"5,6,9,", b",,", b"1,x,2", b"\xff1,3", b" 4 ,+5",
    b"9223372036854775808", b"12",
]  # fmt: skip
TOPICS = [
    c.RMQ_SYS_TRANS_HALF_TOPIC, c.RMQ_SYS_TRANS_OP_HALF_TOPIC, c.TRANS_CHECK_MAX_TIME_TOPIC, "Orders",
    c.RETRY_GROUP_TOPIC_PREFIX + "cg", c.DLQ_GROUP_TOPIC_PREFIX + "cg", c.SCHEDULE_TOPIC,
]  # fmt: skip
PROPERTIES = [
    c.PROPERTY_PRODUCER_GROUP, c.PROPERTY_REAL_TOPIC, c.PROPERTY_REAL_QUEUE_ID, c.PROPERTY_TRANSACTION_CHECK_TIMES,
    c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
]  # fmt: skip


def _random_records(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records = []
    for i in range(count):
        properties = {name: rng.choice([*NUMBERS, "pg-1", "Orders"]) for name in PROPERTIES if rng.random() < 0.6}
        if rng.random() < 0.7:
            properties[c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = f"U{rng.randrange(50):04d}"
        if rng.random() < 0.7:
            properties[c.PROPERTY_TAGS] = rng.choice(["d", "x", "D"])
        records.append(
            commitlog_record(
                broker_name=rng.choice(["broker-a", "broker-b"]),
                topic=rng.choice(TOPICS),
                queue_id=rng.randrange(3),
                queue_offset=i,
                commit_log_offset=i * 300,
                body=rng.choice(BODIES),
                properties=properties,
                sys_flag=rng.choice([0, 1, 4, 8, 9, 12, 2 | 8]),
                store_timestamp=T0 + i,
                prepared_transaction_offset=rng.randrange(0, count * 300, 300),
            )
        )
    return records


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    rows = table.select(list(TRANSACTION_RECORDS.column_names)).to_pylist()
    return sorted(rows, key=lambda r: (r["kind"], r["broker_name"], r["commit_log_offset"], repr(r)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_driver_decodes_the_records_as_the_spark_transform_does(spark: SparkSession, seed: int) -> None:
    records = _random_records(seed, 400)
    expected = build_transaction_records(commitlog_frame(spark, records)).toArrow()
    decoded = decode_transaction_records(commitlog_table(records))
    assert decoded.schema == TRANSACTION_RECORDS.arrow_schema
    assert {r["kind"] for r in decoded.to_pylist()} == {"HALF", "OP", "FINAL", "DISCARD"}
    assert _sorted(decoded) == _sorted(expected)


def test_numbers_read_as_a_failing_cast_reads_them() -> None:
    half = commitlog_record(
        topic=c.RMQ_SYS_TRANS_HALF_TOPIC,
        properties={
            c.PROPERTY_REAL_QUEUE_ID: "\t3 ",
            c.PROPERTY_TRANSACTION_CHECK_TIMES: "2147483648",
            c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: "5.0",
            c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "9223372036854776",
        },
    )
    op = commitlog_record(topic=c.RMQ_SYS_TRANS_OP_HALF_TOPIC, body=b"\xff1, 4 ,,", properties={c.PROPERTY_TAGS: "d"})
    rows = decode_transaction_records(commitlog_table([half, op])).to_pylist()
    assert [(r["real_queue_id"], r["check_times"], r["prepared_queue_offset"]) for r in rows[:1]] == [(3, None, None)]
    assert rows[0]["has_check_immunity"] is True and rows[0]["check_immunity_ms"] is None  # overflows
    assert [(r["kind"], r["removes"], r["half_queue_offset"]) for r in rows[1:]] == [("OP", True, -1), ("OP", True, 4)]
