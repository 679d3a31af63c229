"""The ``replay_ordered`` job: replay message queues strictly in queue order, queues in parallel.

**Sources** (the commit log itself, with the broker's dispatch rule: records whose transaction
type is NOT or COMMIT, as in ``rebuild_consume_queue``; no consume queue table is needed):

- ``--topic T[:0,1]`` (repeatable), all queues or the listed queue ids, optionally cut to an
  offset range ``--from-offset``/``--to-offset`` (``to`` exclusive) or a time range
  ``--from-time``/``--to-time``: RocketMQ's time lookup on each queue, the first offset stored at
  or after ``from`` up to (excluding) the first offset stored at or after ``to``;
- ``--group G``: the group's backlog, from its latest committed offset of each queue
  (``consumer_offset_commits``) to the queue's end; queues without a commit are not in it;
- ``--dlq``: rows of the ``dlq`` table (``--dlq-group`` to choose groups), replayed in the order of
  their ``%DLQ%group`` queue.

``--broker`` restricts any source to some brokers. The end of every queue is read once, at the
start of a run, from the commit log version the run reads.

**Sinks**:

- ``--to-table PATH_OR_NAME``: a Delta table (a bare name lives under the lake root) with the
  commit log's message columns and the source coordinates of every row (``source_broker_name``,
  ``source_topic``, ``source_queue_id``, ``source_queue_offset``, ``source_commit_log_offset``),
  ``replay_id``, and the replay order of each source queue: ``replay_batch`` (the Delta application
  transaction version of the commit that wrote the row) then ``replay_sequence``, which orders a
  queue's rows within its batch (queues are replayed in parallel: no order across queues). Each
  batch is one commit carrying the application transaction ``(replay_id, batch)``. When the commit
  log holds every source queue in queue order, as a broker writes it (checked on the driver from
  the source summary, before the write), ``replay_sequence`` is the source commit log offset and
  each Spark scan task writes its own rows, sorted by batch and sequence, with no shuffle;
  otherwise (a corrupt or foreign log, or a DLQ source) the rows are shuffled by queue and sorted
  by queue offset, and ``replay_sequence`` is the row's position in that write order. Each data
  file holds its rows of a queue in replay order either way. A row of the sink is identified by
  ``replay_id`` and its source coordinates (``replay_sequence`` may repeat across brokers).
- ``--to-topic T``: a topic of the broker holding each source queue (or ``--to-broker``), same queue
  id, or the queue chosen by RocketMQ's ``SelectMessageQueueByHash`` over the value of
  ``--selector-property`` (a message without it keeps its queue id modulo the queue count). The
  job starts that broker in its own process (it takes the broker name's lock: a broker running
  elsewhere makes the job fail at once). The message is stored as it was (body bytes, flag,
  compression, properties) without its delay and transaction markers, plus ``REPLAY_ID`` and
  ``REPLAY_SOURCE`` = ``broker/topic/queue_id/queue_offset``.
- ``--handler module:function``: a Python function called in the driver as
  ``function(messages, context)`` once per queue and batch, queues in parallel threads, messages in
  queue order (:class:`broker_model.store.MessageExt`, body decompressed) with a
  :class:`ReplayContext`. It returns a ``ConsumeOrderlyStatus`` (or its name): ``SUCCESS`` and
  ``COMMIT`` advance; ``SUSPEND_CURRENT_QUEUE_A_MOMENT`` (also an exception or no status) waits the
  context's suspend time (default 1000 ms, clamped to [10, 30000] ms) and delivers the batch again;
  ``ROLLBACK`` delivers it again from the last commit (the batch's start) after the same wait.
  After ``--max-attempts`` deliveries without advance the queue fails: it stops there, the other
  queues go on to their end, and the run ends FAILED naming it. The handler runs in the driver,
  not on executors: a queue's statuses, waits and re-deliveries are decided in one place, and the
  progress row after each batch is written by the one process that saw the handler return. Spark
  still reads and orders the rows, and streams them to the driver one partition at a time.

**Batches and exactly once.** Batch ``b`` of a run covers, in every queue, the queue offsets
``[resume + (b - b0) * N, resume + (b - b0 + 1) * N)`` with ``N = --batch-rows``, ``resume`` the
queue's first offset not replayed yet and ``b0`` the run's first batch number.
``replay_progress`` gets a row per queue when the replay starts (``last_offset`` = first offset - 1,
which pins the start of the replay: a rerun resumes from the progress, whatever its arguments say
about the start) and after each batch reached the sink (the last offset the batch covers). A
restart resumes each queue after ``max(progress, what the sink holds)``:

- Delta table: the rows of the replay in the sink (their greatest ``source_queue_offset`` per
  queue), read when the sink has a committed application transaction for the replay id; batch
  numbers go on after the committed one. A batch is one commit, so a kill leaves whole batches.
  With the bridge engine one Spark pass writes the data files of every batch of the run (invisible
  until committed), then the driver commits them batch after batch.
- Broker topic: the messages of the replay already in the target queues (``REPLAY_ID``), found by
  reading each target queue from the time of the queue's last progress row (less 1 s) to its end;
  a batch is flushed before its progress row is written, and one target broker per source queue
  keeps what a kill leaves a prefix of each source queue.
- Handler: progress only, written after the handler returned for every queue of a batch. A kill
  between the two delivers that batch again (at least once). A handler that must be exactly once
  dedupes by ``(context.replay_id, message.broker_name, topic, queue_id, queue_offset)``: offsets
  of a queue only grow, so remembering the last one per queue is enough.

A file lock (``<lake>/_locks/replay-<id>.lock``) keeps two runs of one replay id apart.

**Ordering report** (``replay_report``, and printed): per source queue, the source rows covered,
the rows replayed, first and last offsets, gaps (source offsets up to the last one replayed that
the sink lacks), duplicates, ``order_preserved`` (a running hash ``h = h * B + offset`` over the
offsets in replay order equals the hash over them in source order), and ``complete``. For a Delta
table or a broker topic it covers everything the sink holds for the replay id, read back from the
sink; for a handler it covers what this run delivered. The driver computes it with numpy, reading
the sink's coordinates file by file with pyarrow; it holds 24 bytes per replayed row (offset,
batch, sequence) and 8 per source message.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from broker_model.broker import Broker, BrokerConfig, InnerMessage
from broker_model.client import ConsumeOrderlyStatus
from broker_model.common import (
    QUEUE_KEY,
    MessageQueue,
    QueueKey,
    decompress_body,
    dispatched_mask,
    parse_instant,
    select_queue_by_hash,
    validate_group,
    validate_name,
    validate_topic,
)
from broker_model.common import constants as c
from broker_model.store import MessageExt, append_rows, read_table
from jobs.cli import job_parser, run_spark_job
from jobs.lake import (
    ENGINES,
    Lake,
    WrittenFile,
    WrittenFiles,
    check_bridge_can_read,
    commit_data_files,
    conform_to_catalog,
    create_table,
    local_directory,
    open_table,
    write_data_files,
)
from jobs.log_chains import group_codes
from jobs.rules import build_current_offsets, is_dispatched
from jobs.runs import JobRun, record_run
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUMER_OFFSET_COMMITS,
    DLQ,
    REPLAY_PROGRESS,
    REPLAY_REPORT,
    TABLES,
    TableSpec,
)
from schemas.catalog import (
    Column as CatalogColumn,
)
from schemas.errors import BrokerLockedError, LakeError, UnsupportedTableError, ValidationError

JOB = "replay_ordered"
REPLAY_ID_PROPERTY = "REPLAY_ID"  # names the replay on every message a broker sink stores
REPLAY_SOURCE_PROPERTY = "REPLAY_SOURCE"  # broker/topic/queue_id/queue_offset of the source message
SOURCE_SEPARATOR = "/"  # never in a topic or broker name (charset [%|a-zA-Z0-9_-])
DEFAULT_BATCH_ROWS = 10_000
DEFAULT_MAX_ATTEMPTS = 16  # the concurrent consumer's 16 reconsumes: a queue gives up after as many tries
TAIL_SCAN_MARGIN_MS = 1000  # the target is read from this long before the last progress row (clock jitter)
MAX_PARTITIONS = 256  # one Spark partition per source queue, up to this many
SOURCES = ("queues", "backlog", "dlq")
_BATCH_DIR = "replay_batch_dir"  # the staging directory key of a batch's files (a copy of replay_batch)
_REPLAY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# a replayed message is delivered now, as a plain message: no delay, no transaction markers
_DROPPED_PROPERTIES = (
    c.PROPERTY_DELAY_TIME_LEVEL,
    c.PROPERTY_REAL_TOPIC,
    c.PROPERTY_REAL_QUEUE_ID,
    c.PROPERTY_TRANSACTION_PREPARED,
)
_KEPT_SYS_FLAG = c.COMPRESSED_FLAG | c.COMPRESSION_TYPE_MASK | c.MULTI_TAGS_FLAG
# the commit log columns a Delta sink row carries, besides its source coordinates
MESSAGE_COLUMNS = (
    "store_size",
    "body_crc",
    "flag",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "store_timestamp",
    "store_host",
    "reconsume_times",
    "body",
    "properties",
    "tags",
    "keys",
    "uniq_key",
    "msg_id",
)
SOURCE_COLUMNS = (*QUEUE_KEY, "queue_offset", "commit_log_offset", *MESSAGE_COLUMNS)
REPLAYED_COLUMNS = (*QUEUE_KEY, "queue_offset", "replay_batch", "replay_sequence")


# ---------------------------------------------------------------------------------------------
# The Delta sink's table
# ---------------------------------------------------------------------------------------------


def sink_spec(path: Path) -> TableSpec:
    """The spec of a Delta sink at ``path`` (absolute): unpartitioned, columns in this order."""
    log_columns = {col.name: col for col in COMMITLOG.columns}
    coordinates = (
        CatalogColumn("replay_id", pa.string(), "name of the replay that wrote the row", False),
        CatalogColumn("replay_batch", pa.int64(), "application transaction version of the commit of the row", False),
        CatalogColumn("replay_sequence", pa.int64(), "orders the rows of a source queue within their batch", False),
        CatalogColumn("source_broker_name", pa.string(), "broker holding the source queue", False),
        CatalogColumn("source_topic", pa.string(), "source topic", False),
        CatalogColumn("source_queue_id", pa.int32(), "source queue id", False),
        CatalogColumn("source_queue_offset", pa.int64(), "queue offset of the source message", False),
        CatalogColumn("source_commit_log_offset", pa.int64(), "commit log offset of the source message", False),
    )
    return TableSpec(
        name=f"replay sink {path}",
        path=str(path),
        partition_by=(),
        columns=coordinates + tuple(log_columns[name] for name in MESSAGE_COLUMNS),
        meaning="messages replayed by replay_ordered, with their source coordinates",
    )


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicQueues:
    """A source topic and its queue ids (None: every queue of the topic)."""

    topic: str
    queue_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ReplayConfig:
    """Options of the job (see the module docstring); checked on construction.

    Attributes:
        replay_id: name of the replay, ``[A-Za-z0-9_.-]{1,64}``; progress and sinks are keyed by it.
        source: ``queues`` (``topics``), ``backlog`` (``group``) or ``dlq`` (``dlq_groups``, empty: all).
        from_offset, to_offset: queue offset range, ``to`` exclusive (``queues`` only).
        from_time, to_time: store time range, epoch ms (``queues`` only; not with offsets).
        to_topic, selector_property, to_broker / to_table / handler: the one sink.
        batch_rows: queue offsets per queue and batch, >= 1.
        max_attempts: handler deliveries of a batch before its queue fails, >= 1.

    Raises:
        ValidationError: naming the option and its value.
    """

    replay_id: str
    lake: Path
    source: str
    topics: tuple[TopicQueues, ...] = ()
    brokers: tuple[str, ...] = ()
    from_offset: int | None = None
    to_offset: int | None = None
    from_time: int | None = None
    to_time: int | None = None
    group: str | None = None
    dlq_groups: tuple[str, ...] = ()
    to_topic: str | None = None
    selector_property: str | None = None
    to_broker: str | None = None
    to_table: Path | None = None
    handler: str | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    engine: str = "auto"

    def __post_init__(self) -> None:
        if not _REPLAY_ID.match(self.replay_id):
            raise ValidationError("--replay-id", self.replay_id, "is not 1-64 characters of [A-Za-z0-9_.-]")
        self._check_source()
        self._check_sink()
        for name, value in (("--batch-rows", self.batch_rows), ("--max-attempts", self.max_attempts)):
            if value < 1:
                raise ValidationError(name, value, "is below 1", "pass a value >= 1")
        if self.engine not in ENGINES:
            raise ValidationError("--engine", self.engine, "unknown lake engine", f"use one of {list(ENGINES)}")

    def _check_source(self) -> None:
        if self.source not in SOURCES:
            raise ValidationError("source", self.source, "unknown source", f"use one of {list(SOURCES)}")
        given = (
            ("--from-offset", self.from_offset),
            ("--to-offset", self.to_offset),
            ("--from-time", self.from_time),
            ("--to-time", self.to_time),
        )
        ranged = [name for name, value in given if value is not None]
        if self.source == "queues" and not self.topics:
            raise ValidationError("--topic", None, "no source topic", "pass --topic T or --topic T:0,1")
        if self.source != "queues" and ((self.topics and self.source == "dlq") or ranged):
            raise ValidationError(ranged[0] if ranged else "--topic", self.source, "applies to --topic sources only")
        if self.source == "backlog":
            validate_group(self.group or "")
        for group in self.dlq_groups:
            validate_group(group)
        for entry in self.topics:
            validate_topic(entry.topic)
            if entry.queue_ids is not None and (not entry.queue_ids or min(entry.queue_ids) < 0):
                raise ValidationError("--topic", f"{entry.topic}:{entry.queue_ids}", "queue ids must be >= 0")
        for broker in self.brokers:
            validate_name(broker, "--broker", c.GROUP_MAX_LENGTH)
        self._check_ranges()

    def _check_ranges(self) -> None:
        if (self.from_offset is not None or self.to_offset is not None) and (
            self.from_time is not None or self.to_time is not None
        ):
            raise ValidationError("--from-time", self.from_time, "an offset range and a time range exclude each other")
        if self.from_offset is not None and self.from_offset < 0:
            raise ValidationError("--from-offset", self.from_offset, "is below 0")
        low, high = (self.from_offset, self.to_offset) if self.from_time is None else (self.from_time, self.to_time)
        if low is not None and high is not None and high <= low:
            name = "--to-offset" if self.from_time is None else "--to-time"
            raise ValidationError(name, high, f"is not after the start {low}", "the end is exclusive")

    def _check_sink(self) -> None:
        sinks = [
            n
            for n, v in (("--to-topic", self.to_topic), ("--to-table", self.to_table), ("--handler", self.handler))
            if v is not None
        ]
        if len(sinks) != 1:
            raise ValidationError("sink", sinks, "give exactly one sink", "--to-topic, --to-table or --handler")
        if self.to_topic is None and (self.selector_property is not None or self.to_broker is not None):
            raise ValidationError("--selector-property", self.selector_property, "applies to --to-topic only")
        if self.to_topic is not None:
            validate_topic(self.to_topic)
            if self.to_topic in {entry.topic for entry in self.topics}:
                raise ValidationError("--to-topic", self.to_topic, "is a source topic", "replay into another topic")
        if self.to_broker is not None:
            validate_name(self.to_broker, "--to-broker", c.GROUP_MAX_LENGTH)
        if self.handler is not None and not re.fullmatch(r"[\w.]+:\w+", self.handler):
            raise ValidationError("--handler", self.handler, "is not module:function", "e.g. mypkg.sinks:consume")
        if self.to_table is not None and not self.to_table.is_absolute():
            raise ValidationError("--to-table", str(self.to_table), "is not an absolute path", "resolve it first")

    @property
    def sink_label(self) -> str:
        """The sink as the report names it: ``table:<path>``, ``topic:<topic>`` or ``handler:<m:f>``."""
        if self.to_table is not None:
            return f"table:{self.to_table}"
        return f"topic:{self.to_topic}" if self.to_topic is not None else f"handler:{self.handler}"


def resolve_sink_path(lake: Path, text: str) -> Path:
    """The directory of ``--to-table``: a bare name lives under the lake root, a path is a path.

    Raises:
        ValidationError: the name of a catalog table (the sink is a table of its own).
    """
    if os.sep not in text and "/" not in text:
        if text in TABLES:
            raise ValidationError("--to-table", text, "is a catalog table", "choose another name")
        return (lake / text).absolute()
    return Path(text).absolute()


def parse_topic(text: str) -> TopicQueues:
    """``T`` or ``T:0,1`` as a :class:`TopicQueues`.

    Raises:
        ValidationError: queue ids that are not integers.
    """
    topic, _, ids = text.partition(":")
    if not ids:
        return TopicQueues(topic)
    try:
        return TopicQueues(topic, tuple(sorted({int(part) for part in ids.split(",")})))
    except ValueError:
        raise ValidationError("--topic", text, "queue ids are not integers", "write e.g. Orders:0,1") from None


# ---------------------------------------------------------------------------------------------
# Queue ranges: pure Python
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRange:
    """One source queue of a run: the replay's first offset (pinned by its first progress row),
    the first offset this run replays, and the end (exclusive)."""

    broker_name: str
    topic: str
    queue_id: int
    first: int
    resume: int
    end: int

    @property
    def key(self) -> QueueKey:
        """(broker_name, topic, queue_id)."""
        return (self.broker_name, self.topic, self.queue_id)

    @property
    def pending(self) -> int:
        """Queue offsets left to replay."""
        return max(0, self.end - self.resume)

    def covered(self, batches: int, batch_rows: int) -> int:
        """The last offset the first ``batches`` batches of the run cover (``resume - 1`` for none)."""
        return min(self.end, self.resume + batches * batch_rows) - 1


@dataclass(frozen=True)
class QueueBounds:
    """What the source knows of a queue: its offsets ``[min_offset, next_offset)``, the first offsets
    stored at or after the time range's start and end (None: none is), a group's committed offset."""

    broker_name: str
    topic: str
    queue_id: int
    min_offset: int
    next_offset: int
    time_start: int | None = None
    time_end: int | None = None
    committed: int | None = None

    @property
    def key(self) -> QueueKey:
        """(broker_name, topic, queue_id)."""
        return (self.broker_name, self.topic, self.queue_id)


@dataclass(frozen=True)
class Progress:
    """The ``replay_progress`` rows of a queue: the replay's first offset, the last offset
    replayed, the time of the latest row (epoch ms)."""

    first: int
    last: int
    updated_timestamp: int


def plan_ranges(
    bounds: Sequence[QueueBounds],
    config: ReplayConfig,
    progress: Mapping[QueueKey, Progress],
    sink_last: Mapping[QueueKey, int] | None = None,
) -> list[QueueRange]:
    """The queue ranges of a run, sorted by queue.

    The start of a queue is its progress's first offset when the replay has progress there; else
    ``from_offset`` (clamped to the queue), the time range's start, the group's committed offset
    (clamped), or the queue's first offset. The end is ``to_offset`` or the time range's end
    (clamped), else the queue's next offset. A run resumes after ``max(progress, sink_last)``.
    Deterministic; no I/O.
    """
    ranges = []
    for bound in sorted(bounds, key=lambda b: b.key):
        key = (bound.broker_name, bound.topic, bound.queue_id)
        start, end = _start_and_end(bound, config)
        known = progress.get(key)
        first = known.first if known is not None else start
        last = max(known.last if known is not None else first - 1, (sink_last or {}).get(key, first - 1))
        ranges.append(QueueRange(*key, first=first, resume=max(first, last + 1), end=max(end, first)))
    return ranges


def _start_and_end(bound: QueueBounds, config: ReplayConfig) -> tuple[int, int]:
    def clamp(value: int) -> int:
        return min(max(value, bound.min_offset), bound.next_offset)

    start, end = bound.min_offset, bound.next_offset
    if config.from_offset is not None:
        start = clamp(config.from_offset)
    if config.to_offset is not None:
        end = clamp(config.to_offset)
    if config.from_time is not None:
        start = bound.next_offset if bound.time_start is None else bound.time_start
    if config.to_time is not None:
        end = bound.next_offset if bound.time_end is None else bound.time_end
    if bound.committed is not None:
        start = clamp(bound.committed)
    return start, end


def batch_count(ranges: Sequence[QueueRange], batch_rows: int) -> int:
    """Batches needed for the longest queue of the run."""
    return max((-(-r.pending // batch_rows) for r in ranges), default=0)


def progress_after(ranges: Sequence[QueueRange], batches: int, batch_rows: int) -> dict[QueueKey, int]:
    """The last offset of every queue with something pending once ``batches`` batches are done."""
    return {r.key: r.covered(batches, batch_rows) for r in ranges if r.pending}


def parse_source(text: str) -> tuple[QueueKey, int] | None:
    """``broker/topic/queue_id/queue_offset`` (``REPLAY_SOURCE``) as (queue key, offset), or None."""
    parts = text.split(SOURCE_SEPARATOR)
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].lstrip("-").isdigit():
        return None
    return (parts[0], parts[1], int(parts[2])), int(parts[3])


def format_source(key: QueueKey, queue_offset: int) -> str:
    """The ``REPLAY_SOURCE`` value of a source message."""
    return SOURCE_SEPARATOR.join((key[0], key[1], str(key[2]), str(queue_offset)))


def select_queue_id(value: str | None, source_queue_id: int, queue_nums: int) -> int:
    """The target queue id: ``SelectMessageQueueByHash`` over ``value`` (Java hash of the string,
    remainder then absolute value), else ``source_queue_id`` modulo ``queue_nums``."""
    return source_queue_id % queue_nums if value is None else select_queue_by_hash(value, queue_nums)


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------


def filter_source_records(commitlog_df: DataFrame, topics: Sequence[TopicQueues]) -> DataFrame:
    """Dispatched records (transaction type NOT or COMMIT) of ``topics`` (and their queue ids);
    every record of a dispatched kind when ``topics`` is empty. Columns unchanged."""
    dispatched = commitlog_df.where(is_dispatched(F.col("sys_flag")))
    if not topics:
        return dispatched
    wanted = F.lit(False)
    for entry in topics:
        term = F.col("topic") == F.lit(entry.topic)
        if entry.queue_ids is not None:
            term = term & F.col("queue_id").isin(*entry.queue_ids)
        wanted = wanted | term
    return dispatched.where(wanted)


_BOUNDS = ("min_offset", "next_offset", "time_start", "time_end")


def _bound_aggregates(from_time: int | None, to_time: int | None) -> list[Column]:
    def first_at(moment: int | None) -> Column:
        if moment is None:
            return F.lit(None).cast("long")
        return F.min(F.when(F.col("store_timestamp") >= F.lit(moment), F.col("queue_offset")))

    return [
        F.min("queue_offset").alias("min_offset"),
        (F.max("queue_offset") + F.lit(1)).alias("next_offset"),
        first_at(from_time).alias("time_start"),
        first_at(to_time).alias("time_end"),
    ]


# the commit log columns a source summary reads
SUMMARY_COLUMNS = (
    "broker_name",
    "topic",
    "queue_id",
    "queue_offset",
    "store_timestamp",
    "sys_flag",
    "commit_log_offset",
)


def summarize_source(
    chunks: Iterable[pa.Table], topics: Sequence[TopicQueues], from_time: int | None, to_time: int | None
) -> pa.Table:
    """Per chunk of commit log rows (:data:`SUMMARY_COLUMNS`, one chunk per data file) and queue,
    the source records' bounds: ``min_offset``, ``next_offset`` (largest + 1), the first offsets
    stored at or after ``from_time`` and ``to_time`` (``time_start``, ``time_end``; null when none
    is, or when the time is None), ``offsets``, the chunk's queue offsets of the queue, and what
    :func:`queues_out_of_log_order` needs: the least and greatest commit log offsets
    (``min_log_offset``, ``max_log_offset``) and ``in_log_order``, whether the queue's offsets
    never fall as the commit log offset rises within the chunk.

    The source records are those :func:`filter_source_records` keeps. Computed on the driver with
    pyarrow, chunk after chunk: a file's narrow columns at a time, and 8 bytes per source record.
    """
    parts = []
    for rows in chunks:
        rows = rows.filter(_source_mask(rows, topics))
        if rows.num_rows == 0:
            continue
        offset, stored = rows["queue_offset"], rows["store_timestamp"]
        for name, moment in (("time_start", from_time), ("time_end", to_time)):
            at_or_after = (
                pa.nulls(rows.num_rows, pa.int64())
                if moment is None
                else pc.if_else(pc.greater_equal(stored, moment), offset, pa.scalar(None, pa.int64()))
            )
            rows = rows.append_column(name, at_or_after)
        rows = rows.append_column("_falls", pa.array(_falls_in_log_order(rows), pa.bool_()))
        grouped = rows.group_by(list(QUEUE_KEY), use_threads=False).aggregate(
            [
                ("queue_offset", "min"),
                ("queue_offset", "max"),
                ("time_start", "min"),
                ("time_end", "min"),
                ("queue_offset", "list"),
                ("commit_log_offset", "min"),
                ("commit_log_offset", "max"),
                ("_falls", "any"),
            ]
        )
        parts.append(
            pa.table(
                {
                    **{k: grouped[k] for k in QUEUE_KEY},
                    "min_offset": grouped["queue_offset_min"],
                    "next_offset": pc.add(grouped["queue_offset_max"], 1),
                    "time_start": grouped["time_start_min"],
                    "time_end": grouped["time_end_min"],
                    "offsets": grouped["queue_offset_list"],
                    "min_log_offset": grouped["commit_log_offset_min"],
                    "max_log_offset": grouped["commit_log_offset_max"],
                    "in_log_order": pc.invert(grouped["_falls_any"]),
                }
            )
        )
    return pa.concat_tables(parts) if parts else _SUMMARY_SCHEMA.empty_table()


_SUMMARY_SCHEMA = pa.schema(
    [
        ("broker_name", pa.string()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("min_offset", pa.int64()),
        ("next_offset", pa.int64()),
        ("time_start", pa.int64()),
        ("time_end", pa.int64()),
        ("offsets", pa.list_(pa.int64())),
        ("min_log_offset", pa.int64()),
        ("max_log_offset", pa.int64()),
        ("in_log_order", pa.bool_()),
    ]
)


def _falls_in_log_order(rows: pa.Table) -> np.ndarray:
    """Per row of ``rows``: whether its queue offset is below the one of the record before it in its
    queue by ``commit_log_offset`` (ties: the same record twice, or a corrupt log; taken as falling)."""
    groups = group_codes(rows, QUEUE_KEY)
    log_offset = np.asarray(rows["commit_log_offset"].to_numpy(), dtype=np.int64)
    offset = np.asarray(rows["queue_offset"].to_numpy(), dtype=np.int64)
    order = np.lexsort((log_offset, groups))
    same_queue = groups[order][1:] == groups[order][:-1]
    bad = same_queue & ((offset[order][1:] < offset[order][:-1]) | (log_offset[order][1:] == log_offset[order][:-1]))
    falls = np.zeros(rows.num_rows, dtype=bool)
    falls[order[1:]] = bad
    return falls


def queues_out_of_log_order(summary: pa.Table) -> list[QueueKey]:
    """The queues of ``summary`` (rows of :func:`summarize_source`) whose records, taken in commit
    log order, are not in queue order: a chunk where a queue offset falls, or two chunks whose
    commit log ranges of the queue overlap or whose queue offsets fall from one to the next.

    A broker writes each queue's records at rising commit log offsets, so for a log it wrote the
    list is empty; then the commit log offset orders every queue as its queue offsets do (ties of
    equal queue offsets by commit log offset, as the replay order breaks them)."""
    runs: dict[QueueKey, list[tuple[int, int, int, int, bool]]] = {}
    for r in summary.select(
        [*QUEUE_KEY, "min_log_offset", "max_log_offset", "min_offset", "next_offset", "in_log_order"]
    ).to_pylist():
        key = (r["broker_name"], r["topic"], r["queue_id"])
        runs.setdefault(key, []).append(
            (r["min_log_offset"], r["max_log_offset"], r["min_offset"], r["next_offset"] - 1, r["in_log_order"])
        )
    out = []
    for key, chunks in sorted(runs.items()):
        chunks.sort()
        seams = all(before[1] < after[0] and before[3] <= after[2] for before, after in pairwise(chunks))
        if not (seams and all(chunk[4] for chunk in chunks)):
            out.append(key)
    return out


def _source_mask(rows: pa.Table, topics: Sequence[TopicQueues]) -> pa.ChunkedArray | pa.Array:
    """:func:`filter_source_records` over Arrow rows: dispatched records of ``topics`` (and their
    queue ids), every dispatched record when ``topics`` is empty."""
    mask = dispatched_mask(rows["sys_flag"])
    if not topics:
        return mask
    wanted = None
    for entry in topics:
        term = pc.equal(rows["topic"], entry.topic)
        if entry.queue_ids is not None:
            term = pc.and_(term, pc.is_in(rows["queue_id"], pa.array(entry.queue_ids, pa.int32())))
        wanted = term if wanted is None else pc.or_(wanted, term)
    return pc.and_(mask, wanted)


def merge_queue_bounds(summary: pa.Table) -> list[QueueBounds]:
    """The bounds of each queue of ``summary`` (rows of :func:`summarize_source`, several per
    queue), sorted by queue; nulls are skipped, as Spark's ``min`` skips them."""
    aggregates = [(n, "max" if n == "next_offset" else "min") for n in _BOUNDS]
    merged = summary.group_by(list(QUEUE_KEY), use_threads=False).aggregate(aggregates)
    rows = merged.to_pylist()
    bounds = [
        QueueBounds(r["broker_name"], r["topic"], r["queue_id"], *[r[f"{n}_{f}"] for n, f in aggregates]) for r in rows
    ]
    return sorted(bounds, key=lambda b: b.key)


