"""The producer client: queue selection over several brokers, retries, batches, compression.

Mirrors ``DefaultMQProducer``: round robin over all of a topic's queues on all brokers (avoiding the
broker that just failed on a retry), the latency fault strategy (off by default), sends with a
selector (no retry), batches, delay levels, zlib compression of bodies of 4 KiB and more, and a
:class:`SendResult` like RocketMQ's.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from broker_model.broker import Broker, InnerMessage, PutResult
from broker_model.common import (
    Message,
    MessageQueue,
    UniqKeyFactory,
    decompress_body,
    now_ms,
    process_uniq_key_factory,
    select_queue_by_hash,
    validate_batch,
    validate_group,
    validate_message,
)
from broker_model.common import constants as c
from schemas.errors import BrokerError, ValidationError


@dataclass(frozen=True)
class SendResult:
    """Outcome of a send, as RocketMQ's ``SendResult``.

    ``msg_id`` is the client unique id (UNIQ_KEY), ``offset_msg_id`` the broker's offset id; for a
    batch both are comma-joined in message order and ``queue_offset`` is the first message's.
    """

    send_status: str
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    commit_log_offset: int


__all__ = ["MessageQueue", "Producer", "SendResult", "decompress_body", "select_by_hash"]

MessageQueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]


def select_by_hash(queues: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
    """``SelectMessageQueueByHash``: Java hash of ``str(arg)`` modulo the queue count, remainder
    first then absolute value (safe for Integer.MIN_VALUE)."""
    return queues[select_queue_by_hash(str(arg), len(queues))]


class LatencyFaultTolerance:
    """RocketMQ's latency fault strategy (its 5.x values): a broker whose last send
    took long (or failed) is avoided for a while; see ``MQFaultStrategy``."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._available_after: dict[str, int] = {}
        self._latency: dict[str, int] = {}

    def update(self, broker_name: str, latency_ms: int, isolation: bool) -> None:
        """Record a send's latency (a failed send counts as the isolation latency)."""
        latency = c.ISOLATION_LATENCY if isolation else latency_ms
        duration = not_available_duration(latency)
        self._latency[broker_name] = latency
        self._available_after[broker_name] = self._clock() + duration

    def is_available(self, broker_name: str) -> bool:
        """True when the broker is not being avoided now."""
        return self._clock() >= self._available_after.get(broker_name, 0)

    def least_bad(self, candidates: Sequence[str]) -> str:
        """Among avoided brokers, the one that becomes available first (then lowest latency)."""
        return min(candidates, key=lambda b: (self._available_after.get(b, 0), self._latency.get(b, 0), b))


def not_available_duration(latency_ms: int) -> int:
    """How long (ms) a broker is avoided after a send of ``latency_ms``: the duration of the
    largest threshold the latency reaches, 0 below all thresholds."""
    for threshold, duration in zip(reversed(c.LATENCY_MAX), reversed(c.NOT_AVAILABLE_DURATION), strict=True):
        if latency_ms >= threshold:
            return duration
    return 0


