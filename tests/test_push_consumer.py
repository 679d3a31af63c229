"""The concurrent push consumer on real brokers: retries with delays, dead letters, offsets."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest

from broker_model.broker import Broker, BrokerConfig, ScheduleMessageService, SubscriptionGroupConfig
from broker_model.client import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    LocalFileOffsetStore,
    Producer,
    PushConsumer,
    ReadOffsetType,
)
from broker_model.common import Message, MessageQueue
from broker_model.common import constants as c
from broker_model.store import MessageExt
from broker_model.tools import RETRY_GROUPS, run_workload
from schemas.errors import ValidationError
from tests.helpers import ManualClock, wait_until
from tests.log_invariants import check_log, read_log

T0 = 1_800_000_000_000
GROUP = "cg-push"
SUCCESS, LATER = ConsumeConcurrentlyStatus.CONSUME_SUCCESS, ConsumeConcurrentlyStatus.RECONSUME_LATER
Q0 = MessageQueue("broker-a", "T", 0)


def _send(broker: Broker, count: int = 1, queue_id: int = 0) -> list[str]:
    producer = Producer([broker], "pg", seed=3, clock=broker.config.clock)
    queue = producer.queues("T")[queue_id]
    return [producer.send_to_queue(Message.create("T", f"m{i}".encode()), queue).msg_id for i in range(count)]


class Recorder:
    """A listener that fails the first ``failures`` deliveries of each message (all when None)."""

    def __init__(self, clock: ManualClock, failures: int | None = None) -> None:
        self.clock = clock
        self.failures = failures
        self.deliveries: list[tuple[str | None, str, int, int]] = []  # (uniq_key, topic, reconsume, time)

    def __call__(self, messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        message = messages[0]
        self.deliveries.append((message.uniq_key, message.topic, message.reconsume_times, self.clock.now))
        if self.failures is None or message.reconsume_times < self.failures:
            return LATER
        return SUCCESS


def _consumer(broker: Broker, listener: object, **kwargs: object) -> PushConsumer:
    options: dict[str, object] = {"consume_from_where": "CONSUME_FROM_FIRST_OFFSET", **kwargs}
    return PushConsumer([broker], GROUP, listener, {"T": "*"}, **options)  # type: ignore[arg-type]


def _drive_retries(broker: Broker, clock: ManualClock, consumer: PushConsumer, rounds: int) -> None:
    """Consume, then move the clock to each retry's due time and deliver it, ``rounds`` times."""
    schedule = ScheduleMessageService(broker)
    consumer.poll_once()
    for _ in range(rounds):
        level = min(c.FIRST_RETRY_DELAY_LEVEL + _newest_retry_reconsume(broker), c.MAX_DELAY_LEVEL)
        clock.now += c.DELAY_LEVEL_MILLIS[level - 1] - 1
        assert schedule.deliver_due(clock.now).total == 0  # not a millisecond early
        clock.now += 1
        assert schedule.deliver_due(clock.now).total == 1
        assert consumer.poll_once() == 1


def _newest_retry_reconsume(broker: Broker) -> int:
    """Reconsume count of the newest retry waiting in the schedule topic."""
    newest = max(
        (
            m
            for q in range(c.MAX_DELAY_LEVEL)
            for m in [broker.store.message_at(c.SCHEDULE_TOPIC, q, broker.store.max_offset(c.SCHEDULE_TOPIC, q) - 1)]
            if m is not None
        ),
        key=lambda m: m.commit_log_offset,
    )
    return newest.reconsume_times - 1


