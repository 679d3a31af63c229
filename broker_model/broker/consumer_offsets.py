"""The broker's consumer offsets (RocketMQ's ConsumerOffsetManager): commits in memory at once,
persisted to the lake's offset ledger.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker_model.common import OFFSET_NOT_FOUND, GroupQueueKey
from broker_model.store import OffsetCommit, OffsetLedger
from schemas.errors import ValidationError


class ConsumerOffsetManager:
    """The broker's clustering offsets (``ConsumerOffsetManager``), persisted in batches."""

    def __init__(self, lake: str | Path, broker_name: str, clock: Callable[[], int] | None = None) -> None:
        self.broker_name = broker_name
        self.ledger = OffsetLedger(lake, clock, broker_name)
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._pending: dict[GroupQueueKey, OffsetCommit] = {}

    def load(self) -> ConsumerOffsetManager:
        """Read the committed offsets from the lake."""
        self.ledger.load()
        return self

    def commit_offset(
        self, group: str, topic: str, queue_id: int, offset: int, client_id: str | None = None, source: str = "consumer"
    ) -> None:
        """Record ``offset`` as the group's next offset of the queue (a plain overwrite, as
        RocketMQ's; it reaches the lake at the next :meth:`persist`)."""
        if offset < 0:
            raise ValidationError("offset", offset, "must not be negative")
        key = (group, self.broker_name, topic, queue_id)
        with self._lock:
            previous = self._pending.get(key)
            floor = previous.commit_timestamp + 1 if previous is not None else 0
            moment = max(self.ledger.next_timestamp(key), floor)
            commit = OffsetCommit(group, self.broker_name, topic, queue_id, offset, moment, source, client_id)
            self._pending[key] = commit

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset of the queue, -1 when it has none (``queryOffset``).

        Sees unpersisted commits of this broker and rows other processes appended (resets).
        """
        key = (group, self.broker_name, topic, queue_id)
        with self._lock:
            pending = self._pending.get(key)
        self.ledger.refresh()
        current = self.ledger.current(key)
        if pending is not None and (current is None or pending.commit_timestamp >= current[1]):
            return pending.offset
        return current[0] if current is not None else OFFSET_NOT_FOUND

    def persist(self) -> int | None:
        """Append every pending commit in one Delta commit (``persistAll``); returns the version."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        try:
            return self.ledger.append(pending)
        except BaseException:
            with self._lock:  # keep them for the next try unless newer ones came
                for commit in pending:
                    self._pending.setdefault(commit.key, commit)
            raise
