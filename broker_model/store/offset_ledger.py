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
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import TableNotFoundError

from broker_model.common import GroupQueueKey
from broker_model.store.append_log import AppendLog
from broker_model.store.delta_commits import CommitTail, FileAction, load_table
from broker_model.store.delta_tables import ensure_table
from schemas.catalog import CONSUMER_OFFSET_COMMITS


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
    def key(self) -> GroupQueueKey:
        """(group, broker_name, topic, queue_id)."""
        return self.group, self.broker_name, self.topic, self.queue_id


def commits_table(commits: Iterable[OffsetCommit]) -> pa.Table:
    """Commit rows as an Arrow table of the ``consumer_offset_commits`` schema."""
    rows = [vars(commit) for commit in commits]
    schema = CONSUMER_OFFSET_COMMITS.arrow_schema
    return pa.Table.from_pylist(rows, schema=schema)


def latest_commits(table: pa.Table) -> dict[GroupQueueKey, tuple[int, int]]:
    """{(group, broker, topic, queue): (offset, commit_timestamp)} of the newest row per queue."""
    latest: dict[GroupQueueKey, tuple[int, int]] = {}
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

    Used by the reset tool for every broker's queues, and by a broker's offset manager for its own
    (``broker_name``): such a ledger reads no file whose statistics show no row of its broker,
    and none of the commits it made itself. Thread-safe.
    """

    def __init__(
        self, lake: str | Path, clock: Callable[[], int] | None = None, broker_name: str | None = None
    ) -> None:
        self.lake = Path(lake)
        self.path = CONSUMER_OFFSET_COMMITS.location(self.lake)
        self.broker_name = broker_name
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.RLock()
        self._latest: dict[GroupQueueKey, tuple[int, int]] = {}
        self._tail: CommitTail | None = None
        self._log: AppendLog | None = None
        self._appended: set[int] = set()  # versions this ledger committed that its tail has not passed

    def load(self) -> OffsetLedger:
        """Read the whole table as of now and follow its log from there."""
        with self._lock:
            try:
                table = load_table(self.path)
            except TableNotFoundError:
                self._latest, self._tail = {}, CommitTail(self.path, -1)
                return self
            self._tail = CommitTail(self.path, table.version())
            self._appended.clear()
            self._latest = latest_commits(self._own_rows(table.to_pyarrow_table()))
        return self

    def _own_rows(self, rows: pa.Table) -> pa.Table:
        """``rows`` of the queues this ledger keeps (all without a ``broker_name``)."""
        if self.broker_name is None:
            return rows
        return rows.filter(pc.equal(rows["broker_name"], self.broker_name))

    def _may_hold_own_rows(self, added: FileAction) -> bool:
        """False when ``added``'s statistics show no row of this ledger's broker."""
        if self.broker_name is None or not added.stats:
            return True
        try:
            stats = json.loads(added.stats)
            low, high = stats["minValues"]["broker_name"], stats["maxValues"]["broker_name"]
        except (ValueError, KeyError, TypeError):
            return True
        # a truncated minimum is a prefix of the least value and a truncated maximum is at least the
        # greatest, so neither can exclude a file that holds the broker's rows
        return not (isinstance(low, str) and isinstance(high, str)) or low <= self.broker_name <= high

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
                if change.version in self._appended:
                    continue  # applied when this ledger committed it
                for added in change.added:
                    if self._may_hold_own_rows(added):
                        self._apply(latest_commits(self._own_rows(pq.read_table(self.path / added.path))))
            self._appended = {version for version in self._appended if version > self._tail.version}

    def _apply(self, rows: dict[GroupQueueKey, tuple[int, int]]) -> None:
        for key, value in rows.items():
            current = self._latest.get(key)
            if current is None or value[1] > current[1]:
                self._latest[key] = value

    def current(self, key: GroupQueueKey) -> tuple[int, int] | None:
        """(offset, commit_timestamp) of the latest commit of a queue, None when there is none."""
        with self._lock:
            return self._latest.get(key)

    def keys(self) -> list[GroupQueueKey]:
        """Every queue with a commit, sorted."""
        with self._lock:
            return sorted(self._latest)

    def next_timestamp(self, key: GroupQueueKey, now: int | None = None) -> int:
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
            self._apply({c.key: (c.offset, c.commit_timestamp) for c in commits if self._keeps(c.key)})
            if self._tail is not None and version == self._tail.version + 1:
                self._tail.version = version
            elif self._tail is not None:
                self._appended.add(version)
            return version

    def _keeps(self, key: GroupQueueKey) -> bool:
        return self.broker_name is None or key[1] == self.broker_name
