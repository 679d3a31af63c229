"""An independent recomputation of every commit log invariant, used by the broker tests.

Nothing here calls the broker's own offset code: offsets, segments and queue offsets are
recomputed from RocketMQ's rules and compared with what the broker stored.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from broker_model.common import body_crc, create_msg_id, decode_properties, parse_host
from broker_model.common import constants as c
from broker_model.store import decode_record, encode_record


def read_log(lake: Path, broker_name: str) -> list[dict[str, Any]]:
    """The broker's commit log rows, sorted by commit_log_offset (read with delta-rs)."""
    table = DeltaTable(str(lake / "commitlog")).to_pyarrow_table(filters=[("broker_name", "=", broker_name)])
    rows = table.sort_by("commit_log_offset").to_pylist()
    for row in rows:
        row["properties"] = dict(row["properties"])
    return rows


def check_log(rows: list[dict[str, Any]], segment_size: int) -> list[str]:
    """Every violation of the commit log rules in ``rows`` (one broker, offset order); [] if none.

    Checks: physical offsets contiguous from 0, a record never spanning segments and leaving room
    for the 8-byte blank, the segment column, the exact record length, the body CRC, the
    msg_id, the denormalised property columns, and queue offsets contiguous from 0 per queue.
    """
    problems: list[str] = []
    expected = 0
    queue_next: dict[tuple[str, int], int] = defaultdict(int)
    for row in rows:
        offset, size = row["commit_log_offset"], row["store_size"]
        base = expected - expected % segment_size
        if expected + size + c.END_FILE_MIN_BLANK_LENGTH > base + segment_size:
            expected = base + segment_size
        if offset != expected:
            problems.append(f"offset {offset}: expected {expected}")
            expected = offset
        if row["segment"] != offset - offset % segment_size:
            problems.append(f"offset {offset}: segment {row['segment']}")
        if offset + size + c.END_FILE_MIN_BLANK_LENGTH > row["segment"] + segment_size:
            problems.append(f"offset {offset}: record of {size} bytes overruns its segment")
        problems.extend(_check_record(row))
        if row["sys_flag"] & c.TRANSACTION_ROLLBACK_TYPE in (c.TRANSACTION_NOT_TYPE, c.TRANSACTION_COMMIT_TYPE):
            key = (row["topic"], row["queue_id"])
            if row["queue_offset"] != queue_next[key]:
                problems.append(f"offset {offset}: queue {key} at {row['queue_offset']}, expected {queue_next[key]}")
            queue_next[key] = row["queue_offset"] + 1
        expected = offset + size
    return problems


def _check_record(row: dict[str, Any]) -> list[str]:
    offset = row["commit_log_offset"]
    problems = []
    encoded = encode_record(row)
    if len(encoded) != row["store_size"]:
        problems.append(f"offset {offset}: encoded {len(encoded)} bytes, store_size {row['store_size']}")
    decoded = decode_record(encoded)
    for name, value in decoded.items():
        if row[name] != value:
            problems.append(f"offset {offset}: {name} decodes as {value!r}, stored {row[name]!r}")
    if body_crc(row["body"]) != row["body_crc"]:
        problems.append(f"offset {offset}: body CRC")
    if row["msg_id"] != create_msg_id(parse_host(row["store_host"]), offset):
        problems.append(f"offset {offset}: msg_id {row['msg_id']}")
    properties = decode_properties(row["raw_properties"].decode())
    if properties != row["properties"]:
        problems.append(f"offset {offset}: properties column differs from raw_properties")
    for column, key in (("tags", c.PROPERTY_TAGS), ("keys", c.PROPERTY_KEYS), ("uniq_key", "UNIQ_KEY")):
        if row[column] != properties.get(key):
            problems.append(f"offset {offset}: {column} {row[column]!r} vs property {properties.get(key)!r}")
    return problems