def build_backlog_starts(commits_df: DataFrame, group: str, as_of: int) -> DataFrame:
    """The group's latest committed offset (the next to consume) per queue at ``as_of``:
    ``broker_name``, ``topic``, ``queue_id``, ``committed``."""
    current_df = build_current_offsets(commits_df.where(F.col("group") == F.lit(group)), as_of)
    return current_df.select(*QUEUE_KEY, F.col("consumer_offset").alias("committed"))


def build_dlq_selection(dlq_df: DataFrame, records_df: DataFrame, groups: Sequence[str]) -> DataFrame:
    """The queue positions of the dead letters of ``dlq_df`` (of ``groups``; all when empty): their
    records in ``records_df`` matched on (``broker_name``, ``msg_id``). Columns: queue key and
    ``queue_offset``, one row per distinct position."""
    chosen_df = dlq_df if not groups else dlq_df.where(F.col("group").isin(*groups))
    letters_df = chosen_df.select("broker_name", "msg_id").distinct()
    dead_df = records_df.where(F.col("topic").startswith(c.DLQ_GROUP_TOPIC_PREFIX))
    return (
        dead_df.join(letters_df, on=["broker_name", "msg_id"], how="left_semi")
        .select(*QUEUE_KEY, "queue_offset")
        .distinct()
    )


