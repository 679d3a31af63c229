"""Timing several threads that start together, for the send benchmarks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def run_timed(threads: int, work: Callable[[int], None]) -> float:
    """Seconds from the moment ``threads`` threads are released together until every one has
    returned from ``work(index)``."""
    gate = threading.Barrier(threads + 1)

    def body(index: int) -> None:
        gate.wait()
        work(index)

    workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    gate.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started
