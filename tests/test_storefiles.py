"""Import and export of RocketMQ commit log files, on real files and real Delta tables.

A real broker writes a log with small segments; its export must be a valid RocketMQ commit log
(checked by an independent file walker written here), import back byte-exactly under another name
and export again to identical bytes. Hand-built 4.9 and 5.x files import with every field intact.
A corrupt file fails with the file and byte position and leaves the lake untouched.
"""

from __future__ import annotations

import argparse
import random
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_model.broker import Broker, BrokerConfig, InnerMessage
from broker_model.common import body_crc, create_msg_id, decode_properties, encode_properties, parse_host
from broker_model.common import constants as c
from broker_model.store import (
    AppendLog,
    append_rows,
    encode_record,
    ensure_table,
    export_commitlog,
    import_commitlog,
    read_table,
    rows_to_table,
)
from broker_model.tools import add_import_export_commands
from schemas.catalog import BROKERS, COMMITLOG, TOPIC_CONFIG
from schemas.errors import BrokerLockedError, CorruptRecordError, ValidationError
from tests.builders import commitlog_record, record_fields
from tests.log_invariants import check_log, read_log

SEGMENT = 4096
LONG_RETRY_TOPIC = "%RETRY%" + "g" * 123  # 130 chars: a 5.x broker stores it with magic v2
BLANK = struct.Struct(">ii")


# -- an independent RocketMQ reader -------------------------------------------------------------


@dataclass(frozen=True)
class FileLayout:
    """What CommitLog recovery sees in one file: (position, size) of each record and the end."""

    records: list[tuple[int, int]]
    end: int  # position of the blank marker or of the zero tail
    blank: bool


def walk_file(data: bytes) -> FileLayout:
    """Walk a commit log file as RocketMQ's ``checkMessageAndReturnSize`` loop does."""
    records, position = [], 0
    while position + 8 <= len(data):
        size, magic = BLANK.unpack_from(data, position)
        if magic == c.BLANK_MAGIC_CODE:
            return FileLayout(records, position, True)
        if magic not in (c.MAGIC_CODE_V1, c.MAGIC_CODE_V2):
            break
        records.append((position, size))
        position += size
    return FileLayout(records, position, False)


# -- the broker-written log (shared by a module's tests) ----------------------------------------


def workload(count: int, seed: int) -> list[InnerMessage]:
    """Varied sizes and topics, IPv4 and IPv6 born hosts, compressed and transactional flags."""
    rng = random.Random(seed)
    messages = []
    for i in range(count):
        topic = ["TopicA", "TopicB", LONG_RETRY_TOPIC, c.RMQ_SYS_TRANS_HALF_TOPIC][i % 4]
        sys_flag = c.TRANSACTION_PREPARED_TYPE if topic == c.RMQ_SYS_TRANS_HALF_TOPIC else 0
        sys_flag |= c.COMPRESSED_FLAG if i % 11 == 0 else 0
        properties = {"TAGS": f"tag{i % 5}", "KEYS": f"k{i} k{i + 1}", "UNIQ_KEY": f"{i:032X}", "WAIT": "true"}
        messages.append(
            InnerMessage(
                topic=topic,
                queue_id=rng.randrange(4) if topic.startswith("Topic") else 0,
                body=rng.randbytes(rng.choice([1, 17, 200, 900, 2500, 3500])),
                properties=properties,
                flag=i,
                sys_flag=sys_flag,
                born_timestamp=1_700_000_000_000 + i,
                born_host="[::1]:5555" if i % 2 else f"10.0.0.{i % 250}:4000",
                reconsume_times=i % 3,
            )
        )
    return messages


@dataclass(frozen=True)
class BrokerLog:
    """A broker's log in a lake and its export."""

    lake: Path
    broker_name: str
    export_dir: Path
    rows: list[dict[str, Any]]


@pytest.fixture(scope="module", params=["127.0.0.1:10911", "[::1]:10911"], ids=["ipv4-store", "ipv6-store"])
def broker_log(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> BrokerLog:
    lake = tmp_path_factory.mktemp("lake")
    config = BrokerConfig(
        lake, "origin", store_host=request.param, segment_size=SEGMENT, flush_mode="ASYNC_FLUSH", fsync=False
    )
    with Broker(config) as broker:
        broker.create_topic(LONG_RETRY_TOPIC, 1)
        for message in workload(300, seed=11):
            broker.put_message(message)
        broker.flush()
    export_dir = lake / "export"
    export_commitlog(lake, "origin", export_dir)
    return BrokerLog(lake, "origin", export_dir, read_log(lake, "origin"))


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def without_broker_name(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "broker_name"} for row in rows]


