"""The lake reads of ``route_dlq`` on the driver (delta-rs and pyarrow, no Spark job): the inputs of
:mod:`jobs.dlq.fold`, narrowed by filters that partition values and file statistics prune by, for
a run that computes every chain and for one that moves the previous tables on.
See docs/jobs.md (route_dlq incremental).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import GroupQueueKey, RecordKey
from broker_model.common import constants as c
from jobs.dlq.fold import (
    CHAIN_ORIGINAL_COLUMNS,
    PREVIOUS_COLUMNS,
    ChainKey,
    Context,
    Previous,
    check_foldable,
    compute,
    first_failures,
    fold,
    host_prefixes,
    offsets_at,
    origin_positions_of,
    origins_of,
    policies_at,
    redrive_states,
    touched_chains,
    with_redrive_states,
)
from jobs.dlq.transforms import RETRY
from jobs.lake import IncrementalReadError, Lake
from jobs.runs import CannotFold
from schemas.catalog import (
    BROKERS,
    COMMITLOG,
    CONSUMER_OFFSET_COMMITS,
    DLQ,
    DLQ_REDRIVES,
    OFFSET_COMMIT_COLUMNS,
    RETRY_CHAINS,
    RETRY_RECORDS,
    SUBSCRIPTION_GROUP,
)
from schemas.errors import LakeError

# the topics of retry queues sort between these: every commit of another topic is pruned by statistics
_RETRY_TOPICS = [("topic", ">=", c.RETRY_GROUP_TOPIC_PREFIX), ("topic", "<", c.RETRY_GROUP_TOPIC_PREFIX[:-1] + "&")]


@dataclass(frozen=True)
class Outcome:
    """The tables a run writes (``retry_chains`` and ``dlq`` rows), the greatest store or commit time
    of the retry records and retry queue commits it read (-1 when none), and whether the ``dlq``
    rows differ from the previous run's (a moved-on run whose dead letters are the same leaves
    ``dlq`` as it is)."""

    chains: pa.Table
    dead_letters: pa.Table
    through: int
    dead_letters_changed: bool = True


def compute_every_chain(lake: Lake, versions: Mapping[str, int], as_of: int) -> Outcome:
    """Every chain of ``retry_records`` (at ``versions``) as of ``as_of``, on the driver. The records
    are read and enter :func:`jobs.dlq.fold.compute` without their bodies and properties (their row
    numbers stand in): only the dead letters' are read, after (:func:`_with_deferred`)."""
    version = versions.get(RETRY_RECORDS.name)
    empty = RETRY_RECORDS.arrow_schema.empty_table().select(_KEPT)
    table = lake.read_rows(RETRY_RECORDS, _KEPT, version=version) if version is not None else empty
    records = _numbered(table)
    commits = _retry_commits(lake, versions)
    brokers = _brokers(lake, versions.get(BROKERS.name))
    hosts = _hosts(brokers)
    origins = pc.unique(origins_of(records.filter(pc.less_equal(records.column("store_timestamp"), as_of))))
    context = Context(
        as_of,
        policies_at(_rows(lake, SUBSCRIPTION_GROUP, versions, POLICY_COLUMNS), as_of),
        offsets_at(commits, as_of),
        hosts,
        _originals(lake, versions, brokers, _positions(origins, hosts)),
    )
    chains, dead = compute(records, context)
    dead_letters = pa.Table.from_pylist(_with_deferred(lake, version, dead, table), schema=DLQ.arrow_schema)
    dead_letters = with_redrive_states(dead_letters, redrive_states(_rows(lake, DLQ_REDRIVES, versions)))
    newest = pc.max(table.column("store_timestamp")).as_py()
    return Outcome(chains, dead_letters, max(-1 if newest is None else newest, _latest(commits)))


POLICY_COLUMNS = ("broker_name", "group", "retry_max_times", "updated_timestamp")  # what policies_at reads
_NEW_RECORD_COLUMNS = ["group", "origin_msg_id", "uniq_key", "msg_id", "store_timestamp"]  # what touches chains
_DEFERRED = ("body", "properties")  # columns a dead letter copies from its record, read for those alone
_KEPT = [name for name in RETRY_RECORDS.column_names if name not in _DEFERRED]  # the columns chains are built of
_RECORD = ["broker_name", "commit_log_offset"]  # a record of a broker's commit log, and so of retry_records


