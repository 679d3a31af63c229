"""``rebuild_consume_queue --verify-broker NAME``: a RocketMQ broker's own consume queues (the
``consumequeue/{topic}/{queueId}/`` files of its store) compared unit by unit with the consume queue
rebuilt from the commit log the lake ingested from that store. See docs/jobs.md (verify-broker).

A store unit is 20 bytes (``ConsumeQueue.CQ_STORE_UNIT_SIZE``): commit log offset (long), size
(int), tags code (long). The files of a queue are named by their first byte (queue offset x 20).
As ``ConsumeQueue.recover`` does, a file's units end at the first one that is not (offset >= 0,
size > 0): the zero tail of a pre-allocated file. Units of size ``Integer.MAX_VALUE`` are the blanks
``fillPreBlank`` writes before a queue's first unit; they hold no message.

Each difference is a finding of ``consume_queue_integrity``:

- ``BROKER_CQ_MISSING``: the rebuilt queue has a unit the broker's lacks, for a record the broker has
  dispatched past (before the greatest record its queues point at) and a queue offset its files
  still cover;
- ``BROKER_CQ_EXTRA``: the broker's queue has a unit the rebuilt one lacks, pointing into the
  ingested range of the log;
- ``BROKER_CQ_OFFSET``, ``BROKER_CQ_SIZE``, ``BROKER_CQ_TAGS``: the same queue offset points at
  another record, with another size, or another tags code;
- ``BROKER_CQ_BEYOND_LOG``: a unit points past the end of the store's commit log files.

Units that cannot be checked are counted, not reported: the broker's units of records not
ingested yet, or of a range lost before it was ingested, and rebuilt units the broker has not
dispatched yet or whose queue files its retention deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import constants as c
from broker_model.store import ingested_end
from broker_model.store.segment_files import SEGMENT_FILE_NAME
from jobs.lake import Lake
from schemas.catalog import CONSUME_QUEUE, CONSUME_QUEUE_INTEGRITY, STORE_INGESTS
from schemas.errors import ValidationError

CQ_UNIT: Final = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags", ">i8")])
PRE_BLANK_SIZE: Final = c.JAVA_INT_MAX  # Integer.MAX_VALUE: the size of a row fillPreBlank wrote
BROKER_PROBLEMS: Final = (
    "BROKER_CQ_MISSING",
    "BROKER_CQ_EXTRA",
    "BROKER_CQ_OFFSET",
    "BROKER_CQ_SIZE",
    "BROKER_CQ_TAGS",
    "BROKER_CQ_BEYOND_LOG",
)
_UNIT_COLUMNS: Final = ("topic", "queue_id", "queue_offset", "commit_log_offset", "store_size", "tags_code")


def read_store_queues(consumequeue_dir: Path) -> pa.Table:
    """Every unit of a store's consume queues (the blanks of ``fillPreBlank`` left out), as
    ``topic, queue_id, queue_offset, commit_log_offset, store_size, tags_code``.

    Raises:
        ValidationError: an entry that is not a queue directory or a file named by its 20-digit
            first byte, or a file whose size is not a whole number of units.
    """
    parts = [CONSUME_QUEUE.arrow_schema.empty_table().select(list(_UNIT_COLUMNS))]
    if not consumequeue_dir.is_dir():
        return parts[0]
    for topic_dir in sorted(consumequeue_dir.iterdir()):
        for queue_dir in sorted(topic_dir.iterdir()) if topic_dir.is_dir() else [topic_dir]:
            if not queue_dir.is_dir() or not queue_dir.name.isdigit():
                raise ValidationError(
                    "consume queue", str(queue_dir), "is not a queue directory", "give a store's consumequeue/ as is"
                )
            for path in sorted(queue_dir.iterdir()):
                parts.append(_read_file(path, topic_dir.name, int(queue_dir.name)))
    return pa.concat_tables(parts)


def _read_file(path: Path, topic: str, queue_id: int) -> pa.Table:
    if not SEGMENT_FILE_NAME.match(path.name) or not path.is_file():
        raise ValidationError(
            "consume queue file", str(path), "is not a file named by its 20-digit first byte", "move it out"
        )
    data = path.read_bytes()
    if len(data) % CQ_UNIT.itemsize or int(path.name) % CQ_UNIT.itemsize:
        problem = f"{len(data)} bytes at {path.name} is not whole 20-byte units"
        raise ValidationError("consume queue file", str(path), problem, "restore it from the store")
    units = np.frombuffer(data, dtype=CQ_UNIT)
    invalid = np.flatnonzero((units["offset"] < 0) | (units["size"] <= 0))
    units = units[: invalid[0] if invalid.size else units.size]
    index = np.flatnonzero(units["size"] != PRE_BLANK_SIZE)
    kept = units[index]
    columns = {
        "topic": pa.array([topic] * kept.size, pa.string()),
        "queue_id": pa.array(np.full(kept.size, queue_id, dtype=np.int32)),
        "queue_offset": pa.array(index.astype(np.int64) + int(path.name) // CQ_UNIT.itemsize),
        "commit_log_offset": pa.array(kept["offset"].astype(np.int64)),
        "store_size": pa.array(kept["size"].astype(np.int32)),
        "tags_code": pa.array(kept["tags"].astype(np.int64)),
    }
    return pa.table(columns).cast(CONSUME_QUEUE.arrow_schema.empty_table().select(list(_UNIT_COLUMNS)).schema)


@dataclass
class Verification:
    """The findings of one broker's verification and the units left unchecked."""

    broker_name: str
    store_dir: Path
    findings: list[dict[str, Any]] = field(default_factory=list)
    unchecked: int = 0
    store_units: int = 0

    def counts(self) -> dict[str, int]:
        """Findings per problem, every problem named."""
        return {p: sum(f["problem"] == p for f in self.findings) for p in BROKER_PROBLEMS}


