"""The consume side of a broker: consume queues, ``getMessage`` and long-polling pulls.

A :class:`MessageStore` indexes one broker's commit log into consume queues (RocketMQ's dispatch
rule: non-transactional and commit records only; ``tags_code`` as the broker computes it) and
serves pulls with RocketMQ's statuses and offset corrections. It is fed two ways:

- in the broker's own process, the broker hands it every commit as soon as it is durable, and a
  held pull wakes at once (``ReputMessageService`` plus ``notifyMessageArriving``);
- in any other process, it follows the Delta log of ``commitlog``; a held pull polls the log's
  version every ``log_poll_ms``.

Queue offsets start at 0 and no segment is ever deleted, so every queue's min offset is 0.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.exceptions import TableNotFoundError

from broker_model.common import WithProperties, consume_queue_tags_code, decompress_body, dispatched_mask, tags_code
from broker_model.common import constants as c
from broker_model.store.delta_commits import CommitChange, CommitTail, load_table
from broker_model.store.delta_files import FILE_COLUMN, rows_within_files, scan_files, snapshot_files
from broker_model.store.file_rows import FileRows
from schemas.catalog import COMMITLOG
from schemas.errors import ValidationError

_log = logging.getLogger(__name__)

MAX_TRANSFER_COUNT = 32  # maxTransferCountOnMessageInMemory
MAX_TRANSFER_BYTES = 256 * 1024  # maxTransferBytesOnMessageInMemory: the first message always goes
MAX_FILTER_SCAN = 16000 // 20  # maxFilterMessageSize / CQ_STORE_UNIT_SIZE: consume-queue rows scanned per pull at least
BROKER_SUSPEND_MAX_TIME_MS = 15000  # the client's suspend timeout
SHORT_POLLING_TIME_MS = 1000  # shortPollingTimeMills: the hold when long polling is off
LONG_POLLING_CHECK_MS = 5000  # the hold service re-checks held pulls this often
_T = TypeVar("_T")
_INDEX_COLUMNS = [
    "commit_log_offset",
    "store_size",
    "topic",
    "queue_id",
    "queue_offset",
    "sys_flag",
    "tags",
    "store_timestamp",
    "properties",
    "uniq_key",
    "prepared_transaction_offset",
]


class GetMessageStatus(Enum):
    """``GetMessageStatus`` of the store."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"


class PullStatus(Enum):
    """The client's ``PullStatus``."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True)
class Subscription:
    """A tag expression: ``*`` (or empty) matches all; else tags joined by ``||``."""

    expression: str
    tags: frozenset[str]
    codes: frozenset[int]

    @classmethod
    def parse(cls, expression: str | None) -> Subscription:
        """``FilterAPI.buildSubscriptionData``: split on ``||``, trim, hash each tag."""
        text = (expression or "*").strip()
        if text in ("", "*"):
            return cls("*", frozenset(), frozenset())
        tags = frozenset(t.strip() for t in text.split("||") if t.strip())
        if not tags:
            raise ValidationError("tag_expression", expression, "names no tag", "use '*' or 'TagA || TagB'")
        return cls(text, tags, frozenset(tags_code(t) for t in tags))

    @property
    def matches_all(self) -> bool:
        """True for ``*``."""
        return not self.tags

    def matches_code(self, code: int) -> bool:
        """The broker's consume-queue check: the tags code (as a Java int) is in the code set."""
        return self.matches_all or _to_int(code) in self.codes

    def matches_tags(self, tags: str | None) -> bool:
        """The client's exact check against hash collisions."""
        return self.matches_all or (tags is not None and tags in self.tags)


@dataclass
class MessageExt(WithProperties):
    """A stored message as a consumer sees it; ``body`` is decompressed."""

    broker_name: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    body: bytes
    flag: int
    sys_flag: int
    properties: dict[str, str]
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int
    msg_id: str

    @property
    def uniq_key(self) -> str | None:
        """The client message id (UNIQ_KEY)."""
        return self.properties.get(c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)


@dataclass(frozen=True)
class GetMessageResult:
    """The store's answer to one read of a queue."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)


@dataclass(frozen=True)
class PullResult:
    """The client's view of a pull (``PullResult``)."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)


