"""The broker's write path: a RocketMQ commit log appended to the lake's ``commitlog`` table.

One :class:`Broker` per ``broker_name`` per lake (enforced with an OS file lock, released when the
process dies). Appends get exact physical offsets (RocketMQ's record length, segments that never
split a record, blank fill at a segment's end) and per-queue offsets, then a committer thread turns
everything pending into one Delta commit (group commit). ``SYNC_FLUSH`` sends return after their
commit is durable; ``ASYNC_FLUSH`` sends return once buffered and :meth:`Broker.flush` waits.

On start the broker recovers its next physical offset and every queue's next offset from the log.
"""

from __future__ import annotations

import functools
import os
import random
import socket
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from broker_model.broker.config import BrokerConfig, InnerMessage, PutResult, SubscriptionGroupConfig
from broker_model.broker.consumer_groups import ConsumerGroupManager
from broker_model.broker.consumer_offsets import ConsumerOffsetManager
from broker_model.broker.rebalance_locks import RebalanceLockManager
from broker_model.common import MessageQueue, encode_properties, parse_host, validate_name
from broker_model.common import constants as c
from broker_model.store import (
    AppendLog,
    BrokerNameLock,
    MessageExt,
    MessageStore,
    PullResult,
    append_rows,
    ensure_table,
    magic_for_topic,
    read_table,
    record_length,
    recover_offsets,
)
from schemas.catalog import BROKERS, COMMITLOG, SUBSCRIPTION_GROUP, TOPIC_CONFIG
from schemas.errors import BrokerError, CommitFailedError, ValidationError


@dataclass(slots=True)
class _Prepared:
    """Records before they have a position, as column lists (what :meth:`Broker._prepare` computes)."""

    messages: Sequence[InnerMessage]
    topics: list[str]
    queue_ids: list[int]
    properties: list[dict[str, str]]
    raw_properties: list[bytes]
    born_hosts: list[str]
    sys_flags: list[int]
    magic_codes: list[int]
    sizes: list[int]
    body_crcs: list[int]


class _Columns:
    """Positioned batches waiting for their commit; turned into one Arrow table by the committer."""

    def __init__(self) -> None:
        self.batches: list[tuple[dict[str, Any], dict[str, list[Any]], _Prepared]] = []

    def extend(self, fixed: dict[str, Any], placed: dict[str, list[Any]], records: _Prepared) -> None:
        """Add positioned records: ``fixed`` values repeat on every row, ``placed`` columns come
        from placement, the rest from ``records``."""
        self.batches.append((fixed, placed, records))

    def column(self, name: str) -> list[Any]:
        """One column's values over every batch, in put order."""
        values: list[Any] = []
        for fixed, placed, records in self.batches:
            if name in fixed:
                values.extend([fixed[name]] * len(records.sizes))
            elif name in placed:
                values.extend(placed[name])
            else:
                values.extend(_record_column(records, name))
        return values

    def to_table(self) -> pa.Table:
        """The rows as an Arrow table with the ``commitlog`` schema."""
        schema = COMMITLOG.arrow_schema
        arrays = []
        for field_ in schema:
            if field_.name == "properties":
                arrays.append(self._properties(field_.type))
            else:
                arrays.append(pa.array(self.column(field_.name), type=field_.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    def _properties(self, map_type: pa.DataType) -> pa.Array:
        offsets: list[int] = [0]
        keys: list[str] = []
        values: list[str] = []
        for _, _, records in self.batches:
            for props in records.properties:
                keys.extend(props)
                values.extend(props.values())
                offsets.append(len(keys))
        return pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.string()), type=map_type
        )


_RECORD_FIELDS = {
    "store_size": "sizes",
    "magic_code": "magic_codes",
    "body_crc": "body_crcs",
    "queue_id": "queue_ids",
    "sys_flag": "sys_flags",
    "born_host": "born_hosts",
    "topic": "topics",
    "raw_properties": "raw_properties",
}
_MESSAGE_FIELDS = ("flag", "born_timestamp", "reconsume_times", "prepared_transaction_offset", "body")
_PROPERTY_FIELDS = {
    "tags": c.PROPERTY_TAGS,
    "keys": c.PROPERTY_KEYS,
    "uniq_key": c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
}


def _record_column(records: _Prepared, name: str) -> list[Any]:
    if name in _RECORD_FIELDS:
        values: list[Any] = getattr(records, _RECORD_FIELDS[name])
        return values
    if name in _MESSAGE_FIELDS:
        return [getattr(m, name) for m in records.messages]
    key = _PROPERTY_FIELDS[name]
    return [p.get(key) for p in records.properties]