def test_a_listener_failing_n_times_is_delivered_n_plus_1_times_with_the_level_delays(
    broker: Broker, clock: ManualClock
) -> None:
    [uniq_key] = _send(broker)
    listener = Recorder(clock, failures=3)
    consumer = _consumer(broker, listener)
    _drive_retries(broker, clock, consumer, rounds=3)
    assert [(d[0], d[1], d[2]) for d in listener.deliveries] == [(uniq_key, "T", n) for n in range(4)]
    times = [d[3] for d in listener.deliveries]
    assert [b - a for a, b in itertools.pairwise(times)] == list(c.DELAY_LEVEL_MILLIS[2:5])  # 10s 30s 1m
    assert consumer.poll_once() == 0  # consumed: nothing comes back
    assert consumer.stats["sent_back"] == 3 and consumer.stats["succeeded"] == 1
    consumer.shutdown()
    assert broker.query_offset(GROUP, "T", 0) == 1
    assert broker.query_offset(GROUP, f"%RETRY%{GROUP}", 0) == 3
    assert broker.queue_nums(f"%DLQ%{GROUP}") is None


@pytest.mark.parametrize(("retry_max_times", "retries"), [(None, 16), (2, 2)])
def test_a_listener_that_always_fails_ends_in_the_dlq_after_max_reconsume_times(
    broker: Broker, clock: ManualClock, retry_max_times: int | None, retries: int
) -> None:
    if retry_max_times is not None:
        broker.update_subscription_group(SubscriptionGroupConfig(GROUP, retry_max_times=retry_max_times))
    [uniq_key] = _send(broker)
    listener = Recorder(clock)
    consumer = _consumer(broker, listener)
    _drive_retries(broker, clock, consumer, rounds=retries)
    assert [d[2] for d in listener.deliveries] == list(range(retries + 1))
    dlq = f"%DLQ%{GROUP}"
    assert broker.store.max_offset(dlq, 0) == 1
    letter = broker.store.message_at(dlq, 0, 0)
    assert letter is not None
    assert (letter.uniq_key, letter.reconsume_times, letter.properties[c.PROPERTY_RETRY_TOPIC]) == (
        uniq_key,
        retries + 1,
        "T",
    )
    assert ScheduleMessageService(broker).deliver_due(clock.now + 10 * 3_600_000).total == 0  # nothing else waits
    consumer.shutdown()


def test_a_client_max_reconsume_times_overrides_the_group(broker: Broker, clock: ManualClock) -> None:
    _send(broker)
    listener = Recorder(clock)
    consumer = _consumer(broker, listener, max_reconsume_times=1)
    _drive_retries(broker, clock, consumer, rounds=1)
    assert [d[2] for d in listener.deliveries] == [0, 1]
    assert broker.store.max_offset(f"%DLQ%{GROUP}", 0) == 1


