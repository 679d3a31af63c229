"""The incremental ``resolve_transactions``: a chain of runs, each moving the previous table on by the
transaction records appended since, gives after every step the table and the record counts a full
run with Spark gives on the same commit log, and so does a full run on the driver.

Seeded random steps on real Delta tables: transactions begun on two brokers (with and without uniq
key or producer group, with odd check immunities), check rounds writing re-put copies, resent
halves, ops ending originals or copies (batched, with other tags, naming offsets no half has yet,
or not a number), final records (some twice, some naming a record written later), discard records
(some before their half), and now and then records stored after the step's T, which make the next
run decide every transaction again. Short timeout and
reserve times let transactions pass from PENDING to CHECK_DUE to EXPIRED between steps.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_model.common import constants as c
from jobs.lake import Lake
from jobs.resolve_transactions import ResolveTransactionsConfig, run
from jobs.resolve_transactions.fold import COUNTED, Previous, check_foldable
from jobs.runs import CannotFold
from schemas.catalog import COMMITLOG, JOB_RUNS, TRANSACTION_RECORDS, TRANSACTION_STATE
from tests.builders import commitlog_record, commitlog_table
from tests.helpers import DRIVER_LAKE, ENGINE, canonical_rows, seeds, spark_reference

pytestmark = [pytest.mark.spark, pytest.mark.both_engines]

STEP_MS = 1_000
SETTINGS = {"timeout_ms": 1_500, "check_max": 3, "reserve_ms": 5_000}
WITH_SPARK = {"engine": ENGINE, "full": True, "driver_records": 0, **SETTINGS}  # the reference
ON_THE_DRIVER = {"engine": ENGINE, "full": True, **SETTINGS}
SEGMENT = 1 << 20


class _Broker:
    """One broker's offsets and the half records it holds."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.offset = 0
        self.half_offset = 0
        self.op_offset = 0
        self.halves: list[dict[str, Any]] = []  # every half record: originals and copies