def _numbered(table: pa.Table) -> pa.Table:
    """``retry_records`` rows ``table`` (the :data:`_KEPT` columns) with a ``row`` column numbering its
    rows (where a dead letter's :data:`_DEFERRED` values will go, :func:`_with_deferred`)."""
    return table.append_column("row", pa.array(np.arange(table.num_rows, dtype=np.int64)))


def _records(table: pa.Table) -> list[tuple[str, int]]:
    """The (broker, commit log offset) of each row of ``table``."""
    brokers, offsets = (table.column(name).to_pylist() for name in _RECORD)
    return list(zip(brokers, offsets, strict=True))


def _with_deferred(
    lake: Lake, version: int | None, dead: list[dict[str, Any]], table: pa.Table
) -> list[dict[str, Any]]:
    """``dead`` with the values of :data:`_DEFERRED` of the records of ``table`` (``retry_records`` at
    ``version``, read without them) that their fields number, read for those records alone: by
    their partition (``kind``; most are the DLQ records, a partition of their own), broker and
    commit log offset.

    Raises:
        LakeError: a record is no longer in ``retry_records`` at ``version``.
    """
    if not dead or version is None:
        return dead
    numbered = sorted({row[_DEFERRED[0]] for row in dead})
    keys = table.select(["kind", *_RECORD]).take(pa.array(numbered, pa.int64()))
    kinds, wanted = keys.column("kind").to_pylist(), _records(keys)
    offsets: dict[tuple[str, str], list[int]] = {}
    for kind, (broker, offset) in zip(kinds, wanted, strict=True):
        offsets.setdefault((kind, broker), []).append(offset)
    filters: list[list[tuple[str, str, Any]]] = [
        [("kind", "=", kind), ("broker_name", "=", broker), ("commit_log_offset", "in", sorted(found))]
        for (kind, broker), found in sorted(offsets.items())
    ]
    read = lake.read_rows(RETRY_RECORDS, [*_RECORD, *_DEFERRED], filters, version)
    by_record = {key: i for i, key in enumerate(_records(read))}
    missing = [key for key in wanted if key not in by_record]
    if missing:
        raise LakeError(
            f"the retry record of broker {missing[0][0]} at commit log offset {missing[0][1]} is gone from "
            f"retry_records version {version}; run route_dlq again"
        )
    position = dict(zip(numbered, (by_record[key] for key in wanted), strict=True))
    for column in _DEFERRED:
        values = read.column(column).take(pa.array([position[row[column]] for row in dead], pa.int64())).to_pylist()
        for row, value in zip(dead, values, strict=True):
            row[column] = value
    return dead


