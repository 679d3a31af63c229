"""Client-side offset stores: the clustering store that reads and commits through the brokers, and
the broadcasting store in a local file.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from enum import Enum
from pathlib import Path

from broker_model.broker import ConsumerOffsetManager
from broker_model.common import OFFSET_BAD_REQUEST, OFFSET_NOT_FOUND, OFFSET_READ_ERROR, MessageQueue
from schemas.errors import RmqLakeError


class ReadOffsetType(Enum):
    """Where a client reads an offset from."""

    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


class OffsetStore(ABC):
    """A client's offsets in memory (RocketMQ's ``offsetTable``), backed by a store that
    :meth:`_read_store` reads (``readOffset`` return codes: the offset, -1 not found, -2 the store
    could not be read, -3 bad request)."""

    def __init__(self) -> None:
        self._memory: dict[tuple[str, str, int], int] = {}

    def _update(self, queue: MessageQueue, offset: int, increase_only: bool) -> None:
        key = (queue.broker_name, queue.topic, queue.queue_id)
        if increase_only and self._memory.get(key, -1) >= offset:
            return
        self._memory[key] = offset

    def read_offset(self, queue: MessageQueue | None, read_type: ReadOffsetType) -> int:
        """The offset per ``read_type``, or one of the negative return codes; an offset read from
        the store is kept in memory."""
        if queue is None or not isinstance(read_type, ReadOffsetType):
            return OFFSET_BAD_REQUEST
        key = (queue.broker_name, queue.topic, queue.queue_id)
        if read_type is not ReadOffsetType.READ_FROM_STORE and key in self._memory:
            return self._memory[key]
        if read_type is ReadOffsetType.READ_FROM_MEMORY:
            return OFFSET_NOT_FOUND
        stored = self._read_store(queue)
        if stored >= 0:
            self._memory[key] = stored
        return stored

    @abstractmethod
    def _read_store(self, queue: MessageQueue) -> int:
        """The offset the store holds for ``queue``, or a negative return code."""


class RemoteBrokerOffsetStore(OffsetStore):
    """A clustering client's offsets: memory, backed by the queue's broker (``readOffset``
    return codes: the offset, -1 not found, -2 broker unreachable, -3 bad request)."""

    def __init__(self, managers: dict[str, ConsumerOffsetManager], group: str, client_id: str) -> None:
        super().__init__()
        self.managers = managers
        self.group = group
        self.client_id = client_id

    def update_offset(self, queue: MessageQueue, offset: int, increase_only: bool = True) -> None:
        """Set the offset in memory (only upwards with ``increase_only``)."""
        self._update(queue, offset, increase_only)

    def _read_store(self, queue: MessageQueue) -> int:
        manager = self.managers.get(queue.broker_name)
        if manager is None:
            return OFFSET_READ_ERROR
        try:
            return manager.query_offset(self.group, queue.topic, queue.queue_id)
        except RmqLakeError:
            return OFFSET_READ_ERROR

    def persist(self, queue: MessageQueue) -> None:
        """Send the memory offset of ``queue`` to its broker."""
        key = (queue.broker_name, queue.topic, queue.queue_id)
        if key in self._memory and queue.broker_name in self.managers:
            self.managers[queue.broker_name].commit_offset(
                self.group, queue.topic, queue.queue_id, self._memory[key], self.client_id
            )

    def persist_all(self) -> None:
        """Send every memory offset to its broker."""
        for broker_name, topic, queue_id in list(self._memory):
            self.persist(MessageQueue(broker_name, topic, queue_id))


class LocalFileOffsetStore(OffsetStore):
    """Broadcasting offsets of one client and group in ``{base}/{client_id}/{group}/offsets.json``.

    The file is strict JSON ``{"offsetTable": [{"brokerName", "topic", "queueId", "offset"}, ...]}``
    (RocketMQ's fastjson text uses queue objects as keys, which is not JSON); it is replaced
    atomically and the previous version kept as ``offsets.json.bak``.
    """

    def __init__(self, base_dir: str | Path, client_id: str, group: str) -> None:
        super().__init__()
        self.path = Path(base_dir) / client_id / group / "offsets.json"

    def update_offset(self, queue: MessageQueue, offset: int, increase_only: bool = False) -> None:
        """Set the offset in memory (only upwards with ``increase_only``)."""
        self._update(queue, offset, increase_only)

    def _read_store(self, queue: MessageQueue) -> int:
        return self._read_file().get((queue.broker_name, queue.topic, queue.queue_id), OFFSET_NOT_FOUND)

    def persist_all(self) -> None:
        """Write every memory offset to the file (atomic replace, previous kept as .bak)."""
        offset_items = sorted(self._memory.items())
        table = [{"brokerName": b, "topic": t, "queueId": q, "offset": o} for (b, t, q), o in offset_items]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_suffix(".json.tmp")
        temp.write_text(json.dumps({"offsetTable": table}, indent=1), encoding="utf-8")
        if self.path.exists():
            os.replace(self.path, self.path.with_suffix(".json.bak"))
        os.replace(temp, self.path)

    def _read_file(self) -> dict[tuple[str, str, int], int]:
        for candidate in (self.path, self.path.with_suffix(".json.bak")):
            try:
                data = json.loads(candidate.read_text(encoding="utf-8"))
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            return {(e["brokerName"], e["topic"], int(e["queueId"])): int(e["offset"]) for e in data["offsetTable"]}
        return {}
