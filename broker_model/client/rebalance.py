"""Consumer group membership on a broker and the averaging queue allocation of clients.

Every consumer client heartbeats every broker it reads from (``HEARTBEAT``, every 30 s); the
broker's :class:`ConsumerGroupManager` remembers each client's last heartbeat and forgets a
client that stayed silent for longer than the channel expiry (120 s) or that unregistered. A
client rebalances by listing the group's live client ids and splitting the sorted queues of a
topic with :func:`allocate_averagely` (RocketMQ's ``AllocateMessageQueueAveragely``), so clients
that see the same membership compute disjoint shares that together cover every queue.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker_model.common import MessageQueue
from schemas.errors import ValidationError


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