def store_dir_of(lake: Lake, broker_name: str) -> Path:
    """The store the lake last ingested ``broker_name`` from (``store_ingests``).

    Raises:
        ValidationError: the broker was never ingested with ``ingest-store``.
    """
    rows = lake.read_rows(STORE_INGESTS, ["broker_name", "store_dir", "ingested_timestamp"])
    mine = rows.filter(pc.equal(rows["broker_name"], broker_name)).sort_by("ingested_timestamp").to_pylist()
    if not mine:
        raise ValidationError(
            "--verify-broker",
            broker_name,
            "was not ingested from a RocketMQ store (no store_ingests row)",
            "ingest it with python -m broker_model ingest-store, or give --store-dir",
        )
    return Path(mine[-1]["store_dir"])


def verify_broker(lake: Lake, broker_name: str, store_dir: Path, commitlog_version: int) -> Verification:
    """Compare ``store_dir``'s consume queues with the lake's rebuilt ones of ``broker_name``."""
    result = Verification(broker_name, store_dir)
    store = read_store_queues(store_dir / "consumequeue")
    result.store_units = store.num_rows
    rebuilt = lake.read_rows(CONSUME_QUEUE, list(_UNIT_COLUMNS), [("broker_name", "=", broker_name)])
    end = ingested_end(lake.root, broker_name) or 0
    ingests = lake.read_rows(STORE_INGESTS, ["broker_name", "from_offset"])
    starts = ingests.filter(pc.equal(ingests["broker_name"], broker_name))["from_offset"]
    first = int(pc.min(starts).as_py()) if len(starts) else 0
    log_end = _store_log_end(store_dir)
    ends = pc.add(store["commit_log_offset"], store["store_size"].cast(pa.int64()))
    dispatched = int(pc.max(ends).as_py()) if store.num_rows else 0
    mins = {
        (r["topic"], r["queue_id"]): r["queue_offset_min"]
        for r in store.group_by(["topic", "queue_id"]).aggregate([("queue_offset", "min")]).to_pylist()
    }
    keys = ["topic", "queue_id", "queue_offset"]
    joined = store.join(rebuilt, keys=keys, join_type="full outer", left_suffix="_store", right_suffix="_lake")

    def finding(row: dict[str, Any], problem: str, offset: int, detail: str) -> None:
        result.findings.append(
            {
                "broker_name": broker_name,
                "topic": row["topic"],
                "queue_id": row["queue_id"],
                "queue_offset": row["queue_offset"],
                "commit_log_offset": offset,
                "problem": problem,
                "detail": f"{detail} (store {store_dir})",
                "commitlog_version": commitlog_version,
            }
        )

    for row in joined.to_pylist():
        at, size, tags = row["commit_log_offset_store"], row["store_size_store"], row["tags_code_store"]
        lake_at = row["commit_log_offset_lake"]
        if at is not None and at + size > log_end:
            finding(row, "BROKER_CQ_BEYOND_LOG", at, f"unit of {size} bytes at {at} ends past the log's end {log_end}")
        elif lake_at is None and at is not None:
            if first <= at < end:
                finding(row, "BROKER_CQ_EXTRA", at, f"unit of {size} bytes at {at}; the rebuilt queue has none")
            else:
                result.unchecked += 1
        elif at is None:
            known_from = mins.get((row["topic"], row["queue_id"]))
            if lake_at < dispatched and (known_from is None or row["queue_offset"] >= known_from):
                size_lake = row["store_size_lake"]
                finding(row, "BROKER_CQ_MISSING", lake_at, f"the rebuilt unit of {size_lake} bytes at {lake_at}")
            else:
                result.unchecked += 1
        elif at != lake_at:
            finding(row, "BROKER_CQ_OFFSET", at, f"the broker's unit points at {at}, the rebuilt one at {lake_at}")
        elif size != row["store_size_lake"]:
            finding(row, "BROKER_CQ_SIZE", at, f"size {size} in the broker's unit, {row['store_size_lake']} rebuilt")
        elif tags != (rebuilt_tags := row["tags_code_lake"]):
            finding(row, "BROKER_CQ_TAGS", at, f"tags code {tags} in the broker's unit, {rebuilt_tags} rebuilt")
    result.findings.sort(key=lambda f: (f["topic"], f["queue_id"], f["queue_offset"], f["problem"]))
    return result


def _store_log_end(store_dir: Path) -> int:
    """The end of the store's commit log files (the last file's base + its size); 0 without files."""
    names = [p for p in (store_dir / "commitlog").iterdir() if SEGMENT_FILE_NAME.match(p.name)]
    if not names:
        return 0
    last = max(names, key=lambda p: int(p.name))
    return int(last.name) + last.stat().st_size


def write_findings(lake: Lake, verification: Verification) -> None:
    """Replace the broker's earlier ``BROKER_CQ_*`` findings in ``consume_queue_integrity`` by these."""
    rows = pa.Table.from_pylist(verification.findings, schema=CONSUME_QUEUE_INTEGRITY.arrow_schema)
    problems = ", ".join(f"'{p}'" for p in BROKER_PROBLEMS)
    predicate = f"broker_name = '{verification.broker_name}' AND problem IN ({problems})"
    lake.replace_rows_where(CONSUME_QUEUE_INTEGRITY, rows, predicate)
