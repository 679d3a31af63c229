"""What the concurrent and the orderly push consumer share: the process queue of an assigned queue,
the message models, where a consumer without a stored offset starts (``ConsumeFromWhere``) and
``computePullFromWhere``.

See docs/rocketmq.md (consumer offsets) for the rule and its RocketMQ source.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from broker_model.client.offset_store import ReadOffsetType
from broker_model.common import MessageQueue
from broker_model.common import constants as c
from broker_model.store import MessageExt, MessageStore
from schemas.errors import ValidationError

MessageModel = Literal["CLUSTERING", "BROADCASTING"]
MESSAGE_MODELS: tuple[MessageModel, ...] = ("CLUSTERING", "BROADCASTING")
ConsumeFromWhere = Literal["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP"]
CONSUME_FROM_WHERE: tuple[ConsumeFromWhere, ...] = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)


class OffsetReader(Protocol):
    """The part of an offset store that :func:`compute_pull_from_where` reads."""

    def read_offset(self, queue: MessageQueue | None, read_type: ReadOffsetType) -> int: ...


def check_message_model(message_model: str) -> None:
    """Raises ValidationError unless ``message_model`` is CLUSTERING or BROADCASTING."""
    if message_model not in MESSAGE_MODELS:
        raise ValidationError("message_model", message_model, "must be CLUSTERING or BROADCASTING")


def check_consume_from_where(consume_from_where: str) -> None:
    """Raises ValidationError unless ``consume_from_where`` is a ConsumeFromWhere value."""
    if consume_from_where not in CONSUME_FROM_WHERE:
        raise ValidationError("consume_from_where", consume_from_where, "is not a ConsumeFromWhere value")


def compute_pull_from_where(
    offsets: OffsetReader,
    store: MessageStore,
    queue: MessageQueue,
    consume_from_where: ConsumeFromWhere,
    consume_timestamp: int,
) -> int | None:
    """``computePullFromWhere``: the first offset to pull of a newly taken queue.

    The stored offset when there is one; else, per ``consume_from_where``: the queue's first
    offset, its max offset, or the offset of ``consume_timestamp`` (epoch ms). A retry topic
    starts at 0 under CONSUME_FROM_LAST_OFFSET and at its max offset under
    CONSUME_FROM_TIMESTAMP. None when the offset store could not be read (the caller tries again
    later).
    """
    stored = offsets.read_offset(queue, ReadOffsetType.READ_FROM_STORE)
    if stored >= 0:
        return stored
    if stored != c.OFFSET_NOT_FOUND:
        return None
    retry = queue.topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX)
    if consume_from_where == "CONSUME_FROM_FIRST_OFFSET" or (
        retry and consume_from_where == "CONSUME_FROM_LAST_OFFSET"
    ):
        return 0
    if consume_from_where == "CONSUME_FROM_TIMESTAMP" and not retry:
        return store.offset_by_time(queue.topic, queue.queue_id, consume_timestamp)
    return store.max_offset(queue.topic, queue.queue_id)


class ProcessQueue:
    """The client-side state of one assigned queue (RocketMQ's ``ProcessQueue``), shared by the
    concurrent and the orderly push consumer. Thread-safe.

    Pulled messages wait in a cache in queue-offset order. The concurrent consumer removes them as
    their batches finish (:meth:`remove_messages`: the offset to commit is the smallest one still
    cached); the orderly consumer moves the first ones to a consuming map (:meth:`take_messages`)
    until they are committed, rolled back or made to consume again. ``pull_offset`` is where the
    next pull starts; ``locked`` and ``last_lock_timestamp`` mirror the broker lock as the client
    last saw it (orderly); ``dropped`` is set when the queue is taken away from this client (results
    of batches still running are then ignored).
    """

    def __init__(self, now: int = 0, pull_offset: int = 0) -> None:
        self.lock = threading.Lock()  # guards the messages; also orders offset updates of this queue
        self._cached: dict[int, MessageExt] = {}
        self._cached_offsets: list[int] = []  # sorted keys of _cached
        self._consuming: dict[int, MessageExt] = {}
        self._bytes = 0
        self.pull_offset = pull_offset
        self.consume_lock = threading.Lock()  # held around each orderly listener call
        self.consuming = False  # an orderly consume request is submitted or running
        self.locked = False
        self.dropped = False
        self.last_lock_timestamp = now
        self.last_pull_timestamp = now
        self.queue_offset_max = -1
        self.try_unlock_times = 0

    def put_messages(self, messages: Sequence[MessageExt]) -> bool:
        """Cache pulled messages (a queue offset held already is ignored); True when an orderly
        consume request must be submitted (messages wait and none is submitted yet)."""
        with self.lock:
            for message in messages:
                offset = message.queue_offset
                if offset in self._cached or offset in self._consuming:
                    continue
                self._cached[offset] = message
                bisect.insort(self._cached_offsets, offset)
                self._bytes += len(message.body)
                self.queue_offset_max = max(self.queue_offset_max, offset)
            dispatch = bool(self._cached) and not self.consuming
            if dispatch:
                self.consuming = True
            return dispatch

    def remove_messages(self, messages: Sequence[MessageExt], commit: Callable[[int], None] | None = None) -> int:
        """Remove consumed messages; return the offset to commit: the smallest queue offset still
        cached, or the highest pulled offset + 1 when none is, or -1 when nothing was cached.

        ``commit`` is called with that offset (when it is >= 0 and the queue is not dropped)
        before the queue's lock is released, so that concurrent batches commit in order.
        """
        with self.lock:
            if not self._cached:
                return -1
            for message in messages:
                if self._cached.pop(message.queue_offset, None) is not None:
                    del self._cached_offsets[bisect.bisect_left(self._cached_offsets, message.queue_offset)]
                    self._bytes -= len(message.body)
            offset = self._cached_offsets[0] if self._cached_offsets else self.queue_offset_max + 1
            if commit is not None and not self.dropped:
                commit(offset)
            return offset

    def take_messages(self, batch_size: int) -> list[MessageExt]:
        """Move up to ``batch_size`` first cached messages to the consuming map; an empty result
        ends the current consume request (``consuming`` becomes False)."""
        with self.lock:
            taken_offsets = self._cached_offsets[:batch_size]
            del self._cached_offsets[:batch_size]
            taken = [self._cached.pop(offset) for offset in taken_offsets]
            for message in taken:
                self._consuming[message.queue_offset] = message
            if not taken:
                self.consuming = False
            return taken

    def commit(self) -> int:
        """Forget the consuming messages; returns the offset to commit (their last offset + 1),
        or -1 when none was consuming."""
        with self.lock:
            if not self._consuming:
                return -1
            last = max(self._consuming)
            self._bytes -= sum(len(m.body) for m in self._consuming.values())
            self._consuming.clear()
            return last + 1

    def rollback(self) -> None:
        """Put every consuming message back into the cache (they are consumed again)."""
        with self.lock:
            self._restore(list(self._consuming.values()))

    def make_message_to_consume_again(self, messages: Sequence[MessageExt]) -> None:
        """Put ``messages`` back from the consuming map into the cache."""
        with self.lock:
            self._restore([m for m in messages if m.queue_offset in self._consuming])

    def _restore(self, messages: list[MessageExt]) -> None:
        for message in messages:
            del self._consuming[message.queue_offset]
            self._cached[message.queue_offset] = message
            bisect.insort(self._cached_offsets, message.queue_offset)

    def has_temp_message(self) -> bool:
        """True while pulled messages wait in the cache (``hasTempMessage``)."""
        with self.lock:
            return bool(self._cached)

    @property
    def cached_count(self) -> int:
        """Messages held by this queue: cached plus consuming."""
        with self.lock:
            return len(self._cached) + len(self._consuming)

    @property
    def cached_bytes(self) -> int:
        """Body bytes of the messages held by this queue."""
        with self.lock:
            return self._bytes

    @property
    def max_span(self) -> int:
        """Largest minus smallest cached queue offset (0 when none is cached)."""
        with self.lock:
            return self._cached_offsets[-1] - self._cached_offsets[0] if self._cached_offsets else 0

    def is_lock_expired(self, now: int, max_live_ms: int = c.CLIENT_LOCK_MAX_LIVE_TIME_MS) -> bool:
        """True when the last lock grant is more than ``max_live_ms`` old."""
        return now - self.last_lock_timestamp > max_live_ms
