"""Every golden Delta table (written by delta-spark) read by the lake's readers, with delta-spark's
own reading as the oracle.

For each table directory of ``delta-golden/`` (beside the repository; ``RMQ_DELTA_GOLDEN`` overrides)
and each of its versions, delta-spark (Delta's reference reader, in the run's session) gives the
rows and schema; the bridge must return the same, or refuse the table with UnsupportedTableError
naming the feature; delta-rs must return the same or refuse the version. A version no engine can
read (its commit removed by log cleanup) must be refused clearly by every reader: such versions
are counted, and the count asserted, so none passes silently. The module runs with the delta-spark
engine (``RMQ_TEST_ENGINE=delta-spark``); the bridge's partition pruning is checked on both.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from broker_model.store.delta_commits import log_dir
from jobs.lake import Lake
from schemas.errors import LakeError, UnsupportedTableError
from tests.helpers import canonical_rows

pytestmark = pytest.mark.spark

GOLDEN = Path(os.environ.get("RMQ_DELTA_GOLDEN") or Path(__file__).resolve().parents[2] / "shared" / "delta-golden")

# The tables the bridge refuses, and the feature its message must name.
BRIDGE_REFUSES = {
    "table-with-columnmapping-mode-name": "column mapping",
    "dv-partitioned-with-checkpoint": "deletion vectors",
}
# The tables delta-rs 1.6 refuses, and what its error names.
DELTA_RS_REFUSES = {"dv-partitioned-with-checkpoint": "deletionVectors"}
# The tables delta-rs 1.6 reads wrongly: it returns the column-mapping table's 6 rows with every
# column null (it reads the files by logical names, which they do not hold). The lake never reads a
# table with column mapping through delta-rs (the bridge refuses it); this records the defect, and
# fails once delta-rs reads it right.
DELTA_RS_WRONG = {"table-with-columnmapping-mode-name"}
# Versions of a golden table that no reader can load any more (their commits were cleaned up before
# a checkpoint): (table, version) -> refused by delta-spark, the bridge and delta-rs alike.
UNREADABLE = frozenset[tuple[str, int]]()


def _table_names() -> list[str]:
    assert GOLDEN.is_dir(), f"no golden tables at {GOLDEN}; set RMQ_DELTA_GOLDEN to the delta-golden directory"
    return sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())


def _versions(path: Path) -> range:
    """Every version from 0 to the latest commit file of the table's Delta log."""
    newest = max(int(p.name[:20]) for p in log_dir(path).glob("*.json"))
    return range(newest + 1)


def _oracle(spark: SparkSession, path: Path, version: int) -> tuple[list[tuple[str, str]], list[object]] | None:
    """delta-spark's (schema, canonical rows) of ``version``, None when it cannot load it."""
    try:
        read_df = spark.read.format("delta").option("versionAsOf", version).load(str(path))
        rows = read_df.toArrow()
    except PySparkException:
        return None
    return [(f.name, f.dataType.simpleString()) for f in read_df.schema], canonical_rows(rows)


@pytest.mark.engine("delta-spark")
@pytest.mark.parametrize("name", _table_names())
def test_each_golden_table_version_reads_as_delta_spark_reads_it_or_is_refused(spark: SparkSession, name: str) -> None:
    path, bridge = GOLDEN / name, Lake(spark, GOLDEN.parent / "unused-lake", engine="bridge")
    unreadable = []
    for version in _versions(path):
        oracle = _oracle(spark, path, version)
        if oracle is None:  # no engine may return rows for it: each must refuse it
            unreadable.append(version)
            with pytest.raises(LakeError):
                bridge.read_path(path, version=version)
            with pytest.raises(DeltaError):
                DeltaTable(str(path), version=version)
            continue
        schema, rows = oracle
        if name in BRIDGE_REFUSES:
            with pytest.raises(UnsupportedTableError, match=BRIDGE_REFUSES[name]):
                bridge.read_path(path, version=version)
        else:
            read_df = bridge.read_path(path, version=version)
            assert [(f.name, f.dataType.simpleString()) for f in read_df.schema] == schema, version
            assert canonical_rows(read_df.toArrow()) == rows, version
        if name in DELTA_RS_REFUSES:
            with pytest.raises(DeltaError, match=DELTA_RS_REFUSES[name]):
                DeltaTable(str(path), version=version).to_pyarrow_table()
        else:
            expected = DeltaTable(str(path), version=version).to_pyarrow_table()
            assert [(f.name, f.dataType.simpleString()) for f in from_arrow_schema(expected.schema)] == schema, version
            if name in DELTA_RS_WRONG:
                assert expected.num_rows == len(rows) and all(c.null_count == len(c) for c in expected.columns)
                assert canonical_rows(expected) != rows
            else:
                assert canonical_rows(expected) == rows, version
    assert {(name, v) for v in unreadable} == {key for key in UNREADABLE if key[0] == name}


def test_a_partition_filter_on_a_golden_table_prunes_files(spark: SparkSession) -> None:
    path = GOLDEN / "time-travel-partition-changes-a"
    bridge = Lake(spark, GOLDEN.parent / "unused-lake", engine="bridge")

    read_df = bridge.read_path(path, partition_filter={"part5": [1, 3]})

    assert len(read_df.inputFiles()) == 4
    assert sorted(r.part5 for r in read_df.collect()) == [1, 1, 3, 3]
