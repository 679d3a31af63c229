"""The concurrent push consumer: RocketMQ's ``DefaultMQPushConsumer`` with a concurrent listener.
It pulls its share of its topics' queues (and ``%RETRY%group`` in CLUSTERING mode), hands batches
to the listener in a thread pool, sends failed messages back for retry, and commits the smallest
offset still in flight. See docs/clients.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from broker_model.broker import Broker
from broker_model.client.consume_core import (
    ConsumeFromWhere,
    MessageModel,
    ProcessQueue,
    check_consume_from_where,
    check_message_model,
    compute_pull_from_where,
)
from broker_model.client.offset_store import LocalFileOffsetStore, RemoteBrokerOffsetStore
from broker_model.common import MessageQueue, validate_group, validate_topic
from broker_model.common import constants as c
from broker_model.store import MessageExt, PullStatus, Subscription
from schemas.errors import BrokerError, RmqLakeError, ValidationError

_log = logging.getLogger(__name__)

ACK_INDEX_ALL = c.JAVA_INT_MAX  # ConsumeConcurrentlyContext.ackIndex default: Integer.MAX_VALUE
REBALANCE_INTERVAL_S = 1.0  # the pull thread re-reads topics and the allocation this often


class ConsumeConcurrentlyStatus(Enum):
    """What a concurrent listener answers for a batch."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


@dataclass
class ConsumeConcurrentlyContext:
    """Handed to the listener with each batch; the listener may change the two settings.

    ``ack_index``: with CONSUME_SUCCESS, messages after this index count as failed (default: all
    succeed). ``delay_level_when_next_consume``: delay level of the send-back, 0 lets the broker
    choose (3 + reconsume times), -1 sends failed messages to the DLQ at once.
    """

    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0
    ack_index: int = ACK_INDEX_ALL


MessageListenerConcurrently = Callable[[list[MessageExt], ConsumeConcurrentlyContext], ConsumeConcurrentlyStatus | None]
AllocateStrategy = Callable[[str, list[MessageQueue]], Sequence[MessageQueue]]
"""``(topic, every queue of the topic, sorted) -> the queues this client consumes``."""


@dataclass
class _Later:
    """Messages whose send-back failed, consumed again at ``due`` (monotonic seconds)."""

    messages: list[MessageExt]
    process_queue: ProcessQueue
    queue: MessageQueue
    due: float