def build_source_rows(
    records_df: DataFrame, ranges_df: DataFrame, batch_rows: int, selection_df: DataFrame | None = None
) -> DataFrame:
    """The source messages of a run with their batch number.

    Args:
        records_df: dispatched commit log records (:func:`filter_source_records`).
        ranges_df: one row per queue: queue key, ``resume``, ``end`` (exclusive), ``first_batch``.
        batch_rows: queue offsets per queue and batch.
        selection_df: when given (DLQ sources), only the positions it lists (queue key, ``queue_offset``).

    Returns:
        :data:`SOURCE_COLUMNS` plus ``replay_batch`` = ``first_batch + (queue_offset - resume) // batch_rows``.
    """
    rows_df = filter_in_ranges(records_df, ranges_df)
    if selection_df is not None:
        rows_df = rows_df.join(selection_df, on=[*QUEUE_KEY, "queue_offset"], how="left_semi")
    batch = F.col("first_batch") + F.floor((F.col("queue_offset") - F.col("resume")) / F.lit(batch_rows))
    return rows_df.select(*SOURCE_COLUMNS, batch.cast("long").alias("replay_batch"))


def filter_in_ranges(rows_df: DataFrame, ranges_df: DataFrame) -> DataFrame:
    """The rows of ``rows_df`` whose queue offset lies in their queue's ``[resume, end)`` of
    ``ranges_df`` (broadcast), with the columns of both."""
    in_range = (F.col("queue_offset") >= F.col("resume")) & (F.col("queue_offset") < F.col("end"))
    return rows_df.join(F.broadcast(ranges_df), on=list(QUEUE_KEY), how="inner").where(in_range)


