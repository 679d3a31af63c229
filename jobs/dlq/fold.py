"""``route_dlq`` on the driver: the retry chains and dead letters of ``retry_records`` rows computed in
Python row for row as the Spark transforms of :mod:`jobs.dlq.transforms` compute them, and the previous
tables moved on to a later T by what changed since. See docs/jobs.md (route_dlq incremental).

A chain's row is a function of its own records stored at or before T, of its original record in
the commit log, of its group's retry limit and of the consumer offset of the retry queue its
latest record sits in. When no record the previous run read was stored after its T, a later run
computes again only the chains whose inputs may have changed:

- the chains of the new records;
- the open chains (SCHEDULED and DELIVERED), whose latest record may be consumed by now;
- the chains of records at or after the consumer offset of a retry queue with new commits (a
  reset may have moved the offset back over a consumed record);
- the chains of a group whose retry limit differs at the new T;
- the chains whose original record was not found (it may have been written since).

Every other chain keeps its row and gets the new ``as_of``; its dead letters keep theirs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import GroupQueueKey, RecordKey
from broker_model.common import constants as c
from jobs.dlq.transforms import (
    CONSUMED,
    CONSUMER_REQUESTED,
    DEAD,
    DEAD_LETTER,
    DELIVERED,
    KIND_RANK,
    MAX_RECONSUME_TIMES,
    POLICY,
    POLICY_NOT_WRITTEN,
    RETRY,
    SCHEDULED,
)
from jobs.runs import CannotFold
from schemas.catalog import ATTEMPT, RETRY_CHAINS

ChainKey = tuple[str, str]
"""(group, origin_msg_id): a retry chain."""
CHAIN_ORIGINAL_COLUMNS = ("broker_name", "commit_log_offset", "topic", "store_timestamp")
"""A chain's original record: where it is in the commit log, its topic and its store time."""

OPEN_STATES = (SCHEDULED, DELIVERED)  # states a consumer offset or a later record moves on
_HEX_DIGITS = "0123456789abcdefABCDEF"
_HEX_SET = frozenset(_HEX_DIGITS)


@dataclass(frozen=True)
class Context:
    """What the chains are computed against, besides their records.

    Attributes:
        as_of: T, epoch milliseconds.
        policies: ``retry_max_times`` per (broker, group) as of T (:func:`policies_at`).
        offsets: the consumer offset per retry queue as of T (:func:`offsets_at`).
        hosts: the broker names per host prefix of offset message ids (:func:`host_prefixes`).
        originals: the original records found (:data:`CHAIN_ORIGINAL_COLUMNS`), in the order read.
    """

    as_of: int
    policies: Mapping[tuple[str, str], int | None]
    offsets: Mapping[GroupQueueKey, int]
    hosts: Mapping[str, Sequence[str]]
    originals: pa.Table


def of_chains(records: pa.Table, keys: set[ChainKey]) -> pa.Table:
    """The ``retry_records`` rows ``records`` of the chains ``keys``."""
    if not keys or not records.num_rows:
        return records.slice(0, 0)
    joined = pc.binary_join_element_wise(records.column("group"), origins_of(records), _CHAIN_JOIN)
    wanted = pa.array([f"{group}{_CHAIN_JOIN}{origin}" for group, origin in keys], pa.string())
    return records.filter(pc.fill_null(pc.is_in(joined, value_set=wanted), False))


def origins_of(records: pa.Table) -> pa.ChunkedArray:
    """The origin id of each chain of ``records`` (:func:`chain_key`, column-wise)."""
    return pc.coalesce(records.column("origin_msg_id"), records.column("uniq_key"), records.column("msg_id"))


def chain_key(record: Mapping[str, Any]) -> ChainKey:
    """The chain of a ``retry_records`` row: its group and ``ORIGIN_MESSAGE_ID``, else its uniq key,
    else its message id (:func:`jobs.dlq.transforms.with_chain_key`)."""
    origin = record["origin_msg_id"]
    if origin is None:
        origin = record["uniq_key"]
        if origin is None:
            origin = record["msg_id"]
    return record["group"], origin