class _Group:
    """Records put together and committed together; completion is shared."""

    def __init__(self) -> None:
        self.columns = _Columns()
        self.size = 0  # records so far
        self.done = threading.Event()
        self.error: BaseException | None = None


class BrokerService(Protocol):
    """A service thread that writes through a broker (the schedule and transaction check services)."""

    def stop(self) -> None: ...


class Broker:
    """One broker of the lake: owns its partition of ``commitlog`` (see module docstring)."""

    def __init__(self, config: BrokerConfig) -> None:
        validate_name(config.broker_name, "broker_name", c.GROUP_MAX_LENGTH)
        self.config = config
        self.broker_name = config.broker_name
        self.store_host = str(parse_host(config.store_host, "store_host"))
        self._store_address = parse_host(config.store_host, "store_host")
        self._msg_id_prefix = self._store_address.to_bytes()  # msg_id = prefix + offset, as hex
        self._clock = config.clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: _Group | None = None  # accumulating puts
        self._committing: _Group | None = None  # being committed
        self._running = False
        self._failed: BaseException | None = None
        self._lock_file: BrokerNameLock | None = None
        self._committer: threading.Thread | None = None
        self.segment_size = config.segment_size or c.DEFAULT_SEGMENT_SIZE
        self.next_offset = 0
        self.segment_base = 0
        self.queue_next: dict[tuple[str, int], int] = {}
        self.topics: dict[str, int] = {}
        self.commits = 0
        self.store = MessageStore(
            config.lake, config.broker_name, cache_bytes=config.store_cache_bytes, clock=config.clock
        )
        self.offsets = ConsumerOffsetManager(config.lake, config.broker_name, config.clock)
        self.transaction_producers: dict[str, list[Any]] = {}  # producer group -> live transactional producers
        self.rebalance_locks = RebalanceLockManager(clock=config.clock)  # orderly queue locks of this broker
        self.consumer_groups = ConsumerGroupManager(clock=config.clock)  # live consumer clients per group
        self._stopped = threading.Event()
        self._persister: threading.Thread | None = None
        self._services: list[BrokerService] = []  # attached by their owners: see attach
        self._subscription_groups: dict[str, SubscriptionGroupConfig] = {}
        self._subscription_lock = threading.Lock()
        self._retry_random = random.Random()  # picks a retry queue, as the broker's send-back does
        self._served: OrderedDict[int, tuple[str, int, int]] = OrderedDict()  # see _remember_served
        self._served_lock = threading.Lock()

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> Broker:
        """Lock the broker name, create missing tables, recover state, start the committer.

        Raises:
            BrokerLockedError: another live process runs a broker with this name on this lake.
            ValidationError: ``segment_size`` differs from the size this broker used before.
        """
        self._acquire_name_lock()
        try:
            for spec in (COMMITLOG, TOPIC_CONFIG, BROKERS):
                ensure_table(self.config.lake, spec)
            self.segment_size = self._settle_segment_size()
            self._log = AppendLog(
                COMMITLOG.location(self.config.lake), COMMITLOG, self.config.fsync, self.config.checkpoint_interval
            )
            self._recover()
            self.store.load()
            self.store.fed_locally = True
            self.offsets.load()
            self._load_subscription_groups()
            self._record_start()
        except BaseException:
            self._release_name_lock()
            raise
        self._running = True
        self._committer = threading.Thread(target=self._commit_loop, name=f"commit-{self.broker_name}", daemon=True)
        self._committer.start()
        self._stopped.clear()
        self._persister = threading.Thread(target=self._persist_loop, name=f"offsets-{self.broker_name}", daemon=True)
        self._persister.start()
        return self

    def attach(self, service: BrokerService) -> None:
        """Have :meth:`shutdown` stop ``service`` (a thread writing through this broker) first."""
        self._services.append(service)

    @property
    def services(self) -> tuple[BrokerService, ...]:
        """The attached services still running, in the order they were attached."""
        return tuple(self._services)

    def shutdown(self) -> None:
        """Commit everything pending, stop the committer and release the broker name."""
        while self._services:  # their rounds write through this broker: stop them first
            self._services.pop().stop()
        with self._lock:
            if not self._running:
                return
            self._running = False
            self._wake.notify_all()
        if self._committer is not None:
            self._committer.join()
        self._stopped.set()
        if self._persister is not None:
            self._persister.join()
        self.offsets.persist()
        self._log.wait_for_checkpoint()
        self._release_name_lock()

    def __enter__(self) -> Broker:
        return self if self._running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`shutdown`."""
        return self._running

    def _persist_loop(self) -> None:
        """``persistAll`` of consumer offsets every ``offset_persist_interval_ms``."""
        while not self._stopped.wait(self.config.offset_persist_interval_ms / 1000):
            try:
                self.offsets.persist()
            except Exception:  # kept pending and retried at the next round or at shutdown
                continue

    def commit_offset(
        self, group: str, topic: str, queue_id: int, offset: int, client_id: str | None = None, source: str = "consumer"
    ) -> None:
        """Commit a clustering group's next offset of one of this broker's queues (persisted to
        the lake within ``offset_persist_interval_ms``)."""
        self.offsets.commit_offset(group, topic, queue_id, offset, client_id, source)

    def lock_batch(
        self, group: str, queues: Iterable[MessageQueue], client_id: str, now: int | None = None
    ) -> set[MessageQueue]:
        """``LOCK_BATCH_MQ``: lock this broker's ``queues`` for an orderly client of ``group``;
        returns the queues it now holds (see :meth:`RebalanceLockManager.lock_batch`).

        Raises:
            ValidationError: a queue of another broker, an empty group or client id.
        """
        wanted = self._own_queues(queues)
        return self.rebalance_locks.lock_batch(group, wanted, client_id, now)

    def unlock_batch(self, group: str, queues: Iterable[MessageQueue], client_id: str) -> set[MessageQueue]:
        """``UNLOCK_BATCH_MQ``: release the locks of ``queues`` that ``client_id`` holds; returns
        the queues released.

        Raises:
            ValidationError: a queue of another broker, an empty group or client id.
        """
        return self.rebalance_locks.unlock_batch(group, self._own_queues(queues), client_id)

    def _own_queues(self, queues: Iterable[MessageQueue]) -> list[MessageQueue]:
        wanted = list(queues)
        for queue in wanted:
            if queue.broker_name != self.broker_name:
                raise ValidationError(
                    "queue.broker_name",
                    queue.broker_name,
                    f"is not this broker ({self.broker_name!r})",
                    "lock each queue on the broker that holds it",
                )
        return wanted

    def heartbeat(self, group: str, client_id: str, now: int | None = None) -> bool:
        """A consumer client's heartbeat for ``group``; True when it joined the group now."""
        return self.consumer_groups.register(group, client_id, now)

    def unregister_client(self, group: str, client_id: str) -> bool:
        """A consumer client leaves ``group`` (at its shutdown); True when it was a member."""
        return self.consumer_groups.unregister(group, client_id)

    def consumer_ids(self, group: str, now: int | None = None) -> list[str]:
        """Live client ids of ``group`` on this broker, sorted (``GET_CONSUMER_LIST_BY_GROUP``)."""
        return self.consumer_groups.client_ids(group, now)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset of the queue, -1 when none (``queryOffset``)."""
        return self.offsets.query_offset(group, topic, queue_id)

    def _acquire_name_lock(self) -> None:
        self._lock_file = BrokerNameLock(self.config.lake, self.broker_name).acquire()

    def _release_name_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.release()
            self._lock_file = None

    def _settle_segment_size(self) -> int:
        rows = read_table(self.config.lake, BROKERS, ["broker_name", "segment_size", "started_timestamp"])
        mine = rows.filter(pc.equal(rows["broker_name"], self.broker_name))
        if mine.num_rows == 0:
            size = self.config.segment_size or c.DEFAULT_SEGMENT_SIZE
        else:
            size = int(mine.sort_by([("started_timestamp", "descending")])["segment_size"][0].as_py())
            if self.config.segment_size not in (None, size):
                raise ValidationError(
                    "segment_size",
                    self.config.segment_size,
                    f"broker {self.broker_name!r} already writes segments of {size} bytes",
                    "omit segment_size or pass the stored size",
                )
        if size < 4096:
            raise ValidationError("segment_size", size, "is below 4096 bytes", "use a larger segment size")
        return size

    def _record_start(self) -> None:
        row = {
            "broker_name": [self.broker_name],
            "store_host": [self.store_host],
            "segment_size": [self.segment_size],
            "flush_mode": [self.config.flush_mode],
            "started_timestamp": [self._clock()],
            "process": [f"{os.getpid()}@{socket.gethostname()}"],
        }
        append_rows(self.config.lake, BROKERS, pa.table(row))

    # -- recovery ---------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Rebuild the next physical offset, queue offsets and topics from the lake."""
        columns = ["segment", "commit_log_offset", "store_size", "topic", "queue_id", "queue_offset", "sys_flag"]
        log = read_table(self.config.lake, COMMITLOG, columns, [("broker_name", "=", self.broker_name)])
        self.next_offset, self.segment_base, self.queue_next = recover_offsets(log)
        self.topics = self._load_topics(log)

    def _load_topics(self, log: pa.Table) -> dict[str, int]:
        config = read_table(self.config.lake, TOPIC_CONFIG)
        config = config.filter(pc.equal(config["broker_name"], self.broker_name))
        topics: dict[str, int] = {}
        for row in config.sort_by("updated_timestamp").to_pylist():
            topics[row["topic"]] = row["queue_nums"]
        if log.num_rows:
            seen = log.group_by("topic").aggregate([("queue_id", "max")]).to_pylist()
            for row in seen:
                topics[row["topic"]] = max(topics.get(row["topic"], 0), row["queue_id_max"] + 1)
        return topics

    # -- topics -----------------------------------------------------------------------------------

    def create_topic(self, topic: str, queue_nums: int = c.DEFAULT_TOPIC_QUEUE_NUMS) -> None:
        """Create or resize ``topic`` on this broker with ``queue_nums`` read/write queues."""
        validate_name(topic, "topic", 255)
        if not 1 <= queue_nums <= 1024:
            raise ValidationError("queue_nums", queue_nums, "must be in [1, 1024]")
        row = {
            "broker_name": [self.broker_name],
            "topic": [topic],
            "queue_nums": [queue_nums],
            "perm": [c.PERM_READ | c.PERM_WRITE],
            "updated_timestamp": [self._clock()],
        }
        append_rows(self.config.lake, TOPIC_CONFIG, pa.table(row))
        with self._lock:
            self.topics[topic] = queue_nums

    def queue_nums(self, topic: str) -> int | None:
        """Queue count of ``topic`` on this broker, None when the topic does not exist here."""
        return self.topics.get(topic)

    def ensure_topic(self, topic: str, queue_nums: int | None = None) -> int:
        """Create ``topic`` if it does not exist (with its system default queue count)."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing
        nums = queue_nums or default_queue_nums(topic)
        self.create_topic(topic, nums)
        return nums

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's next offset to be written (its message count so far)."""
        return self.queue_next.get((topic, queue_id), 0)

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        tag_expression: str | None = "*",
        suspend_timeout_ms: int = 0,
        long_polling: bool = True,
    ) -> PullResult:
        """Pull from one of this broker's queues (see :meth:`MessageStore.pull`); the queue must
        be committed to be visible, as RocketMQ only serves dispatched messages."""
        result = self.store.pull(topic, queue_id, offset, max_msgs, tag_expression, suspend_timeout_ms, long_polling)
        self._remember_served(result.messages)
        return result

    # -- subscription groups, retries and dead letters ---------------------------------------------

    def update_subscription_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create or change a consumer group's settings on this broker
        (``updateAndCreateSubscriptionGroup``): appends one ``subscription_group`` row and applies
        it at once. Returns the settings as stored, with an ``updated_timestamp`` strictly greater
        than the group's previous one.

        Raises:
            ValidationError: a bad group name or setting; nothing is written.
        """
        config.validate()
        with self._subscription_lock:
            previous = self._subscription_groups.get(config.group)
            moment = self._clock()
            if previous is not None and moment <= previous.updated_timestamp:
                moment = previous.updated_timestamp + 1
            stored = replace(config, updated_timestamp=moment)
            row = {"broker_name": self.broker_name, **vars(stored)}
            rows = pa.Table.from_pylist([row], SUBSCRIPTION_GROUP.arrow_schema)
            append_rows(self.config.lake, SUBSCRIPTION_GROUP, rows)
            self._subscription_groups[stored.group] = stored
        return stored

    def subscription_group(self, group: str) -> SubscriptionGroupConfig:
        """The group's settings on this broker: its latest ``subscription_group`` row, or the
        defaults when it has none (RocketMQ auto-creates a missing group with the defaults).

        Raises:
            ValidationError: a bad group name.
        """
        validate_name(group, "group", c.GROUP_MAX_LENGTH)
        with self._subscription_lock:
            found = self._subscription_groups.get(group)
        return found if found is not None else SubscriptionGroupConfig(group)

    def _load_subscription_groups(self) -> None:
        """This broker's latest row per group of ``subscription_group`` (read at start)."""
        table = read_table(self.config.lake, SUBSCRIPTION_GROUP)
        table = table.filter(pc.equal(table["broker_name"], self.broker_name))
        groups: dict[str, SubscriptionGroupConfig] = {}
        for row in table.sort_by("updated_timestamp").to_pylist():
            del row["broker_name"]
            groups[row["group"]] = SubscriptionGroupConfig(**row)
        with self._subscription_lock:
            self._subscription_groups = groups

    def consumer_send_back(
        self,
        group: str,
        commit_log_offset: int,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        reconsume_times: int | None = None,
        origin_msg_id: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        """``CONSUMER_SEND_MSG_BACK``: store again a message a consumer of ``group`` failed on, as a
        retry or as a dead letter (FACTS 7.3, RocketMQ 5.3).

        The original record is read back by ``commit_log_offset`` from this broker. Let ``times``
        be ``reconsume_times`` (None: the stored record's count) and ``limit`` be
        ``max_reconsume_times`` (None: the group's ``retry_max_times``, default 16).

        - ``times >= limit`` or ``delay_level < 0``: a dead letter in ``%DLQ%group`` queue 0,
          stored directly (DELAY set to 0, as RocketMQ stores it).
        - otherwise a retry in ``%RETRY%group`` (created with the group's ``retry_queue_nums``
          queues, one picked at random) with DELAY = ``delay_level``, or ``3 + times`` when 0,
          so that the put redirects it to ``SCHEDULE_TOPIC_XXXX`` until the level's delay passes.

        The copy keeps body (as stored), flag, properties, sys flag, born time and born host; it
        has ``reconsume_times = times + 1``, WAIT=false, RETRY_TOPIC (the original's topic unless
        already set) and ORIGIN_MESSAGE_ID (the original's ``msg_id``, the offset message id,
        unless already set, so it names the first stored copy through every retry).
        ``origin_msg_id`` is the client's id of the message, which RocketMQ's request carries for
        its hooks only; it is not stored. ``properties`` are added to the copy's (a tool that
        dead-letters a message on a group's behalf marks the copy with them).

        Returns:
            where the copy went (the schedule topic and level queue for a retry). When the group's
            ``retry_queue_nums`` is 0 nothing is stored and the offsets are empty (RocketMQ then
            answers SUCCESS).

        Raises:
            ValidationError: a bad group name, a negative ``commit_log_offset`` or
                ``reconsume_times``, or no message at ``commit_log_offset``; nothing is written.
            BrokerError, CommitFailedError: as :meth:`put_messages`.
        """
        validate_name(group, "group", c.GROUP_MAX_LENGTH)
        for name, value in (
            ("delay_level", delay_level),
            ("max_reconsume_times", max_reconsume_times),
            ("reconsume_times", reconsume_times),
        ):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValidationError(name, value, "must be an int")
        if reconsume_times is not None and reconsume_times < 0:
            raise ValidationError("reconsume_times", reconsume_times, "must not be negative")
        original = self._look_message_by_offset(commit_log_offset)
        config = self.subscription_group(group)
        if config.retry_queue_nums <= 0:
            return PutResult(self.broker_name, c.RETRY_GROUP_TOPIC_PREFIX + group, -1, (), (), (), self._clock())
        times = original.reconsume_times if reconsume_times is None else reconsume_times
        limit = config.retry_max_times if max_reconsume_times is None else max_reconsume_times
        copied = {**original.properties, **(properties or {})}
        copied.setdefault(c.PROPERTY_RETRY_TOPIC, original.topic)
        copied[c.PROPERTY_WAIT_STORE_MSG_OK] = "false"
        if not (copied.get(c.PROPERTY_ORIGIN_MESSAGE_ID) or "").strip():
            copied[c.PROPERTY_ORIGIN_MESSAGE_ID] = original.msg_id
        if times >= limit or delay_level < 0:
            topic, queue_id = c.DLQ_GROUP_TOPIC_PREFIX + group, 0
            self._ensure_send_back_topic(topic, c.DLQ_NUMS_PER_GROUP)
            copied[c.PROPERTY_DELAY_TIME_LEVEL] = "0"
        else:
            topic, queue_id = c.RETRY_GROUP_TOPIC_PREFIX + group, self._retry_random.randrange(config.retry_queue_nums)
            self._ensure_send_back_topic(topic, config.retry_queue_nums)
            copied[c.PROPERTY_DELAY_TIME_LEVEL] = str(delay_level or c.FIRST_RETRY_DELAY_LEVEL + times)
        host_bits = c.BORNHOST_V6_FLAG | c.STOREHOSTADDRESS_V6_FLAG  # the put sets them for this record
        return self.put_message(
            InnerMessage(
                topic,
                queue_id,
                original.body,
                copied,
                original.flag,
                original.sys_flag & ~host_bits,
                original.born_timestamp,
                original.born_host,
                times + 1,
            )
        )

    def _ensure_send_back_topic(self, topic: str, queue_nums: int) -> None:
        """``createTopicInSendMessageBackMethod``; a retry topic with fewer queues than the group
        now wants is grown, so that consumers see every queue a retry can land in."""
        with self._subscription_lock:
            if (self.topics.get(topic) or 0) < queue_nums:
                self.create_topic(topic, queue_nums)

    def _remember_served(self, messages: Sequence[MessageExt]) -> None:
        """Remember where recently pulled messages sit (commit log offset -> topic, queue, queue
        offset): the store indexes by queue, and a send-back names a message by its commit log
        offset only. Bounded; a forgotten message is found by a slower search."""
        if not messages:
            return
        with self._served_lock:
            for message in messages:
                self._served[message.commit_log_offset] = (message.topic, message.queue_id, message.queue_offset)
                self._served.move_to_end(message.commit_log_offset)
            while len(self._served) > _SERVED_CAPACITY:
                self._served.popitem(last=False)

    def _look_message_by_offset(self, commit_log_offset: int) -> MessageExt:
        """``lookMessageByOffset``: the dispatched record at ``commit_log_offset``, body as stored.

        Raises:
            ValidationError: not a non-negative int, or no dispatched record starts there.
        """
        if not isinstance(commit_log_offset, int) or isinstance(commit_log_offset, bool) or commit_log_offset < 0:
            raise ValidationError("commit_log_offset", commit_log_offset, "must be a non-negative int")
        with self._served_lock:
            place = self._served.get(commit_log_offset)
        found = None if place is None else self.store.message_at(*place, decompress=False)
        if found is None or found.commit_log_offset != commit_log_offset:
            found = self.store.message_by_offset(commit_log_offset)
        if found is None:
            found = self._search_queues(commit_log_offset)
        if found is None:
            raise ValidationError(
                "commit_log_offset",
                commit_log_offset,
                f"no message is stored there on broker {self.broker_name!r}",
                "pass the commit_log_offset of a message pulled from this broker",
            )
        return found

    def _search_queues(self, commit_log_offset: int) -> MessageExt | None:
        """Binary search of every consume queue (commit log offsets rise with queue offsets)."""
        if commit_log_offset >= self.next_offset:
            return None
        self.flush()  # an ASYNC_FLUSH put becomes readable once committed
        store = self.store
        for topic, queue_id in store.queues():
            low, high = 0, store.max_offset(topic, queue_id) - 1
            while low <= high:
                middle = (low + high) // 2
                message = store.message_at(topic, queue_id, middle, decompress=False)
                if message is None:
                    break
                if message.commit_log_offset == commit_log_offset:
                    return message
                if message.commit_log_offset < commit_log_offset:
                    low = middle + 1
                else:
                    high = middle - 1
        return None

    # -- the append path --------------------------------------------------------------------------

    def put_message(self, message: InnerMessage) -> PutResult:
        """Store one message; see :meth:`put_messages`."""
        return self.put_messages([message])

    def put_messages(self, messages: Sequence[InnerMessage]) -> PutResult:
        """Store messages as consecutive records, in one commit.

        A message with ``DELAY > 0`` (and a non-transactional or commit type) is redirected to
        ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, its real topic and queue kept in
        properties. Under SYNC_FLUSH this returns once the commit is durable. The broker may add
        properties to the given messages' property dicts (CLUSTER, REAL_TOPIC, REAL_QID).

        Raises:
            ValidationError: a record too large for the store or a segment; nothing is stored.
            CommitFailedError: the commit failed after its retries; nothing is stored.
            BrokerError: the broker is not running.
        """
        if not messages:
            raise ValidationError("messages", [], "nothing to put")
        records = self._prepare(messages)
        with self._lock:
            if not self._running:
                raise BrokerError(f"broker {self.broker_name!r} is not running; start it first")
            store_timestamp = self._clock()
            if self._pending is None:
                self._pending = _Group()
            group = self._pending
            placed = self._place(records)
            fixed = {"broker_name": self.broker_name, "store_host": self.store_host, "store_timestamp": store_timestamp}
            group.columns.extend(fixed, placed, records)
            group.size += len(records.sizes)
            self._wake.notify()
        if self.config.flush_mode == "SYNC_FLUSH":
            group.done.wait()
            if group.error is not None:
                raise CommitFailedError(
                    f"broker {self.broker_name!r}: commit failed, message not stored: {group.error}"
                ) from group.error
        return PutResult(
            self.broker_name,
            records.topics[0],
            records.queue_ids[0],
            tuple(placed["queue_offset"]),
            tuple(placed["commit_log_offset"]),
            tuple(placed["msg_id"]),
            store_timestamp,
        )

    def flush(self) -> None:
        """Wait until everything put so far is committed.

        Raises:
            CommitFailedError: a pending commit failed (ASYNC_FLUSH sends that were lost).
        """
        with self._lock:
            groups = [g for g in (self._committing, self._pending) if g is not None]
        for group in groups:
            group.done.wait()
        failed = [g.error for g in groups if g.error is not None]
        if failed:
            raise CommitFailedError(f"broker {self.broker_name!r}: {len(failed)} commit(s) failed: {failed[0]}")

    def _prepare(self, messages: Sequence[InnerMessage]) -> _Prepared:
        """Everything about the records that does not depend on their position.

        Raises:
            ValidationError: a bad DELAY, properties over 32767 bytes, a body over the max
                message size, a record that does not fit a segment, a negative queue id.
        """
        routed = [self._route(m) for m in messages]
        topics = [r[0] for r in routed]
        properties = [r[2] for r in routed]
        flags = [r[3] for r in routed]
        raw = [encode_properties(p).encode("utf-8") for p in properties]
        hosts = [_host_text(m.born_host, "born_host") for m in messages]
        store_v6 = self._store_address.is_v6
        store_bit = c.STOREHOSTADDRESS_V6_FLAG if store_v6 else 0
        born_bits = [c.BORNHOST_V6_FLAG if h[1] else 0 for h in hosts]
        sys_flags = [flag | store_bit | bit for flag, bit in zip(flags, born_bits, strict=True)]
        magics = [magic_for_topic(t) for t in topics]
        sizes = [
            _fixed_length(h[1], store_v6, mg == c.MAGIC_CODE_V2) + len(m.body) + _utf8_length(t) + len(r)
            for m, h, mg, t, r in zip(messages, hosts, magics, topics, raw, strict=True)
        ]
        records = _Prepared(
            messages,
            topics,
            [r[1] for r in routed],
            properties,
            raw,
            [h[0] for h in hosts],
            sys_flags,
            magics,
            sizes,
            [zlib.crc32(m.body) & 0x7FFFFFFF for m in messages],
        )
        self._check_sizes(records)
        return records

    def _route(self, message: InnerMessage) -> tuple[str, int, dict[str, str], int]:
        """(topic, queue id, properties, sys flag) a message is stored with: a prepared
        transactional message becomes a half message (``parseHalfMessageInner``), a delayed one goes
        to the schedule topic, and every stored message carries the CLUSTER property."""
        properties = message.properties
        if c.PROPERTY_CLUSTER not in properties:
            properties[c.PROPERTY_CLUSTER] = self.config.cluster_name
        transaction = message.sys_flag & c.TRANSACTION_ROLLBACK_TYPE
        if transaction == c.TRANSACTION_PREPARED_TYPE and properties.get(c.PROPERTY_TRANSACTION_PREPARED) == "true":
            properties[c.PROPERTY_REAL_TOPIC] = message.topic
            properties[c.PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
            uniq_key = properties.get(c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            if uniq_key:
                properties[c.PROPERTY_TRANSACTION_ID] = uniq_key
            sys_flag = message.sys_flag & ~c.TRANSACTION_ROLLBACK_TYPE  # resetTransactionValue(NOT)
            return c.RMQ_SYS_TRANS_HALF_TOPIC, 0, properties, sys_flag
        delay = properties.get(c.PROPERTY_DELAY_TIME_LEVEL)
        if not delay:
            return message.topic, message.queue_id, properties, message.sys_flag
        if not delay.lstrip("-").isdigit():
            raise ValidationError("DELAY", delay, "is not an integer delay level", "use 0..18")
        if int(delay) > 0 and transaction in (c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE):
            properties[c.PROPERTY_REAL_TOPIC] = message.topic
            properties[c.PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
            return c.SCHEDULE_TOPIC, min(int(delay), c.MAX_DELAY_LEVEL) - 1, properties, message.sys_flag
        return message.topic, message.queue_id, properties, message.sys_flag

    def _check_sizes(self, records: _Prepared) -> None:
        limit = self.config.max_message_size
        rows = zip(records.messages, records.raw_properties, records.sizes, strict=True)
        for index, (message, raw, size) in enumerate(rows):
            if len(raw) > c.MAX_PROPERTIES_LENGTH:
                raise ValidationError(
                    f"messages[{index}].properties", f"<{len(raw)} bytes>", f"over {c.MAX_PROPERTIES_LENGTH} bytes"
                )
            if len(message.body) > limit or size > limit + c.MAX_RECORD_SLACK:
                raise ValidationError(
                    f"messages[{index}].body", f"<{len(message.body)} bytes>", "over the broker's max message size"
                )
            if size + c.END_FILE_MIN_BLANK_LENGTH > self.segment_size:
                raise ValidationError(
                    "store_size", size, f"does not fit a segment of {self.segment_size} bytes", "use larger segments"
                )
            if message.queue_id < 0:
                raise ValidationError(f"messages[{index}].queue_id", message.queue_id, "must not be negative")

    def _place(self, records: _Prepared) -> dict[str, list[Any]]:
        """Give every record its physical offset, segment and queue offset (caller holds the
        lock); returns those columns plus msg_id."""
        offsets, segments, queue_offsets = [], [], []
        dispatched = (c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE)
        rows = zip(records.sizes, records.topics, records.queue_ids, records.sys_flags, strict=True)
        for size, topic, queue_id, sys_flag in rows:
            if self.next_offset + size + c.END_FILE_MIN_BLANK_LENGTH > self.segment_base + self.segment_size:
                # the rest of the segment becomes the blank; the record starts the next segment
                self.segment_base += self.segment_size
                self.next_offset = self.segment_base
            offsets.append(self.next_offset)
            segments.append(self.segment_base)
            self.next_offset += size
            queue_offset = 0
            if sys_flag & c.TRANSACTION_ROLLBACK_TYPE in dispatched:
                key = (topic, queue_id)
                queue_offset = self.queue_next.get(key, 0)
                self.queue_next[key] = queue_offset + 1
            queue_offsets.append(queue_offset)
        prefix, pack = self._msg_id_prefix, _LONG.pack
        return {
            "segment": segments,
            "commit_log_offset": offsets,
            "queue_offset": queue_offsets,
            "msg_id": [(prefix + pack(o)).hex().upper() for o in offsets],
        }

    # -- the committer ----------------------------------------------------------------------------

    def _commit_loop(self) -> None:
        while True:
            with self._lock:
                while self._pending is None and self._running:
                    self._wake.wait()
                if self._pending is None:
                    return
                self._linger()
                group, self._pending = self._pending, None
                self._committing = group
            self._commit_group(group)

    def _linger(self) -> None:
        """Let a group grow while puts are still arriving (caller holds the lock).

        Waits in steps of ``group_commit_step_ms`` for as long as the pending group grew during the
        last step, at most ``group_commit_linger_ms`` in all: many concurrent senders share one
        commit, a lone sender waits one step at most (RocketMQ's group commit waits up to 10 ms).
        """
        step = self.config.group_commit_step_ms / 1000
        deadline = time.monotonic() + self.config.group_commit_linger_ms / 1000
        size = -1
        while self._pending is not None and self._running and size != self._pending.size:
            size = self._pending.size
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wake.wait(min(step, remaining))

    def _commit_group(self, group: _Group) -> None:
        error: BaseException | None = None
        for attempt in range(self.config.commit_retries + 1):
            try:
                adds = self._log.write_files(group.columns.to_table())
                version = self._log.commit(adds)
                self.commits += 1
                break
            except Exception as exc:  # retried, then reported to every waiting sender
                error = exc
                time.sleep(0.01 * (attempt + 1))
        else:
            self._fail(group, error)
            return
        self.store.dispatch_commit(version, [(unquote(a.path), a.rows) for a in adds if a.rows is not None])
        with self._lock:
            self._committing = None
        group.done.set()

    def _fail(self, group: _Group, error: BaseException | None) -> None:
        """A commit failed for good: fail it and everything put after it, then re-read the log so
        that offsets continue from what is really stored."""
        with self._lock:
            failed = [group] if self._pending is None else [group, self._pending]
            self._pending = None
            self._committing = None
            for each in failed:
                each.error = error
                each.done.set()
            self._recover()


_LONG = struct.Struct(">q")
_SERVED_CAPACITY = 32768  # pulled messages whose queue position the broker remembers for send-backs


@functools.lru_cache(maxsize=16)
def _fixed_length(born_v6: bool, store_v6: bool, magic_v2: bool) -> int:
    """Record length without body, topic and property bytes."""
    return record_length(0, 0, 0, born_v6, store_v6, magic_v2)


@functools.lru_cache(maxsize=4096)
def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8"))


@functools.lru_cache(maxsize=1024)
def _host_text(text: str, field: str) -> tuple[str, bool]:
    """(canonical ip:port text, is IPv6) of a host string; cached, hosts repeat."""
    host = parse_host(text, field)
    return str(host), host.is_v6


def default_queue_nums(topic: str) -> int:
    """Queue count a topic gets when auto-created, by kind of topic."""
    if topic == c.SCHEDULE_TOPIC:
        return c.SCHEDULE_TOPIC_QUEUE_NUMS
    if topic.startswith((c.RETRY_GROUP_TOPIC_PREFIX, c.DLQ_GROUP_TOPIC_PREFIX)) or topic in (
        c.RMQ_SYS_TRANS_HALF_TOPIC,
        c.RMQ_SYS_TRANS_OP_HALF_TOPIC,
        c.TRANS_CHECK_MAX_TIME_TOPIC,
    ):
        return 1
    return c.DEFAULT_TOPIC_QUEUE_NUMS
