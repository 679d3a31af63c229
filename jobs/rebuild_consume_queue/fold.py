"""Consume queue rows and record checks of a few commit log rows, computed on the driver.

An incremental ``rebuild_consume_queue`` run over a small, clean increment needs no Spark job:
the new rows are read with pyarrow, checked here and in :mod:`jobs.log_chains`, and their consume-queue rows
appended with delta-rs. These functions give the same answers as the job's Spark columns
(``record_checks`` and ``with_tags_code`` in :mod:`jobs.rebuild_consume_queue.transforms`); where a
row is unusual enough that they might not (property bytes that are not UTF-8), they decline and the
job takes the Spark path.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import constants as c
from broker_model.common import consume_queue_tags_code, dispatched_mask, tags_code
from broker_model.store import FIXED_RECORD_LENGTH, IPV6_HOST_EXTRA
from jobs.rebuild_consume_queue.transforms import RECORD_PLACE_COLUMNS
from jobs.runs import CannotFold
from schemas.catalog import CONSUME_QUEUE

# the columns of the new rows the driver path reads
DRIVER_COLUMNS = (
    *RECORD_PLACE_COLUMNS,
    "sys_flag",
    "tags",
    "magic_code",
    "body_crc",
    "body",
    "raw_properties",
    "store_timestamp",
)
_DELAY = re.compile(
    f"(?:^|{c.PROPERTY_SEPARATOR}){c.PROPERTY_DELAY_TIME_LEVEL}{c.NAME_VALUE_SEPARATOR}([^{c.PROPERTY_SEPARATOR}]+)"
)


def has_record_problem(rows: pa.Table, segment_sizes: Mapping[str, int]) -> bool:
    """Whether a record of ``rows`` (:data:`DRIVER_COLUMNS`) fails a check of ``record_checks``:
    its body CRC, RocketMQ's length of its body, topic and properties (or an unknown magic
    code), its segment column, or its end (with the 8-byte blank) beyond its segment."""
    if rows.num_rows == 0:
        return False
    crcs = np.fromiter((zlib.crc32(body) & 0x7FFFFFFF for body in rows["body"].to_pylist()), np.int64, rows.num_rows)
    if np.any(crcs != _ints(rows["body_crc"])):
        return True
    magic, sys_flag = _ints(rows["magic_code"]), _ints(rows["sys_flag"])
    if not np.all((magic == c.MAGIC_CODE_V1) | (magic == c.MAGIC_CODE_V2)):
        return True
    length = (
        FIXED_RECORD_LENGTH
        + _ints(pc.binary_length(rows["body"]))
        + _ints(pc.binary_length(rows["topic"]))
        + _ints(pc.binary_length(rows["raw_properties"]))
        + (magic == c.MAGIC_CODE_V2)
        + IPV6_HOST_EXTRA * ((sys_flag & c.BORNHOST_V6_FLAG) != 0)
        + IPV6_HOST_EXTRA * ((sys_flag & c.STOREHOSTADDRESS_V6_FLAG) != 0)
    )
    offset, size, segment = (_ints(rows[n]) for n in ("commit_log_offset", "store_size", "segment"))
    if np.any(length != size):
        return True
    brokers = rows["broker_name"].to_pylist()
    segment_size = np.array([segment_sizes.get(b, c.DEFAULT_SEGMENT_SIZE) for b in brokers], dtype=np.int64)
    beyond = offset + size + c.END_FILE_MIN_BLANK_LENGTH > segment + segment_size
    return bool(np.any(segment != offset - offset % segment_size) or np.any(beyond))


def consume_queue_rows(rows: pa.Table) -> pa.Table:
    """The ``consume_queue`` rows of the dispatched records of ``rows`` (:data:`DRIVER_COLUMNS`),
    sorted by queue and queue offset as the Spark write sorts them.

    Raises:
        CannotFold: property bytes on the schedule topic that are not UTF-8 (the driver does not
            decide on them exactly as the Spark columns do).
    """
    cq_rows = rows.filter(dispatched_mask(rows["sys_flag"]))
    distinct = pc.unique(cq_rows["tags"])
    hashes = np.array([tags_code(t) for t in distinct.to_pylist()], dtype=np.int64)
    codes = hashes[_ints(pc.index_in(cq_rows["tags"], value_set=distinct, skip_nulls=False))]
    topics = cq_rows["topic"].to_pylist()
    for i in (i for i, topic in enumerate(topics) if topic == c.SCHEDULE_TOPIC):
        delay = _delay_property(cq_rows["raw_properties"][i].as_py())
        tags = cq_rows["tags"][i].as_py()
        codes[i] = consume_queue_tags_code(c.SCHEDULE_TOPIC, tags, delay, cq_rows["store_timestamp"][i].as_py())
    table = cq_rows.select([n for n in CONSUME_QUEUE.column_names if n != "tags_code"])
    table = table.append_column("tags_code", pa.array(codes, pa.int64()))
    ordered = table.sort_by(
        [
            ("topic", "ascending"),
            ("broker_name", "ascending"),
            ("queue_id", "ascending"),
            ("queue_offset", "ascending"),
            ("commit_log_offset", "ascending"),
        ]
    )
    return ordered.select(CONSUME_QUEUE.column_names).cast(CONSUME_QUEUE.arrow_schema)


def _delay_property(raw_properties: bytes) -> str | None:
    """The DELAY value of a record's property bytes as the broker reads a stored record
    (``string2messageProperties``: the last entry wins), None when absent."""
    try:
        text = raw_properties.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CannotFold("property bytes that are not UTF-8 on the schedule topic") from err
    values = _DELAY.findall(text)
    return values[-1] if values else None


def _ints(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy(), dtype=np.int64)
