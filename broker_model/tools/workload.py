"""Seeded, realistic workloads written through real brokers.

:func:`plan_sends` is pure: the same seed gives the same sends (topics, bodies, tags, keys, order
ids, batch boundaries, delay levels). :func:`run_workload` writes a plan through real brokers from
several threads; thread interleaving decides offsets, the plan decides content.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from broker_model.broker import (
    Broker,
    BrokerConfig,
    FlushMode,
    LocalTransactionState,
    ScheduleMessageService,
    SubscriptionGroupConfig,
    TransactionCheckService,
)
from broker_model.client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
    select_by_hash,
)
from broker_model.common import Message, MessageQueue, now_ms
from broker_model.common import constants as c
from broker_model.store import MessageExt, PullStatus
from schemas.errors import ValidationError

# (topic, queue count per broker, tags, share of sends) of the demo business
TOPICS: tuple[tuple[str, int, tuple[str, ...], float], ...] = (
    ("Orders", 8, ("created", "paid", "shipped", "cancelled"), 0.35),
    ("Payments", 4, ("authorized", "captured", "refunded"), 0.25),
    ("Inventory", 4, ("reserved", "released"), 0.2),
    ("Notifications", 2, ("email", "sms", "push"), 0.15),
    ("Audit", 1, ("", "security"), 0.05),
)


@dataclass(frozen=True)
class PlannedSend:
    """One send of the plan: a single message, an ordered message, or a batch."""

    kind: str  # "single", "ordered", "batch", "delayed"
    messages: tuple[Message, ...]
    order_id: str | None = None


@dataclass
class WorkloadReport:
    """What a workload run wrote."""

    sends: int = 0
    messages: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    by_topic: Counter[str] = field(default_factory=Counter)
    by_broker: Counter[str] = field(default_factory=Counter)
    consumed: Counter[str] = field(default_factory=Counter)
    transactions: Counter[str] = field(default_factory=Counter)
    last_check: int = 0  # time (ms) of the last transaction check round
    retries: Counter[str] = field(default_factory=Counter)  # push consumer figures and dead letters
    # wall seconds per phase, in the order they ran: where a run's time went. The phases: sends
    # (producer threads sending the plan), consumers (groups pulling and committing), transactions
    # (with their check rounds), retries (push consumers failing into retries and dead letters),
    # shutdown (the last flush and the brokers' stop)
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        """A one-paragraph human summary."""
        return (
            f"{self.messages} messages in {self.sends} sends; kinds {dict(sorted(self.by_kind.items()))}; "
            f"brokers {dict(sorted(self.by_broker.items()))}; topics {dict(sorted(self.by_topic.items()))}; "
            f"consumed {dict(sorted(self.consumed.items()))}; transactions {dict(sorted(self.transactions.items()))}"
            + (f"; retries {dict(sorted(self.retries.items()))}" if self.retries else "")
            + (f"; seconds {self.seconds}" if self.seconds else "")
        )


def plan_sends(messages: int, seed: int) -> list[PlannedSend]:
    """A deterministic plan of sends holding exactly ``messages`` messages.

    Mix of sends: 5 % batches of 2-16 messages (about a third of all messages), 25 % ordered sends
    keyed by an order id, 5 % delayed (levels 1-18), the rest single unordered sends; one body in
    50 is over 4 KiB so that compression happens.
    """
    rng = random.Random(seed)
    plan: list[PlannedSend] = []
    left = messages
    while left > 0:
        topic, _, tags, _ = rng.choices(TOPICS, weights=[t[3] for t in TOPICS])[0]
        roll = rng.random()
        if roll < 0.05 and left >= 2:
            size = min(left, rng.randint(2, 16))
            batch = tuple(_message(rng, topic, tags) for _ in range(size))
            plan.append(PlannedSend("batch", batch))
        elif roll < 0.30:
            order_id = f"order-{rng.randrange(10_000)}"
            plan.append(PlannedSend("ordered", (_message(rng, topic, tags, order_id),), order_id))
        elif roll < 0.35:
            plan.append(PlannedSend("delayed", (_message(rng, topic, tags, delay=rng.randint(1, 18)),)))
        else:
            plan.append(PlannedSend("single", (_message(rng, topic, tags),)))
        left -= len(plan[-1].messages)
    return plan


def _message(
    rng: random.Random, topic: str, tags: Sequence[str], order_id: str | None = None, delay: int = 0
) -> Message:
    tag = rng.choice(tags)
    key = order_id or f"key-{rng.randrange(1_000_000)}"
    payload = {"id": rng.randrange(10**9), "key": key, "amount": round(rng.uniform(1, 5000), 2)}
    body = json.dumps(payload).encode()
    if rng.random() < 0.02:
        body += b" " + filler(rng, rng.randint(4096, 9000))
    elif rng.random() < 0.5:
        body += b" " + b"x" * rng.randint(0, 400)
    return Message.create(topic, body, tags=tag or None, keys=[key], delay_level=delay)


FILLER = b"abcdefgh"  # the letters of the bodies over 4 KiB


def filler(rng: random.Random, count: int) -> bytes:
    """``bytes(rng.choice(FILLER) for _ in range(count))``, leaving ``rng`` where that leaves it,
    drawn in bulk: ``choice`` of 8 takes the top 4 bits of one 32-bit word of the generator per try
    and keeps a value below 8. Every process checks once that its ``random`` still draws so, and
    draws one letter at a time when it does not."""
    if not _bulk_draws_match():
        return bytes(rng.choice(FILLER) for _ in range(count))
    return _bulk_filler(rng, count)


def _bulk_filler(rng: random.Random, count: int) -> bytes:
    if count <= 0:
        return b""
    state = rng.getstate()
    words = 2 * count + 64
    while True:
        drawn = np.frombuffer(rng.getrandbits(32 * words).to_bytes(4 * words, "little"), dtype="<u4") >> 28
        kept = np.flatnonzero(drawn < len(FILLER))
        rng.setstate(state)
        if len(kept) >= count:
            break
        words *= 2
    rng.getrandbits(32 * (int(kept[count - 1]) + 1))  # the words the tries took, and no more
    return bytes(np.frombuffer(FILLER, dtype=np.uint8)[drawn[kept[:count]]])


@functools.cache
def _bulk_draws_match() -> bool:
    one, bulk = random.Random(20_241_127), random.Random(20_241_127)
    letters = bytes(one.choice(FILLER) for _ in range(1_000))
    return _bulk_filler(bulk, 1_000) == letters and one.random() == bulk.random()


def start_brokers(
    lake: Path,
    count: int,
    segment_size: int | None = None,
    flush_mode: FlushMode = "ASYNC_FLUSH",
    clock: Callable[[], int] = now_ms,
) -> list[Broker]:
    """Start ``count`` brokers named broker-a, broker-b, ... with the demo topics created."""
    brokers = []
    for index in range(count):
        name = f"broker-{chr(ord('a') + index)}"
        config = BrokerConfig(
            lake=lake,
            broker_name=name,
            store_host=f"127.0.0.{index + 1}:10911",
            segment_size=segment_size,
            flush_mode=flush_mode,
            clock=clock,
        )
        broker = Broker(config).start()
        for topic, queues, _, _ in TOPICS:
            broker.ensure_topic(topic, queues)
        brokers.append(broker)
    return brokers


def run_workload(
    lake: Path,
    messages: int,
    seed: int,
    brokers: int = 2,
    threads: int = 4,
    segment_size: int | None = None,
    flush_mode: FlushMode = "ASYNC_FLUSH",
    consumers: bool = True,
    transactions: int = 0,
    retries: bool = False,
) -> WorkloadReport:
    """Write ``plan_sends(messages, seed)`` through ``brokers`` real brokers from ``threads``
    producer threads (send ``i`` goes to thread ``i % threads``), then (with ``consumers``) let
    the consumer groups read and commit, then flush and stop the brokers.

    With ``retries`` the brokers run on a :class:`SimulatedClock`, and after everything else the
    push consumer groups of :data:`RETRY_GROUPS` consume with failing listeners while the clock
    jumps from one delivery time to the next (:func:`run_retries`): retries, delays and dead
    letters appear in the log at realistic store times within seconds of wall time.

    Raises:
        ValidationError: a negative count of messages, transactions, brokers or threads (nothing
            is written).
    """
    for name, value, low in (("messages", messages, 0), ("transactions", transactions, 0), ("brokers", brokers, 1)):
        if value < low:
            raise ValidationError(name, value, f"must be at least {low}")
    if threads < 1:
        raise ValidationError("threads", threads, "must be at least 1")
    plan = plan_sends(messages, seed)
    clock = SimulatedClock(-RETRY_HISTORY_MS) if retries else now_ms
    started = start_brokers(lake, brokers, segment_size, flush_mode, clock)
    report = WorkloadReport()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(index: int) -> None:
        producer = Producer(started, f"workload-{index}", client_port=40000 + index, seed=seed * 1000 + index)
        local = WorkloadReport()
        try:
            for send in plan[index::threads]:
                result = _execute(producer, send)
                local.sends += 1
                local.messages += len(send.messages)
                local.by_kind[send.kind] += len(send.messages)
                local.by_topic[send.messages[0].topic] += len(send.messages)
                local.by_broker[result] += len(send.messages)
        except BaseException as exc:  # reported after the other threads finish
            errors.append(exc)
        with lock:
            _merge(report, local)

    workers = [threading.Thread(target=work, args=(i,), name=f"workload-{i}") for i in range(threads)]
    phase_started = time.perf_counter()

    def phase_ends(phase: str) -> None:
        nonlocal phase_started
        now = time.perf_counter()
        report.seconds[phase] = round(now - phase_started, 2)
        phase_started = now

    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        for broker in started:
            broker.flush()
        phase_ends("sends")
        if consumers and not errors:
            report.consumed = run_consumers(started, seed, lake / "_clients")
            phase_ends("consumers")
        if transactions and not errors:
            report.transactions, report.last_check = run_transactions(started, transactions, seed)
            phase_ends("transactions")
        if isinstance(clock, SimulatedClock) and not errors:
            report.retries = run_retries(started, seed, lake / "_clients", clock)
            phase_ends("retries")
        for broker in started:
            broker.flush()
    finally:
        for broker in started:
            broker.shutdown()
    phase_ends("shutdown")
    if errors:
        raise errors[0]
    return report


@dataclass(frozen=True)
class ConsumerGroupPlan:
    """A consumer group of the workload: what it reads and how far."""

    group: str
    topic: str
    tag_expression: str
    message_model: str  # CLUSTERING or BROADCASTING
    clients: int


# Inventory and Audit have no consumer at all; Orders' group reads only some of its queues
CONSUMER_GROUPS = (
    ConsumerGroupPlan("cg-orders", "Orders", "*", "CLUSTERING", 1),
    ConsumerGroupPlan("cg-payments", "Payments", "captured || refunded", "CLUSTERING", 1),
    ConsumerGroupPlan("bc-notifications", "Notifications", "*", "BROADCASTING", 2),
)


def run_consumers(brokers: Sequence[Broker], seed: int, offset_dir: Path) -> Counter[str]:
    """Let every group of :data:`CONSUMER_GROUPS` pull and commit at random points.

    Per queue a group reads from its committed offset (the first offset on a new lake) up to a
    random share of what it has not consumed yet (some queues not at all), committing its offset
    every few pulls; clustering offsets go to the brokers, broadcasting ones to local
    files under ``offset_dir``. A client pulls its queues in turn, one pull each, as a client's
    pull service does, so its reads move through the commit log together. Returns messages consumed
    per group.
    """
    rng = random.Random(seed + 1)
    consumed: Counter[str] = Counter()
    for plan in CONSUMER_GROUPS:
        for client in range(plan.clients):
            consumer = PullConsumer(
                brokers,
                plan.group,
                message_model=plan.message_model,  # type: ignore[arg-type]
                client_id=f"127.0.0.{10 + client}@workload",
                offset_dir=offset_dir,
            )
            reads: list[_QueueRead] = []
            for queue in consumer.queues(plan.topic):
                if plan.group == "cg-orders" and rng.random() < 0.3:
                    continue  # a queue this group never consumes
                reads.append(_QueueRead.start(consumer, queue, rng))
            while reads:
                consumed[plan.group] += sum(read.pull_once(consumer, plan.tag_expression, rng) for read in reads)
                reads = [read for read in reads if not read.done]
            consumer.persist()
    return consumed


@dataclass
class _QueueRead:
    """One queue's share of a :func:`run_consumers` client: from ``offset`` up to ``stop``."""

    queue: MessageQueue
    offset: int
    stop: int
    done: bool = False

    @classmethod
    def start(cls, consumer: PullConsumer, queue: MessageQueue, rng: random.Random) -> _QueueRead:
        """From the group's committed offset (the first on a new lake) up to a random share of what
        it has not consumed yet."""
        offset = max(consumer.read_offset(queue), 0)  # -1: none committed yet
        end = consumer.brokers[queue.broker_name].max_offset(queue.topic, queue.queue_id)
        stop = offset + int((end - offset) * rng.choice((0.0, 0.3, 0.6, 0.9, 1.0)))
        return cls(queue, offset, stop, done=offset >= stop)

    def pull_once(self, consumer: PullConsumer, tag_expression: str, rng: random.Random) -> int:
        """One pull and the offset update after it (persisted at random points); the messages
        consumed."""
        if self.done:
            return 0
        queue = self.queue
        result = consumer.pull(queue, self.offset, max_nums=rng.randint(1, 32), tag_expression=tag_expression)
        if result.status is not PullStatus.FOUND and result.status is not PullStatus.NO_MATCHED_MSG:
            self.done = True
            return 0
        self.offset = min(result.next_begin_offset, self.stop)
        self.done = self.offset >= self.stop
        consumer.update_offset(queue, self.offset)
        if rng.random() < 0.3:  # the client's and the broker's periodic persists, at random points
            consumer.persist()
            consumer.brokers[queue.broker_name].offsets.persist()
        return len(result.messages)


