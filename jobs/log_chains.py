"""Continuity of consume queues and broker logs, checked on the driver with numpy, part by part
(a data file, a chunk of consecutive files, an increment: each a range of every queue and broker
it touches): each queue's rows and each broker's records must follow one another. Used by
``rebuild_consume_queue`` and by the replay's log order check. See docs/jobs.md (Log chains).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import QUEUE_KEY, QueueKey, dispatched_mask
from broker_model.common import constants as c

# the commit log columns a part needs
CHAIN_COLUMNS = (*QUEUE_KEY, "queue_offset", "commit_log_offset", "store_size", "sys_flag", "segment")


@dataclass(frozen=True)
class Run:
    """Consecutive elements of one queue or broker within one part, in order: ``first`` and
    ``last`` are ``(queue_offset, commit_log_offset)`` for a queue, ``(commit_log_offset,
    store_size, segment)`` for a broker; ``clean`` says every neighbour inside followed the one
    before; ``count`` is the number of elements; ``context`` marks elements checked before."""

    first: tuple[int, ...]
    last: tuple[int, ...]
    clean: bool
    count: int
    context: bool = False


@dataclass
class Chains:
    """The runs of every queue and broker seen so far, and the verdict on each."""

    segment_sizes: Mapping[str, int] = field(default_factory=dict)
    queues: dict[QueueKey, list[Run]] = field(default_factory=dict)
    logs: dict[str, list[Run]] = field(default_factory=dict)

    def add_part(self, rows: pa.Table) -> None:
        """Check the commit log ``rows`` of one part (:data:`CHAIN_COLUMNS`) and keep their runs."""
        if rows.num_rows == 0:
            return
        cq_rows = rows.filter(dispatched_mask(rows["sys_flag"]))
        for key, run in _queue_runs(cq_rows):
            self.queues.setdefault(key, []).append(run)
        for broker, run in _log_runs(rows, self.segment_sizes):
            self.logs.setdefault(broker, []).append(run)

    def add_context(
        self, queue_tails: Mapping[QueueKey, tuple[int, int]], log_tails: Mapping[str, tuple[int, int, int]]
    ) -> None:
        """Elements checked by an earlier run, each a context run of its own: per queue its
        ``(queue_offset, commit_log_offset)``, per broker its ``(commit_log_offset, store_size, segment)``."""
        for key, cq_row in queue_tails.items():
            self.queues.setdefault(key, []).append(Run(cq_row, cq_row, True, 1, context=True))
        for broker, record in log_tails.items():
            self.logs.setdefault(broker, []).append(Run(record, record, True, 1, context=True))

    def add_context_rows(self, queue_rows: pa.Table | None, log_rows: pa.Table | None) -> None:
        """Consume-queue rows (``broker_name, topic, queue_id, queue_offset, commit_log_offset``) and records
        (``broker_name, segment, commit_log_offset, store_size``) checked by an earlier run, as
        :meth:`add_context`: every element is a context run of its own."""
        queue_tails: dict[QueueKey, list[tuple[int, int]]] = {}
        for r in [] if queue_rows is None else queue_rows.to_pylist():
            key = (r["broker_name"], r["topic"], r["queue_id"])
            queue_tails.setdefault(key, []).append((r["queue_offset"], r["commit_log_offset"]))
        for key, cq_rows in queue_tails.items():
            self.queues.setdefault(key, []).extend(Run(u, u, True, 1, context=True) for u in cq_rows)
        for r in [] if log_rows is None else log_rows.to_pylist():
            record = (r["commit_log_offset"], r["store_size"], r["segment"])
            self.logs.setdefault(r["broker_name"], []).append(Run(record, record, True, 1, context=True))

    def suspect_queues(self) -> list[QueueKey]:
        """The queues whose consume-queue rows might not hold offsets 0, 1, 2, ... with rising commit log offsets."""
        return sorted(key for key, runs in self.queues.items() if not _queue_chain_holds(runs))

    def suspect_brokers(self) -> list[str]:
        """The brokers whose records might not each lead to the next."""
        return sorted(
            broker
            for broker, runs in self.logs.items()
            if not _log_chain_holds(runs, self.segment_sizes.get(broker, c.DEFAULT_SEGMENT_SIZE))
        )

    def queue_tails(self) -> dict[QueueKey, tuple[int, int]]:
        """Per queue, its greatest ``(queue_offset, commit_log_offset)`` consume-queue row."""
        # a queue's runs hold (queue_offset, commit_log_offset) pairs (Run types them as tuple[int, ...])
        return {key: cast(tuple[int, int], max(run.last for run in runs)) for key, runs in self.queues.items()}

    def log_tails(self) -> dict[str, tuple[int, int, int]]:
        """Per broker, its greatest ``(commit_log_offset, store_size, segment)`` record."""
        # a broker's runs hold (commit_log_offset, store_size, segment) triples
        return {broker: cast(tuple[int, int, int], max(run.last for run in runs)) for broker, runs in self.logs.items()}

    def new_cq_rows(self) -> int:
        """Consume-queue rows in the parts (not in the context)."""
        return sum(run.count for runs in self.queues.values() for run in runs if not run.context)

    def new_queues(self) -> int:
        """Queues with consume-queue rows in the parts."""
        return sum(1 for runs in self.queues.values() if any(not run.context for run in runs))


def segment_sizes(brokers: pa.Table) -> dict[str, int]:
    """Per broker, the ``segment_size`` of its latest ``brokers`` row (by start time, then size)."""
    latest: dict[str, tuple[int, int]] = {}
    for r in brokers.select(["broker_name", "started_timestamp", "segment_size"]).to_pylist():
        row = (r["started_timestamp"], r["segment_size"])
        latest[r["broker_name"]] = max(latest.get(r["broker_name"], row), row)
    return {broker: size for broker, (_, size) in latest.items()}


# ---------------------------------------------------------------------------------------------
# Runs of one part
# ---------------------------------------------------------------------------------------------


def _queue_runs(cq_rows: pa.Table) -> Iterator[tuple[QueueKey, Run]]:
    """One run per queue of ``consume-queue rows``, sorted by ``(queue_offset, commit_log_offset)``.

    The broker writes a file's records in commit log order; then a stable sort by queue keeps
    each queue's consume-queue rows in that order, and when they are clean it is their ``(queue_offset,
    commit_log_offset)`` order too. Otherwise the consume-queue rows are sorted by those columns."""
    if cq_rows.num_rows == 0:
        return
    groups = group_codes(cq_rows, QUEUE_KEY)
    offset, log_offset = _numpy(cq_rows, "queue_offset"), _numpy(cq_rows, "commit_log_offset")
    order = None
    if _rising(log_offset):
        order = np.argsort(groups.astype(np.uint16) if groups.max() < 1 << 16 else groups, kind="stable")
        sorted_offset, sorted_log_offset = offset[order], log_offset[order]
        follows = (sorted_offset[1:] == sorted_offset[:-1] + 1) & (sorted_log_offset[1:] > sorted_log_offset[:-1])
        if not np.all(follows | (groups[order][1:] != groups[order][:-1])):
            order = None
    if order is None:
        order = np.lexsort((log_offset, offset, groups))
        sorted_offset, sorted_log_offset = offset[order], log_offset[order]
        follows = (sorted_offset[1:] == sorted_offset[:-1] + 1) & (sorted_log_offset[1:] > sorted_log_offset[:-1])
    yield from _runs(cq_rows, QUEUE_KEY, order, groups[order], follows, [sorted_offset, sorted_log_offset])


def _log_runs(rows: pa.Table, sizes: Mapping[str, int]) -> Iterator[tuple[str, Run]]:
    """One run per broker of ``rows``, sorted by ``(commit_log_offset, store_size)`` (a file of
    one broker in commit log order, as the broker writes it, needs no sort)."""
    groups, brokers = _codes(rows["broker_name"])
    sizes_by_group = np.array([sizes.get(b, c.DEFAULT_SEGMENT_SIZE) for b in brokers.to_pylist()], dtype=np.int64)
    offset, size, segment = (_numpy(rows, n) for n in ("commit_log_offset", "store_size", "segment"))
    if len(brokers) == 1 and _rising(offset):
        order = np.arange(len(offset))
        segment_size = np.full(len(offset), sizes_by_group[0], dtype=np.int64)
    else:
        order = np.lexsort((size, offset, groups))
        groups, offset, size, segment = (a[order] for a in (groups, offset, size, segment))
        segment_size = sizes_by_group[groups]
    follows = _leads_to(offset[:-1], size[:-1], segment_size[:-1], offset[1:], size[1:])
    for (broker,), run in _runs(rows, ("broker_name",), order, groups, follows, [offset, size, segment]):
        yield broker, run


def _rising(values: np.ndarray) -> bool:
    """Whether ``values`` rise strictly."""
    return bool(np.all(values[1:] > values[:-1]))


def _leads_to(offset: Any, size: Any, segment_size: Any, next_commit_log_offset: Any, next_size: Any) -> Any:
    """Whether a record ``(offset, size)`` leads to the record at ``next_commit_log_offset``: it starts where
    the record ends, or at the next segment when it did not fit (with the 8-byte blank) in what
    the record left of its segment. Works on numpy arrays and on ints."""
    end = offset + size
    segment_end = offset - offset % segment_size + segment_size
    rolled = (next_commit_log_offset == segment_end) & (end + next_size + c.END_FILE_MIN_BLANK_LENGTH > segment_end)
    return (next_commit_log_offset == end) | rolled


def _runs(
    rows: pa.Table,
    keys: Sequence[str],
    order: np.ndarray,
    groups: np.ndarray,
    follows: np.ndarray,
    values: Sequence[np.ndarray],
) -> Iterator[tuple[tuple[Any, ...], Run]]:
    """The run of each group of sorted ``groups``; ``follows[i]`` says whether element ``i + 1``
    follows element ``i`` (checked only within a group)."""
    n = len(groups)
    boundary = groups[1:] != groups[:-1]
    starts = np.flatnonzero(np.concatenate(([True], boundary)))
    ends = np.concatenate((starts[1:], [n])) - 1
    broken = np.concatenate((~follows & ~boundary, [False]))
    dirty = np.logical_or.reduceat(broken, starts)
    key_rows = rows.select(list(keys)).take(pa.array(order[starts])).to_pylist()
    for i, start in enumerate(starts):
        end = ends[i]
        first = tuple(int(v[start]) for v in values)
        last = tuple(int(v[end]) for v in values)
        yield tuple(key_rows[i][k] for k in keys), Run(first, last, not bool(dirty[i]), int(end - start + 1))


def group_codes(rows: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """An int64 code per row, equal for rows with equal ``keys`` (dictionary codes in mixed radix;
    plain or dictionary-encoded string columns, a null a value of its own)."""
    codes = np.zeros(rows.num_rows, dtype=np.int64)
    for name in keys:
        indices, values = _codes(rows[name])
        codes = codes * len(values) + indices
    return codes


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """(an int64 code per row, the values the codes index) of a column; a column read
    dictionary-encoded keeps its dictionary (unified across its chunks), others are encoded. A
    null (a foreign row: the catalog's columns are NOT NULL) gets a code of its own, after the
    values, and a null joins the values."""
    if pa.types.is_dictionary(column.type):
        encoded = column.unify_dictionaries().combine_chunks()
    else:
        encoded = pc.dictionary_encode(column.combine_chunks())
    # a dictionary may hold a value twice or a value no row uses: fold it to distinct values
    values = pc.unique(encoded.dictionary)
    remap = np.asarray(pc.index_in(encoded.dictionary, value_set=values).to_numpy(zero_copy_only=False), np.int64)
    remap = np.append(remap, len(values))  # the code of a null
    indices = pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy(zero_copy_only=False)
    if column.null_count:
        values = pa.concat_arrays([values, pa.nulls(1, values.type)])
    return remap[indices], values


def _numpy(rows: pa.Table, name: str) -> np.ndarray:
    return np.asarray(rows[name].to_numpy(), dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Seams between parts
# ---------------------------------------------------------------------------------------------


def _queue_chain_holds(runs: Iterable[Run]) -> bool:
    """Every new run is clean, the chain starts at queue offset 0 (or with context), and at each
    seam with a new run the next queue offset follows at a higher commit log offset."""
    ordered = sorted(runs, key=lambda run: (run.first, not run.context))
    if not all(run.clean for run in ordered):
        return False
    if not ordered[0].context and ordered[0].first[0] != 0:
        return False
    return all(
        (before.context and after.context) or (after.first[0] == before.last[0] + 1 and after.first[1] > before.last[1])
        for before, after in pairwise(ordered)
    )


def _log_chain_holds(runs: Iterable[Run], segment_size: int) -> bool:
    """Every new run is clean and at each seam with a new run the record leads to the next."""
    ordered = sorted(runs, key=lambda run: (run.first[:2], not run.context))
    if not all(run.clean for run in ordered):
        return False
    return all(
        (before.context and after.context)
        or bool(_leads_to(before.last[0], before.last[1], segment_size, after.first[0], after.first[1]))
        for before, after in pairwise(ordered)
    )