def host_prefixes(brokers: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Per host prefix (the part of an offset message id before its offset), the brokers with it,
    from (broker name, store host) pairs."""
    from broker_model.common import create_msg_id, parse_host

    hosts: dict[str, list[str]] = {}
    for prefix, name in sorted({(create_msg_id(parse_host(host), 0)[:-16], name) for name, host in brokers}):
        hosts.setdefault(prefix, []).append(name)
    return hosts


def origin_positions(origin_msg_id: str, hosts: Mapping[str, Sequence[str]]) -> list[RecordKey]:
    """The (broker, commit log offset) pairs an origin id names: the brokers of its host prefix
    and its last 16 characters read as Spark's ``conv(.., 16, 10)`` reads them (spaces trimmed, an
    optional minus, hex digits up to the first other character, above a long: none)."""
    if len(origin_msg_id) <= 16:
        return []
    brokers = hosts.get(origin_msg_id[:-16], ())
    offset = _spark_hex(origin_msg_id[-16:])
    return [(broker, offset) for broker in brokers] if offset is not None else []


def origin_positions_of(origins: pa.Array | pa.ChunkedArray, hosts: Mapping[str, Sequence[str]]) -> pa.Table:
    """:func:`origin_positions` of each of ``origins``, column-wise: a table of ``row`` (the index in
    ``origins``), ``broker_name`` and ``commit_log_offset``, in the order of ``origins`` and of each
    one's positions. Ids whose last 16 characters are 16 hex digits (every id a broker writes) are
    read in NumPy; the others one by one."""
    ids = origins.combine_chunks() if isinstance(origins, pa.ChunkedArray) else origins
    prefixes = pa.array(list(hosts), pa.string())
    long = pc.fill_null(pc.greater(pc.utf8_length(ids), 16), False)
    rows = np.flatnonzero(long.to_numpy(zero_copy_only=False))
    known = pc.index_in(pc.utf8_slice_codeunits(ids.take(pa.array(rows)), 0, -16), value_set=prefixes)
    rows, prefix = rows[known.is_valid().to_numpy(zero_copy_only=False)], known.drop_null().to_numpy()
    tails = pc.utf8_slice_codeunits(ids.take(pa.array(rows)), -16).cast(pa.binary())
    offsets = np.full(len(rows), -1, dtype=np.int64)
    sixteen = np.flatnonzero(pc.equal(pc.binary_length(tails), 16).to_numpy(zero_copy_only=False))  # ASCII tails
    digits = _NIBBLE[_bytes_of(tails.take(pa.array(sixteen)))]
    hex_only = (digits < 16).all(axis=1)
    fits = hex_only & (digits[:, 0] < 8)  # at most a long; the other 16 hex digits name no offset
    packed = np.ascontiguousarray((digits[fits, 0::2] << 4) | digits[fits, 1::2])  # 8 bytes, big-endian
    offsets[sixteen[fits]] = packed.view(">u8").ravel().astype(np.int64)
    slow = np.ones(len(rows), dtype=bool)
    slow[sixteen[hex_only]] = False
    for i in np.flatnonzero(slow):
        value = _spark_hex(tails[int(i)].as_py().decode())
        offsets[i] = -1 if value is None else value
    named = offsets >= 0
    rows, prefix, offsets = rows[named], prefix[named], offsets[named]
    # each id once per broker of its prefix: the brokers of every prefix one after the other
    per_prefix = np.array([len(hosts[key]) for key in prefixes.to_pylist()], dtype=np.int64)
    brokers = pa.array([broker for key in prefixes.to_pylist() for broker in hosts[key]], pa.string())
    counts = per_prefix[prefix]
    ends = np.cumsum(counts)
    nth = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - np.repeat(ends - counts, counts)
    which = np.repeat((np.cumsum(per_prefix) - per_prefix)[prefix], counts) + nth
    return pa.table(
        {
            "row": pa.array(np.repeat(rows, counts)),
            "broker_name": brokers.take(pa.array(which)),
            "commit_log_offset": pa.array(np.repeat(offsets, counts)),
        }
    )


def _bytes_of(texts: pa.Array) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The bytes of binary values of 16 bytes each, one row per value."""
    if not len(texts):
        return np.zeros((0, 16), dtype=np.uint8)
    start = int(np.frombuffer(texts.buffers()[1], dtype=np.int32)[texts.offset])
    data = np.frombuffer(texts.buffers()[2], dtype=np.uint8)[start : start + 16 * len(texts)]
    return data.reshape(-1, 16)


_NIBBLE = np.full(256, 255, dtype=np.uint8)  # a byte's hex digit value, 255 for any other byte
_NIBBLE[np.frombuffer(b"0123456789abcdef", np.uint8)] = _NIBBLE[np.frombuffer(b"0123456789ABCDEF", np.uint8)] = (
    np.arange(16, dtype=np.uint8)
)


