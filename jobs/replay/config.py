"""The options of a replay: the source (topic queues, a group's backlog or dead letters), the range,
the sink (a Delta table, a broker topic or a handler), batching and retries; parsed and checked
before anything runs. See docs/jobs.md (replay_ordered).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from broker_model.common import (
    QUEUE_KEY,
    parse_instant,
    validate_group,
    validate_name,
    validate_topic,
)
from broker_model.common import constants as c
from jobs.cli import job_parser
from jobs.lake import (
    ENGINES,
)
from schemas.catalog import (
    COMMITLOG,
    TABLES,
    TableSpec,
)
from schemas.catalog import (
    Column as CatalogColumn,
)
from schemas.errors import ValidationError

JOB = "replay_ordered"


REPLAY_ID_PROPERTY = "REPLAY_ID"  # names the replay on every message a broker sink stores


REPLAY_SOURCE_PROPERTY = "REPLAY_SOURCE"  # broker/topic/queue_id/queue_offset of the source message


SOURCE_SEPARATOR = "/"  # never in a topic or broker name (charset [%|a-zA-Z0-9_-])


DEFAULT_BATCH_ROWS = 10_000


DEFAULT_MAX_ATTEMPTS = 16  # the concurrent consumer's 16 reconsumes: a queue gives up after as many tries


TAIL_SCAN_MARGIN_MS = 1000  # the target is read from this long before the last progress row (clock jitter)


MAX_PARTITIONS = 256  # one Spark partition per source queue, up to this many


SOURCES = ("queues", "backlog", "dlq")


BATCH_DIR_KEY = "replay_batch_dir"  # the staging directory key of a batch's files (a copy of replay_batch)


_REPLAY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


# a replayed message is delivered now, as a plain message: no delay, no transaction markers
DROPPED_PROPERTIES = (
    c.PROPERTY_DELAY_TIME_LEVEL,
    c.PROPERTY_REAL_TOPIC,
    c.PROPERTY_REAL_QUEUE_ID,
    c.PROPERTY_TRANSACTION_PREPARED,
)


KEPT_SYS_FLAG = c.COMPRESSED_FLAG | c.COMPRESSION_TYPE_MASK | c.MULTI_TAGS_FLAG


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
        for selected in self.topics:
            validate_topic(selected.topic)
            if selected.queue_ids is not None and (not selected.queue_ids or min(selected.queue_ids) < 0):
                raise ValidationError("--topic", f"{selected.topic}:{selected.queue_ids}", "queue ids must be >= 0")
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
            if self.to_topic in {selected.topic for selected in self.topics}:
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