class SimulatedClock:
    """Real time plus a skew that only grows: brokers of a workload run on it so that the
    workload can jump to the next delivery time of delayed messages without waiting."""

    def __init__(self, skew: int = 0) -> None:
        self.skew = skew
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return now_ms() + self.skew

    def advance_to(self, moment: int) -> None:
        """Move the clock forward so that it reads at least ``moment`` (epoch ms)."""
        with self._lock:
            self.skew += max(0, moment - self())


@dataclass(frozen=True)
class RetryGroupPlan:
    """A push consumer group of the workload whose listener fails.

    A delivery fails with chance ``failure_rate`` (decided by a hash of the seed, the group, the
    message's planned keys and body, and the attempt, so the same messages fail in every run of a
    seed); a message whose hash is a multiple of ``poison_every`` always fails and ends in the DLQ.
    """

    group: str
    topic: str
    message_model: str  # CLUSTERING or BROADCASTING
    failure_rate: float
    poison_every: int  # 0: no message always fails
    retry_max_times: int | None = None  # group config on every broker; None keeps the default 16
    retry_queue_nums: int = 1


RETRY_GROUPS = (
    RetryGroupPlan("cg-inventory-retry", "Inventory", "CLUSTERING", 0.3, 40, retry_queue_nums=2),
    RetryGroupPlan("cg-audit-retry", "Audit", "CLUSTERING", 0.1, 3, retry_max_times=3),
    RetryGroupPlan("bc-inventory-retry", "Inventory", "BROADCASTING", 0.2, 0),
)
# the delays of 16 retries add up to about 4.8 h: a workload with retries starts this far in the
# past, so that all its records are stored before the real time a job run after it starts at
RETRY_HISTORY_MS = 6 * 3_600_000
RETRY_WINDOW_MS = 5000  # each jump of the clock delivers everything due within this much more


