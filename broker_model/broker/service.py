"""A broker service that runs in rounds: one round at a time in a daemon thread, on the broker's
clock, attached to the broker so that its shutdown stops the service first."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from broker_model.broker.controller import Broker

_log = logging.getLogger(__name__)


class PeriodicService(ABC):
    """Runs :meth:`run_round` every ``interval_ms`` (the first after ``first_delay_ms``) from
    :meth:`start` until :meth:`stop`; a round that raises is logged, and the next one retries
    (a round leaves its progress exact when it fails)."""

    thread_name = "service"

    def __init__(self, broker: Broker, interval_ms: int, first_delay_ms: int | None = None) -> None:
        self.broker = broker
        self.interval_ms = interval_ms
        self.first_delay_ms = interval_ms if first_delay_ms is None else first_delay_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @abstractmethod
    def run_round(self, now: int) -> object:
        """One round at the broker's time ``now`` (epoch ms)."""

    def start(self) -> Self:
        """Start the rounds in a daemon thread; the broker's shutdown stops them."""
        self._stop.clear()
        self.broker.attach(self)
        name = f"{self.thread_name}-{self.broker.broker_name}"
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread after its current round (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        wait = self.first_delay_ms
        while not self._stop.wait(wait / 1000):
            wait = self.interval_ms
            try:
                self.run_round(self.broker.config.clock())
            except Exception:
                _log.exception("%s round failed on broker %s", type(self).__name__, self.broker.broker_name)
