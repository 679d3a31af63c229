"""Replay into a broker topic: the job runs the target brokers itself and stores each message with
REPLAY_ID and REPLAY_SOURCE, by which a restarted run finds what was already sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import Row

from broker_model.broker import Broker, BrokerConfig, InnerMessage, start_lake_brokers
from broker_model.common import (
    QueueKey,
)
from jobs.replay.config import (
    DROPPED_PROPERTIES,
    KEPT_SYS_FLAG,
    REPLAY_ID_PROPERTY,
    REPLAY_SOURCE_PROPERTY,
    TAIL_SCAN_MARGIN_MS,
)
from jobs.replay.handler import driver_batches
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
from jobs.replay.progress import write_progress
from jobs.replay.report import build_replayed_from_topic
from jobs.replay.source import build_source_rows
from jobs.replay.state import ReplayOutcome, ReplayRun, expected_rows, finish_report, ranges_df, start_replay
from jobs.runs import JobRun
from schemas.catalog import (
    COMMITLOG,
)
from schemas.errors import BrokerLockedError


def replay_to_topic(state: ReplayRun, job_run: JobRun, to_topic: str) -> ReplayOutcome:
    lake, config = state.lake, state.config
    targets = {b.broker_name: config.to_broker or b.broker_name for b in state.bounds}
    brokers = _start_brokers(config.lake, sorted(set(targets.values())))
    try:
        queue_nums = _prepare_target_topic(brokers, state.bounds, targets, to_topic, config.selector_property)
        probe = plan_ranges(state.bounds, config, state.progress)
        found = find_replayed(
            brokers,
            probe,
            targets,
            to_topic,
            config.replay_id,
            state.progress,
            queue_nums,
            config.selector_property is not None,
        )
        ranges = plan_ranges(state.bounds, config, state.progress, found)
        start_replay(state, ranges)
        outcome = ReplayOutcome(batches=batch_count(ranges, config.batch_rows))
        if outcome.batches:
            source_df = build_source_rows(
                state.records_df, ranges_df(lake.spark, ranges, 0), config.batch_rows, state.selection_df
            )
            for batch, queues in driver_batches(source_df):
                for key, rows in queues.items():
                    broker = brokers[targets[key[0]]]
                    for row in rows:
                        broker.put_message(
                            target_message(
                                row,
                                to_topic,
                                config.replay_id,
                                config.selector_property,
                                queue_nums[broker.broker_name],
                            )
                        )
                    outcome.rows += len(rows)
                for broker in brokers.values():
                    broker.flush()
                write_progress(lake, config.replay_id, progress_after(ranges, batch + 1, config.batch_rows))
            job_run.output_versions[COMMITLOG.name] = lake.version(COMMITLOG) or 0
    finally:
        for broker in brokers.values():
            broker.shutdown()
    log_df = lake.read(COMMITLOG, partition_filter={"broker_name": sorted(set(targets.values()))})
    replayed = build_replayed_from_topic(log_df, config.replay_id, to_topic).toArrow()
    return finish_report(state, job_run, [replayed], expected_rows(state, ranges, from_resume=False), outcome)


def _start_brokers(root: Path, names: Sequence[str]) -> dict[str, Broker]:
    """Start a broker for each target name, with the store host it had before (msg ids stay)."""
    try:
        return start_lake_brokers(root, names, flush_mode=BrokerConfig.flush_mode, new_ok=True)
    except BrokerLockedError as err:
        raise BrokerLockedError(
            f"the topic sink writes through its own brokers, but {err}; or replay into a Delta "
            "table (--to-table) and send from there"
        ) from err


def _prepare_target_topic(
    brokers: Mapping[str, Broker],
    bounds: Sequence[QueueBounds],
    targets: Mapping[str, str],
    to_topic: str,
    selector_property: str | None,
) -> dict[str, int]:
    """Create (or, for same queue ids, grow) the target topic on every target broker; its queue
    count per broker."""
    needed: dict[str, int] = {}
    for bound in bounds:
        name = targets[bound.broker_name]
        needed[name] = max(needed.get(name, 1), bound.queue_id + 1)
    counts = {}
    for name, broker in brokers.items():
        existing = broker.queue_nums(to_topic)
        if existing is None or (selector_property is None and existing < needed.get(name, 1)):
            broker.create_topic(to_topic, max(existing or 0, needed.get(name, 1)))
        counts[name] = broker.queue_nums(to_topic) or 1
    return counts


def target_message(
    row: Row, to_topic: str, replay_id: str, selector_property: str | None, queue_nums: int
) -> InnerMessage:
    """The message a broker sink stores for a source row: stored body, flag and compression bits,
    properties without delay and transaction markers plus ``REPLAY_ID`` and ``REPLAY_SOURCE``."""
    properties = {k: v for k, v in (row["properties"] or {}).items() if k not in DROPPED_PROPERTIES}
    key = (row["broker_name"], row["topic"], row["queue_id"])
    properties[REPLAY_ID_PROPERTY] = replay_id
    properties[REPLAY_SOURCE_PROPERTY] = format_source(key, row["queue_offset"])
    queue_id = (
        row["queue_id"]
        if selector_property is None
        else select_queue_id(properties.get(selector_property), row["queue_id"], queue_nums)
    )
    return InnerMessage(
        topic=to_topic,
        queue_id=queue_id,
        body=bytes(row["body"]),
        properties=properties,
        flag=row["flag"],
        sys_flag=row["sys_flag"] & KEPT_SYS_FLAG,
        born_timestamp=row["born_timestamp"],
        born_host=row["born_host"],
    )


def find_replayed(
    brokers: Mapping[str, Broker],
    ranges: Sequence[QueueRange],
    targets: Mapping[str, str],
    to_topic: str,
    replay_id: str,
    progress: Mapping[QueueKey, Progress],
    queue_nums: Mapping[str, int],
    selector: bool,
) -> dict[QueueKey, int]:
    """The last source offset per source queue that the target queues already hold for
    ``replay_id``, read from each target queue's messages stored since the source queues' last
    progress row (less :data:`TAIL_SCAN_MARGIN_MS`). Queues without progress were never sent."""
    since: dict[str, int] = {}
    wanted: dict[str, set[int]] = {}
    for r in ranges:
        known = progress.get(r.key)
        if known is None:
            continue
        name = targets[r.broker_name]
        since[name] = min(since.get(name, known.updated_timestamp), known.updated_timestamp)
        ids = range(queue_nums[name]) if selector else [r.queue_id]
        wanted.setdefault(name, set()).update(ids)
    found: dict[QueueKey, int] = {}
    for name, queue_ids in wanted.items():
        store = brokers[name].store
        for queue_id in sorted(queue_ids):
            start = store.offset_by_time(to_topic, queue_id, since[name] - TAIL_SCAN_MARGIN_MS)
            for offset in range(start, store.max_offset(to_topic, queue_id)):
                message = store.message_at(to_topic, queue_id, offset, decompress=False)
                if message is None or message.properties.get(REPLAY_ID_PROPERTY) != replay_id:
                    continue
                source = parse_source(message.properties.get(REPLAY_SOURCE_PROPERTY, ""))
                if source is not None:
                    found[source[0]] = max(found.get(source[0], -1), source[1])
    return found
