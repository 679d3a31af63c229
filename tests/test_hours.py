"""The hourly summaries (``jobs.hours``): ``queue_hours`` and ``commit_hours`` folded step by step from
the rows the commit log and the offset commits gain equal the ones built from the whole tables with
Spark; the lag history and the traffic drawn from them; the nightly's per-broker summary.

Seeded random steps on real Delta tables: records of two brokers over several hours (prepared and
rolled back records that dispatch nothing, late records into hours already summarised), offset
commits (resets tying with consumer commits), and a commit log whose rows were removed, which makes
the next update build from the whole table.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from broker_model.common import constants as c
from jobs import hours
from jobs.hours import HOUR_MS, lag_over_time, topic_traffic
from jobs.lake import Lake
from jobs.nightly import broker_summary, segments_per_broker
from schemas.catalog import COMMIT_HOURS, COMMITLOG, CONSUMER_OFFSET_COMMITS, QUEUE_HOURS
from tests.builders import commitlog_record, commitlog_table
from tests.helpers import ENGINE, canonical_rows

pytestmark = pytest.mark.spark

SEGMENT = 1 << 20
START = 1_790_000_000_000 - 1_790_000_000_000 % HOUR_MS


def _queue(broker: str, topic: str, queue_id: int) -> dict[str, Any]:
    return {"broker_name": broker, "topic": topic, "queue_id": queue_id}


class _Story:
    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.offsets = {"broker-a": 0, "broker-b": 0}
        self.ends: dict[tuple[str, str, int], int] = {}

    def records(self, hour: int, count: int) -> list[dict[str, Any]]:
        r, rows = self.random, []
        for _ in range(count):
            broker, topic, queue_id = r.choice(list(self.offsets)), r.choice(["Orders", "Audit"]), r.randrange(2)
            at = START + HOUR_MS * max(0, hour - (1 if r.random() < 0.1 else 0)) + r.randrange(HOUR_MS)  # some late
            key = (broker, topic, queue_id)
            offset = self.offsets[broker]
            self.offsets[broker] += 300
            queue_offset = self.ends.get(key, 0)
            sys_flag = r.choice([0, 0, 0, c.TRANSACTION_PREPARED_TYPE, c.TRANSACTION_ROLLBACK_TYPE])
            if sys_flag == 0:
                self.ends[key] = queue_offset + 1
            rows.append(
                commitlog_record(
                    broker_name=broker,
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=queue_offset,
                    sys_flag=sys_flag,
                    body=b"x" * r.randrange(1, 50),
                    commit_log_offset=offset,
                    segment=offset - offset % SEGMENT,
                    store_timestamp=at,
                )
            )
        return rows

    def commits(self, hour: int, count: int) -> list[dict[str, Any]]:
        r, rows = self.random, []
        for _ in range(count):
            broker, topic, queue_id = r.choice(list(self.offsets)), r.choice(["Orders", "Audit"]), r.randrange(2)
            at = START + HOUR_MS * hour + r.choice([0, 5, 5, r.randrange(HOUR_MS)])  # ties now and then
            rows.append(
                {
                    "group": r.choice(["cg-a", "cg-b"]),
                    **_queue(broker, topic, queue_id),
                    "offset": r.randrange(0, self.ends.get((broker, topic, queue_id), 0) + 1),
                    "commit_timestamp": at,
                    "source": r.choice(["consumer", "consumer", "reset"]),
                }
            )
        return rows


def _append(lake: Lake, records: list[dict[str, Any]], commits: list[dict[str, Any]]) -> None:
    lake.append_rows(COMMITLOG, commitlog_table(records))
    lake.append_rows(
        CONSUMER_OFFSET_COMMITS, pa.Table.from_pylist(commits, schema=CONSUMER_OFFSET_COMMITS.arrow_schema)
    )


@pytest.mark.parametrize("seed", [4, 9])
def test_summaries_folded_step_by_step_equal_the_ones_built_from_the_whole_tables(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    story = _Story(seed)
    folded = Lake(spark, tmp_path / "folded", ENGINE)
    taken: list[dict[str, str]] = []
    for hour in range(5):
        records, commits = story.records(hour, 40), story.commits(hour, 12)
        _append(folded, records, commits)
        taken.append({})
        versions = hours.update(folded, choices=taken[-1])
        # no summary yet: built from the whole tables, on the driver and with Spark
        whole, with_spark = (
            Lake(spark, tmp_path / f"whole-{hour}", ENGINE),
            Lake(spark, tmp_path / f"spark-{hour}", ENGINE),
        )
        for lake in (whole, with_spark):
            lake.append_rows(COMMITLOG, folded.read_rows(COMMITLOG))
            lake.append_rows(CONSUMER_OFFSET_COMMITS, folded.read_rows(CONSUMER_OFFSET_COMMITS))
        hours.update(whole)
        hours.update(with_spark, driver_rows=0)
        for spec in (QUEUE_HOURS, COMMIT_HOURS):
            expected = canonical_rows(with_spark.read_rows(spec))
            assert canonical_rows(folded.read_rows(spec)) == expected, f"hour {hour}"
            assert canonical_rows(whole.read_rows(spec)) == expected, f"hour {hour}"
        assert hours.update(folded) == versions  # nothing new: nothing written
    # by what each way reads: whole while the summary's source is a file or two (a new file weighs as
    # 4,096 rows), moved on once the new file is at most half of what the whole source reads
    for spec in (QUEUE_HOURS, COMMIT_HOURS):
        how = [choices[spec.name] for choices in taken]
        assert how[0] == "built whole: no summary yet", how
        assert how[1].startswith("built whole: moving on would read "), how
        assert all(h.startswith("moved on: read ") for h in how[3:]), how
    assert folded.transaction_version(QUEUE_HOURS, hours.APP_ID) == folded.version(COMMITLOG)
    rows = folded.read_rows(QUEUE_HOURS).to_pylist()
    assert sum(r["messages"] for r in rows) == 200 and any(r["end_offset"] is None for r in rows)


@pytest.mark.parametrize("seed", [2, 7])
def test_summaries_of_parts_add_up_to_the_summary_of_the_whole(seed: int) -> None:
    story = _Story(seed)
    # every hour's rows dealt over three parts: a queue's hour, and a group's, is in several parts
    every_record = [r for hour in range(4) for r in story.records(hour, 60)]
    every_commit = [r for hour in range(4) for r in story.commits(hour, 20)]
    records = [every_record[i::3] for i in range(3)]
    commits = [every_commit[i::3] for i in range(3)]
    log_parts = [commitlog_table(part).select(list(hours.LOG_COLUMNS)) for part in records]
    commit_parts = [pa.Table.from_pylist(part, schema=CONSUMER_OFFSET_COMMITS.arrow_schema) for part in commits]
    whole_log = hours.summarize_log([pa.concat_tables(log_parts)])
    whole_commits = hours.summarize_commits([pa.concat_tables(commit_parts)])

    assert canonical_rows(hours.summarize_log([hours.summarize_log([p]) for p in log_parts])) == canonical_rows(
        whole_log
    )
    folded = hours.summarize_commits([hours.summarize_commits([p]) for p in commit_parts])
    assert canonical_rows(folded) == canonical_rows(whole_commits)
    # as a whole source is read: chunks with dictionary-encoded strings, added to the summary so far
    for summarize, parts, whole in (
        (hours.summarize_log, log_parts, whole_log),
        (hours.summarize_commits, commit_parts, whole_commits),
    ):
        so_far = summarize([])
        for part in parts:
            encoded = part.set_column(
                part.schema.get_field_index("topic"), "topic", pc.dictionary_encode(part["topic"])
            )
            so_far = summarize([so_far, summarize([encoded])])
        assert canonical_rows(so_far) == canonical_rows(whole)
    # one chunk of files read with dictionaries: a dictionary per file, unified before the grouping

    def coded(part: pa.Table, order: int) -> pa.Table:
        for name in ("broker_name", "topic"):
            values = sorted(set(part[name].to_pylist()))[::order]
            indices = pc.index_in(part[name], value_set=pa.array(values))
            array = pa.DictionaryArray.from_arrays(indices.combine_chunks(), pa.array(values))
            part = part.set_column(part.schema.get_field_index(name), name, array)
        return part

    chunk = pa.concat_tables([coded(part, 1 if i % 2 else -1) for i, part in enumerate(log_parts)])
    assert len({tuple(c.dictionary.to_pylist()) for c in chunk.column("topic").chunks}) > 1
    assert canonical_rows(hours.summarize_log([chunk])) == canonical_rows(whole_log)
    assert sum(whole_log.column("messages").to_pylist()) == 240
    assert hours.summarize_log([]).num_rows == 0 and hours.summarize_commits([]).num_rows == 0


def test_a_summary_is_built_again_when_its_source_lost_rows(spark: SparkSession, tmp_path: Path) -> None:
    story = _Story(1)
    lake, fresh = Lake(spark, tmp_path / "lake", ENGINE), Lake(spark, tmp_path / "fresh", ENGINE)
    _append(lake, story.records(0, 30), story.commits(0, 8))
    hours.update(lake)
    kept = lake.read_rows(CONSUMER_OFFSET_COMMITS).slice(0, 3)
    lake.overwrite_rows(CONSUMER_OFFSET_COMMITS, kept)  # rows removed: not an append
    fresh.append_rows(CONSUMER_OFFSET_COMMITS, kept)

    hours.update(lake)
    hours.update(fresh)

    assert canonical_rows(lake.read_rows(COMMIT_HOURS)) == canonical_rows(fresh.read_rows(COMMIT_HOURS))
    assert lake.transaction_version(COMMIT_HOURS, hours.APP_ID) == lake.version(CONSUMER_OFFSET_COMMITS)


def test_lag_is_taken_at_the_end_of_each_hour_from_the_latest_offsets_known_then() -> None:
    queue = _queue("broker-a", "Orders", 0)
    queue_hours = [
        {**queue, "hour": START, "end_offset": 2},
        {**queue, "hour": START + HOUR_MS, "end_offset": None},  # only prepared records: no end offset
        {**queue, "hour": START + 2 * HOUR_MS, "end_offset": 5},
        {**_queue("broker-a", "Orders", 1), "hour": START, "end_offset": 9},  # no group committed on it
    ]
    commit_hours = [
        {"group": "cg-a", **queue, "hour": hour, "commit_timestamp": hour + late, "is_reset": reset, "offset": offset}
        for hour, late, reset, offset in ((START + HOUR_MS, 7, False, 1), (START + 2 * HOUR_MS, 0, True, 0))
    ]
    end = HOUR_MS - 1
    assert lag_over_time(queue_hours, commit_hours, 24) == [
        {"group": "cg-a", "sample": 1, "as_of": START + HOUR_MS + end, "lag": 1},
        {"group": "cg-a", "sample": 2, "as_of": START + 2 * HOUR_MS + end, "lag": 5},
    ]
    # two points at most: every second hour back from the last
    assert [r["as_of"] for r in lag_over_time(queue_hours, commit_hours, 2)] == [START + 2 * HOUR_MS + end]
    assert lag_over_time([], commit_hours, 24) == []


def test_traffic_and_the_broker_summary_add_up_the_hours(spark: SparkSession, tmp_path: Path) -> None:
    lake = Lake(spark, tmp_path / "lake", ENGINE)
    records = [
        commitlog_record(broker_name="broker-a", topic="Orders", store_timestamp=START + 10, commit_log_offset=0),
        commitlog_record(broker_name="broker-a", topic="Audit", store_timestamp=START + HOUR_MS, commit_log_offset=300),
        commitlog_record(
            broker_name="broker-a",
            topic="Orders",
            store_timestamp=START + 20,
            commit_log_offset=SEGMENT,
            segment=SEGMENT,
        ),
        commitlog_record(broker_name="broker-b", topic="Orders", store_timestamp=START + 5, commit_log_offset=0),
    ]
    lake.append_rows(COMMITLOG, commitlog_table(records))
    versions = hours.update(lake)
    queue_hours = lake.read_rows(QUEUE_HOURS, version=versions[QUEUE_HOURS.name]).to_pylist()
    size = records[0]["store_size"]
    assert topic_traffic(queue_hours) == [
        {"topic": "Audit", "hour": START + HOUR_MS, "messages": 1, "bytes": records[1]["store_size"]},
        {"topic": "Orders", "hour": START, "messages": 3, "bytes": 3 * size},
    ]
    assert broker_summary(queue_hours, segments_per_broker(lake)) == [
        {
            "broker_name": "broker-a",
            "messages": 3,
            "bytes": 2 * size + records[1]["store_size"],
            "segments": 2,
            "topics": 2,
            "first_store_timestamp": START + 10,
            "last_store_timestamp": START + HOUR_MS,
        },
        {
            "broker_name": "broker-b",
            "messages": 1,
            "bytes": size,
            "segments": 1,
            "topics": 1,
            "first_store_timestamp": START + 5,
            "last_store_timestamp": START + 5,
        },
    ]


def test_a_time_before_1970_falls_in_the_hour_that_starts_before_it() -> None:
    """Spark's ``pmod``: the hour of -1 ms starts at -1 h, not at 0; a log without such times takes
    the quotient's shorter way, with the same hours."""
    stamps = [-HOUR_MS - 1, -HOUR_MS, -1, 0, HOUR_MS - 1, HOUR_MS]
    records = [
        commitlog_record(
            broker_name="broker-a", topic="Orders", queue_offset=i, store_timestamp=at, commit_log_offset=i
        )
        for i, at in enumerate(stamps)
    ]
    log = commitlog_table(records).select(list(hours.LOG_COLUMNS))
    summary = hours.summarize_log([log]).to_pylist()
    assert sorted((r["hour"], r["messages"]) for r in summary) == [
        (-2 * HOUR_MS, 1),
        (-HOUR_MS, 2),
        (0, 2),
        (HOUR_MS, 1),
    ]
    after_1970 = hours.summarize_log([log.filter(pc.field("store_timestamp") >= 0)]).to_pylist()
    assert sorted((r["hour"], r["messages"]) for r in after_1970) == [(0, 2), (HOUR_MS, 1)]
