"""Every golden Delta table (written by delta-spark) through the bridge, checked against delta-rs.

For each table directory of ``delta-golden/`` (beside the repository; ``RMQ_DELTA_GOLDEN`` overrides)
and each version delta-rs can load, the bridge returns the schema (names and types, nullability
aside) and the rows delta-rs returns, or refuses the table with UnsupportedTableError. Which
tables are refused is asserted, so a refusal can neither appear nor vanish unnoticed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from jobs.lake import Lake
from schemas.errors import UnsupportedTableError
from tests.helpers import canonical_rows

pytestmark = pytest.mark.spark

GOLDEN = Path(os.environ.get("RMQ_DELTA_GOLDEN") or Path(__file__).resolve().parents[2] / "shared" / "delta-golden")

# The tables the bridge refuses, and the feature its message must name.
REFUSED = {
    # delta-rs reads this one (6 rows, logical names); the bridge would read physical names
    "table-with-columnmapping-mode-name": "column mapping",
    # delta-rs 1.6 refuses it too: DeltaProtocolError, reader feature deletionVectors unsupported
    "dv-partitioned-with-checkpoint": "deletion vectors",
}


def _table_names() -> list[object]:
    if not GOLDEN.is_dir():
        reason = f"no golden tables at {GOLDEN}; set RMQ_DELTA_GOLDEN to the delta-golden directory"
        return [pytest.param("absent", marks=pytest.mark.skip(reason=reason))]
    return sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())


def _loadable_versions(path: Path) -> list[int]:
    """Every version from 0 to the latest that delta-rs can load (old logs may be cleaned up)."""
    versions = []
    for version in range(DeltaTable(str(path)).version() + 1):
        try:
            DeltaTable(str(path), version=version)
        except DeltaError:
            continue
        versions.append(version)
    return versions


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Lake:
    return Lake(spark, tmp_path_factory.mktemp("lake"), engine="bridge")


@pytest.mark.parametrize("name", _table_names())
def test_the_bridge_reads_each_golden_table_as_delta_rs_does_or_refuses_it(lake: Lake, name: str) -> None:
    path = GOLDEN / name
    if name in REFUSED:
        with pytest.raises(UnsupportedTableError, match=REFUSED[name]):
            lake.read_path(path)
        return
    for version in _loadable_versions(path):
        expected = DeltaTable(str(path), version=version).to_pyarrow_table()
        actual_df = lake.read_path(path, version=version)

        expected_types = [(f.name, f.dataType.simpleString()) for f in from_arrow_schema(expected.schema)]
        assert [(f.name, f.dataType.simpleString()) for f in actual_df.schema] == expected_types, version
        assert canonical_rows(actual_df.toArrow()) == canonical_rows(expected), version


def test_delta_rs_reads_the_column_mapping_table_the_bridge_refuses() -> None:
    path = GOLDEN / "table-with-columnmapping-mode-name"
    if not path.is_dir():
        pytest.skip(f"no golden table at {path}")

    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == 6


def test_delta_rs_refuses_the_deletion_vector_table_as_well() -> None:
    path = GOLDEN / "dv-partitioned-with-checkpoint"
    if not path.is_dir():
        pytest.skip(f"no golden table at {path}")

    with pytest.raises(DeltaError, match="deletionVectors"):
        DeltaTable(str(path)).to_pyarrow_table()


def test_a_partition_filter_on_a_golden_table_prunes_files(lake: Lake) -> None:
    path = GOLDEN / "time-travel-partition-changes-a"
    if not path.is_dir():
        pytest.skip(f"no golden table at {path}")

    read_df = lake.read_path(path, partition_filter={"part5": [1, 3]})

    assert len(read_df.inputFiles()) == 4
    assert sorted(r.part5 for r in read_df.collect()) == [1, 1, 3, 3]
