"""Consumer group membership on a broker and the averaging queue allocation of clients.

Every consumer client heartbeats every broker it reads from (``HEARTBEAT``, every 30 s); the
broker's :class:`ConsumerGroupManager` remembers each client's last heartbeat and forgets a
client that stayed silent for longer than the channel expiry (120 s) or that unregistered. A
client rebalances by listing the group's live client ids and splitting the sorted queues of a
topic with :func:`allocate_averagely` (RocketMQ's ``AllocateMessageQueueAveragely``), so clients
that see the same membership compute disjoint shares that together cover every queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from broker_model import constants as c
from broker_model.errors import ValidationError
from broker_model.message import MessageQueue


def _real_clock() -> int:
    return time.time_ns() // 1_000_000


def queue_sort_key(queue: MessageQueue) -> tuple[str, str, int]:
    """The order RocketMQ sorts message queues in before allocating: topic, broker name, queue id."""
    return queue.topic, queue.broker_name, queue.queue_id


def allocate_averagely(
    group: str, current_client_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]
) -> list[MessageQueue]:
    """The queues ``current_client_id`` consumes when ``client_ids`` share ``queues``.

    Both lists are sorted first (queues by :func:`queue_sort_key`, ids as strings), as the
    rebalance does before calling the strategy. With ``n`` queues and ``k`` clients, the client
    at index ``i`` gets a contiguous run: the first ``n % k`` clients get ``n // k + 1`` queues,
    the others ``n // k``; with fewer queues than clients, the first ``n`` clients get one each.
    A client that is not in ``client_ids`` gets nothing. Deterministic.

    Raises:
        ValidationError: an empty ``current_client_id``, ``queues`` or ``client_ids``.
    """
    if not current_client_id:
        raise ValidationError("current_client_id", current_client_id, "must not be empty")
    if not queues:
        raise ValidationError("queues", list(queues), "nothing to allocate", "allocate once the topic has queues")
    if not client_ids:
        raise ValidationError("client_ids", list(client_ids), "no client to allocate to")
    ordered_queues = sorted(set(queues), key=queue_sort_key)
    ordered_ids = sorted(set(client_ids))
    if current_client_id not in ordered_ids:
        return []
    index = ordered_ids.index(current_client_id)
    total, clients = len(ordered_queues), len(ordered_ids)
    remainder = total % clients
    if total <= clients:
        size = 1
    else:
        size = total // clients + (1 if index < remainder else 0)
    start = index * size if index < remainder else index * size + remainder
    count = max(0, min(size, total - start))
    return ordered_queues[start : start + count]


class ConsumerGroupManager:
    """Live clients per consumer group on one broker (``ConsumerManager``). Thread-safe.

    Args:
        channel_expired_timeout_ms: a client whose last heartbeat is older than this is gone.
        clock: epoch-ms clock used when a method gets no explicit ``now``.
    """

    def __init__(
        self, channel_expired_timeout_ms: int = c.CHANNEL_EXPIRED_TIMEOUT_MS, clock: Callable[[], int] = _real_clock
    ) -> None:
        if channel_expired_timeout_ms <= 0:
            raise ValidationError("channel_expired_timeout_ms", channel_expired_timeout_ms, "must be positive")
        self.channel_expired_timeout_ms = channel_expired_timeout_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, int]] = {}  # group -> client id -> last heartbeat
        self._versions: dict[str, int] = {}

    def _now(self, now: int | None) -> int:
        return self._clock() if now is None else now

    def register(self, group: str, client_id: str, now: int | None = None) -> bool:
        """Record a heartbeat of ``client_id`` in ``group``; True when the client is new to the
        group (its membership changed).

        Raises:
            ValidationError: an empty ``group`` or ``client_id``.
        """
        if not group:
            raise ValidationError("group", group, "must not be empty")
        if not client_id:
            raise ValidationError("client_id", client_id, "must not be empty")
        moment = self._now(now)
        with self._lock:
            self._expire(group, moment)
            clients = self._groups.setdefault(group, {})
            joined = client_id not in clients
            clients[client_id] = moment
            if joined:
                self._versions[group] = self._versions.get(group, 0) + 1
            return joined

    def unregister(self, group: str, client_id: str) -> bool:
        """Forget ``client_id`` (``UNREGISTER_CLIENT`` at shutdown); True when it was a member."""
        with self._lock:
            clients = self._groups.get(group, {})
            if clients.pop(client_id, None) is None:
                return False
            self._versions[group] = self._versions.get(group, 0) + 1
            return True

    def client_ids(self, group: str, now: int | None = None) -> list[str]:
        """The group's live client ids, sorted (clients silent for too long are dropped first)."""
        moment = self._now(now)
        with self._lock:
            self._expire(group, moment)
            return sorted(self._groups.get(group, {}))

    def version(self, group: str, now: int | None = None) -> int:
        """A number that changes whenever the group's membership changes (a client joins, leaves or
        expires), so clients can rebalance at once, as ``NOTIFY_CONSUMER_IDS_CHANGED`` makes them."""
        moment = self._now(now)
        with self._lock:
            self._expire(group, moment)
            return self._versions.get(group, 0)

    def _expire(self, group: str, now: int) -> None:
        clients = self._groups.get(group)
        if not clients:
            return
        expired = [cid for cid, seen in clients.items() if now - seen > self.channel_expired_timeout_ms]
        for client_id in expired:
            del clients[client_id]
        if expired:
            self._versions[group] = self._versions.get(group, 0) + 1
