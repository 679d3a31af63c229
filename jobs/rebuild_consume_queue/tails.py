"""``consume_queue_tails``: the last consume-queue row of every queue and the last record of every
broker's log, against which an incremental run checks what the commit log added.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from broker_model.common import QUEUE_KEY, QueueKey, dispatched_mask, is_dispatched
from jobs.log_chains import CHAIN_COLUMNS
from schemas.catalog import (
    CONSUME_QUEUE_TAILS,
)


@dataclass(frozen=True)
class Tails:
    """Where the consume queue and the commit log end (``consume_queue_tails``): per queue, the
    ``(queue_offset, commit_log_offset)`` of its last consume-queue row; per broker, the ``(commit_log_offset,
    store_size, segment)`` of its last record. An incremental run whose new rows all come after
    them checks the new rows against these rows alone instead of reading old consume-queue rows and records."""

    queues: dict[QueueKey, tuple[int, int]] = field(default_factory=dict)
    logs: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @classmethod
    def from_arrow(cls, table: Any) -> Tails:
        """The tails of ``consume_queue_tails`` rows (an Arrow table)."""
        tails = cls()
        for r in table.to_pylist():
            if r["kind"] == "QUEUE":
                key = (r["broker_name"], r["topic"], r["queue_id"])
                tails.queues[key] = (r["queue_offset"], r["commit_log_offset"])
            else:
                tails.logs[r["broker_name"]] = (r["commit_log_offset"], r["store_size"], r["segment"])
        return tails

    @classmethod
    def of_rows(cls, rows: pa.Table, cq_rows: bool = True) -> Tails:
        """The tails of commit log ``rows`` (an Arrow table read on the driver): each broker's
        greatest ``(commit_log_offset, store_size)`` record, and with ``consume-queue rows`` each queue's
        greatest ``(queue_offset, commit_log_offset)`` dispatched record. Needs ``broker_name``,
        ``segment``, ``commit_log_offset`` and ``store_size``, and with ``consume-queue rows`` also ``topic``,
        ``queue_id``, ``queue_offset`` and ``sys_flag``."""
        tails = cls()
        for r in rows.to_pylist():
            record = (r["commit_log_offset"], r["store_size"], r["segment"])
            tails.logs[r["broker_name"]] = max(tails.logs.get(r["broker_name"], record), record)
            if cq_rows and is_dispatched(r["sys_flag"]):
                key, cq_row = (r["broker_name"], r["topic"], r["queue_id"]), (r["queue_offset"], r["commit_log_offset"])
                tails.queues[key] = max(tails.queues.get(key, cq_row), cq_row)
        return tails

    def to_arrow(self, commitlog_version: int) -> pa.Table:
        """The ``consume_queue_tails`` rows of these tails."""
        rows = [
            {
                "kind": "QUEUE",
                "broker_name": b,
                "topic": t,
                "queue_id": q,
                "queue_offset": qo,
                "segment": None,
                "commit_log_offset": clo,
                "store_size": None,
                "commitlog_version": commitlog_version,
            }
            for (b, t, q), (qo, clo) in sorted(self.queues.items())
        ] + [
            {
                "kind": "LOG",
                "broker_name": b,
                "topic": None,
                "queue_id": None,
                "queue_offset": None,
                "segment": segment,
                "commit_log_offset": clo,
                "store_size": size,
                "commitlog_version": commitlog_version,
            }
            for b, (clo, size, segment) in sorted(self.logs.items())
        ]
        return pa.Table.from_pylist(rows, schema=CONSUME_QUEUE_TAILS.arrow_schema)

    def merged(self, later: Tails) -> Tails:
        """These tails moved on by ``later`` (the tails of rows checked after them), per key the greater."""
        queues = {k: max(v, later.queues[k]) if k in later.queues else v for k, v in self.queues.items()}
        logs = {k: max(v, later.logs[k]) if k in later.logs else v for k, v in self.logs.items()}
        return Tails({**later.queues, **queues}, {**later.logs, **logs})

    def precede(self, starts: Sequence[QueueStart]) -> bool:
        """Whether every new record and consume-queue row comes after these tails: each broker's first new
        record after its last record, each queue's first new consume-queue row after its last one. Then the
        context of the new rows is exactly the tails of their queues and brokers."""
        for start in starts:
            log = self.logs.get(start.broker_name)
            if log is not None and start.first_offset <= log[0]:
                return False
            cq_row = self.queues.get((start.broker_name, start.topic, start.queue_id))
            if cq_row is not None and start.first_cq_row is not None and start.first_cq_row <= cq_row[0]:
                return False
        return True

    def contexts(self, spark: SparkSession, starts: Sequence[QueueStart]) -> tuple[DataFrame | None, DataFrame]:
        """(queue context, log context) of the new rows of ``starts`` when :meth:`precede` holds:
        the last consume-queue row of their queues, the last record of their brokers (driver rows)."""
        queues = {(s.broker_name, s.topic, s.queue_id) for s in starts if s.first_cq_row is not None}
        brokers = {s.broker_name for s in starts}
        cq_row_rows = [(*k, *self.queues[k]) for k in sorted(queues) if k in self.queues]
        log_rows = [(b, segment, clo, size) for b, (clo, size, segment) in sorted(self.logs.items()) if b in brokers]
        queue_context_df = spark.createDataFrame(cq_row_rows, _CQ_ROW_CONTEXT_SCHEMA) if cq_row_rows else None
        return queue_context_df, spark.createDataFrame(log_rows, _LOG_CONTEXT_SCHEMA)


@dataclass(frozen=True)
class QueueStart:
    """Where the new records of an incremental run start in one queue: the smallest commit log
    offset of its records and the smallest queue offset of its consume-queue rows (None without consume-queue rows)."""

    broker_name: str
    topic: str
    queue_id: int
    first_offset: int
    first_cq_row: int | None


START_COLUMNS = (*CHAIN_COLUMNS, "tags")


def queue_starts(rows: pa.Table) -> list[QueueStart]:
    """The :class:`QueueStart` of every queue of commit log ``rows`` (:data:`START_COLUMNS`, an
    Arrow table read on the driver: the new rows of an incremental run are few, and their starts
    decide what the Spark work reads). Consume-queue rows are the dispatched records (:func:`is_dispatched`)."""
    cq_rows = pc.if_else(dispatched_mask(rows["sys_flag"]), rows["queue_offset"], pa.scalar(None, pa.int64()))
    keyed = rows.select(list(QUEUE_KEY)).append_column("first_offset", rows["commit_log_offset"])
    keyed = keyed.append_column("first_unit", cq_rows)
    grouped = keyed.group_by(list(QUEUE_KEY)).aggregate([("first_offset", "min"), ("first_unit", "min")])
    return [
        QueueStart(r["broker_name"], r["topic"], r["queue_id"], r["first_offset_min"], r["first_unit_min"])
        for r in grouped.to_pylist()
    ]


_CQ_ROW_CONTEXT_SCHEMA = "broker_name string, topic string, queue_id int, queue_offset long, commit_log_offset long"


_LOG_CONTEXT_SCHEMA = "broker_name string, segment long, commit_log_offset long, store_size int"
