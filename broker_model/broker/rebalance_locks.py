"""Broker-side queue locks for orderly consumption (RocketMQ's ``RebalanceLockManager``).

A lock entry belongs to one (consumer group, message queue) and names the client that holds it.
The holder keeps it by renewing it: every :meth:`RebalanceLockManager.lock_batch` or
:meth:`RebalanceLockManager.is_locked` of the holder sets the entry's ``last_update_timestamp``.
An entry is *held* by ``client_id`` when the ids match and ``now - last_update_timestamp`` is at
most the lease (60 s); once that is over, any client of the group may take it. Only the holder
unlocks. Time is an explicit ``now`` (epoch ms), defaulting to the manager's clock, so tests run
expiry without sleeping. Every method is thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker_model.common import MessageQueue, now_ms
from broker_model.common import constants as c
from schemas.errors import ValidationError


@dataclass(slots=True)
class LockEntry:
    """Who holds one queue's lock and when it was last renewed (epoch ms)."""

    client_id: str
    last_update_timestamp: int

    def is_expired(self, now: int, lease_ms: int) -> bool:
        """True when more than ``lease_ms`` passed since the last renewal."""
        return now - self.last_update_timestamp > lease_ms

    def is_locked_by(self, client_id: str, now: int, lease_ms: int) -> bool:
        """True when ``client_id`` holds this entry and it has not expired."""
        return self.client_id == client_id and not self.is_expired(now, lease_ms)


class RebalanceLockManager:
    """The lock table of one broker: ``{group: {queue: LockEntry}}`` (see module docstring).

    Args:
        lock_max_live_time_ms: the lease; a lock not renewed for longer than this is free.
        clock: epoch-ms clock used when a method gets no explicit ``now``.

    Raises:
        ValidationError: a non-positive lease.
    """

    def __init__(
        self, lock_max_live_time_ms: int = c.REBALANCE_LOCK_MAX_LIVE_TIME_MS, clock: Callable[[], int] = now_ms
    ) -> None:
        if lock_max_live_time_ms <= 0:
            raise ValidationError("lock_max_live_time_ms", lock_max_live_time_ms, "must be positive")
        self.lock_max_live_time_ms = lock_max_live_time_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._table: dict[str, dict[MessageQueue, LockEntry]] = {}

    def _now(self, now: int | None) -> int:
        return self._clock() if now is None else now

    def lock_batch(
        self, group: str, queues: Iterable[MessageQueue], client_id: str, now: int | None = None
    ) -> set[MessageQueue]:
        """Try to lock ``queues`` for ``client_id`` (``tryLockBatch``); returns the subset it now holds.

        A queue the client already holds is renewed; a free queue, or one whose holder let the
        lease run out, is taken over; a queue another client holds unexpired is left out.

        Raises:
            ValidationError: an empty ``group`` or ``client_id``.
        """
        _check_ids(group, client_id)
        moment = self._now(now)
        held: set[MessageQueue] = set()
        with self._lock:
            entries = self._table.setdefault(group, {})
            for queue in queues:
                entry = entries.get(queue)
                if entry is None or entry.is_locked_by(client_id, moment, self.lock_max_live_time_ms):
                    entries[queue] = LockEntry(client_id, moment)
                    held.add(queue)
                elif entry.is_expired(moment, self.lock_max_live_time_ms):
                    entry.client_id = client_id
                    entry.last_update_timestamp = moment
                    held.add(queue)
        return held

    def unlock_batch(self, group: str, queues: Iterable[MessageQueue], client_id: str) -> set[MessageQueue]:
        """Remove the entries of ``queues`` that ``client_id`` holds (expired or not); entries of
        other clients stay. Returns the queues actually unlocked."""
        _check_ids(group, client_id)
        released: set[MessageQueue] = set()
        with self._lock:
            entries = self._table.get(group)
            if entries is None:
                return released
            for queue in queues:
                entry = entries.get(queue)
                if entry is not None and entry.client_id == client_id:
                    del entries[queue]
                    released.add(queue)
            if not entries:
                del self._table[group]
        return released

    def is_locked(self, group: str, queue: MessageQueue, client_id: str, now: int | None = None) -> bool:
        """True when ``client_id`` holds ``queue``'s lock; a held lock is renewed by asking."""
        moment = self._now(now)
        with self._lock:
            entry = self._table.get(group, {}).get(queue)
            if entry is None or not entry.is_locked_by(client_id, moment, self.lock_max_live_time_ms):
                return False
            entry.last_update_timestamp = moment
            return True

    def is_lock_all_expired(self, group: str, now: int | None = None) -> bool:
        """True when no lock of ``group`` is still within its lease (``isLockAllExpired``)."""
        moment = self._now(now)
        with self._lock:
            entries = self._table.get(group, {})
            return all(e.is_expired(moment, self.lock_max_live_time_ms) for e in entries.values())

    def holder(self, group: str, queue: MessageQueue, now: int | None = None) -> str | None:
        """The client holding ``queue``'s unexpired lock, None when it is free (does not renew)."""
        moment = self._now(now)
        with self._lock:
            entry = self._table.get(group, {}).get(queue)
            if entry is None or entry.is_expired(moment, self.lock_max_live_time_ms):
                return None
            return entry.client_id


def _check_ids(group: str, client_id: str) -> None:
    if not group:
        raise ValidationError("group", group, "must not be empty", "pass the consumer group")
    if not client_id:
        raise ValidationError("client_id", client_id, "must not be empty", "pass the consumer's client id")
