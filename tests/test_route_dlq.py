"""The route_dlq job on logs written by the real broker: record kinds, chain states, reasons,
routing with --execute exactly once, the command line, and a differential run against the
brokers' own dead letter queues on a seeded failure workload."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker_model.broker import Broker, BrokerConfig, ScheduleMessageService, SubscriptionGroupConfig
from broker_model.client import Producer
from broker_model.common import Message
from broker_model.common import constants as c
from broker_model.store import MessageExt
from broker_model.tools import RETRY_GROUPS, run_workload
from broker_model.tools.admin import delete_group
from jobs.dlq.job import RouteDlqConfig, build_config, run
from jobs.dlq.transforms import build_retry_records
from jobs.lake import Lake
from schemas.catalog import COMMITLOG, DLQ, JOB_RUNS, RETRY_CHAINS, RETRY_RECORDS, SUBSCRIPTION_GROUP
from schemas.errors import LakeError, ValidationError
from tests.helpers import CLOCK_START, ENGINE, ManualClock

AS_OF = CLOCK_START + 3_600_000
LEVEL_3_MS = 10_000  # the first retry waits delay level 3


@dataclass
class _Story:
    """Which message took which path; their uniq keys."""

    scheduled: str
    delivered: str
    consumed: str
    requested: str
    exhausted_naturally: str
    exhausted_by_policy: str


def _send(broker: Broker, producer: Producer, body: bytes) -> MessageExt:
    producer.send(Message.create("T", body, keys=[body.decode()]))
    return broker.pull("T", 0, broker.store.max_offset("T", 0) - 1).messages[0]


def _retry_of(broker: Broker, group: str, uniq_key: str) -> MessageExt:
    topic = c.RETRY_GROUP_TOPIC_PREFIX + group
    for offset in range(broker.store.max_offset(topic, 0) - 1, -1, -1):
        message = broker.store.message_at(topic, 0, offset, decompress=False)
        if message is not None and message.uniq_key == uniq_key:
            return message
    raise AssertionError(f"no retry of {uniq_key} in {topic}")


def _write_story(lake: Path) -> _Story:
    """Group ``g`` (limit 16) and group ``h`` (limit 1) fail on six messages of topic T."""
    clock = ManualClock()
    broker = Broker(BrokerConfig(lake, flush_mode="SYNC_FLUSH", clock=clock)).start()
    try:
        broker.ensure_topic("T", 1)
        broker.update_subscription_group(SubscriptionGroupConfig("h", retry_max_times=1))
        producer = Producer([broker], "pg", seed=3, clock=clock)
        m = [_send(broker, producer, f"m{i}".encode()) for i in range(6)]
        for i in (2, 1, 4, 5):  # m2 before m1 in the retry queue: committing past m2 leaves m1
            broker.consumer_send_back("g" if i < 4 else "h", m[i].commit_log_offset)
        broker.consumer_send_back("g", m[3].commit_log_offset, delay_level=-1)  # the consumer gives up at once
        clock.now += LEVEL_3_MS
        ScheduleMessageService(broker).deliver_due(clock.now)
        clock.now += 1000
        broker.consumer_send_back("g", m[0].commit_log_offset)  # waits in the schedule topic at T
        consumed = _retry_of(broker, "g", m[2].uniq_key or "")
        broker.commit_offset("g", consumed.topic, consumed.queue_id, consumed.queue_offset + 1)
        broker.offsets.persist()
        broker.consumer_send_back("h", _retry_of(broker, "h", m[4].uniq_key or "").commit_log_offset)  # 1 >= 1
        # m5's retry stays delivered and unconsumed with reconsume times 1: exhausted for h
    finally:
        broker.shutdown()
    keys = [message.uniq_key or "" for message in m]
    return _Story(keys[0], keys[1], keys[2], keys[3], keys[4], keys[5])


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, _Story]]:
    root = tmp_path_factory.mktemp("route-dlq")
    story = _write_story(root)
    yield root, story
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def story_lake(tmp_path: Path, template: tuple[Path, _Story]) -> tuple[Path, _Story]:
    shutil.copytree(template[0], tmp_path / "lake")
    return tmp_path / "lake", template[1]


def _by_key(rows: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(row["uniq_key"]): row for row in rows}


@pytest.mark.spark
def test_send_back_records_are_decoded_by_kind(spark: SparkSession, template: tuple[Path, _Story]) -> None:
    lake, story = Lake(spark, template[0], ENGINE), template[1]
    records = [r.asDict() for r in build_retry_records(lake.read(COMMITLOG)).collect()]

    kinds = sorted((r["uniq_key"] == story.scheduled, r["kind"], r["group"], r["reconsume_times"]) for r in records)
    assert [k for k in kinds if k[0]] == [(True, "SCHEDULED", "g", 1)]
    assert sorted(r["kind"] for r in records) == ["DLQ", "DLQ"] + ["RETRY"] * 4 + ["SCHEDULED"] * 5
    for record in records:
        assert record["origin_topic"] == "T"
        assert record["origin_msg_id"] is not None and len(record["origin_msg_id"]) == 32
        assert (record["body"] is None) == (record["kind"] == "SCHEDULED")
        assert record["routed_by"] is None


@pytest.mark.spark
def test_chains_states_reasons_and_the_policy_as_of_t(spark: SparkSession, story_lake: tuple[Path, _Story]) -> None:
    root, story = story_lake
    job_run = run(spark, RouteDlqConfig(root, AS_OF, engine=ENGINE))
    lake = Lake(spark, root, ENGINE)

    chains = _by_key([r.asDict() for r in lake.read(RETRY_CHAINS).collect()])
    assert {k: (v["group"], v["state"], v["exhausted"]) for k, v in chains.items()} == {
        story.scheduled: ("g", "SCHEDULED", False),
        story.delivered: ("g", "DELIVERED", False),
        story.consumed: ("g", "CONSUMED", False),
        story.requested: ("g", "DEAD", False),
        story.exhausted_naturally: ("h", "DEAD", False),
        story.exhausted_by_policy: ("h", "DELIVERED", True),
    }
    assert chains[story.exhausted_by_policy]["max_reconsume_times"] == 1
    assert chains[story.delivered]["max_reconsume_times"] == c.RETRY_MAX_TIMES
    natural = chains[story.exhausted_naturally]["attempts"]
    assert [(a["topic"], a["reconsume_times"]) for a in natural] == [("T", 0), ("%RETRY%h", 1)]
    assert natural[1]["store_timestamp"] - natural[0]["store_timestamp"] >= LEVEL_3_MS
    assert [a["reconsume_times"] for a in chains[story.scheduled]["attempts"]] == [0]  # not delivered yet

    dlq = _by_key([r.asDict() for r in lake.read(DLQ).collect()])
    assert {k: v["reason"] for k, v in dlq.items()} == {
        story.requested: "CONSUMER_REQUESTED",
        story.exhausted_naturally: "MAX_RECONSUME_TIMES",
        story.exhausted_by_policy: "POLICY_NOT_WRITTEN",
    }
    dead = dlq[story.exhausted_naturally]
    assert (dead["group"], dead["origin_topic"], dead["reconsume_times"], dead["body"]) == ("h", "T", 2, b"m4")
    assert dead["dlq_timestamp"] is not None and dead["first_failure_timestamp"] < dead["dlq_timestamp"]
    assert dlq[story.exhausted_by_policy]["dlq_timestamp"] is None
    assert job_run.row_counts["dlq"] == 3 and job_run.row_counts["retry_chains"] == 6


@pytest.mark.spark
@pytest.mark.parametrize("driver", [True, False], ids=["driver", "spark"])
def test_a_group_table_of_an_older_release_is_read_and_a_deleted_group_has_the_default_policy(
    spark: SparkSession, story_lake: tuple[Path, _Story], driver: bool
) -> None:
    root, story = story_lake
    limit = {} if driver else {"driver_records": 0}
    location = SUBSCRIPTION_GROUP.location(root)
    rows = DeltaTable(str(location)).to_pyarrow_table()
    old = [field.name for field in SUBSCRIPTION_GROUP.arrow_schema][
        : SUBSCRIPTION_GROUP.column_names.index("retry_policy")
    ]
    shutil.rmtree(location)
    write_deltalake(str(location), rows.select(old))  # as a release before the retry policy columns wrote it

    run(spark, RouteDlqConfig(root, AS_OF, engine=ENGINE, **limit))
    chains = _by_key([r.asDict() for r in Lake(spark, root, ENGINE).read(RETRY_CHAINS).collect()])
    assert chains[story.exhausted_by_policy]["max_reconsume_times"] == 1

    assert delete_group(root, "h", ["broker-a"]) == ["broker-a"]  # timed after h's setting, before AS_OF
    run(spark, RouteDlqConfig(root, AS_OF + 1, engine=ENGINE, **limit))
    chains = _by_key([r.asDict() for r in Lake(spark, root, ENGINE).read(RETRY_CHAINS).collect()])
    assert chains[story.exhausted_by_policy]["max_reconsume_times"] == c.RETRY_MAX_TIMES


@pytest.mark.spark
def test_a_run_recorded_on_a_group_table_of_an_older_release_is_moved_on_from(
    spark: SparkSession, story_lake: tuple[Path, _Story], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, story = story_lake
    location = SUBSCRIPTION_GROUP.location(root)
    rows = DeltaTable(str(location)).to_pyarrow_table()
    shutil.rmtree(location)
    write_deltalake(str(location), rows.select(SUBSCRIPTION_GROUP.column_names[:9]))
    with monkeypatch.context() as older:  # a run of a release that did not know the new columns
        older.setattr(Lake, "add_missing_columns", lambda self, spec: None)
        first = run(spark, RouteDlqConfig(root, AS_OF, engine=ENGINE))
    assert first.input_versions[SUBSCRIPTION_GROUP.name] == 0

    second = run(spark, RouteDlqConfig(root, AS_OF + 1, engine=ENGINE))  # the columns added, then moved on

    assert (second.status, second.message) == ("SUCCEEDED", "retry_chains and dlq moved on by what changed")
    assert second.input_versions[SUBSCRIPTION_GROUP.name] == 1
    chains = _by_key([r.asDict() for r in Lake(spark, root, ENGINE).read(RETRY_CHAINS).collect()])
    assert chains[story.exhausted_by_policy]["max_reconsume_times"] == 1


@pytest.mark.spark
def test_records_after_t_do_not_count(spark: SparkSession, story_lake: tuple[Path, _Story]) -> None:
    root, story = story_lake
    run(spark, RouteDlqConfig(root, CLOCK_START + LEVEL_3_MS - 1, engine=ENGINE))  # before the deliveries
    chains = _by_key([r.asDict() for r in Lake(spark, root, ENGINE).read(RETRY_CHAINS).collect()])
    assert story.scheduled not in chains
    assert {v["state"] for k, v in chains.items() if k != story.requested} == {"SCHEDULED"}
    assert chains[story.requested]["state"] == "DEAD"


@pytest.mark.spark
def test_execute_routes_an_exhausted_chain_once_and_reruns_change_nothing(
    spark: SparkSession, story_lake: tuple[Path, _Story], capsys: pytest.CaptureFixture[str]
) -> None:
    root, story = story_lake
    lake = Lake(spark, root, ENGINE)
    first = run(spark, RouteDlqConfig(root, AS_OF, execute=True, engine=ENGINE))
    out = capsys.readouterr().out

    assert first.row_counts["routed"] == 1
    assert "routed to %DLQ% by this run: 1" in out
    dlq = _by_key([r.asDict() for r in lake.read(DLQ).collect()])
    routed = dlq[story.exhausted_by_policy]
    assert (routed["reason"], routed["reconsume_times"]) == ("POLICY", 2)
    assert routed["properties"]["DLQ_ROUTED_BY"] == "route_dlq"
    chains = _by_key([r.asDict() for r in lake.read(RETRY_CHAINS).collect()])
    assert (chains[story.exhausted_by_policy]["state"], chains[story.exhausted_by_policy]["exhausted"]) == (
        "DEAD",
        False,
    )

    second = run(spark, RouteDlqConfig(root, AS_OF, execute=True, engine=ENGINE))
    third = run(spark, RouteDlqConfig(root, AS_OF, engine=ENGINE))

    assert second.row_counts["routed"] == 0
    dead_letters = lake.read(COMMITLOG).where(F.col("topic") == "%DLQ%h").count()
    assert dead_letters == 2  # the natural one and the routed one, written once
    assert third.status == "NOOP" and third.output_versions == second.output_versions
    statuses = [r["status"] for r in lake.read(JOB_RUNS).orderBy("started_timestamp", "run_id").collect()]
    assert statuses == ["SUCCEEDED", "NOOP", "NOOP"]  # nothing left to route: the inputs did not change


@pytest.mark.spark
def test_a_routing_broker_held_elsewhere_fails_clearly_and_writes_no_dead_letter(
    spark: SparkSession, story_lake: tuple[Path, _Story]
) -> None:
    root, _ = story_lake
    running = Broker(BrokerConfig(root, flush_mode="SYNC_FLUSH")).start()
    try:
        with pytest.raises(LakeError, match=r"cannot route through broker 'broker-a'.*stop it"):
            run(spark, RouteDlqConfig(root, AS_OF, execute=True, engine=ENGINE))
    finally:
        running.shutdown()
    lake = Lake(spark, root, ENGINE)
    assert lake.read(COMMITLOG).where(F.col("topic") == "%DLQ%h").count() == 1
    assert [r["status"] for r in lake.read(JOB_RUNS).collect()] == ["FAILED"]


def test_command_line_refuses_as_of_with_execute_and_bad_times() -> None:
    with pytest.raises(ValidationError, match="--as-of"):
        build_config(["--execute", "--as-of", "2026-01-01T00:00:00Z"])
    with pytest.raises(ValidationError, match="--as-of"):
        build_config(["--as-of", "2026-01-01T00:00:00"])  # no zone
    config = build_config(["--as-of", "2026-01-01T00:00:00Z", "--lake", "x"])
    assert (config.as_of, config.execute, config.lake) == (1_767_225_600_000, False, Path("x"))
    assert build_config(["--lake", "x", "--driver-records", "0"]).driver_records == 0
    with pytest.raises(ValidationError, match="driver_records"):
        build_config(["--lake", "x", "--driver-records", "-1"])


@pytest.mark.spark
@pytest.mark.slow
def test_dlq_equals_the_brokers_dead_letter_queues_on_a_seeded_failure_workload(
    spark: SparkSession, tmp_path: Path
) -> None:
    report = run_workload(tmp_path, 5000, seed=11, retries=True)
    job_run = run(spark, RouteDlqConfig(tmp_path, time.time_ns() // 1_000_000, engine=ENGINE))  # all stored by now
    lake = Lake(spark, tmp_path, ENGINE)

    # online: the dead letter queues as the brokers hold them
    online: set[tuple[str, str, str]] = set()
    for name in ("broker-a", "broker-b"):
        broker = Broker(BrokerConfig(tmp_path, broker_name=name, store_host=_host(lake, name))).start()
        try:
            for plan in RETRY_GROUPS:
                topic = c.DLQ_GROUP_TOPIC_PREFIX + plan.group
                for offset in range(broker.store.min_offset(topic, 0), broker.store.max_offset(topic, 0)):
                    message = broker.store.message_at(topic, 0, offset, decompress=False)
                    assert message is not None
                    online.add((plan.group, name, message.msg_id))
        finally:
            broker.shutdown()
    batch = {(r["group"], r["broker_name"], r["msg_id"]) for r in lake.read(DLQ).collect()}
    assert batch == online
    assert len(online) == sum(n for k, n in report.retries.items() if k.endswith(".dlq")) > 20
    assert job_run.row_counts["dlq"] == len(online)

    limits = {p.group: p.retry_max_times or c.RETRY_MAX_TIMES for p in RETRY_GROUPS}
    for row in lake.read(DLQ).collect():
        attempts = [a["reconsume_times"] for a in row["attempts"]]
        assert attempts == list(range(limits[row["group"]] + 1)), row["msg_id"]  # the original, then every retry
        assert row["reason"] == "MAX_RECONSUME_TIMES" and row["reconsume_times"] == limits[row["group"]] + 1
        times = [a["store_timestamp"] for a in row["attempts"]]
        assert times == sorted(times) and times[-1] < row["dlq_timestamp"]
    chains = lake.read(RETRY_CHAINS)
    assert chains.where("state IN ('SCHEDULED', 'DELIVERED') OR exhausted").count() == 0  # the workload drains
    gaps = chains.where(
        F.size("attempts") != F.col("last_reconsume_times") + F.when(F.col("state") == "DEAD", 0).otherwise(1)
    ).count()
    assert gaps == 0
    assert lake.read(RETRY_RECORDS).where("kind = 'DLQ'").count() == len(online)


def _host(lake: Lake, broker_name: str) -> str:
    rows = lake.read("brokers").where(F.col("broker_name") == broker_name).orderBy(F.col("started_timestamp").desc())
    return str(rows.first()["store_host"])  # type: ignore[index]
