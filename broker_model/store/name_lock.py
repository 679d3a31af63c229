"""The broker name lock: one live writer per broker name in a lake."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import Any

from schemas.errors import BrokerLockedError


class BrokerNameLock:
    """An OS file lock that makes ``broker_name`` exclusive on a lake across processes.

    The kernel releases it when the holder dies (even by SIGKILL), so a crashed broker never
    blocks its own restart. Local file systems only.
    """

    def __init__(self, lake: str | Path, broker_name: str) -> None:
        self.path = Path(lake) / "_locks" / f"broker-{broker_name}.lock"
        self.broker_name = broker_name
        self.lake = lake
        self._handle: Any = None

    def acquire(self) -> BrokerNameLock:
        """Take the lock or fail at once.

        Raises:
            BrokerLockedError: another live process holds it (its pid@host is in the message).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise BrokerLockedError(
                f"broker_name={self.broker_name!r} is already running on lake {self.lake} "
                f"(held by {holder}); stop that broker or choose another broker_name"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}@{socket.gethostname()}\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> BrokerNameLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
