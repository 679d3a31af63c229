"""The ``replay_ordered`` job: message queues replayed strictly in queue order, queues in parallel, into a
Delta table, a broker topic or a handler, restartable exactly once (see docs/jobs.md).

Besides the job package's roles (docs/jobs.md, "How a job package is laid out"): ``config`` (the
options and their checks), ``source`` (the records to replay), ``plan`` (queue bounds and batches),
``state`` and ``progress`` (where each queue stands, ``replay_progress``), the sinks
``table_sink``, ``topic_sink`` and ``handler``, and ``report`` (the ordering report).
"""

from __future__ import annotations

from jobs.replay.config import MESSAGE_COLUMNS, REPLAYED_COLUMNS, ReplayConfig, TopicQueues, build_config, sink_spec
from jobs.replay.handler import ReplayContext, deliver
from jobs.replay.job import main, run
from jobs.replay.plan import (
    Progress,
    QueueBounds,
    QueueRange,
    batch_count,
    format_source,
    parse_source,
    plan_ranges,
    progress_after,
    select_queue_id,
)
from jobs.replay.progress import read_progress, write_progress
from jobs.replay.report import build_ordering_report, running_hash
from jobs.replay.source import (
    SUMMARY_COLUMNS,
    build_dlq_selection,
    build_source_rows,
    filter_source_records,
    merge_queue_bounds,
    queues_out_of_log_order,
    summarize_source,
)

__all__ = [
    "MESSAGE_COLUMNS",
    "REPLAYED_COLUMNS",
    "SUMMARY_COLUMNS",
    "Progress",
    "QueueBounds",
    "QueueRange",
    "ReplayConfig",
    "ReplayContext",
    "TopicQueues",
    "batch_count",
    "build_config",
    "build_dlq_selection",
    "build_ordering_report",
    "build_source_rows",
    "deliver",
    "filter_source_records",
    "format_source",
    "main",
    "merge_queue_bounds",
    "parse_source",
    "plan_ranges",
    "progress_after",
    "queues_out_of_log_order",
    "read_progress",
    "run",
    "running_hash",
    "select_queue_id",
    "sink_spec",
    "summarize_source",
    "write_progress",
]
