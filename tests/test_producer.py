"""The producer client against real brokers on a real lake."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_model.broker import Broker, BrokerConfig
from broker_model.client import LatencyFaultTolerance, MessageQueue, Producer, not_available_duration, select_by_hash
from broker_model.common import Message, java_string_hash
from broker_model.common import constants as c
from schemas.errors import BrokerError, ValidationError
from tests.log_invariants import read_log


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[list[Broker]]:
    started = [
        Broker(BrokerConfig(tmp_path, name, store_host=f"127.0.0.{i + 1}:10911", flush_mode="SYNC_FLUSH")).start()
        for i, name in enumerate(("broker-a", "broker-b"))
    ]
    for broker in started:
        broker.ensure_topic("Orders", 4)
    yield started
    for broker in started:
        broker.shutdown()


def test_round_robin_spreads_sends_evenly_over_every_queue_of_every_broker(brokers: list[Broker]) -> None:
    producer = Producer(brokers, seed=5)
    used = Counter(producer.send(Message.create("Orders", b"x")).message_queue for _ in range(80))
    assert set(used) == {MessageQueue(b, "Orders", q) for b in ("broker-a", "broker-b") for q in range(4)}
    assert set(used.values()) == {10}


def test_unknown_topic_is_created_on_every_broker_with_four_queues(brokers: list[Broker]) -> None:
    Producer(brokers, seed=1).send(Message.create("NewTopic", b"x"))
    assert [b.queue_nums("NewTopic") for b in brokers] == [c.DEFAULT_TOPIC_QUEUE_NUMS] * 2


def test_send_retries_on_another_broker_after_a_failure_and_keeps_the_uniq_key(brokers: list[Broker]) -> None:
    producer = Producer(brokers, seed=2)
    brokers[1].shutdown()
    results = [producer.send(Message.create("Orders", b"x")) for _ in range(6)]
    assert {r.message_queue.broker_name for r in results} == {"broker-a"}
    stored = {r["uniq_key"] for r in read_log(brokers[0].config.lake, "broker-a")}
    assert {r.msg_id for r in results} == stored


def test_send_fails_clearly_when_every_try_fails(brokers: list[Broker]) -> None:
    producer = Producer(brokers, seed=2)
    for broker in brokers:
        broker.shutdown()
    with pytest.raises(BrokerError, match="failed after 3 tries"):
        producer.send(Message.create("Orders", b"x"))


@pytest.mark.parametrize(
    ("key", "queue"),
    [("123", 0), ("234", 3), ("polygenelubricants", 8), ("GydZG_", 8), ("DESIGNING WORKHOUSES", 8)],
)
def test_select_by_hash_matches_rocketmq_for_ten_queues(key: str, queue: int) -> None:
    queues = [MessageQueue("b", "T", q) for q in range(10)]
    assert select_by_hash(queues, Message.create("T", b"x"), key).queue_id == queue


def test_integer_min_value_hashes_are_what_the_vectors_claim() -> None:
    assert {java_string_hash(k) for k in ("polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES")} == {-(2**31)}


def test_selector_keeps_one_order_id_on_one_queue_in_send_order(brokers: list[Broker]) -> None:
    producer = Producer(brokers, seed=3)
    steps = [Message.create("Orders", f"step {i}".encode()) for i in range(5)]
    results = [producer.send(step, select_by_hash, "order-42") for step in steps]
    assert len({r.message_queue for r in results}) == 1
    assert [r.queue_offset for r in results] == list(range(5))


def test_batch_is_stored_as_consecutive_records_of_one_queue(brokers: list[Broker]) -> None:
    producer = Producer(brokers, seed=4)
    result = producer.send_batch([Message.create("Orders", bytes([65 + i]) * 5000) for i in range(4)])
    rows = [r for r in read_log(brokers[0].config.lake, result.message_queue.broker_name) if r["topic"] == "Orders"]
    assert [r["queue_offset"] for r in rows] == [0, 1, 2, 3]
    assert all(r["sys_flag"] & c.COMPRESSED_FLAG == 0 for r in rows), "batches are never compressed"
    assert result.msg_id.split(",") == [r["uniq_key"] for r in rows]
    assert result.offset_msg_id.split(",") == [r["msg_id"] for r in rows]


def test_batch_rules_are_enforced_before_anything_is_sent(brokers: list[Broker]) -> None:
    producer = Producer(brokers, seed=4)
    with pytest.raises(ValidationError, match="differs from the batch's topic"):
        producer.send_batch([Message.create("Orders", b"a"), Message.create("Other", b"b")])
    assert all(b.next_commit_log_offset == 0 for b in brokers)


def test_delayed_send_reports_the_chosen_queue_and_is_stored_on_the_schedule_topic(brokers: list[Broker]) -> None:
    result = Producer(brokers, seed=6).send(Message.create("Orders", b"later", delay_level=18))
    row = read_log(brokers[0].config.lake, result.message_queue.broker_name)[0]
    assert result.message_queue.topic == "Orders"
    assert (row["topic"], row["queue_id"]) == (c.SCHEDULE_TOPIC, 17)
    assert row["properties"][c.PROPERTY_REAL_QUEUE_ID] == str(result.message_queue.queue_id)


def test_body_of_exactly_4096_bytes_is_compressed_and_4095_is_not(brokers: list[Broker]) -> None:
    producer = Producer(brokers, seed=7)
    flags = []
    for size in (4095, 4096):
        result = producer.send(Message.create("Orders", b"z" * size))
        rows = read_log(brokers[0].config.lake, result.message_queue.broker_name)
        flags.append(next(r["sys_flag"] for r in rows if r["uniq_key"] == result.msg_id))
    assert flags == [0, c.COMPRESSED_FLAG | c.COMPRESSION_ZLIB_TYPE]


@pytest.mark.parametrize(
    ("latency", "duration"),
    [
        (0, 0),
        (49, 0),
        (50, 0),
        (100, 0),
        (549, 0),
        (550, 2000),
        (1800, 5000),
        (3000, 6000),
        (5000, 10000),
        (15000, 30000),
        (99999, 30000),
    ],
)
def test_not_available_duration_follows_the_latency_table(latency: int, duration: int) -> None:
    assert not_available_duration(latency) == duration


def test_latency_fault_strategy_avoids_a_failed_broker_until_its_time_is_up(brokers: list[Broker]) -> None:
    now = [1_000_000]
    producer = Producer(brokers, seed=8, send_latency_fault_enable=True, clock=lambda: now[0])
    assert producer.fault is not None
    producer.fault.update("broker-b", 0, isolation=True)  # as after a failed send: 30 s away
    picks = {producer.send(Message.create("Orders", b"x")).message_queue.broker_name for _ in range(10)}
    assert picks == {"broker-a"}
    now[0] += 30_001
    picks = {producer.send(Message.create("Orders", b"x")).message_queue.broker_name for _ in range(10)}
    assert picks == {"broker-a", "broker-b"}


def test_fault_tolerance_picks_the_broker_available_soonest_when_all_are_avoided() -> None:
    now = [0]
    fault = LatencyFaultTolerance(lambda: now[0])
    fault.update("a", 5000, isolation=False)  # 10 s
    fault.update("b", 600, isolation=False)  # 2 s
    assert not fault.is_available("a") and not fault.is_available("b")
    assert fault.least_bad(["a", "b"]) == "b"


def test_latency_fault_strategy_is_off_by_default(brokers: list[Broker]) -> None:
    assert Producer(brokers).fault is None