# -- (a) broker log -> export -> import -> export ------------------------------------------------


def test_broker_log_covers_the_formats(broker_log: BrokerLog) -> None:
    rows = broker_log.rows
    assert check_log(rows, SEGMENT) == []
    assert {r["magic_code"] for r in rows if r["topic"] == LONG_RETRY_TOPIC} == {c.MAGIC_CODE_V2}
    assert {r["magic_code"] for r in rows if r["topic"] != LONG_RETRY_TOPIC} == {c.MAGIC_CODE_V1}
    assert {bool(r["sys_flag"] & c.BORNHOST_V6_FLAG) for r in rows} == {True, False}
    assert len({r["segment"] for r in rows}) > 30


def test_export_writes_one_full_size_file_per_segment(broker_log: BrokerLog) -> None:
    files = files_of(broker_log.export_dir)
    segments = sorted({r["segment"] for r in broker_log.rows})
    assert list(files) == [f"{s:020d}" for s in segments]
    assert all(len(name) == 20 and name.isdigit() for name in files)
    assert {len(data) for data in files.values()} == {SEGMENT}


def test_export_lays_out_records_blanks_and_zero_fill(broker_log: BrokerLog) -> None:
    files = files_of(broker_log.export_dir)
    names = list(files)
    for name, data in files.items():
        base = int(name)
        mine = [r for r in broker_log.rows if r["segment"] == base]
        layout = walk_file(data)
        assert layout.records == [(r["commit_log_offset"] - base, r["store_size"]) for r in mine], name
        assert layout.blank == (name != names[-1]), name
        tail = layout.end + (8 if layout.blank else 0)
        if layout.blank:
            assert BLANK.unpack_from(data, layout.end) == (SEGMENT - layout.end, c.BLANK_MAGIC_CODE)
        assert data[tail:] == bytes(SEGMENT - tail), name
        for row, (position, size) in zip(mine, layout.records, strict=True):
            assert data[position : position + size] == encode_record(row)


def test_import_of_an_export_reproduces_every_column(broker_log: BrokerLog, tmp_path: Path) -> None:
    report = import_commitlog(tmp_path, "copy", broker_log.export_dir)
    imported = read_log(tmp_path, "copy")
    assert without_broker_name(imported) == without_broker_name(broker_log.rows)
    assert {r["broker_name"] for r in imported} == {"copy"}
    rows = broker_log.rows
    segments = len({r["segment"] for r in rows})
    assert (report.records, report.files, report.segments) == (len(rows), segments, segments)
    assert (report.first_offset, report.last_offset) == (0, rows[-1]["commit_log_offset"])
    assert report.end_offset == rows[-1]["commit_log_offset"] + rows[-1]["store_size"]
    assert report.bytes == sum(r["store_size"] for r in rows)
    assert report.segment_size == SEGMENT and report.store_host == rows[0]["store_host"]


def test_import_registers_the_broker_and_its_topics(broker_log: BrokerLog, tmp_path: Path) -> None:
    import_commitlog(tmp_path, "copy", broker_log.export_dir)
    brokers = read_table(tmp_path, BROKERS).to_pylist()
    assert [(b["broker_name"], b["segment_size"], b["store_host"], b["flush_mode"]) for b in brokers] == [
        ("copy", SEGMENT, broker_log.rows[0]["store_host"], "ASYNC_FLUSH")
    ]
    topics = {(t["topic"], t["queue_nums"], t["perm"]) for t in read_table(tmp_path, TOPIC_CONFIG).to_pylist()}
    expected_queues: dict[str, int] = {}
    for row in broker_log.rows:
        expected_queues[row["topic"]] = max(expected_queues.get(row["topic"], 0), row["queue_id"] + 1)
    assert topics == {(topic, queues, 6) for topic, queues in expected_queues.items()}
    assert expected_queues["TopicA"] == 4 and expected_queues[LONG_RETRY_TOPIC] == 1


