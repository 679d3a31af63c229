"""``resolve_transactions`` agrees with the broker's check service on a seeded workload of 2,000
transactions with random outcomes and check rounds at random times."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from broker_model.broker import Broker, BrokerConfig, TransactionCheckService
from broker_model.common import constants as c
from broker_model.tools import run_workload
from jobs.resolve_transactions import ResolveTransactionsConfig, run
from tests.helpers import ENGINE

pytestmark = [pytest.mark.spark, pytest.mark.slow]
BROKERS = ("broker-a", "broker-b")


def _job_states(spark: SparkSession, lake: Path, as_of: int) -> dict[tuple[str, str], dict[str, Any]]:
    run(spark, ResolveTransactionsConfig(lake, as_of, engine=ENGINE))
    rows = DeltaTable(str(lake / "transaction_state")).to_pyarrow_table().to_pylist()
    return {(r["broker_name"], r["uniq_key"]): r for r in rows if r["uniq_key"] is not None}


def _broker_views(lake: Path, as_of: int) -> dict[tuple[str, str], Any]:
    views = {}
    for name in BROKERS:
        with Broker(BrokerConfig(lake, name)).start() as broker:
            for uniq_key, view in TransactionCheckService(broker).view(as_of).items():
                views[(name, uniq_key)] = view
    return views


def test_job_states_equal_the_check_services_view(spark: SparkSession, tmp_path: Path) -> None:
    report = run_workload(tmp_path, 500, seed=44, brokers=2, threads=2, transactions=700, consumers=False)
    assert sum(report.transactions.values()) == 700
    log = DeltaTable(str(tmp_path / "commitlog")).to_pyarrow_table().to_pylist()
    born = sorted(r["born_timestamp"] for r in log if r["topic"] == c.RMQ_SYS_TRANS_HALF_TOPIC)
    for as_of in (born[len(born) // 2] + 3_000, report.last_check):  # mid-way (PENDING ones) and at the end
        views = _broker_views(tmp_path, as_of)
        states = _job_states(spark, tmp_path, as_of)
        assert set(states) == set(views)
        for key, view in views.items():
            row = states[key]
            assert (row["state"], row["check_times"], row["half_queue_offset"]) == (
                view.state,
                view.check_times,
                view.half_queue_offset,
            ), key
            assert row["op_queue_offset"] == view.op_queue_offset, key
            assert row["final_commit_log_offset"] == view.final_commit_log_offset, key
        counts = Counter(v.state for v in views.values())
        assert counts["COMMITTED"] and counts["ROLLED_BACK"], counts
    assert {"DISCARDED", "COMMITTED", "ROLLED_BACK"} <= set(Counter(v.state for v in views.values()))

    finals = Counter(r["uniq_key"] for r in log if r["sys_flag"] & 12 == c.TRANSACTION_COMMIT_TYPE)
    committed = {k[1] for k, v in views.items() if v.state == "COMMITTED"}
    assert set(finals) == committed
    assert set(finals.values()) == {1}, "every committed transaction has exactly one final message"
