"""The commit log record: RocketMQ's exact byte layout, length formula, encoder and decoder.

A record is handled as a dict of ``commitlog`` columns (without ``broker_name`` and
``segment``). ``encode_record(row)`` gives the exact bytes RocketMQ writes, so
``len(encode_record(row)) == row["store_size"]``; ``decode_record`` is its inverse.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from broker_model.common import body_crc, create_msg_id, decode_properties, host_from_bytes, parse_host
from broker_model.common import constants as c
from schemas.errors import CorruptRecordError

# TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTIMESTAMP
RECORD_HEAD = struct.Struct(">iiiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP: 48 bytes
_STORE_TS = struct.Struct(">q")
_TAIL = struct.Struct(">iq")  # RECONSUMETIMES, PREPARED_TRANSACTION_OFFSET
RECORD_INT = struct.Struct(">i")  # BODYLENGTH and the other int fields
RECORD_SHORT = struct.Struct(">h")  # a v2 TOPICLENGTH and PROPERTIESLENGTH
_BLANK = struct.Struct(">ii")


FIXED_RECORD_LENGTH = 91
"""``calMsgLength`` with IPv4 hosts and magic v1, without the body, topic and property bytes."""
IPV6_HOST_EXTRA = 12
"""What an IPv6 host adds to a record over an IPv4 one (16 address bytes instead of 4)."""
MAGIC_V2_EXTRA = 1
"""What magic v2 adds to a record (a two-byte topic length instead of one)."""


RECORD_COLUMNS: Final = (
    "commit_log_offset",
    "store_size",
    "magic_code",
    "body_crc",
    "queue_id",
    "flag",
    "queue_offset",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "store_timestamp",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "body",
    "topic",
    "raw_properties",
)
"""The ``commitlog`` columns a record's bytes carry: what :func:`encode_record` reads."""


def record_length(
    body_length: int,
    topic_length: int,
    properties_length: int,
    born_v6: bool = False,
    store_v6: bool = False,
    magic_v2: bool = False,
) -> int:
    """RocketMQ's ``calMsgLength``: the exact record size in bytes.

    All lengths are UTF-8 byte lengths. With IPv4 hosts and magic v1 this is
    ``91 + body + topic + properties``; each IPv6 host adds 12 bytes, magic v2 adds 1.
    """
    extra = IPV6_HOST_EXTRA * (born_v6 + store_v6) + MAGIC_V2_EXTRA * magic_v2
    return FIXED_RECORD_LENGTH + extra + body_length + topic_length + properties_length


def magic_for_topic(topic: str) -> int:
    """The magic code a 5.x broker uses for ``topic``: v2 only when it is over 127 chars."""
    return c.MAGIC_CODE_V2 if len(topic) > c.V1_MAX_TOPIC_LENGTH else c.MAGIC_CODE_V1


def encode_record(row: dict[str, Any]) -> bytes:
    """Encode a ``commitlog`` row to its exact record bytes.

    Uses ``raw_properties`` for the PROPERTIES bytes, ``magic_code`` for the topic-length width,
    and the IPv6 bits of ``sys_flag`` for the host widths. ``body_crc`` is written as stored.
    """
    born = parse_host(row["born_host"], "born_host")
    store = parse_host(row["store_host"], "store_host")
    topic = row["topic"].encode("utf-8")
    props: bytes = row["raw_properties"]
    body: bytes = row["body"]
    v2 = row["magic_code"] == c.MAGIC_CODE_V2
    parts = [
        RECORD_HEAD.pack(
            row["store_size"],
            row["magic_code"],
            row["body_crc"],
            row["queue_id"],
            row["flag"],
            row["queue_offset"],
            row["commit_log_offset"],
            row["sys_flag"],
            row["born_timestamp"],
        ),
        born.to_bytes(),
        _STORE_TS.pack(row["store_timestamp"]),
        store.to_bytes(),
        _TAIL.pack(row["reconsume_times"], row["prepared_transaction_offset"]),
        RECORD_INT.pack(len(body)),
        body,
        RECORD_SHORT.pack(len(topic)) if v2 else struct.pack(">B", len(topic)),  # Java writes (byte) len
        topic,
        RECORD_SHORT.pack(len(props)),
        props,
    ]
    return b"".join(parts)


def encode_blank(remaining: int) -> bytes:
    """The 8-byte end-of-segment marker: TOTALSIZE = bytes left in the segment, BLANK magic."""
    return _BLANK.pack(remaining, c.BLANK_MAGIC_CODE)