def order_by_log(source_df: DataFrame) -> DataFrame:
    """``source_df`` with ``replay_sequence`` = ``commit_log_offset``, each partition sorted by
    batch and sequence: no shuffle, every scan task writes its own rows.

    Only for sources whose commit log order is each queue's order (:func:`queues_out_of_log_order`
    found none): then the sequence orders every queue's rows of a batch by queue offset, and each
    task's rows of a queue are in that order too. The batch is the sort prefix and the writer's
    partition key."""
    sequenced_df = source_df.withColumn("replay_sequence", F.col("commit_log_offset"))
    return sequenced_df.sortWithinPartitions("replay_batch", "replay_sequence")


def order_within_queues(source_df: DataFrame, partitions: int) -> DataFrame:
    """``source_df`` shuffled by queue (a queue's rows in one partition), sorted within each
    partition by batch, queue offset and commit log offset, with ``replay_sequence`` the row's
    position in that order (the write order). For any source: no global sort, queues in parallel,
    each queue's rows in offset order within a batch (queues sharing a partition interleave)."""
    ordered_df = source_df.repartition(partitions, *QUEUE_KEY).sortWithinPartitions(
        "replay_batch", "queue_offset", "commit_log_offset"
    )
    return ordered_df.withColumn("replay_sequence", F.monotonically_increasing_id())


def build_sink_rows(ordered_df: DataFrame, replay_id: str) -> DataFrame:
    """The Delta sink's rows of ``ordered_df`` (:func:`order_by_log` or :func:`order_within_queues`),
    columns exactly the sink's, in the same order."""
    renamed = {name: f"source_{name}" for name in (*QUEUE_KEY, "queue_offset", "commit_log_offset")}
    return ordered_df.select(
        F.lit(replay_id).alias("replay_id"),
        F.col("replay_batch"),
        F.col("replay_sequence"),
        *[F.col(name).alias(alias) for name, alias in renamed.items()],
        *MESSAGE_COLUMNS,
    )


def build_replayed_from_sink(sink_df: DataFrame, replay_id: str) -> DataFrame:
    """:data:`REPLAYED_COLUMNS` of a Delta sink's rows of ``replay_id``."""
    return sink_df.where(F.col("replay_id") == F.lit(replay_id)).select(
        F.col("source_broker_name").alias("broker_name"),
        F.col("source_topic").alias("topic"),
        F.col("source_queue_id").alias("queue_id"),
        F.col("source_queue_offset").alias("queue_offset"),
        "replay_batch",
        "replay_sequence",
    )


def build_replayed_from_topic(commitlog_df: DataFrame, replay_id: str, to_topic: str) -> DataFrame:
    """:data:`REPLAYED_COLUMNS` of the messages a broker sink stored for ``replay_id`` in
    ``to_topic``: the source from ``REPLAY_SOURCE``, the order from the target commit log offset
    (``replay_batch`` 0; one target broker per source queue makes it a total order per queue)."""
    mine = (F.col("topic") == F.lit(to_topic)) & (
        F.element_at(F.col("properties"), F.lit(REPLAY_ID_PROPERTY)) == F.lit(replay_id)
    )
    parts = F.split(F.element_at(F.col("properties"), F.lit(REPLAY_SOURCE_PROPERTY)), SOURCE_SEPARATOR)
    return commitlog_df.where(mine).select(
        parts.getItem(0).alias("broker_name"),
        parts.getItem(1).alias("topic"),
        parts.getItem(2).cast("int").alias("queue_id"),
        parts.getItem(3).cast("long").alias("queue_offset"),
        F.lit(0).cast("long").alias("replay_batch"),
        F.col("commit_log_offset").alias("replay_sequence"),
    )


_HASH_BASE = np.uint64(0x100000001B3)  # the running hash's multiplier: odd, so no offset is lost mod 2^64


def running_hash(offsets: np.ndarray) -> int:
    """The running hash of a sequence of offsets, in order: ``h = h * B + offset`` (mod 2^64) from
    0, computed at once as the sum of ``offset_i * B^(n-1-i)``. Equal sequences hash equal; a
    sequence hashes like its sorted copy only when it was in order (or by a 2^-64 chance)."""
    if len(offsets) == 0:
        return 0
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(len(offsets), _HASH_BASE, dtype=np.uint64))  # B^1 .. B^n
        powers = np.concatenate((np.ones(1, np.uint64), powers[:-1]))  # B^0 .. B^(n-1)
        return int(np.sum(offsets.astype(np.uint64) * powers[::-1], dtype=np.uint64))


def build_ordering_report(
    replayed: Iterable[pa.Table], expected: pa.Table, replay_id: str, run_id: str, sink: str, as_of: int
) -> list[dict[str, Any]]:
    """The ``replay_report`` rows, one per queue of ``expected`` or ``replayed``, sorted by queue.

    Args:
        replayed: chunks (one per sink data file, say) of :data:`REPLAYED_COLUMNS`, the rows the
            sink holds; the replay order of a queue is (``replay_batch``, ``replay_sequence``).
        expected: queue key and ``queue_offset``, one row per source message the report covers.

    Computed on the driver with numpy, chunk after chunk: each row leaves its offset, batch and
    sequence (24 bytes) until its queue is reported. ``order_preserved``: the running hash of the
    offsets in replay order equals the running hash of the same offsets sorted (the source order).
    ``gaps``: expected offsets up to ``last_offset`` the sink lacks. ``duplicates``: rows beyond
    the first of each offset. ``complete``: no gap, no duplicate, order preserved, and every
    expected offset replayed.
    """
    rows: dict[QueueKey, list[tuple[np.ndarray, ...]]] = {}
    for chunk in replayed:
        for key, columns in _by_queue(chunk, ["queue_offset", "replay_batch", "replay_sequence"]):
            rows.setdefault(key, []).append(columns)
    offsets = {key: values for key, (values,) in _by_queue(expected, ["queue_offset"])}
    report = []
    for key in sorted(rows.keys() | offsets.keys()):
        replay_order = np.empty(0, np.int64)
        if key in rows:
            offset, batch, sequence = (np.concatenate(column) for column in zip(*rows.pop(key), strict=True))
            replay_order = offset[np.lexsort((sequence, batch))]
        source = offsets.pop(key, np.empty(0, np.int64))
        report.append(
            _report_row(key, replay_order, source)
            | {"replay_id": replay_id, "run_id": run_id, "sink": sink, "report_timestamp": as_of}
        )
    return [{name: row[name] for name in REPLAY_REPORT.column_names} for row in report]


