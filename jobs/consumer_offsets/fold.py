"""The incremental ``consumer_offsets``: the previous table moved on to a later T by the offset commits
and consume-queue rows appended since, on the driver (no Spark job). The caller checks when this
gives the full run's table exactly (:func:`check_foldable`); see docs/jobs.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import RETRY_GROUP_TOPIC_PREFIX, GroupQueueKey, QueueKey
from jobs.consumer_offsets.transforms import QUEUE_NOT_FOUND
from jobs.lake import decoded
from jobs.runs import CannotFold
from schemas.catalog import CONSUME_QUEUE, OFFSET_COMMIT_COLUMNS

CQ_ROW_COLUMNS = ("broker_name", "topic", "queue_id", "queue_offset", "store_timestamp")
CQ_CODED_COLUMNS = ("broker_name", "topic")
"""The consume-queue columns the whole computation reads dictionary-encoded: it groups by them."""

OffsetLookup = Callable[[Mapping[QueueKey, set[int]]], dict[tuple[QueueKey, int], int]]
"""Store times of consume-queue rows at queue offsets (the earliest per offset; absent: no row)."""
TopicRead = Callable[[set[str]], pa.Table]
"""The :data:`CQ_ROW_COLUMNS` of every consume-queue row of the topics (at the run's version)."""


@dataclass(frozen=True)
class Previous:
    """The run moved on: its table rows, its T and the greatest input time it had read."""

    rows: list[dict[str, Any]]
    as_of: int
    through: int


def check_foldable(previous: Previous, as_of: int, new_commits: pa.Table) -> None:
    """Refuse to move the previous table on to ``as_of`` unless that gives the full run's table.

    Exact when every input row the previous run read counted at its T (``through <= as_of`` of
    that run: none was waiting for a later T), the new T is not earlier, and every new commit
    comes after that T (so it is later than each commit already counted for its key).

    Raises:
        CannotFold: why it is not exact.
    """
    if as_of < previous.as_of:
        raise CannotFold(f"as_of {as_of} is before the previous run's {previous.as_of}")
    if previous.through > previous.as_of:
        raise CannotFold(f"the previous run read rows stored after its as_of ({previous.through} > {previous.as_of})")
    if new_commits.num_rows:
        first = pc.min(new_commits["commit_timestamp"]).as_py()
        if first <= previous.as_of:
            raise CannotFold(f"a new offset commit is timed {first}, not after the previous as_of {previous.as_of}")


def latest_time(*tables: tuple[pa.Table, str]) -> int | None:
    """The greatest value of the named time column over the tables, None when all are empty."""
    times = [pc.max(table[column]).as_py() for table, column in tables if table.num_rows]
    return max(times) if times else None


def fold(
    previous: Previous,
    as_of: int,
    new_commits: pa.Table,
    new_cq_rows: pa.Table,
    read_topics: TopicRead,
    lookup: OffsetLookup,
    configured: Collection[QueueKey] = (),
) -> list[dict[str, Any]]:
    """The ``consumer_offsets`` rows as of ``as_of``: ``previous`` moved on by ``new_commits``
    (:data:`OFFSET_COMMIT_COLUMNS`) and ``new_cq_rows`` (:data:`CQ_ROW_COLUMNS`), the rows appended to the
    inputs since, with ``configured`` (:func:`configured_queues` at ``as_of``) the queues an empty
    queue may be. When :func:`check_foldable` holds, equal to the full run's rows.

    Reads old consume-queue rows only where the previous table cannot tell: every row of a topic
    a group subscribes to for the first time (``read_topics``), and the store times at the offsets
    a moved commit points at inside the old rows (``lookup``).
    """
    current: dict[GroupQueueKey, int] = {}
    bounds: dict[QueueKey, tuple[int, int]] = {}
    known: dict[tuple[QueueKey, int], int | None] = {}
    for row in previous.rows:
        key, queue = _keys(row)
        offset, low, high = row["consumer_offset"], row["broker_min_offset"], row["broker_offset"]
        if offset is not None:
            current[key] = offset
            known[(queue, offset - 1)] = row["last_timestamp"]
        if high:  # an empty queue (0) had no row: it is one again only if still configured at as_of
            bounds[queue] = (low, high)
            if (offset or 0) < high:
                known[(queue, max(offset or 0, low))] = row["oldest_unconsumed_timestamp"]
    old_bounds = dict(bounds)
    known_topics = _subscribed_topics(current)

    current.update(_latest_commits(new_commits.filter(pc.field("commit_timestamp") <= as_of)))
    new_rows = stored_by(new_cq_rows, as_of)
    new_times = _earliest_times(new_rows)
    for queue, (low, high) in _queue_bounds(new_rows).items():
        if queue in bounds:
            bounds[queue] = (min(low, bounds[queue][0]), max(high, bounds[queue][1]))
        elif queue[1] in known_topics:
            bounds[queue] = (low, high)

    read_whole: dict[tuple[QueueKey, int], int] = {}
    first_topics = _subscribed_topics(current) - known_topics
    if first_topics:
        whole = stored_by(read_topics(first_topics), as_of)
        bounds.update(_queue_bounds(whole))
        read_whole = _earliest_times(whole)
    _add_empty_queues(bounds, configured)

    listed = _listed(current, bounds)
    wanted: dict[QueueKey, set[int]] = {}

    def needs(queue: QueueKey, offset: int) -> None:
        if queue[1] not in first_topics and _old(queue, offset, old_bounds, known) is _UNKNOWN:
            wanted.setdefault(queue, set()).add(offset)

    for key in listed:
        for offset in _looked_up_offsets(current.get(key), bounds.get(key[1:])):
            if offset is not None:
                needs(key[1:], offset)
    looked_up = lookup(wanted) if wanted else {}

    def time_at(queue: QueueKey, offset: int) -> int | None:
        if queue[1] in first_topics:
            return read_whole.get((queue, offset))
        if queue in wanted and offset in wanted[queue]:
            return looked_up.get((queue, offset))
        old = _old(queue, offset, old_bounds, known)
        return _earliest(old if isinstance(old, int) else None, new_times.get((queue, offset)))

    return [_row(key, current.get(key), bounds.get(key[1:]), time_at, as_of) for key in sorted(listed)]


def row_times_at(rows: pa.Table, wanted: Mapping[QueueKey, set[int]]) -> dict[tuple[QueueKey, int], int]:
    """Per (queue, offset) of ``wanted`` that consume-queue ``rows`` (:data:`CQ_ROW_COLUMNS`) hold,
    the earliest store time there."""
    names = ["broker_name", "topic", "queue_id", "queue_offset"]
    key_schema = pa.schema([CONSUME_QUEUE.arrow_schema.field(name) for name in names])
    pairs = [dict(zip(names, (*queue, offset), strict=True)) for queue, offsets in wanted.items() for offset in offsets]
    if not rows.num_rows or not pairs:
        return {}
    return _earliest_times(rows.join(pa.Table.from_pylist(pairs, schema=key_schema), keys=names, join_type="inner"))


def compute(
    as_of: int,
    commits: pa.Table,
    cq_rows: pa.Table | Iterable[pa.Table],
    configured: Collection[QueueKey] = (),
) -> list[dict[str, Any]]:
    """The ``consumer_offsets`` rows as of ``as_of`` from every offset commit (:data:`OFFSET_COMMIT_COLUMNS`)
    and every consume-queue row (:data:`CQ_ROW_COLUMNS`, one table or chunks of it) of the topics
    the groups subscribe to, with ``configured`` (:func:`configured_queues` at ``as_of``) the
    queues an empty queue may be, with Arrow on the driver: the rows
    :func:`jobs.consumer_offsets.transforms.build_consumer_offsets` gives with Spark.

    One pass over the chunks, holding one at a time: per queue, its least and greatest offsets
    and the store time at the least, and the store times at the offsets a commit points at
    (``offset - 1`` and ``offset``): every time a row can show (:func:`_looked_up_offsets`)."""
    current = _current_offsets(commits.filter(pc.field("commit_timestamp") <= as_of))
    names = ["broker_name", "topic", "queue_id", "queue_offset"]
    key_schema = CONSUME_QUEUE.arrow_schema
    key_schema = pa.schema([key_schema.field(name) for name in names])
    pointed = {(*key[1:], offset + step) for key, offset in current.items() for step in (-1, 0)}
    pairs = pa.Table.from_pylist([dict(zip(names, pair, strict=True)) for pair in pointed], schema=key_schema)
    lows: dict[QueueKey, tuple[int, int | None]] = {}  # queue -> (least offset, earliest store time there)
    highs: dict[QueueKey, int] = {}
    times: dict[tuple[QueueKey, int], int] = {}
    for chunk in [cq_rows] if isinstance(cq_rows, pa.Table) else cq_rows:
        rows = stored_by(chunk, as_of)
        if not rows.num_rows:
            continue
        for queue, (low, high) in _queue_bounds(rows).items():
            highs[queue] = max(high, highs.get(queue, high))
            if queue not in lows or low <= lows[queue][0]:
                earlier = lows[queue][1] if queue in lows and lows[queue][0] == low else None
                lows[queue] = (low, earlier)
        # one join for both: the rows at each queue's least offset, and those a commit points at;
        # first the rows at any of those offsets (one integer column), then the join on their few
        least = {(*queue, low) for queue, (low, _) in lows.items()} - pointed
        wanted = pa.concat_tables(
            [pairs, pa.Table.from_pylist([dict(zip(names, key, strict=True)) for key in least], schema=key_schema)]
        )
        near = decoded(_at_offsets(rows, set(wanted["queue_offset"].to_pylist())))
        for (queue, offset), at in _earliest_times(near.join(wanted, keys=names, join_type="inner")).items():
            low, seen = lows[queue]
            if offset == low:
                lows[queue] = (low, _earliest(seen, at))
            if (*queue, offset) in pointed:
                times[(queue, offset)] = min(times[(queue, offset)], at) if (queue, offset) in times else at
    bounds = {queue: (low, highs[queue]) for queue, (low, _) in lows.items()}
    _add_empty_queues(bounds, configured)

    def time_at(queue: QueueKey, offset: int) -> int | None:
        low, at = lows.get(queue, (None, None))
        return at if offset == low else times.get((queue, offset))

    listed = sorted(_listed(current, bounds))
    return [_row(key, current.get(key), bounds.get(key[1:]), time_at, as_of) for key in listed]


def stored_by(rows: pa.Table, as_of: int) -> pa.Table:
    """The consume-queue ``rows`` stored at or before ``as_of``: ``rows`` themselves when all are (a
    nightly's T is after every row: no copy of the columns). ``store_timestamp`` holds no null
    (the catalog's), so both ways keep the same rows."""
    newest = pc.max(rows.column("store_timestamp")).as_py() if rows.num_rows else None
    if newest is not None and newest <= as_of:
        return rows
    return rows.filter(pc.field("store_timestamp") <= as_of)


def configured_queues(topic_config: pa.Table, as_of: int) -> set[QueueKey]:
    """The queues the topic configuration knows at ``as_of`` from ``topic_config`` rows (at least
    ``broker_name``, ``topic``, ``queue_nums``, ``updated_timestamp``): queue ids ``0 ..
    queue_nums - 1`` of each (broker, topic)'s latest row at or before ``as_of`` (the greatest
    ``updated_timestamp``, then ``queue_nums``), as
    :func:`jobs.consumer_offsets.transforms.build_configured_queues`."""
    latest: dict[tuple[str, str], tuple[int, int]] = {}
    columns = ["broker_name", "topic", "queue_nums", "updated_timestamp"]
    for row in topic_config.select(columns).filter(pc.field("updated_timestamp") <= as_of).to_pylist():
        key, order = (row["broker_name"], row["topic"]), (row["updated_timestamp"], row["queue_nums"])
        latest[key] = max(order, latest.get(key, order))
    return {(broker, topic, queue_id) for (broker, topic), (_, n) in latest.items() for queue_id in range(n)}


def _add_empty_queues(bounds: dict[QueueKey, tuple[int, int]], configured: Iterable[QueueKey]) -> None:
    """Give each configured queue without consume-queue rows the bounds of an empty queue: RocketMQ's
    min and max offsets 0."""
    for queue in configured:
        bounds.setdefault(queue, (0, 0))


def _current_offsets(commits: pa.Table) -> dict[GroupQueueKey, int]:
    """:func:`_latest_commits` with Arrow: the commits sorted by the order of
    :func:`jobs.rules.build_current_offsets`, the last of each key taken (a group-by on one thread
    sees the rows in their order)."""
    if not commits.num_rows:
        return {}
    keys = ["group", "broker_name", "topic", "queue_id"]
    ordered = commits.select(list(OFFSET_COMMIT_COLUMNS)).append_column(
        "is_reset", pc.fill_null(pc.equal(commits["source"], "reset"), False)
    )
    ordered = ordered.sort_by([(k, "ascending") for k in ("commit_timestamp", "is_reset", "offset", "source")])
    latest = ordered.group_by(keys, use_threads=False).aggregate([("offset", "last")])
    return {(r["group"], r["broker_name"], r["topic"], r["queue_id"]): r["offset_last"] for r in latest.to_pylist()}


def subscribed_topics(commits: pa.Table, as_of: int) -> set[str]:
    """The topics the groups with commits at or before ``as_of`` subscribe to: their committed
    topics and their retry topics."""
    counted = commits.filter(pc.field("commit_timestamp") <= as_of)
    groups = pc.unique(counted["group"]).to_pylist()
    return set(pc.unique(counted["topic"]).to_pylist()) | {RETRY_GROUP_TOPIC_PREFIX + g for g in groups}


class _Unknown:
    """The old rows were not read at that offset."""


_UNKNOWN = _Unknown()


def _old(
    queue: QueueKey,
    offset: int,
    old_bounds: Mapping[QueueKey, tuple[int, int]],
    known: Mapping[tuple[QueueKey, int], int | None],
) -> int | _Unknown | None:
    """The store time of the old row at ``offset`` of ``queue`` as the previous table tells, None
    when there is none, :data:`_UNKNOWN` when only a read can tell."""
    if queue not in old_bounds:
        return None  # a queue of a subscribed topic missing from the previous table had no row
    low, high = old_bounds[queue]
    if offset < low or offset >= high:
        return None
    return known.get((queue, offset), _UNKNOWN)


def _looked_up_offsets(offset: int | None, bound: tuple[int, int] | None) -> tuple[int | None, int | None]:
    """The queue offsets whose store times a row shows: the last consumed one (``offset - 1``),
    and the first unconsumed one when the group is behind (from the queue's first row on)."""
    last = None if offset is None else offset - 1
    oldest = None
    if bound is not None and (offset or 0) < bound[1]:
        oldest = max(offset or 0, bound[0])
    return last, oldest


def _row(
    key: GroupQueueKey,
    offset: int | None,
    bound: tuple[int, int] | None,
    time_at: Callable[[QueueKey, int], int | None],
    as_of: int,
) -> dict[str, Any]:
    queue = key[1:]
    counted = offset or 0
    low, high = bound if bound is not None else (None, None)
    last_offset, oldest_offset = _looked_up_offsets(offset, bound)
    return {
        "group": key[0],
        "broker_name": key[1],
        "topic": key[2],
        "queue_id": key[3],
        "consumer_offset": offset,
        "broker_min_offset": low,
        "broker_offset": high,
        "diff": None if high is None else high - counted,
        "last_timestamp": None if last_offset is None else time_at(queue, last_offset),
        "oldest_unconsumed_timestamp": None if oldest_offset is None else time_at(queue, oldest_offset),
        "as_of": as_of,
        "anomaly": QUEUE_NOT_FOUND if high is None else None,
    }


def _keys(row: Mapping[str, Any]) -> tuple[GroupQueueKey, QueueKey]:
    queue = (row["broker_name"], row["topic"], row["queue_id"])
    return (row["group"], *queue), queue


def _subscriptions(current: Iterable[GroupQueueKey]) -> set[tuple[str, str]]:
    """(group, topic) of the committed keys, and each committing group's retry topic."""
    keys = list(current)
    return {(key[0], key[2]) for key in keys} | {(key[0], RETRY_GROUP_TOPIC_PREFIX + key[0]) for key in keys}


def _subscribed_topics(current: Iterable[GroupQueueKey]) -> set[str]:
    return {topic for _, topic in _subscriptions(current)}


def _listed(current: Mapping[GroupQueueKey, int], bounds: Mapping[QueueKey, tuple[int, int]]) -> set[GroupQueueKey]:
    """The committed keys plus, per group, every queue of its topics and the queues of its retry
    topic that hold rows (an empty queue's end is 0), as
    :func:`jobs.consumer_offsets.transforms.build_listed_queues`."""
    queues_of: dict[str, list[QueueKey]] = {}
    for queue in bounds:
        queues_of.setdefault(queue[1], []).append(queue)
    listed = set(current)
    committed = {(key[0], key[2]) for key in current}
    for group, topic in _subscriptions(current):
        held_only = (group, topic) not in committed  # the retry topic of a group that never committed on it
        listed.update((group, *queue) for queue in queues_of.get(topic, ()) if not held_only or bounds[queue][1] > 0)
    return listed


def _latest_commits(commits: pa.Table) -> dict[GroupQueueKey, int]:
    """Per key, the offset of the latest commit in :func:`jobs.rules.build_current_offsets`' order."""
    latest: dict[GroupQueueKey, tuple[int, bool, int, str]] = {}
    for row in commits.select(list(OFFSET_COMMIT_COLUMNS)).to_pylist():
        key = (row["group"], row["broker_name"], row["topic"], row["queue_id"])
        order = (row["commit_timestamp"], row["source"] == "reset", row["offset"], row["source"])
        if key not in latest or order > latest[key]:
            latest[key] = order
    return {key: order[2] for key, order in latest.items()}


def _queue_bounds(rows: pa.Table) -> dict[QueueKey, tuple[int, int]]:
    """Per queue of consume-queue ``rows``, (smallest queue offset, greatest plus one)."""
    if not rows.num_rows:
        return {}
    grouped = rows.group_by(["broker_name", "topic", "queue_id"]).aggregate([("queue_offset", "min_max")])
    return {
        (r["broker_name"], r["topic"], r["queue_id"]): (
            r["queue_offset_min_max"]["min"],
            r["queue_offset_min_max"]["max"] + 1,
        )
        for r in grouped.to_pylist()
    }


def _at_offsets(rows: pa.Table, offsets: set[int]) -> pa.Table:
    """The ``rows`` whose ``queue_offset`` is one of ``offsets`` (a few, of any queue): through a
    bitmap over the offsets' span when it is at most :data:`_BITMAP_SPAN` (one lookup per row, about
    a third of a hash set's cost), else through a hash set."""
    if not offsets:
        return rows.slice(0, 0)
    low, span = min(offsets), max(offsets) - min(offsets) + 1
    if span > _BITMAP_SPAN:
        return rows.filter(pc.is_in(rows["queue_offset"], value_set=pa.array(sorted(offsets), pa.int64())))
    # slot 0 answers for every offset below the span, the last slot for every offset above it
    wanted = np.zeros(span + 2, dtype=bool)
    wanted[np.fromiter(offsets, np.int64, len(offsets)) - (low - 1)] = True
    slots = rows.column("queue_offset").to_numpy() - (low - 1)
    return rows.filter(pa.array(np.take(wanted, slots, mode="clip")))


_BITMAP_SPAN = 1 << 24
"""Offsets' span up to which :func:`_at_offsets` looks them up in a bitmap (one byte per offset)."""


def _earliest_times(rows: pa.Table) -> dict[tuple[QueueKey, int], int]:
    """Per (queue, queue offset) of consume-queue ``rows``, the earliest store time."""
    if not rows.num_rows:
        return {}
    grouped = rows.group_by(["broker_name", "topic", "queue_id", "queue_offset"]).aggregate(
        [("store_timestamp", "min")]
    )
    return {
        ((r["broker_name"], r["topic"], r["queue_id"]), r["queue_offset"]): r["store_timestamp_min"]
        for r in grouped.to_pylist()
    }


def _earliest(*times: int | None) -> int | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None