def move_on(lake: Lake, previous_run: Mapping[str, Any], versions: Mapping[str, int], as_of: int) -> Outcome:
    """The previous run's tables moved on to ``as_of`` (:mod:`jobs.dlq.fold`).

    Raises:
        CannotFold: why they cannot be (then the caller computes every chain).
    """
    before: Mapping[str, int] = previous_run["input_versions"]
    previous_as_of, through = previous_run["parameters"].get("as_of"), previous_run["parameters"].get("through")
    if previous_as_of is None or through is None:
        raise CannotFold("the previous run recorded no as_of and through")
    for name in (RETRY_RECORDS.name, COMMITLOG.name):
        if name not in before or name not in versions:
            raise CannotFold(f"no {name} version was recorded")
    brokers = _brokers(lake, versions.get(BROKERS.name))
    hosts = _hosts(brokers)
    same_brokers = before.get(BROKERS.name) == versions.get(BROKERS.name)
    if not same_brokers and hosts != _hosts(_brokers(lake, before.get(BROKERS.name))):
        raise CannotFold("a broker's store host changed")
    outputs = previous_run["output_versions"]
    previous_chains = lake.read_rows(RETRY_CHAINS, version=outputs[RETRY_CHAINS.name])
    previous_dead = lake.read_rows(DLQ, version=outputs[DLQ.name])
    previous = Previous(
        _light_chains(previous_chains),
        previous_as_of,
        through,
        policies_at(_rows(lake, SUBSCRIPTION_GROUP, before, POLICY_COLUMNS), previous_as_of),
    )
    check_foldable(previous, as_of)
    try:
        lake.appended_size(COMMITLOG, before[COMMITLOG.name], versions[COMMITLOG.name])
        new = _appended(lake, RETRY_RECORDS, _NEW_RECORD_COLUMNS, before, versions).to_pylist()
        new_commits = _retry_only(
            _appended(lake, CONSUMER_OFFSET_COMMITS, list(OFFSET_COMMIT_COLUMNS), before, versions)
        )
    except IncrementalReadError as err:
        raise CannotFold(str(err)) from err
    commits = _retry_commits(lake, versions)
    offsets = offsets_at(commits, as_of)
    moved = {
        (r["group"], r["broker_name"], r["topic"], r["queue_id"])
        for r in new_commits.to_pylist()
        if r["commit_timestamp"] <= as_of
    }
    policies = policies_at(_rows(lake, SUBSCRIPTION_GROUP, versions, POLICY_COLUMNS), as_of)
    backlog = _backlog(lake, versions[RETRY_RECORDS.name], {q: offsets[q] for q in moved if q in offsets})
    touched = touched_chains(previous, new, policies, backlog, hosts, as_of)
    table = _chain_records(lake, versions[RETRY_RECORDS.name], touched, previous, new)
    records = _numbered(table)
    originals = _originals(lake, versions, brokers, _positions(pa.array([o for _, o in touched], pa.string()), hosts))
    context = Context(as_of, policies, offsets, hosts, originals)
    chains, dead, kept_dead = fold(previous_chains, previous_dead, touched, records, context)
    computed = pa.Table.from_pylist(
        _with_deferred(lake, versions[RETRY_RECORDS.name], dead, table), schema=previous_dead.schema
    )
    states = redrive_states(_rows(lake, DLQ_REDRIVES, versions))
    dead_letters = with_redrive_states(pa.concat_tables([kept_dead, computed]), states)
    times = [r["store_timestamp"] for r in new] + [_latest(new_commits)]
    changed = not _in_order(dead_letters).equals(_in_order(previous_dead))
    return Outcome(chains, dead_letters, max([through, *times]), changed)


def _in_order(dead: pa.Table) -> pa.Table:
    keys = ("group", "broker_name", "msg_id", "reason", "origin_msg_id", "reconsume_times", "dlq_timestamp")
    return dead.sort_by([(key, "ascending") for key in keys])


def _light_chains(chains: pa.Table) -> pa.Table:
    """:attr:`jobs.dlq.fold.Previous.chains` of a ``retry_chains`` table."""
    first = pc.list_slice(chains.column("attempts"), 0, 1)
    return chains.select(list(PREVIOUS_COLUMNS)).append_column("attempts", first)