def _spark_hex(text: str) -> int | None:
    if text and _HEX_SET.issuperset(text):  # the usual case: every character a hex digit
        value = int(text, 16)
        return value if value <= c.JAVA_LONG_MAX else None
    digits = text.strip(" ")
    negative = digits.startswith("-")
    value = 0
    for char in digits[1:] if negative else digits:
        if char not in _HEX_DIGITS:
            break
        value = value * 16 + int(char, 16)
    if negative:
        value = -value % (1 << 64)
    return value if value <= c.JAVA_LONG_MAX else None


def policies_at(rows: Iterable[Mapping[str, Any]], as_of: int) -> dict[tuple[str, str], int | None]:
    """``retry_max_times`` of the latest ``subscription_group`` row at or before ``as_of`` per
    (broker, group) (:func:`jobs.dlq.transforms.build_policies`)."""
    latest: dict[tuple[str, str], tuple[int, int | None]] = {}
    for row in rows:
        if row["updated_timestamp"] > as_of:
            continue
        key = (row["broker_name"], row["group"])
        seen = latest.get(key)
        if seen is None or row["updated_timestamp"] > seen[0]:
            latest[key] = (row["updated_timestamp"], row["retry_max_times"])
    return {key: value for key, (_, value) in latest.items()}


def offsets_at(commits: pa.Table, as_of: int) -> dict[GroupQueueKey, int]:
    """The committed offset per (group, broker, topic, queue) of the latest commit at or before
    ``as_of``, by the total order of :func:`jobs.rules.build_current_offsets`, computed in Arrow
    from ``consumer_offset_commits`` rows (:data:`OFFSET_ORDER`)."""
    done = commits.filter(pc.less_equal(commits.column("commit_timestamp"), as_of))
    if not done.num_rows:
        return {}
    keys = ["group", "broker_name", "topic", "queue_id"]
    reset = pc.fill_null(pc.equal(done.column("source"), "reset"), False)
    ordered = done.select([*keys, "commit_timestamp", "offset", "source"]).append_column("reset", reset)
    ordered = ordered.sort_by([(key, "ascending") for key in (*keys, *OFFSET_ORDER)])
    latest = ordered.group_by(keys, use_threads=False).aggregate([("offset", "last")])
    columns = [latest.column(name).to_pylist() for name in (*keys, "offset_last")]
    return {(group, broker, topic, queue): offset for group, broker, topic, queue, offset in zip(*columns, strict=True)}


OFFSET_ORDER = ("commit_timestamp", "reset", "offset", "source")
"""The order of a queue's commits, the latest last: commit time, then a reset after a client's
commit of the same millisecond, then the greater offset (``reset``: whether ``source`` is "reset")."""