def test_export_of_an_import_is_byte_identical(broker_log: BrokerLog, tmp_path: Path) -> None:
    import_commitlog(tmp_path, "copy", broker_log.export_dir)
    report = export_commitlog(tmp_path, "copy", tmp_path / "again")
    assert files_of(tmp_path / "again") == files_of(broker_log.export_dir)
    assert (report.files, report.records) == (len(files_of(broker_log.export_dir)), len(broker_log.rows))


def test_broker_started_after_import_continues_the_log(broker_log: BrokerLog, tmp_path: Path) -> None:
    report = import_commitlog(tmp_path, "copy", broker_log.export_dir, chunk_rows=50)
    last = broker_log.rows[-1]
    left = last["segment"] + SEGMENT - report.end_offset
    queue_a1 = max(r["queue_offset"] for r in broker_log.rows if (r["topic"], r["queue_id"]) == ("TopicA", 1))
    assert left > 300, "the workload must leave room for a small record in the last segment"
    with Broker(BrokerConfig(tmp_path, "copy", fsync=False)) as broker:
        assert broker.segment_size == SEGMENT
        small = broker.put_message(InnerMessage("TopicA", 1, b"tail", {"WAIT": "true"}, born_host="10.0.0.1:1"))
        big = broker.put_message(InnerMessage("TopicA", 1, bytes(SEGMENT - 400), {}, born_host="10.0.0.1:1"))
    assert small.commit_log_offsets == (report.end_offset,)
    assert big.commit_log_offsets == (last["segment"] + SEGMENT,)
    assert (small.queue_offsets, big.queue_offsets) == ((queue_a1 + 1,), (queue_a1 + 2,))
    assert check_log(read_log(tmp_path, "copy"), SEGMENT) == []


# -- (b) files as RocketMQ 4.9 and 5.x write them ------------------------------------------------


def rocketmq_row(
    topic: str, body: bytes, properties: dict[str, str], trailing: bool, born: str, store: str, queue_offset: int
) -> dict[str, Any]:
    """A record row as a RocketMQ broker fills it (offset set when laid out)."""
    return record_fields(
        commitlog_record(
            topic=topic,
            body=body,
            properties=properties,
            raw_properties=encode_properties(properties, trailing_separator=trailing).encode(),
            born_host=str(parse_host(born)),
            store_host=str(parse_host(store)),
            queue_id=queue_offset % 3,
            queue_offset=queue_offset,
            commit_log_offset=-1,
            born_timestamp=1_600_000_000_000 + queue_offset,
            store_timestamp=1_600_000_000_500 + queue_offset,
        )
    )


