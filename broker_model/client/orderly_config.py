"""The orderly push consumer's settings, its listener's statuses and context (RocketMQ's
``MessageListenerOrderly``), with RocketMQ's defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from broker_model.client.consume_core import (
    ConsumeFromWhere,
    MessageModel,
    check_consume_from_where,
    check_message_model,
)
from broker_model.common import MessageQueue
from broker_model.common import constants as c
from broker_model.store import MessageExt
from schemas.errors import ValidationError

CONSUME_TIMESTAMP_DEFAULT_AGO_MS = 30 * 60 * 1000  # consumeTimestamp defaults to half an hour ago


class ConsumeOrderlyStatus(Enum):
    """What an orderly listener returns (``ConsumeOrderlyStatus``)."""

    SUCCESS = "SUCCESS"
    ROLLBACK = "ROLLBACK"
    COMMIT = "COMMIT"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclass
class ConsumeOrderlyContext:
    """Per-call context the listener may change: ``auto_commit`` (default True) and the suspend
    time of this call (-1: the consumer's ``suspend_current_queue_time_millis``)."""

    message_queue: MessageQueue
    auto_commit: bool = True
    suspend_current_queue_time_millis: int = -1


MessageListenerOrderly = Callable[[list[MessageExt], ConsumeOrderlyContext], ConsumeOrderlyStatus | None]


@dataclass(frozen=True)
class OrderlyConsumerConfig:
    """Settings of an orderly push consumer; defaults are RocketMQ's (section 11 and 12.1 of the
    facts). ``client_id`` defaults to one unique to the consumer object; ``offset_dir`` is needed in
    BROADCASTING mode; ``consume_timestamp`` (epoch ms) is for CONSUME_FROM_TIMESTAMP and defaults
    to half an hour before the queue is first taken."""

    message_model: MessageModel = "CLUSTERING"
    client_id: str | None = None
    offset_dir: str | Path | None = None
    consume_from_where: ConsumeFromWhere = "CONSUME_FROM_LAST_OFFSET"
    consume_timestamp: int | None = None
    consume_message_batch_max_size: int = c.CONSUME_MESSAGE_BATCH_MAX_SIZE
    pull_batch_size: int = c.PULL_BATCH_SIZE
    pull_threshold_for_queue: int = c.PULL_THRESHOLD_FOR_QUEUE
    pull_threshold_size_for_queue_mib: int = c.PULL_THRESHOLD_SIZE_FOR_QUEUE_MIB
    suspend_current_queue_time_millis: int = c.SUSPEND_CURRENT_QUEUE_TIME_MS
    max_reconsume_times: int = -1
    consume_thread_max: int = 20  # consumeThreadMax
    lock_interval_ms: int = c.REBALANCE_LOCK_INTERVAL_MS
    client_lock_max_live_time_ms: int = c.CLIENT_LOCK_MAX_LIVE_TIME_MS
    unlock_delay_ms: int = c.UNLOCK_DELAY_TIME_MS
    rebalance_interval_ms: int = c.REBALANCE_INTERVAL_MS
    heartbeat_interval_ms: int = c.HEARTBEAT_BROKER_INTERVAL_MS
    persist_offset_interval_ms: int = c.PERSIST_CONSUMER_OFFSET_INTERVAL_MS
    max_time_consume_continuously_ms: int = c.MAX_TIME_CONSUME_CONTINUOUSLY_MS
    pull_idle_delay_ms: int = 100

    def validate(self) -> None:
        """Check every field before anything starts.

        Raises:
            ValidationError: the first bad field, with its value.
        """
        check_message_model(self.message_model)
        if self.message_model == "BROADCASTING" and self.offset_dir is None:
            raise ValidationError("offset_dir", None, "a broadcasting consumer keeps offsets in local files")
        check_consume_from_where(self.consume_from_where)
        ranges = {
            "consume_message_batch_max_size": (1, 1024),
            "pull_batch_size": (1, 1024),
            "pull_threshold_for_queue": (1, 65535),
            "pull_threshold_size_for_queue_mib": (1, 1024),
            "consume_thread_max": (1, 1000),
        }
        for name, (low, high) in ranges.items():
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValidationError(name, value, f"must be in [{low}, {high}]")
        if self.max_reconsume_times < -1:
            raise ValidationError("max_reconsume_times", self.max_reconsume_times, "must be -1 (unlimited) or >= 0")
        positive = (
            "lock_interval_ms",
            "client_lock_max_live_time_ms",
            "rebalance_interval_ms",
            "heartbeat_interval_ms",
            "persist_offset_interval_ms",
            "max_time_consume_continuously_ms",
            "pull_idle_delay_ms",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValidationError(name, getattr(self, name), "must be positive")
        if self.unlock_delay_ms < 0:
            raise ValidationError("unlock_delay_ms", self.unlock_delay_ms, "must not be negative")