class PushConsumer:
    """A concurrent push consumer of one group (see the module docstring)."""

    def __init__(
        self,
        brokers: Sequence[Broker],
        group: str,
        listener: MessageListenerConcurrently,
        subscriptions: Mapping[str, str],
        *,
        message_model: MessageModel = "CLUSTERING",
        client_id: str | None = None,
        offset_dir: str | Path | None = None,
        consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET",
        consume_timestamp: int | None = None,
        pull_batch_size: int = c.PULL_BATCH_SIZE,
        consume_message_batch_max_size: int = c.CONSUME_MESSAGE_BATCH_MAX_SIZE,
        consume_thread_min: int = c.CONSUME_THREADS,
        consume_thread_max: int = c.CONSUME_THREADS,
        max_reconsume_times: int = -1,
        pull_threshold_for_queue: int = c.PULL_THRESHOLD_FOR_QUEUE,
        consume_concurrently_max_span: int = c.CONSUME_CONCURRENTLY_MAX_SPAN,
        persist_consumer_offset_interval_ms: int = c.PERSIST_CONSUMER_OFFSET_INTERVAL_MS,
        idle_wait_ms: int = 20,
        allocate: AllocateStrategy | None = None,
    ) -> None:
        """Configure the consumer (nothing runs until :meth:`poll_once` or :meth:`start`).

        ``subscriptions`` maps topics to tag expressions. ``max_reconsume_times`` -1 leaves the
        limit to the group's ``retry_max_times`` on the broker (default 16, RocketMQ's value for
        concurrent consumers); a value >= 0 is sent with every send-back and overrides it.
        ``consume_timestamp`` (epoch ms) is needed by CONSUME_FROM_TIMESTAMP. The consume pool
        runs ``consume_thread_min`` threads: RocketMQ's pool has an unbounded queue, so it never
        grows to ``consume_thread_max``.

        Raises:
            ValidationError: a bad group, topic, tag expression, mode or setting.
        """
        validate_group(group)
        if not brokers:
            raise ValidationError("brokers", [], "a consumer needs at least one broker")
        check_message_model(message_model)
        check_consume_from_where(consume_from_where)
        if consume_from_where == "CONSUME_FROM_TIMESTAMP" and consume_timestamp is None:
            raise ValidationError("consume_timestamp", None, "CONSUME_FROM_TIMESTAMP needs a time (epoch ms)")
        _check_range("pull_batch_size", pull_batch_size, 1, 1024)
        _check_range("consume_message_batch_max_size", consume_message_batch_max_size, 1, 1024)
        _check_range("consume_thread_min", consume_thread_min, 1, 1000)
        _check_range("consume_thread_max", consume_thread_max, consume_thread_min, 1000)
        _check_range("max_reconsume_times", max_reconsume_times, -1, 2**31 - 1)
        _check_range("pull_threshold_for_queue", pull_threshold_for_queue, 1, 65535)
        _check_range("consume_concurrently_max_span", consume_concurrently_max_span, 1, 65535)
        if not subscriptions:
            raise ValidationError("subscriptions", dict(subscriptions), "subscribe to at least one topic")
        self.brokers = {b.broker_name: b for b in brokers}
        self.group = group
        self.listener = listener
        self.message_model = message_model
        self.retry_topic = c.RETRY_GROUP_TOPIC_PREFIX + group
        self.subscriptions: dict[str, Subscription] = {}
        for topic, expression in subscriptions.items():
            validate_topic(topic)
            self.subscriptions[topic] = Subscription.parse(expression)
        if message_model == "CLUSTERING":
            self.subscriptions[self.retry_topic] = Subscription.parse("*")
        self.client_id = client_id or f"127.0.0.1@{os.getpid()}"
        self.offset_store: RemoteBrokerOffsetStore | LocalFileOffsetStore
        if message_model == "CLUSTERING":
            managers = {name: broker.offsets for name, broker in self.brokers.items()}
            self.offset_store = RemoteBrokerOffsetStore(managers, group, self.client_id)
        elif offset_dir is None:
            raise ValidationError("offset_dir", offset_dir, "a broadcasting consumer keeps offsets in local files")
        else:
            self.offset_store = LocalFileOffsetStore(offset_dir, self.client_id, group)
        self.consume_from_where = consume_from_where
        self.consume_timestamp = consume_timestamp
        self.pull_batch_size = pull_batch_size
        self.consume_message_batch_max_size = consume_message_batch_max_size
        self.consume_thread_min = consume_thread_min
        self.consume_thread_max = consume_thread_max
        self.max_reconsume_times = max_reconsume_times
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.consume_concurrently_max_span = consume_concurrently_max_span
        self.persist_interval_ms = persist_consumer_offset_interval_ms
        self.idle_wait_ms = idle_wait_ms
        self.allocate = allocate
        self.stats: Counter[str] = Counter()  # consumed, succeeded, failed, sent_back, send_back_failed, dropped
        self._stats_lock = threading.Lock()
        self._queues: dict[MessageQueue, ProcessQueue] = {}
        self._queues_lock = threading.Lock()
        self._later: list[_Later] = []
        self._later_lock = threading.Lock()
        self._stop = threading.Event()
        self._executor: ThreadPoolExecutor | None = None
        self._threads: list[threading.Thread] = []
        self._started = False

    # -- queues -----------------------------------------------------------------------------------

    def assigned_queues(self) -> list[MessageQueue]:
        """The queues this client consumes now, sorted."""
        with self._queues_lock:
            return sorted(self._queues)

    def rebalance(self) -> None:
        """Take the queues the allocation gives this client (every queue of every subscribed
        topic on every broker by default), starting each new one at its committed offset (or per
        ``consume_from_where``); queues no longer given are persisted and dropped."""
        wanted: set[MessageQueue] = set()
        for topic in self.subscriptions:
            queues = sorted(
                MessageQueue(name, topic, q)
                for name, broker in self.brokers.items()
                for q in range(broker.queue_nums(topic) or 0)
            )
            if queues:
                wanted.update(self.allocate(topic, queues) if self.allocate is not None else queues)
        with self._queues_lock:
            current = dict(self._queues)
        for queue, process_queue in current.items():
            if queue not in wanted:
                process_queue.dropped = True
                self._persist_queue(queue)
                with self._queues_lock:
                    self._queues.pop(queue, None)
        for queue in sorted(wanted - current.keys()):
            start = self._compute_pull_from_where(queue)
            if start is not None:
                with self._queues_lock:
                    self._queues[queue] = ProcessQueue(pull_offset=start)

    def _compute_pull_from_where(self, queue: MessageQueue) -> int | None:
        """The first offset to pull of a newly taken queue; None when the offset store cannot be
        read now (tried again at the next rebalance)."""
        # __init__ refused CONSUME_FROM_TIMESTAMP without a time; the others do not read it
        moment = self.consume_timestamp if self.consume_timestamp is not None else 0
        store = self.brokers[queue.broker_name].store
        return compute_pull_from_where(self.offset_store, store, queue, self.consume_from_where, moment)

    # -- one deterministic round ------------------------------------------------------------------

    def poll_once(self) -> int:
        """One round in the calling thread: rebalance, consume the messages whose send-back
        failed, pull each queue once and consume every batch in queue order. Returns the number
        of messages handed to the listener. Deterministic for a deterministic listener.

        Raises:
            BrokerError: the consumer was started (its threads do the work then).
        """
        if self._started:
            raise BrokerError("poll_once is for a consumer that is not started; it runs its own threads")
        self.rebalance()
        handed = 0
        for later in self._take_later(due_only=False):
            handed += self._consume(later.messages, later.process_queue, later.queue)
        with self._queues_lock:
            queues = sorted(self._queues.items())
        for queue, process_queue in queues:
            for batch in self._pull(queue, process_queue):
                handed += self._consume(batch, process_queue, queue)
        return handed

    def persist(self) -> None:
        """Send every offset to its store (the brokers, or the local file)."""
        self.offset_store.persist_all()

    # -- threads ----------------------------------------------------------------------------------

    def start(self) -> PushConsumer:
        """Start the pull thread, the consume pool and the offset persister."""
        if self._started:
            return self
        self._started = True
        self._stop.clear()
        self._executor = ThreadPoolExecutor(self.consume_thread_min, thread_name_prefix=f"consume-{self.group}")
        self._threads = [
            threading.Thread(target=self._pull_loop, name=f"pull-{self.group}", daemon=True),
            threading.Thread(target=self._persist_loop, name=f"offsets-{self.group}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def shutdown(self) -> None:
        """Stop pulling, let every batch handed to the pool finish, then persist the offsets.
        Works after :meth:`poll_once` rounds too (it then only persists)."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._started = False
        self.persist()

    def __enter__(self) -> PushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _pull_loop(self) -> None:
        next_rebalance = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_rebalance:
                self._safely(self.rebalance)
                next_rebalance = time.monotonic() + REBALANCE_INTERVAL_S
            try:
                found = self._pull_round()
            except Exception:  # the pull thread must not die; the next round retries
                _log.exception("pull round of %s failed", self.group)
                found = False
            if not found:
                self._stop.wait(self.idle_wait_ms / 1000)

    def _pull_round(self) -> bool:
        """Hand due retries and one pull of every queue to the pool; True when a pull found any."""
        for later in self._take_later(due_only=True):
            self._submit(later.messages, later.process_queue, later.queue)
        found = False
        with self._queues_lock:
            queues = sorted(self._queues.items())
        for queue, process_queue in queues:
            if self._stop.is_set():
                break
            for batch in self._pull(queue, process_queue):
                found = True
                self._submit(batch, process_queue, queue)
        return found

    def _persist_loop(self) -> None:
        while not self._stop.wait(self.persist_interval_ms / 1000):
            self._safely(self.persist)

    def _submit(self, batch: list[MessageExt], process_queue: ProcessQueue, queue: MessageQueue) -> None:
        executor = self._executor
        if executor is None:
            return
        try:
            executor.submit(self._safely, lambda: self._consume(batch, process_queue, queue))
        except RuntimeError:  # the pool is shutting down: the messages stay uncommitted
            return

    @staticmethod
    def _safely(action: Callable[[], object]) -> None:
        try:
            action()
        except Exception:  # a thread of the consumer must not die; the next round retries
            _log.exception("push consumer task failed")

    # -- pulling ----------------------------------------------------------------------------------

    def _pull(self, queue: MessageQueue, process_queue: ProcessQueue) -> list[list[MessageExt]]:
        """One pull of ``queue`` (unless flow control holds it); returns the batches to consume."""
        if process_queue.dropped or process_queue.cached_count > self.pull_threshold_for_queue:
            return []
        if process_queue.max_span > self.consume_concurrently_max_span:
            return []
        broker = self.brokers[queue.broker_name]
        subscription = self.subscriptions[queue.topic]
        try:
            result = broker.pull(
                queue.topic, queue.queue_id, process_queue.pull_offset, self.pull_batch_size, subscription.expression
            )
        except RmqLakeError:
            _log.exception("pull of %s failed", queue)
            return []
        process_queue.pull_offset = result.next_begin_offset
        if result.status is PullStatus.FOUND and result.messages:
            process_queue.put_messages(result.messages)
            size = self.consume_message_batch_max_size
            return [result.messages[i : i + size] for i in range(0, len(result.messages), size)]
        if result.status is PullStatus.OFFSET_ILLEGAL:
            with process_queue.lock:
                self.offset_store.update_offset(queue, result.next_begin_offset, False)
            self._persist_queue(queue)
        elif result.status is not PullStatus.FOUND and process_queue.cached_count == 0:
            with process_queue.lock:  # correctTagsOffset: nothing held, so everything scanned is done
                self.offset_store.update_offset(queue, result.next_begin_offset, True)
        return []

    # -- consuming --------------------------------------------------------------------------------

    def _consume(self, messages: list[MessageExt], process_queue: ProcessQueue, queue: MessageQueue) -> int:
        """``ConsumeRequest.run``: restore retry topics, call the listener, process the result."""
        if process_queue.dropped:
            return 0
        for message in messages:
            retry_topic = message.properties.get(c.PROPERTY_RETRY_TOPIC)
            if retry_topic is not None and message.topic == self.retry_topic:
                message.topic = retry_topic
            message.properties[c.PROPERTY_CONSUME_START_TIMESTAMP] = str(time.time_ns() // 1_000_000)
        context = ConsumeConcurrentlyContext(queue)
        try:
            status = self.listener(list(messages), context)
        except Exception:
            _log.warning("listener of %s raised; the batch is reconsumed later", self.group, exc_info=True)
            status = None
        if status is None:
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        if not process_queue.dropped:
            self._process_result(status, context, messages, process_queue, queue)
        return len(messages)

    def _process_result(
        self,
        status: ConsumeConcurrentlyStatus,
        context: ConsumeConcurrentlyContext,
        messages: list[MessageExt],
        process_queue: ProcessQueue,
        queue: MessageQueue,
    ) -> None:
        """``processConsumeResult``: send failures back (or drop them when broadcasting), then
        commit the process-queue offset."""
        ack_index = -1  # RECONSUME_LATER, or anything else a listener returned
        if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS:
            ack_index = max(-1, min(context.ack_index, len(messages) - 1))
        failed = messages[ack_index + 1 :]
        self._count(consumed=len(messages), succeeded=len(messages) - len(failed), failed=len(failed))
        retained: list[MessageExt] = []
        for message in failed:
            if self.message_model == "BROADCASTING":
                _log.info("BROADCASTING, the message consume failed, drop it: %s", message.msg_id)
                self._count(dropped=1)
            elif self._send_message_back(message, context):
                self._count(sent_back=1)
            else:
                message.reconsume_times += 1
                retained.append(message)
                self._count(send_back_failed=1)
        if retained:
            due = time.monotonic() + c.CONSUME_REQUEST_LATER_MS / 1000
            with self._later_lock:
                self._later.append(_Later(retained, process_queue, queue, due))
        done = [m for m in messages if all(m is not r for r in retained)]
        process_queue.remove_messages(done, lambda offset: self.offset_store.update_offset(queue, offset, True))

    def _send_message_back(self, message: MessageExt, context: ConsumeConcurrentlyContext) -> bool:
        """Send a failed message back to the broker that holds it; False when that failed."""
        broker = self.brokers[context.message_queue.broker_name]
        limit = None if self.max_reconsume_times < 0 else self.max_reconsume_times
        try:
            broker.consumer_send_back(
                self.group,
                message.commit_log_offset,
                context.delay_level_when_next_consume,
                limit,
                client_msg_id=message.uniq_key or message.msg_id,
            )
        except RmqLakeError:
            _log.warning("send-back of %s failed", message.msg_id, exc_info=True)
            return False
        return True

    def _take_later(self, due_only: bool) -> list[_Later]:
        now = time.monotonic()
        with self._later_lock:
            ready = [later for later in self._later if not due_only or later.due <= now]
            self._later = [later for later in self._later if all(later is not r for r in ready)]
        return ready

    def _persist_queue(self, queue: MessageQueue) -> None:
        if isinstance(self.offset_store, RemoteBrokerOffsetStore):
            self.offset_store.persist(queue)
        else:
            self.offset_store.persist_all()

    def _count(self, **amounts: int) -> None:
        with self._stats_lock:
            self.stats.update(amounts)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValidationError(name, value, f"must be an int in [{low}, {high}]")
