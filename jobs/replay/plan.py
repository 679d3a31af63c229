"""Queue ranges of a replay, in pure Python: where each queue starts and ends, how its rows fall into
batches, where a restarted replay resumes, and the REPLAY_SOURCE coordinates of a replayed message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker_model.common import (
    QueueKey,
    select_queue_by_hash,
)
from jobs.replay.config import SOURCE_SEPARATOR, ReplayConfig


@dataclass(frozen=True)
class QueueRange:
    """One source queue of a run: the replay's first offset (pinned by its first progress row),
    the first offset this run replays, and the end (exclusive)."""

    broker_name: str
    topic: str
    queue_id: int
    first: int
    resume: int
    end: int

    @property
    def key(self) -> QueueKey:
        """(broker_name, topic, queue_id)."""
        return (self.broker_name, self.topic, self.queue_id)

    @property
    def pending(self) -> int:
        """Queue offsets left to replay."""
        return max(0, self.end - self.resume)

    def covered(self, batches: int, batch_rows: int) -> int:
        """The last offset the first ``batches`` batches of the run cover (``resume - 1`` for none)."""
        return min(self.end, self.resume + batches * batch_rows) - 1


@dataclass(frozen=True)
class QueueBounds:
    """What the source knows of a queue: its offsets ``[min_offset, max_offset)``, the first offsets
    stored at or after the time range's start and end (None: none is), a group's committed offset."""

    broker_name: str
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    time_start: int | None = None
    time_end: int | None = None
    committed: int | None = None

    @property
    def key(self) -> QueueKey:
        """(broker_name, topic, queue_id)."""
        return (self.broker_name, self.topic, self.queue_id)


@dataclass(frozen=True)
class Progress:
    """The ``replay_progress`` rows of a queue: the replay's first offset, the last offset
    replayed, the time of the latest row (epoch ms)."""

    first: int
    last: int
    updated_timestamp: int


def plan_ranges(
    bounds: Sequence[QueueBounds],
    config: ReplayConfig,
    progress: Mapping[QueueKey, Progress],
    sink_last: Mapping[QueueKey, int] | None = None,
) -> list[QueueRange]:
    """The queue ranges of a run, sorted by queue.

    The start of a queue is its progress's first offset when the replay has progress there; else
    ``from_offset`` (clamped to the queue), the time range's start, the group's committed offset
    (clamped), or the queue's first offset. The end is ``to_offset`` or the time range's end
    (clamped), else the queue's next offset. A run resumes after ``max(progress, sink_last)``.
    Deterministic; no I/O.
    """
    ranges = []
    for bound in sorted(bounds, key=lambda b: b.key):
        key = (bound.broker_name, bound.topic, bound.queue_id)
        start, end = _start_and_end(bound, config)
        known = progress.get(key)
        first = known.first if known is not None else start
        last = max(known.last if known is not None else first - 1, (sink_last or {}).get(key, first - 1))
        ranges.append(QueueRange(*key, first=first, resume=max(first, last + 1), end=max(end, first)))
    return ranges


def _start_and_end(bound: QueueBounds, config: ReplayConfig) -> tuple[int, int]:
    def clamp(value: int) -> int:
        return min(max(value, bound.min_offset), bound.max_offset)

    start, end = bound.min_offset, bound.max_offset
    if config.from_offset is not None:
        start = clamp(config.from_offset)
    if config.to_offset is not None:
        end = clamp(config.to_offset)
    if config.from_time is not None:
        start = bound.max_offset if bound.time_start is None else bound.time_start
    if config.to_time is not None:
        end = bound.max_offset if bound.time_end is None else bound.time_end
    if bound.committed is not None:
        start = clamp(bound.committed)
    return start, end


def batch_count(ranges: Sequence[QueueRange], batch_rows: int) -> int:
    """Batches needed for the longest queue of the run."""
    return max((-(-r.pending // batch_rows) for r in ranges), default=0)


def progress_after(ranges: Sequence[QueueRange], batches: int, batch_rows: int) -> dict[QueueKey, int]:
    """The last offset of every queue with something pending once ``batches`` batches are done."""
    return {r.key: r.covered(batches, batch_rows) for r in ranges if r.pending}


def parse_source(text: str) -> tuple[QueueKey, int] | None:
    """``broker/topic/queue_id/queue_offset`` (``REPLAY_SOURCE``) as (queue key, offset), or None."""
    parts = text.split(SOURCE_SEPARATOR)
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].lstrip("-").isdigit():
        return None
    return (parts[0], parts[1], int(parts[2])), int(parts[3])


def format_source(key: QueueKey, queue_offset: int) -> str:
    """The ``REPLAY_SOURCE`` value of a source message."""
    return SOURCE_SEPARATOR.join((key[0], key[1], str(key[2]), str(queue_offset)))


def select_queue_id(value: str | None, source_queue_id: int, queue_nums: int) -> int:
    """The target queue id: ``SelectMessageQueueByHash`` over ``value`` (Java hash of the string,
    remainder then absolute value), else ``source_queue_id`` modulo ``queue_nums``."""
    return source_queue_id % queue_nums if value is None else select_queue_by_hash(value, queue_nums)
