"""The incremental ``consumer_offsets``: a chain of runs, each moving the previous table on by the
rows appended since, gives after every step the table a full run with Spark gives on the same inputs,
and so does a full run on the driver.

Seeded random steps on real Delta tables: consume-queue rows appended to the tails of queues (some
new, some of a topic nobody subscribed to yet, some offsets held twice), offset commits by consumers
and resets (at the tail, inside the old rows, beyond the end, on queues the log does not have, by a
group that appears later), topic configurations (queue counts that grow and shrink, of topics with
and without rows, some timed after the step's T), and now and then rows stored after the step's T,
which make the next run compute from the whole inputs.
"""

from __future__ import annotations

import importlib
import json
import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from broker_model.common import RETRY_GROUP_TOPIC_PREFIX
from jobs.consumer_offsets import ConsumerOffsetsConfig, Previous, check_foldable, run
from jobs.lake import Lake
from jobs.runs import MOVE_ON_FROM, CannotFold
from schemas.catalog import CONSUME_QUEUE, CONSUMER_OFFSET_COMMITS, CONSUMER_OFFSETS, JOB_RUNS, TOPIC_CONFIG
from tests.helpers import DRIVER_LAKE, ENGINE, canonical_rows, seeds, spark_reference

pytestmark = [pytest.mark.spark, pytest.mark.both_engines]

BROKERS = ("broker-a", "broker-b")
GROUPS = ("g1", "g2", "g3")
TOPICS = ("Orders", "Audit", "Later", *(RETRY_GROUP_TOPIC_PREFIX + g for g in GROUPS))
STEP_MS = 1_000


class _Story:
    """The inputs written so far, and the generator of the next step's rows."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.tails: dict[tuple[str, str, int], int] = {}
        self.now = 1_000_000

    def step(self, late: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], int]:
        """(consume-queue rows, offset commits, topic configurations, T) of one step, stored after
        the last T; ``late`` adds rows stored after this step's T."""
        r, start = self.random, self.now
        self.now += STEP_MS
        cq_rows = []
        for _ in range(r.randint(0, 25)):
            topic = r.choice(TOPICS if r.random() < 0.8 else ("Orders",))
            queue = (r.choice(BROKERS), topic, r.randint(0, 2))
            offset = self.tails.get(queue, r.choice((0, 0, 5)))
            stored = r.randint(start + 1, self.now)
            cq_rows.append(_cq_row(queue, offset, stored))
            if r.random() < 0.1:  # the same queue offset held twice, the second in this step
                cq_rows.append(_cq_row(queue, offset, r.randint(start + 1, self.now)))
            if r.random() < 0.1 and offset:  # an offset of an earlier step held again, stored earlier
                cq_rows.append(_cq_row(queue, offset - 1, start - r.randint(0, 3 * STEP_MS)))
            self.tails[queue] = offset + 1
        commits = []
        groups = GROUPS if start > 1_003_000 else GROUPS[:2]
        for _ in range(r.randint(0, 8)):
            group = r.choice(groups)
            queue = (r.choice(BROKERS), r.choice(("Orders", "Audit", "Later", "Nowhere", "Empty")), r.randint(0, 3))
            tail = self.tails.get(queue, 0)
            offset = r.choice((tail, tail, r.randint(0, tail + 1), tail + 3, 0))
            source = "reset" if r.random() < 0.2 else "consumer"
            commits.append(_commit(group, queue, offset, r.randint(start + 1, self.now), source))
        if commits and r.random() < 0.3:  # a tie of time on one key
            tied = dict(commits[-1])
            tied["offset"] += 1
            tied["source"] = "reset" if tied["source"] == "consumer" else "consumer"
            commits.append(tied)
        configs = []
        for _ in range(r.randint(0, 3)):  # queue counts, some timed after T (counted by a later run)
            topic = r.choice(("Orders", "Audit", "Empty", RETRY_GROUP_TOPIC_PREFIX + "g1"))
            stored = r.randint(start + 1, self.now + (STEP_MS if r.random() < 0.2 else 0))
            configs.append(_topic_config(r.choice(BROKERS), topic, r.choice((0, 1, 2, 4)), stored))
        if late:
            queue = ("broker-a", "Orders", 0)
            cq_rows.append(_cq_row(queue, self.tails.get(queue, 0), self.now + 500))
            self.tails[queue] = self.tails.get(queue, 0) + 1
            commits.append(_commit("g1", queue, 1, self.now + 400, "consumer"))
        return cq_rows, commits, configs, self.now


def _topic_config(broker: str, topic: str, queue_nums: int, at: int) -> dict[str, Any]:
    return {"broker_name": broker, "topic": topic, "queue_nums": queue_nums, "perm": 6, "updated_timestamp": at}


