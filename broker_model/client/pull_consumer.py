"""The pull consumer client: pulls by (broker, topic, queue, offset) and keeps offsets.

Clustering groups keep offsets on the queue's broker (in the lake); broadcasting clients keep
them in a local file of their own (``LocalFileOffsetStore``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from broker_model.broker import Broker
from broker_model.client.consume_core import MessageModel, check_message_model
from broker_model.client.offset_store import LocalFileOffsetStore, ReadOffsetType, RemoteBrokerOffsetStore
from broker_model.common import MessageQueue, validate_group
from broker_model.store import PullResult
from schemas.errors import ValidationError


class PullConsumer:
    """A consumer of one group over brokers of this process (``DefaultMQPullConsumer``)."""

    def __init__(
        self,
        brokers: Sequence[Broker],
        group: str,
        *,
        message_model: MessageModel = "CLUSTERING",
        client_id: str | None = None,
        offset_dir: str | Path | None = None,
    ) -> None:
        validate_group(group)
        check_message_model(message_model)
        self.brokers = {b.broker_name: b for b in brokers}
        self.group = group
        self.message_model = message_model
        self.client_id = client_id or f"127.0.0.1@{os.getpid()}"
        self.offset_store: RemoteBrokerOffsetStore | LocalFileOffsetStore
        if message_model == "CLUSTERING":
            self.offset_store = RemoteBrokerOffsetStore(
                {n: b.offsets for n, b in self.brokers.items()}, group, self.client_id
            )
        else:
            if offset_dir is None:
                raise ValidationError("offset_dir", offset_dir, "a broadcasting consumer keeps offsets in local files")
            self.offset_store = LocalFileOffsetStore(offset_dir, self.client_id, group)

    def queues(self, topic: str) -> list[MessageQueue]:
        """Every queue of ``topic`` on this consumer's brokers, sorted."""
        return sorted(
            MessageQueue(name, topic, q)
            for name, broker in self.brokers.items()
            for q in range(broker.queue_nums(topic) or 0)
        )

    def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = 32,
        tag_expression: str = "*",
        suspend_timeout_ms: int = 0,
    ) -> PullResult:
        """Pull from ``queue`` at ``offset`` (held up to ``suspend_timeout_ms`` when nothing is new)."""
        broker = self.brokers.get(queue.broker_name)
        if broker is None:
            raise ValidationError("broker_name", queue.broker_name, "is not a broker of this consumer")
        return broker.pull(queue.topic, queue.queue_id, offset, max_nums, tag_expression, suspend_timeout_ms)

    def update_offset(self, queue: MessageQueue, offset: int, increase_only: bool = True) -> None:
        """Remember ``offset`` (the next to consume) for ``queue``."""
        self.offset_store.update_offset(queue, offset, increase_only)

    def read_offset(
        self, queue: MessageQueue, read_type: ReadOffsetType = ReadOffsetType.MEMORY_FIRST_THEN_STORE
    ) -> int:
        """The queue's offset, or -1 (none), -2 (store unreadable), -3 (bad request)."""
        return self.offset_store.read_offset(queue, read_type)

    def persist(self) -> None:
        """Send the offsets to the brokers (clustering) or write the local file (broadcasting)."""
        self.offset_store.persist_all()