def peek_header(data: bytes | memoryview, position: int) -> tuple[int, int]:
    """(TOTALSIZE, MAGIC) of the record or blank at ``position``; (0, 0) past the data."""
    if position + 8 > len(data):
        return 0, 0
    size, magic = _BLANK.unpack_from(data, position)
    return size, magic


def decode_record(
    data: bytes | memoryview, position: int = 0, source: str = "<bytes>", check_crc: bool = True
) -> dict[str, Any]:
    """Decode the record starting at ``position`` of ``data`` into a ``commitlog`` row.

    The row has every ``commitlog`` column except ``broker_name`` and ``segment``.

    Raises:
        CorruptRecordError: bad magic, truncated record, TOTALSIZE different from the length the
            fields add up to, or (with ``check_crc``) a body CRC mismatch; names ``source`` and
            ``position``.
    """
    try:
        row = _decode(data, position)
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise CorruptRecordError(source, position, f"undecodable record: {exc}") from None
    expected = record_length(
        len(row["body"]),
        len(row["topic"].encode("utf-8")),
        len(row["raw_properties"]),
        bool(row["sys_flag"] & c.BORNHOST_V6_FLAG),
        bool(row["sys_flag"] & c.STOREHOSTADDRESS_V6_FLAG),
        row["magic_code"] == c.MAGIC_CODE_V2,
    )
    if expected != row["store_size"]:
        raise CorruptRecordError(source, position, f"TOTALSIZE {row['store_size']} but the fields add up to {expected}")
    if check_crc and body_crc(row["body"]) != row["body_crc"]:
        raise CorruptRecordError(
            source, position, f"body CRC {row['body_crc']} but the body's CRC is {body_crc(row['body'])}"
        )
    return row


def _decode(data: bytes | memoryview, position: int) -> dict[str, Any]:
    (size, magic, crc, queue_id, flag, queue_offset, offset, sys_flag, born_ts) = RECORD_HEAD.unpack_from(
        data, position
    )
    if magic not in (c.MAGIC_CODE_V1, c.MAGIC_CODE_V2):
        raise ValueError(f"bad magic code {magic} (0x{magic & 0xFFFFFFFF:08X})")
    if size <= 0 or position + size > len(data):
        raise ValueError(f"TOTALSIZE {size} runs past the end of the data")
    p = position + RECORD_HEAD.size
    born_len = 20 if sys_flag & c.BORNHOST_V6_FLAG else 8
    born = host_from_bytes(bytes(data[p : p + born_len]))
    p += born_len
    (store_ts,) = _STORE_TS.unpack_from(data, p)
    p += 8
    store_len = 20 if sys_flag & c.STOREHOSTADDRESS_V6_FLAG else 8
    store = host_from_bytes(bytes(data[p : p + store_len]))
    p += store_len
    reconsume, prepared = _TAIL.unpack_from(data, p)
    p += _TAIL.size
    (body_len,) = RECORD_INT.unpack_from(data, p)
    body = bytes(data[p + 4 : p + 4 + body_len])
    p += 4 + body_len
    if magic == c.MAGIC_CODE_V2:
        (topic_len,) = RECORD_SHORT.unpack_from(data, p)
        p += 2
    else:
        topic_len = data[p]
        p += 1
    topic = bytes(data[p : p + topic_len]).decode("utf-8")
    p += topic_len
    (props_len,) = RECORD_SHORT.unpack_from(data, p)
    raw_properties = bytes(data[p + 2 : p + 2 + props_len])
    if min(body_len, topic_len, props_len) < 0 or len(body) != body_len or len(raw_properties) != props_len:
        raise ValueError("a length field runs past the record")
    properties = decode_properties(raw_properties.decode("utf-8", errors="replace"))
    return {
        "commit_log_offset": offset,
        "store_size": size,
        "magic_code": magic,
        "body_crc": crc,
        "queue_id": queue_id,
        "flag": flag,
        "queue_offset": queue_offset,
        "sys_flag": sys_flag,
        "born_timestamp": born_ts,
        "born_host": str(born),
        "store_timestamp": store_ts,
        "store_host": str(store),
        "reconsume_times": reconsume,
        "prepared_transaction_offset": prepared,
        "body": body,
        "topic": topic,
        "properties": properties,
        "raw_properties": raw_properties,
        "tags": properties.get(c.PROPERTY_TAGS),
        "keys": properties.get(c.PROPERTY_KEYS),
        "uniq_key": properties.get(c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
        "msg_id": create_msg_id(store, offset),
    }