def redrive_states(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """Per (broker, message id): ``<state> <request id>`` of its latest ``dlq_redrives`` row."""
    latest: dict[tuple[str, str], tuple[tuple[int, str, str], str]] = {}
    for row in rows:
        key = (row["broker_name"], row["msg_id"])
        order = (row["updated_timestamp"], row["state"], row["request_id"])
        seen = latest.get(key)
        if seen is None or order > seen[0]:
            latest[key] = (order, f"{row['state']} {row['request_id']}")
    return {key: state for key, (_, state) in latest.items()}


def compute(records: pa.Table, context: Context) -> tuple[pa.Table, list[dict[str, Any]]]:
    """The ``retry_chains`` table and the ``dlq`` rows (``redrive_state`` left unset) of the chains
    of ``records``, which must hold every record of those chains (any store time: later ones are
    left out), computed in Arrow as :func:`jobs.dlq.transforms.build_retry_chains` and
    :func:`~jobs.dlq.transforms.build_dlq` compute them.

    ``records`` are ``retry_records`` rows without ``body`` and ``properties``, with a ``row``
    column instead: a dead letter's ``body`` and ``properties`` are its record's ``row``, for the
    caller to read (dead letters are few, bodies large)."""
    done = records.filter(pc.less_equal(records.column("store_timestamp"), context.as_of))
    if not done.num_rows:
        return RETRY_CHAINS.arrow_schema.empty_table(), []
    ranks = pc.take(
        pa.array(list(KIND_RANK.values()), pa.int8()),
        pc.index_in(done.column("kind"), value_set=pa.array(list(KIND_RANK), pa.string())),
    )
    origin = origins_of(done)
    keyed = done.append_column("origin", origin).append_column("rank", ranks)
    keyed = keyed.append_column("position", pa.array(np.arange(done.num_rows, dtype=np.int64)))
    # a chain's records together, its latest last: the greatest (reconsume times, rank, store time,
    # commit log offset), the first record of the table among equals
    ordered = keyed.sort_by(
        [(key, "ascending") for key in (*_CHAIN, "reconsume_times", "rank", "store_timestamp", "commit_log_offset")]
        + [("position", "descending")]
    )
    starts = _starts(ordered)
    chain_of = np.repeat(np.arange(len(starts), dtype=np.int64), np.diff(np.append(starts, ordered.num_rows)))
    ordered = ordered.append_column("chain", pa.array(chain_of))
    lasts = np.append(starts[1:], ordered.num_rows) - 1
    latest = ordered.select(["kind", "topic", "queue_id", "queue_offset", "reconsume_times", "store_timestamp"])
    latest = latest.take(pa.array(lasts))
    first = ordered.select(list(_CHAIN)).take(pa.array(starts))
    least = ordered.group_by("chain", use_threads=False).aggregate(
        [("uniq_key", "min"), ("keys", "min"), ("origin_topic", "min"), ("store_timestamp", "min")]
    )
    # the broker of the record with the least commit log offset (the first of the table among equals)
    by_offset = pc.sort_indices(
        ordered.select(["chain", "commit_log_offset", "position"]),
        [("chain", "ascending"), ("commit_log_offset", "ascending"), ("position", "ascending")],
    )
    brokers = ordered.column("broker_name").take(by_offset.take(pa.array(starts)))
    retry_columns = ["chain", *ATTEMPT.names, "msg_id", "uniq_key", "origin_topic", "position", "row"]
    retries = (
        ordered.filter(pc.equal(ordered.column("kind"), RETRY))
        .select(retry_columns)
        .sort_by([("chain", "ascending")] + [(key, "ascending") for key in (*_ATTEMPT_ORDER, "broker_name", "topic")])
    )
    chains = len(starts)
    states, limits = _states(latest, first.column("group"), brokers, context)
    exhausted = pc.and_(
        pc.is_in(states, value_set=pa.array(OPEN_STATES, pa.string())),
        pc.greater_equal(latest.column("reconsume_times"), limits),
    )
    # one row per original record found (several brokers may share the origin id's host prefix), else one
    found = _found_originals(origin_positions_of(first.column("origin"), context.hosts), context.originals)
    found_per_chain = np.bincount(found.column("row").to_numpy(), minlength=chains).tolist()
    copies_of = [max(n, 1) for n in found_per_chain]
    row_chain = np.repeat(np.arange(chains, dtype=np.int64), copies_of)
    first_row = np.concatenate(([0], np.cumsum(copies_of)[:-1])).astype(np.int64)
    # a chain with originals has one row per original, each with it; a chain without, one row without
    with_original = np.repeat(np.array(found_per_chain, dtype=np.int64) > 0, copies_of).astype(np.int64)
    attempts = _attempts(retries, chains, row_chain, with_original, found)
    take = pa.array(row_chain)
    table = pa.table(
        {
            "group": pc.take(first.column("group"), take),
            "origin_msg_id": pc.take(first.column("origin"), take),
            "uniq_key": pc.take(least.column("uniq_key_min"), take),
            "keys": pc.take(least.column("keys_min"), take),
            "origin_topic": pc.take(least.column("origin_topic_min"), take),
            "broker_name": pc.take(brokers, take),
            "attempts": attempts,
            "last_reconsume_times": pc.take(latest.column("reconsume_times"), take),
            "first_failure_timestamp": pc.take(least.column("store_timestamp_min"), take),
            "last_timestamp": pc.take(latest.column("store_timestamp"), take),
            "state": pc.take(states, take),
            "max_reconsume_times": pc.take(limits, take),
            "exhausted": pc.take(exhausted, take),
            "as_of": pa.array(np.full(len(row_chain), context.as_of, dtype=np.int64)),
        },
        schema=RETRY_CHAINS.arrow_schema,
    )
    return table, _dead_letters(table, ordered, retries, first_row, copies_of)


def _states(
    latest: pa.Table, groups: pa.ChunkedArray, brokers: pa.ChunkedArray, context: Context
) -> tuple[pa.Array, pa.Array]:
    """Each chain's state and retry limit, from its latest record (``latest``, one row per chain),
    group and broker: DEAD after a DLQ record, SCHEDULED after a SCHEDULED one, else CONSUMED when its
    group's offset in the latest record's queue passed it, else DELIVERED; the limit is the
    broker's policy for the group, RocketMQ's default without one."""
    n = latest.num_rows
    keys = pa.table(
        {
            "group": groups,
            "broker_name": brokers,
            "topic": latest.column("topic"),
            "queue_id": latest.column("queue_id"),
            "chain": pa.array(np.arange(n, dtype=np.int64)),
        }
    )
    queues = list(context.offsets)
    offsets = pa.table(
        {
            "group": pa.array([queue[0] for queue in queues], pa.string()),
            "broker_name": pa.array([queue[1] for queue in queues], pa.string()),
            "topic": pa.array([queue[2] for queue in queues], pa.string()),
            "queue_id": pa.array([queue[3] for queue in queues], pa.int32()),
            "offset": pa.array([context.offsets[queue] for queue in queues], pa.int64()),
        }
    )
    found = keys.join(offsets, ["group", "broker_name", "topic", "queue_id"], use_threads=False).sort_by("chain")
    consumed = pc.fill_null(pc.greater(found.column("offset"), latest.column("queue_offset")), False)
    kind = latest.column("kind")
    states = pc.case_when(
        pc.make_struct(pc.equal(kind, DEAD_LETTER), pc.equal(kind, SCHEDULED), consumed),
        DEAD,
        SCHEDULED,
        CONSUMED,
        DELIVERED,
    )
    given = [(broker, group, limit) for (broker, group), limit in context.policies.items() if limit is not None]
    policies = pa.table(
        {
            "broker_name": pa.array([broker for broker, _, _ in given], pa.string()),
            "group": pa.array([group for _, group, _ in given], pa.string()),
            "limit": pa.array([limit for _, _, limit in given], pa.int32()),
        }
    )
    limits = keys.join(policies, ["broker_name", "group"], use_threads=False).sort_by("chain").column("limit")
    return states, pc.fill_null(limits, c.RETRY_MAX_TIMES).combine_chunks()


_CHAIN = ("group", "origin")
_ATTEMPT_ORDER = ("reconsume_times", "store_timestamp", "commit_log_offset")


def _starts(ordered: pa.Table) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The first row of each chain of ``ordered`` (sorted by chain)."""
    if ordered.num_rows < 2:
        return np.zeros(ordered.num_rows, dtype=np.int64)
    group, origin = (ordered.column(key) for key in _CHAIN)
    changed = pc.or_(
        pc.not_equal(group.slice(1), group.slice(0, ordered.num_rows - 1)),
        pc.not_equal(origin.slice(1), origin.slice(0, ordered.num_rows - 1)),
    )
    after = np.flatnonzero(changed.to_numpy(zero_copy_only=False)) + 1
    return np.concatenate(([0], after)).astype(np.int64)


def _found_originals(positions: pa.Table, originals: pa.Table) -> pa.Table:
    """The original records at the chains' ``positions`` (:func:`origin_positions_of` of their
    origins: ``row`` the chain), one row per record found: ``row``, then the record's
    :data:`CHAIN_ORIGINAL_COLUMNS`; in the order of the positions, then of ``originals``."""
    key = ["broker_name", "commit_log_offset"]
    numbered = positions.append_column("_position", pa.array(np.arange(positions.num_rows, dtype=np.int64)))
    read = originals.append_column("_read", pa.array(np.arange(originals.num_rows, dtype=np.int64)))
    found = numbered.join(read, key, join_type="inner", use_threads=False).sort_by(
        [("_position", "ascending"), ("_read", "ascending")]
    )
    return found.select(["row", *CHAIN_ORIGINAL_COLUMNS])


def _attempts(
    retries: pa.Table,
    chains: int,
    row_chain: np.ndarray[Any, np.dtype[np.int64]],
    with_original: np.ndarray[Any, np.dtype[np.int64]],
    originals: pa.Table,
) -> pa.ListArray:
    """Each chain row's ``attempts``: its original (when found: ``originals``, :func:`_found_originals`,
    in the order of the rows), then its chain's RETRY records in attempt order (``retries``, sorted
    by chain and that order)."""
    counts = np.bincount(retries.column("chain").to_numpy(), minlength=chains).astype(np.int64)
    retry_first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    lengths = with_original + counts[row_chain]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    # the values: every row's original (numbered after the retries), then its chain's retries
    shift = np.repeat(retry_first[row_chain] - offsets[:-1] - with_original, lengths)
    index = np.arange(int(offsets[-1]), dtype=np.int64) + shift
    original_at = offsets[:-1][with_original == 1]
    index[original_at] = retries.num_rows + np.arange(len(originals), dtype=np.int64)
    fields = [field.name for field in ATTEMPT]
    stored = pa.StructArray.from_arrays(
        [retries.column(name).combine_chunks().cast(ATTEMPT.field(name).type) for name in fields],
        fields=list(ATTEMPT),
    )
    first = originals.append_column(  # an original is the first attempt
        "reconsume_times", pa.array(np.zeros(originals.num_rows, dtype=np.int32), ATTEMPT.field("reconsume_times").type)
    )
    found = pa.StructArray.from_arrays(
        [first.column(name).combine_chunks().cast(ATTEMPT.field(name).type) for name in fields], fields=list(ATTEMPT)
    )
    values = pa.concat_arrays([stored, found]).take(pa.array(index))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _dead_letters(
    chains: pa.Table,
    ordered: pa.Table,
    retries: pa.Table,
    first_row: np.ndarray[Any, np.dtype[np.int64]],
    copies_of: Sequence[int],
) -> list[dict[str, Any]]:
    """The ``dlq`` rows of the chains: one per DLQ record and chain row, and one
    ``POLICY_NOT_WRITTEN`` row for each exhausted DELIVERED chain (its latest retry record, with its
    first row's attempts), which the Spark window gives once per chain however many rows it has
    (:func:`jobs.dlq.transforms.build_dlq`)."""
    columns = ["chain", "broker_name", "msg_id", "uniq_key", "origin_topic", "reconsume_times", "store_timestamp"]
    dead = ordered.filter(pc.equal(ordered.column("kind"), DEAD_LETTER)).select([*columns, "routed_by", "row"])
    pending = pc.and_(chains.column("exhausted"), pc.equal(chains.column("state"), DELIVERED))
    # the chains (by index) whose first row is pending: the row their pending dead letter takes
    pending_chains = np.flatnonzero(pending.to_numpy(zero_copy_only=False)[first_row]).tolist()
    wanted = {
        int(row)
        for record in dead.column("chain").to_pylist()
        for row in range(first_row[record], first_row[record] + copies_of[record])
    } | {int(first_row[i]) for i in pending_chains}
    rows = dict(zip(sorted(wanted), chains.take(pa.array(sorted(wanted), pa.int64())).to_pylist(), strict=True))
    letters = []
    for record in dead.to_pylist():
        for row in range(first_row[record["chain"]], first_row[record["chain"]] + copies_of[record["chain"]]):
            chain = rows[int(row)]
            if record["routed_by"] is not None:
                reason = POLICY
            elif record["reconsume_times"] - 1 >= chain["max_reconsume_times"]:
                reason = MAX_RECONSUME_TIMES
            else:
                reason = CONSUMER_REQUESTED
            letters.append(_dead_letter(chain, record, reason, record["store_timestamp"]))
    if pending_chains:
        candidates = retries.filter(
            pc.is_in(retries.column("chain"), value_set=pa.array(pending_chains, pa.int64()))
        ).select([*columns, "commit_log_offset", "position", "row"])
        latest: dict[int, dict[str, Any]] = {}
        for record in candidates.to_pylist():  # the greatest attempt order, the first of the table among equals
            seen = latest.get(record["chain"])
            order = (*(record[key] for key in _ATTEMPT_ORDER), -record["position"])
            if seen is None or order > (*(seen[key] for key in _ATTEMPT_ORDER), -seen["position"]):
                latest[record["chain"]] = record
        for chain_index, record in sorted(latest.items()):
            letters.append(_dead_letter(rows[int(first_row[chain_index])], record, POLICY_NOT_WRITTEN, None))
    return letters


def _dead_letter(
    chain: Mapping[str, Any], record: Mapping[str, Any], reason: str, dlq_timestamp: int | None
) -> dict[str, Any]:
    return {
        "group": chain["group"],
        "broker_name": record["broker_name"],
        "msg_id": record["msg_id"],
        "uniq_key": record["uniq_key"],
        "origin_msg_id": chain["origin_msg_id"],
        "origin_topic": record["origin_topic"],
        "reconsume_times": record["reconsume_times"],
        "first_failure_timestamp": chain["first_failure_timestamp"],
        "dlq_timestamp": dlq_timestamp,
        "body": record["row"],
        "properties": record["row"],
        "attempts": chain["attempts"],
        "reason": reason,
        "redrive_state": None,
    }


# ---------------------------------------------------------------------------------------------
# Moving a previous run on
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Previous:
    """The run moved on: its chains (in Arrow, light rows: ``group``, ``origin_msg_id``, ``state``,
    ``broker_name``, ``first_failure_timestamp`` and ``attempts`` holding at most the first), its
    T, the greatest store time of the retry records and commit time of the retry queue commits it
    had read, and the retry limits it applied. The caller passes its whole tables to :func:`fold`,
    in Arrow."""

    chains: pa.Table
    as_of: int
    through: int
    policies: Mapping[tuple[str, str], int | None]


PREVIOUS_COLUMNS = ("group", "origin_msg_id", "state", "broker_name", "first_failure_timestamp")
"""The columns of :attr:`Previous.chains` besides the first attempt."""


def check_foldable(previous: Previous, as_of: int) -> None:
    """Refuse to move ``previous`` on to ``as_of`` unless that gives the full run's tables.

    Raises:
        CannotFold: why it is not exact.
    """
    if as_of < previous.as_of:
        raise CannotFold(f"as_of {as_of} is before the previous run's ({previous.as_of})")
    if previous.through > previous.as_of:
        raise CannotFold(
            f"the previous run read a record stored after its as_of ({previous.through} > {previous.as_of})"
        )


def touched_chains(
    previous: Previous,
    new_records: Iterable[Mapping[str, Any]],
    policies: Mapping[tuple[str, str], int | None],
    backlog: Iterable[Mapping[str, Any]],
    hosts: Mapping[str, Sequence[str]],
    as_of: int,
) -> set[ChainKey]:
    """The chains computed again (module docstring). The previous chains are sifted in Arrow: only
    those whose original is not plainly their first attempt are looked at one by one.

    Args:
        previous: the run moved on.
        new_records: the ``retry_records`` rows appended since it.
        policies: :func:`policies_at` the new T.
        backlog: the RETRY rows at or after the consumer offset, as of T, of every retry queue
            with commits appended since.
        hosts: :func:`host_prefixes`.
        as_of: T.
    """
    touched = {chain_key(r) for r in new_records if r["store_timestamp"] <= as_of}
    touched |= {chain_key(r) for r in backlog if r["store_timestamp"] <= as_of}
    every = policies.keys() | previous.policies.keys()
    changed = {key for key in every if policies.get(key) != previous.policies.get(key)}
    chains = previous.chains
    if not chains.num_rows:
        return touched
    again = pc.is_in(chains.column("state"), value_set=pa.array(OPEN_STATES, pa.string()))
    if changed:
        pairs = pc.binary_join_element_wise(chains.column("broker_name"), chains.column("group"), _CHAIN_JOIN)
        wanted = pa.array([f"{broker}{_CHAIN_JOIN}{group}" for broker, group in changed], pa.string())
        again = pc.or_(again, pc.is_in(pairs, value_set=wanted))
    again = pc.fill_null(again, False)
    touched |= _keys(chains.filter(again))
    rest = chains.filter(pc.invert(again))
    unsure = rest.filter(pc.invert(_plainly_found(rest, hosts)))
    touched |= {
        (chain["group"], chain["origin_msg_id"]) for chain in unsure.to_pylist() if not _has_original(chain, hosts)
    }
    return touched


def _keys(chains: pa.Table) -> set[ChainKey]:
    return set(zip(chains.column("group").to_pylist(), chains.column("origin_msg_id").to_pylist(), strict=True))


def _plainly_found(chains: pa.Table, hosts: Mapping[str, Sequence[str]]) -> pa.ChunkedArray:
    """Per chain, whether its first attempt is the record its origin id names: a first failure
    (reconsume times 0) whose broker's host prefix and commit log offset, in uppercase hex, spell the
    origin id. Such a chain :func:`_has_original`; a chain where this is false may have one too."""
    first = pc.list_element(
        pc.if_else(pc.greater(pc.list_value_length(chains.column("attempts")), 0), chains.column("attempts"), None), 0
    )
    prefix_of = {broker: prefix for prefix, brokers in hosts.items() for broker in brokers}
    brokers = pa.array(sorted(prefix_of), pa.string())
    prefixes = pa.array([prefix_of[broker] for broker in brokers.to_pylist()], pa.string())
    prefix = pc.take(prefixes, pc.index_in(pc.struct_field(first, "broker_name"), value_set=brokers))
    offset = pc.struct_field(first, "commit_log_offset")
    digits = [pc.bit_wise_and(pc.shift_right(offset, 4 * k), 15) for k in range(15, -1, -1)]
    spelled = pc.binary_join_element_wise(prefix, *(pc.take(_UPPER_HEX, digit) for digit in digits), "")
    plain = pc.and_(
        pc.and_(pc.equal(chains.column("origin_msg_id"), spelled), pc.greater_equal(offset, 0)),
        pc.equal(pc.struct_field(first, "reconsume_times"), 0),
    )
    return pc.fill_null(plain, False)


_UPPER_HEX = pa.array(list("0123456789ABCDEF"), pa.string())


def _has_original(chain: Mapping[str, Any], hosts: Mapping[str, Sequence[str]]) -> bool:
    """Whether the chain's original was found, or its origin id names no known record."""
    positions = origin_positions(chain["origin_msg_id"], hosts)
    if not positions:
        return True
    first = chain["attempts"][0] if chain["attempts"] else None
    if first is None or first["reconsume_times"] != 0:
        return False
    return (first["broker_name"], first["commit_log_offset"]) in positions


def first_failures(previous: Previous, touched: set[ChainKey]) -> list[int]:
    """The first failure times of the ``touched`` chains the previous run had."""
    if not touched or not previous.chains.num_rows:
        return []
    mine = previous.chains.filter(_in_chains(previous.chains, touched))
    return [t for t in mine.column("first_failure_timestamp").to_pylist() if t is not None]


def fold(
    previous_chains: pa.Table,
    previous_dead: pa.Table,
    touched: set[ChainKey],
    records: pa.Table,
    context: Context,
) -> tuple[pa.Table, list[dict[str, Any]], pa.Table]:
    """The ``retry_chains`` and ``dlq`` tables as of ``context.as_of``: the previous rows of chains not
    ``touched`` (kept in Arrow, with the new T), and the touched chains computed from ``records``
    (every record of those chains; others are ignored). Returns the chains, the touched chains'
    dead letters' rows (as :func:`compute` gives them, for the caller to complete) and the kept
    dead letters (their redrive states as the previous run left them)."""
    computed, dead = compute(of_chains(records, touched), context)
    kept_chains = _without(previous_chains, touched)
    as_of = pa.array([context.as_of] * kept_chains.num_rows, pa.int64())
    kept_chains = kept_chains.set_column(kept_chains.schema.get_field_index("as_of"), "as_of", as_of)
    return pa.concat_tables([kept_chains, computed.cast(kept_chains.schema)]), dead, _without(previous_dead, touched)


def with_redrive_states(dead: pa.Table, states: Mapping[tuple[str, str], str]) -> pa.Table:
    """``dead`` (``dlq`` rows in Arrow) with the ``redrive_state`` of each dead letter."""
    pairs = zip(dead.column("broker_name").to_pylist(), dead.column("msg_id").to_pylist(), strict=True)
    column = pa.array([states.get(pair) for pair in pairs], dead.schema.field("redrive_state").type)
    return dead.set_column(dead.schema.get_field_index("redrive_state"), "redrive_state", column)


def _without(table: pa.Table, touched: set[ChainKey]) -> pa.Table:
    """The rows of ``table`` whose (group, origin_msg_id) is not in ``touched``."""
    if not touched or not table.num_rows:
        return table
    return table.filter(pc.invert(_in_chains(table, touched)))


def _in_chains(table: pa.Table, keys: set[ChainKey]) -> pa.ChunkedArray:
    """Per row of ``table``, whether its (group, origin_msg_id) is one of ``keys``."""
    joined = pc.binary_join_element_wise(table.column("group"), table.column("origin_msg_id"), _CHAIN_JOIN)
    wanted = pa.array([f"{group}{_CHAIN_JOIN}{origin}" for group, origin in keys], pa.string())
    return pc.fill_null(pc.is_in(joined, value_set=wanted), False)


_CHAIN_JOIN = "\x00"  # in no group name ([%|a-zA-Z0-9_-]): group and id cannot run together
