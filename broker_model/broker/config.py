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

    def validate(self) -> None:
        """Check every setting.

        Raises:
            ValidationError: a bad group name, ``retry_max_times`` outside [0, 2^31) or
                ``retry_queue_nums`` outside [0, 1024].
        """
        validate_name(self.group, "group", c.GROUP_MAX_LENGTH)
        if not 0 <= self.retry_max_times < 2**31:
            raise ValidationError("retry_max_times", self.retry_max_times, "must be in [0, 2^31)", "16 is the default")
        if not 0 <= self.retry_queue_nums <= 1024:
            raise ValidationError(
                "retry_queue_nums", self.retry_queue_nums, "must be in [0, 1024]", "use 0 to drop failed messages"
            )


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
