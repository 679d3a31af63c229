"""Send-back of failed messages on the real broker: retries, dead letters, group settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_model.broker import Broker, BrokerConfig, ScheduleMessageService, SubscriptionGroupConfig
from broker_model.client import Producer
from broker_model.common import Message
from broker_model.common import constants as c
from broker_model.store import MessageExt, read_table
from schemas.catalog import SUBSCRIPTION_GROUP
from schemas.errors import ValidationError
from tests.helpers import ManualClock

GROUP = "cg-a"
RETRY, DLQ = c.RETRY_GROUP_TOPIC_PREFIX + GROUP, c.DLQ_GROUP_TOPIC_PREFIX + GROUP


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Iterator[Broker]:
    started = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", clock=clock)).start()
    started.ensure_topic("T", 1)
    yield started
    started.shutdown()


def _send(broker: Broker, body: bytes = b"order 42", **kwargs: object) -> MessageExt:
    producer = Producer([broker], "pg", seed=1, clock=broker.config.clock)
    producer.send(Message.create("T", body, tags="TagA", keys=["k1"], **kwargs))  # type: ignore[arg-type]
    result = broker.pull("T", 0, broker.store.max_offset("T", 0) - 1)
    return result.messages[0]


def _last(broker: Broker, topic: str, queue_id: int) -> MessageExt:
    message = broker.store.message_at(topic, queue_id, broker.store.max_offset(topic, queue_id) - 1, decompress=False)
    assert message is not None
    return message


def test_first_failure_goes_to_the_retry_topic_through_the_schedule_topic_at_level_3(broker: Broker) -> None:
    original = _send(broker)
    result = broker.consumer_send_back(GROUP, original.commit_log_offset)
    assert (result.topic, result.queue_id) == (c.SCHEDULE_TOPIC, 2)  # level 3 -> queue 2
    stored = _last(broker, c.SCHEDULE_TOPIC, 2)
    assert stored.commit_log_offset == result.commit_log_offsets[0]
    assert stored.reconsume_times == 1
    assert (stored.body, stored.flag, stored.born_timestamp, stored.born_host) == (
        original.body,
        original.flag,
        original.born_timestamp,
        original.born_host,
    )
    props = stored.properties
    assert props[c.PROPERTY_DELAY_TIME_LEVEL] == "3"
    assert (props[c.PROPERTY_REAL_TOPIC], props[c.PROPERTY_REAL_QUEUE_ID]) == (RETRY, "0")
    assert props[c.PROPERTY_RETRY_TOPIC] == "T"
    assert props[c.PROPERTY_ORIGIN_MESSAGE_ID] == original.msg_id  # the offset message id
    assert props[c.PROPERTY_WAIT_STORE_MSG_OK] == "false"
    assert (props[c.PROPERTY_TAGS], props[c.PROPERTY_KEYS], props["UNIQ_KEY"]) == ("TagA", "k1", original.uniq_key)
    assert broker.queue_nums(RETRY) == 1


@pytest.mark.parametrize(("delay_level", "queue_id", "delay"), [(1, 0, "1"), (5, 4, "5"), (30, 17, "30")])
def test_a_client_delay_level_replaces_the_default_and_is_capped_at_18(
    broker: Broker, delay_level: int, queue_id: int, delay: str
) -> None:
    original = _send(broker)
    result = broker.consumer_send_back(GROUP, original.commit_log_offset, delay_level=delay_level)
    assert (result.topic, result.queue_id) == (c.SCHEDULE_TOPIC, queue_id)
    assert _last(broker, c.SCHEDULE_TOPIC, queue_id).properties[c.PROPERTY_DELAY_TIME_LEVEL] == delay


@pytest.mark.parametrize(
    ("reconsume_times", "max_reconsume_times", "delay_level", "dead"),
    [
        (15, 16, 0, False),
        (16, 16, 0, True),  # stored count >= max: dead
        (0, 0, 0, True),
        (0, 16, -1, True),  # a negative delay level: dead at once
        (3, None, 0, False),  # None: the group's retry_max_times (16)
    ],
)
def test_dead_letter_when_reconsume_times_reach_the_max_or_delay_is_negative(
    broker: Broker, reconsume_times: int, max_reconsume_times: int | None, delay_level: int, dead: bool
) -> None:
    original = _send(broker)
    result = broker.consumer_send_back(
        GROUP, original.commit_log_offset, delay_level, max_reconsume_times, reconsume_times=reconsume_times
    )
    if dead:
        assert (result.topic, result.queue_id) == (DLQ, 0)
        letter = _last(broker, DLQ, 0)
        assert letter.reconsume_times == reconsume_times + 1
        assert letter.properties[c.PROPERTY_DELAY_TIME_LEVEL] == "0"  # stored directly, not scheduled
        assert letter.properties[c.PROPERTY_RETRY_TOPIC] == "T"
        assert letter.properties[c.PROPERTY_ORIGIN_MESSAGE_ID] == original.msg_id
        assert broker.queue_nums(DLQ) == 1
    else:
        assert result.topic == c.SCHEDULE_TOPIC
        stored = _last(broker, c.SCHEDULE_TOPIC, result.queue_id)
        assert stored.properties[c.PROPERTY_DELAY_TIME_LEVEL] == str(3 + reconsume_times)
        assert stored.reconsume_times == reconsume_times + 1


def test_the_stored_reconsume_times_decide_when_none_is_given(broker: Broker, clock: ManualClock) -> None:
    """Retry -> delivered -> retry again: counts come from the stored records, and the retry
    topic and origin id of the first copy are kept."""
    original = _send(broker)
    schedule = ScheduleMessageService(broker)
    current = original
    for expected in range(1, 4):
        broker.consumer_send_back(GROUP, current.commit_log_offset, max_reconsume_times=3)
        clock.now += 3_600_000
        schedule.deliver_due(clock.now)
        current = _last(broker, RETRY, 0)
        assert current.reconsume_times == expected
        assert current.properties[c.PROPERTY_RETRY_TOPIC] == "T"
        assert current.properties[c.PROPERTY_ORIGIN_MESSAGE_ID] == original.msg_id
    result = broker.consumer_send_back(GROUP, current.commit_log_offset, max_reconsume_times=3)
    assert result.topic == DLQ
    letter = _last(broker, DLQ, 0)
    assert (letter.reconsume_times, letter.properties[c.PROPERTY_ORIGIN_MESSAGE_ID]) == (4, original.msg_id)


def test_a_lowered_group_retry_max_times_applies_when_the_client_sends_none(broker: Broker) -> None:
    broker.update_subscription_group(SubscriptionGroupConfig(GROUP, retry_max_times=2))
    original = _send(broker)
    assert broker.consumer_send_back(GROUP, original.commit_log_offset, reconsume_times=1).topic == c.SCHEDULE_TOPIC
    assert broker.consumer_send_back(GROUP, original.commit_log_offset, reconsume_times=2).topic == DLQ
    # the client's own max overrides the group's
    assert broker.consumer_send_back(GROUP, original.commit_log_offset, 0, 16, 2).topic == c.SCHEDULE_TOPIC


def test_retry_queue_is_random_among_the_group_retry_queues(broker: Broker) -> None:
    broker.update_subscription_group(SubscriptionGroupConfig(GROUP, retry_queue_nums=4))
    original = _send(broker)
    queues = {
        _last(broker, c.SCHEDULE_TOPIC, 2).properties[c.PROPERTY_REAL_QUEUE_ID]
        for _ in range(40)
        if broker.consumer_send_back(GROUP, original.commit_log_offset)
    }
    assert queues == {"0", "1", "2", "3"}
    assert broker.queue_nums(RETRY) == 4


def test_zero_retry_queues_succeed_without_storing_anything(broker: Broker) -> None:
    broker.update_subscription_group(SubscriptionGroupConfig(GROUP, retry_queue_nums=0))
    original = _send(broker)
    before = broker.next_commit_log_offset
    result = broker.consumer_send_back(GROUP, original.commit_log_offset)
    assert (result.commit_log_offsets, result.queue_offsets, result.msg_ids) == ((), (), ())
    assert broker.next_commit_log_offset == before
    assert broker.queue_nums(RETRY) is None


def test_a_compressed_body_is_copied_as_stored(broker: Broker) -> None:
    original = _send(broker, body=b"z" * 10_000)
    stored_original = _last(broker, "T", 0)
    assert stored_original.sys_flag & c.COMPRESSED_FLAG
    broker.consumer_send_back(GROUP, original.commit_log_offset, delay_level=-1)
    letter = _last(broker, DLQ, 0)
    assert (letter.body, letter.sys_flag, letter.body_crc) == (
        stored_original.body,
        stored_original.sys_flag,
        stored_original.body_crc,
    )


def test_a_message_not_pulled_since_the_start_is_found_by_searching_the_queues(
    tmp_path: Path, clock: ManualClock
) -> None:
    with Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", clock=clock)).start() as broker:
        broker.ensure_topic("T", 1)
        original = _send(broker)
        for _ in range(20):
            _send(broker)
    with Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", clock=clock)).start() as restarted:
        result = restarted.consumer_send_back(GROUP, original.commit_log_offset, delay_level=-1)
        assert result.topic == DLQ
        assert _last(restarted, DLQ, 0).properties["UNIQ_KEY"] == original.uniq_key


@pytest.mark.parametrize(
    ("group", "offset", "field"),
    [
        ("bad group", 0, "group"),
        ("", 0, "group"),
        (GROUP, -1, "commit_log_offset"),
        (GROUP, 3, "commit_log_offset"),  # inside a record
        (GROUP, 10**9, "commit_log_offset"),  # beyond the log
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_written(
    broker: Broker, group: str, offset: int, field: str
) -> None:
    _send(broker)
    before = broker.next_commit_log_offset
    with pytest.raises(ValidationError) as caught:
        broker.consumer_send_back(group, offset)
    assert caught.value.field == field
    assert caught.value.value == (group if field == "group" else offset)
    assert broker.next_commit_log_offset == before
    assert broker.queue_nums(RETRY) is None and broker.queue_nums(DLQ) is None


def test_group_settings_survive_a_restart_and_the_latest_row_wins(tmp_path: Path, clock: ManualClock) -> None:
    with Broker(BrokerConfig(tmp_path, clock=clock)).start() as broker:
        assert broker.subscription_group(GROUP) == SubscriptionGroupConfig(GROUP)  # the defaults
        first = broker.update_subscription_group(SubscriptionGroupConfig(GROUP, retry_max_times=5))
        second = broker.update_subscription_group(SubscriptionGroupConfig(GROUP, retry_max_times=2, retry_queue_nums=3))
        assert second.updated_timestamp == first.updated_timestamp + 1  # same clock reading: still ordered
    with Broker(BrokerConfig(tmp_path, clock=clock)).start() as broker:
        assert broker.subscription_group(GROUP) == second
    with Broker(BrokerConfig(tmp_path, broker_name="broker-b", store_host="127.0.0.2:10911", clock=clock)) as other:
        assert other.subscription_group(GROUP).retry_max_times == 16  # settings are per broker
    rows = read_table(tmp_path, SUBSCRIPTION_GROUP).sort_by("updated_timestamp").to_pylist()
    assert [(r["broker_name"], r["group"], r["retry_max_times"], r["retry_queue_nums"]) for r in rows] == [
        ("broker-a", GROUP, 5, 1),
        ("broker-a", GROUP, 2, 3),
    ]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (SubscriptionGroupConfig("bad group"), "group"),
        (SubscriptionGroupConfig(GROUP, retry_max_times=-1), "retry_max_times"),
        (SubscriptionGroupConfig(GROUP, retry_queue_nums=-1), "retry_queue_nums"),
        (SubscriptionGroupConfig(GROUP, retry_queue_nums=1025), "retry_queue_nums"),
    ],
)
def test_bad_group_settings_are_refused(broker: Broker, config: SubscriptionGroupConfig, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        broker.update_subscription_group(config)
    assert caught.value.field == field
    assert read_table(broker.config.lake, SUBSCRIPTION_GROUP).num_rows == 0
