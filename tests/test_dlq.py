"""The DLQ shell helpers (``jobs.dlq``) on a real lake.

One lake per module: a seeded workload with failing consumer groups (retries and dead letters
through the real brokers), plus three dead letters sent back by hand through broker-a with a
binary, a JSON and a compressed JSON body, then one ``route_dlq`` run. Each test works on its own
copy. Expected rows come from the ``dlq`` table read with delta-rs and filtered in Python; sent
messages are counted in the broker's own consume queues (:class:`MessageStore`), never in our
ledger.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker_model.broker import Broker, BrokerConfig
from broker_model.client import Producer
from broker_model.common import Message
from broker_model.common import constants as c
from broker_model.store import MessageExt, MessageStore
from broker_model.tools import run_workload
from jobs import dlq
from jobs.cli import iso_utc
from jobs.dlq.job import RouteDlqConfig
from jobs.dlq.job import run as route_dlq
from jobs.dlq.transforms import CONSUMER_REQUESTED, MAX_RECONSUME_TIMES, build_dlq
from jobs.lake import Lake
from schemas.catalog import COMMITLOG, DLQ, DLQ_REDRIVES, RETRY_CHAINS, RETRY_RECORDS
from schemas.errors import LakeError, ValidationError
from tests.helpers import ENGINE

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
GROUP = "cg-audit-retry"  # retry_max_times 3 in the workload: dead letters come quickly
BINARY_BODY = bytes(range(256)) + b"\x00\xff"
JSON_BODY = b'{"order": 42, "items": ["a", "b"], "note": "caf\xc3\xa9"}'
BIG_JSON_BODY = json.dumps({"order": 43, "blob": "z" * 6000}).encode()  # over 4 KiB: the producer compresses it


@dataclass(frozen=True)
class BaseLake:
    """The module's lake and the dead letters added by hand (name -> dead letter msg_id)."""

    path: Path
    extras: dict[str, str]


