"""The incremental ``resolve_transactions``: the previous ``transaction_state`` moved on to a later T by
the transaction records appended since, on the driver (no Spark job). See docs/jobs.md
(resolve_transactions incremental).

A transaction's row is a function of a few figures that only grow as records arrive (the highest
check count, the first op, the first final and how many, whether a copy is a duplicate, whether it
was discarded) and of T. The previous row gives those figures; the new records move them on. Only
transactions the new records touch, and the open ones (PENDING and CHECK_DUE, whose state moves
with T), are decided again; every other row keeps its state, as T only ages it further into the
state it has. The old records are read only where the previous table cannot tell: the half records
at the queue offsets new ops name and at the commit log offsets new finals name, the check
immunity of the open transactions, and any old final or discard naming a new half record. (An old
op naming a new half record's queue offset left a row of an op without half: a new half there
makes the run decide every transaction again.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from broker_model.common import RecordKey
from broker_model.common import constants as c
from jobs.resolve_transactions.transforms import (
    CHECK_DUE,
    COMMITTED,
    DISCARD,
    DISCARDED,
    DOUBLE_COMMIT,
    DUPLICATE_HALF,
    EXPIRED,
    FINAL,
    FINAL_WITHOUT_OP,
    HALF,
    OP,
    OP_ON_REPUT_COPY,
    OP_WITHOUT_HALF,
    PENDING,
    ROLLED_BACK,
    UNKNOWN_OFFSET,
)
from jobs.runs import CannotFold
from schemas.errors import LakeError

OPEN_STATES = (PENDING, CHECK_DUE)  # the states that move with T
COUNTED = ("half_records", "op_records", "ignored_op_records", "final_records", "discard_records")

HalfPosition = tuple[str, int, int]
"""(broker_name, queue_id, queue_offset) of a half record in the half topic."""
TransactionKey = tuple[str, str | None, str]
"""(broker_name, producer group, uniq_key): a transaction of half records that carry a uniq key."""

HalfLookup = Callable[[set[HalfPosition], set[RecordKey]], pa.Table]
"""The HALF rows of ``transaction_records`` at the positions or at the commit log offsets."""
LinkLookup = Callable[[set[RecordKey], set[TransactionKey]], pa.Table]
"""The FINAL rows naming the commit log offsets and the DISCARD rows of the keys, among
``transaction_records``."""


@dataclass(frozen=True)
class Settings:
    """The broker's check settings the states are decided with."""

    timeout_ms: int
    check_max: int
    reserve_ms: int


@dataclass(frozen=True)
class Previous:
    """The run moved on: its table rows, its T, the greatest record store time it had read, and
    its counts of records (:data:`COUNTED`)."""

    rows: list[dict[str, Any]]
    as_of: int
    through: int
    counts: Mapping[str, int]


def check_foldable(previous: Previous, as_of: int) -> None:
    """Refuse to move the previous table on to ``as_of`` unless that gives the full run's table:
    every record it read counted at its T (none waits for a later one) and the new T is not earlier.

    Raises:
        CannotFold: why it is not exact.
    """
    if as_of < previous.as_of:
        raise CannotFold(f"as_of {as_of} is before the previous run's {previous.as_of}")
    if previous.through > previous.as_of:
        raise CannotFold(
            f"the previous run read records stored after its as_of ({previous.through} > {previous.as_of})"
        )
    missing = [name for name in COUNTED if name not in previous.counts]
    if missing:
        raise CannotFold(f"the previous run recorded no {missing[0]}")


@dataclass
class _Transaction:
    """A transaction's figures (a ``transaction_state`` row before its state is decided)."""

    row: dict[str, Any]  # the columns that come from the original half record
    check_times: int | None
    has_duplicate: bool
    first_op: tuple[int, bool] | None  # (op queue offset, on a copy), the least
    final_offset: int | None
    final_count: int
    discarded: bool  # a discard record, or carried over from a DISCARDED row
    immunity: tuple[bool, int | None] | None  # (has immunity, immunity ms); None: not read
    old: bool
    touched: bool = field(default=False)

    @property
    def offset(self) -> int:
        value: int = self.row["half_commit_log_offset"]
        return value


