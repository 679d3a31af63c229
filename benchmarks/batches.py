"""The benchmarks' bulk writer: messages through two real ASYNC_FLUSH brokers, as ``send_batch``
calls of 1,000 messages, each batch built just before it is sent (``benchmarks/consume_queue.py``,
``benchmarks/run_all.py`` and ``benchmarks/replay.py`` differ only in the topics and tags)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from broker_model.client import Producer
from broker_model.common import Message
from broker_model.tools import start_brokers

BATCH = 1000
BODY_BYTES = 200

TopicOf = Callable[[int], tuple[str, Sequence[str | None]]]
"""A batch's topic and the tags its messages draw from, by the batch's index."""


def send_batches(
    lake: Path, messages: int, seed: int, topic_of: TopicOf, first_key: int = 0, queues: Sequence[tuple[str, int]] = ()
) -> float:
    """Send ``messages`` messages (random ``BODY_BYTES``-byte bodies, keys ``k<first_key + n>``,
    tags drawn from the batch's) through two ASYNC_FLUSH brokers of ``lake`` in batches of
    :data:`BATCH`, after creating the ``queues`` (topic, queues per broker); the seconds from the
    first send until both brokers flushed."""
    brokers = start_brokers(lake, 2, flush_mode="ASYNC_FLUSH")
    try:
        for broker in brokers:
            for topic, count in queues:
                broker.create_topic(topic, count)
        producer = Producer(brokers, "bench", seed=seed)
        rng = random.Random(seed)
        started = time.perf_counter()
        for index, start in enumerate(range(0, messages, BATCH)):
            topic, tags = topic_of(index)
            keys = range(first_key + start, first_key + min(start + BATCH, messages))
            batch = [
                Message.create(topic, rng.randbytes(BODY_BYTES), tags=rng.choice(tags) or None, keys=f"k{k}")
                for k in keys
            ]
            producer.send_batch(batch)
        for broker in brokers:
            broker.flush()
        return time.perf_counter() - started
    finally:
        for broker in brokers:
            broker.shutdown()
