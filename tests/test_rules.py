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
    encode_properties,
    is_dispatched,
    parse_delay_level,
    schedule_level,
    select_queue_by_hash,
)
from broker_model.common import constants as c
from jobs import rules
from jobs.rebuild_consume_queue.driver import consume_queue_rows
from jobs.replay.plan import select_queue_id
from schemas.catalog import CONSUME_QUEUE, CONSUMER_OFFSETS, REPLAY_PROGRESS

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
        records.append(
            {
                "broker_name": "broker-a",
                "topic": topic,
                "queue_id": 0,
                "queue_offset": i,
                "commit_log_offset": i * 100,
                "store_size": 100,
                "sys_flag": rng.choice([0, 4, 8, 12, 1, 9, 13, 0x100 | 8, 0x7FFFFFFF, -1]),
                "tags": properties.get("TAGS") or None,
                "store_timestamp": rng.randrange(0, 2**41),
                "raw_properties": encode_properties(properties).encode(),
                "delay": delay,
            }
        )
    return records


def _python_tags_code(record: dict[str, Any]) -> int:
    return consume_queue_tags_code(record["topic"], record["tags"], record["delay"], record["store_timestamp"])


def test_the_delay_level_is_read_as_java_integer_parse_int() -> None:
    assert [parse_delay_level(t) for t in ("+5", "-0", "007", "2147483647")] == [5, 0, 7, 2**31 - 1]
    assert [parse_delay_level(t) for t in (" 3", "٣", "²", "1.5", "", "2147483648", None)] == [None] * 7
    assert [schedule_level(t) for t in ("0", "-1", "1", "18", "19", "x")] == [None, None, 1, 18, 18, None]


def test_dispatch_python_and_arrow_agree() -> None:
    flags = [r["sys_flag"] for r in _records(500)]
    assert dispatched_mask(pa.array(flags, pa.int32())).to_pylist() == [is_dispatched(f) for f in flags]


def test_the_driver_path_gives_the_python_tags_code() -> None:
    records = _records(400)
    rows = pa.Table.from_pylist([{k: v for k, v in r.items() if k != "delay"} for r in records])
    cq_rows = consume_queue_rows(rows)
    expected = sorted((r["commit_log_offset"], _python_tags_code(r)) for r in records if is_dispatched(r["sys_flag"]))
    assert (
        sorted(zip(cq_rows["commit_log_offset"].to_pylist(), cq_rows["tags_code"].to_pylist(), strict=True)) == expected
    )


@pytest.mark.spark
def test_the_spark_columns_give_the_python_forms(spark: SparkSession) -> None:
    records = _records(400)
    schema = (
        "topic string, sys_flag int, tags string, store_timestamp long, raw_properties binary, commit_log_offset long"
    )
    records_df = spark.createDataFrame([tuple(r[n] for n in schema_names(schema)) for r in records], schema)
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
        assert row["level"] == (parse_delay_level(record["delay"]) if scheduled else None), record
        assert row["tags_code"] == _python_tags_code(record), record


def schema_names(ddl: str) -> list[str]:
    return [part.split()[0] for part in ddl.split(",")]


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