def _cq_row(queue: tuple[str, str, int], offset: int, stored: int) -> dict[str, Any]:
    broker, topic, queue_id = queue
    return {
        "broker_name": broker,
        "topic": topic,
        "queue_id": queue_id,
        "queue_offset": offset,
        "commit_log_offset": 1_000 * offset,
        "store_size": 100,
        "tags_code": 0,
        "store_timestamp": stored,
    }


def _commit(group: str, queue: tuple[str, str, int], offset: int, at: int, source: str) -> dict[str, Any]:
    reset = source == "reset"
    return {
        "group": group,
        "broker_name": queue[0],
        "topic": queue[1],
        "queue_id": queue[2],
        "offset": offset,
        "commit_timestamp": at,
        "source": source,
        "client_id": "10.0.0.1@1",
        "reset_id": "r-1" if reset else None,
        "previous_offset": 0 if reset else None,
        "reason": "test" if reset else None,
        "operator": "ops@host" if reset else None,
    }


def _append(
    lake: Lake, cq_rows: list[dict[str, Any]], commits: list[dict[str, Any]], configs: list[dict[str, Any]]
) -> None:
    if configs:
        lake.append_rows(TOPIC_CONFIG, pa.Table.from_pylist(configs, schema=TOPIC_CONFIG.arrow_schema))
    if cq_rows:
        lake.append_rows(CONSUME_QUEUE, pa.Table.from_pylist(cq_rows, schema=CONSUME_QUEUE.arrow_schema))
    if commits:
        lake.append_rows(
            CONSUMER_OFFSET_COMMITS, pa.Table.from_pylist(commits, schema=CONSUMER_OFFSET_COMMITS.arrow_schema)
        )


def _plans(lake: Lake) -> list[tuple[str, str, int | None, int | None]]:
    """Per run that computed, in order: (plan, message, rows read by moving on, rows computing whole
    would read); a run with nothing to compute (NOOP) records no plan."""
    runs = lake.read_rows(JOB_RUNS, ["started_timestamp", "run_id", "message", "parameters"]).to_pylist()
    plans = []
    for run_row in sorted(runs, key=lambda r: (r["started_timestamp"], r["run_id"])):
        parameters = {name: json.loads(value) for name, value in run_row["parameters"]}
        if "plan" not in parameters:
            continue
        plan = parameters["plan"]
        plans.append((plan, run_row["message"], parameters.get("read_rows"), parameters.get("whole_rows")))
    return plans