def fold(
    previous: Previous,
    as_of: int,
    settings: Settings,
    new_records: pa.Table,
    lookup_halves: HalfLookup,
    lookup_links: LinkLookup,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The ``transaction_state`` rows as of ``as_of`` and the record counts: ``previous`` moved on
    by ``new_records`` (the ``transaction_records`` rows appended since). Equal to a full run's
    rows when :func:`check_foldable` holds.

    Raises:
        CannotFold: the new records change what the previous table cannot tell (a new half record
            older than its transaction's original, a half at the position of an op without half or
            of an old half, a negative check count): compute from the whole records instead.
    """
    records = [r for r in new_records.to_pylist() if r["store_timestamp"] <= as_of]
    by_id: dict[RecordKey, _Transaction] = {}
    by_key: dict[TransactionKey, _Transaction] = {}
    orphans: dict[tuple[str, int], int] = {}
    for row in previous.rows:
        if row["half_commit_log_offset"] == UNKNOWN_OFFSET:
            orphans[(row["broker_name"], row["half_queue_offset"])] = row["op_queue_offset"]
            continue
        transaction = _from_row(row)
        _index(transaction, by_id, by_key)

    members_at: dict[HalfPosition, dict[int, _Transaction]] = {}
    members_of: dict[RecordKey, _Transaction] = {}
    new_halves = sorted(
        (r for r in records if r["kind"] == HALF), key=lambda r: (r["broker_name"], r["commit_log_offset"])
    )
    created: list[_Transaction] = []
    for half in new_halves:
        if (half["broker_name"], half["queue_offset"]) in orphans:
            raise CannotFold(f"a new half record sits at the queue offset of an op without half: {_where(half)}")
        known = _transaction_of(half, by_id, by_key)
        if known is None:
            known = _from_original(half)
            _index(known, by_id, by_key)
            created.append(known)
        else:
            _add_copy(known, half)
        _member(half, known, members_at, members_of)

    new_positions = {_position(h) for h in new_halves}
    new_offsets = {(h["broker_name"], h["commit_log_offset"]) for h in new_halves}
    links = _unique_links(
        [r for r in records if r["kind"] in (OP, FINAL, DISCARD)],
        lookup_links(new_offsets, {key for t in created if (key := _key(t.row)) is not None}).to_pylist(),
        as_of,
    )
    ops = [r for r in links if r["kind"] == OP and r["removes"] and r["half_queue_offset"] is not None]
    finals = [r for r in links if r["kind"] == FINAL]
    open_old = [t for t in by_id.values() if t.old and t.row["state"] in OPEN_STATES]
    for t in open_old:
        t.touched = True
    wanted_positions = {(r["broker_name"], r["queue_id"], r["half_queue_offset"]) for r in ops}
    wanted_positions |= new_positions  # an old half there: its old ops end the new one too
    wanted_offsets = {(r["broker_name"], r["prepared_transaction_offset"]) for r in finals}
    wanted_offsets |= {(t.row["broker_name"], t.offset) for t in open_old}
    if wanted_positions or wanted_offsets:
        for half in lookup_halves(wanted_positions, wanted_offsets).to_pylist():
            if half["store_timestamp"] > as_of:
                continue
            if _position(half) in new_positions and (half["broker_name"], half["commit_log_offset"]) not in new_offsets:
                raise CannotFold(f"a new half record sits at the queue offset of an old one: {_where(half)}")
            owner = _transaction_of(half, by_id, by_key)
            if owner is None:
                raise CannotFold(f"a half record belongs to no transaction of the previous table: {_where(half)}")
            if half["commit_log_offset"] == owner.offset and owner.immunity is None:
                owner.immunity = (half["has_check_immunity"], half["check_immunity_ms"])
            _member(half, owner, members_at, members_of)

    new_orphans: dict[tuple[str, int], int] = {}
    for op in ops:
        position = (op["broker_name"], op["queue_id"], op["half_queue_offset"])
        members = members_at.get(position)
        if not members:
            orphan = (op["broker_name"], op["half_queue_offset"])
            new_orphans[orphan] = min(new_orphans.get(orphan, op["queue_offset"]), op["queue_offset"])
            continue
        for offset, transaction in members.items():
            candidate = (op["queue_offset"], offset != transaction.offset)
            transaction.first_op = candidate if transaction.first_op is None else min(transaction.first_op, candidate)
            transaction.touched = True
    for final in finals:
        found = members_of.get((final["broker_name"], final["prepared_transaction_offset"]))
        if found is not None:
            found.final_offset = _least(found.final_offset, final["commit_log_offset"])
            found.final_count += 1
            found.touched = True
    for discard in (r for r in links if r["kind"] == DISCARD):
        key = (discard["broker_name"], discard["producer_group"], discard["uniq_key"])
        if discard["producer_group"] is not None and discard["uniq_key"] is not None and key in by_key:
            by_key[key].discarded = True
            by_key[key].touched = True

    rows = [
        _decided(t, as_of, settings) if t.touched or not t.old else {**t.row, "as_of": as_of} for t in by_id.values()
    ]
    for orphan, op_offset in new_orphans.items():
        orphans[orphan] = min(orphans.get(orphan, op_offset), op_offset)
    rows += [_orphan_row(broker, offset, op_offset, as_of) for (broker, offset), op_offset in orphans.items()]
    return rows, _counts(previous.counts, records)


def _from_row(row: Mapping[str, Any]) -> _Transaction:
    anomalies = set((row["anomaly"] or "").split(","))
    op = row["op_queue_offset"]
    final = row["final_commit_log_offset"]
    return _Transaction(
        row=dict(row),
        check_times=row["check_times"],
        has_duplicate=DUPLICATE_HALF in anomalies,
        first_op=None if op is None else (op, OP_ON_REPUT_COPY in anomalies),
        final_offset=final,
        final_count=2 if DOUBLE_COMMIT in anomalies else int(final is not None),
        discarded=row["state"] == DISCARDED,
        immunity=None,
        old=True,
    )


def _from_original(half: Mapping[str, Any]) -> _Transaction:
    row = {
        "broker_name": half["broker_name"],
        "producer_group": half["producer_group"],
        "uniq_key": half["uniq_key"],
        "half_queue_offset": half["queue_offset"],
        "half_commit_log_offset": half["commit_log_offset"],
        "real_topic": half["real_topic"],
        "real_queue_id": half["real_queue_id"],
        "born_timestamp": half["born_timestamp"],
        "state": None,
    }
    immunity = (half["has_check_immunity"], half["check_immunity_ms"])
    return _Transaction(row, half["check_times"], False, None, None, 0, False, immunity, old=False, touched=True)


def _add_copy(transaction: _Transaction, half: Mapping[str, Any]) -> None:
    """A later half record of the transaction (a re-put copy, or a duplicate)."""
    if half["commit_log_offset"] <= transaction.offset:
        raise CannotFold(f"a new half record is not later than its transaction's original: {_where(half)}")
    checks = half["check_times"]
    if checks is not None:
        if checks < 0 and transaction.old:
            raise CannotFold(f"a new half record has a negative check count: {_where(half)}")
        transaction.check_times = checks if transaction.check_times is None else max(transaction.check_times, checks)
    if checks is None and half["prepared_queue_offset"] is None:
        transaction.has_duplicate = True
    transaction.touched = True


def _key(row: Mapping[str, Any]) -> TransactionKey | None:
    return None if row["uniq_key"] is None else (row["broker_name"], row["producer_group"], row["uniq_key"])


def _index(
    transaction: _Transaction, by_id: dict[RecordKey, _Transaction], by_key: dict[TransactionKey, _Transaction]
) -> None:
    by_id[(transaction.row["broker_name"], transaction.offset)] = transaction
    key = _key(transaction.row)
    if key is not None:
        by_key[key] = transaction


def _transaction_of(
    half: Mapping[str, Any], by_id: Mapping[RecordKey, _Transaction], by_key: Mapping[TransactionKey, _Transaction]
) -> _Transaction | None:
    """The transaction a half record belongs to: by its key, or (no uniq key) its own."""
    key = _key(half)
    if key is not None:
        return by_key.get(key)
    return by_id.get((half["broker_name"], half["commit_log_offset"]))


def _member(
    half: Mapping[str, Any],
    transaction: _Transaction,
    members_at: dict[HalfPosition, dict[int, _Transaction]],
    members_of: dict[RecordKey, _Transaction],
) -> None:
    members_at.setdefault(_position(half), {})[half["commit_log_offset"]] = transaction
    members_of[(half["broker_name"], half["commit_log_offset"])] = transaction


def _position(half: Mapping[str, Any]) -> HalfPosition:
    return (half["broker_name"], half["queue_id"], half["queue_offset"])


def _unique_links(new: Iterable[dict[str, Any]], found: Iterable[dict[str, Any]], as_of: int) -> list[dict[str, Any]]:
    """The op, final and discard rows of both lists stored by ``as_of``, each once."""
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    for record in (*new, *found):
        if record["store_timestamp"] <= as_of:
            identity = (record["kind"], record["broker_name"], record["commit_log_offset"], record["half_queue_offset"])
            unique.setdefault(identity, record)
    return list(unique.values())


def _least(current: int | None, value: int) -> int:
    return value if current is None else min(current, value)


def _decided(transaction: _Transaction, as_of: int, settings: Settings) -> dict[str, Any]:
    """The transaction's row as of ``as_of``, decided as :func:`build_transaction_state` decides."""
    row = transaction.row
    check_times = transaction.check_times if transaction.check_times is not None else 0
    has_op, has_final = transaction.first_op is not None, transaction.final_count > 0
    discarded = transaction.discarded or check_times >= settings.check_max
    age = as_of - row["born_timestamp"]
    # the age is a long in the Spark decision, which fails beyond
    if not has_op and not discarded and not c.JAVA_LONG_MIN <= age <= c.JAVA_LONG_MAX:
        raise LakeError(f"as_of {as_of} minus born_timestamp {row['born_timestamp']} overflows a long: {_where(row)}")
    if has_op:
        state = COMMITTED if has_final else ROLLED_BACK
    elif discarded:
        state = DISCARDED
    elif age > settings.reserve_ms:
        state = EXPIRED
    else:
        if transaction.immunity is None:
            raise CannotFold(f"the check immunity of an open transaction was not found: {_where(row)}")
        has_immunity, immunity_ms = transaction.immunity
        immunity = immunity_ms if immunity_ms is not None else settings.timeout_ms
        pending = age < immunity if has_immunity else 0 <= age < settings.timeout_ms
        state = PENDING if pending else CHECK_DUE
    flags = [
        FINAL_WITHOUT_OP if has_final and not has_op else None,
        DOUBLE_COMMIT if transaction.final_count >= 2 else None,
        OP_ON_REPUT_COPY if transaction.first_op is not None and transaction.first_op[1] else None,
        DUPLICATE_HALF if transaction.has_duplicate else None,
    ]
    return {
        **row,
        "state": state,
        "check_times": check_times,
        "op_queue_offset": transaction.first_op[0] if transaction.first_op is not None else None,
        "final_commit_log_offset": transaction.final_offset,
        "as_of": as_of,
        "anomaly": ",".join(flag for flag in flags if flag) or None,
    }


def _orphan_row(broker: str, half_queue_offset: int, op_queue_offset: int, as_of: int) -> dict[str, Any]:
    return {
        "broker_name": broker,
        "producer_group": None,
        "uniq_key": None,
        "half_queue_offset": half_queue_offset,
        "half_commit_log_offset": UNKNOWN_OFFSET,
        "real_topic": None,
        "real_queue_id": None,
        "state": ROLLED_BACK,
        "check_times": None,
        "op_queue_offset": op_queue_offset,
        "final_commit_log_offset": None,
        "born_timestamp": None,
        "as_of": as_of,
        "anomaly": OP_WITHOUT_HALF,
    }


def _counts(previous: Mapping[str, int], records: list[dict[str, Any]]) -> dict[str, int]:
    """The previous run's record counts plus the new records' (stored by T)."""
    ops = {(r["broker_name"], r["commit_log_offset"]) for r in records if r["kind"] == OP}
    ignored = {(r["broker_name"], r["commit_log_offset"]) for r in records if r["kind"] == OP and not r["removes"]}
    added = {
        "half_records": sum(r["kind"] == HALF for r in records),
        "op_records": len(ops),
        "ignored_op_records": len(ignored),
        "final_records": sum(r["kind"] == FINAL for r in records),
        "discard_records": sum(r["kind"] == DISCARD for r in records),
    }
    return {name: previous[name] + added[name] for name in COUNTED}


def _where(record: Mapping[str, Any]) -> str:
    offset = record.get("commit_log_offset", record.get("half_commit_log_offset"))
    return f"broker {record['broker_name']}, commit log offset {offset}"