class _Queue:
    """One consume queue: parallel arrays of its rows from queue offset :attr:`min_offset` on, the
    first one still stored (0 unless a store's oldest segments were deleted before the lake took it
    in); the row of queue offset ``q`` is at index ``q - min_offset``."""

    __slots__ = ("files", "min_offset", "offsets", "rows", "sizes", "tags_codes", "timestamps")

    def __init__(self, min_offset: int) -> None:
        self.min_offset = min_offset
        self.offsets = array("q")
        self.sizes = array("i")
        self.tags_codes = array("q")
        self.timestamps = array("q")
        self.files = array("i")
        self.rows = array("i")

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def max_offset(self) -> int:
        """The next queue offset to be written."""
        return self.min_offset + len(self.offsets)

    def holds(self, queue_offset: int) -> bool:
        """Whether the queue has a row at ``queue_offset``."""
        return self.min_offset <= queue_offset < self.max_offset


class MessageStore:
    """Consume queues and pulls of one broker (see the module docstring). Thread-safe."""

    def __init__(
        self,
        lake: str | Path,
        broker_name: str,
        *,
        cache_bytes: int = 256 * 1024 * 1024,
        log_poll_ms: int = 100,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.lake = Path(lake)
        self.broker_name = broker_name
        self.log_poll_ms = log_poll_ms
        self.fed_locally = False  # True when a broker in this process dispatches its commits here
        self.loads = 0  # how many times the whole log was indexed (start, and changes it could not follow)
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.RLock()
        self._arrival = threading.Condition(self._lock)
        self._held = 0  # pulls being held now (PullRequestHoldService's suspended requests)
        self._listeners: list[Callable[[], None]] = []  # told of every arrival (add_arrival_listener)
        self._queues: dict[tuple[str, int], _Queue] = {}
        # the log's files by id (files known by decoded path): a row locator is (file id, row)
        self._files = FileRows(COMMITLOG.location(self.lake), cache_bytes)
        self._tail: CommitTail | None = None
        self._undispatched: list[tuple[str, pa.Table | None]] = []  # committed here, not yet indexed
        self._written: dict[str, pa.Table] = {}  # rows of the commit being dispatched through refresh
        self.skipped: list[tuple[str, int, int]] = []  # (topic, queue id, queue offset) not contiguous
        self._half_offsets: dict[int, int] = {}  # half record commit log offset -> half queue offset
        self._finals: dict[str, list[int]] = {}  # UNIQ_KEY -> commit log offsets of its commit records
        self._final_positions: dict[int, tuple[str, int, int]] = {}  # commit record offset -> (topic, queue, offset)

    # -- loading and dispatch ---------------------------------------------------------------------

    def load(self) -> MessageStore:
        """Index the broker's whole log as of now and follow the log from there."""
        path = COMMITLOG.location(self.lake)
        with self._lock:
            self.loads += 1
            self._undispatched.clear()
            self._half_offsets.clear()
            self._finals.clear()
            self._final_positions.clear()
            self._queues.clear()
            self._files.clear()
            try:
                table = load_table(path)
            except TableNotFoundError:
                self._tail = CommitTail(path, -1)
                return self
            version = table.version()
            self._index_files(snapshot_files(table, COMMITLOG, {"broker_name": [self.broker_name]}))
            self._tail = CommitTail(path, version)
        return self

    def _index_files(self, files: pa.Table) -> None:
        """Index the rows of ``files`` (:func:`snapshot_files` of the broker's partition), read in
        one scan of their index columns (caller holds the lock)."""
        rows = scan_files(COMMITLOG.location(self.lake), files, COMMITLOG, [*_INDEX_COLUMNS, FILE_COLUMN])
        ids = {path: self._files.add(path, path) for path in files.column("path").to_pylist()}
        file_ids = pa.array([ids[p] for p in rows.column(FILE_COLUMN).to_pylist()], pa.int32())
        index = rows.select(_INDEX_COLUMNS).append_column("file_id", file_ids)
        index = index.append_column("row", pa.array(rows_within_files(rows.column(FILE_COLUMN)), pa.int32()))
        self._index(index.sort_by("commit_log_offset"))

    def refresh(self) -> bool:
        """Index commits made since the last look (by any process); True when anything new came.

        A rewrite (compaction: files removed and added with ``dataChange=false``) moves rows
        without changing them: the consume-queue rows of the removed files are pointed at the same rows,
        found by commit log offset, in the added files (:meth:`_remap`). A commit that removes rows,
        a rewrite whose rows cannot all be found, or a cleaned-up log makes it reload everything.
        """
        with self._lock:
            if self._tail is None:
                self.load()
                return True
            changes = self._tail.poll()
            if changes is None or any(change.starts_over for change in changes):
                self.load()
                return True
            self._drain()
            try:
                arrived = self._follow(changes)
            except FileNotFoundError:  # a file of the changes is gone already (VACUUM): start over
                self.load()
                return True
            if arrived:
                self._arrival.notify_all()
        if arrived:
            self._announce()
        return arrived

    def _follow(self, changes: Sequence[CommitChange]) -> bool:
        """Index the new files of ``changes`` and follow their rewrites, in log order (caller holds
        the lock); True when new rows of this broker came. A rewrite it cannot follow reloads all."""
        arrived = False
        pending: list[tuple[str, pa.Table | None]] = []
        for change in changes:
            pending += [
                (added.path, self._written.get(added.path))
                for added in change.added
                if added.partition_values.get("broker_name") == self.broker_name
            ]
            if change.removed:
                self._dispatch_files(pending)  # first: the rewrite may have compacted them
                arrived, pending = arrived or bool(pending), []
                if not self._remap(change):
                    self.load()
                    return True
        if pending:
            self._dispatch_files(pending)
            arrived = True
        return arrived

    def _remap(self, change: CommitChange) -> bool:
        """Point the consume-queue rows of the files ``change`` removed at the same rows in the files it
        added (caller holds the lock). False when a row's commit log offset is in none of them."""
        known = [self._files.id_of(removed.path) for removed in change.removed]
        gone = [file_id for file_id in known if file_id is not None]
        if not gone:
            return True  # another broker's files
        located = [
            self._locate(moved.path)
            for moved in change.rewritten
            if moved.partition_values.get("broker_name") == self.broker_name
        ]
        if not located:
            return False
        offsets, file_ids, rows = (np.concatenate(parts) for parts in zip(*located, strict=True))
        order = np.argsort(offsets, kind="stable")
        offsets, file_ids, rows = offsets[order], file_ids[order], rows[order]
        removed = np.array(gone, dtype=np.int32)
        for queue in self._queues.values():
            queue_files = np.frombuffer(queue.files, dtype=np.int32)
            moved = np.isin(queue_files, removed)
            if not moved.any():
                continue
            wanted = np.frombuffer(queue.offsets, dtype=np.int64)[moved]
            at = np.minimum(np.searchsorted(offsets, wanted), len(offsets) - 1)
            if not np.array_equal(offsets[at], wanted):
                return False
            queue_files[moved] = file_ids[at]
            np.frombuffer(queue.rows, dtype=np.int32)[moved] = rows[at]
        self._files.forget(gone)
        return True

    def _locate(self, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A new file id for ``path`` and, per row of the file, (commit log offset, file id, row)."""
        file_id = self._files.add(path, unquote(path))
        offsets = pq.read_table(COMMITLOG.location(self.lake) / path, columns=["commit_log_offset"])
        count = offsets.num_rows
        return (
            np.asarray(offsets["commit_log_offset"].to_numpy(), dtype=np.int64),
            np.full(count, file_id, dtype=np.int32),
            np.arange(count, dtype=np.int32),
        )

    def dispatch_commit(self, version: int, files: Sequence[tuple[str, pa.Table]]) -> None:
        """Take a commit this process just made (its files with their rows) and wake held pulls.

        Indexing waits for the next query, so that the write path only pays for a list append;
        the log tail skips that version. A version out of sequence (another writer committed in
        between) makes the store read the log instead.
        """
        with self._lock:
            if self._tail is not None and version == self._tail.version + 1:
                self._tail.version = version
                self._undispatched.extend(files)
            else:
                self._drain()
                self._written = dict(files)  # paths unquoted, as _follow looks them up
                try:
                    self.refresh()  # the commits in between are read, this one's rows are at hand
                finally:
                    self._written = {}
            self._arrival.notify_all()
        self._announce()

    def add_arrival_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (from the thread that dispatched, so it must be quick and must not
        raise) whenever new rows of this broker may have come: a waiter that cannot hold a thread
        (an event loop's long poll) then looks with :meth:`arrived_any`."""
        with self._lock:
            self._listeners.append(listener)

    def remove_arrival_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener`` (one that is not listening is ignored)."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def announce(self) -> None:
        """Wake every held pull and tell every listener, though nothing was stored: something a
        waiter waits for changed (a FIFO group's ack frees its queue)."""
        with self._arrival:
            self._arrival.notify_all()
        self._announce()

    def _announce(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener()
            except Exception:  # the dispatching thread (a committer) must carry on
                _log.exception("an arrival listener failed")

    def arrived_any(self, queues: Sequence[tuple[str, int, int]], sub: Subscription) -> bool:
        """Whether a message matching ``sub`` is at or after the offset of any of ``queues``
        (topic, queue id, offset)."""
        with self._lock:
            return any(self._arrived(topic, queue_id, offset, sub) for topic, queue_id, offset in queues)

    def _drain(self) -> None:
        """Index what :meth:`dispatch_commit` queued (caller holds the lock)."""
        if self._undispatched:
            files, self._undispatched = self._undispatched, []
            self._dispatch_files(files)

    def _dispatch_files(self, files: Sequence[tuple[str, pa.Table | None]]) -> None:
        parts = []
        for path, rows in files:
            file_id = self._files.add(path, unquote(path), rows)
            table = rows
            if table is None:
                table = pq.read_table(COMMITLOG.location(self.lake) / path, columns=_INDEX_COLUMNS)
            index = table.select(_INDEX_COLUMNS)
            index = index.append_column("file_id", pa.array([file_id] * table.num_rows, pa.int32()))
            parts.append(index.append_column("row", pa.array(range(table.num_rows), pa.int32())))
        if parts:
            merged = pa.concat_tables(parts).sort_by("commit_log_offset")
            self._index(merged)

    def _index(self, rows: pa.Table) -> None:
        dispatched = rows.filter(dispatched_mask(rows["sys_flag"]))
        columns = dispatched.to_pydict()
        for i in range(dispatched.num_rows):
            key = (columns["topic"][i], columns["queue_id"][i])
            self._index_transaction(columns, i)
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Queue(columns["queue_offset"][i])
            if columns["queue_offset"][i] != queue.max_offset:
                self.skipped.append((key[0], key[1], columns["queue_offset"][i]))
                continue
            queue.offsets.append(columns["commit_log_offset"][i])
            queue.sizes.append(columns["store_size"][i])
            queue.tags_codes.append(_tags_code(columns, i))
            queue.timestamps.append(columns["store_timestamp"][i])
            queue.files.append(columns["file_id"][i])
            queue.rows.append(columns["row"][i])

    def _index_transaction(self, columns: dict[str, list[Any]], i: int) -> None:
        if columns["topic"][i] == c.RMQ_SYS_TRANS_HALF_TOPIC:
            self._half_offsets[columns["commit_log_offset"][i]] = columns["queue_offset"][i]
        elif columns["sys_flag"][i] & c.TRANSACTION_ROLLBACK_TYPE == c.TRANSACTION_COMMIT_TYPE:
            uniq_key = columns["uniq_key"][i]
            if uniq_key is not None:
                self._finals.setdefault(uniq_key, []).append(columns["commit_log_offset"][i])
            position = (columns["topic"][i], columns["queue_id"][i], columns["queue_offset"][i])
            self._final_positions[columns["commit_log_offset"][i]] = position

    def half_queue_offset(self, commit_log_offset: int) -> int | None:
        """Half queue offset of the half record at ``commit_log_offset``, None when there is none."""
        with self._lock:
            self._drain()
            return self._half_offsets.get(commit_log_offset)

    def final_offsets(self, uniq_key: str) -> list[int]:
        """Commit log offsets of the committed (final) records of a transaction."""
        with self._lock:
            self._drain()
            return list(self._finals.get(uniq_key, ()))

    def message_by_offset(self, commit_log_offset: int) -> MessageExt | None:
        """A committed (final) transactional record by its commit log offset, None if unknown."""
        with self._lock:
            self._drain()
            position = self._final_positions.get(commit_log_offset)
        return None if position is None else self.message_at(*position, decompress=False)

    def message_at(self, topic: str, queue_id: int, queue_offset: int, decompress: bool = True) -> MessageExt | None:
        """The message at a queue offset, None when there is none; with ``decompress=False`` the
        body is as stored (compressed when the sys flag says so), for the broker's own copies."""
        with self._lock:
            self._drain()
            queue = self._queues.get((topic, queue_id))
            if queue is None or not queue.holds(queue_offset):
                return None
            return self._message(topic, queue_id, queue_offset, decompress)

    def _after_recovery(self, read: Callable[[], _T]) -> _T:
        """``read()`` (caller holds the lock); when a file it reads is gone (a compaction this store
        has not followed yet, then a VACUUM), again after following the log, then after indexing the
        whole log again."""
        for recover in (self.refresh, self.load):
            try:
                return read()
            except FileNotFoundError:
                recover()
        return read()

    def _row(self, topic: str, queue_id: int, queue_offset: int) -> dict[str, Any]:
        """The stored record of a consume-queue row (caller holds the lock)."""

        def read() -> dict[str, Any]:
            queue = self._queues[(topic, queue_id)]
            index = queue_offset - queue.min_offset
            return self._files.row(queue.files[index], queue.rows[index])

        return self._after_recovery(read)

    def _messages(
        self, topic: str, queue_id: int, queue_offsets: Sequence[int], decompress: bool = True
    ) -> list[MessageExt]:
        """The messages at ``queue_offsets`` of a queue, in that order (caller holds the lock): per
        file, only their rows are made into Python values (a pull's rows lie scattered among other
        queues' rows, so whole runs would turn many rows into values for each one read)."""

        def read() -> list[dict[str, Any]]:
            queue = self._queues[(topic, queue_id)]
            places = [(queue.files[q - queue.min_offset], queue.rows[q - queue.min_offset]) for q in queue_offsets]
            per_file: dict[int, list[int]] = {}
            for file_id, row in places:
                per_file.setdefault(file_id, []).append(row)
            rows: dict[tuple[int, int], dict[str, Any]] = {}
            for file_id, file_rows in per_file.items():
                columns = self._files.rows(file_id, file_rows)
                for at, row in enumerate(file_rows):
                    rows[(file_id, row)] = {name: values[at] for name, values in columns.items()}
            return [rows[place] for place in places]

        rows = self._after_recovery(read)
        return [self._to_message(topic, q, row, decompress) for q, row in zip(queue_offsets, rows, strict=True)]

    def _message(self, topic: str, queue_id: int, queue_offset: int, decompress: bool = True) -> MessageExt:
        return self._to_message(topic, queue_offset, self._row(topic, queue_id, queue_offset), decompress)

    def _to_message(self, topic: str, queue_offset: int, row: dict[str, Any], decompress: bool) -> MessageExt:
        body = decompress_body(row["body"], row["sys_flag"]) if decompress else row["body"]
        return MessageExt(
            broker_name=self.broker_name,
            topic=topic,
            queue_id=row["queue_id"],
            queue_offset=queue_offset,
            commit_log_offset=row["commit_log_offset"],
            store_size=row["store_size"],
            body=body,
            flag=row["flag"],
            sys_flag=row["sys_flag"],
            properties=dict(row["properties"]),
            born_timestamp=row["born_timestamp"],
            born_host=row["born_host"],
            store_timestamp=row["store_timestamp"],
            store_host=row["store_host"],
            reconsume_times=row["reconsume_times"],
            prepared_transaction_offset=row["prepared_transaction_offset"],
            body_crc=row["body_crc"],
            msg_id=row["msg_id"],
        )

    # -- queries ----------------------------------------------------------------------------------

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) with at least one consume-queue row, sorted."""
        with self._lock:
            self._drain()
            return sorted(self._queues)

    def cq_rows(self, topic: str, queue_id: int) -> tuple[int, array[int], array[int], array[int]]:
        """A queue's consume-queue rows in queue order: the queue offset of the first, and copies of
        their commit log offsets, sizes and tags codes (what the 20-byte units of RocketMQ's
        consume queue files hold); ``(0, empty, empty, empty)`` for an unknown queue."""
        with self._lock:
            self._drain()
            queue = self._queues.get((topic, queue_id))
            if queue is None:
                return 0, array("q"), array("i"), array("q")
            return queue.min_offset, array("q", queue.offsets), array("i", queue.sizes), array("q", queue.tags_codes)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The smallest queue offset still stored (``ConsumeQueue.getMinOffsetInQueue``): 0 unless
        the store the lake took the broker from had deleted its oldest segments; 0 for an unknown
        queue."""
        with self._lock:
            self._drain()
            queue = self._queues.get((topic, queue_id))
            return queue.min_offset if queue is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's next offset to be written (``getMaxOffsetInQueue``); 0 for an unknown queue."""
        with self._lock:
            self._drain()
            queue = self._queues.get((topic, queue_id))
            return queue.max_offset if queue is not None else 0

    def store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """Store time (ms) of the consume-queue row at ``queue_offset``, None when there is none."""
        with self._lock:
            self._drain()
            queue = self._queues.get((topic, queue_id))
            if queue is None or not queue.holds(queue_offset):
                return None
            return queue.timestamps[queue_offset - queue.min_offset]

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """RocketMQ 5.1.1+ lookup with the LOWER boundary: the first offset whose store time is at
        or after ``timestamp`` (max offset when none is), clamped to [min offset, max offset]."""
        with self._lock:
            self._drain()
            queue = self._queues.get((topic, queue_id))
            if queue is None:
                return 0
            low, high = 0, len(queue)
            while low < high:  # store times rise with queue offsets within a queue
                middle = (low + high) // 2
                if queue.timestamps[middle] < timestamp:
                    low = middle + 1
                else:
                    high = middle
            return queue.min_offset + low

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = MAX_TRANSFER_COUNT,
        subscription: Subscription | None = None,
    ) -> GetMessageResult:
        """``DefaultMessageStore.getMessage``: read up to ``max_msgs`` matching messages.

        Scans at most ``max(800, max_msgs)`` consume-queue rows; a batch ends at ``max_msgs`` messages or
        256 KiB (the first message always goes). ``next_begin_offset`` follows RocketMQ's
        corrections: min offset when too small, max offset when far too large.
        """
        if max_msgs <= 0:
            raise ValidationError("max_msgs", max_msgs, "must be positive")
        sub = subscription or Subscription.parse("*")
        with self._lock:
            self._drain()
            queue = self._queues.get((topic, queue_id))
            if queue is None or queue.max_offset == 0:
                return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
            low, high = queue.min_offset, queue.max_offset
            if offset < low:
                return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, low, low, high)
            if offset == high:
                return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, low, high)
            if offset > high:
                return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, high, low, high)
            return self._scan(queue, topic, queue_id, offset, max_msgs, sub)

    def _scan(
        self, queue: _Queue, topic: str, queue_id: int, offset: int, max_msgs: int, sub: Subscription
    ) -> GetMessageResult:
        end = min(queue.max_offset, offset + max(MAX_FILTER_SCAN, max_msgs))
        found: list[int] = []
        size = 0
        position = offset
        while position < end:
            index = position - queue.min_offset
            if found and (len(found) >= max_msgs or size + queue.sizes[index] > MAX_TRANSFER_BYTES):
                break
            if sub.matches_code(queue.tags_codes[index]):
                found.append(position)
                size += queue.sizes[index]
            position += 1
        status = GetMessageStatus.FOUND if found else GetMessageStatus.NO_MATCHED_MESSAGE
        messages = self._messages(topic, queue_id, found)
        return GetMessageResult(status, position, queue.min_offset, queue.max_offset, messages)

    # -- pulls ------------------------------------------------------------------------------------

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = MAX_TRANSFER_COUNT,
        tag_expression: str | None = "*",
        suspend_timeout_ms: int = 0,
        long_polling: bool = True,
    ) -> PullResult:
        """A pull as a consumer sees it: the broker read, long polling, then the client's tag check.

        With ``suspend_timeout_ms > 0`` a pull that finds no new message (offset at the queue's
        end) is held: with long polling on until a message matching the subscription arrives in
        that queue or the timeout passes; with it off for the short-polling time (1 s), woken by
        nothing. It is then read once more.
        """
        sub = Subscription.parse(tag_expression)
        if not self.fed_locally:
            self.refresh()
        result = self.get_message(topic, queue_id, offset, max_msgs, sub)
        if suspend_timeout_ms > 0 and _response_code(result, offset) == "PULL_NOT_FOUND":
            hold = suspend_timeout_ms if long_polling else min(suspend_timeout_ms, SHORT_POLLING_TIME_MS)
            self._hold([(topic, queue_id, offset)], sub, hold, long_polling)
            result = self.get_message(topic, queue_id, offset, max_msgs, sub)
        return _client_result(result, offset, sub)

    @property
    def held_pulls(self) -> int:
        """The pulls being held now, waiting for a message or the end of their hold."""
        with self._lock:
            return self._held

    def hold_any(self, queues: Sequence[tuple[str, int, int]], sub: Subscription, hold_ms: int) -> None:
        """Wait up to ``hold_ms`` until a message matching ``sub`` arrives at or after the offset of
        any of ``queues`` (topic, queue id, offset): a POP long poll, which reads every queue."""
        self._hold(queues, sub, hold_ms, True)

    def _hold(self, queues: Sequence[tuple[str, int, int]], sub: Subscription, hold_ms: int, wake: bool) -> None:
        """Wait until a matching message arrived in one of ``queues``, when ``wake``, or ``hold_ms`` passed."""
        deadline = time.monotonic() + hold_ms / 1000
        with self._arrival:
            self._held += 1
            try:
                while not (wake and any(self._arrived(t, q, o, sub) for t, q, o in queues)):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    step = LONG_POLLING_CHECK_MS if self.fed_locally else self.log_poll_ms
                    self._arrival.wait(min(remaining, step / 1000))
                    if not self.fed_locally:
                        self.refresh()
            finally:
                self._held -= 1

    def _arrived(self, topic: str, queue_id: int, offset: int, sub: Subscription) -> bool:
        self._drain()
        queue = self._queues.get((topic, queue_id))
        if queue is None or queue.max_offset <= offset:
            return False
        first = max(offset, queue.min_offset) - queue.min_offset
        return any(sub.matches_code(queue.tags_codes[index]) for index in range(first, len(queue)))