@pytest.mark.parametrize("seed", seeds(3, 8))
def test_a_chain_of_incremental_runs_gives_what_full_runs_give(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    story = _Story(seed)
    chained, whole = Lake(spark, tmp_path / "chained", ENGINE), Lake(spark, tmp_path / "whole", ENGINE)
    driver = Lake(spark, tmp_path / "driver", ENGINE)
    lakes = (chained, whole, driver) if DRIVER_LAKE else (chained, whole)
    late_steps = {3, 6}
    steps = 8
    for step in range(steps):
        cq_rows, commits, configs, as_of = story.step(late=step in late_steps)
        for lake in lakes:
            _append(lake, cq_rows, commits, configs)

        # moving on taken whenever it is exact, whatever it reads: the chain checks that it is exact
        run(spark, ConsumerOffsetsConfig(chained.root, as_of, engine=ENGINE, move_on_share=math.inf, move_on_from=0))
        with_spark = {"driver_rows": 0} if spark_reference(step, steps) else {}
        run(spark, ConsumerOffsetsConfig(whole.root, as_of, engine=ENGINE, full=True, **with_spark))
        if DRIVER_LAKE:
            run(spark, ConsumerOffsetsConfig(driver.root, as_of, engine=ENGINE, full=True))

        expected = canonical_rows(whole.read_rows(CONSUMER_OFFSETS))
        for lake in lakes:
            assert canonical_rows(lake.read_rows(CONSUMER_OFFSETS)) == expected, f"step {step}"

    moved_on = [i for i, (plan, message, *_) in enumerate(_plans(chained)) if plan == "moved on"]
    # the first run and the run after each step with late rows compute from the whole inputs
    assert moved_on == [i for i in range(steps) if i != 0 and i - 1 not in late_steps]
    empty = [r for r in chained.read_rows(CONSUMER_OFFSETS).to_pylist() if r["broker_offset"] == 0]
    assert empty and all(r["diff"] == -(r["consumer_offset"] or 0) and r["anomaly"] is None for r in empty)


def test_a_run_moves_on_while_that_reads_little_and_computes_whole_once_it_would_read_more(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = Lake(spark, tmp_path / "lake", ENGINE)
    small, big = ("broker-a", "Small", 0), ("broker-a", "Big", 0)
    for offset in range(5):  # a file per append, as a broker's offset commits and small increments come
        _append(
            lake,
            [_cq_row(small, offset, 1_000 + offset)],
            [_commit("g1", small, offset, 1_000 + offset, "consumer")],
            [],
        )
    _append(lake, [_cq_row(big, o, 1_000) for o in range(20_000)], [], [])
    run(spark, ConsumerOffsetsConfig(lake.root, 2_000, engine=ENGINE, move_on_from=0))
    # a row and a commit on the topic the group reads: moving on reads 3 small files, computing
    # whole the 12 files of the commits and of Small
    _append(lake, [_cq_row(small, 5, 2_100)], [_commit("g1", small, 6, 2_200, "consumer")], [])
    run(spark, ConsumerOffsetsConfig(lake.root, 3_000, engine=ENGINE, move_on_from=0))
    # 30,000 more rows on Big and a group reading it for the first time: moving on would read the
    # new rows and then the whole of Big; computing whole reads Big once, with Small and the commits
    _append(
        lake, [_cq_row(big, o, 3_100) for o in range(20_000, 50_000)], [_commit("g2", big, 10, 3_200, "consumer")], []
    )
    run(spark, ConsumerOffsetsConfig(lake.root, 4_000, engine=ENGINE, move_on_from=0))
    # a row and a commit on Big again: moving on reads the new files and Big's first file (the
    # offsets the commit points at), computing whole all of Big
    _append(lake, [_cq_row(big, 50_000, 4_100)], [_commit("g2", big, 20, 4_200, "consumer")], [])
    run(spark, ConsumerOffsetsConfig(lake.root, 5_000, engine=ENGINE, move_on_from=0))
    # 300 log commits that add no rows, then a commit: moving on would parse 301 commit files
    # (weighed as 154,112 rows) before it knows its files; computing whole reads 50,016 rows in 18
    # files (weighed as 123,744 rows), half of which moving on may read
    for _ in range(300):
        lake.append_rows(CONSUMER_OFFSET_COMMITS, CONSUMER_OFFSET_COMMITS.arrow_schema.empty_table())
    _append(lake, [], [_commit("g1", small, 6, 5_100, "consumer")], [])
    previous_table = lake.version(CONSUMER_OFFSETS)
    reads: list[tuple[str, Any]] = []  # the reads this run makes, recorded on their way to the lake
    for method in ("read_rows", "read_appended_rows", "read_cost"):
        real = getattr(Lake, method)

        def spy(self: Lake, spec: Any, *args: Any, _real: Any = real, _name: str = method, **kwargs: Any) -> Any:
            reads.append((_name, getattr(spec, "name", spec), kwargs.get("version")))
            return _real(self, spec, *args, **kwargs)

        monkeypatch.setattr(Lake, method, spy)
    run(spark, ConsumerOffsetsConfig(lake.root, 6_000, engine=ENGINE, move_on_from=0))
    monkeypatch.undo()
    # refused before it read the previous table or any new row, or loaded the previous table's log
    # to count its files: the whole computation's reads only
    assert ("read_rows", CONSUMER_OFFSETS.name, previous_table) not in reads, reads
    assert not [r for r in reads if r[:2] == ("read_cost", CONSUMER_OFFSETS.name)], reads
    assert not [r for r in reads if r[0] == "read_appended_rows"], reads
    assert ("read_rows", CONSUMER_OFFSET_COMMITS.name, lake.version(CONSUMER_OFFSET_COMMITS)) in reads, reads
    # a commit after it: moving on again
    _append(lake, [], [_commit("g1", small, 6, 6_100, "consumer")], [])
    run(spark, ConsumerOffsetsConfig(lake.root, 7_000, engine=ENGINE, move_on_from=0))

    plans = _plans(lake)
    assert [plan for plan, *_ in plans] == ["whole", "moved on", "whole", "moved on", "whole", "moved on"], plans
    assert "more than 0.5 of computing whole" in plans[2][1] and "first time" in plans[2][1], plans[2]
    assert "with the log commits since the previous run: 0 rows in 0 files and 301 log commits" in plans[4][1]
    # refused before the previous table or the new commits were read: against an upper bound
    assert "of the most computing whole can read" in plans[4][1], plans[4]
    for _, message, read, whole in (plans[1], plans[3], plans[5]):
        assert read is not None and whole is not None and read < whole, message
    assert plans[3][2] == 20_000 + 1 + 1 + 2  # Big's first file, the new row and commit, the previous 2 rows
    moved_on = canonical_rows(lake.read_rows(CONSUMER_OFFSETS))
    run(spark, ConsumerOffsetsConfig(lake.root, 7_000, engine=ENGINE, move_on_from=0, full=True))
    assert canonical_rows(lake.read_rows(CONSUMER_OFFSETS)) == moved_on
    rows = lake.read_rows(CONSUMER_OFFSETS).to_pylist()
    assert {(r["group"], r["topic"], r["consumer_offset"], r["broker_offset"]) for r in rows} >= {
        ("g1", "Small", 6, 6),
        ("g2", "Big", 20, 50_001),
    }
    # by default a lake whose whole computation reads this little is computed whole, before any read
    _append(lake, [], [_commit("g1", small, 6, 7_100, "consumer")], [])
    run(spark, ConsumerOffsetsConfig(lake.root, 8_000, engine=ENGINE))
    _append(lake, [], [_commit("g1", small, 6, 8_100, "consumer")], [])
    run(spark, ConsumerOffsetsConfig(lake.root, 9_000, engine=ENGINE, move_on_from=60_000))
    _append(lake, [], [_commit("g1", small, 6, 9_100, "consumer")], [])
    run(spark, ConsumerOffsetsConfig(lake.root, 10_000, engine=ENGINE, move_on_from=40_000))
    plans = _plans(lake)[-3:]
    assert [plan for plan, *_ in plans] == ["whole", "whole", "moved on"], plans
    # after a run with nothing to compute (NOOP), counted from the Delta logs; after one that computed,
    # from its record before any log is loaded: computing whole read about 50,000 rows
    assert f"less than the {MOVE_ON_FROM:,} from which moving on is worth its fixed costs" in plans[0][1], plans
    assert "rows at the previous run, less than the 60,000 from which" in plans[1][1], plans[1]


def test_a_table_is_not_moved_on_to_an_earlier_t_nor_past_rows_it_left_for_a_later_one() -> None:
    previous = Previous([], as_of=2_000, through=2_000)
    commits = pa.Table.from_pylist(
        [_commit("g", ("b", "t", 0), 1, 2_000, "consumer")], schema=CONSUMER_OFFSET_COMMITS.arrow_schema
    )
    check_foldable(previous, 2_500, commits.slice(0, 0))
    with pytest.raises(CannotFold, match="before the previous run's"):
        check_foldable(previous, 1_999, commits.slice(0, 0))
    with pytest.raises(CannotFold, match="stored after its as_of"):
        check_foldable(Previous([], 2_000, 2_001), 2_500, commits.slice(0, 0))
    with pytest.raises(CannotFold, match="not after the previous as_of"):
        check_foldable(previous, 2_500, commits)


@pytest.mark.parametrize("seed", [3, 8, 13])
def test_the_driver_computation_over_chunks_in_any_order_equals_it_over_the_whole_consume_queue(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.consumer_offsets.fold import CQ_CODED_COLUMNS, CQ_ROW_COLUMNS, compute, configured_queues
    from schemas.catalog import OFFSET_COMMIT_COLUMNS

    story, cq_rows, commits, configs = _Story(seed), [], [], []
    for step in range(8):
        rows, more, configured, as_of = story.step(late=step in {3, 6})
        cq_rows += rows
        commits += more
        configs += configured
    cq = pa.Table.from_pylist(cq_rows, schema=CONSUME_QUEUE.arrow_schema).select(list(CQ_ROW_COLUMNS))
    committed = pa.Table.from_pylist(commits, schema=CONSUMER_OFFSET_COMMITS.arrow_schema).select(
        list(OFFSET_COMMIT_COLUMNS)
    )
    # chunks cut anywhere (a queue's least offset and its duplicates land in several), read in any order
    shuffled = random.Random(seed)
    cuts = sorted(shuffled.sample(range(1, cq.num_rows), 6))
    chunks = [cq.slice(start, end - start) for start, end in zip([0, *cuts], [*cuts, cq.num_rows], strict=True)]
    shuffled.shuffle(chunks)
    # as the job reads them: the columns it groups by dictionary-encoded, one dictionary per chunk
    dictionary = pa.dictionary(pa.int32(), pa.string())
    coded = [
        chunk.cast(pa.schema([f.with_type(dictionary) if f.name in CQ_CODED_COLUMNS else f for f in chunk.schema]))
        for chunk in chunks
    ]
    topic_config = pa.Table.from_pylist(configs, schema=TOPIC_CONFIG.arrow_schema)
    for t in (as_of - 3 * STEP_MS, as_of):
        queues = configured_queues(topic_config, t)
        whole = compute(t, committed, cq, queues)
        assert compute(t, committed, iter(chunks), queues) == whole
        assert compute(t, committed, iter(coded), queues) == whole
        assert any(row["oldest_unconsumed_timestamp"] is not None for row in whole)
        # the rows at the wanted offsets found through a hash set instead of a bitmap over their span
        with monkeypatch.context() as patched:
            patched.setattr(importlib.import_module("jobs.consumer_offsets.fold"), "_BITMAP_SPAN", 0)
            assert compute(t, committed, iter(coded), queues) == whole