def _by_queue(table: pa.Table, columns: Sequence[str]) -> Iterator[tuple[QueueKey, tuple[np.ndarray, ...]]]:
    """Per queue key of ``table``: the key and the numeric ``columns`` of its rows as numpy
    arrays, in table order."""
    if table.num_rows == 0:
        return
    grouped = table.group_by(list(QUEUE_KEY), use_threads=False).aggregate([(c, "list") for c in columns])
    for i in range(grouped.num_rows):
        key = (grouped["broker_name"][i].as_py(), grouped["topic"][i].as_py(), grouped["queue_id"][i].as_py())
        yield key, tuple(grouped[f"{c}_list"][i].values.to_numpy() for c in columns)


def _report_row(key: QueueKey, replay_order: np.ndarray, source: np.ndarray) -> dict[str, Any]:
    rows = len(replay_order)
    ordered = np.sort(replay_order)
    distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if rows else ordered
    last = int(ordered[-1]) if rows else None
    gaps = 0
    if rows:  # distinct source offsets up to the last one replayed, less those the sink holds
        wanted = np.unique(source[source <= last])
        at = np.minimum(np.searchsorted(distinct, wanted), len(distinct) - 1)
        gaps = int(np.count_nonzero(distinct[at] != wanted))
    duplicates = rows - len(distinct)
    preserved = running_hash(replay_order) == running_hash(ordered)
    return {
        "broker_name": key[0],
        "topic": key[1],
        "queue_id": key[2],
        "source_rows": len(source),
        "rows": rows,
        "first_offset": int(ordered[0]) if rows else None,
        "last_offset": last,
        "gaps": gaps,
        "duplicates": duplicates,
        "order_preserved": preserved,
        "complete": gaps == 0 and duplicates == 0 and preserved and rows - duplicates == len(source),
    }


# ---------------------------------------------------------------------------------------------
# The handler's side
# ---------------------------------------------------------------------------------------------


@dataclass
class ReplayContext:
    """What a handler call gets besides the messages; it may set
    ``suspend_current_queue_time_millis`` (-1: 1000 ms) for a SUSPEND or ROLLBACK answer."""

    replay_id: str
    message_queue: MessageQueue
    batch: int
    attempt: int
    suspend_current_queue_time_millis: int = -1


ReplayHandler = Callable[[list[MessageExt], ReplayContext], Any]


def load_handler(spec: str) -> ReplayHandler:
    """The function named by ``module:function``.

    Raises:
        ValidationError: the module cannot be imported or has no such callable.
    """
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise ValidationError("--handler", spec, f"cannot import {module_name!r}: {err}", "check PYTHONPATH") from err
    handler = getattr(module, function_name, None)
    if not callable(handler):
        raise ValidationError("--handler", spec, f"module {module_name!r} has no function {function_name!r}")
    return cast(ReplayHandler, handler)


def status_of(answer: Any) -> ConsumeOrderlyStatus:
    """A handler's answer as a status: a status, or its name; anything else suspends the queue."""
    if isinstance(answer, ConsumeOrderlyStatus):
        return answer
    if isinstance(answer, str) and answer in ConsumeOrderlyStatus.__members__:
        return ConsumeOrderlyStatus[answer]
    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


def suspend_seconds(context: ReplayContext) -> float:
    """The wait before a batch is delivered again: the context's time or 1000 ms, clamped to
    [10, 30000] ms as the orderly consumer does."""
    millis = (
        c.SUSPEND_CURRENT_QUEUE_TIME_MS
        if context.suspend_current_queue_time_millis == -1
        else (context.suspend_current_queue_time_millis)
    )
    return min(max(millis, c.SUSPEND_TIME_MIN_MS), c.SUSPEND_TIME_MAX_MS) / 1000


def deliver(
    handler: ReplayHandler, messages: list[MessageExt], replay_id: str, batch: int, max_attempts: int
) -> str | None:
    """Deliver one queue's batch until the handler advances; None on success, else why it failed
    after ``max_attempts`` deliveries (the last status or error)."""
    queue = MessageQueue(messages[0].broker_name, messages[0].topic, messages[0].queue_id)
    last = ""
    for attempt in range(1, max_attempts + 1):
        context = ReplayContext(replay_id, queue, batch, attempt)
        try:
            status = status_of(handler(list(messages), context))
            last = status.name
        except Exception as err:  # a failing handler suspends its queue, as an orderly listener does
            status, last = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT, f"{type(err).__name__}: {err}"
        if status in (ConsumeOrderlyStatus.SUCCESS, ConsumeOrderlyStatus.COMMIT):
            return None
        if attempt < max_attempts:
            time.sleep(suspend_seconds(context))
    return f"{max_attempts} deliveries of batch {batch} without SUCCESS or COMMIT (last: {last})"


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


class ReplayLock:
    """An OS file lock making a replay id exclusive on a lake; released when the holder dies."""

    def __init__(self, lake: Path, replay_id: str) -> None:
        self.path = lake / "_locks" / f"replay-{replay_id}.lock"
        self.replay_id = replay_id
        self._handle: Any = None

    def __enter__(self) -> ReplayLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ValidationError(
                "--replay-id",
                self.replay_id,
                f"is being replayed by another process ({holder})",
                "wait for it to end or kill it, then run again",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}@{socket.gethostname()}\n")
        handle.flush()
        self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


@dataclass
class ReplayOutcome:
    """What a run did: rows replayed, batches, queues that failed (handler) and the report rows."""

    rows: int = 0
    batches: int = 0
    failed: dict[QueueKey, str] = field(default_factory=dict)
    report: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Run:
    """The state a run shares between its steps."""

    lake: Lake
    config: ReplayConfig
    commitlog_version: int
    records_df: DataFrame
    offsets: pa.Table  # queue key and offsets (list): the queue offsets of the source's records
    selection_df: DataFrame | None  # cached while the run lasts
    progress: dict[QueueKey, Progress]
    bounds: list[QueueBounds]
    log_ordered: bool  # the commit log order of every source queue is its queue order (order_by_log)


def run(spark: SparkSession, config: ReplayConfig) -> JobRun:
    """Replay the source into the sink, print and record the ordering report, record the run.

    Reads ``commitlog`` at its current version (and ``consumer_offset_commits`` or ``dlq``),
    ``replay_progress``; writes the sink, ``replay_progress``, ``replay_report`` and one ``job_runs``
    row: SUCCEEDED, NOOP (nothing left to replay) or FAILED (a handler queue failed: the other
    queues completed; or an error, re-raised).

    Raises:
        ValidationError: bad handler, a Delta sink with other columns, a source missing its table.
        BrokerLockedError: a target broker runs in another process.
        LakeError: the lake has no commit log.
    """
    lake = Lake(spark, config.lake, config.engine)
    handler = load_handler(config.handler) if config.handler is not None else None
    if config.to_table is not None:
        _check_sink_table(config.to_table)
    job_run = JobRun(JOB)
    with ReplayLock(config.lake, config.replay_id):
        try:
            state = _prepare(lake, config)
            job_run.input_versions = {COMMITLOG.name: state.commitlog_version}
            outcome = _replay(state, job_run, handler)
            job_run.row_counts = {"replayed": outcome.rows, "batches": outcome.batches, "queues": len(outcome.report)}
        except Exception as err:
            record_run(lake, job_run.finish("FAILED", f"replay_id={config.replay_id}; {type(err).__name__}: {err}"))
            raise
    print("\n".join(format_report(outcome.report, config.replay_id, config.sink_label)))
    failed = "; ".join(f"{SOURCE_SEPARATOR.join(map(str, key))}: {why}" for key, why in sorted(outcome.failed.items()))
    status = "FAILED" if outcome.failed else ("SUCCEEDED" if outcome.batches else "NOOP")
    message = f"replay_id={config.replay_id}; {outcome.rows} rows in {outcome.batches} batches"
    record_run(lake, job_run.finish(status, message + (f"; failed queues: {failed}" if failed else "")))
    if failed:
        print(f"{JOB}: queues failed (the others completed): {failed}")
    return job_run


def _check_sink_table(path: Path) -> None:
    if not DeltaTable.is_deltatable(str(path)):
        if path.exists() and any(path.iterdir()):
            raise ValidationError("--to-table", str(path), "is a non-empty directory but no Delta table")
        return
    expected = sink_spec(path).arrow_schema
    actual = pa.schema(DeltaTable(str(path)).schema().to_arrow())
    if [(f.name, str(f.type)) for f in actual] != [(f.name, str(f.type)) for f in expected]:
        raise ValidationError(
            "--to-table",
            str(path),
            "is a Delta table with other columns than a replay sink",
            "replay into a new table",
        )


