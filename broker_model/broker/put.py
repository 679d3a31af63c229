"""The put path: exact physical and queue offsets for each put, and the committer thread that turns
everything pending into one Delta commit (group commit, SYNC_FLUSH and ASYNC_FLUSH)."""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from broker_model.broker.config import BrokerConfig, InnerMessage, PutResult, TopicConfig
from broker_model.common import constants as c
from broker_model.common import encode_properties, is_dispatched, parse_delay_level, parse_host, schedule_level
from broker_model.common.codec import HostAddress
from broker_model.common.message import validate_name
from broker_model.store import (
    magic_for_topic,
    record_length,
)
from broker_model.store.append_log import AppendLog
from broker_model.store.commitlog import recover_offsets
from broker_model.store.delta_commits import latest_version
from broker_model.store.delta_tables import append_rows, read_table
from broker_model.store.message_store import MessageStore
from broker_model.store.store_configs import latest_rows
from schemas.catalog import COMMITLOG, TOPIC_CONFIG
from schemas.errors import BrokerError, CommitFailedError, ValidationError

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class PreparedPut:
    """Records before they have a position, as column lists (what :meth:`PutPath.prepare_put`
    computes, the broker's lock not taken)."""

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
        self.batches: list[tuple[dict[str, Any], dict[str, list[Any]], PreparedPut]] = []

    def extend(self, fixed: dict[str, Any], placed: dict[str, list[Any]], records: PreparedPut) -> None:
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


TOPIC_REFRESH_S = 1.0
"""How often, at most, a broker looks for topic configurations written while it runs."""

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


def _record_column(records: PreparedPut, name: str) -> list[Any]:
    if name in _RECORD_FIELDS:
        values: list[Any] = getattr(records, _RECORD_FIELDS[name])
        return values
    if name in _MESSAGE_FIELDS:
        return [getattr(m, name) for m in records.messages]
    key = _PROPERTY_FIELDS[name]
    return [p.get(key) for p in records.properties]


class _Completion:
    """Set once, waited on by any number of threads, or called back.

    A lock held from creation until :meth:`set`: each waiter takes and hands it back in turn,
    so a commit wakes its senders without a condition variable all of them contend for.
    """

    __slots__ = ("_callbacks", "_guard", "_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False
        self._guard = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        """Complete it (once), wake every waiter and run every callback."""
        with self._guard:
            if self._set:
                return
            self._set = True
            callbacks, self._callbacks = self._callbacks, []
        self._lock.release()
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a waiter's failure must not stop the committer or the other waiters
                _log.exception("a commit's completion callback failed")

    def wait(self) -> None:
        """Return once :meth:`set` was called."""
        if not self._set:
            with self._lock:
                pass

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once set: from the thread that sets it, or now when it is set already."""
        with self._guard:
            if not self._set:
                self._callbacks.append(callback)
                return
        callback()


class PutGroup:
    """Records put together and committed together; completion is shared."""

    def __init__(self) -> None:
        self.columns = _Columns()
        self.size = 0  # records so far
        self.puts = 0  # puts that added them
        self.done = _Completion()
        self.error: BaseException | None = None


class PendingPut:
    """A put placed in a group that may not be committed yet: where its messages go (``result``)
    and the group's commit, to wait for (:meth:`wait`) or be called back on (:meth:`add_callback`,
    then :meth:`check`)."""

    __slots__ = ("_group", "result")

    def __init__(self, result: PutResult, group: PutGroup) -> None:
        self.result = result
        self._group = group

    def wait(self) -> None:
        """Return once the commit is done.

        Raises:
            CommitFailedError: the commit failed after its retries; nothing is stored.
        """
        self._group.done.wait()
        self.check()

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the committing thread) once the commit is done or failed."""
        self._group.done.add_callback(callback)

    def check(self) -> None:
        """Raise when the commit, done, failed.

        Raises:
            CommitFailedError: the commit failed after its retries; nothing is stored.
        """
        error = self._group.error
        if error is not None:
            raise CommitFailedError(
                f"broker {self.result.broker_name!r}: commit failed, message not stored: {error}"
            ) from error


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