class FlakyListener:
    """The listener of a :class:`RetryGroupPlan` (batches of one message)."""

    def __init__(self, plan: RetryGroupPlan, seed: int) -> None:
        self.plan = plan
        self.seed = seed

    def __call__(self, messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        message = messages[0]
        identity = f"{self.seed}:{self.plan.group}:{message.keys}:{zlib.crc32(message.body)}"  # planned content only
        if self.plan.poison_every and zlib.crc32(identity.encode()) % self.plan.poison_every == 0:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        roll = zlib.crc32(f"{identity}:{message.reconsume_times}".encode()) / 2**32
        if roll < self.plan.failure_rate:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


def run_retries(
    brokers: Sequence[Broker], seed: int, offset_dir: Path, clock: SimulatedClock, max_rounds: int = 200
) -> Counter[str]:
    """Let the groups of :data:`RETRY_GROUPS` consume with failing listeners until no delayed
    message waits, or for ``max_rounds`` rounds: consume everything (``poll_once`` until nothing
    comes), jump ``clock`` to the next delivery time (plus :data:`RETRY_WINDOW_MS`), deliver what is
    due, repeat. What is still scheduled after the last round stays in the schedule topic, in flight
    as in a live lake (from 100,000 messages on, retries of the longest delay levels). Group
    settings go to every broker first. Returns each group's consumer figures
    (``<group>.<figure>``) and its dead letters (``<group>.dlq``).
    """
    for plan in RETRY_GROUPS:
        if plan.retry_max_times is not None or plan.retry_queue_nums != 1:
            limit = c.RETRY_MAX_TIMES if plan.retry_max_times is None else plan.retry_max_times
            config = SubscriptionGroupConfig(plan.group, retry_max_times=limit, retry_queue_nums=plan.retry_queue_nums)
            for broker in brokers:
                broker.update_subscription_group(config)
    consumers = [
        PushConsumer(
            brokers,
            plan.group,
            FlakyListener(plan, seed),
            {plan.topic: "*"},
            message_model=plan.message_model,  # type: ignore[arg-type]
            client_id=f"127.0.0.30@{plan.group}",
            offset_dir=offset_dir,
            consume_from_where="CONSUME_FROM_FIRST_OFFSET",
        )
        for plan in RETRY_GROUPS
    ]
    services = [ScheduleMessageService(broker) for broker in brokers]
    with ThreadPoolExecutor(len(services), thread_name_prefix="schedule") as pool:  # brokers' commits overlap
        for _ in range(max_rounds):
            while sum(consumer.poll_once() for consumer in consumers):
                pass
            times = pool.map(ScheduleMessageService.next_delivery_time, services)
            due = [moment for moment in times if moment is not None]
            if not due:
                break
            clock.advance_to(min(due) + RETRY_WINDOW_MS)
            for _ in pool.map(ScheduleMessageService.deliver_due, services, [clock()] * len(services)):
                pass
    figures: Counter[str] = Counter()
    for consumer in consumers:
        consumer.shutdown()
        figures.update({f"{consumer.group}.{name}": value for name, value in consumer.stats.items()})
        dead = sum(broker.store.max_offset(c.DLQ_GROUP_TOPIC_PREFIX + consumer.group, 0) for broker in brokers)
        if dead:
            figures[f"{consumer.group}.dlq"] = dead
    return figures


TX_OUTCOMES = ("commit", "rollback", "check_commit", "check_rollback", "unknown_forever", "raises")
TX_WEIGHTS = (0.45, 0.2, 0.12, 0.08, 0.1, 0.05)
TX_GROUP = "tx-payments"
TX_TOPIC = "Payments"


class WorkloadTransactionListener:
    """Local transactions of the workload: the outcome of each is planned, keyed by ``bizId``."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        outcome = self.outcomes[message.properties["bizId"]]
        if outcome == "raises":
            raise RuntimeError("the local transaction's database is down")
        return {"commit": LocalTransactionState.COMMIT_MESSAGE, "rollback": LocalTransactionState.ROLLBACK_MESSAGE}.get(
            outcome, LocalTransactionState.UNKNOW
        )

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        outcome = self.outcomes.get(message.properties.get("bizId", ""), "unknown_forever")
        if outcome in ("check_rollback",):
            return LocalTransactionState.ROLLBACK_MESSAGE
        if outcome in ("check_commit", "raises"):
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.UNKNOW


def run_transactions(brokers: Sequence[Broker], count: int, seed: int, rounds: int = 18) -> tuple[Counter[str], int]:
    """Send ``count`` transactions with planned outcomes, then run ``rounds`` check rounds on
    every broker at random times (30-90 s apart, from now on). Returns outcomes sent and the time
    of the last check round (epoch ms)."""
    rng = random.Random(seed + 2)
    listener = WorkloadTransactionListener()
    producer = TransactionProducer(brokers, TX_GROUP, listener, client_port=41000, seed=seed)
    sent: Counter[str] = Counter()
    for index in range(count):
        outcome = rng.choices(TX_OUTCOMES, weights=TX_WEIGHTS)[0]
        biz_id = f"tx-{seed}-{index}"
        listener.outcomes[biz_id] = outcome
        message = Message.create(
            TX_TOPIC,
            f'{{"payment": "{biz_id}"}}'.encode(),
            tags="captured",
            keys=[biz_id],
            user_properties={"bizId": biz_id},
        )
        producer.send_message_in_transaction(message)
        sent[outcome] += 1
    services = [TransactionCheckService(broker) for broker in brokers]
    now = max(broker.config.clock() for broker in brokers)
    for _ in range(rounds):
        now += rng.randint(30_000, 90_000)
        for service in services:
            service.check(now)
    return sent, now


def _execute(producer: Producer, send: PlannedSend) -> str:
    if send.kind == "batch":
        return producer.send_batch(send.messages).message_queue.broker_name
    if send.kind == "ordered":
        return producer.send(send.messages[0], select_by_hash, send.order_id).message_queue.broker_name
    return producer.send(send.messages[0]).message_queue.broker_name


def _merge(total: WorkloadReport, part: WorkloadReport) -> None:
    total.sends += part.sends
    total.messages += part.messages
    total.by_kind.update(part.by_kind)
    total.by_topic.update(part.by_topic)
    total.by_broker.update(part.by_broker)
