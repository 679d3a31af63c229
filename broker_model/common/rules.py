"""The RocketMQ rules that several layers apply, each written once: which records reach a consume
queue (dispatch), the delay level of a DELAY property, the consume-queue tags code (the delivery
time on the schedule topic), ``SelectMessageQueueByHash`` and the queue keys.

A rule has a Python form here (and an Arrow form where the store and the jobs read Arrow
columns); the Spark column forms live in :mod:`jobs.commitlog`, and ``tests/test_rules.py``
holds the forms against each other. See docs/rocketmq.md for each rule and its RocketMQ source.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import constants as c
from broker_model.common.codec import java_string_hash, tags_code

QueueKey = tuple[str, str, int]
"""A message queue: (broker_name, topic, queue_id)."""
GroupQueueKey = tuple[str, str, str, int]
"""A consumer group's message queue: (group, broker_name, topic, queue_id)."""
QUEUE_KEY = ("broker_name", "topic", "queue_id")
"""The columns of a :data:`QueueKey`, in its order."""
GROUP_QUEUE_KEY = ("group", *QUEUE_KEY)
"""The columns of a :data:`GroupQueueKey`, in its order."""
RecordKey = tuple[str, int]
"""A record of the lake: (broker_name, commit_log_offset)."""

DISPATCHED_TRANSACTION_TYPES = (c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE)
"""Transaction types (``sys_flag & 12``) whose records get a consume-queue row."""
_JAVA_INT_TEXT = re.compile(r"[+-]?[0-9]+")  # Integer.parseInt: an optional sign, ASCII digits


def is_dispatched(sys_flag: int) -> bool:
    """Whether a record with ``sys_flag`` gets a consume-queue row: transaction type NOT or COMMIT."""
    return sys_flag & c.TRANSACTION_ROLLBACK_TYPE in DISPATCHED_TRANSACTION_TYPES


def dispatched_mask(sys_flag: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """:func:`is_dispatched` over an Arrow column of ``sys_flag`` values (a boolean column)."""
    # NOT (0) and COMMIT (8) are the two types without PREPARED's bit (4): two passes, no hash lookup
    return pc.equal(pc.bit_wise_and(sys_flag, c.TRANSACTION_PREPARED_TYPE), 0)


def parse_delay_level(text: str | None) -> int | None:
    """A DELAY property as Java's ``Integer.parseInt`` reads it: an optional sign and ASCII digits
    within a Java int; None when absent or anything else."""
    if text is None or not _JAVA_INT_TEXT.fullmatch(text):
        return None
    level = int(text)
    return level if c.JAVA_INT_MIN <= level <= c.JAVA_INT_MAX else None


def level_delay_ms(level: int) -> int | None:
    """The delay (ms) of ``level`` (1..18), None for a level outside the table."""
    return c.DELAY_LEVEL_MILLIS[level - 1] if 1 <= level <= c.MAX_DELAY_LEVEL else None


def compute_deliver_timestamp(level: int, store_timestamp: int) -> int:
    """``computeDeliverTimestamp``: store time plus the level's delay; a level outside the table
    waits 1000 ms."""
    delay = level_delay_ms(level)
    return store_timestamp + (c.UNKNOWN_LEVEL_DELAY_MS if delay is None else delay)


def schedule_level(delay: str | None) -> int | None:
    """The level a DELAY property schedules at: capped at 18 (``maxDelayLevel``), None unless it
    is an integer above 0."""
    level = parse_delay_level(delay)
    return min(level, c.MAX_DELAY_LEVEL) if level is not None and level > 0 else None


def consume_queue_tags_code(topic: str, tags: str | None, delay: str | None, store_timestamp: int) -> int:
    """The tags code of a record's consume-queue row: on ``SCHEDULE_TOPIC_XXXX`` with a DELAY
    level above 0 the delivery time, otherwise the Java hash of ``tags`` (0 when null or empty)."""
    level = schedule_level(delay) if topic == c.SCHEDULE_TOPIC else None
    return tags_code(tags) if level is None else compute_deliver_timestamp(level, store_timestamp)


def select_queue_by_hash(arg: str, queue_count: int) -> int:
    """``SelectMessageQueueByHash``: the index of the queue for ``arg`` among ``queue_count``:
    Java hash of the string, remainder first, then absolute value (safe for Integer.MIN_VALUE)."""
    return abs(java_string_hash(arg)) % queue_count


def uninterpreted_topic(topic: str) -> str | None:
    """What a RocketMQ 5 system topic whose records this product stores but does not interpret
    yet holds (POP's revive log, POP checkpoints); None for any other topic (the timer wheel
    ``rmq_sys_wheel_timer`` is interpreted: its records are delivered by the broker's timer)."""
    if topic.startswith(c.REVIVE_TOPIC_PREFIX):
        return "POP checkpoints and acks of a cluster (RocketMQ 5 revive log)"
    if topic == c.POP_CHECKPOINT_TOPIC:
        return "POP checkpoints (RocketMQ 5)"
    return None