class _Story:
    """The commit log written so far, and the generator of the next step's records."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.brokers = [_Broker("broker-a"), _Broker("broker-b")]
        self.now = 1_000_000
        self.serial = 0

    def step(self, late: bool) -> tuple[list[dict[str, Any]], int]:
        """(commit log rows, T) of one step, stored after the last T; ``late`` adds records stored
        after this step's T."""
        r, start = self.random, self.now
        self.now += STEP_MS
        rows: list[dict[str, Any]] = []
        for _ in range(r.randint(4, 14)):
            broker = r.choice(self.brokers)
            stored = r.randint(start + 1, self.now)
            rows.append(self._record(broker, stored))
        if late:
            rows.append(self._begin(self.brokers[0], self.now + 300))
        return rows, self.now

    def _record(self, broker: _Broker, stored: int) -> dict[str, Any]:
        r = self.random
        if not broker.halves or r.random() < 0.3:
            return self._begin(broker, stored)
        half = r.choice(broker.halves)
        original = half["original"]
        what = r.random()
        if what < 0.25:  # a check round's re-put copy
            checks = int(half["properties"].get(c.PROPERTY_TRANSACTION_CHECK_TIMES, "0")) + 1
            extra = {c.PROPERTY_TRANSACTION_CHECK_TIMES: str(checks), c.PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: "1"}
            return self._half(broker, stored, {**original["properties"], **extra}, original["born"], original)
        if what < 0.3:  # a resent half: a duplicate
            return self._half(broker, stored, dict(original["properties"]), original["born"], original)
        if what < 0.6:  # an op
            offsets = [str(half["queue_offset"])]
            if r.random() < 0.3:
                offsets.append(str(r.choice(broker.halves)["queue_offset"]))
            if r.random() < 0.1:
                offsets.append(r.choice(["x", str(broker.half_offset + r.randint(0, 2))]))  # garbage, or ahead
            body = ",".join(offsets) + ("," if r.random() < 0.5 else "")
            tags = "d" if r.random() < 0.9 else "x"
            broker.op_offset += 1
            return self._put(
                broker, c.RMQ_SYS_TRANS_OP_HALF_TOPIC, broker.op_offset - 1, stored, {c.PROPERTY_TAGS: tags}, body
            )
        if what < 0.85:  # a final record in the real topic; now and then naming a record not written yet
            ended = half["commit_log_offset"] if r.random() < 0.9 else broker.offset + 300 * r.randint(1, 3)
            return self._put(
                broker, "Orders", r.randint(0, 99), stored, {}, "m", sys_flag=c.TRANSACTION_COMMIT_TYPE, prepared=ended
            )
        if what < 0.88:  # a discard record of a transaction not begun yet
            properties = {**original["properties"], c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"U{self.serial + 1:06d}"}
            return self._put(broker, c.TRANS_CHECK_MAX_TIME_TOPIC, 0, stored, properties, "m")
        properties = {
            **original["properties"],
            c.PROPERTY_TRANSACTION_CHECK_TIMES: half["properties"].get(c.PROPERTY_TRANSACTION_CHECK_TIMES, "0"),
        }
        return self._put(broker, c.TRANS_CHECK_MAX_TIME_TOPIC, 0, stored, properties, "m")

    def _begin(self, broker: _Broker, stored: int) -> dict[str, Any]:
        r = self.random
        self.serial += 1
        properties = {c.PROPERTY_REAL_TOPIC: "Orders", c.PROPERTY_REAL_QUEUE_ID: str(r.randint(0, 3))}
        if r.random() < 0.9:
            properties[c.PROPERTY_PRODUCER_GROUP] = r.choice(["pg-1", "pg-2"])
        if r.random() < 0.9:
            properties[c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = f"U{self.serial:06d}"
        if r.random() < 0.2:
            properties[c.PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = r.choice(["2", "-1", "x", "0"])
        born = stored - r.choice([0, 200, 1_200, 2_500, -300])
        return self._half(broker, stored, properties, born, None)

    def _half(
        self, broker: _Broker, stored: int, properties: dict[str, str], born: int, original: dict[str, Any] | None
    ) -> dict[str, Any]:
        broker.half_offset += 1
        row = self._put(broker, c.RMQ_SYS_TRANS_HALF_TOPIC, broker.half_offset - 1, stored, properties, "m", born=born)
        half = {
            "queue_offset": row["queue_offset"],
            "commit_log_offset": row["commit_log_offset"],
            "properties": properties,
            "born": born,
        }
        half["original"] = original if original is not None else half
        broker.halves.append(half)
        return row

    def _put(
        self,
        broker: _Broker,
        topic: str,
        queue_offset: int,
        stored: int,
        properties: dict[str, str],
        body: str,
        *,
        sys_flag: int = 0,
        prepared: int = 0,
        born: int | None = None,
    ) -> dict[str, Any]:
        offset = broker.offset
        broker.offset += 300
        return commitlog_record(
            broker_name=broker.name,
            topic=topic,
            queue_offset=queue_offset,
            body=body.encode(),
            properties=properties,
            sys_flag=sys_flag,
            commit_log_offset=offset,
            segment=offset - offset % SEGMENT,
            store_timestamp=stored,
            born_timestamp=born,
            prepared_transaction_offset=prepared,
        )


def _runs(lake: Lake) -> list[dict[str, Any]]:
    rows = lake.read_rows(JOB_RUNS, ["started_timestamp", "run_id", "message", "row_counts"]).to_pylist()
    return sorted(rows, key=lambda r: (r["started_timestamp"], r["run_id"]))


@pytest.mark.parametrize("seed", seeds(5, 11))
def test_a_chain_of_incremental_runs_gives_what_full_runs_give(
    spark: SparkSession, tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the records' files are packed after almost every run: a run still moves on from the last one
    monkeypatch.setattr("broker_model.store.delta_tables.SMALL_TABLE_FILES", 2)
    story = _Story(seed)
    chained, whole = Lake(spark, tmp_path / "chained", ENGINE), Lake(spark, tmp_path / "whole", ENGINE)
    driver = Lake(spark, tmp_path / "driver", ENGINE)
    lakes = (chained, whole, driver) if DRIVER_LAKE else (chained, whole)
    late_steps = {4}
    steps = 9
    seen_states: set[str] = set()
    for step in range(steps):
        rows, as_of = story.step(late=step in late_steps)
        for lake in lakes:
            lake.append_rows(COMMITLOG, commitlog_table(rows))
        run(spark, ResolveTransactionsConfig(chained.root, as_of, engine=ENGINE, **SETTINGS))
        reference = WITH_SPARK if spark_reference(step, steps) else ON_THE_DRIVER
        run(spark, ResolveTransactionsConfig(whole.root, as_of, **reference))
        if DRIVER_LAKE:
            run(spark, ResolveTransactionsConfig(driver.root, as_of, **ON_THE_DRIVER))

        expected = canonical_rows(whole.read_rows(TRANSACTION_STATE))
        counts = [{k: dict(_runs(whole)[-1]["row_counts"])[k] for k in COUNTED}]
        for lake in lakes:
            assert canonical_rows(lake.read_rows(TRANSACTION_STATE)) == expected, f"step {step}"
            assert [{k: dict(_runs(lake)[-1]["row_counts"])[k] for k in COUNTED}] == counts, f"step {step}"
        seen_states |= set(whole.read_rows(TRANSACTION_STATE).column("state").to_pylist())

    moved_on = [i for i, r in enumerate(_runs(chained)) if r["message"].endswith("moved on by the new records")]
    assert set(moved_on) <= set(range(1, steps)) - {i + 1 for i in late_steps}
    assert len(moved_on) >= steps - 4  # a half at an orphan op's offset also makes a run decide every one
    assert seen_states >= {"COMMITTED", "ROLLED_BACK", "DISCARDED", "PENDING", "CHECK_DUE"}
    history = DeltaTable(str(chained.location(TRANSACTION_RECORDS))).history()
    assert sum(h["operation"] == "OPTIMIZE" for h in history) >= 2


def test_a_table_is_not_moved_on_to_an_earlier_t_nor_past_records_it_left_for_a_later_one() -> None:
    counts = dict.fromkeys(COUNTED, 0)
    previous = Previous([], as_of=2_000, through=2_000, counts=counts)
    check_foldable(previous, 2_500)
    with pytest.raises(CannotFold, match="before the previous run's"):
        check_foldable(previous, 1_999)
    with pytest.raises(CannotFold, match="stored after its as_of"):
        check_foldable(Previous([], 2_000, 2_001, counts), 2_500)
    with pytest.raises(CannotFold, match="recorded no half_records"):
        check_foldable(Previous([], 2_000, 2_000, {}), 2_500)


def test_the_commit_log_rows_of_a_step_are_transaction_records(tmp_path: Path) -> None:
    rows, _ = _Story(1).step(late=False)
    topics = set(commitlog_table(rows).column("topic").to_pylist())
    assert c.RMQ_SYS_TRANS_HALF_TOPIC in topics
    assert pa.Table.from_pylist(rows).num_rows == len(rows)


def _incremental_against_spark(
    spark: SparkSession, tmp_path: Path, steps: list[tuple[list[dict[str, Any]], int]]
) -> Lake:
    """The lake of incremental runs after each step's rows, checked equal to full Spark runs."""
    chained, whole = Lake(spark, tmp_path / "chained", ENGINE), Lake(spark, tmp_path / "whole", ENGINE)
    for rows, as_of in steps:
        for lake in (chained, whole):
            lake.append_rows(COMMITLOG, commitlog_table(rows))
        run(spark, ResolveTransactionsConfig(chained.root, as_of, engine=ENGINE, **SETTINGS))
        run(spark, ResolveTransactionsConfig(whole.root, as_of, **WITH_SPARK))
        expected = canonical_rows(whole.read_rows(TRANSACTION_STATE))
        assert canonical_rows(chained.read_rows(TRANSACTION_STATE)) == expected, f"as of {as_of}"
    return chained


def test_a_final_and_a_discard_written_before_their_half_count_when_it_arrives(
    spark: SparkSession, tmp_path: Path
) -> None:
    broker = _Broker("broker-a")
    story = _Story(0)
    key = {c.PROPERTY_PRODUCER_GROUP: "pg-1", c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "U-early"}
    half_at = 900  # the commit log offset the half will take: three records later
    first = [
        story._put(
            broker, c.TRANS_CHECK_MAX_TIME_TOPIC, 0, 1_100, {**key, c.PROPERTY_TRANSACTION_CHECK_TIMES: "1"}, "m"
        ),
        story._put(broker, "Orders", 0, 1_200, {}, "m", sys_flag=c.TRANSACTION_COMMIT_TYPE, prepared=half_at),
        story._put(broker, c.RMQ_SYS_TRANS_HALF_TOPIC, 0, 1_300, {c.PROPERTY_REAL_TOPIC: "Orders"}, "m"),
    ]
    second = [story._put(broker, c.RMQ_SYS_TRANS_HALF_TOPIC, 1, 2_100, {**key, c.PROPERTY_REAL_TOPIC: "Orders"}, "m")]
    assert second[0]["commit_log_offset"] == half_at
    chained = _incremental_against_spark(spark, tmp_path, [(first, 2_000), (second, 3_000)])
    state = {r["uniq_key"]: r for r in chained.read_rows(TRANSACTION_STATE).to_pylist()}
    assert (state["U-early"]["state"], state["U-early"]["final_commit_log_offset"]) == ("DISCARDED", 300)
    assert state["U-early"]["anomaly"] == "FINAL_WITHOUT_OP"
    assert _runs(chained)[-1]["message"].endswith("moved on by the new records")


def test_a_second_half_at_the_queue_offset_of_an_ended_one_is_ended_by_the_same_op(
    spark: SparkSession, tmp_path: Path
) -> None:
    broker, story = _Broker("broker-a"), _Story(0)

    def half(uniq_key: str, stored: int) -> dict[str, Any]:
        properties = {c.PROPERTY_PRODUCER_GROUP: "pg-1", c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq_key}
        return story._put(broker, c.RMQ_SYS_TRANS_HALF_TOPIC, 5, stored, properties, "m")

    first = [half("A", 1_100), story._put(broker, c.RMQ_SYS_TRANS_OP_HALF_TOPIC, 0, 1_200, {c.PROPERTY_TAGS: "d"}, "5")]
    second = [half("B", 2_100)]
    chained = _incremental_against_spark(spark, tmp_path, [(first, 2_000), (second, 3_000)])
    states = {r["uniq_key"]: r["state"] for r in chained.read_rows(TRANSACTION_STATE).to_pylist()}
    assert states == {"A": "ROLLED_BACK", "B": "ROLLED_BACK"}
    # the driver does not move a table on across a half at an old half's position: it decides every
    # transaction again, and the run says why (before, the reason was never recorded, so a check for it
    # could not fail)
    assert _runs(chained)[-1]["message"] == (
        "computed in full: a new half record sits at the queue offset of an old one: "
        "broker broker-a, commit log offset 0"
    )
