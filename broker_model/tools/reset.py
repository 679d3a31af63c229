"""Consumer offset resets: plan, dry run, execute with an audit trail, export, and undo.

In the style of ``kafka-consumer-groups --reset-offsets`` and ``mqadmin resetOffsetByTime``. A
plan lists, per queue, the current and the target offset and how many messages the move would
deliver again or skip. Targets outside [min offset, max offset] are clamped and the clamp is
reported. Executing appends every move to ``consumer_offset_commits`` in ONE Delta commit, each
row with ``source='reset'``, the reset id, the offset it replaced, the reason and the operator.
Queue bounds and time lookups come from the live commit log (the brokers' consume queues).
"""

from __future__ import annotations

import csv
import getpass
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc

from broker_model.common import GroupQueueKey
from broker_model.store import MessageStore, OffsetCommit, OffsetLedger, read_table
from schemas.catalog import CONSUMER_OFFSET_COMMITS, TOPIC_CONFIG
from schemas.errors import ValidationError

STRATEGIES = (
    "to_earliest",
    "to_latest",
    "to_offset",
    "shift_by",
    "to_timestamp",
    "to_datetime",
    "by_duration",
    "from_file",
)


@dataclass(frozen=True)
class TopicSelection:
    """A topic and, optionally, the queue ids to reset (on every broker holding the topic)."""

    topic: str
    queue_ids: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, text: str) -> TopicSelection:
        """``topic`` or ``topic:0,1``."""
        topic, _, ids = text.partition(":")
        if not topic:
            raise ValidationError("topic", text, "names no topic", "write TOPIC or TOPIC:0,1")
        if not ids:
            return cls(topic)
        try:
            return cls(topic, tuple(sorted({int(q) for q in ids.split(",")})))
        except ValueError:
            raise ValidationError("topic", text, "has queue ids that are not integers", "write TOPIC:0,1") from None