def lay_out(directory: Path, files: list[list[dict[str, Any]]], first_base: int, empty_files: int = 0) -> list[Path]:
    """Write ``files`` (rows per file) as RocketMQ does: records, blank marker, zeros; then
    ``empty_files`` pre-allocated all-zero files. Sets each row's ``commit_log_offset``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, rows in enumerate([*files, *[[]] * empty_files]):
        base = first_base + index * SEGMENT
        data = bytearray(SEGMENT)
        position = 0
        for row in rows:
            row["commit_log_offset"] = base + position
            record = encode_record(row)
            data[position : position + len(record)] = record
            position += len(record)
        assert position <= SEGMENT, "the rows of one file must fit it"
        if index < len(files) - 1:
            assert position + 8 <= SEGMENT, "a file followed by another needs room for its blank marker"
            data[position : position + 8] = BLANK.pack(SEGMENT - position, c.BLANK_MAGIC_CODE)
        paths.append(directory / f"{base:020d}")
        paths[-1].write_bytes(bytes(data))
    return paths


def rocketmq_files(version: str) -> list[list[dict[str, Any]]]:
    """Three files of records as a 4.9 broker (no trailing separator, v1, IPv4) or a 5.x broker
    (trailing separator, a v2 retry topic, IPv6 hosts) writes them."""
    trailing = version == "5.x"
    born, store = (
        ("[2408:4004:180:8100:3faa:1dde:2b3f:898a]:50000", "[::1]:10911")
        if trailing
        else ("192.168.0.7:50000", "192.168.0.10:10911")
    )
    topics = ["TopicA", LONG_RETRY_TOPIC] if trailing else ["TopicA", "%RETRY%group"]
    files, queue_offset = [], 500
    for sizes in ([600, 900, 1100], [3000], [10, 20, 30]):
        rows = []
        for size in sizes:
            properties = {"TAGS": "TagA", "KEYS": f"key{queue_offset}", "UNIQ_KEY": f"{queue_offset:032X}"}
            properties |= {"CLUSTER": "DefaultCluster", "MIN_OFFSET": "0", "MAX_OFFSET": str(queue_offset)}
            topic = topics[queue_offset % 2]
            rows.append(
                rocketmq_row(topic, bytes([queue_offset % 256]) * size, properties, trailing, born, store, queue_offset)
            )
            queue_offset += 1
        files.append(rows)
    return files


@pytest.mark.parametrize("version", ["4.9", "5.x"])
def test_import_of_rocketmq_files_keeps_every_field(version: str, tmp_path: Path) -> None:
    files = rocketmq_files(version)
    paths = lay_out(tmp_path / "commitlog", files, first_base=2 * SEGMENT, empty_files=1)
    report = import_commitlog(tmp_path / "lake", "b", tmp_path / "commitlog")
    imported = read_log(tmp_path / "lake", "b")
    expected = [row for rows in files for row in rows]
    assert (report.files, report.segments, report.records) == (4, 3, len(expected))
    assert report.first_offset == 2 * SEGMENT
    for row, got in zip(expected, imported, strict=True):
        assert {k: got[k] for k in row} == row
        assert got["segment"] == row["commit_log_offset"] - row["commit_log_offset"] % SEGMENT
        assert got["properties"] == decode_properties(row["raw_properties"].decode())
        assert got["raw_properties"].endswith(b"\x02") == (version == "5.x")
        assert (got["tags"], got["keys"], got["uniq_key"]) == (
            "TagA",
            f"key{row['queue_offset']}",
            f"{row['queue_offset']:032X}",
        )
        assert got["msg_id"] == create_msg_id(parse_host(row["store_host"]), row["commit_log_offset"])
    magics = {got["magic_code"] for got in imported}
    assert magics == ({c.MAGIC_CODE_V1, c.MAGIC_CODE_V2} if version == "5.x" else {c.MAGIC_CODE_V1})
    export_commitlog(tmp_path / "lake", "b", tmp_path / "out")
    assert files_of(tmp_path / "out") == {p.name: p.read_bytes() for p in paths[:3]}


def test_store_host_override_is_registered(tmp_path: Path) -> None:
    lay_out(tmp_path / "commitlog", rocketmq_files("4.9"), first_base=0)
    report = import_commitlog(tmp_path / "lake", "b", tmp_path / "commitlog", store_host_override="10.9.9.9:10911")
    assert report.store_host == "10.9.9.9:10911"
    assert read_table(tmp_path / "lake", BROKERS)["store_host"].to_pylist() == ["10.9.9.9:10911"]
    assert {r["store_host"] for r in read_log(tmp_path / "lake", "b")} == {"192.168.0.10:10911"}


_FORMATS = st.tuples(
    st.integers(0, 1500),  # body length
    st.sampled_from(["TopicA", "%RETRY%g", LONG_RETRY_TOPIC]),
    st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "user"]), st.text("ab\x01é", min_size=1), max_size=3),
    st.booleans(),  # trailing property separator
    st.sampled_from(["10.0.0.1:4000", "[fe80::1]:4000"]),
)


@settings(max_examples=12, deadline=None)
@given(
    st.lists(_FORMATS, min_size=1, max_size=25), st.sampled_from(["10.0.0.2:10911", "[::2]:10911"]), st.integers(0, 3)
)
def test_any_rocketmq_log_round_trips_byte_exactly(
    formats: list[tuple[int, str, dict[str, str], bool, str]], store: str, first_segment: int
) -> None:
    files: list[list[dict[str, Any]]] = [[]]
    position = 0
    for index, (body_length, topic, properties, trailing, born) in enumerate(formats):
        row = rocketmq_row(topic, bytes([index % 256]) * body_length, properties, trailing, born, store, index)
        if position + row["store_size"] + 8 > SEGMENT:  # RocketMQ's roll-over rule
            files.append([])
            position = 0
        files[-1].append(row)
        position += row["store_size"]
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        paths = lay_out(root / "commitlog", files, first_base=first_segment * SEGMENT)
        report = import_commitlog(root / "lake", "b", root / "commitlog")
        export_commitlog(root / "lake", "b", root / "out")
        assert report.records == len(formats)
        assert files_of(root / "out") == {p.name: p.read_bytes() for p in paths}


# -- (c) corrupt files: the error names file and position, nothing is committed ------------------


@dataclass(frozen=True)
class Damage:
    """A corruption of the record (or marker) at ``position`` and the problem it must report."""

    name: str
    apply: Callable[[bytearray, int, dict[str, Any]], None]
    problem: str


def _body_position(row: dict[str, Any]) -> int:
    born = 20 if row["sys_flag"] & c.BORNHOST_V6_FLAG else 8
    store = 20 if row["sys_flag"] & c.STOREHOSTADDRESS_V6_FLAG else 8
    return 48 + born + 8 + store + 12 + 4  # BORNHOST starts at byte 48


def _flip(data: bytearray, index: int) -> None:
    data[index] ^= 0x5A


DAMAGES = [
    Damage("magic", lambda d, p, r: _flip(d, p + 4), "neither a message"),
    Damage("body", lambda d, p, r: _flip(d, p + _body_position(r)), "body CRC"),
    Damage("totalsize", lambda d, p, r: _flip(d, p + 3), "TOTALSIZE"),
    Damage("physical-offset", lambda d, p, r: _flip(d, p + 35), "physical offset field"),
    Damage("zero-header", lambda d, p, r: d.__setitem__(slice(p, p + 8), bytes(8)), "data after the end"),
]


@pytest.fixture
def lake_with_another_broker(tmp_path: Path) -> Path:
    """A lake where broker "other" already has records (so a failed import must not touch them)."""
    lay_out(tmp_path / "other-files", rocketmq_files("4.9"), first_base=0)
    import_commitlog(tmp_path / "lake", "other", tmp_path / "other-files")
    return tmp_path / "lake"


@dataclass(frozen=True)
class LakeState:
    version: int
    parquet: frozenset[Path]
    brokers: int
    topics: int


def lake_state(lake: Path) -> LakeState:
    return LakeState(
        DeltaTable(str(COMMITLOG.location(lake))).version(),
        frozenset(COMMITLOG.location(lake).rglob("*.parquet")),
        read_table(lake, BROKERS).num_rows,
        read_table(lake, TOPIC_CONFIG).num_rows,
    )


@pytest.mark.parametrize("damage", DAMAGES, ids=[d.name for d in DAMAGES])
def test_corrupt_record_fails_the_import_with_file_and_position(
    damage: Damage, broker_log: BrokerLog, lake_with_another_broker: Path, tmp_path: Path
) -> None:
    source = tmp_path / "commitlog"
    shutil.copytree(broker_log.export_dir, source)
    segments = sorted({r["segment"] for r in broker_log.rows})
    victim = [r for r in broker_log.rows if r["segment"] == segments[5]][1]
    path = source / f"{victim['segment']:020d}"
    position = victim["commit_log_offset"] - victim["segment"]
    data = bytearray(path.read_bytes())
    damage.apply(data, position, victim)
    path.write_bytes(bytes(data))
    before = lake_state(lake_with_another_broker)
    expected_path, expected_position = path, position
    if damage.name == "zero-header":  # the log ends there, and the next file still has data
        expected_path, expected_position = source / f"{segments[6]:020d}", 0

    with pytest.raises(CorruptRecordError, match=damage.problem) as caught:
        import_commitlog(lake_with_another_broker, "victim", source, chunk_rows=5)

    assert (caught.value.source, caught.value.position) == (str(expected_path), expected_position)
    assert str(expected_path) in str(caught.value) and f"byte {expected_position}" in str(caught.value)
    assert lake_state(lake_with_another_broker) == before
    assert read_log(lake_with_another_broker, "victim") == []
    assert not (COMMITLOG.location(lake_with_another_broker) / "broker_name=victim").exists()


def test_blank_marker_of_the_wrong_size_fails_the_import(tmp_path: Path) -> None:
    paths = lay_out(tmp_path / "commitlog", rocketmq_files("4.9"), first_base=0)
    data = bytearray(paths[0].read_bytes())
    end = walk_file(bytes(data)).end
    data[end : end + 4] = struct.pack(">i", SEGMENT - end - 1)
    paths[0].write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="blank marker TOTALSIZE") as caught:
        import_commitlog(tmp_path / "lake", "b", tmp_path / "commitlog")
    assert (caught.value.source, caught.value.position) == (str(paths[0]), end)
    assert read_log(tmp_path / "lake", "b") == []


def test_record_leaving_no_room_for_a_blank_fails_the_import(tmp_path: Path) -> None:
    row = rocketmq_row("TopicA", b"", {"TAGS": "a"}, True, "10.0.0.1:1", "10.0.0.2:2", 0)
    row["body"] = bytes(SEGMENT - row["store_size"] - 4)  # the record ends 4 bytes before the file end
    row["store_size"], row["body_crc"] = SEGMENT - 4, body_crc(row["body"])
    paths = lay_out(tmp_path / "commitlog", [[row]], first_base=0)
    with pytest.raises(CorruptRecordError, match="fewer than a blank marker") as caught:
        import_commitlog(tmp_path / "lake", "b", tmp_path / "commitlog")
    assert (caught.value.source, caught.value.position) == (str(paths[0]), 0)


def _bad_name(directory: Path) -> Path:
    (directory / "checkpoint").write_bytes(b"")
    return directory / "checkpoint"


def _short_file(directory: Path) -> Path:
    path = directory / f"{SEGMENT:020d}"
    path.write_bytes(path.read_bytes()[:-1])
    return path


def _gap(directory: Path) -> Path:
    (directory / f"{SEGMENT:020d}").unlink()
    return directory / f"{2 * SEGMENT:020d}"


def _not_a_multiple(directory: Path) -> Path:
    for path in sorted(directory.iterdir()):
        path.rename(directory / f"{int(path.name) + 100:020d}")
    return directory / f"{100:020d}"


def _tiny_files(directory: Path) -> Path:
    for path in sorted(directory.iterdir()):
        path.unlink()
    (directory / f"{0:020d}").write_bytes(bytes(1024))
    return directory / f"{0:020d}"


@pytest.mark.parametrize(
    ("break_files", "problem"),
    [
        (_bad_name, "20-digit base offset"),
        (_short_file, "same size"),
        (_gap, "does not follow"),
        (_not_a_multiple, "not a multiple"),
        (_tiny_files, "smallest segment size"),
    ],
)
def test_bad_file_set_is_refused_naming_the_file(
    break_files: Callable[[Path], Path], problem: str, tmp_path: Path
) -> None:
    lay_out(tmp_path / "commitlog", rocketmq_files("4.9"), first_base=0)
    culprit = break_files(tmp_path / "commitlog")
    with pytest.raises(ValidationError, match=problem) as caught:
        import_commitlog(tmp_path / "lake", "b", tmp_path / "commitlog")
    assert (caught.value.field, caught.value.value) == ("commit log file", str(culprit))
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize("make", ["missing", "empty", "zeros"])
def test_source_without_records_is_refused(make: str, tmp_path: Path) -> None:
    source = tmp_path / "commitlog"
    if make != "missing":
        source.mkdir()
    if make == "zeros":
        (source / f"{0:020d}").write_bytes(bytes(SEGMENT))
    with pytest.raises(ValidationError) as caught:
        import_commitlog(tmp_path / "lake", "b", source)
    assert (caught.value.field, caught.value.value) == ("src_dir", str(source))
    assert list(tmp_path.glob("lake/**/*.parquet")) == []
    assert read_table(tmp_path / "lake", BROKERS).num_rows == 0


# -- (d) refusals --------------------------------------------------------------------------------


def test_import_is_refused_when_the_broker_has_records(tmp_path: Path) -> None:
    lay_out(tmp_path / "commitlog", rocketmq_files("4.9"), first_base=0)
    import_commitlog(tmp_path / "lake", "b", tmp_path / "commitlog")
    before = lake_state(tmp_path / "lake")
    with pytest.raises(ValidationError, match="already has records") as caught:
        import_commitlog(tmp_path / "lake", "b", tmp_path / "commitlog")
    assert (caught.value.field, caught.value.value) == ("broker_name", "b")
    assert lake_state(tmp_path / "lake") == before


def test_import_is_refused_while_a_broker_of_that_name_runs(tmp_path: Path) -> None:
    lay_out(tmp_path / "commitlog", rocketmq_files("4.9"), first_base=0)
    with Broker(BrokerConfig(tmp_path / "lake", "b", segment_size=SEGMENT, fsync=False)):
        with pytest.raises(BrokerLockedError, match="'b' is already running"):
            import_commitlog(tmp_path / "lake", "b", tmp_path / "commitlog")
    assert read_log(tmp_path / "lake", "b") == []


def test_export_of_an_unknown_broker_is_refused(broker_log: BrokerLog, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no such broker") as caught:
        export_commitlog(broker_log.lake, "nobody", tmp_path / "out")
    assert (caught.value.field, caught.value.value) == ("broker_name", "nobody")
    assert not (tmp_path / "out").exists()


def test_export_into_a_directory_with_commit_log_files_is_refused(broker_log: BrokerLog, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / f"{0:020d}").write_bytes(b"keep me")
    with pytest.raises(ValidationError, match="already holds commit log files") as caught:
        export_commitlog(broker_log.lake, "origin", tmp_path / "out")
    assert (caught.value.field, caught.value.value) == ("out_dir", str(tmp_path / "out"))
    assert files_of(tmp_path / "out") == {f"{0:020d}": b"keep me"}


def write_broker(lake: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """Store ``rows`` as broker ``name``'s log directly (bypassing every check of the broker)."""
    ensure_table(lake, COMMITLOG)
    log = AppendLog(COMMITLOG.location(lake), COMMITLOG, fsync=False)
    log.append(rows_to_table([{**row, "broker_name": name} for row in rows]))
    broker = {
        "broker_name": [name],
        "store_host": ["127.0.0.1:1"],
        "segment_size": [SEGMENT],
        "flush_mode": ["ASYNC_FLUSH"],
        "started_timestamp": [1],
        "process": ["1@test"],
    }
    append_rows(lake, BROKERS, pa.table(broker))


