"""The column decoder of ``ingest-store`` (:class:`RecordColumns`) against the reference decoder
(:func:`decode_record`, one record at a time) on generated records: every column of every row the
same, and the same records refused, for 4.9 and 5.x layouts, IPv6 hosts, magic v2 topics and
property strings of every shape RocketMQ's parser meets.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from broker_model.common import constants as c
from broker_model.store import decode_record, rows_to_table
from broker_model.store.record_columns import RecordColumns, decode_property_column
from broker_model.store.segment_files import SegmentFile, decode_file_record
from schemas.errors import CorruptRecordError
from tests.helpers import canonical_rows
from tests.rocketmq_store import encode

FILE = 1 << 16
HOSTS = ("10.0.0.7:10911", "192.168.3.4:51200", "[fd00::7]:10911", "[2408:4004:180::898a]:50000")
PIECES = ("TAGS", "KEYS", "UNIQ_KEY", "a", "k", "\x01", "\x02", "é", "v\x01w", "", "x" * 5)


def _properties(r: random.Random) -> str:
    shape = r.random()
    if shape < 0.5:  # as brokers write them, with or without the trailing separator
        values = ("TagA", "k1 k2", "0A1B", "é", "v\x01w")
        entries = {r.choice(PIECES[:5]): r.choice(values) for _ in range(r.randint(0, 4))}
        text = "".join(f"{k}\x01{v}\x02" for k, v in entries.items())
        return text[:-1] if r.random() < 0.5 else text
    return "".join(r.choice(PIECES) for _ in range(r.randint(0, 12)))  # anything the parser may meet


def _record(r: random.Random, offset: int, queue_offset: int) -> bytes:
    topic = r.choice(("Orders", "%RETRY%g", "T" * 130, "rmq_sys_wheel_timer", "é"))
    data = encode(
        topic=topic,
        queue_id=r.randint(0, 7),
        queue_offset=queue_offset,
        physical_offset=offset,
        body=r.randbytes(r.randint(0, 300)),
        properties=_properties(r),
        born=r.choice(HOSTS),
        store=r.choice(HOSTS),
        born_timestamp=r.randint(0, 2**45),
        store_timestamp=r.randint(0, 2**45),
        sys_flag=r.choice((0, 0, 1 << 2, 1 << 3)),
    )
    return data


def _file(seed: int) -> tuple[bytearray, list[int]]:
    r = random.Random(seed)
    data, positions = bytearray(FILE), []
    position = 0
    for queue_offset in range(120):
        record = _record(r, 5 * FILE + position, queue_offset)
        if position + len(record) + 8 > FILE:
            break
        data[position : position + len(record)] = record
        positions.append(position)
        position += len(record)
    return data, positions


@pytest.mark.parametrize("seed", range(12))
def test_the_column_decoder_gives_the_reference_rows(seed: int) -> None:
    data, positions = _file(seed)
    view = memoryview(bytes(data))
    columns = RecordColumns("broker-z")
    for position in positions:
        assert columns.add(view, position, 5 * FILE, FILE) is not None
    table = columns.table()
    reference = []
    for position in positions:
        row = decode_record(view, position)
        reference.append({**row, "broker_name": "broker-z", "segment": 5 * FILE})
    assert table.schema == rows_to_table(reference).schema
    assert canonical_rows(table) == canonical_rows(rows_to_table(reference))


@pytest.mark.parametrize("seed", range(6))
def test_the_column_decoder_refuses_what_the_reference_refuses(seed: int) -> None:
    r = random.Random(100 + seed)
    data, positions = _file(seed)
    segment = SegmentFile(5 * FILE, Path("f"), FILE)
    for position in positions[:40]:
        damaged = bytearray(data)
        spot = position + r.choice((0, 1, 4, 9, 28, 31, r.randint(0, 200)))
        damaged[spot] ^= 1 << r.randint(0, 7)
        view = memoryview(bytes(damaged))
        _, magic = struct.unpack_from(">ii", view, position)
        try:
            decode_file_record(view, segment, position, magic)
            accepted = True
        except CorruptRecordError:
            accepted = False
        assert (RecordColumns("b").add(view, position, 5 * FILE, FILE) is not None) == accepted


def test_property_strings_decode_as_rocketmq_parses_them() -> None:
    texts = [
        "TAGS\x01a\x02KEYS\x01k\x02",
        "TAGS\x01a\x02TAGS\x01b\x02K\x01v",
        "ab\x02\x01v\x02k\x01\x02kk\x01v\x01w",
        "",
        "é\x01é\x02",
    ]
    maps = decode_property_column(pa.array([t.encode() for t in texts], pa.binary())).to_pylist()
    assert maps == [
        [("TAGS", "a"), ("KEYS", "k")],
        [("TAGS", "b"), ("K", "v")],  # a later duplicate wins, at its first place
        [("kk", "v\x01w")],
        [],
        [("é", "é")],
    ]
    invalid = decode_property_column(pa.array([b"K\x01\xff\xfe\x02"], pa.binary())).to_pylist()
    assert invalid == [[("K", "\ufffd\ufffd")]]
    assert zlib.crc32(b"") == 0 and c.MAGIC_CODE_V2 < 0  # the constants the generator relies on
