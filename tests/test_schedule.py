"""Delayed delivery on the real broker: the level table, progress, restarts and crashes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_model.broker import (
    Broker,
    BrokerConfig,
    InnerMessage,
    ScheduleMessageService,
    correct_deliver_timestamp,
    progress_path,
)
from broker_model.client import Producer
from broker_model.common import Message, compute_deliver_timestamp
from broker_model.common import constants as c
from broker_model.store import MessageExt
from schemas.errors import BrokerError
from tests.helpers import ManualClock

REPO = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000_000


def _start(lake: Path, clock: ManualClock, **kwargs: object) -> Broker:
    broker = Broker(BrokerConfig(lake, flush_mode="SYNC_FLUSH", clock=clock, **kwargs)).start()  # type: ignore[arg-type]
    broker.ensure_topic("T", 2)
    return broker


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Iterator[Broker]:
    started = _start(tmp_path, clock)
    yield started
    started.shutdown()


def _send_delayed(broker: Broker, level: int, body: bytes = b"later", tags: str = "TagA") -> str:
    producer = Producer([broker], "pg", seed=7, clock=broker.config.clock)
    result = producer.send_to_queue(Message.create("T", body, tags=tags, delay_level=level), producer.queues("T")[1])
    return result.msg_id


def _real(broker: Broker, queue_id: int = 1) -> list[MessageExt]:
    store = broker.store
    found = (store.message_at("T", queue_id, q, decompress=False) for q in range(store.max_offset("T", queue_id)))
    return [m for m in found if m is not None]


@pytest.mark.parametrize("level", [1, 3, 17, 18])
def test_a_delayed_message_is_delivered_exactly_when_its_level_delay_has_passed(
    broker: Broker, clock: ManualClock, level: int
) -> None:
    uniq_key = _send_delayed(broker, level)
    service = ScheduleMessageService(broker)
    delay = c.DELAY_LEVEL_MILLIS[level - 1]
    clock.now = T0 + delay - 1
    assert service.deliver_due(clock.now).total == 0
    assert _real(broker) == []
    clock.now = T0 + delay
    report = service.deliver_due(clock.now)
    assert (report.delivered[level], report.offsets[level]) == (1, 1)
    [copy] = _real(broker)
    entry = broker.store.message_at(c.SCHEDULE_TOPIC, level - 1, 0, decompress=False)
    assert entry is not None
    assert (copy.uniq_key, copy.body, copy.born_timestamp, copy.reconsume_times) == (
        uniq_key,
        entry.body,
        entry.born_timestamp,
        entry.reconsume_times,
    )
    assert copy.store_timestamp == T0 + delay  # a new store time
    assert c.PROPERTY_DELAY_TIME_LEVEL not in copy.properties
    assert (copy.properties[c.PROPERTY_REAL_TOPIC], copy.properties[c.PROPERTY_REAL_QUEUE_ID]) == ("T", "1")
    assert copy.properties[c.PROPERTY_WAIT_STORE_MSG_OK] == "false"
    # the consume queue entry has the tags' hash again, so a tag subscription finds the copy
    assert [m.uniq_key for m in broker.pull("T", 1, 0, tag_expression="TagA").messages] == [uniq_key]
    assert broker.pull("T", 1, 0, tag_expression="TagB").messages == []


def test_a_level_stops_at_its_first_message_not_due_and_keeps_queue_order(broker: Broker, clock: ManualClock) -> None:
    first = _send_delayed(broker, 2, b"first")
    clock.now = T0 + 3000
    second = _send_delayed(broker, 2, b"second")
    service = ScheduleMessageService(broker)
    assert service.deliver_due(T0 + 5000).delivered[2] == 1
    assert service.offset(2) == 1
    assert service.deliver_due(T0 + 7999).total == 0
    clock.now = T0 + 8000
    assert service.deliver_due(clock.now).delivered[2] == 1
    assert [m.uniq_key for m in _real(broker)] == [first, second]


def test_a_delivery_time_beyond_now_plus_the_level_delay_is_delivered_now(broker: Broker, clock: ManualClock) -> None:
    """correctDeliverTimestamp: the clock went back by an hour after the message was stored."""
    _send_delayed(broker, 3)
    clock.now = T0 - 3_600_000
    assert ScheduleMessageService(broker).deliver_due(clock.now).delivered[3] == 1
    assert len(_real(broker)) == 1


def test_deliver_time_rules_match_rocketmq_values() -> None:
    assert compute_deliver_timestamp(999, 0) == 1000  # a level outside the table waits 1 s
    assert compute_deliver_timestamp(2, 0) == 5000
    assert correct_deliver_timestamp(now=100, deliver_ts=100 + 10_001, level=3) == 100
    assert correct_deliver_timestamp(now=100, deliver_ts=100 + 10_000, level=3) == 10_100


def test_an_entry_for_the_half_topic_is_dropped_and_passed(broker: Broker, clock: ManualClock) -> None:
    broker.put_message(InnerMessage(c.RMQ_SYS_TRANS_HALF_TOPIC, 0, b"bug", {c.PROPERTY_DELAY_TIME_LEVEL: "1"}))
    uniq_key = _send_delayed(broker, 1)
    clock.now = T0 + 1000
    report = ScheduleMessageService(broker).deliver_due(clock.now)
    assert (report.dropped, report.delivered[1], report.offsets[1]) == ([(1, 0)], 1, 2)
    assert broker.store.max_offset(c.RMQ_SYS_TRANS_HALF_TOPIC, 0) == 0
    assert [m.uniq_key for m in _real(broker)] == [uniq_key]


def test_many_due_messages_go_in_several_batches(broker: Broker, clock: ManualClock) -> None:
    keys = [_send_delayed(broker, 1, f"m{i}".encode()) for i in range(7)]
    clock.now = T0 + 1000
    service = ScheduleMessageService(broker, batch_size=3)
    assert service.deliver_due(clock.now).delivered[1] == 7
    assert [m.uniq_key for m in _real(broker)] == keys


def test_progress_survives_a_restart_without_delivering_again_or_skipping(tmp_path: Path, clock: ManualClock) -> None:
    broker = _start(tmp_path, clock)
    early = [_send_delayed(broker, 1, b"a"), _send_delayed(broker, 4, b"b")]
    late = _send_delayed(broker, 5, b"c")  # 60 s
    clock.now = T0 + 30_000
    assert ScheduleMessageService(broker).deliver_due(clock.now).total == 2
    broker.shutdown()
    saved = json.loads(progress_path(tmp_path, "broker-a").read_text())
    assert saved == {"offsetTable": {"1": 1, "4": 1}}  # RocketMQ's delayOffset.json shape
    restarted = _start(tmp_path, clock)
    try:
        service = ScheduleMessageService(restarted)
        assert service.deliver_due(clock.now).total == 0
        clock.now = T0 + 60_000
        assert service.deliver_due(clock.now).delivered[5] == 1
        assert [m.uniq_key for m in _real(restarted)] == [*early, late]
    finally:
        restarted.shutdown()


@pytest.mark.parametrize("copies_stored", [True, False])
@pytest.mark.parametrize("form", ["ranges", "one level", "first range dropped"])
def test_a_round_left_pending_by_a_crash_is_settled_from_the_log(
    tmp_path: Path, clock: ManualClock, copies_stored: bool, form: str
) -> None:
    """The progress file as a crash leaves it: the round's ranges pending, the offsets before them.
    With the copies in the log every range counts as delivered; without them they are delivered
    now. A round spans every level that has due records; files written before that hold one
    level's range (``level``, ``from``, ``to``), read too."""
    broker = _start(tmp_path, clock)
    if form == "first range dropped":  # level 1 holds only an entry to drop: level 2's copy decides
        broker.put_message(InnerMessage(c.RMQ_SYS_TRANS_HALF_TOPIC, 0, b"bug", {c.PROPERTY_DELAY_TIME_LEVEL: "1"}))
        keys = [_send_delayed(broker, 2, b"m0")]
    else:
        keys = [_send_delayed(broker, 1, f"m{i}".encode()) for i in range(3)]
    if form == "ranges":
        keys += [_send_delayed(broker, 2, b"m3")]
    log_offset = broker.next_commit_log_offset
    clock.now = T0 + 5000
    if copies_stored:
        assert ScheduleMessageService(broker).deliver_due(clock.now).total == len(keys)
    pending: dict[str, object] = {"level": 1, "from": 0, "to": 3, "log_offset": log_offset}
    if form == "ranges":
        pending = {"ranges": [[1, 0, 3], [2, 0, 1]], "log_offset": log_offset}
    elif form == "first range dropped":
        pending = {"ranges": [[1, 0, 1], [2, 0, 1]], "log_offset": log_offset}
    progress_path(tmp_path, "broker-a").parent.mkdir(parents=True, exist_ok=True)
    progress_path(tmp_path, "broker-a").write_text(json.dumps({"offsetTable": {}, "pending": pending}))
    broker.shutdown()
    restarted = _start(tmp_path, clock)
    try:
        service = ScheduleMessageService(restarted)
        level_1_end = 1 if form == "first range dropped" else 3
        assert service.offset(1) == (level_1_end if copies_stored else 0)
        assert service.offset(2) == (1 if copies_stored and form != "one level" else 0)
        service.deliver_due(clock.now)
        assert [m.uniq_key for m in _real(restarted)] == keys  # each exactly once
        expected = {"1": level_1_end, "2": 1} if form != "one level" else {"1": 3}
        assert json.loads(progress_path(tmp_path, "broker-a").read_text()) == {"offsetTable": expected}
    finally:
        restarted.shutdown()


