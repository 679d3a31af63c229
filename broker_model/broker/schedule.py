"""Delayed delivery: the broker's ``ScheduleMessageService``. A message put with a DELAY level waits
in ``SCHEDULE_TOPIC_XXXX`` (queue level - 1) and this service moves it back to its real topic and
queue when its time comes, each level in queue order, the due entries of every level stored
together in one put per round, keeping its progress per level in ``delayOffset.json``. Its owner
starts it (it attaches to the broker). See docs/broker.md.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_model.broker.config import InnerMessage, stored_copy
from broker_model.broker.service import PeriodicService
from broker_model.common import constants as c
from broker_model.common import consume_queue_tags_code, delay_progress_path, level_delay_ms, validate_name
from broker_model.common.durable import read_progress, write_json_durably
from broker_model.store import MessageExt
from schemas.errors import ValidationError

if TYPE_CHECKING:
    from broker_model.broker.controller import Broker

_log = logging.getLogger(__name__)

DELIVER_BATCH_SIZE = 256  # copies of each level a round takes (dropped entries aside); a round is one put
_CLEARED_ON_DELIVERY = (c.PROPERTY_DELAY_TIME_LEVEL, c.PROPERTY_TIMER_DELIVER_MS, c.PROPERTY_TIMER_DELAY_SEC)


def progress_path(lake: str | Path, broker_name: str) -> Path:
    """Where a broker's delay progress file lives."""
    return delay_progress_path(lake, broker_name)


def deliver_timestamp(record: MessageExt) -> int:
    """The tags code the consume queue holds for a schedule record: its delivery time from its
    DELAY level (capped at 18) when that is a positive number, else the Java hash of its TAGS."""
    delay = record.properties.get(c.PROPERTY_DELAY_TIME_LEVEL)
    return consume_queue_tags_code(c.SCHEDULE_TOPIC, record.tags, delay, record.store_timestamp)


def correct_deliver_timestamp(now: int, deliver_ts: int, level: int) -> int:
    """``correctDeliverTimestamp``: a delivery time beyond ``now`` + the level's delay is ``now``."""
    delay = level_delay_ms(level)
    latest = now + (c.UNKNOWN_LEVEL_DELAY_MS if delay is None else delay)
    return now if deliver_ts > latest else deliver_ts


def _pending_ranges(pending: dict[str, Any]) -> list[tuple[int, int, int]]:
    """The ``(level, from, to)`` ranges of a pending entry of the progress file."""
    if "ranges" in pending:
        return [(int(level), int(start), int(end)) for level, start, end in pending["ranges"]]
    return [(int(pending["level"]), int(pending["from"]), int(pending["to"]))]


def restore_message(record: MessageExt) -> InnerMessage | None:
    """``messageTimeUp``: the message to store in the record's real topic and queue, or None when
    the record must be dropped (real topic is the half topic, REAL_TOPIC / REAL_QID missing or
    invalid)."""
    properties = dict(record.properties)
    real_topic = properties.get(c.PROPERTY_REAL_TOPIC)
    real_queue = properties.get(c.PROPERTY_REAL_QUEUE_ID)
    if real_topic is None or real_topic == c.RMQ_SYS_TRANS_HALF_TOPIC:
        return None
    if real_queue is None or not real_queue.isdigit() or int(real_queue) > 1023:
        return None
    try:
        validate_name(real_topic, "REAL_TOPIC", 255)
    except ValidationError:
        return None
    for key in _CLEARED_ON_DELIVERY:
        properties.pop(key, None)
    return stored_copy(record, real_topic, int(real_queue), properties)


@dataclass
class DeliveryReport:
    """What one :meth:`ScheduleMessageService.deliver_due` call did."""

    delivered: Counter[int] = field(default_factory=Counter)  # level -> copies stored
    dropped: list[tuple[int, int]] = field(default_factory=list)  # (level, queue offset) of dropped records
    offsets: dict[int, int] = field(default_factory=dict)  # level -> progress after the call

    @property
    def total(self) -> int:
        """Copies stored over every level."""
        return sum(self.delivered.values())


