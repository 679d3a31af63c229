"""Differential: a workload written by the product's own brokers, exported as RocketMQ stores with
their config files (``export-store``) and ingested into a second lake (``ingest-store``), gives every
job the same output tables as the first lake, at the same T.

The offset history is the one thing a store does not keep: ``consumerOffset.json`` holds each
queue's latest offset only, so the second lake has one commit per queue where the first has the
whole history. Every table computed as of a T after the export is the same; the report's lag
history (``commit_hours``) is not compared.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_model.store import ingest_store
from broker_model.store.store_export import export_store
from jobs.nightly import NightlyConfig, run
from jobs.rebuild_consume_queue import RebuildConfig
from jobs.rebuild_consume_queue import run as rebuild
from jobs.rebuild_consume_queue.verify import BROKER_PROBLEMS as VERIFY_PROBLEMS
from schemas.catalog import BROKERS
from tests.helpers import ENGINE, canonical_rows
from tests.rocketmq_store import StoreWriter, read_consume_queues, read_store

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COMPARED = (
    "consume_queue",
    "consume_queue_integrity",
    "consume_queue_tails",
    "consumer_offsets",
    "transaction_state",
    "transaction_records",
    "retry_records",
    "retry_chains",
    "dlq",
    "queue_hours",
)
LAKE_SPECIFIC = ("commitlog_version",)  # the other lake's own Delta versions


def _rows(lake: Path, name: str) -> list[object]:
    table = DeltaTable(str(lake / name)).to_pyarrow_table()
    kept = [c for c in table.column_names if c not in LAKE_SPECIFIC]
    return canonical_rows(table.select(kept))


def _brokers(lake: Path) -> list[str]:
    names = DeltaTable(str(BROKERS.location(lake))).to_pyarrow_table(columns=["broker_name"])["broker_name"]
    return sorted(set(pa.array(names).to_pylist()))


def test_every_job_gives_the_same_tables_on_the_stores_of_a_lake_ingested_into_another(
    spark: SparkSession, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    demo = NightlyConfig(first, demo_messages=1500, demo_transactions=30, seed=8, out=tmp_path / "r1", engine=ENGINE)
    assert run(spark, demo).status == "SUCCEEDED"

    brokers = _brokers(first)
    assert len(brokers) == 2
    units = {}
    for name in brokers:
        exported = export_store(first, name, tmp_path / f"store-{name}", cq_units_per_file=256)
        assert exported.records > 0 and exported.units > 0 and exported.offsets > 0
        report = ingest_store(second, name, exported.out_dir)
        assert (report.records, report.stop, report.lost) == (exported.records, "END", None)
        assert report.configs.offsets == exported.offsets
        units[name] = exported.units

    as_of = time.time_ns() // 1_000_000 + 1
    for lake, out in ((first, "r1"), (second, "r2")):
        config = NightlyConfig(lake, as_of=as_of, out=tmp_path / out, engine=ENGINE)
        assert run(spark, config).status == "SUCCEEDED"

    for name in COMPARED:
        assert _rows(second, name) == _rows(first, name), name
    for name in brokers:  # and against a reading of the stores that is not the product's
        _check_against_the_store(second, name, tmp_path / f"store-{name}")
    assert len(_rows(first, "dlq")) >= 5 and len(_rows(first, "transaction_state")) >= 30

    # the brokers' own consume queues (exported from their index) agree with the rebuilt ones
    verified = rebuild(spark, RebuildConfig(second, engine=ENGINE, verify_brokers=tuple(brokers)))
    for name in brokers:
        assert verified.row_counts[f"verified {name}"] == units[name]
        assert sum(verified.row_counts[f"{name} {p}"] for p in VERIFY_PROBLEMS) == 0


def _check_against_the_store(lake: Path, broker: str, store: Path) -> None:
    """The ingested broker's records and consume queue are the ones its store's files hold, read
    by the tests' own parser (:func:`tests.rocketmq_store.read_store`)."""
    log = DeltaTable(str(lake / "commitlog")).to_pyarrow_table(
        columns=["commit_log_offset", "store_size", "topic", "queue_id", "queue_offset", "sys_flag", "body"],
        filters=[("broker_name", "=", broker)],
    )
    ingested = sorted(
        (
            r["commit_log_offset"],
            r["store_size"],
            r["topic"],
            r["queue_id"],
            r["queue_offset"],
            r["sys_flag"],
            r["body"],
        )
        for r in log.to_pylist()
    )
    stored = [(r.offset, r.size, r.topic, r.queue_id, r.queue_offset, r.sys_flag, r.body) for r in read_store(store)]
    assert ingested == stored
    queue = DeltaTable(str(lake / "consume_queue")).to_pyarrow_table(
        columns=["topic", "queue_id", "queue_offset", "commit_log_offset", "store_size", "tags_code"],
        filters=[("broker_name", "=", broker)],
    )
    rebuilt: dict[tuple[str, int], dict[int, tuple[int, int, int]]] = {}
    for r in queue.to_pylist():
        rebuilt.setdefault((r["topic"], r["queue_id"]), {})[r["queue_offset"]] = (
            r["commit_log_offset"],
            r["store_size"],
            r["tags_code"],
        )
    assert rebuilt == read_consume_queues(store)


def test_an_ingested_broker_and_brokers_of_ours_side_by_side_in_one_lake(spark: SparkSession, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    demo = NightlyConfig(lake, demo_messages=800, demo_transactions=10, seed=4, out=tmp_path / "r", engine=ENGINE)
    assert run(spark, demo).status == "SUCCEEDED"
    ours = _brokers(lake)
    store = StoreWriter(tmp_path / "store", 64 * 1024, store_host="10.9.9.9:10911")
    store.append_many(300, topics=("Orders", "Ledger"))
    committed = {0: 30, 1: 25, 2: 20, 3: 10}
    entries = ",".join(f"{q}:{o}" for q, o in committed.items())
    store.config("consumerOffset.json", f'{{"offsetTable":{{"Ledger@cg-ledger":{{{entries}}}}}}}')
    assert ingest_store(lake, "broker-r", store.root).records == 300

    as_of = time.time_ns() // 1_000_000 + 1
    assert run(spark, NightlyConfig(lake, as_of=as_of, out=tmp_path / "r", engine=ENGINE)).status == "SUCCEEDED"
    verified = rebuild(spark, RebuildConfig(lake, engine=ENGINE, verify_brokers=("broker-r",)))
    assert verified.row_counts["verified broker-r"] == 300
    assert sum(verified.row_counts[f"broker-r {p}"] for p in VERIFY_PROBLEMS) == 0

    queue = DeltaTable(str(lake / "consume_queue")).to_pyarrow_table(columns=["broker_name"])["broker_name"]
    assert set(queue.to_pylist()) == {*ours, "broker-r"}
    lag = DeltaTable(str(lake / "consumer_offsets")).to_pyarrow_table().to_pylist()
    ledger = sorted((r["queue_id"], r["consumer_offset"], r["diff"]) for r in lag if r["group"] == "cg-ledger")
    ends = {q: store.queue_offsets[("Ledger", q)] for q in committed}
    assert ledger == [(q, o, ends[q] - o) for q, o in committed.items()]
