"""The report's rows: the small aggregations of the lake's tables that its tables and plots show."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import QUEUE_KEY

Row = dict[str, Any]


def utc_datetime(epoch_ms: int) -> datetime:
    """The UTC time of epoch milliseconds."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC)


def ascending(value: Any) -> tuple[bool, Any]:
    """A sort key putting None first, as an ascending Spark sort does."""
    return value is not None, value


def lag_per_queue(offsets: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per (group, broker_name, topic, queue_id) of ``consumer_offsets`` rows: ``consumer_offset``,
    ``broker_offset``, ``diff`` (a null diff, QUEUE_NOT_FOUND, as 0) and
    ``oldest_unconsumed_timestamp``; the largest diff first."""
    rows = [
        {
            "group": r["group"],
            **{k: r[k] for k in QUEUE_KEY},
            "consumer_offset": r["consumer_offset"],
            "broker_offset": r["broker_offset"],
            "diff": r["diff"] if r["diff"] is not None else 0,
            "oldest_unconsumed_timestamp": r["oldest_unconsumed_timestamp"],
        }
        for r in offsets
    ]
    return sorted(rows, key=lambda r: (-r["diff"], *(ascending(r[k]) for k in ("group", *QUEUE_KEY))))


def lag_per_group(offsets: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per group: ``lag`` (sum of ``diff``, nulls as 0) and ``queues`` (rows of the group); the
    largest lag first."""
    groups: dict[str, list[int]] = {}
    for r in offsets:
        total = groups.setdefault(r["group"], [0, 0])
        total[0] += r["diff"] or 0
        total[1] += 1
    rows = [{"group": g, "lag": lag, "queues": queues} for g, (lag, queues) in groups.items()]
    return sorted(rows, key=lambda r: (-r["lag"], r["group"]))


def dead_letters_per_day(dead: pa.Table) -> list[Row]:
    """Per group and UTC day (``yyyy-MM-dd`` of ``dlq_timestamp``, None for letters not written
    yet) of ``dead`` (``dlq`` rows, at least ``group`` and ``dlq_timestamp``): ``dead_letters``; by
    day, then group. Counted with Arrow: a lake's letters are many, its rows here few."""
    stamps = pc.cast(dead["dlq_timestamp"], pa.timestamp("ms", tz="UTC"))
    days = pa.table({"group": dead["group"], "day": pc.strftime(stamps, format="%Y-%m-%d")})
    counted = days.group_by(["group", "day"], use_threads=False).aggregate([("group", "count", _ALL)])
    rows = [{"group": r["group"], "day": r["day"], "dead_letters": r["group_count"]} for r in counted.to_pylist()]
    return sorted(rows, key=lambda r: (ascending(r["day"]), r["group"]))


def transaction_outcomes(states: pa.Table) -> list[Row]:
    """Per ``state`` of ``states`` (``transaction_state`` rows, at least ``state`` and
    ``anomaly``): ``transactions``, and ``anomalies`` (rows with a non-null anomaly); the most
    transactions first."""
    counted = states.group_by("state", use_threads=False).aggregate([("state", "count", _ALL), ("anomaly", "count")])
    rows = [
        {"state": r["state"], "transactions": r["state_count"], "anomalies": r["anomaly_count"]}
        for r in counted.to_pylist()
    ]
    return sorted(rows, key=lambda r: (-r["transactions"], r["state"]))


_ALL = pc.CountOptions(mode="all")  # rows, nulls included


def integrity_summary(findings: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per ``problem``: ``findings`` and ``brokers`` (distinct brokers with the problem)."""
    problems: dict[str, tuple[int, set[str]]] = {}
    for r in findings:
        count, brokers = problems.get(r["problem"], (0, set()))
        brokers.add(r["broker_name"])
        problems[r["problem"]] = (count + 1, brokers)
    return [{"problem": p, "findings": n, "brokers": len(b)} for p, (n, b) in sorted(problems.items())]


def store_files(ingests: Iterable[Mapping[str, Any]], known: Mapping[str, str]) -> list[Row]:
    """Per broker ingested from a RocketMQ store, the files and folders its latest ``store_ingests``
    row (the greatest ``commitlog_version``) lists as not read: ``broker_name``, ``path``,
    ``bytes``, ``holds`` (from ``known``, path -> what it holds; a ``.bak`` copy as its file; else
    "not known to this product"), ``ingested_timestamp`` and ``store_dir`` of that row; by broker
    and path.
    Rows of older releases, without the listing, list nothing."""
    latest: dict[str, Mapping[str, Any]] = {}
    for r in ingests:
        seen = latest.get(r["broker_name"])
        if seen is None or r["commitlog_version"] > seen["commitlog_version"]:
            latest[r["broker_name"]] = r
    rows = []
    for broker, r in sorted(latest.items()):
        for path, size in sorted(r["unread"] or []):
            original = path.removesuffix(".bak")
            holds = known.get(path) or (f"the previous copy: {known[original]}" if original in known else None)
            rows.append(
                {
                    "broker_name": broker,
                    "path": path,
                    "bytes": size,
                    "holds": holds or "not known to this product",
                    "ingested_timestamp": r["ingested_timestamp"],
                    "store_dir": r["store_dir"],
                }
            )
    return rows