def _prepare(lake: Lake, config: ReplayConfig) -> _Run:
    """Read the source's queue bounds and the replay's progress (before any write)."""
    version = lake.version(COMMITLOG)
    if version is None:
        raise LakeError(f"no commitlog table under {config.lake}; write messages first (python -m broker_model)")
    partition_filter = {"broker_name": list(config.brokers)} if config.brokers else None
    log_df = lake.read(COMMITLOG, version=version, partition_filter=partition_filter)
    records_df = filter_source_records(log_df, config.topics)
    selection_df = None
    if config.source == "dlq":
        if not lake.exists(DLQ):
            raise ValidationError("--dlq", str(config.lake), "the lake has no dlq table", "run route_dlq first")
        selection_df = build_dlq_selection(lake.read(DLQ), records_df, config.dlq_groups).cache()
        records_df = records_df.where(F.col("topic").startswith(c.DLQ_GROUP_TOPIC_PREFIX))
        positions_df = selection_df.withColumn("store_timestamp", F.lit(0).cast("long"))
        summary_df = positions_df.groupBy(*QUEUE_KEY).agg(
            *_bound_aggregates(config.from_time, config.to_time), F.collect_list("queue_offset").alias("offsets")
        )
        summary = summary_df.select(*QUEUE_KEY, *_BOUNDS, "offsets").toArrow()
    else:
        # the source summarized per file and queue on the driver, from the narrow columns (bounds,
        # and the offsets the report expects): no Spark job before the write
        chunks = lake.iter_file_rows(COMMITLOG, SUMMARY_COLUMNS, version=version, partition_filter=partition_filter)
        summary = summarize_source(chunks, config.topics, config.from_time, config.to_time)
    # only a Delta sink writes with Spark; handlers and topics take the rows to the driver in order
    log_ordered = config.to_table is not None and config.source != "dlq" and _log_ordered(summary)
    bounds = merge_queue_bounds(summary)
    if config.source == "backlog":
        if not lake.exists(CONSUMER_OFFSET_COMMITS):
            raise ValidationError("--group", config.group, "the lake has no consumer_offset_commits table")
        starts_df = build_backlog_starts(lake.read(CONSUMER_OFFSET_COMMITS), config.group or "", _now())
        starts = {(r["broker_name"], r["topic"], r["queue_id"]): r["committed"] for r in starts_df.collect()}
        bounds = [replace(b, committed=starts[b.key]) for b in bounds if b.key in starts]
    progress = read_progress(lake, config.replay_id)
    return _Run(
        lake,
        config,
        version,
        records_df,
        summary.select([*QUEUE_KEY, "offsets"]),
        selection_df,
        progress,
        bounds,
        log_ordered,
    )


def _log_ordered(summary: pa.Table) -> bool:
    """Whether every queue of ``summary`` is in queue order in the commit log; else say which are not."""
    unordered = queues_out_of_log_order(summary)
    if unordered:
        named = ", ".join(SOURCE_SEPARATOR.join(map(str, key)) for key in unordered[:5])
        more = f" and {len(unordered) - 5} more" if len(unordered) > 5 else ""
        print(
            f"{JOB}: the commit log's data files do not hold {named}{more} in queue order file after file (a "
            "corrupt or foreign log, or files whose offset ranges overlap); the rows are shuffled by queue and "
            "sorted by queue offset"
        )
    return not unordered


def read_progress(lake: Lake, replay_id: str) -> dict[QueueKey, Progress]:
    """The progress of every queue of ``replay_id`` (empty when the table does not exist); a small
    table, read from the driver with delta-rs as it is written."""
    rows = read_table(lake.root, REPLAY_PROGRESS)
    rows = (
        rows.filter(pc.equal(rows["replay_id"], replay_id))
        .group_by(list(QUEUE_KEY))
        .aggregate([("last_offset", "min"), ("last_offset", "max"), ("updated_timestamp", "max")])
    )
    return {
        (r["broker_name"], r["topic"], r["queue_id"]): Progress(
            r["last_offset_min"] + 1, r["last_offset_max"], r["updated_timestamp_max"]
        )
        for r in rows.to_pylist()
    }


def write_progress(lake: Lake, replay_id: str, last_offsets: Mapping[QueueKey, int]) -> None:
    """Append one ``replay_progress`` row per queue of ``last_offsets``."""
    if not last_offsets:
        return
    keys = sorted(last_offsets)
    columns = {
        "replay_id": [replay_id] * len(keys),
        "broker_name": [k[0] for k in keys],
        "topic": [k[1] for k in keys],
        "queue_id": [k[2] for k in keys],
        "last_offset": [last_offsets[k] for k in keys],
        "updated_timestamp": [_now()] * len(keys),
    }
    # a few rows per batch: appended from the driver with delta-rs (as the broker appends its small
    # tables), so that a batch's progress costs a commit, not a Spark job
    append_rows(lake.root, REPLAY_PROGRESS, pa.table(columns, schema=REPLAY_PROGRESS.arrow_schema))


def _replay(state: _Run, job_run: JobRun, handler: ReplayHandler | None) -> ReplayOutcome:
    config = state.config
    try:
        if config.to_table is not None:
            return _replay_to_table(state, job_run, config.to_table)
        if config.to_topic is not None:
            return _replay_to_topic(state, job_run, config.to_topic)
        assert handler is not None
        return _replay_to_handler(state, job_run, handler)
    finally:
        if state.selection_df is not None:
            state.selection_df.unpersist()


def _start_replay(state: _Run, ranges: list[QueueRange]) -> None:
    """Pin the start of queues new to the replay with a progress row at ``first - 1``."""
    new = {r.key: r.first - 1 for r in ranges if r.key not in state.progress}
    write_progress(state.lake, state.config.replay_id, new)


def _ranges_df(spark: SparkSession, ranges: Sequence[QueueRange], first_batch: int) -> DataFrame:
    rows = [(*r.key, r.resume, r.end, first_batch) for r in ranges if r.pending]
    schema = "broker_name string, topic string, queue_id int, resume long, end long, first_batch long"
    return spark.createDataFrame(rows, schema)


def _expected(state: _Run, ranges: Sequence[QueueRange], from_resume: bool) -> pa.Table:
    """Queue key and ``queue_offset`` of the source messages the report covers, from each queue's
    first offset (or this run's resume point) to its end."""
    lists = state.offsets["offsets"]
    flat = state.offsets.select(list(QUEUE_KEY)).take(pc.list_parent_indices(lists))
    flat = flat.append_column("queue_offset", pc.list_flatten(lists))
    limits = pa.table(
        {
            "broker_name": [r.broker_name for r in ranges],
            "topic": [r.topic for r in ranges],
            "queue_id": pa.array([r.queue_id for r in ranges], pa.int32()),
            "_from": pa.array([r.resume if from_resume else r.first for r in ranges], pa.int64()),
            "_end": pa.array([r.end for r in ranges], pa.int64()),
        }
    )
    joined = flat.join(limits, list(QUEUE_KEY), join_type="inner", use_threads=False)
    offset = joined["queue_offset"]
    kept = pc.and_(pc.greater_equal(offset, joined["_from"]), pc.less(offset, joined["_end"]))
    return joined.filter(kept).select([*QUEUE_KEY, "queue_offset"])


def _finish_report(
    state: _Run, job_run: JobRun, replayed: Iterable[pa.Table], expected: pa.Table, outcome: ReplayOutcome
) -> ReplayOutcome:
    """Compute the ordering report and append it to ``replay_report`` from the driver (one commit)."""
    config = state.config
    outcome.report = build_ordering_report(
        replayed, expected, config.replay_id, job_run.run_id, config.sink_label, _now()
    )
    if outcome.report:
        state.lake.append_rows(REPLAY_REPORT, pa.Table.from_pylist(outcome.report, REPLAY_REPORT.arrow_schema))
    return outcome


# -- Delta table --------------------------------------------------------------------------------


def _replay_to_table(state: _Run, job_run: JobRun, path: Path) -> ReplayOutcome:
    lake, config = state.lake, state.config
    spec = sink_spec(path)
    committed = (
        DeltaTable(str(path)).transaction_version(config.replay_id) if DeltaTable.is_deltatable(str(path)) else None
    )
    sink_last: dict[QueueKey, int] = {}
    if committed is not None:
        last_df = (
            build_replayed_from_sink(lake.read(spec), config.replay_id)
            .groupBy(*QUEUE_KEY)
            .agg(F.max("queue_offset").alias("last"))
        )
        sink_last = {(r["broker_name"], r["topic"], r["queue_id"]): r["last"] for r in last_df.collect()}
    ranges = plan_ranges(state.bounds, config, state.progress, sink_last)
    _start_replay(state, ranges)
    first_batch = 0 if committed is None else committed + 1
    outcome = ReplayOutcome(batches=batch_count(ranges, config.batch_rows))
    if outcome.batches:
        source_df = build_source_rows(
            state.records_df, _ranges_df(lake.spark, ranges, first_batch), config.batch_rows, state.selection_df
        )
        if state.log_ordered:
            ordered_df = order_by_log(source_df)
        else:
            ordered_df = order_within_queues(source_df, min(MAX_PARTITIONS, max(1, sum(r.pending > 0 for r in ranges))))
        sink_df = build_sink_rows(ordered_df, config.replay_id)
        write = _write_batches_bridge if lake.engine == "bridge" else _write_batches_delta_spark
        outcome.rows = write(lake, spec, sink_df, ranges, first_batch, outcome.batches, config)
        job_run.output_versions["sink"] = DeltaTable(str(path)).version()
    expected = _expected(state, ranges, from_resume=False)
    return _finish_report(state, job_run, read_replayed_from_sink(lake, spec, config.replay_id), expected, outcome)


_REPLAYED_TYPES = (pa.string(), pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.int64())  # of REPLAYED_COLUMNS


