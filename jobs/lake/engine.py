"""The contract of a lake engine: how :class:`~jobs.lake.facade.Lake` reads, creates and writes a
Delta table through Spark. Two engines keep it: the bridge (:mod:`jobs.lake.bridge`) and
delta-spark (:mod:`jobs.lake.delta_spark`); see docs/lake.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from deltalake.transaction import Transaction
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from schemas.catalog import TableSpec

WriteMode = Literal["append", "overwrite", "partitions"]
"""``append`` adds rows; ``overwrite`` replaces every row; ``partitions`` replaces the rows of the
partitions a write names."""

PartitionFilter = Mapping[str, Sequence[Any]]
"""``{partition column: [values]}``: the files whose partition values are in every list (None in a
list matches null)."""

PartitionValues = Mapping[str, Any]
"""``{partition column: value}``: one partition, or every partition with those values when it names
a subset of the partition columns."""

PartitionTargets = list[dict[str, str | None]]
"""Partitions to replace, as Delta partition value strings (None for null)."""


@dataclass(frozen=True)
class TableWrite:
    """One write of a catalog table: its rows conformed to ``spec``, how they replace what is there
    (``mode``, and ``targets`` for ``partitions``), and the application transaction it records."""

    spec: TableSpec
    df: DataFrame
    mode: WriteMode
    targets: PartitionTargets | None = None
    txn: Transaction | None = None


class LakeEngine(Protocol):
    """What :class:`~jobs.lake.facade.Lake` asks of an engine, for a table at a path."""

    def read(self, path: str, version: int | None, partition_filter: PartitionFilter | None) -> DataFrame:
        """The table at ``version`` (None: the latest), only the files ``partition_filter`` keeps."""
        ...

    def exists(self, path: str) -> bool:
        """Whether a Delta table is at ``path``."""
        ...

    def version(self, path: str) -> int:
        """The table's latest version."""
        ...

    def schema(self, path: str) -> StructType:
        """The table's schema as its Delta log declares it."""
        ...

    def create(self, path: str, spec: TableSpec) -> None:
        """Create ``spec``'s empty table at ``path`` (nothing when another creator won)."""
        ...

    def write(self, path: str, write: TableWrite) -> int | None:
        """Commit ``write`` to the table at ``path`` in one commit; the version committed, None when
        its application transaction was already committed and nothing was written."""
        ...