class ScheduleMessageService(PeriodicService):
    """Delayed delivery of one broker (see the module docstring).

    :meth:`deliver_due` runs one pass over every level at an explicit ``now`` (tests, replays);
    :meth:`start` runs passes on the broker's clock in a thread (first after 1 s, then every
    100 ms). Thread-safe: passes never overlap. Creating the service reads the progress file and
    settles a round a crash left pending, so the broker must be started.
    """

    thread_name = "schedule"

    def __init__(
        self,
        broker: Broker,
        *,
        path: str | Path | None = None,
        batch_size: int = DELIVER_BATCH_SIZE,
        interval_ms: int = c.SCHEDULE_DELAY_FOR_A_WHILE_MS,
        first_delay_ms: int = c.SCHEDULE_FIRST_DELAY_MS,
    ) -> None:
        if batch_size < 1:
            raise ValidationError("batch_size", batch_size, "must be at least 1")
        super().__init__(broker, interval_ms, first_delay_ms)
        self.path = Path(path) if path is not None else progress_path(broker.config.lake, broker.broker_name)
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._offsets: dict[int, int] = {}
        self._load()

    # -- progress ---------------------------------------------------------------------------------

    def offset(self, level: int) -> int:
        """The next schedule queue offset of ``level`` to deliver."""
        with self._lock:
            return self._offsets.get(level, 0)

    def offsets(self) -> dict[int, int]:
        """Progress of every level that has any."""
        with self._lock:
            return dict(self._offsets)

    def _load(self) -> None:
        """Read the progress file and settle a pending round: a round saves its ranges as pending
        before its put and the new offsets after; pending ranges found at start are delivered when
        their copies landed in their real queues at or after the logged commit log offset, else
        they are delivered again (docs/broker.md). A pending entry of one level (``level``,
        ``from``, ``to``), as files written before rounds spanned levels hold, is read too.

        Raises:
            BrokerError: the file exists but is not valid progress JSON.
        """

        def parse(data: dict[str, Any]) -> tuple[dict[int, int], Any, list[tuple[int, int, int]], int]:
            offsets = {int(level): int(offset) for level, offset in data.get("offsetTable", {}).items()}
            pending = data.get("pending")
            ranges = _pending_ranges(pending) if pending else []
            return offsets, pending, ranges, int(pending["log_offset"]) if pending else 0

        read = read_progress(self.path, "schedule", "to deliver every delayed message again from the start", parse)
        if read is None:
            return
        offsets, pending, ranges, log_offset = read
        self._offsets = offsets
        if pending:
            self._settle(ranges, log_offset)
            self._save(None)

    def _save(self, pending: dict[str, Any] | None) -> None:
        """Replace the progress file atomically and durably (temp file, fsync, rename, fsync)."""
        data: dict[str, Any] = {"offsetTable": {str(k): v for k, v in sorted(self._offsets.items())}}
        if pending is not None:
            data["pending"] = pending
        write_json_durably(self.path, data)

    def _settle(self, ranges: list[tuple[int, int, int]], log_offset: int) -> None:
        """Set each level's progress after a round whose put may or may not have landed: to the end
        of its range when the round's copies are stored, else to its start."""
        done = self._ranges_delivered(ranges, log_offset)
        for level, start, end in ranges:
            self._offsets[level] = end if done else start

    def _ranges_delivered(self, ranges: list[tuple[int, int, int]], log_offset: int) -> bool:
        """True when the copies of the schedule queue ranges ``(level, from, to)`` of one round are
        stored (all or none are: they were one put). A round with nothing deliverable counts as
        done."""
        store = self.broker.store
        for level, start, end in ranges:
            for position in range(start, end):
                record = store.message_at(c.SCHEDULE_TOPIC, level - 1, position, decompress=False)
                copy = None if record is None else restore_message(record)
                if record is not None and copy is not None:
                    return self._copy_stored(record, copy, log_offset)
        return True

    def _copy_stored(self, record: MessageExt, copy: InnerMessage, log_offset: int) -> bool:
        """Whether ``record``'s copy is in its real queue at or after ``log_offset``."""
        store = self.broker.store
        position = store.max_offset(copy.topic, copy.queue_id) - 1
        while position >= 0:
            landed = store.message_at(copy.topic, copy.queue_id, position, decompress=False)
            if landed is None or landed.commit_log_offset < log_offset:
                return False
            if (landed.uniq_key, landed.born_timestamp, landed.body_crc, landed.reconsume_times) == (
                record.uniq_key,
                record.born_timestamp,
                record.body_crc,
                record.reconsume_times,
            ) and c.PROPERTY_REAL_TOPIC in landed.properties:
                return True
            position -= 1
        return False

    # -- delivery ---------------------------------------------------------------------------------

    def deliver_due(self, now: int) -> DeliveryReport:
        """Deliver every record of every level that is due at ``now`` (epoch ms).

        Raises:
            BrokerError, CommitFailedError: the broker could not store the copies; the progress
                then says exactly what was stored, and the next call carries on from there.
        """
        report = DeliveryReport()
        with self._lock:
            while self._deliver_round(now, report):
                pass
            report.offsets = dict(self._offsets)
        return report

    def next_delivery_time(self) -> int | None:
        """The earliest delivery time (epoch ms, as stored: before ``correctDeliverTimestamp``)
        of the records waiting at each level's progress offset; None when nothing waits."""
        store = self.broker.store
        self.broker.flush()
        times = []
        with self._lock:
            for level in range(1, c.MAX_DELAY_LEVEL + 1):
                record = store.message_at(c.SCHEDULE_TOPIC, level - 1, self._offsets.get(level, 0), decompress=False)
                if record is not None:
                    times.append(deliver_timestamp(record))
        return min(times, default=None)

    def _deliver_round(self, now: int, report: DeliveryReport) -> bool:
        """Deliver up to ``batch_size`` due records of every level in one put; True when some
        level filled its batch (more may be due)."""
        log_offset = self.broker.next_commit_log_offset  # read BEFORE the flush: everything below it is then durable
        self.broker.flush()
        ranges: list[tuple[int, int, int]] = []
        copies: list[InnerMessage] = []
        counts: Counter[int] = Counter()
        full = False
        for level in range(1, c.MAX_DELAY_LEVEL + 1):
            start = self._offsets.get(level, 0)
            end, level_copies = self._due_range(level, start, now, report)
            if end > start:
                ranges.append((level, start, end))
                copies.extend(level_copies)
                counts[level] = len(level_copies)
                full = full or len(level_copies) == self.batch_size
        if not ranges:
            return False
        self._save({"ranges": [list(r) for r in ranges], "log_offset": log_offset})
        if copies:
            try:
                self._store(copies)
            except BaseException:
                self._settle(ranges, log_offset)
                self._save(None)
                raise
        for level, _, end in ranges:
            self._offsets[level] = end
        self._save(None)
        report.delivered.update(counts)
        return full

    def _due_range(self, level: int, start: int, now: int, report: DeliveryReport) -> tuple[int, list[InnerMessage]]:
        """The end of the due run of ``level`` from ``start`` (at most ``batch_size`` copies) and
        its copies; records to drop are passed over and reported."""
        store, queue_id = self.broker.store, level - 1
        max_offset = store.max_offset(c.SCHEDULE_TOPIC, queue_id)
        copies: list[InnerMessage] = []
        position = start
        while position < max_offset and len(copies) < self.batch_size:
            record = store.message_at(c.SCHEDULE_TOPIC, queue_id, position, decompress=False)
            if record is None or correct_deliver_timestamp(now, deliver_timestamp(record), level) > now:
                break
            copy = restore_message(record)
            if copy is None:
                _log.warning(
                    "dropped schedule record %s of level %s: real topic %r",
                    position,
                    level,
                    record.properties.get(c.PROPERTY_REAL_TOPIC),
                )
                report.dropped.append((level, position))
            else:
                copies.append(copy)
            position += 1
        return position, copies

    def _store(self, copies: list[InnerMessage]) -> None:
        """Store ``copies`` in one put (one atomic commit) and wait until it is durable."""
        for topic in sorted({copy.topic for copy in copies}):
            self.broker.ensure_topic(topic)
        self.broker.put_messages(copies)
        self.broker.flush()

    # -- the background thread --------------------------------------------------------------------

    def run_round(self, now: int) -> object:
        """One round of the service at ``now`` (:meth:`deliver_due`)."""
        return self.deliver_due(now)
