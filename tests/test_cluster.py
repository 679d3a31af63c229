"""The nightly on a Spark standalone cluster with the delta-spark engine: a master and a worker,
started from pyspark's own ``spark-class`` on loopback, and ``./spark-submit.sh --master
spark://...``, which ships the project's code (``--py-files``) and the Delta jars (``--jars``, the
ones Ivy resolved for an earlier session; else ``--packages``) to the worker's executor. Its
tables equal those of the same nightly run by the test's own local session on a copy of the same
lake."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from broker_model.tools import run_workload
from jobs.lake import Lake
from jobs.nightly import NightlyConfig
from jobs.nightly import run as nightly
from schemas.catalog import JOB_RUNS, TABLES
from tests.helpers import ENGINE, canonical_rows, job_statuses, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.subprocess, pytest.mark.engine("delta-spark")]
ROOT = Path(__file__).resolve().parent.parent
SPARK_CLASS = Path(sys.executable).parent / "spark-class"
# what differs between two runs of the same job by design: the runs' ids, clocks and messages
PER_RUN_COLUMNS = {"run_id", "started_timestamp", "finished_timestamp", "duration_ms", "message"}


class Cluster:
    """A standalone master and one worker (1 core, 1 GiB), every port chosen by the JVMs (0) and
    read back from their logs, every address loopback."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {
            **os.environ,
            "SPARK_HOME": str(Path(pyspark.__file__).parent),  # pip's pyspark is a whole Spark home
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(home / "logs"),
            "SPARK_WORKER_DIR": str(home / "work"),
        }
        self.processes: list[subprocess.Popen[bytes]] = []
        self.url = ""

    def _start(self, name: str, *args: str) -> Path:
        log = self.home / f"{name}.log"
        with log.open("wb") as out:
            self.processes.append(
                subprocess.Popen([str(SPARK_CLASS), *args], stdout=out, stderr=subprocess.STDOUT, env=self.env)
            )
        return log

    def start(self) -> Cluster:
        master = self._start(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"
        )
        found: list[str] = []

        def master_up() -> bool:
            self._check_alive()
            found[:] = re.findall(r"Starting Spark master at (spark://\S+)", master.read_text(errors="replace"))
            return bool(found)

        wait_until(master_up, "the standalone master's start")
        self.url = found[0]
        worker = self.home / "work"
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--webui-port", "0", "--cores", "1", "--memory", "1g"),
            *("--work-dir", str(worker), self.url),
        )

        def registered() -> bool:
            self._check_alive()
            return "Registering worker" in master.read_text(errors="replace")

        wait_until(registered, "the worker's registration with the master")
        return self

    def _check_alive(self) -> None:
        for process in self.processes:
            assert process.poll() is None, f"{process.args[1]} exited with {process.returncode}"

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            process.wait(timeout=60)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    (tmp_path / "cluster").mkdir()
    running = Cluster(tmp_path / "cluster")
    try:
        yield running.start()
    finally:
        running.stop()


def _rows(lake: Lake, name: str) -> list[object]:
    """The table's rows, read on the driver (a Spark read per table cost seconds each here)."""
    table = lake.read_rows(name)
    return canonical_rows(table.drop_columns([c for c in table.column_names if c in PER_RUN_COLUMNS]))


def test_the_nightly_on_a_standalone_cluster_with_delta_spark_writes_what_a_local_run_writes(
    spark: SparkSession, cluster: Cluster, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    run_workload(source, 1000, 5, consumers=True, transactions=10, retries=True)
    on_cluster, local = tmp_path / "on-cluster", tmp_path / "local"
    shutil.copytree(source, on_cluster)
    shutil.copytree(source, local)

    command = ["./spark-submit.sh", "--master", cluster.url, "--conf", "spark.executor.memory=768m"]
    command += ["nightly", "--lake", str(on_cluster), "--out", str(tmp_path / "report-cluster")]
    command += ["--engine", "delta-spark"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    assert nightly(spark, NightlyConfig(local, out=tmp_path / "report-local", engine=ENGINE)).status == "SUCCEEDED"

    # the work ran on the worker's executor, which fetched the project's code and the Delta jar
    apps = list((cluster.home / "work").glob("app-*/*"))
    assert apps, "no executor ran on the worker"
    shipped = {path.name for path in apps[0].iterdir()}
    assert "rmq-lake.zip" in shipped and any(re.match(r"io\.delta_delta-spark_.*\.jar", n) for n in shipped), shipped

    cluster_lake, local_lake = Lake(spark, on_cluster, ENGINE), Lake(spark, local, ENGINE)
    statuses = {row["status"] for row in cluster_lake.read(JOB_RUNS.name).select("status").collect()}
    assert "SUCCEEDED" in statuses and "FAILED" not in statuses, statuses
    compared = 0
    for name in TABLES:
        if name == JOB_RUNS.name:  # the runs differ in their report folders and figures: which ran, and how
            assert job_statuses(cluster_lake) == job_statuses(local_lake)
            continue
        if not (local_lake.location(name) / "_delta_log").exists():
            assert not (cluster_lake.location(name) / "_delta_log").exists(), name
            continue
        assert _rows(cluster_lake, name) == _rows(local_lake, name), name
        compared += 1
    assert compared >= 12
