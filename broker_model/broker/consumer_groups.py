"""The broker's consumer groups: which clients of a group are alive (heartbeats, expiry)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from broker_model.common import constants as c
from broker_model.common import now_ms
from schemas.errors import ValidationError


class ConsumerGroupManager:
    """Live clients per consumer group on one broker (``ConsumerManager``). Thread-safe.

    Args:
        channel_expired_timeout_ms: a client whose last heartbeat is older than this is gone.
        clock: epoch-ms clock used when a method gets no explicit ``now``.
    """

    def __init__(
        self, channel_expired_timeout_ms: int = c.CHANNEL_EXPIRED_TIMEOUT_MS, clock: Callable[[], int] = now_ms
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
