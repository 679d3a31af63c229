"""Locks of a lake: an OS file lock per name under ``<lake>/_locks``, and the broker name lock
built on it (one live writer per broker name in a lake)."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import IO

from schemas.errors import BrokerLockedError


class LakeLock:
    """An OS file lock on ``<lake>/_locks/<name>.lock``, exclusive across processes.

    The kernel releases it when the holder dies (even by SIGKILL), so a crashed holder never
    blocks its own restart. The holder writes its ``pid@host`` into the file, for the message of
    whoever finds it taken. Local file systems only.
    """

    def __init__(self, lake: str | Path, name: str) -> None:
        self.path = Path(lake) / "_locks" / f"{name}.lock"
        self._handle: IO[str] | None = None

    def try_acquire(self) -> str | None:
        """Take the lock; None when taken, else (when another live process holds it) that
        holder's ``pid@host`` and nothing held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            return holder
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}@{socket.gethostname()}\n")
        handle.flush()
        self._handle = handle
        return None

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


class BrokerNameLock:
    """The :class:`LakeLock` that makes ``broker_name`` exclusive on a lake across processes."""

    def __init__(self, lake: str | Path, broker_name: str) -> None:
        self._lock = LakeLock(lake, f"broker-{broker_name}")
        self.path = self._lock.path
        self.broker_name = broker_name
        self.lake = lake

    def acquire(self) -> BrokerNameLock:
        """Take the lock or fail at once.

        Raises:
            BrokerLockedError: another live process holds it (its pid@host is in the message).
        """
        holder = self._lock.try_acquire()
        if holder is not None:
            raise BrokerLockedError(
                f"broker_name={self.broker_name!r} is already running on lake {self.lake} "
                f"(held by {holder}); stop that broker or choose another broker_name"
            )
        return self

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        self._lock.release()

    def __enter__(self) -> BrokerNameLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
