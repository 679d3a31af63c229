"""Replay into a user handler with orderly-consumer semantics: each queue's batches are delivered in
order from the driver, and a handler's status advances, retries or gives up on its queue.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from pyspark.sql import DataFrame, Row

from broker_model.client import ConsumeOrderlyStatus
from broker_model.common import (
    QUEUE_KEY,
    MessageQueue,
    QueueKey,
    decompress_body,
)
from broker_model.common import constants as c
from broker_model.store import MessageExt
from jobs.replay.config import REPLAYED_COLUMNS
from jobs.replay.plan import batch_count, plan_ranges, progress_after
from jobs.replay.progress import write_progress
from jobs.replay.report import REPLAYED_TYPES
from jobs.replay.source import build_source_rows
from jobs.replay.state import ReplayOutcome, ReplayRun, expected_rows, finish_report, ranges_df, start_replay
from jobs.runs import JobRun
from schemas.errors import ValidationError


@dataclass
class ReplayContext:
    """What a handler call gets besides the messages; it may set
    ``suspend_current_queue_time_millis`` (-1: 1000 ms) for a SUSPEND or ROLLBACK answer."""

    replay_id: str
    message_queue: MessageQueue
    batch: int
    attempt: int
    suspend_current_queue_time_millis: int = -1


ReplayHandler = Callable[[list[MessageExt], ReplayContext], Any]


def load_handler(spec: str) -> ReplayHandler:
    """The function named by ``module:function``.

    Raises:
        ValidationError: the module cannot be imported or has no such callable.
    """
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise ValidationError("--handler", spec, f"cannot import {module_name!r}: {err}", "check PYTHONPATH") from err
    handler = getattr(module, function_name, None)
    if not callable(handler):
        raise ValidationError("--handler", spec, f"module {module_name!r} has no function {function_name!r}")
    return cast(ReplayHandler, handler)


def status_of(answer: Any) -> ConsumeOrderlyStatus:
    """A handler's answer as a status: a status, or its name; anything else suspends the queue."""
    if isinstance(answer, ConsumeOrderlyStatus):
        return answer
    if isinstance(answer, str) and answer in ConsumeOrderlyStatus.__members__:
        return ConsumeOrderlyStatus[answer]
    return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


def suspend_seconds(context: ReplayContext) -> float:
    """The wait before a batch is delivered again: the context's time or 1000 ms, clamped to
    [10, 30000] ms as the orderly consumer does."""
    millis = (
        c.SUSPEND_CURRENT_QUEUE_TIME_MS
        if context.suspend_current_queue_time_millis == -1
        else (context.suspend_current_queue_time_millis)
    )
    return min(max(millis, c.SUSPEND_TIME_MIN_MS), c.SUSPEND_TIME_MAX_MS) / 1000


def deliver(
    handler: ReplayHandler, messages: list[MessageExt], replay_id: str, batch: int, max_attempts: int
) -> str | None:
    """Deliver one queue's batch until the handler advances; None on success, else why it failed
    after ``max_attempts`` deliveries (the last status or error)."""
    queue = MessageQueue(messages[0].broker_name, messages[0].topic, messages[0].queue_id)
    last = ""
    for attempt in range(1, max_attempts + 1):
        context = ReplayContext(replay_id, queue, batch, attempt)
        try:
            status = status_of(handler(list(messages), context))
            last = status.name
        except Exception as err:  # a failing handler suspends its queue, as an orderly listener does
            status, last = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT, f"{type(err).__name__}: {err}"
        if status in (ConsumeOrderlyStatus.SUCCESS, ConsumeOrderlyStatus.COMMIT):
            return None
        if attempt < max_attempts:
            time.sleep(suspend_seconds(context))
    return f"{max_attempts} deliveries of batch {batch} without SUCCESS or COMMIT (last: {last})"


def driver_batches(source_df: DataFrame) -> Iterator[tuple[int, dict[QueueKey, list[Row]]]]:
    """The rows of ``source_df`` (:func:`build_source_rows`) batch after batch, each batch's rows
    grouped by queue in queue offset order; partitions stream to the driver one at a time."""
    ordered_df = source_df.orderBy("replay_batch", *QUEUE_KEY, "queue_offset")
    current: int | None = None
    queues: dict[QueueKey, list[Row]] = {}
    for row in ordered_df.toLocalIterator(prefetchPartitions=True):
        if current is not None and row["replay_batch"] != current:
            yield current, queues
            queues = {}
        current = row["replay_batch"]
        queues.setdefault((row["broker_name"], row["topic"], row["queue_id"]), []).append(row)
    if current is not None:
        yield current, queues


def message_of(row: Row) -> MessageExt:
    """A source row as the message a handler receives (body decompressed)."""
    return MessageExt(
        broker_name=row["broker_name"],
        topic=row["topic"],
        queue_id=row["queue_id"],
        queue_offset=row["queue_offset"],
        commit_log_offset=row["commit_log_offset"],
        store_size=row["store_size"],
        body=decompress_body(bytes(row["body"]), row["sys_flag"]),
        flag=row["flag"],
        sys_flag=row["sys_flag"],
        properties=dict(row["properties"] or {}),
        born_timestamp=row["born_timestamp"],
        born_host=row["born_host"],
        store_timestamp=row["store_timestamp"],
        store_host=row["store_host"],
        reconsume_times=row["reconsume_times"],
        prepared_transaction_offset=0,
        body_crc=row["body_crc"],
        msg_id=row["msg_id"],
    )


def replay_to_handler(state: ReplayRun, job_run: JobRun, handler: ReplayHandler) -> ReplayOutcome:
    lake, config = state.lake, state.config
    ranges = plan_ranges(state.bounds, config, state.progress)
    start_replay(state, ranges)
    outcome = ReplayOutcome(batches=batch_count(ranges, config.batch_rows))
    delivered: list[tuple[str, str, int, int, int, int]] = []
    if outcome.batches:
        source_df = build_source_rows(
            state.records_df, ranges_df(lake.spark, ranges, 0), config.batch_rows, state.selection_df
        )
        written: dict[QueueKey, int] = {}
        workers = max(1, min(8, sum(1 for r in ranges if r.pending)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="replay-handler") as pool:
            for batch, queues in driver_batches(source_df):
                live = {key: rows for key, rows in queues.items() if key not in outcome.failed}
                futures = {
                    key: pool.submit(
                        deliver, handler, [message_of(r) for r in rows], config.replay_id, batch, config.max_attempts
                    )
                    for key, rows in live.items()
                }
                for key, future in futures.items():
                    failure = future.result()
                    if failure is not None:
                        outcome.failed[key] = failure
                        continue
                    sequence = len(delivered)
                    delivered += [(*key, row["queue_offset"], batch, sequence + i) for i, row in enumerate(live[key])]
                    outcome.rows += len(live[key])
                done = progress_after(ranges, batch + 1, config.batch_rows)
                fresh = {k: v for k, v in done.items() if k not in outcome.failed and written.get(k) != v}
                write_progress(lake, config.replay_id, fresh)
                written.update(fresh)
    replayed = pa.Table.from_arrays(
        [
            pa.array(column, kind)
            for column, kind in zip(
                zip(*delivered, strict=True) if delivered else [[]] * 6, REPLAYED_TYPES, strict=True
            )
        ],
        names=list(REPLAYED_COLUMNS),
    )
    return finish_report(state, job_run, [replayed], expected_rows(state, ranges, from_resume=True), outcome)