def _rows(
    lake: Lake, spec: Any, versions: Mapping[str, int], columns: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The rows of a small table at its recorded version; none when it has no version."""
    version = versions.get(spec.name)
    return lake.read_rows(spec, columns, version=version).to_pylist() if version is not None else []


def _appended(
    lake: Lake, spec: Any, columns: Sequence[str], before: Mapping[str, int], now: Mapping[str, int]
) -> pa.Table:
    """The rows appended to a table between two recorded versions (every row when it had none)."""
    if spec.name not in now:
        return spec.arrow_schema.empty_table().select(list(columns))
    if spec.name not in before:
        return lake.read_rows(spec, columns, version=now[spec.name])
    return lake.read_appended_rows(spec, columns, before[spec.name], now[spec.name])


def _retry_only(commits: pa.Table) -> pa.Table:
    return commits.filter(pc.starts_with(commits.column("topic"), c.RETRY_GROUP_TOPIC_PREFIX))


def _retry_commits(lake: Lake, versions: Mapping[str, int]) -> pa.Table:
    """The offset commits of retry queues (``%RETRY%`` topics)."""
    version = versions.get(CONSUMER_OFFSET_COMMITS.name)
    if version is None:
        return CONSUMER_OFFSET_COMMITS.arrow_schema.empty_table().select(list(OFFSET_COMMIT_COLUMNS))
    return _retry_only(
        lake.read_rows(CONSUMER_OFFSET_COMMITS, list(OFFSET_COMMIT_COLUMNS), _RETRY_TOPICS, version=version)
    )


def _latest(commits: pa.Table) -> int:
    """The latest commit time of ``commits``, -1 when there is none."""
    latest = pc.max(commits.column("commit_timestamp")).as_py()
    return -1 if latest is None else int(latest)


def _brokers(lake: Lake, version: int | None) -> dict[str, dict[str, Any]]:
    """Each broker's latest ``brokers`` row (by start time)."""
    latest: dict[str, dict[str, Any]] = {}
    if version is None:
        return latest
    columns = ["broker_name", "store_host", "segment_size", "started_timestamp"]
    for row in lake.read_rows(BROKERS, columns, version=version).to_pylist():
        seen = latest.get(row["broker_name"])
        if seen is None or row["started_timestamp"] > seen["started_timestamp"]:
            latest[row["broker_name"]] = row
    return latest


def _hosts(brokers: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """:func:`jobs.dlq.fold.host_prefixes` of each broker's latest store host (:func:`_brokers`)."""
    return host_prefixes((name, row["store_host"]) for name, row in brokers.items())


def _positions(origins: pa.Array | pa.ChunkedArray, hosts: Mapping[str, Sequence[str]]) -> set[RecordKey]:
    """The (broker, commit log offset) pairs the chains' ``origins`` name."""
    table = origin_positions_of(origins, hosts)
    return set(zip(table.column("broker_name").to_pylist(), table.column("commit_log_offset").to_pylist(), strict=True))


def _originals(
    lake: Lake, versions: Mapping[str, int], brokers: Mapping[str, Mapping[str, Any]], positions: set[RecordKey]
) -> pa.Table:
    """The commit log records at ``positions`` (:data:`jobs.dlq.fold.CHAIN_ORIGINAL_COLUMNS`), reading
    only the segments that can hold them (segment sizes from :func:`_brokers`)."""
    version = versions.get(COMMITLOG.name)
    none = COMMITLOG.arrow_schema.empty_table().select(list(CHAIN_ORIGINAL_COLUMNS))
    if version is None or not positions:
        return none
    sizes = {name: row["segment_size"] for name, row in brokers.items()}
    by_broker: dict[str, set[int]] = {}
    for broker, offset in positions:
        if broker in sizes:
            by_broker.setdefault(broker, set()).add(offset)
    filters = [
        [
            ("broker_name", "=", broker),
            ("segment", "in", sorted({o - o % sizes[broker] for o in offsets})),
            ("commit_log_offset", "in", sorted(offsets)),
        ]
        for broker, offsets in sorted(by_broker.items())
    ]
    if not filters:
        return none
    return lake.read_rows(COMMITLOG, list(CHAIN_ORIGINAL_COLUMNS), filters, version=version)  # the rows matching alone


def _backlog(lake: Lake, version: int, offsets: Mapping[GroupQueueKey, int]) -> list[dict[str, Any]]:
    """The RETRY rows of ``retry_records`` at or after the given consumer offset of their queue (of
    any broker: a chain's offset is looked up under the broker of its first record)."""
    if not offsets:
        return []
    filters = [
        [("kind", "=", RETRY), ("topic", "=", topic), ("queue_id", "=", queue_id), ("queue_offset", ">=", offset)]
        for (_, _, topic, queue_id), offset in sorted(offsets.items())
    ]
    columns = ["group", "origin_msg_id", "uniq_key", "msg_id", "store_timestamp"]
    rows: list[dict[str, Any]] = lake.read_rows(RETRY_RECORDS, columns, filters, version=version).to_pylist()
    return rows


def _chain_records(
    lake: Lake, version: int, touched: set[ChainKey], previous: Previous, new: Sequence[Mapping[str, Any]]
) -> pa.Table:
    """The rows of ``retry_records`` (at ``version``) that may belong to the ``touched`` chains: every
    row of those chains, and rows of other chains that the filters cannot tell apart. None is stored
    before the earliest first failure of the touched chains the previous run had, nor, for chains
    it had not, before the earliest new record: that bound prunes the older files."""
    if not touched:
        return RETRY_RECORDS.arrow_schema.empty_table().select(_KEPT)
    since = min(first_failures(previous, touched) + [r["store_timestamp"] for r in new], default=0)
    groups = sorted({group for group, _ in touched})
    origins = sorted({origin for _, origin in touched})
    filters = [
        [("store_timestamp", ">=", since), ("group", "in", groups), (column, "in", origins)]
        for column in ("origin_msg_id", "uniq_key", "msg_id")
    ]
    return lake.read_rows(RETRY_RECORDS, _KEPT, filters, version)