def read_replayed_from_sink(lake: Lake, spec: TableSpec, replay_id: str) -> Iterator[pa.Table]:
    """:data:`REPLAYED_COLUMNS` of a Delta sink's rows of ``replay_id``, read on the driver with
    pyarrow one data file at a time (a sink the bridge cannot read: through Spark, as one table)."""
    columns = [
        "source_broker_name",
        "source_topic",
        "source_queue_id",
        "source_queue_offset",
        "replay_batch",
        "replay_sequence",
    ]
    try:
        chunks = lake.iter_file_rows(spec, columns, {"replay_id": replay_id})
    except UnsupportedTableError:
        return iter([build_replayed_from_sink(lake.read(spec), replay_id).toArrow()])
    return (chunk.rename_columns(list(REPLAYED_COLUMNS)) for chunk in chunks)


def _write_batches_bridge(
    lake: Lake,
    spec: TableSpec,
    sink_df: DataFrame,
    ranges: Sequence[QueueRange],
    first_batch: int,
    batches: int,
    config: ReplayConfig,
) -> int:
    """One Spark pass writes every batch's files (invisible until committed), then each batch is
    committed with its application transaction and its progress written after; the rows committed."""
    table_dir = local_directory(spec.path)
    if not DeltaTable.is_deltatable(table_dir):
        create_table(table_dir, spec)
    check_bridge_can_read(open_table(table_dir), table_dir)
    conform_to_catalog(sink_df, spec)  # checks the columns and types; its NOT NULL guards are left out:
    # a guard rewrites replay_batch, and the writer would then sort the rows by batch again, unstably.
    # Every sink column is a literal or a NOT NULL commit log column. The staging key is replay_batch
    # itself, the first key of the sort, so the writer keeps the order as it is.
    staged_df = sink_df.select(*spec.column_names, F.col("replay_batch").alias(_BATCH_DIR))
    written = write_data_files(staged_df, table_dir, [_BATCH_DIR])
    by_batch: dict[int, list[WrittenFile]] = {}
    for file in written.files:
        batch = int(file.partition_values[_BATCH_DIR] or 0)
        by_batch.setdefault(batch, []).append(replace(file, partition_values={}))
    rows = 0
    try:
        for index in range(batches):
            files = by_batch.pop(first_batch + index, [])
            if files:
                _commit_batch(
                    table_dir, WrittenFiles(written.directory, tuple(files)), config.replay_id, first_batch + index
                )
                rows += sum(_num_records(f) for f in files)
            write_progress(lake, config.replay_id, progress_after(ranges, index + 1, config.batch_rows))
    finally:
        for files in by_batch.values():  # files of batches an error kept from their commit
            for file in files:
                Path(table_dir, file.path).unlink(missing_ok=True)
    return rows


def _commit_batch(table_dir: str, files: WrittenFiles, replay_id: str, batch: int) -> None:
    """Commit one batch's files with the application transaction (replay_id, batch), unless the
    table already holds that version (a commit that raised after it happened)."""
    from deltalake.transaction import Transaction

    committed = open_table(table_dir).transaction_version(replay_id)
    if committed is not None and committed >= batch:
        return
    commit_data_files(table_dir, files, "append", None, Transaction(replay_id, batch))


def _num_records(file: WrittenFile) -> int:
    import json

    return int(json.loads(file.stats)["numRecords"])


def _write_batches_delta_spark(
    lake: Lake,
    spec: TableSpec,
    sink_df: DataFrame,
    ranges: Sequence[QueueRange],
    first_batch: int,
    batches: int,
    config: ReplayConfig,
) -> int:
    """One write per batch through :meth:`Lake.append` with the application transaction (Delta's
    own writer keeps no staged files between commits); the rows written."""
    rows = 0
    for index in range(batches):
        batch = first_batch + index
        batch_df = sink_df.where(F.col("replay_batch") == F.lit(batch)).cache()
        try:
            count = batch_df.count()
            if count:
                lake.append(spec, batch_df, config.replay_id, batch)
                rows += count
        finally:
            batch_df.unpersist()
        write_progress(lake, config.replay_id, progress_after(ranges, index + 1, config.batch_rows))
    return rows


# -- rows to the driver -------------------------------------------------------------------------


def driver_batches(source_df: DataFrame) -> Iterator[tuple[int, dict[QueueKey, list[Row]]]]:
    """The rows of ``source_df`` (:func:`build_source_rows`) batch after batch, each batch's rows
    grouped by queue in queue offset order; partitions stream to the driver one at a time."""
    ordered_df = source_df.orderBy("replay_batch", *QUEUE_KEY, "queue_offset")
    current: int | None = None
    queues: dict[QueueKey, list[Row]] = {}
    for row in ordered_df.toLocalIterator(prefetchPartitions=True):
        if current is not None and row["replay_batch"] != current:
            yield current, queues
            queues = {}
        current = row["replay_batch"]
        queues.setdefault((row["broker_name"], row["topic"], row["queue_id"]), []).append(row)
    if current is not None:
        yield current, queues


def message_of(row: Row) -> MessageExt:
    """A source row as the message a handler receives (body decompressed)."""
    return MessageExt(
        broker_name=row["broker_name"],
        topic=row["topic"],
        queue_id=row["queue_id"],
        queue_offset=row["queue_offset"],
        commit_log_offset=row["commit_log_offset"],
        store_size=row["store_size"],
        body=decompress_body(bytes(row["body"]), row["sys_flag"]),
        flag=row["flag"],
        sys_flag=row["sys_flag"],
        properties=dict(row["properties"] or {}),
        born_timestamp=row["born_timestamp"],
        born_host=row["born_host"],
        store_timestamp=row["store_timestamp"],
        store_host=row["store_host"],
        reconsume_times=row["reconsume_times"],
        prepared_transaction_offset=0,
        body_crc=row["body_crc"],
        msg_id=row["msg_id"],
    )


# -- handler ------------------------------------------------------------------------------------


