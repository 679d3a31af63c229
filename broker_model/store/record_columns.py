"""Commit log records decoded straight into ``commitlog`` columns, for reading a whole RocketMQ
commit log fast (``ingest-store``).

:class:`RecordColumns` checks each record as :func:`~broker_model.store.record.decode_record` and
:func:`~broker_model.store.segment_files.decode_file_record` do (magic code, TOTALSIZE against the
length formula, body CRC, physical offset, room for a blank marker) and appends its fields to
column lists: hosts and topics are decoded once per distinct value, the offset message id is the
store host's hex plus the offset's, bodies and property strings are gathered into one buffer
each. A record that fails a check is handed to :func:`decode_file_record` for its exact error.
:func:`decode_record` stays the reference: a differential test compares both on generated
records.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_model.common import constants as c
from broker_model.common import host_from_bytes
from broker_model.common.constants import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
from broker_model.store.record import RECORD_HEAD, RECORD_INT, RECORD_SHORT, record_length
from schemas.catalog import COMMITLOG


class RecordColumns:
    """The records of one broker's commit log, decoded and checked into ``commitlog`` columns.

    Records are added from one mapped file at a time; :meth:`table` must be called before that
    file's memory goes away (the columns keep views of it).
    """

    def __init__(self, broker_name: str) -> None:
        self.broker_name = broker_name
        self._hosts: dict[bytes, tuple[str, str]] = {}  # raw host -> (text, msg id prefix)
        self._topics: dict[bytes, str] = {}
        self._data: memoryview | None = None
        self._base = 0
        self._reset()

    def _reset(self) -> None:
        self._positions: list[int] = []
        self._v6: list[int] = []  # positions of records with an IPv6 host
        self._topic_names: list[str] = []
        self._bodies: list[memoryview] = []
        self._properties: list[memoryview] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._positions)

    def add(self, data: memoryview, position: int, base: int, file_size: int) -> int | None:
        """Check the record at ``position`` of the file at ``base`` (``file_size`` bytes, ``data``
        its content) and take it; its TOTALSIZE, or None when a check fails (nothing taken:
        :func:`decode_file_record` gives the error). Every record of a table comes from one file."""
        if self._positions and data is not self._data:
            raise ValueError("RecordColumns.add: a record of another file before table() was taken")
        try:
            size, magic, crc, _, _, _, offset, sys_flag, _ = RECORD_HEAD.unpack_from(data, position)
        except struct.error:
            return None
        end = position + size
        if magic not in (c.MAGIC_CODE_V1, c.MAGIC_CODE_V2) or size <= 0 or end > len(data):
            return None
        born_len = 20 if sys_flag & c.BORNHOST_V6_FLAG else 8
        store_len = 20 if sys_flag & c.STOREHOSTADDRESS_V6_FLAG else 8
        p = position + 48 + born_len + 8 + store_len + 12
        (body_len,) = RECORD_INT.unpack_from(data, p)
        body_at = p + 4
        p = body_at + body_len
        if body_len < 0 or p + 3 > end:
            return None
        if v2 := magic == c.MAGIC_CODE_V2:
            (topic_len,) = RECORD_SHORT.unpack_from(data, p)
            p += 2
        else:
            topic_len = data[p]
            p += 1
        topic_at = p
        p += topic_len
        if topic_len < 0 or p + 2 > end:
            return None
        (props_len,) = RECORD_SHORT.unpack_from(data, p)
        expected = record_length(body_len, topic_len, props_len, born_len == 20, store_len == 20, v2)
        body = data[body_at : body_at + body_len]
        if props_len < 0 or expected != size or (zlib.crc32(body) & 0x7FFFFFFF) != crc:
            return None
        if offset != base + position or file_size - end < c.END_FILE_MIN_BLANK_LENGTH:
            return None
        raw_topic = bytes(data[topic_at : topic_at + topic_len])
        topic = self._topics.get(raw_topic)
        if topic is None:
            try:
                topic = self._topics[raw_topic] = raw_topic.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if born_len == 20 or store_len == 20:
            self._v6.append(len(self._positions))
        self._data, self._base = data, base
        self._positions.append(position)
        self._topic_names.append(topic)
        self._bodies.append(body)
        self._properties.append(data[p + 2 : p + 2 + props_len])
        self.bytes += size
        return int(size)

    def _host(self, raw: bytes) -> tuple[str, str]:
        known = self._hosts.get(raw)
        if known is None:
            known = self._hosts[raw] = (str(host_from_bytes(raw)), raw.hex().upper())
        return known

    def table(self) -> pa.Table:
        """The records taken since the last call, as an Arrow table in the ``commitlog`` schema."""
        schema = COMMITLOG.arrow_schema
        count = len(self)
        arrays: dict[str, pa.Array | np.ndarray | list[Any]] = {}
        if count:
            assert self._data is not None
            arrays.update(self._fixed(np.frombuffer(self._data, dtype=np.uint8), np.array(self._positions)))
        else:
            empty = (*_INTS, *_LONGS, *_LONGS_AFTER_HOSTS, "born_host", "store_host", "msg_id")
            arrays.update({name: [] for name in empty})
        raw_properties = _binary(self._properties)
        properties = decode_property_column(raw_properties).cast(schema.field("properties").type)
        arrays.update(
            {
                "broker_name": [self.broker_name] * count,
                "segment": np.full(count, self._base, dtype=np.int64),
                "topic": self._topic_names,
                "body": _binary(self._bodies),
                "properties": properties,
                "raw_properties": raw_properties,
                "tags": pc.map_lookup(properties, c.PROPERTY_TAGS, "first"),
                "keys": pc.map_lookup(properties, c.PROPERTY_KEYS, "first"),
                "uniq_key": pc.map_lookup(properties, c.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "first"),
            }
        )
        self._reset()
        return pa.table([_column(arrays[f.name], f.type) for f in schema], schema=schema)

    def _fixed(self, buf: np.ndarray, positions: np.ndarray) -> dict[str, Any]:
        """The fixed-width fields and the hosts of the records at ``positions`` of ``buf``."""
        fields: dict[str, Any] = {name: _read(buf, positions + at, width) for name, (at, width) in _FIELDS.items()}
        sys_flag = fields["sys_flag"]
        born_len = np.where(sys_flag & c.BORNHOST_V6_FLAG, 20, 8)
        store_len = np.where(sys_flag & c.STOREHOSTADDRESS_V6_FLAG, 20, 8)
        store_at = positions + 48 + born_len + 8
        fields["store_timestamp"] = _read(buf, store_at - 8, 8)
        fields["reconsume_times"] = _read(buf, store_at + store_len, 4)
        fields["prepared_transaction_offset"] = _read(buf, store_at + store_len + 4, 8)
        born = [self._host(raw) for raw in _hosts(buf, positions + 48, born_len, self._v6)]
        store = [self._host(raw) for raw in _hosts(buf, store_at, store_len, self._v6)]
        fields["born_host"] = [text for text, _ in born]
        fields["store_host"] = [text for text, _ in store]
        offsets = fields["commit_log_offset"].tolist()
        fields["msg_id"] = [f"{prefix}{offset:016X}" for (_, prefix), offset in zip(store, offsets, strict=True)]
        return fields


# the fixed fields at the start of every record: (byte offset, width)
_FIELDS: Final = {
    "store_size": (0, 4),
    "magic_code": (4, 4),
    "body_crc": (8, 4),
    "queue_id": (12, 4),
    "flag": (16, 4),
    "queue_offset": (20, 8),
    "commit_log_offset": (28, 8),
    "sys_flag": (36, 4),
    "born_timestamp": (40, 8),
}
_INTS: Final = ("store_size", "magic_code", "body_crc", "queue_id", "flag", "sys_flag", "reconsume_times")
_LONGS: Final = ("commit_log_offset", "queue_offset", "born_timestamp", "store_timestamp")
_LONGS_AFTER_HOSTS: Final = ("prepared_transaction_offset",)


def _read(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The big-endian signed integers of ``width`` bytes at ``at`` in ``buf``."""
    gathered = buf[at[:, None] + np.arange(width)]
    return gathered.view(">i4" if width == 4 else ">i8").ravel().astype(np.int32 if width == 4 else np.int64)