class PutPath:
    """The put path of a :class:`~broker_model.broker.controller.Broker` (a mixin: the broker holds the state).

    It owns the broker's topics and offsets: the next physical offset, the segment being written and
    every queue's next offset, recovered from the log on start.
    """

    config: BrokerConfig
    broker_name: str
    store_host: str
    store: MessageStore
    _store_address: HostAddress
    _msg_id_prefix: bytes
    _clock: Callable[[], int]
    _lock: threading.Lock
    _wake: threading.Condition
    _pending: PutGroup | None
    _committing: PutGroup | None
    _recent_puts: collections.deque[int]
    _full_group: int
    _running: bool
    _failed: BaseException | None
    _log: AppendLog
    segment_size: int
    next_commit_log_offset: int
    segment_base: int
    max_offsets: dict[tuple[str, int], int]
    topics: dict[str, int]
    topic_configs: dict[str, TopicConfig]
    _topic_times: dict[str, int]
    _topic_configs_version: int
    _topic_configs_checked: float  # when the table was last looked at, once the look is done
    _topics_refresh_lock: threading.Lock
    commits: int
    lingered_steps: int

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
        put = self.submit_messages(messages)
        if self.config.flush_mode == "SYNC_FLUSH":
            put.wait()
        return put.result

    def submit_messages(self, messages: Sequence[InnerMessage]) -> PendingPut:
        """Place messages as :meth:`put_messages` does and return at once: the result is known
        before the commit, which the returned put waits for or calls back on.

        Raises:
            ValidationError, BrokerError: as :meth:`put_messages`; nothing is stored.
        """
        return self.submit_prepared(self.prepare_put(messages))

    def prepare_put(self, messages: Sequence[InnerMessage]) -> PreparedPut:
        """Check and encode messages for :meth:`try_submit_prepared` (no lock taken).

        Raises:
            ValidationError: as :meth:`put_messages`.
        """
        if not messages:
            raise ValidationError("messages", [], "nothing to put")
        return self._prepare(messages)

    def try_submit_prepared(self, records: PreparedPut) -> PendingPut | None:
        """Place prepared records as :meth:`submit_messages` does, or return None, having placed
        nothing, when that would block: the broker's lock is held elsewhere, or the broker must
        first re-read its log after a failed commit. A caller that must not block (an event loop)
        then submits them from a thread with :meth:`submit_prepared`.

        Raises:
            BrokerError: the broker is not running.
        """
        return self._submit(records, block=False)

    def submit_prepared(self, records: PreparedPut) -> PendingPut:
        """Place prepared records as :meth:`submit_messages` does, waiting for the lock.

        Raises:
            BrokerError: as :meth:`put_messages`.
        """
        put = self._submit(records, block=True)
        assert put is not None  # a blocking submit always places
        return put

    def _submit(self, records: PreparedPut, block: bool) -> PendingPut | None:
        if not self._lock.acquire(blocking=block):
            return None
        try:
            if not self._running:
                raise BrokerError(f"broker {self.broker_name!r} is not running; start it first")
            if self._failed is not None:
                if not block:
                    return None  # re-reading the log takes a while
                self._recover_or_mark_failed()
            if self._failed is not None:
                raise BrokerError(
                    f"broker {self.broker_name!r} cannot read its commit log after a failed commit, so its offsets are "
                    f"unknown: {self._failed}; nothing was stored, put again once the log is readable"
                ) from self._failed
            store_timestamp = self._clock()
            if self._pending is None:
                self._pending = PutGroup()
                self._wake.notify()  # the committer waits for a group; a lingering one polls
            group = self._pending
            placed = self._place(records)
            fixed = {"broker_name": self.broker_name, "store_host": self.store_host, "store_timestamp": store_timestamp}
            group.columns.extend(fixed, placed, records)
            group.size += len(records.sizes)
            group.puts += 1
            if group.puts == self._full_group:
                self._wake.notify()  # every recent sender is back: the lingering committer goes on
        finally:
            self._lock.release()
        result = PutResult(
            self.broker_name,
            records.topics[0],
            records.queue_ids[0],
            tuple(placed["queue_offset"]),
            tuple(placed["commit_log_offset"]),
            tuple(placed["msg_id"]),
            store_timestamp,
        )
        return PendingPut(result, group)

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

    def _prepare(self, messages: Sequence[InnerMessage]) -> PreparedPut:
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
        records = PreparedPut(
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
        if not delay or parse_delay_level(delay) == 0:
            timer = self._timer_route(message, transaction)
            if timer is not None:
                return timer
        if not delay:
            return message.topic, message.queue_id, properties, message.sys_flag
        if parse_delay_level(delay) is None:
            raise ValidationError("DELAY", delay, "is not an integer delay level", "use 0..18")
        level = schedule_level(delay)
        if level is not None and is_dispatched(message.sys_flag):
            properties[c.PROPERTY_REAL_TOPIC] = message.topic
            properties[c.PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
            return c.SCHEDULE_TOPIC, level - 1, properties, message.sys_flag
        return message.topic, message.queue_id, properties, message.sys_flag

    def _timer_route(self, message: InnerMessage, transaction: int) -> tuple[str, int, dict[str, str], int] | None:
        """RocketMQ 5's timer messages (``HookUtils.handleScheduleMessage``): a plain or committed
        message with a delivery time (``TIMER_DELIVER_MS``, or ``TIMER_DELAY_MS``/``TIMER_DELAY_SEC``
        after now) still in the future is stored in the timer topic, queue 0, waiting for
        ``TIMER_OUT_MS``, its real topic and queue in its properties; one already due is stored
        as it is. Not rounded to a precision: it is delivered at its millisecond, never before
        (RocketMQ rounds down to ``timerPrecisionMs``, 1 s by default). A timer record or a copy
        it delivered (``TIMER_OUT_MS`` set) is never transformed again.

        Raises:
            ValidationError: a delivery time that is not a number, or more than 3 days ahead.
        """
        properties = message.properties
        keys = (c.PROPERTY_TIMER_DELIVER_MS, c.PROPERTY_TIMER_DELAY_MS, c.PROPERTY_TIMER_DELAY_SEC)
        if transaction not in (c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE):
            return None
        if not any(k in properties for k in keys):
            return None
        if message.topic == c.TIMER_TOPIC or c.PROPERTY_TIMER_OUT_MS in properties:
            return None
        now = self.config.clock()
        # the first of these that is set wins, as in HookUtils: (key, time it counts from, ms per unit)
        rules = ((c.PROPERTY_TIMER_DELAY_SEC, now, 1000), (c.PROPERTY_TIMER_DELAY_MS, now, 1), (keys[0], 0, 1))
        key, start, unit = next(rule for rule in rules if rule[0] in properties)
        try:
            deliver = start + int(properties[key]) * unit
        except ValueError:
            raise ValidationError(key, properties[key], "is not a whole number", "give a time in ms (or s)") from None
        if deliver <= now:
            return None
        if deliver - now > c.TIMER_MAX_DELAY_MS:
            raise ValidationError(key, properties[key], "is more than 3 days ahead", "the max is 3 days")
        properties[c.PROPERTY_TIMER_OUT_MS] = str(deliver)
        properties[c.PROPERTY_REAL_TOPIC] = message.topic
        properties[c.PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
        return c.TIMER_TOPIC, 0, properties, message.sys_flag

    def _check_sizes(self, records: PreparedPut) -> None:
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

    def _place(self, records: PreparedPut) -> dict[str, list[Any]]:
        """Give every record its physical offset, segment and queue offset (caller holds the
        lock); returns those columns plus msg_id."""
        offsets, segments, queue_offsets = [], [], []
        rows = zip(records.sizes, records.topics, records.queue_ids, records.sys_flags, strict=True)
        for size, topic, queue_id, sys_flag in rows:
            if self.next_commit_log_offset + size + c.END_FILE_MIN_BLANK_LENGTH > self.segment_base + self.segment_size:
                # the rest of the segment becomes the blank; the record starts the next segment
                self.segment_base += self.segment_size
                self.next_commit_log_offset = self.segment_base
            offsets.append(self.next_commit_log_offset)
            segments.append(self.segment_base)
            self.next_commit_log_offset += size
            queue_offset = 0
            if is_dispatched(sys_flag):
                key = (topic, queue_id)
                queue_offset = self.max_offsets.get(key, 0)
                self.max_offsets[key] = queue_offset + 1
            queue_offsets.append(queue_offset)
        prefix = self._msg_id_prefix.hex().upper()  # offsets are never negative: 16 hex digits
        return {
            "segment": segments,
            "commit_log_offset": offsets,
            "queue_offset": queue_offsets,
            "msg_id": [f"{prefix}{o:016X}" for o in offsets],
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
                self._recent_puts.append(group.puts)
                self._full_group = max(self._recent_puts)
            self._commit_group(group)

    def _linger(self) -> None:
        """Let a group grow while puts are still arriving (caller holds the lock).

        Waits in steps of ``group_commit_step_ms`` for as long as the pending group grew during the
        last step, at most ``group_commit_linger_ms`` in all: many concurrent senders share one
        commit (RocketMQ's group commit waits up to 10 ms). It stops as soon as the group holds as
        many puts as the largest of the last commits (the senders of those are all back), so a lone
        sender, whose commits hold one put each, does not wait at all.
        """
        full = self._full_group
        step = self.config.group_commit_step_ms / 1000
        deadline = time.monotonic() + self.config.group_commit_linger_ms / 1000
        size = -1
        while self._pending is not None and self._running and size != self._pending.size:
            if 0 < full <= self._pending.puts:
                return
            size = self._pending.size
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if not self._wake.wait(min(step, remaining)):
                self.lingered_steps += 1

    def _commit_group(self, group: PutGroup) -> None:
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

    def _fail(self, group: PutGroup, error: BaseException | None) -> None:
        """A commit failed for good: fail it and everything put after it, then re-read the log so
        that offsets continue from what is really stored."""
        with self._lock:
            failed = [group] if self._pending is None else [group, self._pending]
            self._pending = None
            self._committing = None
            self._recover_or_mark_failed()
            for each in failed:
                each.error = error
                each.done.set()

    def _recover_or_mark_failed(self) -> None:
        """Re-read the offsets from the log (caller holds the lock); when the log cannot be read
        now, remember why, so that the next put tries again instead of placing records at offsets
        the broker cannot know (and the committer thread lives on)."""
        try:
            self._recover()
        except Exception as exc:  # kept for the next put, which retries the recovery
            self._failed = exc
        else:
            self._failed = None

    # -- recovery ---------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Rebuild the next physical offset, queue offsets and topics from the lake."""
        columns = ["segment", "commit_log_offset", "store_size", "topic", "queue_id", "queue_offset", "sys_flag"]
        log = read_table(self.config.lake, COMMITLOG, columns, [("broker_name", "=", self.broker_name)])
        self.next_commit_log_offset, self.segment_base, self.max_offsets = recover_offsets(log)
        self.topics = self._load_topics(log)

    def _load_topics(self, log: pa.Table) -> dict[str, int]:
        """The queue count of every topic (at least what the log shows); sets :attr:`topic_configs`
        (at a start, or with the lock held by a recovering put)."""
        configs, times, version = self._read_topic_configs()
        self.topic_configs, self._topic_times, self._topic_configs_version = configs, times, version
        self._topic_configs_checked = time.monotonic()
        topics = {topic: config.queue_nums for topic, config in configs.items()}
        if log.num_rows:
            seen = log.group_by("topic").aggregate([("queue_id", "max")]).to_pylist()
            for row in seen:
                topics[row["topic"]] = max(topics.get(row["topic"], 0), row["queue_id_max"] + 1)
        return topics

    def _read_topic_configs(self) -> tuple[dict[str, TopicConfig], dict[str, int], int]:
        """This broker's latest ``topic_config`` row per topic, the time of each, and the table's
        version before the read (a row written meanwhile is read again by the next refresh)."""
        version = latest_version(TOPIC_CONFIG.location(self.config.lake))
        latest = latest_rows(self.config.lake, TOPIC_CONFIG, self.broker_name, ("topic",), "updated_timestamp")
        configs = {
            topic: TopicConfig(topic, row["queue_nums"], row["perm"], row["message_type"])
            for (topic,), row in latest.items()
        }
        return configs, {topic: row["updated_timestamp"] for (topic,), row in latest.items()}, version

    def topics_refresh_due(self, interval_s: float = TOPIC_REFRESH_S) -> bool:
        """Whether :meth:`refresh_topics` would look at the table now."""
        return time.monotonic() - self._topic_configs_checked >= interval_s

    def refresh_topics(self, interval_s: float = TOPIC_REFRESH_S) -> None:
        """Apply the ``topic_config`` rows written since this broker read them (an operator's
        ``admin updateTopic`` while it runs): looked for at most once per ``interval_s``, read only
        when the table has a new version. A topic whose row changed gets the row's settings, and
        as at a start at least the queues its log holds."""
        if not self.topics_refresh_due(interval_s):
            return
        with self._topics_refresh_lock:  # a caller that comes during a read waits for it (as for groups)
            if self.topics_refresh_due(interval_s):
                try:
                    self._apply_topic_configs()
                finally:  # a table that cannot be read is tried again after the interval
                    self._topic_configs_checked = time.monotonic()

    def _apply_topic_configs(self) -> None:
        if latest_version(TOPIC_CONFIG.location(self.config.lake)) == self._topic_configs_version:
            return
        configs, times, version = self._read_topic_configs()
        with self._lock:
            if version < self._topic_configs_version:  # a recovery read a later version meanwhile
                return
            before = self.topic_configs
            self.topic_configs, self._topic_times, self._topic_configs_version = configs, times, version
            changed = {topic for topic, config in configs.items() if before.get(topic) != config}
            logged: dict[str, int] = {}
            for topic, queue_id in self.max_offsets:
                if topic in changed:
                    logged[topic] = max(logged.get(topic, 0), queue_id + 1)
            for topic in changed:
                self.topics[topic] = max(configs[topic].queue_nums, logged.get(topic, 0))

    # -- topics -----------------------------------------------------------------------------------

    def create_topic(self, topic: str, queue_nums: int = c.DEFAULT_TOPIC_QUEUE_NUMS) -> None:
        """Create or resize ``topic`` on this broker with ``queue_nums`` read/write queues (its
        permission and message type as they were, read and write and unset for a new topic); the
        row is timed after the topic's latest one, so that it is the latest."""
        validate_name(topic, "topic", 255)
        if not 1 <= queue_nums <= 1024:
            raise ValidationError("queue_nums", queue_nums, "must be in [1, 1024]")
        self.refresh_topics()
        with self._lock:
            config = replace(self.topic_configs.get(topic) or TopicConfig(topic), queue_nums=queue_nums)
            moment = max(self._clock(), self._topic_times.get(topic, -1) + 1)
        row = {"broker_name": self.broker_name, **vars(config), "updated_timestamp": moment}
        append_rows(self.config.lake, TOPIC_CONFIG, pa.Table.from_pylist([row], TOPIC_CONFIG.arrow_schema))
        with self._lock:
            self.topics[topic] = queue_nums
            self.topic_configs[topic] = config
            self._topic_times[topic] = moment

    def queue_nums(self, topic: str) -> int | None:
        """Queue count of ``topic`` on this broker (after :meth:`refresh_topics`), None when the
        topic does not exist here."""
        self.refresh_topics()
        return self.topics.get(topic)

    def topic_config(self, topic: str) -> TopicConfig | None:
        """The settings of ``topic`` on this broker (after :meth:`refresh_topics`): its latest
        ``topic_config`` row with the queue count the broker uses; None when the topic does not
        exist here. A topic known only from the log (no row) reads and writes and has no type."""
        self.refresh_topics()
        queue_nums = self.topics.get(topic)
        config = self.topic_configs.get(topic)
        if queue_nums is None:
            return None
        return replace(config or TopicConfig(topic), queue_nums=queue_nums)

    def ensure_topic(self, topic: str, queue_nums: int | None = None) -> int:
        """Create ``topic`` if it does not exist (with its system default queue count); one an
        operator created a moment ago is looked for first, so that its settings stay."""
        existing = self.topics.get(topic)
        if existing is None:
            self.refresh_topics(interval_s=0)
            existing = self.topics.get(topic)
        if existing is not None:
            return existing
        nums = queue_nums or default_queue_nums(topic)
        self.create_topic(topic, nums)
        return nums

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's next offset to be written (its message count so far)."""
        return self.max_offsets.get((topic, queue_id), 0)


def default_queue_nums(topic: str) -> int:
    """Queue count a topic gets when auto-created, by kind of topic."""
    if topic == c.SCHEDULE_TOPIC:
        return c.SCHEDULE_TOPIC_QUEUE_NUMS
    if topic.startswith(c.REVIVE_TOPIC_PREFIX):
        return c.REVIVE_QUEUE_NUM
    if topic.startswith((c.RETRY_GROUP_TOPIC_PREFIX, c.DLQ_GROUP_TOPIC_PREFIX)) or topic in (
        c.RMQ_SYS_TRANS_HALF_TOPIC,
        c.RMQ_SYS_TRANS_OP_HALF_TOPIC,
        c.TRANS_CHECK_MAX_TIME_TOPIC,
        c.TIMER_TOPIC,
    ):
        return 1
    return c.DEFAULT_TOPIC_QUEUE_NUMS
