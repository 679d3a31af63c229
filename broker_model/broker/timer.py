"""Timer delivery: RocketMQ 5's timer messages. A message put with a delivery time in the future
waits in ``rmq_sys_wheel_timer`` (queue 0) with ``TIMER_OUT_MS`` (see the put path); this service
stores a copy in its real topic and queue once that millisecond has come, in delivery-time order.

The copy is ``TimerMessageStore.convertMessage``'s: the record's body, flag, sys flag, born fields
and reconsume times, every property but ``REAL_TOPIC``/``REAL_QID``, plus ``TIMER_DEQUEUE_MS``,
``WAIT`` false.

Crash safety (no copy twice, none skipped, whatever kills the broker): the records are delivered
in rounds, each round's copies in ONE put (one atomic commit). The progress file
(``<lake>/_config/<broker>/timerProgress.json``) holds the first timer queue offset not yet
settled and the settled offsets above it; before a round's put it records the round as pending
(its offsets and the commit log offset the put starts after). A service that finds a pending
round looks for its first copy in the real queue after that offset: found, the round counts as
delivered; not found, it is delivered again. See docs/broker.md.
"""

from __future__ import annotations

import heapq
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from broker_model.broker.config import InnerMessage, stored_copy
from broker_model.broker.service import PeriodicService
from broker_model.common import constants as c
from broker_model.common.durable import read_progress, write_json_durably
from broker_model.store import MessageExt
from schemas.errors import ValidationError

if TYPE_CHECKING:
    from broker_model.broker.controller import Broker

_log = logging.getLogger(__name__)

ROUND_SIZE: Final = 32  # copies stored per put (one atomic commit)
INTERVAL_MS: Final = 10  # how often the service looks for due records


def timer_progress_path(lake: str | Path, broker_name: str) -> Path:
    """Where a broker's timer progress lives."""
    return Path(lake) / "_config" / broker_name / "timerProgress.json"


def delivery_copy(record: MessageExt, now: int) -> InnerMessage | None:
    """The copy of a timer record for its real topic and queue, None when it names none."""
    properties = dict(record.properties)
    real_topic = properties.pop(c.PROPERTY_REAL_TOPIC, None)
    real_queue = properties.pop(c.PROPERTY_REAL_QUEUE_ID, None)
    if real_topic is None or real_queue is None or not real_queue.isdigit():
        return None
    properties[c.PROPERTY_TIMER_DEQUEUE_MS] = str(now)
    return stored_copy(record, real_topic, int(real_queue), properties)