def _hosts(buf: np.ndarray, at: np.ndarray, length: np.ndarray, v6_rows: list[int]) -> list[bytes]:
    """The raw host bytes (8 for IPv4, 20 for IPv6) at ``at``: IPv4 ones read as 8-byte keys in
    one gather, decoded once per distinct value; the rows of ``v6_rows`` one by one."""
    keys = buf[at[:, None] + np.arange(8)].view(">u8").ravel()
    distinct, inverse = np.unique(keys, return_inverse=True)
    raws = [int(k).to_bytes(8, "big") for k in distinct]
    hosts = [raws[i] for i in inverse.tolist()]
    for row in v6_rows:
        if length[row] == 20:
            start = int(at[row])
            hosts[row] = buf[start : start + 20].tobytes()
    return hosts


def _column(values: pa.Array | np.ndarray | list[Any], type_: pa.DataType) -> pa.Array:
    return values.cast(type_) if isinstance(values, pa.Array) else pa.array(values, type_)


def decode_property_column(raw: pa.Array) -> pa.MapArray:
    """:func:`~broker_model.common.decode_properties` of every property string of ``raw``
    (binary), as one map array: the segments between separators, those of at least 3 characters
    with a non-empty key before the first name-value separator and a non-empty value after it; a
    later duplicate key's value kept at its first key's place. Strings that are not UTF-8 are
    decoded with replacement characters, as the reference does."""
    try:
        texts = raw.cast(pa.string())
    except pa.ArrowInvalid:
        texts = pa.array([v.decode("utf-8", errors="replace") for v in raw.to_pylist()], pa.string())
    segments = pc.split_pattern(texts, PROPERTY_SEPARATOR)
    flat = segments.flatten()
    rows = pc.list_parent_indices(segments)
    pairs = pc.extract_regex(flat, f"(?s)^(?P<key>[^{NAME_VALUE_SEPARATOR}]*){NAME_VALUE_SEPARATOR}(?P<value>.*)$")
    keys, values = pc.struct_field(pairs, "key"), pc.struct_field(pairs, "value")
    valid = pc.and_(pc.greater_equal(pc.utf8_length(flat), 3), pc.is_valid(pairs))
    valid = pc.fill_null(pc.and_(valid, pc.and_(pc.not_equal(keys, ""), pc.not_equal(values, ""))), False)
    taken = np.flatnonzero(valid.to_numpy(zero_copy_only=False))
    keyed_rows = rows.to_numpy()[taken]
    if _has_duplicates(keyed_rows, pc.dictionary_encode(keys.take(pa.array(taken)))):
        keyed = pa.table({"row": keyed_rows, "key": keys.take(pa.array(taken)), "at": taken})
        kept = keyed.group_by(["row", "key"]).aggregate([("at", "min"), ("at", "max")]).sort_by("at_min")
        keyed_rows = kept["row"].to_numpy()
        firsts, lasts = kept["at_min"].combine_chunks(), kept["at_max"].combine_chunks()
    else:
        firsts = lasts = pa.array(taken)
    offsets = np.zeros(len(raw) + 1, dtype=np.int32)
    np.cumsum(np.bincount(keyed_rows, minlength=len(raw)), out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), keys.take(firsts), values.take(lasts))


def _has_duplicates(rows: np.ndarray, keys: pa.DictionaryArray) -> bool:
    """Whether a row (``rows``: each entry's row, ascending) holds a key twice: the bit of each
    key's code ORed and added per row differ. True (let the caller look) beyond 63 distinct keys."""
    if len(rows) == 0:
        return False
    if len(keys.dictionary) > 63:
        return True
    bits = np.left_shift(np.uint64(1), keys.indices.to_numpy().astype(np.uint64))
    starts = np.flatnonzero(np.diff(rows, prepend=-1))
    return bool(np.any(np.bitwise_or.reduceat(bits, starts) != np.add.reduceat(bits, starts)))


def _binary(parts: list[memoryview]) -> pa.Array:
    """The byte strings ``parts`` as one Arrow binary array (one buffer, one copy)."""
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    data = b"".join(parts)
    return pa.Array.from_buffers(pa.binary(), len(parts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
