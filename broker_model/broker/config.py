"""What a broker is configured with and what its put path takes and answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from broker_model.common import constants as c
from broker_model.common import now_ms, validate_name
from schemas.errors import ValidationError


@dataclass(frozen=True)
class BrokerConfig:
    """Settings of one broker. ``segment_size=None`` keeps the size the broker used before
    (1 GiB for a new broker); an explicit size that differs from the stored one is refused.
    ``flush_mode`` defaults to ASYNC_FLUSH as in RocketMQ; SYNC_FLUSH makes every send durable
    before it returns."""

    lake: Path
    broker_name: str = "broker-a"
    store_host: str = "127.0.0.1:10911"
    segment_size: int | None = None
    flush_mode: FlushMode = "ASYNC_FLUSH"  # RocketMQ's default flushDiskType
    cluster_name: str = "DefaultCluster"
    max_message_size: int = c.MAX_MESSAGE_SIZE
    commit_retries: int = 3
    group_commit_step_ms: float = 0.5
    group_commit_linger_ms: float = 5.0
    offset_persist_interval_ms: int = 5000  # persistConsumerOffsetInterval
    checkpoint_interval: int = 100
    fsync: bool = True
    store_cache_bytes: int = 256 * 1024 * 1024  # decoded commit log files the consume side keeps in memory
    clock: Callable[[], int] = field(default=now_ms, compare=False)


@dataclass(slots=True)
class InnerMessage:
    """A message as the broker receives it: the producer already compressed the body and set
    ``sys_flag``, UNIQ_KEY and the born fields."""

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str]
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


class WithStoredFields(Protocol):
    """What a stored message carries that a copy of it keeps."""

    body: bytes
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    reconsume_times: int


@dataclass(frozen=True)
class PutResult:
    """Where each message of one put was stored (same order as given)."""

    broker_name: str
    topic: str
    queue_id: int
    queue_offsets: tuple[int, ...]
    commit_log_offsets: tuple[int, ...]
    msg_ids: tuple[str, ...]
    store_timestamp: int


@dataclass(frozen=True)
class TopicConfig:
    """A topic's settings on one broker (``TopicConfig``); one row of the ``topic_config`` table.

    ``queue_nums``: its read and write queues (one count: RocketMQ's read and write counts differ
    only while an operator shrinks a topic). ``perm``: 4 read, 2 write (6 both). ``message_type``:
    the types it takes, RocketMQ 5's ``message.type`` attribute (NORMAL, FIFO, DELAY, TRANSACTION,
    MIXED), None when not set: every type (docs/broker.md).
    """

    topic: str
    queue_nums: int = c.DEFAULT_TOPIC_QUEUE_NUMS
    perm: int = c.PERM_READ | c.PERM_WRITE
    message_type: str | None = None

    def validate(self) -> None:
        """Check every setting.

        Raises:
            ValidationError: a bad topic name, ``queue_nums`` outside [1, 1024], ``perm`` not 2, 4
                or 6, or an unknown ``message_type``.
        """
        validate_name(self.topic, "topic", c.TOPIC_MAX_LENGTH)
        if not 1 <= self.queue_nums <= 1024:
            raise ValidationError("queue_nums", self.queue_nums, "must be in [1, 1024]")
        if self.perm not in (c.PERM_WRITE, c.PERM_READ, c.PERM_READ | c.PERM_WRITE):
            raise ValidationError("perm", self.perm, "must be 2 (write), 4 (read) or 6 (read and write)")
        if self.message_type is not None and self.message_type not in c.TOPIC_MESSAGE_TYPES:
            raise ValidationError(
                "message_type", self.message_type, "is not a topic message type", f"one of {c.TOPIC_MESSAGE_TYPES}"
            )


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    """A consumer group's settings on one broker (``SubscriptionGroupConfig``); one row of the
    ``subscription_group`` table.

    ``retry_max_times``: failed deliveries after which a send-back goes to ``%DLQ%group`` when
    the client does not send its own maximum. ``retry_queue_nums``: queues of ``%RETRY%group``;
    0 makes a send-back succeed without storing anything. The ``consume_*`` flags are kept for
    the jobs and tools; the broker does not enforce them. ``updated_timestamp`` (epoch ms) is set
    by :meth:`Broker.update_subscription_group`.
    """

    group: str
    retry_max_times: int = c.RETRY_MAX_TIMES
    retry_queue_nums: int = c.RETRY_QUEUE_NUMS
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_from_min_enable: bool = True
    consume_message_orderly: bool = False
    updated_timestamp: int = 0
    retry_policy: str | None = None
    retry_next_ms: tuple[int, ...] | None = None
    retry_initial_ms: int | None = None
    retry_max_ms: int | None = None
    retry_multiplier: int | None = None

    def validate(self) -> None:
        """Check every setting.

        Raises:
            ValidationError: a bad group name, ``retry_max_times`` outside [0, 2^31),
                ``retry_queue_nums`` outside [0, 1024], an unknown ``retry_policy``, the settings of
                one policy given with the other, or a delay or multiplier below 1.
        """
        validate_name(self.group, "group", c.GROUP_MAX_LENGTH)
        if not 0 <= self.retry_max_times < 2**31:
            raise ValidationError("retry_max_times", self.retry_max_times, "must be in [0, 2^31)", "16 is the default")
        if not 0 <= self.retry_queue_nums <= 1024:
            raise ValidationError(
                "retry_queue_nums", self.retry_queue_nums, "must be in [0, 1024]", "use 0 to drop failed messages"
            )
        if self.retry_policy is not None and self.retry_policy not in c.RETRY_POLICIES:
            raise ValidationError("retry_policy", self.retry_policy, "is not a retry policy", f"{c.RETRY_POLICIES}")
        exponential = (self.retry_initial_ms, self.retry_max_ms, self.retry_multiplier)
        if self.retry_policy != "CUSTOMIZED" and self.retry_next_ms is not None:
            raise ValidationError("retry_next_ms", self.retry_next_ms, "is a CUSTOMIZED policy's")
        if self.retry_policy != "EXPONENTIAL" and any(value is not None for value in exponential):
            raise ValidationError("retry_initial_ms", exponential, "are an EXPONENTIAL policy's")
        if self.retry_next_ms is not None and not self.retry_next_ms:
            raise ValidationError("retry_next_ms", self.retry_next_ms, "holds no delay")
        checked = [("retry_next_ms", min(self.retry_next_ms or (1,))), *zip(_EXPONENTIAL, exponential, strict=True)]
        for name, value in checked:
            if value is not None and value < 1:
                raise ValidationError(name, value, "must be at least 1")

    def next_delay_ms(self, reconsume_times: int) -> int:
        """The delay before the retry of a message consumed ``reconsume_times`` times before, as
        RocketMQ's ``RetryPolicy.nextDelayDuration``: the customized list's entry at
        ``reconsume_times + 2`` (the old delay levels' offset; the last entry beyond the list), or
        ``initial * multiplier ^ min(reconsume_times, 32)`` up to the maximum. An EXPONENTIAL
        policy without its settings is RocketMQ's default policy, the customized one
        (``GroupRetryPolicy.getRetryPolicy``)."""
        exponential = (self.retry_initial_ms, self.retry_max_ms, self.retry_multiplier)
        if self.retry_policy == "EXPONENTIAL" and any(value is not None for value in exponential):
            initial, largest, multiplier = (
                given if given is not None else default
                for given, default in zip(
                    (self.retry_initial_ms, self.retry_max_ms, self.retry_multiplier),
                    c.EXPONENTIAL_RETRY_MS,
                    strict=True,
                )
            )
            return int(min(largest, initial * multiplier ** min(max(reconsume_times, 0), 32)))
        delays = self.retry_next_ms or c.CUSTOMIZED_RETRY_NEXT_MS
        return delays[min(max(reconsume_times, 0) + 2, len(delays) - 1)]


_EXPONENTIAL = ("retry_initial_ms", "retry_max_ms", "retry_multiplier")


FlushMode = Literal["SYNC_FLUSH", "ASYNC_FLUSH"]


def stored_copy(record: WithStoredFields, topic: str, queue_id: int, properties: dict[str, str]) -> InnerMessage:
    """A stored ``record`` put again in ``topic`` and ``queue_id`` with ``properties`` and WAIT=false,
    as the schedule and timer services deliver their records: body as stored, flag, sys flag (the
    put sets the host bits again), born time and host, reconsume times."""
    properties[c.PROPERTY_WAIT_STORE_MSG_OK] = "false"
    return InnerMessage(
        topic=topic,
        queue_id=queue_id,
        body=record.body,
        properties=properties,
        flag=record.flag,
        sys_flag=record.sys_flag & ~(c.BORNHOST_V6_FLAG | c.STOREHOSTADDRESS_V6_FLAG),
        born_timestamp=record.born_timestamp,
        born_host=record.born_host,
        reconsume_times=record.reconsume_times,
    )
