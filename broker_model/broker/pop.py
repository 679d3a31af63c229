"""POP consumption as RocketMQ 5 does it (docs/pop.md): a pop returns messages that stay invisible
to the group for an invisible time; an ack consumes them; one not acked in time is revived into the
group's POP retry topic, its reconsume times one more, and a pop that meets a message past the
group's attempts dead-letters and acks it (the proxy's filter).

The state is in the log in RocketMQ's own form, so that one reading serves our brokers and the
stores ingested from Apache RocketMQ 5 brokers:

- a pop writes one checkpoint (``ck``) per queue it read, in the revive topic
  ``rmq_sys_REVIVE_LOG_<cluster>``, due ``ACK_TIME_INTERVAL_MS`` before the end of the invisible
  time (the put routes it through the timer topic until then), and moves the group's offset of the
  queue on at once (a POP group's offset is "popped up to");
- an ack writes an ``ack`` record due at the checkpoint's revive time; a change of the invisible
  time writes a new checkpoint for the one message and an ack of the old one, in one put;
- the revive service (:class:`PopService`, a periodic service) reads the revive queues as the
  group ``CID_RMQ_SYS_REVIVE_GROUP``, pairs acks with their checkpoints, and revives each
  unacked message of a checkpoint whose revive time has passed, once the timer has delivered
  every record due by then (its acks included).

Crash safety: pops, acks and changes answer only once their records are committed. The revive
service's progress (the last checkpoint done per revive queue, inclusive, as RocketMQ keeps it) is
in ``<lake>/_config/<broker>/reviveProgress.json``; a round records itself as pending before its
put, and a service that finds a pending round looks for its first copy in the log: so no
checkpoint is revived twice, and none skipped. The progress is also committed as the revive
group's consumer offsets. A group's pop offsets reach the lake every few seconds; a broker that
starts again moves each one on to the end of the checkpoints written after the last persisted
commits, so an acked message is never popped again.

FIFO groups (``consume_message_orderly``) pop in order, with no checkpoint (:mod:`.pop_orderly`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from broker_model.broker.config import InnerMessage
from broker_model.broker.pop_orderly import OrderInfo, OrderInfoTable, order_info_path
from broker_model.broker.service import PeriodicService
from broker_model.common import OFFSET_NOT_FOUND, validate_name
from broker_model.common import constants as c
from broker_model.common.durable import read_progress, write_json_durably
from broker_model.common.pop_records import (
    TOPIC_TYPE_NORMAL,
    TOPIC_TYPE_RETRY_V1,
    AckMsg,
    PopCheckPoint,
    PopError,
    ReceiptHandle,
    ack_of,
    pop_retry_topic,
    revive_topic,
)
from broker_model.common.sql92 import SqlFilter
from broker_model.store import MessageExt
from broker_model.store.message_store import Subscription
from schemas.errors import ValidationError

if TYPE_CHECKING:
    from broker_model.broker.controller import Broker
    from broker_model.broker.timer import TimerMessageService

_log = logging.getLogger(__name__)

CheckPointKey = tuple[str, str, int, int, int, str]  # PopCheckPoint.key
ORDERLY_POLL_STEP_MS: Final = 100  # an in-process long poll of a FIFO group looks again this often
REVIVE_ROUND_CKS: Final = 64  # checkpoints one revive round finishes at most (one put of their copies)
REVIVE_INTERVAL_MS: Final = 200  # how often the revive service looks (RocketMQ: 1 s, slower when idle)
RECOVERY_MARGIN_MS: Final = 10_000  # checkpoints this long before the last persisted offsets are read again
UNIQ_KEY: Final = c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX


@dataclass(frozen=True)
class PoppedMessage:
    """A message as a pop returns it: under the topic the group subscribed to (a retried one too),
    with its receipt handle and delivery attempt (reconsume times + 1)."""

    message: MessageExt
    receipt_handle: str
    delivery_attempt: int


@dataclass(frozen=True)
class PopResult:
    """``FOUND`` with messages, or ``NO_NEW_MSG`` when the poll ended with none."""

    status: str
    messages: list[PoppedMessage] = field(default_factory=list)
    dead_lettered: int = 0  # messages past the group's attempts, sent to %DLQ% and acked
    filtered: int = 0  # messages whose tags the filter did not match exactly, acked
    looked: tuple[tuple[str, int, int], ...] = ()  # each queue read and its offset: what a long poll waits on
    # a FIFO group's pop: a long poll pops again on any change of the broker (an ack unblocks a
    # queue), and at the latest after ``unblocks_in_ms`` (a blocked batch's invisible time ends)
    orderly: bool = False
    unblocks_in_ms: int | None = None


@dataclass(frozen=True)
class _Ask:
    """What one pop asks for."""

    group: str
    topic: str
    max_nums: int
    invisible_ms: int
    sub: Subscription
    init_mode: str
    sql: SqlFilter | None
    attempt_id: str | None

    def fields(self) -> tuple[str, str, int, int, Subscription, str, SqlFilter | None]:
        return self.group, self.topic, self.max_nums, self.invisible_ms, self.sub, self.init_mode, self.sql


@dataclass
class _Waiting:
    """A checkpoint read from a revive queue, with the acks met so far."""

    ck: PopCheckPoint
    acked: set[int] = field(default_factory=set)  # queue offsets


class PopService(PeriodicService):
    """POP for one broker: :meth:`pop`, :meth:`ack` and :meth:`change_invisible` for consumers,
    and the revive service (:meth:`revive`, run every ``interval_ms`` by :meth:`start`). Needs the
    broker started and its :class:`TimerMessageService`, which delivers the records into the revive
    queues (see the module docstring)."""

    thread_name = "revive"

    def __init__(
        self,
        broker: Broker,
        timer: TimerMessageService,
        *,
        path: str | Path | None = None,
        interval_ms: int = REVIVE_INTERVAL_MS,
        seed: int | None = None,
    ) -> None:
        super().__init__(broker, interval_ms)
        self.timer = timer
        self.revive_topic = revive_topic(broker.config.cluster_name)
        self.path = Path(path) if path is not None else revive_progress_path(broker.config.lake, broker.broker_name)
        self._random = random.Random(seed)
        self._pops = itertools.count()  # picks each pop's revive queue, as ckMessageNumber does
        self._lock = threading.Lock()  # the revive state
        self._group_locks: dict[tuple[str, str], threading.Lock] = {}
        self._group_locks_lock = threading.Lock()
        self._done: dict[int, int] = {}  # revive queue -> offset of the last checkpoint done (inclusive)
        self._read: dict[int, int] = {}  # revive queue -> next offset to read
        self._waiting: dict[int, dict[CheckPointKey, _Waiting]] = {q: {} for q in range(c.REVIVE_QUEUE_NUM)}
        # acks read before their checkpoint, by its key: (due time, queue offsets, revive queue, revive offset)
        self._early_acks: dict[CheckPointKey, tuple[int, set[int], int, int]] = {}
        self._in_flight: dict[int, int] = {}  # acks and changes being written: token -> when they were checked
        self._in_flight_lock = threading.Lock()
        self._tokens = itertools.count()
        self.orders = OrderInfoTable(order_info_path(broker.config.lake, broker.broker_name))
        broker.ensure_topic(self.revive_topic, c.REVIVE_QUEUE_NUM)
        self._load()
        self._recover_pop_offsets()
        self._recover_orderly_offsets()

    # -- consumers --------------------------------------------------------------------------------

    def pop(
        self,
        group: str,
        topic: str,
        max_nums: int = c.MAX_POP_NUMS,
        invisible_ms: int = 60_000,
        expression: str | None = "*",
        poll_ms: int = 0,
        max_attempts: int | None = None,
        init_mode: str = "MAX",
        attempt_id: str | None = None,
        expression_type: str = "TAG",
    ) -> PopResult:
        """Pop up to ``max_nums`` messages of ``topic`` (every readable queue, and the group's POP
        retry topic) for ``group``, invisible for ``invisible_ms``; waits up to ``poll_ms`` for a
        matching message when none is there. A message whose reconsume times reached
        ``max_attempts`` (None: the group's ``retry_max_times`` + 1) is dead-lettered into
        ``%DLQ%<group>`` and acked; one whose tags the expression does not match exactly is acked.
        ``expression_type`` ``SQL92`` makes ``expression`` a condition on the messages' properties
        (:mod:`broker_model.common.sql92`); the messages it does not match are passed over.
        A FIFO group (``consume_message_orderly``) pops in order (:mod:`.pop_orderly`): a queue
        whose last batch is not all acked gives nothing until that batch's invisible time passes;
        a receive repeated with the same ``attempt_id`` gets the same batch again.

        Raises:
            ValidationError: a bad group or topic name, ``max_nums`` outside [1, 32], a negative
                ``invisible_ms`` or ``poll_ms``, an unknown topic or ``init_mode``.
            BrokerError, CommitFailedError: the checkpoints could not be stored (nothing was popped).
        """
        validate_name(group, "group", c.GROUP_MAX_LENGTH)
        validate_name(topic, "topic", c.TOPIC_MAX_LENGTH)
        if not 1 <= max_nums <= c.MAX_POP_NUMS:
            raise ValidationError("max_nums", max_nums, f"must be in [1, {c.MAX_POP_NUMS}]")
        for name, value in (("invisible_ms", invisible_ms), ("poll_ms", poll_ms)):
            if value < 0:
                raise ValidationError(name, value, "must not be negative")
        if init_mode not in ("MIN", "MAX"):
            raise ValidationError("init_mode", init_mode, "must be MIN or MAX")
        config = self.broker.subscription_group(group)
        if self.broker.queue_nums(topic) is None:
            raise PopError("TOPIC_NOT_FOUND", "topic", topic, f"does not exist on broker {self.broker.broker_name!r}")
        if expression_type not in ("TAG", "SQL92"):
            raise ValidationError("expression_type", expression_type, "must be TAG or SQL92")
        sql = SqlFilter.parse(expression or "") if expression_type == "SQL92" else None
        sub = Subscription.parse("*" if sql is not None else expression)
        limit = config.retry_max_times + 1 if max_attempts is None else max_attempts
        deadline = time.monotonic() + poll_ms / 1000
        while True:
            unblocks: int | None = None
            ask = _Ask(group, topic, max_nums, invisible_ms, sub, init_mode, sql, attempt_id)
            if config.consume_message_orderly:
                popped, looked, unblocks = self._pop_orderly(ask)
            else:
                popped, looked = self._pop_once(ask)
            found = self._filter(group, topic, popped, sub, limit)
            orderly = config.consume_message_orderly
            result = dataclasses.replace(found, looked=tuple(looked), orderly=orderly, unblocks_in_ms=unblocks)
            remaining = deadline - time.monotonic()
            if result.messages or remaining <= 0:
                return result
            hold = int(remaining * 1000) + 1
            if orderly:  # an ack unblocks a queue without storing anything: look again soon
                hold = min(hold, ORDERLY_POLL_STEP_MS, unblocks if unblocks is not None else hold)
            self.broker.store.hold_any(looked, sub, hold)

    def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        """Ack the message of ``receipt_handle`` (its topic as the group subscribed to it).

        Raises:
            PopError: ``INVALID_RECEIPT_HANDLE`` for a malformed or expired handle (nothing is
                written, as the proxy refuses it); ``MESSAGE_NOT_FOUND`` when its offset is not in
                the queue.
        """
        handle = ReceiptHandle.decode(receipt_handle)
        with self._writing():
            real = self._check_handle(group, topic, handle)
            if handle.orderly:
                self._ack_orderly(group, real, handle)
                return
            self._put([self._ack_record(ack_of(handle, real, group), handle.revive_queue_id, handle.expires)])

    def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        """Make the message of ``receipt_handle`` invisible for ``invisible_ms`` from now: a new
        checkpoint for it and an ack of the old one, in one put; the new receipt handle.

        Raises:
            PopError: as :meth:`ack`.
            ValidationError: a negative ``invisible_ms``.
        """
        if invisible_ms < 0:
            raise ValidationError("invisible_ms", invisible_ms, "must not be negative")
        handle = ReceiptHandle.decode(receipt_handle)
        with self._writing():
            real = self._check_handle(group, topic, handle)
            if handle.orderly:
                return self._change_orderly(group, real, handle, invisible_ms)
            # a new pop time, so that the new checkpoint is never the old one's key
            now = max(self.broker.config.clock(), handle.pop_time + 1)
            offset, rq = handle.queue_offset, handle.revive_queue_id
            ck = PopCheckPoint(real, handle.queue_id, offset, now, invisible_ms, (0,), group, handle.broker_name)
            self._put([self._ck_record(ck, rq), self._ack_record(ack_of(handle, real, group), rq, handle.expires)])
        return dataclasses.replace(handle, start_offset=offset, pop_time=now, invisible_time=invisible_ms).encode()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """An ack or change from its check of the handle to its commit: the revive waits for it
        (a checkpoint due after the check may have an ack on its way)."""
        token = next(self._tokens)
        with self._in_flight_lock:
            self._in_flight[token] = self.broker.config.clock()
        try:
            yield
        finally:
            with self._in_flight_lock:
                del self._in_flight[token]

    # -- the pop ----------------------------------------------------------------------------------

    def _group_lock(self, group: str, topic: str) -> threading.Lock:
        with self._group_locks_lock:
            return self._group_locks.setdefault((group, topic), threading.Lock())

    def _pop_once(self, ask: _Ask) -> tuple[list[PoppedMessage], list[tuple[str, int, int]]]:
        """One pass over the queues: the messages popped, and every queue looked at with the
        offset it was read from (what a long poll waits on)."""
        group, topic, max_nums, invisible_ms, sub, init_mode, sql = ask.fields()
        broker, store = self.broker, self.broker.store
        retry = pop_retry_topic(topic, group)
        with self._group_lock(group, topic):
            now = broker.config.clock()
            revive_queue = next(self._pops) % c.REVIVE_QUEUE_NUM
            chance = self._random.randrange(100)
            count = broker.queue_nums(topic) or 0
            normal = [(topic, (count - 1 - i + chance) % count) for i in range(count)]
            plan = [(retry, 0), *normal] if chance < c.POP_FROM_RETRY_PROBABILITY else [*normal, (retry, 0)]
            cks: list[tuple[PopCheckPoint, list[MessageExt]]] = []
            moved: dict[tuple[str, int], int] = {}
            looked: list[tuple[str, int, int]] = []
            taken = 0
            for queue_topic, queue_id in plan:
                if taken >= max_nums:
                    break
                if queue_topic == retry and broker.queue_nums(retry) is None:
                    looked.append((retry, 0, 0))  # a first revive creates it
                    continue
                offset, committed = self._pop_offset(group, queue_topic, queue_id, init_mode)
                looked.append((queue_topic, queue_id, offset))
                got = store.get_message(queue_topic, queue_id, offset, max_nums - taken, sub)
                matched = _matching(got.messages, sql, queue_topic != retry)
                if matched:  # the ck starts where the pop started reading (filtered messages skipped)
                    diffs = tuple(m.queue_offset - offset for m in matched)
                    where = (queue_topic, queue_id, offset)
                    cks.append((PopCheckPoint(*where, now, invisible_ms, diffs, group, broker.broker_name), matched))
                    taken += len(matched)
                if got.next_begin_offset != offset or not committed:
                    moved[(queue_topic, queue_id)] = got.next_begin_offset
            if cks:
                self._put([self._ck_record(ck, revive_queue) for ck, _ in cks])
            for (queue_topic, queue_id), offset in moved.items():
                broker.offsets.commit_offset(group, queue_topic, queue_id, offset, source="pop")
        popped = []
        for ck, messages in cks:
            kind = TOPIC_TYPE_RETRY_V1 if ck.topic == retry else TOPIC_TYPE_NORMAL
            for message in messages:
                handle = ReceiptHandle(
                    ck.start_offset,
                    ck.pop_time,
                    ck.invisible_time,
                    revive_queue,
                    kind,
                    broker.broker_name,
                    ck.queue_id,
                    message.queue_offset,
                    message.commit_log_offset,
                )
                shown = message if message.topic == topic else dataclasses.replace(message, topic=topic)
                popped.append(PoppedMessage(shown, handle.encode(), message.reconsume_times + 1))
        return popped, looked

    # -- FIFO groups ------------------------------------------------------------------------------

    def _pop_orderly(self, ask: _Ask) -> tuple[list[PoppedMessage], list[tuple[str, int, int]], int | None]:
        """One orderly pass over the topic's queues (never its retry topic): from each queue not
        blocked by its last batch, a batch from the group's offset, its messages' reconsume times
        their consume counts; no checkpoint is written, the batch is kept instead. Also the ms
        until the first blocked batch's invisible time ends (None: none is blocked)."""
        group, topic, max_nums, invisible_ms, sub, init_mode, sql = ask.fields()
        attempt_id = ask.attempt_id
        broker, store = self.broker, self.broker.store
        popped: list[PoppedMessage] = []
        looked: list[tuple[str, int, int]] = []
        unblocks: int | None = None
        with self._group_lock(group, topic), self.orders.lock:
            now = broker.config.clock()
            count = broker.queue_nums(topic) or 0
            changed = False
            first = self._random.randrange(count) if count else 0  # as RocketMQ's randomQ: no queue starves
            for queue_id in ((first + i) % count for i in range(count)):
                if len(popped) >= max_nums:
                    break
                offset, _ = self._pop_offset(group, topic, queue_id, init_mode)
                previous = self.orders.get(topic, group, queue_id)
                if previous is not None and not min(previous.offsets) <= offset <= max(previous.offsets) + 1:
                    previous = None  # the offset was reset away from the batch: it no longer blocks
                if previous is not None and previous.blocks(now, attempt_id):
                    unacked = [previous.visible_at(o) for o in previous.offsets if o not in previous.acked]
                    wait = max(1, max(unacked) - now)  # free once its last unacked message is visible
                    unblocks = min(unblocks, wait) if unblocks is not None else wait
                    continue
                looked.append((topic, queue_id, offset))
                got = store.get_message(topic, queue_id, offset, max_nums - len(popped), sub)
                matched = _matching(got.messages, sql, True)
                if not matched:
                    if got.next_begin_offset != offset:  # only messages the filter skips
                        broker.offsets.commit_offset(group, topic, queue_id, got.next_begin_offset, source="pop")
                    continue
                offsets = [m.queue_offset for m in matched]
                counts = {}
                for o in offsets:
                    known = previous.counts.get(o, 0) if previous is not None else 0
                    repeated = attempt_id is not None and previous is not None and previous.attempt_id == attempt_id
                    again = previous is not None and o in previous.offsets and not repeated
                    counts[o] = known + 1 if again else known  # mergeOffsetConsumedCount
                info = OrderInfo(now, invisible_ms, offsets, counts, attempt_id=attempt_id)
                self.orders.put(topic, group, queue_id, info)
                changed = True
                # the offset stays at the batch (those before it do not match the filter) until acks move it
                broker.offsets.commit_offset(group, topic, queue_id, offsets[0], source="pop")
                for message in matched:
                    handle = ReceiptHandle(
                        offset,
                        now,
                        invisible_ms,
                        c.POP_ORDER_REVIVE_QUEUE,
                        TOPIC_TYPE_NORMAL,
                        broker.broker_name,
                        queue_id,
                        message.queue_offset,
                        message.commit_log_offset,
                    )
                    times = counts[message.queue_offset]
                    shown = dataclasses.replace(message, reconsume_times=times)
                    popped.append(PoppedMessage(shown, handle.encode(), times + 1))
            if changed:
                self.orders.save()
        return popped, looked, unblocks

    def _ack_orderly(self, group: str, topic: str, handle: ReceiptHandle) -> None:
        """``ackOrderly``: the message is consumed; the group's offset goes to the batch's first
        unacked message, or past the batch."""
        with self.orders.lock:
            info = self.orders.get(topic, group, handle.queue_id)
            if info is None or handle.queue_offset not in info.offsets or info.pop_time != handle.pop_time:
                return  # a batch popped again since: the message was delivered anew
            info.acked.add(handle.queue_offset)
            self.orders.save()
            self.broker.offsets.commit_offset(group, topic, handle.queue_id, info.committed(), source="pop")
        self.broker.store.announce()  # a long poll of the group pops again: the queue may be free

    def _change_orderly(self, group: str, topic: str, handle: ReceiptHandle, invisible_ms: int) -> str:
        """``updateNextVisibleTime``: the message's next visible time is now + ``invisible_ms``; the
        handle keeps its pop time, with the invisible time that reaches it."""
        with self.orders.lock:
            info = self.orders.get(topic, group, handle.queue_id)
            if info is None or handle.queue_offset not in info.offsets or info.pop_time != handle.pop_time:
                raise PopError(
                    "INVALID_RECEIPT_HANDLE",
                    "receipt_handle",
                    handle.encode(),
                    "names a FIFO batch popped again since",
                )
            visible = self.broker.config.clock() + invisible_ms
            info.next_visible[handle.queue_offset] = visible
            self.orders.save()
        self.broker.store.announce()  # a long poll of the group looks again: the queue may be free sooner
        return dataclasses.replace(handle, invisible_time=visible - handle.pop_time).encode()

    def _recover_orderly_offsets(self) -> None:
        """A FIFO group's offset is at least where its kept batch says (acks are kept durably there,
        the offsets only every few seconds)."""
        ledger = self.broker.offsets.ledger
        for topic, group, queue_id, info in self.orders.items():
            offset = self.broker.offsets.query_offset(group, topic, queue_id)
            current = ledger.current((group, self.broker.broker_name, topic, queue_id))
            reset_since = current is not None and current[1] > info.pop_time and offset < min(info.offsets)
            if not reset_since and offset < info.committed():
                self.broker.offsets.commit_offset(group, topic, queue_id, info.committed(), source="pop")

    def _pop_offset(self, group: str, topic: str, queue_id: int, init_mode: str) -> tuple[int, bool]:
        """The group's offset of the queue, and whether it has one (one look at the offsets): a
        first pop starts at the min offset for a retry topic or ``MIN``, else at 0 while the queue
        still holds offset 0, else at its last message."""
        offset = self.broker.offsets.query_offset(group, topic, queue_id)
        if offset != OFFSET_NOT_FOUND:
            return offset, True
        return self._first_offset(topic, queue_id, init_mode), False

    def _first_offset(self, topic: str, queue_id: int, init_mode: str) -> int:
        store = self.broker.store
        low = store.min_offset(topic, queue_id)
        if init_mode == "MIN" or topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX) or low == 0:
            return low
        return max(store.max_offset(topic, queue_id) - 1, low)

    def _filter(self, group: str, topic: str, popped: list[PoppedMessage], sub: Subscription, limit: int) -> PopResult:
        """The proxy's filter of a pop's messages: past the attempts, dead-letter then ack; tags
        not matched exactly, ack; the rest is delivered."""
        kept: list[PoppedMessage] = []
        dead = filtered = 0
        for item in popped:
            message = item.message
            if message.reconsume_times >= limit:
                self.broker.consumer_send_back(group, message.commit_log_offset, delay_level=-1)
                self._ack_popped(group, topic, item.receipt_handle)
                dead += 1
            elif not sub.matches_tags(message.tags):
                self._ack_popped(group, topic, item.receipt_handle)
                filtered += 1
            else:
                kept.append(item)
        return PopResult("FOUND" if kept else "NO_NEW_MSG", kept, dead, filtered)

    def _ack_popped(self, group: str, topic: str, receipt_handle: str) -> None:
        """The pop's own ack of a message it does not deliver: not refused when its invisible time
        has already passed (a slow dead letter, a small invisible time)."""
        handle = ReceiptHandle.decode(receipt_handle)
        real = handle.real_topic(topic, group)
        with self._writing():
            if handle.orderly:
                self._ack_orderly(group, real, handle)
                return
            self._put([self._ack_record(ack_of(handle, real, group), handle.revive_queue_id, handle.expires)])

    def _check_handle(self, group: str, topic: str, handle: ReceiptHandle) -> str:
        """The real topic of a handle presented by ``group``, after the proxy's and broker's checks."""
        validate_name(group, "group", c.GROUP_MAX_LENGTH)
        validate_name(topic, "topic", c.TOPIC_MAX_LENGTH)
        if handle.expires <= self.broker.config.clock():
            raise PopError(
                "INVALID_RECEIPT_HANDLE",
                "receipt_handle",
                handle.encode(),
                "is expired",
                "ack or change a message within its invisible time; it is delivered again",
            )
        if handle.broker_name != self.broker.broker_name:
            raise PopError(
                "INVALID_RECEIPT_HANDLE",
                "receipt_handle",
                handle.encode(),
                f"names broker {handle.broker_name!r}, not {self.broker.broker_name!r}",
            )
        real = handle.real_topic(topic, group)
        store = self.broker.store
        if not store.min_offset(real, handle.queue_id) <= handle.queue_offset < store.max_offset(real, handle.queue_id):
            raise PopError(
                "MESSAGE_NOT_FOUND",
                "receipt_handle",
                handle.encode(),
                f"names offset {handle.queue_offset} of {real}:{handle.queue_id}, which holds no such message",
            )
        return real

    # -- records ----------------------------------------------------------------------------------

    def _record(self, body: str, tag: str, unique_id: str, revive_queue: int, deliver_ms: int) -> InnerMessage:
        """A ck or ack record as ``buildCkMsg``/``appendAck`` build it; the put routes it through
        the timer topic while its delivery time is ahead."""
        broker = self.broker
        properties = {
            c.PROPERTY_TIMER_DELIVER_MS: str(deliver_ms),
            UNIQ_KEY: unique_id,
            c.PROPERTY_TAGS: tag,
        }
        now = broker.config.clock()
        return InnerMessage(self.revive_topic, revive_queue, body.encode(), properties, 0, 0, now, broker.store_host)

    def _ck_record(self, ck: PopCheckPoint, revive_queue: int) -> InnerMessage:
        return self._record(ck.to_json(), c.CK_TAG, ck.unique_id, revive_queue, ck.revive_time - c.ACK_TIME_INTERVAL_MS)

    def _ack_record(self, ack: AckMsg, revive_queue: int, deliver_ms: int) -> InnerMessage:
        return self._record(ack.to_json(), c.ACK_TAG, ack.unique_id, revive_queue, deliver_ms)

    def _put(self, records: Sequence[InnerMessage]) -> None:
        """Store records in one put and wait for its commit, whatever the flush mode."""
        self.broker.submit_messages(records).wait()

    # -- the revive service -----------------------------------------------------------------------

    def run_round(self, now: int) -> object:
        """One pass of the revive service at ``now`` (:meth:`revive`)."""
        return self.revive(now)

    def revive(self, now: int) -> int:
        """Read the revive queues, and revive every unacked message of each checkpoint due by
        ``now`` (its revive time ``ACK_TIME_INTERVAL_MS`` ago or more, and every timer record due by
        then delivered), in revive-offset order per queue, the copies in one put; the copies
        stored.

        Raises:
            BrokerError, CommitFailedError: the copies could not be stored; the progress says
                exactly what was, and the next call carries on from there.
        """
        through = min(now, self.timer.delivered_through(now)) - c.ACK_TIME_INTERVAL_MS
        with self._in_flight_lock:
            if self._in_flight:
                through = min(through, min(self._in_flight.values()) - 1)
        with self._lock:
            for queue_id in range(c.REVIVE_QUEUE_NUM):
                self._read_queue(queue_id)
            finished: dict[int, list[CheckPointKey]] = {}
            copies: list[InnerMessage] = []
            for queue_id, waiting in self._waiting.items():
                for key, item in waiting.items():
                    if item.ck.revive_time > through or sum(map(len, finished.values())) >= REVIVE_ROUND_CKS:
                        break
                    copies += self._revivable(item)
                    finished.setdefault(queue_id, []).append(key)
            self._early_acks = {k: v for k, v in self._early_acks.items() if v[0] > through}
            if not finished:
                return 0
            done = {q: self._waiting[q][keys[-1]].ck.revive_offset for q, keys in finished.items()}
            for _, _, queue_id, offset in self._early_acks.values():  # kept in memory only: read again
                if queue_id in done:
                    done[queue_id] = min(done[queue_id], offset - 1)
            if copies:
                first = copies[0]
                log_offset = self.broker.next_commit_log_offset
                pending = {
                    "done": done,
                    "log_offset": log_offset,
                    "first": [first.topic, first.properties.get(UNIQ_KEY), first.reconsume_times],
                }
                self._save(pending)
                try:
                    self._put(copies)
                except BaseException:
                    if self._round_stored(pending):
                        self._finish(finished, done)
                    self._save(None)
                    raise
            self._finish(finished, done)
            self._save(None)
            return len(copies)

    def _finish(self, finished: Mapping[int, list[CheckPointKey]], done: Mapping[int, int]) -> None:
        for queue_id, keys in finished.items():
            for key in keys:
                del self._waiting[queue_id][key]
        for queue_id, offset in done.items():
            self._done[queue_id] = max(self._done.get(queue_id, -1), offset)
            offsets = self.broker.offsets
            offsets.commit_offset(c.REVIVE_GROUP, self.revive_topic, queue_id, self._done[queue_id], source="revive")

    def _read_queue(self, queue_id: int) -> None:
        """Read the records stored in a revive queue since the last read: checkpoints wait, acks
        mark their checkpoint's messages."""
        store = self.broker.store
        offset = max(self._read.get(queue_id, 0), store.min_offset(self.revive_topic, queue_id))
        while True:
            got = store.get_message(self.revive_topic, queue_id, offset, c.MAX_POP_NUMS)
            for record in got.messages:
                self._take(queue_id, record)
            if got.next_begin_offset <= offset:
                break
            offset = got.next_begin_offset
        self._read[queue_id] = offset

    def _take(self, queue_id: int, record: MessageExt) -> None:
        tag = record.properties.get(c.PROPERTY_TAGS)
        text = record.body.decode("utf-8", "replace")
        try:
            if tag == c.CK_TAG:
                ck = PopCheckPoint.from_json(text, record.queue_offset)
                if record.queue_offset <= self._done.get(queue_id, -1):
                    return
                item = self._waiting[queue_id].setdefault(ck.key, _Waiting(ck))
                early = self._early_acks.pop(ck.key, None)
                if early is not None:
                    item.acked |= early[1]
            elif tag in (c.ACK_TAG, c.BATCH_ACK_TAG):
                ack = AckMsg.from_json(text, self.broker.broker_name)
                waiting = self._waiting[queue_id].get(ack.key)
                if waiting is not None:
                    waiting.acked.update(ack.offsets)
                else:
                    due = int(record.properties.get(c.PROPERTY_TIMER_DELIVER_MS, "0") or 0)
                    early = self._early_acks.setdefault(ack.key, (due, set(), queue_id, record.queue_offset))
                    early[1].update(ack.offsets)
        except (ValidationError, ValueError) as exc:
            _log.warning("revive queue %s offset %s: %s; skipped", queue_id, record.queue_offset, exc)

    def _revivable(self, item: _Waiting) -> list[InnerMessage]:
        """The copies of :meth:`_revived`, their retry topic created, once the broker would store
        them; a checkpoint whose copies it refuses (a retry topic's name over 255 characters, a
        copy too large) is logged and given up, so that it never holds up the others."""
        copies = self._revived(item)
        try:
            for topic in sorted({copy.topic for copy in copies}):
                self.broker.ensure_topic(topic, c.POP_RETRY_QUEUE_NUM)
            if copies:
                self.broker.prepare_put(copies)
        except ValidationError as exc:
            _log.warning("revive: %s of group %s cannot be revived (%s); given up", item.ck.topic, item.ck.group, exc)
            return []
        return copies

    def _revived(self, item: _Waiting) -> list[InnerMessage]:
        """``reviveRetry``: a copy in the POP retry topic of each unacked message of a checkpoint."""
        ck, store = item.ck, self.broker.store
        copies = []
        for offset in ck.offsets:
            if offset in item.acked:
                continue
            message = store.message_at(ck.topic, ck.queue_id, offset, decompress=False)
            if message is None:
                _log.warning("revive: no message at %s:%s offset %s; skipped", ck.topic, ck.queue_id, offset)
                continue
            retry = ck.topic if ck.topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX) else pop_retry_topic(ck.topic, ck.group)
            properties = dict(message.properties)
            if message.reconsume_times == 0 or c.PROPERTY_FIRST_POP_TIME not in properties:
                properties[c.PROPERTY_FIRST_POP_TIME] = str(ck.pop_time)
            properties[c.PROPERTY_ORIGIN_GROUP] = ck.group
            copies.append(
                InnerMessage(
                    retry,
                    0,
                    message.body,
                    properties,
                    message.flag,
                    message.sys_flag & ~(c.BORNHOST_V6_FLAG | c.STOREHOSTADDRESS_V6_FLAG),
                    message.born_timestamp,
                    self.broker.store_host,
                    message.reconsume_times + (0 if ck.suspend else 1),
                )
            )
        return copies

    # -- progress and recovery --------------------------------------------------------------------

    def _load(self) -> None:
        def parse(data: dict[str, Any]) -> tuple[dict[int, int], Any]:
            return {int(q): int(o) for q, o in data.get("done", {}).items()}, data.get("pending")

        read = read_progress(self.path, "revive", "to revive every checkpoint of the revive topic again", parse)
        if read is None:  # a store ingested from RocketMQ: its revive group's offsets say what it revived
            for queue_id in range(c.REVIVE_QUEUE_NUM):
                offset = self.broker.offsets.query_offset(c.REVIVE_GROUP, self.revive_topic, queue_id)
                if offset >= 0:
                    self._done[queue_id] = offset
            self._read = {q: o + 1 for q, o in self._done.items()}
            return
        self._done, pending = read
        if pending:
            if self._round_stored(pending):
                for queue_id, offset in pending["done"].items():
                    self._done[int(queue_id)] = max(self._done.get(int(queue_id), -1), int(offset))
            self._save(None)
        self._read = {q: o + 1 for q, o in self._done.items()}

    def _save(self, pending: dict[str, Any] | None) -> None:
        data: dict[str, Any] = {"done": {str(q): o for q, o in sorted(self._done.items())}}
        if pending is not None:
            data["pending"] = pending
        write_json_durably(self.path, data)

    def _round_stored(self, pending: Mapping[str, Any]) -> bool:
        """Whether a round's put landed: its first copy is in its retry topic at or after the
        round's commit log offset (a round is stored all or none)."""
        topic, uniq_key, reconsume_times = pending["first"]
        log_offset = int(pending["log_offset"])
        store = self.broker.store
        self.broker.flush()
        position = store.max_offset(topic, 0) - 1
        while position >= 0:
            landed = store.message_at(topic, 0, position, decompress=False)
            if landed is None or landed.commit_log_offset < log_offset:
                return False
            if landed.uniq_key == uniq_key and landed.reconsume_times == reconsume_times:
                return True
            position -= 1
        return False

    def _recover_pop_offsets(self) -> None:
        """Move each group's pop offset on to the end of the checkpoints stored after its last
        persisted commit: pops commit their offsets in memory, and a broker killed before it
        persisted them would pop those messages again."""
        broker = self.broker
        ledger = broker.offsets.ledger
        times = [current[1] for key in ledger.keys() if (current := ledger.current(key)) is not None]
        since = max(times) - RECOVERY_MARGIN_MS if times else 0
        ends: dict[tuple[str, str, int], int] = {}
        for ck in self._stored_checkpoints(since):
            if ck.re_put_times is not None or ck.broker_name != broker.broker_name:
                continue
            current = ledger.current((ck.group, broker.broker_name, ck.topic, ck.queue_id))
            if not ck.offsets or (current is not None and current[1] > ck.pop_time):
                continue
            key = (ck.group, ck.topic, ck.queue_id)
            ends[key] = max(ends.get(key, 0), max(ck.offsets) + 1)
        for (group, topic, queue_id), end in ends.items():
            if broker.offsets.query_offset(group, topic, queue_id) < end:
                broker.offsets.commit_offset(group, topic, queue_id, end, source="pop")

    def _stored_checkpoints(self, since: int) -> Iterable[PopCheckPoint]:
        """Every ck record stored at or after ``since`` (epoch ms), in the timer topic (still
        waiting for its time) or in a revive queue."""
        store = self.broker.store
        cks = Subscription.parse(c.CK_TAG)  # read by the tags code: the timer's other records are skipped unread
        queues = [(c.TIMER_TOPIC, 0)] + [(self.revive_topic, q) for q in range(c.REVIVE_QUEUE_NUM)]
        for topic, queue_id in queues:
            offset = store.offset_by_time(topic, queue_id, since)
            while True:
                got = store.get_message(topic, queue_id, offset, c.MAX_POP_NUMS, cks)
                for record in got.messages:
                    if record.tags != c.CK_TAG:
                        continue
                    if topic == c.TIMER_TOPIC and record.properties.get(c.PROPERTY_REAL_TOPIC) != self.revive_topic:
                        continue
                    try:
                        yield PopCheckPoint.from_json(record.body.decode("utf-8", "replace"))
                    except ValidationError as exc:
                        _log.warning("%s:%s offset %s: %s; skipped", topic, queue_id, record.queue_offset, exc)
                if got.next_begin_offset <= offset:
                    break
                offset = got.next_begin_offset


def _matching(messages: list[MessageExt], sql: SqlFilter | None, filtered: bool) -> list[MessageExt]:
    """The messages a SQL92 filter matches (all without one; all of a retry topic, whose copies were
    matched before they were revived, as RocketMQ subscribes the retry topic to everything)."""
    if sql is None or not filtered:
        return messages
    return [m for m in messages if sql.matches(m.properties)]


def revive_progress_path(lake: str | Path, broker_name: str) -> Path:
    """Where a broker's revive progress lives."""
    return Path(lake) / "_config" / broker_name / "reviveProgress.json"
