"""Consumer offsets: the broker's clustering offsets in the lake, and the broadcasting local file.

An offset is the next queue offset to consume. Clustering offsets live on the broker that holds
the queue (``ConsumerOffsetManager``): commits update memory at once and are appended to the
``consumer_offset_commits`` table in batches (``persistAll`` every 5 s, and on shutdown). Other
processes (the reset tool) append to the same table; the manager follows its log, so
``query_offset`` sees them. Broadcasting offsets stay with each client in a local JSON file
(``LocalFileOffsetStore``).

Within one (group, broker_name, topic, queue_id) the ``commit_timestamp`` of successive rows is
strictly increasing: a writer whose clock has not moved past the last row uses that time + 1 ms.
The current offset is therefore the row with the greatest ``commit_timestamp``, in any reader.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from broker_model.deltalog import AppendLog, LogTail, ensure_table
from broker_model.errors import RmqLakeError, ValidationError
from broker_model.message import MessageQueue
from schemas.catalog import CONSUMER_OFFSET_COMMITS

PERSIST_CONSUMER_OFFSET_INTERVAL_MS = 5000  # persistConsumerOffsetInterval


class ReadOffsetType(Enum):
    """Where a client reads an offset from."""

    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


# readOffset return codes besides offsets >= 0
OFFSET_NOT_FOUND = -1  # nothing in memory / no offset stored
OFFSET_READ_ERROR = -2  # the store could not be read
OFFSET_BAD_REQUEST = -3  # no queue given, or an unknown read type (5.x)

QueueKey = tuple[str, str, str, int]  # (group, broker_name, topic, queue_id)


@dataclass(frozen=True)
class OffsetCommit:
    """One row of ``consumer_offset_commits``."""

    group: str
    broker_name: str
    topic: str
    queue_id: int
    offset: int
    commit_timestamp: int
    source: str = "consumer"
    client_id: str | None = None
    reset_id: str | None = None
    previous_offset: int | None = None
    reason: str | None = None
    operator: str | None = None

    @property
    def key(self) -> QueueKey:
        """(group, broker_name, topic, queue_id)."""
        return self.group, self.broker_name, self.topic, self.queue_id


def commits_table(commits: Iterable[OffsetCommit]) -> pa.Table:
    """Commit rows as an Arrow table of the ``consumer_offset_commits`` schema."""
    rows = [vars(commit) for commit in commits]
    schema = CONSUMER_OFFSET_COMMITS.arrow_schema
    return pa.Table.from_pylist(rows, schema=schema)


def latest_commits(table: pa.Table) -> dict[QueueKey, tuple[int, int]]:
    """{(group, broker, topic, queue): (offset, commit_timestamp)} of the newest row per queue."""
    latest: dict[QueueKey, tuple[int, int]] = {}
    columns = table.select(["group", "broker_name", "topic", "queue_id", "offset", "commit_timestamp"]).to_pydict()
    for i in range(table.num_rows):
        key = (columns["group"][i], columns["broker_name"][i], columns["topic"][i], columns["queue_id"][i])
        value = (columns["offset"][i], columns["commit_timestamp"][i])
        current = latest.get(key)
        if current is None or value[1] > current[1]:
            latest[key] = value
    return latest


class OffsetLedger:
    """The ``consumer_offset_commits`` table as the latest offset per queue, following its log.

    Used by the broker's offset manager and by the reset tool; thread-safe.
    """

    def __init__(self, lake: str | Path, clock: Callable[[], int] | None = None) -> None:
        self.lake = Path(lake)
        self.path = CONSUMER_OFFSET_COMMITS.location(self.lake)
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.RLock()
        self._latest: dict[QueueKey, tuple[int, int]] = {}
        self._tail: LogTail | None = None
        self._log: AppendLog | None = None

    def load(self) -> OffsetLedger:
        """Read the whole table as of now and follow its log from there."""
        with self._lock:
            try:
                table = DeltaTable(str(self.path))
            except TableNotFoundError:
                self._latest, self._tail = {}, LogTail(self.path, -1)
                return self
            self._tail = LogTail(self.path, table.version())
            self._latest = latest_commits(table.to_pyarrow_table())
        return self

    def refresh(self) -> None:
        """Apply rows other writers appended since the last look."""
        with self._lock:
            if self._tail is None:
                self.load()
                return
            changes = self._tail.poll()
            if changes is None or any(change.removed or change.rewritten for change in changes):
                self.load()
                return
            for change in changes:
                for path, _ in change.added:
                    self._apply(latest_commits(pq.read_table(self.path / path)))

    def _apply(self, rows: dict[QueueKey, tuple[int, int]]) -> None:
        for key, value in rows.items():
            current = self._latest.get(key)
            if current is None or value[1] > current[1]:
                self._latest[key] = value

    def current(self, key: QueueKey) -> tuple[int, int] | None:
        """(offset, commit_timestamp) of the latest commit of a queue, None when there is none."""
        with self._lock:
            return self._latest.get(key)

    def keys(self) -> list[QueueKey]:
        """Every queue with a commit, sorted."""
        with self._lock:
            return sorted(self._latest)

    def next_timestamp(self, key: QueueKey, now: int | None = None) -> int:
        """The commit_timestamp a new row of ``key`` gets: now, or the last one + 1 ms when the
        clock has not moved past it (keeps timestamps strictly increasing per queue)."""
        moment = self._clock() if now is None else now
        current = self._latest.get(key)
        return moment if current is None or moment > current[1] else current[1] + 1

    def append(self, commits: list[OffsetCommit]) -> int | None:
        """Append ``commits`` in ONE Delta commit (atomic) and apply them; returns the version."""
        if not commits:
            return None
        with self._lock:
            if self._log is None:
                ensure_table(self.lake, CONSUMER_OFFSET_COMMITS)
                self._log = AppendLog(self.path, CONSUMER_OFFSET_COMMITS, checkpoint_interval=100)
            version = self._log.commit(self._log.write_files(commits_table(commits)), operation="WRITE")
            self._apply({c.key: (c.offset, c.commit_timestamp) for c in commits})
            if self._tail is not None and version == self._tail.version + 1:
                self._tail.version = version
            return version


class ConsumerOffsetManager:
    """The broker's clustering offsets (``ConsumerOffsetManager``), persisted in batches."""

    def __init__(self, lake: str | Path, broker_name: str, clock: Callable[[], int] | None = None) -> None:
        self.broker_name = broker_name
        self.ledger = OffsetLedger(lake, clock)
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._pending: dict[QueueKey, OffsetCommit] = {}

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


