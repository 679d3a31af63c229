"""Hand-built ``commitlog`` rows: one record with every column as a broker stores it, a broker's
layout of records at consecutive offsets, and the rows as an Arrow table or a Spark frame.

A record's derived columns (``magic_code``, ``raw_properties``, ``store_size``, ``body_crc``,
``tags``, ``keys``, ``uniq_key``, ``msg_id``) follow from the others by RocketMQ's rules; a test
that needs one of them wrong (a corrupt CRC, a size nothing accounts for) gives it explicitly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from broker_model.common import body_crc, create_msg_id, encode_properties, parse_host
from broker_model.common import constants as c
from broker_model.store import RECORD_COLUMNS, magic_for_topic, record_length, rows_to_table
from schemas.catalog import COMMITLOG, spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T0 = 1_700_000_000_000
"""Default store time of a built record, epoch milliseconds."""
BORN_HOST = "10.0.0.9:5000"
STORE_HOST = "10.0.0.1:10911"
SEGMENT_SIZE = 4096
"""Default segment size of :func:`laid_out`: small, so that a few records roll a segment."""

DERIVED_COLUMNS = ("magic_code", "raw_properties", "store_size", "body_crc", "tags", "keys", "uniq_key", "msg_id")


def commitlog_record(
    *,
    broker_name: str = "broker-a",
    topic: str = "TopicA",
    queue_id: int = 0,
    queue_offset: int = 0,
    body: bytes = b"hello",
    properties: Mapping[str, str] | None = None,
    sys_flag: int = 0,
    commit_log_offset: int = 0,
    segment: int = 0,
    store_timestamp: int = T0,
    born_timestamp: int | None = None,
    born_host: str = BORN_HOST,
    store_host: str = STORE_HOST,
    flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    **derived: Any,
) -> dict[str, Any]:
    """One ``commitlog`` row, every column of the catalog in its order, as a broker stores it.

    ``born_timestamp`` defaults to ``store_timestamp``; ``sys_flag`` gets the IPv6 bit of each
    IPv6 host. Unless given in ``derived``:

    - ``magic_code``: v1, or v2 for a topic over 127 characters (:func:`magic_for_topic`);
    - ``raw_properties``: ``encode_properties(properties)`` (trailing separator, RocketMQ 5.2+);
    - ``store_size``: RocketMQ's record length of the body, topic and ``raw_properties``, with the
      host widths of the ``sys_flag`` IPv6 bits and the topic length width of ``magic_code``;
    - ``body_crc``: ``body_crc(body)``;
    - ``tags``, ``keys``, ``uniq_key``: the TAGS, KEYS and UNIQ_KEY properties, None when absent;
    - ``msg_id``: ``create_msg_id(store_host, commit_log_offset)``.

    A derived column given is kept as given; the others still follow from it (a given
    ``raw_properties`` sets the ``store_size``, say).
    """
    unknown = set(derived) - set(DERIVED_COLUMNS)
    if unknown:
        raise TypeError(f"not a derived commitlog column: {sorted(unknown)}")
    props = dict(properties or {})
    born, store = parse_host(born_host), parse_host(store_host)
    sys_flag |= (c.BORNHOST_V6_FLAG if born.is_v6 else 0) | (c.STOREHOSTADDRESS_V6_FLAG if store.is_v6 else 0)
    magic_code = derived.get("magic_code", magic_for_topic(topic))
    raw_properties = derived.get("raw_properties", encode_properties(props).encode())
    store_size = record_length(
        len(body),
        len(topic.encode()),
        len(raw_properties),
        born_v6=bool(sys_flag & c.BORNHOST_V6_FLAG),
        store_v6=bool(sys_flag & c.STOREHOSTADDRESS_V6_FLAG),
        magic_v2=magic_code == c.MAGIC_CODE_V2,
    )
    row = {
        "broker_name": broker_name,
        "segment": segment,
        "commit_log_offset": commit_log_offset,
        "store_size": store_size,
        "magic_code": magic_code,
        "body_crc": body_crc(body),
        "queue_id": queue_id,
        "flag": flag,
        "queue_offset": queue_offset,
        "sys_flag": sys_flag,
        "born_timestamp": store_timestamp if born_timestamp is None else born_timestamp,
        "born_host": born_host,
        "store_timestamp": store_timestamp,
        "store_host": store_host,
        "reconsume_times": reconsume_times,
        "prepared_transaction_offset": prepared_transaction_offset,
        "body": body,
        "topic": topic,
        "properties": props,
        "raw_properties": raw_properties,
        "tags": props.get(c.PROPERTY_TAGS),
        "keys": props.get(c.PROPERTY_KEYS),
        "uniq_key": props.get(c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
        "msg_id": create_msg_id(store, commit_log_offset),
    }
    row.update(derived)
    return {name: row[name] for name in COMMITLOG.column_names}


def record_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """The ``RECORD_COLUMNS`` of a built row: what encoding it writes and decoding gives back."""
    return {name: row[name] for name in RECORD_COLUMNS}


def laid_out(
    records: Iterable[dict[str, Any]], segment_size: int = SEGMENT_SIZE, start: int = 0
) -> list[dict[str, Any]]:
    """``records`` (of one broker) placed as the broker places them: contiguous from ``start``,
    rolling to the next segment when a record and the 8-byte blank do not fit in what is left.

    Returns new rows with ``commit_log_offset``, ``segment`` and ``msg_id`` set; the stored
    ``store_size`` decides where the next record starts, right or not.
    """
    placed, offset = [], start
    for record in records:
        base = offset - offset % segment_size
        if offset + record["store_size"] + c.END_FILE_MIN_BLANK_LENGTH > base + segment_size:
            offset = base + segment_size
        msg_id = create_msg_id(parse_host(record["store_host"]), offset)
        placed.append(
            {**record, "commit_log_offset": offset, "segment": offset - offset % segment_size, "msg_id": msg_id}
        )
        offset += record["store_size"]
    return placed


def commitlog_table(records: Iterable[dict[str, Any]]) -> pa.Table:
    """``records`` as an Arrow table in the catalog's ``commitlog`` schema."""
    return rows_to_table(records)


def commitlog_frame(spark: SparkSession, records: Iterable[dict[str, Any]]) -> DataFrame:
    """``records`` as a Spark frame in the catalog's ``commitlog`` schema."""
    rows = [tuple(r[n] for n in COMMITLOG.column_names) for r in records]
    return spark.createDataFrame(rows, spark_schema(COMMITLOG))