def test_a_put_that_fails_leaves_the_round_to_deliver_again_and_nothing_pending(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The round's put raises before anything is stored: every level's progress stays at its
    start, the progress file holds no pending round, and the next pass delivers the round."""

    class FailingOnce(ScheduleMessageService):
        failed = False

        def _store(self, copies: list[InnerMessage]) -> None:
            if not self.failed:
                self.failed = True
                raise BrokerError("the disk is full")
            super()._store(copies)

    broker = _start(tmp_path, clock)
    try:
        keys = [_send_delayed(broker, 1, b"a"), _send_delayed(broker, 2, b"b")]
        clock.now = T0 + 5000
        service = FailingOnce(broker)
        with pytest.raises(BrokerError, match="the disk is full"):
            service.deliver_due(clock.now)
        assert (service.offset(1), service.offset(2)) == (0, 0) and _real(broker) == []
        assert json.loads(progress_path(tmp_path, "broker-a").read_text()) == {"offsetTable": {"1": 0, "2": 0}}
        assert service.deliver_due(clock.now).total == 2
        assert sorted(m.uniq_key for m in _real(broker)) == sorted(keys)
    finally:
        broker.shutdown()


CRASH_SCRIPT = """
import os, signal, sys
from pathlib import Path
from broker_model.broker import Broker
from broker_model.broker import BrokerConfig
from broker_model.common import Message
from broker_model.client import Producer
from broker_model.broker import ScheduleMessageService

class Crashing(ScheduleMessageService):
    def _store(self, copies):
        if sys.argv[2] == "after":
            super()._store(copies)
        os.kill(os.getpid(), signal.SIGKILL)

clock = lambda: 1_800_000_000_000
broker = Broker(BrokerConfig(Path(sys.argv[1]), flush_mode="SYNC_FLUSH", clock=clock)).start()
broker.ensure_topic("T", 2)
producer = Producer([broker], "pg", seed=7, clock=clock)
for i in range(3):  # levels 1, 2, 1: one round delivers both levels in one put
    producer.send_to_queue(Message.create("T", b"m%d" % i, delay_level=1 + i % 2), producer.queues("T")[1])
print("sent", flush=True)
Crashing(broker).deliver_due(1_800_000_005_000)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("crash", ["before", "after"])
def test_a_broker_killed_around_storing_the_copies_neither_delivers_twice_nor_skips(
    tmp_path: Path, clock: ManualClock, crash: str
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(tmp_path), crash], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -9, done.stderr
    assert "sent" in done.stdout
    clock.now = T0 + 5000
    broker = _start(tmp_path, clock)
    try:
        assert len(_real(broker)) == (3 if crash == "after" else 0)
        service = ScheduleMessageService(broker)
        assert (service.offset(1), service.offset(2)) == ((2, 1) if crash == "after" else (0, 0))
        service.deliver_due(clock.now)
        assert sorted(m.body for m in _real(broker)) == [b"m0", b"m1", b"m2"]
    finally:
        broker.shutdown()


def test_the_broker_thread_delivers_on_the_broker_clock(tmp_path: Path, clock: ManualClock) -> None:
    broker = _start(tmp_path, clock)
    service = ScheduleMessageService(broker).start()
    try:
        assert broker.services == (service,)
        uniq_key = _send_delayed(broker, 2)
        clock.now = T0 + 5000
        deadline = time.monotonic() + 10
        while not _real(broker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [m.uniq_key for m in _real(broker)] == [uniq_key]
    finally:
        broker.shutdown()
    assert broker.services == ()


def test_a_retry_is_delivered_to_the_group_retry_topic(broker: Broker, clock: ManualClock) -> None:
    producer = Producer([broker], "pg", seed=7, clock=clock)
    producer.send_to_queue(Message.create("T", b"x"), producer.queues("T")[0])
    original = broker.pull("T", 0, 0).messages[0]
    broker.consumer_send_back("cg", original.commit_log_offset)
    service = ScheduleMessageService(broker)
    clock.now = T0 + 9_999
    assert service.deliver_due(clock.now).total == 0
    clock.now = T0 + 10_000  # level 3
    assert service.deliver_due(clock.now).delivered[3] == 1
    [retry] = broker.pull("%RETRY%cg", 0, 0).messages
    assert (retry.reconsume_times, retry.properties[c.PROPERTY_RETRY_TOPIC]) == (1, "T")
    assert retry.properties[c.PROPERTY_REAL_TOPIC] == "%RETRY%cg"


def test_next_delivery_time_is_the_earliest_waiting_entry(broker: Broker, clock: ManualClock) -> None:
    service = ScheduleMessageService(broker)
    assert service.next_delivery_time() is None
    _send_delayed(broker, 4)  # 30 s
    _send_delayed(broker, 2)  # 5 s
    assert service.next_delivery_time() == T0 + 5000
    service.deliver_due(T0 + 5000)
    assert service.next_delivery_time() == T0 + 30_000


def test_an_unreadable_progress_file_is_refused_and_the_service_does_not_start(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = progress_path(tmp_path, "broker-a")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    broker = _start(tmp_path, clock)
    try:
        with pytest.raises(BrokerError, match=r"delayOffset\.json"):
            ScheduleMessageService(broker).start()
        assert broker.services == ()
        path.unlink()
        assert ScheduleMessageService(broker).start() in broker.services
    finally:
        broker.shutdown()
    assert broker.services == ()