@pytest.fixture(scope="module")
def base_lake(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> BaseLake:
    lake = tmp_path_factory.mktemp("dlq") / "lake"
    run_workload(lake, 2000, 5, retries=True)
    broker = Broker(BrokerConfig(lake, "broker-a", "127.0.0.1:10911", flush_mode="SYNC_FLUSH")).start()
    extras = {}
    try:
        producer = Producer([broker], "test-dlq")
        for name, body in (("binary", BINARY_BODY), ("json", JSON_BODY), ("big", BIG_JSON_BODY)):
            sent = producer.send(Message.create("Audit", body, tags="manual", keys=[f"manual-{name}"], flag=7))
            extras[name] = broker.consumer_send_back(GROUP, sent.commit_log_offset, delay_level=-1).msg_ids[0]
    finally:
        broker.shutdown()
    route_dlq(spark, RouteDlqConfig(lake, as_of=time.time_ns() // 1_000_000 + 1000, engine=ENGINE))
    return BaseLake(lake, extras)


@pytest.fixture
def lake(base_lake: BaseLake, tmp_path: Path) -> Path:
    copy = tmp_path / "lake"
    shutil.copytree(base_lake.path, copy)
    return copy


def _dlq_rows(lake: Path) -> list[dict[str, Any]]:
    return DeltaTable(str(DLQ.location(lake))).to_pyarrow_table().to_pylist()


def _redriven(lake: Path, broker_name: str, topic: str) -> list[MessageExt]:
    """Messages of ``topic`` on ``broker_name`` carrying DLQ_MSG_ID, from the broker's consume queues."""
    store = MessageStore(lake, broker_name).load()
    found = []
    for queue_topic, queue_id in store.queues():
        if queue_topic == topic:
            for offset in range(store.max_offset(topic, queue_id)):
                message = store.message_at(topic, queue_id, offset)
                if message is not None and dlq.PROPERTY_DLQ_MSG_ID in message.properties:
                    found.append(message)
    return found


def _ledger(lake: Path) -> list[dict[str, Any]]:
    path = DLQ_REDRIVES.location(lake)
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(str(path)) else []


def _version(lake: Path, spec: Any) -> int | None:
    path = str(spec.location(lake))
    return DeltaTable(path).version() if DeltaTable.is_deltatable(path) else None


# ---------------------------------------------------------------------------------------------
# load and summary
# ---------------------------------------------------------------------------------------------


def test_load_filters_match_the_table(spark: SparkSession, base_lake: BaseLake) -> None:
    lake, rows = base_lake.path, _dlq_rows(base_lake.path)
    json_row = next(r for r in rows if r["msg_id"] == base_lake.extras["json"])

    def ids(**filters: Any) -> set[str]:
        return {r["msg_id"] for r in dlq.load(spark, lake, **filters).select("msg_id").collect()}

    assert ids() == {r["msg_id"] for r in rows}
    assert ids(group=GROUP) == {r["msg_id"] for r in rows if r["group"] == GROUP}
    assert ids(topic="Inventory") == {r["msg_id"] for r in rows if r["origin_topic"] == "Inventory"} != set()
    assert ids(reason=CONSUMER_REQUESTED) == set(base_lake.extras.values())
    assert ids(group=GROUP, reason=MAX_RECONSUME_TIMES) == {
        r["msg_id"] for r in rows if r["group"] == GROUP and r["reason"] == MAX_RECONSUME_TIMES
    }
    assert ids(key="manual-json") == {json_row["msg_id"]}
    assert ids(key=json_row["uniq_key"]) == {json_row["msg_id"]}
    moment = json_row["dlq_timestamp"]
    iso = iso_utc(moment)
    assert ids(since=moment, until=moment + 1) == {r["msg_id"] for r in rows if r["dlq_timestamp"] == moment}
    assert ids(since=iso, until=moment + 1) == ids(since=moment, until=moment + 1)
    earlier = {r["msg_id"] for r in rows if r["dlq_timestamp"] is not None and r["dlq_timestamp"] < moment}
    assert ids(until=iso) == earlier


def test_summary_counts_by_group_topic_reason_and_age(spark: SparkSession, base_lake: BaseLake) -> None:
    rows = _dlq_rows(base_lake.path)
    as_of = min(r["dlq_timestamp"] for r in rows if r["msg_id"] in base_lake.extras.values()) - 1
    assert all(r["dlq_timestamp"] is not None for r in rows)
    alive = [r for r in rows if r["dlq_timestamp"] <= as_of]  # the hand-made ones died after as_of
    expected: dict[tuple[str, str, str], Counter[str]] = {}
    for r in alive:
        counts = expected.setdefault((r["group"], r["origin_topic"], r["reason"]), Counter())
        counts["dead_letters"] += 1
        age = as_of - r["dlq_timestamp"]
        counts.update(name for name, low, high in dlq.AGE_BUCKETS if low <= age and (high is None or age < high))

    result = dlq.summary(dlq.load(spark, base_lake.path), as_of=iso_utc(as_of)).collect()

    assert [(r["group"], r["origin_topic"], r["reason"]) for r in result] == sorted(expected)
    for r in result:
        counts = expected[(r["group"], r["origin_topic"], r["reason"])]
        assert r["dead_letters"] == counts["dead_letters"] > 0
        assert [r[name] for name, _, _ in dlq.AGE_BUCKETS] == [counts[name] for name, _, _ in dlq.AGE_BUCKETS]
        assert r["redriven"] == 0 and round(r["as_of"].timestamp() * 1000) == as_of
    assert sum(r["dead_letters"] for r in result) == len(alive) > 0
    everything = dlq.summary(dlq.load(spark, base_lake.path)).collect()
    assert sum(r["dead_letters"] for r in everything) == len(rows)


# ---------------------------------------------------------------------------------------------
# show
# ---------------------------------------------------------------------------------------------


def test_show_prints_json_pretty_and_the_retry_history(
    spark: SparkSession, base_lake: BaseLake, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = base_lake.extras["json"]
    dlq.show(spark, dead.lower(), base_lake.path)
    out = capsys.readouterr().out.splitlines()

    assert out[0] == f"dead letter {dead}"
    assert any(line.split() == ["group", GROUP] for line in out)
    assert any(line.split() == ["reason", CONSUMER_REQUESTED] for line in out)
    assert any(line.split() == ["flag", "7"] for line in out)
    assert "  KEYS=manual-json" in out and "  RETRY_TOPIC=Audit" in out
    start = out.index(f"body ({len(JSON_BODY)} bytes, JSON)")
    assert out[start + 1 : start + 3] == ["  {", '    "order": 42,']
    assert '    "note": "café"' in out
    history = out[out.index("retry history (2 records)") + 2 :]
    assert history[0].split()[2:5] == ["-", "broker-a", "Audit"]
    assert history[1].split()[3:5] == ["broker-a", f"%DLQ%{GROUP}"]
    assert history[1].split()[2].startswith("+") and history[1].split()[1].endswith("Z")


def test_show_dumps_binary_bodies_and_decompresses(
    spark: SparkSession, base_lake: BaseLake, capsys: pytest.CaptureFixture[str]
) -> None:
    dlq.show(spark, base_lake.extras["binary"], base_lake.path)
    out = capsys.readouterr().out.splitlines()
    assert f"body ({len(BINARY_BODY)} bytes, binary)" in out
    assert "  00000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  |................|" in out
    assert "  00000040  40 41 42 43 44 45 46 47 48 49 4a 4b 4c 4d 4e 4f  |@ABCDEFGHIJKLMNO|" in out
    assert out[out.index("retry history (2 records)") - 1] == f"  {256:08x}  {'00 ff':<47}  |..|"

    dlq.show(spark, base_lake.extras["big"], base_lake.path, max_body_bytes=100)
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("body ("))
    assert header.startswith(f"body ({len(BIG_JSON_BODY)} bytes, ") and ", JSON, " in header
    assert "compressed" in header and "more characters not shown" in header
    assert out[out.index(header) + 2] == '    "order": 43,'
    assert any(line.split()[0] == "sys_flag" and int(line.split()[1]) & c.COMPRESSED_FLAG for line in out)


# ---------------------------------------------------------------------------------------------
# redrive
# ---------------------------------------------------------------------------------------------


@pytest.mark.both_engines
def test_redrive_dry_run_plans_and_writes_nothing(
    spark: SparkSession, lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commitlog_version = _version(lake, COMMITLOG)
    selection = dlq.load(spark, lake, group=GROUP, reason=MAX_RECONSUME_TIMES).orderBy("msg_id").limit(4)

    plan = dlq.redrive(spark, selection, "dry-1", lake)

    assert [r["action"] for r in plan.collect()] == [dlq.SEND] * 4
    assert {r["target_topic"] for r in plan.collect()} == {"Audit"}
    assert "dry run: nothing written (pass execute=True to send)" in capsys.readouterr().out
    assert _version(lake, DLQ_REDRIVES) is None and _version(lake, COMMITLOG) == commitlog_version
    assert _redriven(lake, "broker-a", "Audit") == [] and _redriven(lake, "broker-b", "Audit") == []


@pytest.mark.both_engines
def test_redrive_executed_twice_sends_each_dead_letter_once(
    spark: SparkSession, lake: Path, base_lake: BaseLake
) -> None:
    workload = sorted(r["msg_id"] for r in _dlq_rows(lake) if r["group"] == GROUP and r["broker_name"] == "broker-b")
    chosen = [*workload[:2], base_lake.extras["big"], base_lake.extras["binary"]]
    selection = dlq.load(spark, lake).where(F.col("msg_id").isin(chosen))

    first = {r["msg_id"]: r for r in dlq.redrive(spark, selection, "fix-1", lake, execute=True).collect()}
    ledger_version = _version(lake, DLQ_REDRIVES)
    second = {r["msg_id"]: r for r in dlq.redrive(spark, chosen, "fix-1", lake, execute=True).collect()}

    assert {m: r["action"] for m, r in first.items()} == dict.fromkeys(chosen, dlq.SENT_NOW)
    assert {m: r["action"] for m, r in second.items()} == dict.fromkeys(chosen, dlq.SKIPPED)
    assert {m: r["new_msg_id"] for m, r in second.items()} == {m: r["new_msg_id"] for m, r in first.items()}
    assert _version(lake, DLQ_REDRIVES) == ledger_version  # the rerun wrote nothing
    sent = _redriven(lake, "broker-a", "Audit") + _redriven(lake, "broker-b", "Audit")
    assert Counter(m.properties[dlq.PROPERTY_DLQ_MSG_ID] for m in sent) == Counter(chosen)
    by_dead = {m.properties[dlq.PROPERTY_DLQ_MSG_ID]: m for m in sent}
    originals = {r["msg_id"]: r for r in _dlq_rows(lake)}
    for dead, message in by_dead.items():
        assert message.msg_id == first[dead]["new_msg_id"]
        assert message.broker_name == originals[dead]["broker_name"] == first[dead]["new_broker_name"]
        assert message.properties[dlq.PROPERTY_REDRIVE_REQUEST_ID] == "fix-1"
        assert message.reconsume_times == 0
        assert not dlq.STRIPPED_PROPERTIES & (message.properties.keys() - {c.PROPERTY_CLUSTER})
        assert message.properties[c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] == originals[dead]["uniq_key"]
    assert by_dead[base_lake.extras["big"]].body == BIG_JSON_BODY
    assert by_dead[base_lake.extras["binary"]].body == BINARY_BODY and by_dead[base_lake.extras["binary"]].flag == 7
    ledger = Counter((r["msg_id"], r["state"]) for r in _ledger(lake))
    assert ledger == Counter({(m, s): 1 for m in chosen for s in (dlq.PENDING, dlq.SENT)})
    # route_dlq's dlq table takes redrive_state from this ledger
    spark_lake = Lake(spark, lake)
    states = build_dlq(
        spark_lake.read(RETRY_RECORDS),
        spark_lake.read(RETRY_CHAINS),
        spark_lake.read(DLQ_REDRIVES),
        time.time_ns() // 1_000_000,
    ).where(F.col("msg_id").isin(chosen))
    assert {r["msg_id"]: r["redrive_state"] for r in states.collect()} == dict.fromkeys(chosen, "SENT fix-1")


_CRASH_SCRIPT = """
import os, signal, sys
from jobs import dlq
from jobs.cli import iso_utc
from jobs.lake import build_session

lake, request_id, *ids = sys.argv[1:]
spark = build_session("dlq-crash", master="local[1]", engine="bridge", extra_conf={"spark.ui.enabled": "false"})

def crash(sent):
    print("sent", sent.msg_id, sent.new_msg_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # after the first send, before the SENT rows

dlq.redrive(spark, ids, request_id, lake, execute=True, on_sent=crash)
"""


@pytest.mark.subprocess
def test_redrive_killed_between_send_and_record_finds_what_it_sent(spark: SparkSession, lake: Path) -> None:
    chosen = sorted(r["msg_id"] for r in _dlq_rows(lake) if r["group"] == GROUP and r["broker_name"] == "broker-a")[:2]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    crashed = subprocess.run(
        [sys.executable, "-c", _CRASH_SCRIPT, str(lake), "crash-1", *chosen],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    sent_line = next(line for line in crashed.stdout.splitlines() if line.startswith("sent "))
    _, first_dead, first_new = sent_line.split()
    assert {(r["msg_id"], r["state"]) for r in _ledger(lake)} == {(m, dlq.PENDING) for m in chosen}
    assert [m.properties[dlq.PROPERTY_DLQ_MSG_ID] for m in _redriven(lake, "broker-a", "Audit")] == [first_dead]

    rerun = {r["msg_id"]: r for r in dlq.redrive(spark, chosen, "crash-1", lake, execute=True).collect()}

    (second_dead,) = set(chosen) - {first_dead}
    assert rerun[first_dead]["action"] == dlq.RECOVERED and rerun[first_dead]["new_msg_id"] == first_new
    assert rerun[second_dead]["action"] == dlq.SENT_NOW
    sent = _redriven(lake, "broker-a", "Audit")
    assert Counter(m.properties[dlq.PROPERTY_DLQ_MSG_ID] for m in sent) == Counter(chosen)
    assert {m.properties[dlq.PROPERTY_DLQ_MSG_ID]: m.msg_id for m in sent}[first_dead] == first_new
    latest = {r["msg_id"]: r for r in sorted(_ledger(lake), key=lambda r: r["updated_timestamp"])}
    assert {m: (r["state"], r["new_msg_id"]) for m, r in latest.items()} == {
        first_dead: (dlq.SENT, first_new),
        second_dead: (dlq.SENT, rerun[second_dead]["new_msg_id"]),
    }


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def test_bad_input_names_the_field_and_writes_nothing(spark: SparkSession, lake: Path) -> None:
    versions = {spec.name: _version(lake, spec) for spec in (COMMITLOG, DLQ, DLQ_REDRIVES)}
    dead = sorted(r["msg_id"] for r in _dlq_rows(lake))[0]
    cases = [
        (
            lambda: dlq.redrive(spark, [dead, "7F00000100002A9F0000000000000001"], "r-1", lake, execute=True),
            "selection",
        ),
        (lambda: dlq.redrive(spark, ["not-an-id"], "r-1", lake, execute=True), "selection"),
        (lambda: dlq.redrive(spark, [], "r-1", lake, execute=True), "selection"),
        (lambda: dlq.redrive(spark, [dead], "bad request id", lake, execute=True), "request_id"),
        (lambda: dlq.load(spark, lake, since="yesterday"), "since"),
        (lambda: dlq.load(spark, lake, until="2026-11-22T00:00:00"), "until"),
        (lambda: dlq.load(spark, lake, since=2000, until=1000), "until"),
        (lambda: dlq.load(spark, lake, reason="TIRED"), "reason"),
        (lambda: dlq.summary(dlq.load(spark, lake), as_of="noon"), "as_of"),
        (lambda: dlq.show(spark, "xyz", lake), "msg_id"),
        (lambda: dlq.show(spark, "7F00000100002A9F0000000000000001", lake), "msg_id"),
    ]
    for call, field in cases:
        with pytest.raises(ValidationError) as raised:
            call()
        assert raised.value.field == field, (field, str(raised.value))
    assert {spec.name: _version(lake, spec) for spec in (COMMITLOG, DLQ, DLQ_REDRIVES)} == versions


def test_redrive_refuses_while_the_broker_runs(spark: SparkSession, lake: Path) -> None:
    dead = sorted(r["msg_id"] for r in _dlq_rows(lake) if r["broker_name"] == "broker-a")[0]
    commitlog_version = _version(lake, COMMITLOG)
    with Broker(BrokerConfig(lake, "broker-a", "127.0.0.1:10911")):
        with pytest.raises(LakeError, match="stop that broker"):
            dlq.redrive(spark, [dead], "r-2", lake, execute=True)
    assert _version(lake, DLQ_REDRIVES) is None and _version(lake, COMMITLOG) == commitlog_version


# ---------------------------------------------------------------------------------------------
# The shell: python -m jobs shell
# ---------------------------------------------------------------------------------------------

SHELL_SCRIPT = """
import json
rows = spark.sql("SELECT msg_id, `group` FROM rmq.dlq").collect()
by_path = spark.read.format("delta").load(str(lake_root / "dlq")).count()
summary = dlq.summary(dlq.load(spark, lake_root)).collect()
print("RESULT " + json.dumps({
    "sql": sorted(r["msg_id"] for r in rows),
    "by_path": by_path,
    "tables": sorted(t.name for t in spark.catalog.listTables("rmq")),
    "summarised": sum(r["dead_letters"] for r in summary),
}))
dlq.show(spark, sorted(r["msg_id"] for r in rows)[0], lake_root)
"""


@pytest.mark.engine("delta-spark")  # the shell always configures Delta: its run needs the Delta jars
@pytest.mark.subprocess
@pytest.mark.parametrize("shell_engine", ["bridge", "delta-spark"])
def test_the_shell_opens_on_the_lake_with_delta_sql_by_name_and_times_in_its_zone(
    lake: Path, tmp_path: Path, shell_engine: str
) -> None:
    script = tmp_path / "session.py"
    script.write_text(SHELL_SCRIPT, encoding="utf-8")
    command = [sys.executable, "-m", "jobs", "shell", "--lake", str(lake), "--master", "local[1]"]
    command += ["--engine", shell_engine, "--time-zone", "Asia/Shanghai", "--execute", str(script)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    rows = _dlq_rows(lake)
    assert result["sql"] == sorted(r["msg_id"] for r in rows) and result["by_path"] == len(rows)
    assert result["summarised"] == len(rows)
    assert {"commitlog", "dlq", "retry_chains"} <= set(result["tables"])
    assert f"engine {shell_engine}, time zone Asia/Shanghai" in done.stdout
    # the dead letter shown prints its times as ISO timestamps at +08:00, never epoch ms
    shown = done.stdout.split("RESULT ", 1)[1]
    assert "+08:00" in shown and "Z\n" not in shown
    first = min(r["dlq_timestamp"] for r in rows if r["dlq_timestamp"] is not None)
    assert str(first) not in shown


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("option", "value", "field"),
    [("--time-zone", "Mars/Olympus", "time zone"), ("--lake", "no-such-lake", "lake")],
)
def test_the_shell_refuses_bad_input_before_spark_starts(lake: Path, option: str, value: str, field: str) -> None:
    command = [sys.executable, "-m", "jobs", "shell", "--lake", str(lake), option, value]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert field in done.stderr and value in done.stderr and "SparkContext" not in done.stderr
