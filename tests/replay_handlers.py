"""Handlers for the replay_ordered tests (``--handler tests.replay_handlers:<function>``).

``record`` is an exactly-once handler as the job's docstring describes: it appends
``broker topic queue_id queue_offset`` lines to the file named by ``REPLAY_TEST_OUT`` and skips
the messages whose offset is not above the last one it recorded for their queue (the file is
the handler's own store, read once per process). ``REPLAY_TEST_SLEEP_MS`` makes each call
sleep, so that a test can kill the job between two calls. Both variables are read here only.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from broker_model.client import ConsumeOrderlyStatus
from broker_model.store import MessageExt
from jobs.replay import ReplayContext

_lock = threading.Lock()
_last: dict[tuple[str, str, int], int] | None = None
_calls: dict[tuple[str, str, int], int] = {}


def _recorded(out: Path) -> dict[tuple[str, str, int], int]:
    last: dict[tuple[str, str, int], int] = {}
    if out.exists():
        for line in out.read_text().splitlines():
            broker, topic, queue_id, offset = line.split()
            key = (broker, topic, int(queue_id))
            last[key] = max(last.get(key, -1), int(offset))
    return last


def record(messages: list[MessageExt], context: ReplayContext) -> ConsumeOrderlyStatus:
    """Record each message once, in the order given; SUCCESS."""
    global _last
    time.sleep(int(os.environ.get("REPLAY_TEST_SLEEP_MS", "0")) / 1000)
    out = Path(os.environ["REPLAY_TEST_OUT"])
    with _lock:
        if _last is None:
            _last = _recorded(out)
        lines = []
        for message in messages:
            key = (message.broker_name, message.topic, message.queue_id)
            if message.queue_offset > _last.get(key, -1):
                lines.append(f"{message.broker_name} {message.topic} {message.queue_id} {message.queue_offset}\n")
                _last[key] = message.queue_offset
        with out.open("a") as handle:
            handle.writelines(lines)
            handle.flush()
            os.fsync(handle.fileno())
    return ConsumeOrderlyStatus.SUCCESS


def reset() -> None:
    """Forget what this process recorded (a new test, a new file)."""
    global _last
    with _lock:
        _last = None
        _calls.clear()


def stubborn(messages: list[MessageExt], context: ReplayContext) -> ConsumeOrderlyStatus:
    """Queue 0 is suspended every time, queue 1 rolls back its first delivery of every batch;
    the other queues are recorded as :func:`record` does."""
    context.suspend_current_queue_time_millis = 10
    queue = context.message_queue
    if queue.queue_id == 0:
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
    if queue.queue_id == 1 and context.attempt == 1:
        return ConsumeOrderlyStatus.ROLLBACK
    return record(messages, context)
