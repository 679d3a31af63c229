"""What the concurrent and the orderly push consumer share: the message models, where a consumer
without a stored offset starts (``ConsumeFromWhere``) and ``computePullFromWhere``.

See docs/rocketmq.md (consumer offsets) for the rule and its RocketMQ source.
"""

from __future__ import annotations

from typing import Literal, Protocol

from broker_model.client.offset_store import ReadOffsetType
from broker_model.common import MessageQueue
from broker_model.common import constants as c
from broker_model.store import MessageStore
from schemas.errors import ValidationError

MessageModel = Literal["CLUSTERING", "BROADCASTING"]
MESSAGE_MODELS: tuple[MessageModel, ...] = ("CLUSTERING", "BROADCASTING")
ConsumeFromWhere = Literal["CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP"]
CONSUME_FROM_WHERE: tuple[ConsumeFromWhere, ...] = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)


class OffsetReader(Protocol):
    """The part of an offset store that :func:`compute_pull_from_where` reads."""

    def read_offset(self, queue: MessageQueue | None, read_type: ReadOffsetType) -> int: ...


def check_message_model(message_model: str) -> None:
    """Raises ValidationError unless ``message_model`` is CLUSTERING or BROADCASTING."""
    if message_model not in MESSAGE_MODELS:
        raise ValidationError("message_model", message_model, "must be CLUSTERING or BROADCASTING")


def check_consume_from_where(consume_from_where: str) -> None:
    """Raises ValidationError unless ``consume_from_where`` is a ConsumeFromWhere value."""
    if consume_from_where not in CONSUME_FROM_WHERE:
        raise ValidationError("consume_from_where", consume_from_where, "is not a ConsumeFromWhere value")


def compute_pull_from_where(
    offsets: OffsetReader,
    store: MessageStore,
    queue: MessageQueue,
    consume_from_where: ConsumeFromWhere,
    consume_timestamp: int,
) -> int | None:
    """``computePullFromWhere``: the first offset to pull of a newly taken queue.

    The stored offset when there is one; else, per ``consume_from_where``: the queue's first
    offset, its max offset, or the offset of ``consume_timestamp`` (epoch ms). A retry topic
    starts at 0 under CONSUME_FROM_LAST_OFFSET and at its max offset under
    CONSUME_FROM_TIMESTAMP. None when the offset store could not be read (the caller tries again
    later).
    """
    stored = offsets.read_offset(queue, ReadOffsetType.READ_FROM_STORE)
    if stored >= 0:
        return stored
    if stored != c.OFFSET_NOT_FOUND:
        return None
    retry = queue.topic.startswith(c.RETRY_GROUP_TOPIC_PREFIX)
    if consume_from_where == "CONSUME_FROM_FIRST_OFFSET" or (
        retry and consume_from_where == "CONSUME_FROM_LAST_OFFSET"
    ):
        return 0
    if consume_from_where == "CONSUME_FROM_TIMESTAMP" and not retry:
        return store.offset_by_time(queue.topic, queue.queue_id, consume_timestamp)
    return store.max_offset(queue.topic, queue.queue_id)