class Producer:
    """A producer of one group that knows several brokers of a lake (in this process).

    Deterministic given ``seed`` and a single sending thread: the round-robin start index of each
    thread comes from a generator seeded with ``seed``.
    """

    def __init__(
        self,
        brokers: Sequence[Broker],
        group: str = "DEFAULT_PRODUCER",
        *,
        client_ip: str = "127.0.0.1",
        client_port: int = 50000,
        send_latency_fault_enable: bool = False,
        retry_times_when_send_failed: int = c.RETRY_TIMES_WHEN_SEND_FAILED,
        compress_over: int = c.COMPRESS_MSG_BODY_OVER,
        max_message_size: int = c.MAX_MESSAGE_SIZE,
        default_topic_queue_nums: int = c.DEFAULT_TOPIC_QUEUE_NUMS,
        seed: int | None = None,
        clock: Callable[[], int] = now_ms,
        uniq_keys: UniqKeyFactory | None = None,
    ) -> None:
        if not brokers:
            raise ValidationError("brokers", [], "a producer needs at least one broker")
        validate_group(group)
        self.brokers = {b.broker_name: b for b in brokers}
        self._ordered_brokers = [self.brokers[name] for name in sorted(self.brokers)]
        self._routes: dict[str, tuple[tuple[int | None, ...], list[MessageQueue]]] = {}
        self.group = group
        self.born_host = f"{client_ip}:{client_port}" if ":" not in client_ip else f"[{client_ip}]:{client_port}"
        self.retry_times = retry_times_when_send_failed
        self.compress_over = compress_over
        self.max_message_size = max_message_size
        self.default_topic_queue_nums = default_topic_queue_nums
        self.fault = LatencyFaultTolerance(clock) if send_latency_fault_enable else None
        self._clock = clock
        self._seeds = random.Random(seed)
        self._seed_lock = threading.Lock()
        self._index = threading.local()
        self._uniq = uniq_keys or process_uniq_key_factory(client_ip)

    # -- routes -----------------------------------------------------------------------------------

    def queues(self, topic: str) -> list[MessageQueue]:
        """All write queues of ``topic`` on all brokers, ordered by broker then queue id; a topic
        unknown everywhere is created on every broker (as through TBW102)."""
        sizes = tuple(broker.queue_nums(topic) for broker in self._ordered_brokers)
        cached = self._routes.get(topic)
        if cached is not None and cached[0] == sizes:
            return cached[1]
        routes = [
            MessageQueue(broker.broker_name, topic, q)
            for broker, size in zip(self._ordered_brokers, sizes, strict=True)
            for q in range(size or 0)
        ]
        if routes:
            self._routes[topic] = (sizes, routes)
            return routes
        for broker in self.brokers.values():
            broker.ensure_topic(topic, self.default_topic_queue_nums)
        return self.queues(topic)

    def _next_index(self) -> int:
        index = getattr(self._index, "value", None)
        if index is None:
            with self._seed_lock:
                index = self._seeds.randrange(0, 2**31)
        index = (index + 1) & 0x7FFFFFFF
        self._index.value = index
        return index

    def select_queue(self, topic: str, last_broker: str | None = None) -> MessageQueue:
        """Round robin over the topic's queues, avoiding ``last_broker`` (and, with the latency
        fault strategy on, brokers being avoided) when another choice exists."""
        queues = self.queues(topic)
        for _ in range(len(queues)):
            queue = queues[self._next_index() % len(queues)]
            if queue.broker_name == last_broker:
                continue
            if self.fault is None or self.fault.is_available(queue.broker_name):
                return queue
        if self.fault is not None:
            usable = sorted({q.broker_name for q in queues} - {last_broker} or {q.broker_name for q in queues})
            best = self.fault.least_bad(usable)
            candidates = [q for q in queues if q.broker_name == best]
            return candidates[self._next_index() % len(candidates)]
        return queues[self._next_index() % len(queues)]

    # -- sends ------------------------------------------------------------------------------------

    def send(self, message: Message, selector: MessageQueueSelector | None = None, arg: Any = None) -> SendResult:
        """Send one message synchronously.

        Without a selector the send tries ``1 + retry_times_when_send_failed`` times, each retry on
        a queue of another broker than the one that just failed. With a selector (e.g.
        :func:`select_by_hash` and an order id as ``arg``) there is no retry, as in RocketMQ.

        Raises:
            ValidationError: the message breaks a rule; nothing was sent.
            BrokerError: every try failed.
        """
        validate_message(message, self.max_message_size)
        uniq_key = self._uniq_key_of(message)
        if selector is not None:
            queue = selector(self.queues(message.topic), message, arg)
            return self._send_to(queue, [self._inner(message, queue, uniq_key)])
        return self._send_with_retries(message.topic, lambda queue: [self._inner(message, queue, uniq_key)])

    def send_to_queue(self, message: Message, queue: MessageQueue) -> SendResult:
        """Send one message to an explicit queue (no retry)."""
        validate_message(message, self.max_message_size)
        return self._send_to(queue, [self._inner(message, queue, self._uniq_key_of(message))])

    def send_batch(
        self, messages: Sequence[Message], selector: MessageQueueSelector | None = None, arg: Any = None
    ) -> SendResult:
        """Send a batch (one topic, no delay, no retry topic) to one queue as consecutive records.

        Bodies of a batch are never compressed. Retries as :meth:`send`.
        """
        batch = validate_batch(messages, self.max_message_size)
        fresh = iter(self._uniq.create_many(len(batch)))
        uniq_keys = [m.properties.get(c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or next(fresh) for m in batch]

        def build(queue: MessageQueue) -> list[InnerMessage]:
            return [self._inner(m, queue, k, compress=False) for m, k in zip(batch, uniq_keys, strict=True)]

        if selector is not None:
            queue = selector(self.queues(batch[0].topic), batch[0], arg)
            return self._send_to(queue, build(queue))
        return self._send_with_retries(batch[0].topic, build)

    def _send_with_retries(self, topic: str, build: Callable[[MessageQueue], list[InnerMessage]]) -> SendResult:
        last_broker: str | None = None
        error: BrokerError | None = None
        for _ in range(1 + self.retry_times):
            queue = self.select_queue(topic, last_broker)
            try:
                return self._send_to(queue, build(queue))
            except BrokerError as exc:
                error, last_broker = exc, queue.broker_name
        assert error is not None
        raise BrokerError(f"send to {topic!r} failed after {1 + self.retry_times} tries: {error}") from error

    def _send_to(self, queue: MessageQueue, inner: list[InnerMessage]) -> SendResult:
        broker = self.brokers.get(queue.broker_name)
        if broker is None:
            raise ValidationError("broker_name", queue.broker_name, "is not a broker of this producer")
        started = time.monotonic()
        try:
            put = broker.put_messages(inner)
        except BrokerError:
            if self.fault is not None:
                self.fault.update(queue.broker_name, 0, isolation=True)
            raise
        if self.fault is not None:
            self.fault.update(queue.broker_name, int((time.monotonic() - started) * 1000), isolation=False)
        return _send_result(queue, inner, put)

    def _uniq_key_of(self, message: Message) -> str:
        """The message's UNIQ_KEY, created once per send so that retries keep the same id."""
        return message.properties.get(c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or self._uniq.create()

    def _inner(self, message: Message, queue: MessageQueue, uniq_key: str, compress: bool = True) -> InnerMessage:
        properties = {**message.properties, c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq_key}
        body, sys_flag = message.body, 0
        if compress and len(body) >= self.compress_over:
            body = zlib.compress(body, c.COMPRESS_LEVEL)
            sys_flag |= c.COMPRESSED_FLAG | c.COMPRESSION_ZLIB_TYPE
        return InnerMessage(
            topic=queue.topic,
            queue_id=queue.queue_id,
            body=body,
            properties=properties,
            flag=message.flag,
            sys_flag=sys_flag,
            born_timestamp=self._clock(),
            born_host=self.born_host,
        )


def _send_result(queue: MessageQueue, inner: list[InnerMessage], put: PutResult) -> SendResult:
    uniq = ",".join(m.properties[c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] for m in inner)
    # the queue the producer chose, even when the broker stored a delayed message elsewhere
    return SendResult("SEND_OK", uniq, ",".join(put.msg_ids), queue, put.queue_offsets[0], put.commit_log_offsets[0])