def test_ack_index_and_delay_level_decide_what_goes_back_and_where(broker: Broker, clock: ManualClock) -> None:
    keys = _send(broker, 4)

    def listener(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        context.ack_index = 1  # messages 2 and 3 failed
        context.delay_level_when_next_consume = 1 if messages[0].reconsume_times == 0 else -1
        return SUCCESS

    consumer = _consumer(broker, listener, consume_message_batch_max_size=4)
    assert consumer.poll_once() == 4
    retries = [broker.store.message_at(c.SCHEDULE_TOPIC, 0, q) for q in range(2)]
    assert [m.uniq_key for m in retries if m is not None] == keys[2:]
    assert consumer.stats["sent_back"] == 2
    consumer.shutdown()
    assert broker.query_offset(GROUP, "T", 0) == 4  # sent back counts as consumed


def test_a_listener_exception_counts_as_reconsume_later(broker: Broker, clock: ManualClock) -> None:
    _send(broker)

    def listener(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        raise RuntimeError("database down")

    consumer = _consumer(broker, listener)
    consumer.poll_once()
    assert (consumer.stats["failed"], consumer.stats["sent_back"]) == (1, 1)
    assert broker.store.max_offset(c.SCHEDULE_TOPIC, 2) == 1  # level 3


def test_pulls_take_32_and_the_listener_gets_batches_of_the_batch_size(broker: Broker, clock: ManualClock) -> None:
    _send(broker, 40)
    sizes: list[int] = []

    def listener(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        sizes.append(len(messages))
        return SUCCESS

    consumer = _consumer(broker, listener, consume_message_batch_max_size=5)
    assert consumer.poll_once() == 32
    assert sizes == [5, 5, 5, 5, 5, 5, 2]
    assert consumer.poll_once() == 8
    assert sizes[7:] == [5, 3]


def test_the_committed_offset_never_passes_a_message_still_in_flight(broker: Broker, clock: ManualClock) -> None:
    _send(broker, 10)
    release = threading.Event()
    done: set[int] = set()
    lock = threading.Lock()

    def listener(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        if messages[0].queue_offset == 0:
            assert release.wait(10)
        with lock:
            done.add(messages[0].queue_offset)
        return SUCCESS

    consumer = _consumer(
        broker, listener, consume_thread_min=4, consume_thread_max=4, persist_consumer_offset_interval_ms=50
    )
    consumer.start()
    try:
        wait_until(lambda: len(done) >= 9, "the nine messages after offset 0 consumed")
        assert done == set(range(1, 10))
        # a persist round while offset 0 is still in flight commits 0, not the offsets done after it
        wait_until(lambda: broker.query_offset(GROUP, "T", 0) == 0, "a persist of the offset in flight")
        assert consumer.offset_store.read_offset(Q0, ReadOffsetType.READ_FROM_MEMORY) == 0
        release.set()
        wait_until(lambda: consumer.offset_store.read_offset(Q0, ReadOffsetType.READ_FROM_MEMORY) == 10, "offset 10")
    finally:
        release.set()
        consumer.shutdown()
    assert broker.query_offset(GROUP, "T", 0) == 10


def test_broadcasting_drops_failures_and_keeps_offsets_in_local_files(
    broker: Broker, clock: ManualClock, tmp_path: Path
) -> None:
    keys = _send(broker, 3)
    listeners = [Recorder(clock), Recorder(clock)]
    consumers = [
        _consumer(
            broker, listener, message_model="BROADCASTING", client_id=f"10.0.0.{i}@bc", offset_dir=tmp_path / "clients"
        )
        for i, listener in enumerate(listeners)
    ]
    for consumer in consumers:
        consumer.poll_once()
        consumer.shutdown()
    for listener, consumer in zip(listeners, consumers, strict=True):
        assert [d[0] for d in listener.deliveries] == keys  # every client gets every message once
        assert (consumer.stats["dropped"], consumer.stats["sent_back"]) == (3, 0)
        stored = LocalFileOffsetStore(tmp_path / "clients", consumer.client_id, GROUP)
        assert stored.read_offset(Q0, ReadOffsetType.READ_FROM_STORE) == 3
    assert broker.queue_nums(f"%RETRY%{GROUP}") is None
    assert broker.store.max_offset(c.SCHEDULE_TOPIC, 2) == 0
    assert broker.query_offset(GROUP, "T", 0) == -1  # nothing on the broker


def test_an_allocation_splits_the_queues_between_clients(broker: Broker, clock: ManualClock) -> None:
    _send(broker, 2, queue_id=0)
    _send(broker, 3, queue_id=1)
    seen: dict[int, list[int]] = {0: [], 1: []}

    def recorder(index: int) -> object:
        def listener(messages: list[MessageExt], context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
            seen[index].extend(m.queue_id for m in messages)
            return SUCCESS

        return listener

    clients = [
        _consumer(
            broker,
            recorder(i),
            client_id=f"c{i}",
            allocate=lambda topic, queues, i=i: [q for q in queues if q.queue_id % 2 == i],
        )
        for i in range(2)
    ]
    for client in clients:
        client.poll_once()
    assert (seen[0], seen[1]) == ([0, 0], [1, 1, 1])
    assert clients[0].assigned_queues() == [Q0]


def test_a_retry_waiting_in_the_schedule_topic_survives_a_broker_restart(tmp_path: Path, clock: ManualClock) -> None:
    broker = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", clock=clock)).start()
    broker.ensure_topic("T", 1)
    [uniq_key] = _send(broker)
    listener = Recorder(clock, failures=1)
    consumer = _consumer(broker, listener)
    consumer.poll_once()
    consumer.shutdown()
    broker.shutdown()
    clock.now += 10_000
    restarted = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", clock=clock)).start()
    try:
        assert ScheduleMessageService(restarted).deliver_due(clock.now).total == 1
        again = _consumer(restarted, listener)
        assert again.poll_once() == 1  # only the retry: the original's offset was committed
        again.shutdown()
        assert [(d[0], d[2]) for d in listener.deliveries] == [(uniq_key, 0), (uniq_key, 1)]
    finally:
        restarted.shutdown()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"pull_batch_size": 0}, "pull_batch_size"),
        ({"consume_message_batch_max_size": 1025}, "consume_message_batch_max_size"),
        ({"consume_thread_min": 4, "consume_thread_max": 2}, "consume_thread_max"),
        ({"max_reconsume_times": -2}, "max_reconsume_times"),
        ({"message_model": "FANOUT"}, "message_model"),
        ({"message_model": "BROADCASTING"}, "offset_dir"),
        ({"consume_from_where": "CONSUME_FROM_TIMESTAMP"}, "consume_timestamp"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(broker: Broker, options: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _consumer(broker, Recorder(ManualClock()), **options)
    assert caught.value.field == field


def test_a_bad_group_or_tag_expression_is_refused(broker: Broker) -> None:
    with pytest.raises(ValidationError, match="group"):
        PushConsumer([broker], "bad group", Recorder(ManualClock()), {"T": "*"})
    with pytest.raises(ValidationError, match="tag_expression"):
        PushConsumer([broker], GROUP, Recorder(ManualClock()), {"T": "||"})


def test_the_retry_workload_writes_retries_delays_and_dead_letters(tmp_path: Path) -> None:
    report = run_workload(tmp_path, 400, seed=9, brokers=2, threads=2, consumers=False, retries=True)
    assert (
        report.retries
        == run_workload(tmp_path / "again", 400, seed=9, brokers=2, threads=2, consumers=False, retries=True).retries
    )
    for plan in RETRY_GROUPS:
        if plan.message_model == "CLUSTERING":  # every message ends consumed or dead
            done = report.retries[f"{plan.group}.succeeded"] + report.retries[f"{plan.group}.dlq"]
            assert done == report.by_topic[plan.topic], plan.group
            assert report.retries[f"{plan.group}.dlq"] > 0, plan.group
    assert report.retries["bc-inventory-retry.dropped"] > 0
    # where the run's time went: the phases that ran, in order (no consumer groups, no transactions)
    assert list(report.seconds) == ["sends", "retries", "shutdown"]
    assert all(seconds >= 0 for seconds in report.seconds.values())
    assert "seconds {'sends': " in report.summary()
    rows = [row for name in ("broker-a", "broker-b") for row in read_log(tmp_path, name)]
    for name in ("broker-a", "broker-b"):
        assert check_log(read_log(tmp_path, name), c.DEFAULT_SEGMENT_SIZE) == [], name
    limits = {"%DLQ%cg-audit-retry": 3, "%DLQ%cg-inventory-retry": 16}
    for row in rows:
        if row["topic"] in limits:
            assert row["reconsume_times"] == limits[row["topic"]] + 1
            assert row["properties"][c.PROPERTY_RETRY_TOPIC] in ("Audit", "Inventory")
    retry_rows = [r for r in rows if r["topic"].startswith(c.RETRY_GROUP_TOPIC_PREFIX)]
    assert retry_rows and all(c.PROPERTY_ORIGIN_MESSAGE_ID in r["properties"] for r in retry_rows)
    assert {r["queue_id"] for r in retry_rows if r["topic"] == "%RETRY%cg-inventory-retry"} == {0, 1}