def _drop_row(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    segment = sorted({r["segment"] for r in rows})[3]
    index = next(i for i, r in enumerate(rows) if r["segment"] == segment) + 1
    return rows[:index] + rows[index + 1 :], rows[index + 1]["commit_log_offset"]


def _drop_segment(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    segment = sorted({r["segment"] for r in rows})[3]
    return [r for r in rows if r["segment"] != segment], segment + SEGMENT


@pytest.mark.parametrize(("damage", "problem"), [(_drop_row, "the log continues at"), (_drop_segment, "is missing")])
def test_export_of_a_non_contiguous_log_fails_and_leaves_no_files(
    damage: Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], int]],
    problem: str,
    broker_log: BrokerLog,
    tmp_path: Path,
) -> None:
    rows, position = damage(broker_log.rows)
    write_broker(tmp_path, "gappy", rows)
    with pytest.raises(CorruptRecordError, match=problem) as caught:
        export_commitlog(tmp_path, "gappy", tmp_path / "out")
    assert caught.value.position == position
    assert "broker_name=gappy" in caught.value.source
    assert list((tmp_path / "out").iterdir()) == []


# -- command line --------------------------------------------------------------------------------


@pytest.fixture
def parser() -> Iterator[argparse.ArgumentParser]:
    root = argparse.ArgumentParser(prog="broker_model")
    add_import_export_commands(root.add_subparsers(dest="command", required=True))
    yield root


def test_command_line_imports_and_exports(
    parser: argparse.ArgumentParser, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = lay_out(tmp_path / "commitlog", rocketmq_files("5.x"), first_base=0)
    lake, out = str(tmp_path / "lake"), str(tmp_path / "out")
    for argv in (
        ["import-commitlog", "--lake", lake, "--broker-name", "b", str(tmp_path / "commitlog")],
        ["export-commitlog", "--lake", lake, "--broker-name", "b", out],
    ):
        args = parser.parse_args(argv)
        assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("imported 7 records") and "into broker 'b'" in lines[0]
    assert lines[1].startswith("exported 7 records") and f"3 files of {SEGMENT} bytes" in lines[1]
    assert files_of(tmp_path / "out") == {p.name: p.read_bytes() for p in paths}
    stored = read_table(Path(lake), COMMITLOG, ["store_size"])["store_size"].to_pylist()
    assert sorted(stored) == sorted(size for p in paths for _, size in walk_file(p.read_bytes()).records)