def _replay_to_handler(state: _Run, job_run: JobRun, handler: ReplayHandler) -> ReplayOutcome:
    lake, config = state.lake, state.config
    ranges = plan_ranges(state.bounds, config, state.progress)
    _start_replay(state, ranges)
    outcome = ReplayOutcome(batches=batch_count(ranges, config.batch_rows))
    delivered: list[tuple[str, str, int, int, int, int]] = []
    if outcome.batches:
        source_df = build_source_rows(
            state.records_df, _ranges_df(lake.spark, ranges, 0), config.batch_rows, state.selection_df
        )
        written: dict[QueueKey, int] = {}
        workers = max(1, min(8, sum(1 for r in ranges if r.pending)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="replay-handler") as pool:
            for batch, queues in driver_batches(source_df):
                live = {key: rows for key, rows in queues.items() if key not in outcome.failed}
                futures = {
                    key: pool.submit(
                        deliver, handler, [message_of(r) for r in rows], config.replay_id, batch, config.max_attempts
                    )
                    for key, rows in live.items()
                }
                for key, future in futures.items():
                    failure = future.result()
                    if failure is not None:
                        outcome.failed[key] = failure
                        continue
                    sequence = len(delivered)
                    delivered += [(*key, row["queue_offset"], batch, sequence + i) for i, row in enumerate(live[key])]
                    outcome.rows += len(live[key])
                done = progress_after(ranges, batch + 1, config.batch_rows)
                fresh = {k: v for k, v in done.items() if k not in outcome.failed and written.get(k) != v}
                write_progress(lake, config.replay_id, fresh)
                written.update(fresh)
    replayed = pa.Table.from_arrays(
        [
            pa.array(column, kind)
            for column, kind in zip(
                zip(*delivered, strict=True) if delivered else [[]] * 6, _REPLAYED_TYPES, strict=True
            )
        ],
        names=list(REPLAYED_COLUMNS),
    )
    return _finish_report(state, job_run, [replayed], _expected(state, ranges, from_resume=True), outcome)


# -- broker topic -------------------------------------------------------------------------------


def _replay_to_topic(state: _Run, job_run: JobRun, to_topic: str) -> ReplayOutcome:
    lake, config = state.lake, state.config
    targets = {b.broker_name: config.to_broker or b.broker_name for b in state.bounds}
    brokers = _start_brokers(config.lake, sorted(set(targets.values())))
    try:
        queue_nums = _prepare_target_topic(brokers, state.bounds, targets, to_topic, config.selector_property)
        probe = plan_ranges(state.bounds, config, state.progress)
        found = find_replayed(
            brokers,
            probe,
            targets,
            to_topic,
            config.replay_id,
            state.progress,
            queue_nums,
            config.selector_property is not None,
        )
        ranges = plan_ranges(state.bounds, config, state.progress, found)
        _start_replay(state, ranges)
        outcome = ReplayOutcome(batches=batch_count(ranges, config.batch_rows))
        if outcome.batches:
            source_df = build_source_rows(
                state.records_df, _ranges_df(lake.spark, ranges, 0), config.batch_rows, state.selection_df
            )
            for batch, queues in driver_batches(source_df):
                for key, rows in queues.items():
                    broker = brokers[targets[key[0]]]
                    for row in rows:
                        broker.put_message(
                            target_message(
                                row,
                                to_topic,
                                config.replay_id,
                                config.selector_property,
                                queue_nums[broker.broker_name],
                            )
                        )
                    outcome.rows += len(rows)
                for broker in brokers.values():
                    broker.flush()
                write_progress(lake, config.replay_id, progress_after(ranges, batch + 1, config.batch_rows))
            job_run.output_versions[COMMITLOG.name] = lake.version(COMMITLOG) or 0
    finally:
        for broker in brokers.values():
            broker.shutdown()
    log_df = lake.read(COMMITLOG, partition_filter={"broker_name": sorted(set(targets.values()))})
    replayed = build_replayed_from_topic(log_df, config.replay_id, to_topic).toArrow()
    return _finish_report(state, job_run, [replayed], _expected(state, ranges, from_resume=False), outcome)


def _start_brokers(root: Path, names: Sequence[str]) -> dict[str, Broker]:
    """Start a broker for each target name, with the store host it had before (msg ids stay)."""
    starts = read_table(root, BROKERS, ["broker_name", "store_host", "started_timestamp"]).to_pylist()
    hosts = {r["broker_name"]: r["store_host"] for r in sorted(starts, key=lambda r: r["started_timestamp"])}
    started: dict[str, Broker] = {}
    try:
        for name in names:
            config = BrokerConfig(root, name, store_host=hosts.get(name, BrokerConfig.store_host))
            try:
                started[name] = Broker(config).start()
            except BrokerLockedError as err:
                raise BrokerLockedError(
                    f"the topic sink writes through its own broker {name!r}, but {err}; or replay into a Delta "
                    "table (--to-table) and send from there"
                ) from err
    except BaseException:
        for broker in started.values():
            broker.shutdown()
        raise
    return started


def _prepare_target_topic(
    brokers: Mapping[str, Broker],
    bounds: Sequence[QueueBounds],
    targets: Mapping[str, str],
    to_topic: str,
    selector_property: str | None,
) -> dict[str, int]:
    """Create (or, for same queue ids, grow) the target topic on every target broker; its queue
    count per broker."""
    needed: dict[str, int] = {}
    for bound in bounds:
        name = targets[bound.broker_name]
        needed[name] = max(needed.get(name, 1), bound.queue_id + 1)
    counts = {}
    for name, broker in brokers.items():
        existing = broker.queue_nums(to_topic)
        if existing is None or (selector_property is None and existing < needed.get(name, 1)):
            broker.create_topic(to_topic, max(existing or 0, needed.get(name, 1)))
        counts[name] = broker.queue_nums(to_topic) or 1
    return counts


def target_message(
    row: Row, to_topic: str, replay_id: str, selector_property: str | None, queue_nums: int
) -> InnerMessage:
    """The message a broker sink stores for a source row: stored body, flag and compression bits,
    properties without delay and transaction markers plus ``REPLAY_ID`` and ``REPLAY_SOURCE``."""
    properties = {k: v for k, v in (row["properties"] or {}).items() if k not in _DROPPED_PROPERTIES}
    key = (row["broker_name"], row["topic"], row["queue_id"])
    properties[REPLAY_ID_PROPERTY] = replay_id
    properties[REPLAY_SOURCE_PROPERTY] = format_source(key, row["queue_offset"])
    queue_id = (
        row["queue_id"]
        if selector_property is None
        else select_queue_id(properties.get(selector_property), row["queue_id"], queue_nums)
    )
    return InnerMessage(
        topic=to_topic,
        queue_id=queue_id,
        body=bytes(row["body"]),
        properties=properties,
        flag=row["flag"],
        sys_flag=row["sys_flag"] & _KEPT_SYS_FLAG,
        born_timestamp=row["born_timestamp"],
        born_host=row["born_host"],
    )


def find_replayed(
    brokers: Mapping[str, Broker],
    ranges: Sequence[QueueRange],
    targets: Mapping[str, str],
    to_topic: str,
    replay_id: str,
    progress: Mapping[QueueKey, Progress],
    queue_nums: Mapping[str, int],
    selector: bool,
) -> dict[QueueKey, int]:
    """The last source offset per source queue that the target queues already hold for
    ``replay_id``, read from each target queue's messages stored since the source queues' last
    progress row (less :data:`TAIL_SCAN_MARGIN_MS`). Queues without progress were never sent."""
    since: dict[str, int] = {}
    wanted: dict[str, set[int]] = {}
    for r in ranges:
        known = progress.get(r.key)
        if known is None:
            continue
        name = targets[r.broker_name]
        since[name] = min(since.get(name, known.updated_timestamp), known.updated_timestamp)
        ids = range(queue_nums[name]) if selector else [r.queue_id]
        wanted.setdefault(name, set()).update(ids)
    found: dict[QueueKey, int] = {}
    for name, queue_ids in wanted.items():
        store = brokers[name].store
        for queue_id in sorted(queue_ids):
            start = store.offset_by_time(to_topic, queue_id, since[name] - TAIL_SCAN_MARGIN_MS)
            for offset in range(start, store.max_offset(to_topic, queue_id)):
                message = store.message_at(to_topic, queue_id, offset, decompress=False)
                if message is None or message.properties.get(REPLAY_ID_PROPERTY) != replay_id:
                    continue
                source = parse_source(message.properties.get(REPLAY_SOURCE_PROPERTY, ""))
                if source is not None:
                    found[source[0]] = max(found.get(source[0], -1), source[1])
    return found


# ---------------------------------------------------------------------------------------------
# The printed report
# ---------------------------------------------------------------------------------------------

_REPORT_HEADER = (
    "broker_name",
    "topic",
    "queue_id",
    "source_rows",
    "rows",
    "first_offset",
    "last_offset",
    "gaps",
    "duplicates",
    "order_preserved",
    "complete",
)


def format_report(rows: Sequence[Mapping[str, Any]], replay_id: str, sink: str) -> list[str]:
    """The ordering report as printed: a header line, one line per queue, a total line."""
    lines = [f"ordering report of replay {replay_id!r} into {sink}: {len(rows)} queues"]
    cells = [_REPORT_HEADER] + [
        tuple(
            "-" if row[n] is None else str(row[n]).lower() if isinstance(row[n], bool) else str(row[n])
            for n in _REPORT_HEADER
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_REPORT_HEADER))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in cells]
    total = sum(int(row["rows"]) for row in rows)
    incomplete = [row for row in rows if not row["complete"]]
    verdict = "every queue complete, in order" if not incomplete else f"{len(incomplete)} queue(s) not complete"
    lines.append(f"total: {total} rows; {verdict}")
    return lines


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def _now() -> int:
    return time.time_ns() // 1_000_000


def build_parser() -> argparse.ArgumentParser:
    """Options of ``replay_ordered``."""
    parser = job_parser(JOB, __doc__)
    parser.add_argument("--replay-id", required=True, help="name of the replay ([A-Za-z0-9_.-], up to 64)")
    source = parser.add_argument_group("source (one of --topic, --group, --dlq)")
    source.add_argument("--topic", action="append", default=[], help="T or T:0,1 (repeatable)")
    source.add_argument("--group", help="replay the group's backlog: committed offsets to the end")
    source.add_argument("--dlq", action="store_true", help="replay rows of the dlq table")
    source.add_argument("--dlq-group", action="append", default=[], help="dlq rows of this group (repeatable)")
    source.add_argument("--broker", action="append", default=[], help="source brokers only (repeatable)")
    source.add_argument("--from-offset", type=int, help="first queue offset (--topic)")
    source.add_argument("--to-offset", type=int, help="end queue offset, exclusive (--topic)")
    source.add_argument("--from-time", help="epoch ms or ISO-8601 with a zone (--topic)")
    source.add_argument("--to-time", help="end time, exclusive: epoch ms or ISO-8601 with a zone (--topic)")
    sink = parser.add_argument_group("sink (one of --to-topic, --to-table, --handler)")
    sink.add_argument("--to-topic", help="replay into this topic (same queue id, or --selector-property)")
    sink.add_argument("--selector-property", help="choose the target queue by the hash of this property")
    sink.add_argument("--to-broker", help="target broker (default: the source queue's broker)")
    sink.add_argument("--to-table", help="replay into a Delta table: a path, or a name under the lake root")
    sink.add_argument("--handler", help="module:function called per queue and batch in order")
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=DEFAULT_BATCH_ROWS,
        help=f"queue offsets per queue and batch: the progress granularity (default {DEFAULT_BATCH_ROWS})",
    )
    parser.add_argument(
        "--max-attempts",
        type=int,
        default=DEFAULT_MAX_ATTEMPTS,
        help=f"handler deliveries of a batch before its queue fails (default {DEFAULT_MAX_ATTEMPTS})",
    )
    return parser


def build_config(argv: Sequence[str] | None = None) -> ReplayConfig:
    """The config of ``argv``.

    Raises:
        ValidationError: a bad option value or combination.
        SystemExit: argparse usage errors and ``--help``.
    """
    args = build_parser().parse_args(argv)
    chosen = [
        name
        for name, given in (("--topic", bool(args.topic)), ("--group", args.group is not None), ("--dlq", args.dlq))
        if given
    ]
    if len(chosen) != 1:
        raise ValidationError("source", chosen, "give exactly one source", "--topic, --group or --dlq")
    source = {"--topic": "queues", "--group": "backlog", "--dlq": "dlq"}[chosen[0]]
    lake = Path(args.lake)
    return ReplayConfig(
        replay_id=args.replay_id,
        lake=lake,
        source=source,
        topics=tuple(parse_topic(t) for t in args.topic),
        brokers=tuple(args.broker),
        from_offset=args.from_offset,
        to_offset=args.to_offset,
        from_time=None if args.from_time is None else parse_instant(args.from_time, "--from-time"),
        to_time=None if args.to_time is None else parse_instant(args.to_time, "--to-time"),
        group=args.group,
        dlq_groups=tuple(args.dlq_group),
        to_topic=args.to_topic,
        selector_property=args.selector_property,
        to_broker=args.to_broker,
        to_table=None if args.to_table is None else resolve_sink_path(lake, args.to_table),
        handler=args.handler,
        batch_rows=args.batch_rows,
        max_attempts=args.max_attempts,
        engine=args.engine,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` (before starting Spark), build the session, run.
    Returns 1 when a handler queue failed (the other queues completed), else 0."""
    job_run = run_spark_job(JOB, build_config(argv), run)
    return 1 if job_run.status == "FAILED" else 0
