"""The ``consumer_offsets`` job: committed offsets and lag per consumer group and queue as of a time
T (RocketMQ's ``mqadmin consumerProgress`` figures), from ``consumer_offset_commits`` and
``consume_queue`` (``topic_config`` for the empty queues), moved on incrementally when it can be (see docs/jobs.md).
"""

from __future__ import annotations

from jobs.consumer_offsets.fold import Previous, check_foldable, configured_queues, fold
from jobs.consumer_offsets.job import (
    ConsumerOffsetsConfig,
    build_config,
    build_parser,
    format_progress,
    main,
    run,
)
from jobs.consumer_offsets.transforms import (
    QUEUE_NOT_FOUND,
    build_configured_queues,
    build_consumer_offsets,
    build_listed_queues,
    build_queue_bounds,
    filter_cq_rows_as_of,
    union_empty_queues,
)

__all__ = [
    "QUEUE_NOT_FOUND",
    "ConsumerOffsetsConfig",
    "Previous",
    "build_config",
    "build_configured_queues",
    "build_consumer_offsets",
    "build_listed_queues",
    "build_parser",
    "build_queue_bounds",
    "check_foldable",
    "configured_queues",
    "filter_cq_rows_as_of",
    "fold",
    "format_progress",
    "main",
    "run",
    "union_empty_queues",
]