class RemoteBrokerOffsetStore:
    """A clustering client's offsets: memory, backed by the queue's broker (``readOffset``
    return codes: the offset, -1 not found, -2 broker unreachable, -3 bad request)."""

    def __init__(self, managers: dict[str, ConsumerOffsetManager], group: str, client_id: str) -> None:
        self.managers = managers
        self.group = group
        self.client_id = client_id
        self._memory: dict[tuple[str, str, int], int] = {}

    def update_offset(self, queue: MessageQueue, offset: int, increase_only: bool = True) -> None:
        """Set the offset in memory (only upwards with ``increase_only``)."""
        key = (queue.broker_name, queue.topic, queue.queue_id)
        if increase_only and self._memory.get(key, -1) >= offset:
            return
        self._memory[key] = offset

    def read_offset(self, queue: MessageQueue | None, read_type: ReadOffsetType) -> int:
        """The offset per ``read_type``, or one of the negative return codes."""
        if queue is None or not isinstance(read_type, ReadOffsetType):
            return OFFSET_BAD_REQUEST
        key = (queue.broker_name, queue.topic, queue.queue_id)
        if read_type is not ReadOffsetType.READ_FROM_STORE and key in self._memory:
            return self._memory[key]
        if read_type is ReadOffsetType.READ_FROM_MEMORY:
            return OFFSET_NOT_FOUND
        manager = self.managers.get(queue.broker_name)
        if manager is None:
            return OFFSET_READ_ERROR
        try:
            offset = manager.query_offset(self.group, queue.topic, queue.queue_id)
        except RmqLakeError:
            return OFFSET_READ_ERROR
        if offset >= 0:
            self._memory[key] = offset
        return offset

    def persist(self, queue: MessageQueue) -> None:
        """Send the memory offset of ``queue`` to its broker."""
        key = (queue.broker_name, queue.topic, queue.queue_id)
        if key in self._memory and queue.broker_name in self.managers:
            self.managers[queue.broker_name].commit_offset(
                self.group, queue.topic, queue.queue_id, self._memory[key], self.client_id
            )

    def persist_all(self) -> None:
        """Send every memory offset to its broker."""
        for broker_name, topic, queue_id in list(self._memory):
            self.persist(MessageQueue(broker_name, topic, queue_id))


class LocalFileOffsetStore:
    """Broadcasting offsets of one client and group in ``{base}/{client_id}/{group}/offsets.json``.

    The file is strict JSON ``{"offsetTable": [{"brokerName", "topic", "queueId", "offset"}, ...]}``
    (RocketMQ's fastjson text uses queue objects as keys, which is not JSON); it is replaced
    atomically and the previous version kept as ``offsets.json.bak``.
    """

    def __init__(self, base_dir: str | Path, client_id: str, group: str) -> None:
        self.path = Path(base_dir) / client_id / group / "offsets.json"
        self._memory: dict[tuple[str, str, int], int] = {}

    def update_offset(self, queue: MessageQueue, offset: int, increase_only: bool = False) -> None:
        """Set the offset in memory (only upwards with ``increase_only``)."""
        key = (queue.broker_name, queue.topic, queue.queue_id)
        if increase_only and self._memory.get(key, -1) >= offset:
            return
        self._memory[key] = offset

    def read_offset(self, queue: MessageQueue | None, read_type: ReadOffsetType) -> int:
        """The offset per ``read_type``; -1 for every "not found", -3 for a bad request."""
        if queue is None or not isinstance(read_type, ReadOffsetType):
            return OFFSET_BAD_REQUEST
        key = (queue.broker_name, queue.topic, queue.queue_id)
        if read_type is not ReadOffsetType.READ_FROM_STORE and key in self._memory:
            return self._memory[key]
        if read_type is ReadOffsetType.READ_FROM_MEMORY:
            return OFFSET_NOT_FOUND
        stored = self._read_file().get(key, OFFSET_NOT_FOUND)
        if stored >= 0:
            self._memory[key] = stored
        return stored

    def persist_all(self) -> None:
        """Write every memory offset to the file (atomic replace, previous kept as .bak)."""
        entries = sorted(self._memory.items())
        table = [{"brokerName": b, "topic": t, "queueId": q, "offset": o} for (b, t, q), o in entries]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_suffix(".json.tmp")
        temp.write_text(json.dumps({"offsetTable": table}, indent=1), encoding="utf-8")
        if self.path.exists():
            os.replace(self.path, self.path.with_suffix(".json.bak"))
        os.replace(temp, self.path)

    def _read_file(self) -> dict[tuple[str, str, int], int]:
        for candidate in (self.path, self.path.with_suffix(".json.bak")):
            try:
                data = json.loads(candidate.read_text(encoding="utf-8"))
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            return {(e["brokerName"], e["topic"], int(e["queueId"])): int(e["offset"]) for e in data["offsetTable"]}
        return {}