def _tags_code(columns: dict[str, list[Any]], i: int) -> int:
    """The tags code of dispatched record ``i``; its properties are read only on the schedule
    topic, where the DELAY level decides it (indexing a whole log stays one hash per record)."""
    topic, tags = columns["topic"][i], columns["tags"][i]
    if topic != c.SCHEDULE_TOPIC:
        return tags_code(tags)
    delay = dict(columns["properties"][i]).get(c.PROPERTY_DELAY_TIME_LEVEL)
    return consume_queue_tags_code(topic, tags, delay, columns["store_timestamp"][i])


def _response_code(result: GetMessageResult, offset: int) -> str:
    """``PullMessageProcessor``'s response code for a store result."""
    status = result.status
    if status is GetMessageStatus.FOUND:
        return "SUCCESS"
    if status is GetMessageStatus.NO_MATCHED_MESSAGE:
        return "PULL_RETRY_IMMEDIATELY"
    if status is GetMessageStatus.NO_MESSAGE_IN_QUEUE:
        return "PULL_OFFSET_MOVED" if offset != 0 else "PULL_NOT_FOUND"
    if status is GetMessageStatus.OFFSET_OVERFLOW_ONE:
        return "PULL_NOT_FOUND"
    return "PULL_OFFSET_MOVED"


_CLIENT_STATUS = {
    "SUCCESS": PullStatus.FOUND,
    "PULL_NOT_FOUND": PullStatus.NO_NEW_MSG,
    "PULL_RETRY_IMMEDIATELY": PullStatus.NO_MATCHED_MSG,
    "PULL_OFFSET_MOVED": PullStatus.OFFSET_ILLEGAL,
}


def _client_result(result: GetMessageResult, offset: int, sub: Subscription) -> PullResult:
    """``PullAPIWrapper.processPullResult``: keep messages whose tags match exactly, and mark
    each with the queue's min and max offsets."""
    status = _CLIENT_STATUS[_response_code(result, offset)]
    messages = [m for m in result.messages if sub.matches_tags(m.tags)]
    for message in messages:
        message.properties[c.PROPERTY_MIN_OFFSET] = str(result.min_offset)
        message.properties[c.PROPERTY_MAX_OFFSET] = str(result.max_offset)
    return PullResult(status, result.next_begin_offset, result.min_offset, result.max_offset, messages)


def _to_int(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - 0x100000000 if value & 0x80000000 else value
