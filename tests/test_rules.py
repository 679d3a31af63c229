"""Each RocketMQ rule with more than one form agrees with itself: the Python form of
:mod:`broker_model.common.rules`, its Arrow form, the driver path of ``rebuild_consume_queue`` and
the Spark column form of :mod:`jobs.rules`, on seeded generated records (edge cases included)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker_model.client import select_by_hash
from broker_model.common import (
    GROUP_QUEUE_KEY,
    QUEUE_KEY,
    Message,
    MessageQueue,
    consume_queue_tags_code,
    dispatched_mask,
    is_dispatched,
    parse_delay_level,
    schedule_level,
    select_queue_by_hash,
)
from broker_model.common import constants as c
from jobs import rules
from jobs.rebuild_consume_queue.fold import consume_queue_rows
from jobs.replay.plan import select_queue_id
from schemas.catalog import CONSUME_QUEUE, CONSUMER_OFFSETS, REPLAY_PROGRESS
from tests.builders import commitlog_frame, commitlog_record, commitlog_table

SEED = 20261125
DELAY_TEXTS = ["0", "1", "3", "18", "19", "99", "-1", "+5", "-0", "007", " 3", "3 ", "", "x", "1.5", "٣", "²"]
DELAY_TEXTS += ["2147483647", "2147483648", "-2147483648", "-2147483649", "99999999999999999999"]
TAGS = [None, "", "TagA", "*", "123", "polygenelubricants", "a||b", "日本", "😀 tag", "\u0000"]


def _records(count: int) -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    records = []
    for i in range(count):
        topic = rng.choice([c.SCHEDULE_TOPIC, c.SCHEDULE_TOPIC, "Orders", "%RETRY%cg"])
        delay = rng.choice([*DELAY_TEXTS, None, None])
        properties = {"TAGS": t} if (t := rng.choice(TAGS)) else {}
        if delay is not None:
            properties["DELAY"] = delay
        sys_flag = rng.choice([0, 4, 8, 12, 1, 9, 13, 0x100 | 8, 0x7FFFFFFF, -1])
        records.append(
            commitlog_record(
                topic=topic,
                queue_offset=i,
                commit_log_offset=i * 100,
                properties=properties,
                sys_flag=sys_flag,
                store_timestamp=rng.randrange(0, 2**41),
            )
        )
    return records


def _python_tags_code(record: dict[str, Any]) -> int:
    delay = record["properties"].get("DELAY")
    return consume_queue_tags_code(record["topic"], record["tags"], delay, record["store_timestamp"])


def test_the_delay_level_is_read_as_java_integer_parse_int() -> None:
    assert [parse_delay_level(t) for t in ("+5", "-0", "007", "2147483647")] == [5, 0, 7, 2**31 - 1]
    assert [parse_delay_level(t) for t in (" 3", "٣", "²", "1.5", "", "2147483648", None)] == [None] * 7
    assert [schedule_level(t) for t in ("0", "-1", "1", "18", "19", "x")] == [None, None, 1, 18, 18, None]


def test_dispatch_python_and_arrow_agree() -> None:
    types = (
        c.TRANSACTION_NOT_TYPE,
        c.TRANSACTION_PREPARED_TYPE,
        c.TRANSACTION_COMMIT_TYPE,
        c.TRANSACTION_ROLLBACK_TYPE,
    )
    flags = [r["sys_flag"] for r in _records(500)] + [t | other for t in types for other in (0, 1, 2, 3, 16, 48)]
    assert {f & c.TRANSACTION_ROLLBACK_TYPE for f in flags} == set(types)
    assert dispatched_mask(pa.array(flags, pa.int32())).to_pylist() == [is_dispatched(f) for f in flags]


def test_the_driver_path_gives_the_python_tags_code() -> None:
    records = _records(400)
    cq_rows = consume_queue_rows(commitlog_table(records))
    expected = sorted((r["commit_log_offset"], _python_tags_code(r)) for r in records if is_dispatched(r["sys_flag"]))
    assert (
        sorted(zip(cq_rows["commit_log_offset"].to_pylist(), cq_rows["tags_code"].to_pylist(), strict=True)) == expected
    )


@pytest.mark.spark
def test_the_spark_columns_give_the_python_forms(spark: SparkSession) -> None:
    records = _records(400)
    records_df = commitlog_frame(spark, records)
    level = F.when(F.col("topic") == c.SCHEDULE_TOPIC, rules.delay_level(F.col("raw_properties")))
    rows = records_df.select(
        "commit_log_offset",
        rules.is_dispatched(F.col("sys_flag")).alias("dispatched"),
        level.alias("level"),
        rules.consume_queue_tags_code(
            rules.java_string_hash(F.when(F.length("tags") > 0, F.col("tags"))), level, F.col("store_timestamp")
        ).alias("tags_code"),
    ).collect()
    by_offset = {r["commit_log_offset"]: r for r in rows}
    for record in records:
        row = by_offset[record["commit_log_offset"]]
        scheduled = record["topic"] == c.SCHEDULE_TOPIC
        assert row["dispatched"] == is_dispatched(record["sys_flag"]), record
        assert row["level"] == (parse_delay_level(record["properties"].get("DELAY")) if scheduled else None), record
        assert row["tags_code"] == _python_tags_code(record), record


def test_queue_selection_by_hash_has_one_form() -> None:
    rng = random.Random(SEED)
    queues = [MessageQueue("T", "broker-a", i) for i in range(7)]
    for _ in range(300):
        arg = "".join(rng.choice("abcXYZ019日😀") for _ in range(rng.randrange(0, 12)))
        index = select_queue_by_hash(arg, len(queues))
        assert select_by_hash(queues, Message("T", b"x"), arg) == queues[index]
        assert select_queue_id(arg, 3, len(queues)) == index
    assert select_queue_by_hash("polygenelubricants", 10) == 8  # hashCode is Integer.MIN_VALUE
    assert [select_queue_by_hash(k, 10) for k in ("123", "234")] == [0, 3]


def test_the_queue_keys_are_the_catalog_columns() -> None:
    for spec in (CONSUME_QUEUE, CONSUMER_OFFSETS, REPLAY_PROGRESS):
        assert set(QUEUE_KEY) <= set(spec.column_names), spec.name
    assert set(GROUP_QUEUE_KEY) <= set(CONSUMER_OFFSETS.column_names)
    assert GROUP_QUEUE_KEY[1:] == QUEUE_KEY