@dataclass(frozen=True)
class Strategy:
    """Where to move offsets: ``kind`` is one of :data:`STRATEGIES`; ``value`` is the offset,
    shift, epoch ms (timestamp, datetime and duration are already resolved to a time) or the
    file's targets."""

    kind: str
    value: int = 0
    file_targets: dict[tuple[str | None, str, str, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanRow:
    """One queue of a reset plan."""

    group: str
    broker_name: str
    topic: str
    queue_id: int
    current: int  # -1 when the group has no offset on the queue
    target: int
    min_offset: int
    max_offset: int
    note: str = ""

    @property
    def redelivered(self) -> int:
        """Messages the group will consume again."""
        return max(0, self.current - self.target) if self.current >= 0 else 0

    @property
    def skipped(self) -> int:
        """Messages the group will never consume."""
        base = self.current if self.current >= 0 else self.min_offset
        return max(0, self.target - base)

    @property
    def moves(self) -> bool:
        """True when the target differs from the current offset."""
        return self.target != self.current


class ResetTool:
    """Plans and applies resets on one lake."""

    def __init__(self, lake: str | Path, clock: Callable[[], int] | None = None) -> None:
        self.lake = Path(lake)
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self.ledger = OffsetLedger(self.lake, self._clock).load()
        self._stores: dict[str, MessageStore] = {}

    def store(self, broker_name: str) -> MessageStore:
        """The consume queues of ``broker_name`` as of now."""
        if broker_name not in self._stores:
            self._stores[broker_name] = MessageStore(self.lake, broker_name).load()
        return self._stores[broker_name]

    def plan(
        self, groups: Sequence[str], topics: Sequence[TopicSelection], all_topics: bool, strategy: Strategy
    ) -> list[PlanRow]:
        """The plan of a reset (nothing is written).

        Raises:
            ValidationError: an unknown group or topic, no topic chosen, or a strategy value
                that makes no sense (e.g. a file row naming a queue that does not exist).
        """
        _check_strategy(strategy)
        rows = []
        for group in groups:
            for broker_name, topic, queue_id in self._queues_of(group, topics, all_topics):
                rows.append(self._row(group, broker_name, topic, queue_id, strategy))
        if strategy.kind == "from_file":
            self._check_file_used(strategy, rows)
        return sorted(rows, key=lambda r: (r.group, r.topic, r.broker_name, r.queue_id))

    def _queues_of(self, group: str, topics: Sequence[TopicSelection], all_topics: bool) -> list[tuple[str, str, int]]:
        committed = [key for key in self.ledger.keys() if key[0] == group]
        if not committed:
            known = sorted({key[0] for key in self.ledger.keys()})
            raise ValidationError(
                "group",
                group,
                "has no committed offset on any broker of this lake",
                f"check the name; groups with offsets: {known}",
            )
        if all_topics:
            topics = [TopicSelection(t) for t in sorted({key[2] for key in committed})]
        if not topics:
            raise ValidationError("topic", None, "no topic chosen", "give --topic TOPIC[:QUEUES] or --all-topics")
        queues: list[tuple[str, str, int]] = []
        layout = self._topic_layout()
        for selection in topics:
            brokers = layout.get(selection.topic)
            if not brokers:
                raise ValidationError(
                    "topic",
                    selection.topic,
                    "does not exist on any broker of this lake",
                    f"known topics: {sorted(layout)}",
                )
            for broker_name, queue_nums in sorted(brokers.items()):
                ids = selection.queue_ids if selection.queue_ids is not None else tuple(range(queue_nums))
                queues.extend((broker_name, selection.topic, q) for q in ids if q < queue_nums)
        return queues

    def _topic_layout(self) -> dict[str, dict[str, int]]:
        """{topic: {broker_name: queue count}} from the topic configs, widened by queues seen in
        the log and in offsets."""
        layout: dict[str, dict[str, int]] = {}
        config = read_table(self.lake, TOPIC_CONFIG).sort_by("updated_timestamp").to_pylist()
        for row in config:
            layout.setdefault(row["topic"], {})[row["broker_name"]] = row["queue_nums"]
        for _, broker_name, topic, queue_id in self.ledger.keys():
            brokers = layout.setdefault(topic, {})
            brokers[broker_name] = max(brokers.get(broker_name, 0), queue_id + 1)
        return layout

    def _row(self, group: str, broker_name: str, topic: str, queue_id: int, strategy: Strategy) -> PlanRow:
        store = self.store(broker_name)
        low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        latest_commit = self.ledger.current((group, broker_name, topic, queue_id))
        current = latest_commit[0] if latest_commit is not None else -1
        wanted, note = self._wanted(store, group, broker_name, topic, queue_id, current, low, strategy)
        target = min(max(wanted, low), high)
        if target != wanted:
            note = _join(note, f"clamped from {wanted} to [{low}, {high}]")
        return PlanRow(group, broker_name, topic, queue_id, current, target, low, high, note)

    def _wanted(
        self,
        store: MessageStore,
        group: str,
        broker_name: str,
        topic: str,
        queue_id: int,
        current: int,
        low: int,
        strategy: Strategy,
    ) -> tuple[int, str]:
        kind = strategy.kind
        if kind == "to_earliest":
            return low, ""
        if kind == "to_latest":
            return store.max_offset(topic, queue_id), ""
        if kind == "to_offset":
            return strategy.value, ""
        if kind == "shift_by":
            if current < 0:
                return low + strategy.value, "no current offset: shifted from the min offset"
            return current + strategy.value, ""
        if kind == "from_file":
            target = strategy.file_targets.get((group, broker_name, topic, queue_id))
            if target is None:
                target = strategy.file_targets.get((None, broker_name, topic, queue_id))
            if target is None:
                return current if current >= 0 else low, "not in the file: left as it is"
            return target, ""
        return store.offset_by_time(topic, queue_id, strategy.value), ""  # the time strategies

    def _check_file_used(self, strategy: Strategy, rows: list[PlanRow]) -> None:
        planned = {(r.broker_name, r.topic, r.queue_id) for r in rows}
        for group, broker_name, topic, queue_id in strategy.file_targets:
            if (broker_name, topic, queue_id) not in planned:
                raise ValidationError(
                    "from_file",
                    f"{group or '*'},{broker_name},{topic},{queue_id}",
                    "names a queue outside the chosen groups and topics",
                    "add its topic with --topic",
                )

    def execute(self, plan: Sequence[PlanRow], reason: str | None, operator: str | None = None) -> str | None:
        """Write every moving row of ``plan`` in one atomic commit; return the reset id (None
        when nothing moves: then nothing is written)."""
        moving = [row for row in plan if row.moves]
        if not moving:
            return None
        reset_id = f"reset-{uuid.uuid4().hex[:12]}"
        who = operator or f"{getpass.getuser()}@{socket.gethostname()}"
        self.ledger.refresh()
        commits = [
            OffsetCommit(
                *_key(row),
                row.target,
                self.ledger.next_timestamp(_key(row)),
                "reset",
                None,
                reset_id,
                row.current,
                reason,
                who,
            )
            for row in moving
        ]
        self.ledger.append(commits)
        return reset_id

    def undo_plan(self, reset_id: str) -> list[PlanRow]:
        """The plan that puts back the offsets reset ``reset_id`` replaced.

        Queues that had no offset before the reset cannot get "no offset" back; they are left as
        they are and say so.

        Raises:
            ValidationError: no reset with that id.
        """
        commits = read_table(self.lake, CONSUMER_OFFSET_COMMITS)
        rows = commits.filter(pc.equal(commits["reset_id"], reset_id)).to_pylist()
        if not rows:
            raise ValidationError("undo", reset_id, "no reset with this id", "copy the id a reset --execute printed")
        plan = []
        for row in rows:
            key = (row["group"], row["broker_name"], row["topic"], row["queue_id"])
            store = self.store(row["broker_name"])
            current = self.ledger.current(key)
            now = current[0] if current is not None else -1
            previous = row["previous_offset"]
            low, high = store.min_offset(row["topic"], row["queue_id"]), store.max_offset(row["topic"], row["queue_id"])
            if previous is None or previous < 0:
                plan.append(PlanRow(*key, now, now, low, high, "had no offset before the reset: left as it is"))
            else:
                plan.append(PlanRow(*key, now, previous, low, high, f"restores the offset {reset_id} replaced"))
        return sorted(plan, key=lambda r: (r.group, r.topic, r.broker_name, r.queue_id))


def _key(row: PlanRow) -> GroupQueueKey:
    return row.group, row.broker_name, row.topic, row.queue_id


def _join(first: str, second: str) -> str:
    return f"{first}; {second}" if first else second


def _check_strategy(strategy: Strategy) -> None:
    if strategy.kind not in STRATEGIES:
        raise ValidationError("strategy", strategy.kind, "is unknown", f"use one of {STRATEGIES}")
    if strategy.kind == "to_offset" and strategy.value < 0:
        raise ValidationError("to_offset", strategy.value, "must not be negative")


def read_targets_file(path: str | Path) -> dict[tuple[str | None, str, str, int], int]:
    """Targets from a CSV with a header: ``broker_name,topic,queue_id`` and ``target_offset`` (or
    ``offset``), optionally ``group``; a plan exported with ``--export`` is such a file.

    Raises:
        ValidationError: a missing column or a bad value, naming the file and line.
    """
    targets: dict[tuple[str | None, str, str, int], int] = {}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = set(reader.fieldnames or [])
        offset_column = "target_offset" if "target_offset" in columns else "offset"
        missing = {"broker_name", "topic", "queue_id", offset_column} - columns
        if missing:
            raise ValidationError(
                "from_file",
                str(path),
                f"lacks the columns {sorted(missing)}",
                "write a header: broker_name,topic,queue_id,target_offset[,group]",
            )
        for line, row in enumerate(reader, start=2):
            try:
                key = (row.get("group") or None, row["broker_name"], row["topic"], int(row["queue_id"]))
                targets[key] = int(row[offset_column])
            except (TypeError, ValueError):
                raise ValidationError(
                    "from_file", f"{path}:{line}", f"bad row {row}", "queue_id and the offset must be integers"
                ) from None
    return targets


PLAN_COLUMNS = (
    "group",
    "broker_name",
    "topic",
    "queue_id",
    "current_offset",
    "target_offset",
    "min_offset",
    "max_offset",
    "redelivered",
    "skipped",
    "note",
)


def plan_records(plan: Iterable[PlanRow]) -> list[tuple[object, ...]]:
    """The plan as rows of :data:`PLAN_COLUMNS`."""
    return [
        (
            r.group,
            r.broker_name,
            r.topic,
            r.queue_id,
            r.current,
            r.target,
            r.min_offset,
            r.max_offset,
            r.redelivered,
            r.skipped,
            r.note,
        )
        for r in plan
    ]


def export_plan(plan: Iterable[PlanRow], path: str | Path) -> None:
    """Write the plan as CSV (readable again with ``--from-file``)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(PLAN_COLUMNS)
        writer.writerows(plan_records(plan))
