"""The incremental ``route_dlq``: a chain of runs, each moving the previous ``retry_chains`` and ``dlq``
on by what changed since, gives after every step the tables a full run with Spark gives on the same
lake, and so does a full run on the driver.

Seeded random steps on real Delta tables of two brokers: original messages, chains of schedule,
retry and dead letter records (some with no ORIGIN_MESSAGE_ID, some naming a host no broker has,
some whose original is written only later, some moving to the other broker, some dead-lettered by a
tool), commits of the retry queues (moving on, and now and then reset back over consumed records),
retry limits changed between steps, redrives of dead letters, and now and then a record stored after
the step's T, which makes the next run compute every chain again.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker_model.common import constants as c
from broker_model.common import create_msg_id, parse_host
from jobs.dlq.decode import decode_retry_records
from jobs.dlq.fold import (
    CHAIN_ORIGINAL_COLUMNS,
    OPEN_STATES,
    PREVIOUS_COLUMNS,
    Context,
    Previous,
    check_foldable,
    compute,
    host_prefixes,
    offsets_at,
    origin_positions,
    origin_positions_of,
    touched_chains,
)
from jobs.dlq.job import RouteDlqConfig, run
from jobs.dlq.transforms import (
    PROPERTY_ROUTED_BY,
    build_dlq,
    build_origin_hosts,
    build_origins,
    build_retry_chains,
    build_retry_records,
    with_chain_key,
)
from jobs.lake import Lake
from jobs.runs import CannotFold
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUMER_OFFSET_COMMITS,
    DLQ,
    DLQ_REDRIVES,
    JOB_RUNS,
    RETRY_CHAINS,
    RETRY_RECORDS,
    SUBSCRIPTION_GROUP,
    spark_schema,
)
from tests.builders import commitlog_frame, commitlog_record, commitlog_table
from tests.helpers import DRIVER_LAKE, ENGINE, canonical_rows, seeds, spark_reference

pytestmark = [pytest.mark.spark, pytest.mark.both_engines]

STEP_MS = 1_000
SEGMENT = 1 << 20
GROUPS = ("g-audit", "g-stock")
HOSTS = {"broker-a": "10.0.0.1:10911", "broker-b": "10.0.0.2:10911"}
WITH_SPARK = {"engine": ENGINE, "full": True, "driver_records": 0}  # the reference
ON_THE_DRIVER = {"engine": ENGINE, "full": True}


class _Story:
    """The lake written so far, and the generator of the next step's rows."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.now = 1_000_000
        self.offsets = dict.fromkeys(HOSTS, 0)
        self.queue_ends: dict[tuple[str, str, int], int] = {}  # (broker, topic, queue) -> next offset
        self.committed: dict[tuple[str, str, str, int], int] = {}
        self.originals: list[dict[str, Any]] = []
        self.chains: list[dict[str, Any]] = []  # (group, origin id, uniq key, reconsume times, ...)
        self.dead: list[dict[str, Any]] = []
        self.pending_originals: list[tuple[str, int]] = []  # (broker, offset) named before written
        self.serial = 0

    def step(self, late: bool) -> tuple[dict[str, list[dict[str, Any]]], int]:
        """Rows per table of one step, stored after the last T, and the step's T."""
        r, start = self.random, self.now
        self.now += STEP_MS
        rows: dict[str, list[dict[str, Any]]] = {
            COMMITLOG.name: [],
            CONSUMER_OFFSET_COMMITS.name: [],
            SUBSCRIPTION_GROUP.name: [],
            DLQ_REDRIVES.name: [],
        }
        times = sorted(r.randint(start + 1, self.now) for _ in range(r.randint(6, 16)))
        for stored in times:
            what = r.random()
            if what < 0.2 or not self.originals:
                rows[COMMITLOG.name].append(self._original(stored))
            elif what < 0.7:
                rows[COMMITLOG.name] += self._fail(stored)
            elif what < 0.85:
                rows[CONSUMER_OFFSET_COMMITS.name].append(self._commit(stored))
            elif what < 0.92:
                rows[SUBSCRIPTION_GROUP.name].append(self._limit(stored))
            elif self.dead:
                rows[DLQ_REDRIVES.name] += self._redrive(stored)
        if late:
            rows[COMMITLOG.name] += self._fail(self.now + 300)
        return rows, self.now

    def _put(self, broker: str, topic: str, queue_id: int, stored: int, **fields: Any) -> dict[str, Any]:
        offset = self.offsets[broker]
        self.offsets[broker] += 400
        queue = (broker, topic, queue_id)
        queue_offset = self.queue_ends.get(queue, 0)
        self.queue_ends[queue] = queue_offset + 1
        return commitlog_record(
            broker_name=broker,
            topic=topic,
            queue_id=queue_id,
            queue_offset=queue_offset,
            commit_log_offset=offset,
            segment=offset - offset % SEGMENT,
            store_timestamp=stored,
            store_host=HOSTS[broker],
            **fields,
        )

    def _original(self, stored: int) -> dict[str, Any]:
        r = self.random
        broker = r.choice(list(HOSTS))
        self.serial += 1
        properties = {
            c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"U{self.serial:05d}",
            c.PROPERTY_KEYS: f"k{self.serial}",
        }
        if self.pending_originals and r.random() < 0.5:  # the record an earlier chain named
            broker, offset = self.pending_originals.pop()
            if self.offsets[broker] <= offset:
                self.offsets[broker] = offset
        row = self._put(broker, "Orders", r.randint(0, 3), stored, properties=properties, body=b"order")
        self.originals.append(row)
        return row

    def _fail(self, stored: int) -> list[dict[str, Any]]:
        """The next record of a chain: a new chain's first schedule record, or an old chain's next
        retry, schedule or dead letter record."""
        r = self.random
        if not self.chains or r.random() < 0.35:
            original = r.choice(self.originals)
            chain = {
                "group": r.choice(GROUPS),
                "broker": original["broker_name"],
                "uniq_key": original["uniq_key"],
                "origin": original["msg_id"],
                "times": 0,
                "next": "SCHEDULED",
            }
            what = r.random()
            if what < 0.1:
                chain["origin"] = None  # a copy sent back by a client: no ORIGIN_MESSAGE_ID
            elif what < 0.15:
                chain["origin"] = create_msg_id(parse_host("10.9.9.9:10911"), 4_000)  # no broker has this host
            elif what < 0.22:  # an original not written yet
                offset = self.offsets["broker-b"] + 400 * r.randint(2, 5)
                chain["origin"] = create_msg_id(parse_host(HOSTS["broker-b"]), offset)
                self.pending_originals.append(("broker-b", offset))
            self.chains.append(chain)
        else:
            chain = r.choice(self.chains)
        if chain["next"] == "DEAD":
            return self._fail(stored) if len(self.chains) < 400 else []
        if r.random() < 0.1:
            chain["broker"] = r.choice(list(HOSTS))  # the next record on the other broker
        properties = {c.PROPERTY_RETRY_TOPIC: "Orders"}
        if chain["origin"] is not None:
            properties[c.PROPERTY_ORIGIN_MESSAGE_ID] = chain["origin"]
        if chain["uniq_key"] is not None:
            properties[c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = chain["uniq_key"]
        group, broker = chain["group"], chain["broker"]
        if chain["next"] == "SCHEDULED":
            chain["times"] += 1
            chain["next"] = "RETRY"
            properties[c.PROPERTY_REAL_TOPIC] = c.RETRY_GROUP_TOPIC_PREFIX + group
            properties[c.PROPERTY_REAL_QUEUE_ID] = "0"
            return [
                self._put(broker, c.SCHEDULE_TOPIC, 2, stored, properties=properties, reconsume_times=chain["times"])
            ]
        if chain["next"] == "RETRY":
            chain["next"] = "DLQ" if r.random() < (0.6 if chain["times"] >= 2 else 0.2) else "SCHEDULED"
            topic = c.RETRY_GROUP_TOPIC_PREFIX + group
            return [self._put(broker, topic, 0, stored, properties=properties, reconsume_times=chain["times"])]
        chain["next"] = "DEAD"
        if r.random() < 0.3:
            properties[PROPERTY_ROUTED_BY] = "route_dlq"
        times = chain["times"] + (1 if r.random() < 0.8 else 0)
        row = self._put(
            broker, c.DLQ_GROUP_TOPIC_PREFIX + group, 0, stored, properties=properties, reconsume_times=times
        )
        self.dead.append(row)
        return [row]

    def _commit(self, stored: int) -> dict[str, Any]:
        r = self.random
        group, broker = r.choice(GROUPS), r.choice(list(HOSTS))
        topic = c.RETRY_GROUP_TOPIC_PREFIX + group
        key = (group, broker, topic, 0)
        end = self.queue_ends.get((broker, topic, 0), 0)
        committed = self.committed.get(key, 0)
        source = "client"
        if r.random() < 0.2 and committed:  # a reset back over consumed records
            offset, source = r.randint(0, committed - 1), "reset"
        else:
            offset = r.randint(committed, max(committed, end))
        self.committed[key] = offset
        return {
            "group": group,
            "broker_name": broker,
            "topic": topic,
            "queue_id": 0,
            "offset": offset,
            "commit_timestamp": stored,
            "source": source,
        }

    def _limit(self, stored: int) -> dict[str, Any]:
        r = self.random
        return {
            "broker_name": r.choice(list(HOSTS)),
            "group": r.choice(GROUPS),
            "retry_max_times": r.choice([1, 2, 3]),
            "retry_queue_nums": 1,
            "consume_enable": True,
            "consume_broadcast_enable": False,
            "consume_from_min_enable": False,
            "consume_message_orderly": False,
            "updated_timestamp": stored,
        }

    def _redrive(self, stored: int) -> list[dict[str, Any]]:
        dead = self.random.choice(self.dead)
        self.serial += 1
        row = {
            "request_id": f"req-{self.serial}",
            "broker_name": dead["broker_name"],
            "msg_id": dead["msg_id"],
            "group": dead["topic"].removeprefix(c.DLQ_GROUP_TOPIC_PREFIX),
            "target_topic": "Orders",
            "state": "PENDING",
            "updated_timestamp": stored,
        }
        return [row, {**row, "state": "SENT", "updated_timestamp": stored + 1}] if self.random.random() < 0.5 else [row]


def _brokers() -> pa.Table:
    rows = [
        {
            "broker_name": name,
            "store_host": host,
            "segment_size": SEGMENT,
            "flush_mode": "ASYNC_FLUSH",
            "started_timestamp": 1_000,
            "process": "test",
        }
        for name, host in HOSTS.items()
    ]
    return pa.Table.from_pylist(rows, schema=BROKERS.arrow_schema)


def _append(lake: Lake, rows: dict[str, list[dict[str, Any]]]) -> None:
    for name, table_rows in rows.items():
        if not table_rows:
            continue
        if name == COMMITLOG.name:
            lake.append_rows(COMMITLOG, commitlog_table(table_rows))
        else:
            spec = {s.name: s for s in (CONSUMER_OFFSET_COMMITS, SUBSCRIPTION_GROUP, DLQ_REDRIVES, BROKERS)}[name]
            lake.append_rows(spec, pa.Table.from_pylist(table_rows, schema=spec.arrow_schema))


def _messages(lake: Lake) -> list[str]:
    rows = lake.read_rows(JOB_RUNS, ["job", "started_timestamp", "run_id", "message"]).to_pylist()
    return [
        r["message"]
        for r in sorted(rows, key=lambda r: (r["started_timestamp"], r["run_id"]))
        if r["job"] == "route_dlq"
    ]


@pytest.mark.parametrize("seed", seeds(3, 8))
def test_a_chain_of_incremental_runs_gives_what_full_runs_give(
    spark: SparkSession, tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the records' files are packed after almost every run: a run still moves on from the last one
    monkeypatch.setattr("broker_model.store.delta_tables.SMALL_TABLE_FILES", 2)
    story = _Story(seed)
    names = ("chained", "whole", "driver") if DRIVER_LAKE else ("chained", "whole")
    lakes = {name: Lake(spark, tmp_path / name, ENGINE) for name in names}
    limits = [
        {**story._limit(1_000), "broker_name": b, "group": g, "retry_max_times": 2} for b in HOSTS for g in GROUPS
    ]
    for lake in lakes.values():
        lake.append_rows(BROKERS, _brokers())
        lake.append_rows(SUBSCRIPTION_GROUP, pa.Table.from_pylist(limits, schema=SUBSCRIPTION_GROUP.arrow_schema))
    late_steps = {4}
    steps = 8
    seen: dict[str, set[Any]] = {"state": set(), "reason": set(), "redrive": set()}
    bodies_read: list[Any] = []  # the filters of each read of retry_records' bodies on the driver
    real_read_rows = Lake.read_rows

    def read_rows(self: Lake, spec: Any, columns: Any = None, filters: Any = None, version: Any = None) -> Any:
        if getattr(spec, "name", spec) == RETRY_RECORDS.name and (columns is None or "body" in columns):
            bodies_read.append(filters)
        return real_read_rows(self, spec, columns, filters, version)

    monkeypatch.setattr(Lake, "read_rows", read_rows)
    for step in range(steps):
        rows, as_of = story.step(late=step in late_steps)
        for lake in lakes.values():
            _append(lake, rows)
        run(spark, RouteDlqConfig(lakes["chained"].root, as_of, engine=ENGINE))
        reference = WITH_SPARK if spark_reference(step, steps) else ON_THE_DRIVER
        run(spark, RouteDlqConfig(lakes["whole"].root, as_of, **reference))
        if DRIVER_LAKE:
            run(spark, RouteDlqConfig(lakes["driver"].root, as_of, **ON_THE_DRIVER))
        for spec in (RETRY_CHAINS, DLQ):
            expected = canonical_rows(lakes["whole"].read_rows(spec))
            for name, lake in lakes.items():
                assert canonical_rows(lake.read_rows(spec)) == expected, f"{spec.name} of {name} at step {step}"
        chains = lakes["whole"].read_rows(RETRY_CHAINS).to_pylist()
        dead = lakes["whole"].read_rows(DLQ).to_pylist()
        seen["state"] |= {r["state"] for r in chains}
        seen["reason"] |= {r["reason"] for r in dead}
        seen["redrive"] |= {r["redrive_state"] is not None for r in dead}

    # the bodies and properties of dead letters' records alone, by partition and commit log offset
    assert bodies_read, "no dead letter's body was read"
    for filters in bodies_read:
        assert filters and all({"kind", "broker_name", "commit_log_offset"} <= {c for c, *_ in f} for f in filters)
    messages = _messages(lakes["chained"])
    moved_on = [i for i, m in enumerate(messages) if m.endswith("moved on by what changed")]
    assert set(moved_on) == set(range(1, steps)) - {i + 1 for i in late_steps}
    assert seen["state"] >= {"SCHEDULED", "DELIVERED", "CONSUMED", "DEAD"}
    assert seen["reason"] >= {"MAX_RECONSUME_TIMES", "POLICY", "POLICY_NOT_WRITTEN"}
    assert seen["redrive"] == {True, False}
    history = DeltaTable(str(lakes["chained"].location(RETRY_RECORDS))).history()
    assert sum(h["operation"] == "OPTIMIZE" for h in history) >= 2


def test_the_offset_of_a_queue_is_its_latest_commit_by_time_then_reset_then_offset() -> None:
    # many commits of few queues in few milliseconds: ties of time, of time and source, of all three
    rng = random.Random(9)
    rows = [
        {
            "group": rng.choice(GROUPS),
            "broker_name": rng.choice(list(HOSTS)),
            "topic": "%RETRY%" + rng.choice(GROUPS),
            "queue_id": 0,
            "offset": rng.randrange(1_000),
            "commit_timestamp": rng.randrange(1_000, 1_006),
            "source": rng.choice(["client", "reset", "broker"]),
        }
        for _ in range(2_000)
    ]
    schema = pa.schema([CONSUMER_OFFSET_COMMITS.arrow_schema.field(name) for name in rows[0]])
    table = pa.Table.from_pylist(rows, schema=schema)
    for as_of in (999, 1_002, 1_005):
        expected: dict[tuple[str, str, str, int], tuple[int, bool, int, str]] = {}
        for row in rows:
            if row["commit_timestamp"] <= as_of:
                key = (row["group"], row["broker_name"], row["topic"], row["queue_id"])
                order = (row["commit_timestamp"], row["source"] == "reset", row["offset"], row["source"])
                expected[key] = max(expected.get(key, order), order)
        assert offsets_at(table, as_of) == {key: order[2] for key, order in expected.items()}
    assert len(offsets_at(table, 1_005)) == 8


def test_the_previous_chains_sifted_in_arrow_are_those_the_rule_touches_one_by_one() -> None:
    # chains whose first attempt spells their origin id, and every way of not doing so: another
    # offset or broker, a retry first, no attempt, lowercase or odd hex, a short id, an unknown host
    rng = random.Random(5)
    hosts = host_prefixes(HOSTS.items())
    prefix = {name: create_msg_id(parse_host(host), 0)[:-16] for name, host in HOSTS.items()}
    origins = [
        lambda b, o: prefix[b] + f"{o:016X}",
        lambda b, o: prefix[b] + f"{o:016x}",
        lambda b, o: prefix[b] + f"{o + 1:016X}",
        lambda b, o: prefix["broker-b" if b == "broker-a" else "broker-a"] + f"{o:016X}",
        lambda b, o: prefix[b] + f" {o:015X}",
        lambda b, o: prefix[b] + "-" + f"{o:015X}",
        lambda b, o: "0A000009" + "00002A9F" + f"{o:016X}",
        lambda b, o: f"{o:X}",
        lambda b, o: f"UNIQ{o}",
    ]
    field = RETRY_CHAINS.arrow_schema.field
    schema = pa.schema([field(name) for name in (*PREVIOUS_COLUMNS, "attempts")])
    rows = []
    for i in range(3_000):
        broker, offset = rng.choice(list(HOSTS)), rng.choice([0, 7, 1 << 40, rng.randrange(1 << 62)])
        attempt = {"broker_name": broker, "commit_log_offset": offset, "reconsume_times": rng.choice([0, 0, 0, 1])}
        rows.append(
            {
                "group": rng.choice(GROUPS),
                "origin_msg_id": rng.choice(origins)(broker, offset),
                "state": rng.choice(["CONSUMED", "CONSUMED", "DEAD", "SCHEDULED", "DELIVERED"]),
                "broker_name": rng.choice([*HOSTS, None]),
                "first_failure_timestamp": i,
                "attempts": rng.choice([[attempt], [attempt], []]),
            }
        )
    before = {("broker-a", "g-audit"): 2, ("broker-b", "g-stock"): 3}
    now = {("broker-a", "g-audit"): 5, ("broker-b", "g-stock"): 3}
    previous = Previous(pa.Table.from_pylist(rows, schema=schema), 0, 0, before)

    def original_found(row: dict[str, Any]) -> bool:
        positions = origin_positions(row["origin_msg_id"], hosts)
        first = row["attempts"][0] if row["attempts"] else None
        if not positions:
            return True
        return (
            first is not None
            and first["reconsume_times"] == 0
            and (first["broker_name"], first["commit_log_offset"]) in positions
        )

    expected = {
        (row["group"], row["origin_msg_id"])
        for row in rows
        if row["state"] in OPEN_STATES
        or (row["broker_name"], row["group"]) == ("broker-a", "g-audit")
        or not original_found(row)
    }
    touched = touched_chains(previous, [], now, [], hosts, as_of=0)
    assert touched == expected
    # every kind of chain was there: kept ones, and ones touched for each reason
    assert 0 < len(touched) < len({(row["group"], row["origin_msg_id"]) for row in rows})
    assert any(not original_found(row) and row["state"] not in OPEN_STATES for row in rows)


def test_a_table_is_not_moved_on_to_an_earlier_t_nor_past_records_it_left_for_a_later_one() -> None:
    previous = Previous(pa.table({}), as_of=2_000, through=2_000, policies={})
    check_foldable(previous, 2_000)
    with pytest.raises(CannotFold, match="before the previous run's"):
        check_foldable(previous, 1_999)
    with pytest.raises(CannotFold, match="stored after its as_of"):
        check_foldable(Previous(pa.table({}), 2_000, 2_001, {}), 2_500)


@pytest.mark.parametrize(
    ("tail", "offset"),
    [
        ("00000000000000FF", 255),
        ("00000000000001g1", 1),  # digits up to the first other character, as Spark's conv
        (" 00000000000001f", 31),
        ("-000000000000001", None),  # negative: above a long once unsigned
        ("-000000000000000", 0),
        ("8000000000000000", None),
        ("+000000000000001", 0),
    ],
)
def test_an_origin_id_names_the_offset_sparks_conv_reads(tail: str, offset: int | None) -> None:
    prefix = create_msg_id(parse_host(HOSTS["broker-a"]), 0)[:-16]
    hosts = {prefix: ["broker-a"]}
    assert origin_positions(prefix + tail, hosts) == ([("broker-a", offset)] if offset is not None else [])
    assert origin_positions(tail, hosts) == []


def test_origin_ids_column_wise_name_the_positions_they_name_one_by_one() -> None:
    hosts = {create_msg_id(parse_host(host), 0)[:-16]: [name] for name, host in HOSTS.items()}
    hosts[create_msg_id(parse_host("10.0.0.9:10911"), 0)[:-16]] = ["broker-x", "broker-y"]  # one host, two names
    prefixes, rng = sorted(hosts), random.Random(5)
    tails = [
        "00000000000001g1",
        " 00000000000001f",
        "-000000000000000",
        "8000000000000000",
        "00000000000\u00e9\u00e90001",
    ]
    ids = [
        rng.choice(
            [
                None,
                rng.choice(tails),
                rng.choice(prefixes) + rng.choice(tails),
                "0A0B0C0D" + f"{rng.randrange(1 << 63):016X}",  # no broker's prefix
                rng.choice(prefixes) + f"{rng.randrange(1 << 64):016x}",
            ]
        )
        for _ in range(4_000)
    ]
    table = origin_positions_of(pa.array(ids, pa.string()), hosts)
    columns = (table.column(name).to_pylist() for name in ("row", "broker_name", "commit_log_offset"))
    expected = [(i, *p) for i, origin in enumerate(ids) if origin is not None for p in origin_positions(origin, hosts)]
    assert list(zip(*columns, strict=True)) == expected
    # every kind of id was there: named by one broker, by two, and by none
    assert {broker for _, broker, _ in expected} == {*HOSTS, "broker-x", "broker-y"}
    assert len({i for i, *_ in expected}) < sum(origin is not None for origin in ids)


def _chained_against_spark(
    spark: SparkSession, tmp_path: Path, steps: list[tuple[dict[str, list[dict[str, Any]]], int]]
) -> tuple[Lake, list[list[str]]]:
    """The lake of incremental runs after each step's rows, checked equal to full Spark runs, and
    the chains' states after each step."""
    states = []
    chained, whole = Lake(spark, tmp_path / "chained", ENGINE), Lake(spark, tmp_path / "whole", ENGINE)
    for lake in (chained, whole):
        lake.append_rows(BROKERS, _brokers())
    for rows, as_of in steps:
        for lake in (chained, whole):
            _append(lake, rows)
        run(spark, RouteDlqConfig(chained.root, as_of, engine=ENGINE))
        run(spark, RouteDlqConfig(whole.root, as_of, **WITH_SPARK))
        for spec in (RETRY_CHAINS, DLQ):
            expected = canonical_rows(whole.read_rows(spec))
            assert canonical_rows(chained.read_rows(spec)) == expected, f"{spec.name} as of {as_of}"
        states.append(sorted(chained.read_rows(RETRY_CHAINS).column("state").to_pylist()))
    return chained, states


def test_a_reset_back_over_a_consumed_retry_delivers_its_chain_again(spark: SparkSession, tmp_path: Path) -> None:
    story = _Story(0)
    original = story._original(1_100)
    topic = c.RETRY_GROUP_TOPIC_PREFIX + "g-audit"
    properties = {c.PROPERTY_ORIGIN_MESSAGE_ID: original["msg_id"], c.PROPERTY_RETRY_TOPIC: "Orders"}
    scheduled = {**properties, c.PROPERTY_REAL_TOPIC: topic, c.PROPERTY_REAL_QUEUE_ID: "0"}
    first = [
        story._put("broker-a", c.SCHEDULE_TOPIC, 2, 1_200, properties=scheduled, reconsume_times=1),
        story._put("broker-a", topic, 0, 1_300, properties=properties, reconsume_times=1),
    ]
    commit = {"group": "g-audit", "broker_name": "broker-a", "topic": topic, "queue_id": 0, "source": "client"}
    other = {**commit, "broker_name": "broker-b", "offset": 5, "commit_timestamp": 2_100}
    steps = [
        ({COMMITLOG.name: [original, *first]}, 2_000),
        ({CONSUMER_OFFSET_COMMITS.name: [{**commit, "offset": 1, "commit_timestamp": 2_500}]}, 3_000),
        ({CONSUMER_OFFSET_COMMITS.name: [other]}, 3_500),  # another broker's queue: nothing changes
        (
            {CONSUMER_OFFSET_COMMITS.name: [{**commit, "offset": 0, "commit_timestamp": 3_600, "source": "reset"}]},
            4_000,
        ),
    ]
    chained, states = _chained_against_spark(spark, tmp_path, steps)
    assert states == [["DELIVERED"], ["CONSUMED"], ["CONSUMED"], ["DELIVERED"]]
    assert all(m.endswith("moved on by what changed") for m in _messages(chained)[1:])


ODD_VALUES = [
    "", " ", "  0A00000100002A9F0000000000000E10 ", "Orders", "\t x", "%RETRY%g-audit", "%DLQ%g", "%RETRY%",
    "%RETRY%g_Orders", " %RETRY%g_a_b",
]  # fmt: skip
ODD_TOPICS = [
    c.SCHEDULE_TOPIC, c.RETRY_GROUP_TOPIC_PREFIX + "g-audit", c.DLQ_GROUP_TOPIC_PREFIX + "g-stock", "Orders",
    c.RETRY_GROUP_TOPIC_PREFIX + c.DLQ_GROUP_TOPIC_PREFIX + "g", c.DLQ_GROUP_TOPIC_PREFIX, "%RETRY", "SCHEDULE",
    "%RETRY%g_Orders", "%RETRY%g+Orders", "%RETRY%g_", "%RETRY%g_a_b", "%RETRY%g-audit_Orders",
]  # fmt: skip
ODD_GROUPS = ["", " ", "g", "g-audit", "g_a", "%RETRY%g"]  # ORIGIN_GROUP of POP retries


@pytest.mark.parametrize("seed", [1, 2])
def test_the_driver_decodes_send_back_records_as_the_spark_transform_does(spark: SparkSession, seed: int) -> None:
    rng = random.Random(seed)
    names = [c.PROPERTY_REAL_TOPIC, c.PROPERTY_ORIGIN_MESSAGE_ID, c.PROPERTY_RETRY_TOPIC, PROPERTY_ROUTED_BY]
    records = []
    for i in range(300):
        properties = {name: rng.choice(ODD_VALUES) for name in names if rng.random() < 0.7}
        if rng.random() < 0.5:
            properties[c.PROPERTY_ORIGIN_GROUP] = rng.choice(ODD_GROUPS)
        if rng.random() < 0.5:
            properties[c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = rng.choice(["", "U1", " U2"])
        records.append(
            commitlog_record(
                broker_name=rng.choice(list(HOSTS)),
                topic=rng.choice(ODD_TOPICS),
                queue_id=rng.randrange(3),
                queue_offset=i,
                commit_log_offset=i * 400,
                body=rng.choice([b"", b"m", b"\xff"]),
                properties=properties,
                reconsume_times=rng.randrange(4),
                store_timestamp=1_000 + i,
            )
        )
    expected = build_retry_records(commitlog_frame(spark, records)).toArrow()
    decoded = decode_retry_records(commitlog_table(records))
    assert decoded.schema == RETRY_RECORDS.arrow_schema
    assert {r["kind"] for r in decoded.to_pylist()} == {"SCHEDULED", "RETRY", "DLQ"}
    retries = [r for r in decoded.to_pylist() if r["kind"] == "RETRY"]
    assert any(r["topic"] != c.RETRY_GROUP_TOPIC_PREFIX + r["group"] for r in retries)  # POP retries among them
    assert canonical_rows(decoded) == canonical_rows(expected.select(RETRY_RECORDS.column_names))


@pytest.mark.spark
def test_a_pop_retry_belongs_to_its_origin_group_and_retries_the_topic_its_name_holds(spark: SparkSession) -> None:
    """RocketMQ 5 POP consumers get messages back through ``%RETRY%<group>_<topic>`` (``+`` with
    enableRetryTopicV2), the revived copy naming its group in ``ORIGIN_GROUP``: names may hold
    ``_``, so only that property tells where the group ends. A 4.x retry keeps its ``RETRY_TOPIC``; a POP
    dead letter's ``RETRY_TOPIC`` is the POP retry topic, which names the topic."""
    origin = c.PROPERTY_ORIGIN_GROUP
    topics_and_properties = [
        ("%RETRY%cg_a_Orders_b", {origin: "cg_a"}),
        ("%RETRY%cg+Orders", {origin: "cg"}),
        ("%RETRY%cg_Orders", {}),  # no ORIGIN_GROUP: the name is the group, as a 4.x retry topic's
        ("%RETRY%cg", {origin: "cg", c.PROPERTY_RETRY_TOPIC: "Orders"}),
        ("%RETRY%cg_", {origin: "cg"}),  # nothing after the separator: no POP retry topic
        ("%DLQ%cg", {origin: "cg", c.PROPERTY_RETRY_TOPIC: "%RETRY%cg_Orders"}),  # a POP dead letter
    ]
    records = [
        commitlog_record(topic=topic, properties=properties, queue_offset=i, commit_log_offset=i * 400)
        for i, (topic, properties) in enumerate(topics_and_properties)
    ]
    expected = [
        ("cg_a", "Orders_b"), ("cg", "Orders"), ("cg_Orders", None), ("cg", "Orders"), ("cg_", None), ("cg", "Orders")
    ]  # fmt: skip

    spark_rows = build_retry_records(commitlog_frame(spark, records)).orderBy("commit_log_offset").collect()
    driver_rows = decode_retry_records(commitlog_table(records)).to_pylist()
    assert [(r["group"], r["origin_topic"]) for r in spark_rows] == expected
    assert [(r["group"], r["origin_topic"]) for r in driver_rows] == expected


def test_a_broker_restarted_on_another_host_makes_the_run_compute_every_chain(
    spark: SparkSession, tmp_path: Path
) -> None:
    story = _Story(0)
    original = story._original(1_100)
    properties = {c.PROPERTY_ORIGIN_MESSAGE_ID: original["msg_id"], c.PROPERTY_RETRY_TOPIC: "Orders"}
    retry = story._put(original["broker_name"], c.RETRY_GROUP_TOPIC_PREFIX + "g-audit", 0, 1_200, properties=properties)
    broker = original["broker_name"]
    [row] = [r for r in _brokers().to_pylist() if r["broker_name"] == broker]
    moved = {**row, "store_host": "10.0.0.9:10911", "started_timestamp": 2_500}
    consumed = {
        "group": "g-audit",
        "broker_name": broker,
        "topic": c.RETRY_GROUP_TOPIC_PREFIX + "g-audit",
        "queue_id": 0,
        "offset": 1,
        "commit_timestamp": 1_500,
        "source": "client",
    }
    steps = [
        ({COMMITLOG.name: [original, retry], CONSUMER_OFFSET_COMMITS.name: [consumed]}, 2_000),
        ({BROKERS.name: [moved]}, 3_000),  # the origin id no longer names the broker: no original
    ]
    chained, states = _chained_against_spark(spark, tmp_path, steps)
    assert states == [["CONSUMED"], ["CONSUMED"]]  # not open: only the host check makes it computed again
    assert _messages(chained)[-1] == "computed in full: a broker's store host changed"
    assert [len(a) for a in chained.read_rows(RETRY_CHAINS).column("attempts").to_pylist()] == [1]


@pytest.mark.parametrize("seed", seeds(5, 6, 7))
def test_the_driver_computes_every_chain_as_the_spark_transforms_do(spark: SparkSession, seed: int) -> None:
    # chains keyed by origin id, by uniq key alone and by msg id alone; two brokers sharing a store
    # host, so that an origin id names a record on each (two chain rows); originals found, missing
    # or not offset ids at all; every kind, limits per broker, retry queues consumed or not, records
    # after T, dead letters routed by a tool or by reconsume times, chains exhausted but delivered
    r = random.Random(seed)
    shared, alone = "10.0.0.7:10911", "10.0.0.8:10911"
    hosts = {"broker-a": shared, "broker-b": shared, "broker-c": alone}
    prefixes = {name: create_msg_id(parse_host(host), 0)[:-16] for name, host in hosts.items()}
    as_of, offsets = 5_000, iter(r.sample(range(1, 10_000_000), 5_000))  # distinct commit log offsets
    records: list[dict[str, Any]] = []
    originals: list[dict[str, Any]] = []
    for n in range(120):
        group = r.choice(GROUPS)
        named = r.choice(["broker-a", "broker-c", None])
        origin_offset = next(offsets)
        origin = None if named is None else f"{prefixes[named]}{origin_offset:016X}"
        for broker in ("broker-a", "broker-b") if named == "broker-a" else (named,) if named else ():
            if r.random() < 0.7:  # else the original is not in the log
                originals.append(
                    {
                        "broker_name": broker,
                        "commit_log_offset": origin_offset,
                        "topic": "T",
                        "store_timestamp": r.randint(1, 100),
                    }
                )
        uniq_key = r.choice([f"U{n:04d}", None])
        for _ in range(r.randint(1, 6)):
            kind = r.choices(["SCHEDULED", "RETRY", "DLQ"], [3, 4, 1])[0]
            broker = r.choice(list(hosts))
            records.append(
                {
                    "kind": kind,
                    "group": group,
                    "broker_name": broker,
                    "topic": {"SCHEDULED": "SCHEDULE_TOPIC_XXXX", "RETRY": f"%RETRY%{group}", "DLQ": f"%DLQ%{group}"}[
                        kind
                    ],
                    "queue_id": r.randint(0, 1),
                    "queue_offset": r.randint(0, 9),
                    "commit_log_offset": next(offsets),
                    "msg_id": f"M{len(records):05d}",
                    "uniq_key": uniq_key,
                    "keys": r.choice(["k1", "k2", None]),
                    "origin_msg_id": origin if origin is not None or r.random() < 0.5 else None,
                    "origin_topic": r.choice(["T", "T2", None]),
                    "reconsume_times": r.randint(0, 4),
                    "born_timestamp": 1,
                    "store_timestamp": r.randint(100, 6_000),
                    "routed_by": "tool" if kind == "DLQ" and r.random() < 0.3 else None,
                    "body": b"body %d" % len(records),
                    "properties": [("K", str(len(records)))] if kind != "SCHEDULED" else None,
                }
            )
    table = pa.Table.from_pylist(records, schema=RETRY_RECORDS.arrow_schema)
    limits = {(broker, group): r.choice([2, 3, None]) for broker in hosts for group in GROUPS}
    committed = {
        (group, broker, f"%RETRY%{group}", q): r.randint(0, 10) for group in GROUPS for broker in hosts for q in (0, 1)
    }
    schema = COMMITLOG.arrow_schema
    found = pa.Table.from_pylist(
        [{name: row[name] for name in CHAIN_ORIGINAL_COLUMNS} for row in originals],
        schema=pa.schema([schema.field(name) for name in CHAIN_ORIGINAL_COLUMNS]),
    )
    context = Context(
        as_of,
        {key: limit for key, limit in limits.items() if limit is not None},
        committed,
        host_prefixes(hosts.items()),
        found,
    )
    numbered = table.drop_columns(["body", "properties"]).append_column(
        "row", pa.array(range(table.num_rows), pa.int64())
    )
    chains, dead = compute(numbered, context)
    for letter in dead:
        letter["body"], letter["properties"] = (table.column(c)[letter["body"]].as_py() for c in ("body", "properties"))

    as_rows = [{**row, "properties": row["properties"] and dict(row["properties"])} for row in records]
    records_df = spark.createDataFrame(as_rows, spark_schema(RETRY_RECORDS))
    policies_df = spark.createDataFrame(
        [(b, g, limit) for (b, g), limit in limits.items() if limit is not None],
        "broker_name string, group string, retry_max_times int",
    )
    offsets_df = spark.createDataFrame(
        [(g, b, t, q, o) for (g, b, t, q), o in committed.items()],
        "group string, broker_name string, topic string, queue_id int, consumer_offset long",
    )
    keys_df = (
        with_chain_key(records_df.where(F.col("store_timestamp") <= as_of)).select("group", "origin_msg_id").distinct()
    )
    originals_df = spark.createDataFrame(
        [(o["broker_name"], o["commit_log_offset"], o["topic"], o["store_timestamp"]) for o in originals],
        "broker_name string, commit_log_offset long, topic string, store_timestamp long",
    )
    origins_df = build_origins(originals_df, keys_df, build_origin_hosts(list(hosts.items()), spark))
    chains_df = build_retry_chains(records_df, policies_df, offsets_df, origins_df, as_of)
    redrives_df = spark.createDataFrame([], spark_schema(DLQ_REDRIVES))
    dlq_df = build_dlq(records_df, chains_df, redrives_df, as_of)

    expected_chains = pa.Table.from_pylist(
        [row.asDict(recursive=True) for row in chains_df.collect()], RETRY_CHAINS.arrow_schema
    )
    expected_dead = pa.Table.from_pylist([row.asDict(recursive=True) for row in dlq_df.collect()], DLQ.arrow_schema)
    assert canonical_rows(chains) == canonical_rows(expected_chains)
    # a pending dead letter of a chain with two rows takes either row's attempts in Spark (the
    # window's rows tie); the driver takes the first's
    copies = Counter((row["group"], row["origin_msg_id"]) for row in chains.to_pylist())
    attempts_of = {}
    for row in chains.to_pylist():
        attempts_of.setdefault((row["group"], row["origin_msg_id"]), []).append(row["attempts"])

    def settled(rows: list[dict[str, Any]]) -> pa.Table:
        for row in rows:
            key = (row["group"], row["origin_msg_id"])
            if row["reason"] == "POLICY_NOT_WRITTEN" and copies[key] > 1:
                assert row["attempts"] in attempts_of[key]
                row["attempts"] = None
        return pa.Table.from_pylist(rows, DLQ.arrow_schema)

    assert canonical_rows(settled(dead)) == canonical_rows(settled(expected_dead.to_pylist()))
    # the cases the seeds must reach
    rows = chains.to_pylist()
    assert sum(bool(row["attempts"]) and row["attempts"][0]["reconsume_times"] == 0 for row in rows) > 5
    assert len(rows) > len({(row["group"], row["origin_msg_id"]) for row in rows}), "no chain with two originals"
    assert {row["state"] for row in rows} >= {"SCHEDULED", "DELIVERED", "CONSUMED", "DEAD"}
    assert {row["reason"] for row in dead} >= {"POLICY", "MAX_RECONSUME_TIMES", "POLICY_NOT_WRITTEN"}