class TimerMessageService(PeriodicService):
    """Timer delivery of one broker (see the module docstring). :meth:`deliver_due` delivers what
    is due at an explicit ``now``; :meth:`start` runs it on the broker's clock every
    ``interval_ms``. Creating the service reads the progress and settles a pending round, so the
    broker must be started."""

    thread_name = "timer"

    def __init__(
        self,
        broker: Broker,
        *,
        path: str | Path | None = None,
        interval_ms: int = INTERVAL_MS,
        round_size: int = ROUND_SIZE,
    ) -> None:
        if round_size < 1:
            raise ValidationError("round_size", round_size, "must be at least 1")
        super().__init__(broker, interval_ms, interval_ms)
        self.path = Path(path) if path is not None else timer_progress_path(broker.config.lake, broker.broker_name)
        self.round_size = round_size
        self._lock = threading.Lock()
        self._floor = 0  # every timer queue offset below it is settled
        self._settled: set[int] = set()  # settled offsets at or above the floor
        self._scanned = 0  # timer queue offsets below it are in the heap or settled
        self._heap: list[tuple[int, int]] = []  # (delivery time, timer queue offset) waiting
        self._load()

    # -- progress ---------------------------------------------------------------------------------

    def _load(self) -> None:
        def parse(data: dict[str, Any]) -> tuple[int, set[int], Any]:
            return int(data.get("floor", 0)), {int(o) for o in data.get("settled", [])}, data.get("pending")

        read = read_progress(self.path, "timer", "to deliver every timer message again from the start", parse)
        if read is None:
            return
        self._floor, self._settled, pending = read
        self._scanned = self._floor
        if pending:
            offsets = [int(o) for o in pending["offsets"]]
            if self._round_stored(offsets, int(pending["log_offset"])):
                self._settle(offsets)
            self._save(None)

    def _save(self, pending: dict[str, Any] | None) -> None:
        """Replace the progress file atomically and durably (temp file, fsync, rename, fsync)."""
        data: dict[str, Any] = {"floor": self._floor, "settled": sorted(self._settled)}
        if pending is not None:
            data["pending"] = pending
        write_json_durably(self.path, data)

    def _settle(self, offsets: list[int]) -> None:
        self._settled.update(offsets)
        while self._floor in self._settled:
            self._settled.remove(self._floor)
            self._floor += 1

    def _round_stored(self, offsets: list[int], log_offset: int) -> bool:
        """Whether the pending round's put landed: the copy of its first deliverable record is in
        its real queue at or after ``log_offset`` (a round is stored all or none)."""
        store = self.broker.store
        self.broker.flush()
        for offset in offsets:
            record = store.message_at(c.TIMER_TOPIC, 0, offset, decompress=False)
            copy = None if record is None else delivery_copy(record, 0)
            if record is None or copy is None:
                continue
            position = store.max_offset(copy.topic, copy.queue_id) - 1
            while position >= 0:
                landed = store.message_at(copy.topic, copy.queue_id, position, decompress=False)
                if landed is None or landed.commit_log_offset < log_offset:
                    return False
                if (landed.uniq_key, landed.born_timestamp, landed.body_crc) == (
                    record.uniq_key,
                    record.born_timestamp,
                    record.body_crc,
                ) and landed.properties.get(c.PROPERTY_TIMER_OUT_MS) == record.properties.get(c.PROPERTY_TIMER_OUT_MS):
                    return True
                position -= 1
            return False
        return True  # nothing deliverable in it: nothing to look for

    # -- delivery ---------------------------------------------------------------------------------

    def waiting(self) -> int:
        """Timer records not delivered yet (as far as the service has read the timer queue)."""
        with self._lock:
            self._scan()
            return len(self._heap)

    def delivered_through(self, now: int) -> int:
        """A time at or before ``now`` by which every timer record stored so far is delivered when
        due: the revive service waits for it before it counts a checkpoint's acks as all in."""
        with self._lock:
            self._scan()
            return min(now, self._heap[0][0] - 1) if self._heap else now

    def deliver_due(self, now: int) -> int:
        """Deliver every timer record due at ``now`` (epoch ms); the copies stored.

        Raises:
            BrokerError, CommitFailedError: the broker could not store a round; the progress then
                says exactly what was stored, and the next call carries on from there.
        """
        delivered = 0
        with self._lock:
            self._scan()
            while self._heap and self._heap[0][0] <= now:
                delivered += self._round(now)
        return delivered

    def _scan(self) -> None:
        """Read the timer records appended since the last scan into the heap (those still in a
        pending commit come with a later scan)."""
        store = self.broker.store
        end = store.max_offset(c.TIMER_TOPIC, 0)
        for offset in range(max(self._scanned, self._floor), end):
            if offset in self._settled:
                continue
            record = store.message_at(c.TIMER_TOPIC, 0, offset, decompress=False)
            text = None if record is None else record.properties.get(c.PROPERTY_TIMER_OUT_MS)
            if text is None or not text.lstrip("-").isdigit():
                _log.warning("timer record %s has no delivery time: left undelivered", offset)
                self._settle([offset])
                continue
            heapq.heappush(self._heap, (int(text), offset))
        self._scanned = max(self._scanned, end)

    def _round(self, now: int) -> int:
        """Deliver up to ``round_size`` due records in one put; the copies stored."""
        store = self.broker.store
        taken: list[int] = []
        copies: list[InnerMessage] = []
        while self._heap and self._heap[0][0] <= now and len(taken) < self.round_size:
            _, offset = heapq.heappop(self._heap)
            record = store.message_at(c.TIMER_TOPIC, 0, offset, decompress=False)
            copy = None if record is None else delivery_copy(record, now)
            if copy is None:
                _log.warning("timer record %s names no real topic and queue: dropped", offset)
            else:
                copies.append(copy)
            taken.append(offset)
        log_offset = self.broker.next_commit_log_offset
        self._save({"offsets": taken, "log_offset": log_offset})
        if copies:
            try:
                for topic in sorted({copy.topic for copy in copies}):
                    self.broker.ensure_topic(topic)
                self.broker.put_messages(copies)
                self.broker.flush()
            except BaseException:
                if self._round_stored(taken, log_offset):
                    self._settle(taken)
                else:
                    for offset in taken:  # waiting again
                        record = store.message_at(c.TIMER_TOPIC, 0, offset, decompress=False)
                        if record is not None:
                            heapq.heappush(self._heap, (int(record.properties[c.PROPERTY_TIMER_OUT_MS]), offset))
                self._save(None)
                raise
        self._settle(taken)
        self._save(None)
        return len(copies)

    # -- the background thread --------------------------------------------------------------------

    def run_round(self, now: int) -> object:
        """One pass of the service at ``now`` (:meth:`deliver_due`)."""
        return self.deliver_due(now)
