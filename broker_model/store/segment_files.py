"""Import and export of real RocketMQ commit log files (the ``{store}/commitlog/`` directory).

A RocketMQ commit log is a directory of equally sized files, each named by its base physical
offset as 20 zero-padded digits. Records never span two files; when the next record does not fit
(``size + 8 > bytes left``) the writer puts an 8-byte blank marker (TOTALSIZE = bytes left, BLANK
magic) and starts the next file. The rest of every file is zero.

:func:`import_commitlog` turns such a directory into one broker's partition of the ``commitlog``
table, byte-exactly: each row keeps ``raw_properties`` and ``magic_code``, so
:func:`export_commitlog` writes the very same files back, whichever RocketMQ version (4.9 without
the trailing property separator, 5.x with it, magic v1 or v2, IPv4 or IPv6 hosts) wrote them.
A :class:`~broker_model.broker.Broker` started afterwards under the same name continues the log.
"""

from __future__ import annotations

import mmap
import os
import re
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from broker_model.common import constants as c
from broker_model.common import now_ms, parse_host, validate_name
from broker_model.store.append_log import AddFile, AppendLog, escape_partition_value
from broker_model.store.commitlog import rows_to_table
from broker_model.store.delta_commits import load_table
from broker_model.store.delta_tables import append_rows, ensure_table, read_table
from broker_model.store.name_lock import BrokerNameLock
from broker_model.store.record import RECORD_COLUMNS, decode_record, encode_blank, encode_record, peek_header
from schemas.catalog import BROKERS, COMMITLOG, TOPIC_CONFIG
from schemas.errors import CorruptRecordError, ValidationError

IMPORT_CHUNK_ROWS: Final = 50_000  # rows per Parquet write: bounds the import's memory
IMPORT_CHUNK_BYTES: Final = 64 * 1024 * 1024  # ... and so do the record bytes held per write
MIN_SEGMENT_SIZE: Final = 4096  # Broker refuses smaller segments, so the import does too
EXPORT_BATCH_ROWS: Final = 4096  # rows turned into Python objects at a time while exporting
SEGMENT_FILE_NAME = re.compile(r"^[0-9]{20}$")  # UtilAll.offset2FileName: %020d of the base offset


@dataclass(frozen=True)
class SegmentFile:
    """One commit log file: its base physical offset, path and size in bytes."""

    base: int
    path: Path
    size: int


@dataclass(frozen=True)
class ImportReport:
    """What :func:`import_commitlog` stored.

    Attributes:
        broker_name: the broker the records now belong to.
        files: commit log files read (empty pre-allocated files included).
        segments: files that held at least one record.
        records: records imported.
        bytes: sum of the records' ``store_size``.
        segment_size: the file size, now the broker's segment size.
        first_offset: ``commit_log_offset`` of the first record.
        last_offset: ``commit_log_offset`` of the last record.
        end_offset: the byte after the last record, where a broker continues if the next record fits.
        topics: queue count given to each topic (highest ``queue_id`` seen + 1).
        store_host: the store host registered for the broker.
        version: the ``commitlog`` table version of the import commit.
    """

    broker_name: str
    files: int
    segments: int
    records: int
    bytes: int
    segment_size: int
    first_offset: int
    last_offset: int
    end_offset: int
    topics: Mapping[str, int]
    store_host: str
    version: int

    def summary(self) -> str:
        """One line for the command line."""
        return (
            f"imported {self.records} records ({self.bytes} bytes) from {self.files} files into broker "
            f"{self.broker_name!r}: offsets {self.first_offset}..{self.end_offset}, "
            f"{len(self.topics)} topics, segment size {self.segment_size}, commitlog version {self.version}"
        )


@dataclass(frozen=True)
class ExportReport:
    """What :func:`export_commitlog` wrote.

    Attributes:
        broker_name: the exported broker.
        out_dir: the directory holding the files.
        files: files written, each exactly ``segment_size`` bytes.
        records: records written.
        bytes: sum of the records' ``store_size``.
        segment_size: size of every file.
        first_offset: ``commit_log_offset`` of the first record (None when the broker has none).
        end_offset: the byte after the last record (None when the broker has none).
        version: the ``commitlog`` table version that was read (None when the table does not exist).
    """

    broker_name: str
    out_dir: Path
    files: int
    records: int
    bytes: int
    segment_size: int
    first_offset: int | None
    end_offset: int | None
    version: int | None

    def summary(self) -> str:
        """One line for the command line."""
        span = "no records" if self.first_offset is None else f"offsets {self.first_offset}..{self.end_offset}"
        return (
            f"exported {self.records} records ({self.bytes} bytes) of broker {self.broker_name!r} as "
            f"{self.files} files of {self.segment_size} bytes to {self.out_dir}: {span}"
        )


# -- the file set --------------------------------------------------------------------------------


def list_commitlog_files(src_dir: Path) -> list[SegmentFile]:
    """The commit log files of ``src_dir`` in offset order, validated as one RocketMQ commit log.

    Every entry must be a regular file named by 20 decimal digits; all files have the same size
    (at least 4096 bytes), each base offset is a multiple of that size and follows the previous
    file's base by exactly that size.

    Raises:
        ValidationError: naming the offending file (or ``src_dir``) and what to do; nothing is read.
    """
    src_dir = Path(src_dir)
    if not src_dir.is_dir():
        raise ValidationError(
            "src_dir", str(src_dir), "is not a directory", "give a RocketMQ store's commitlog/ directory"
        )
    files: list[SegmentFile] = []
    for path in sorted(src_dir.iterdir()):
        if not SEGMENT_FILE_NAME.match(path.name) or not path.is_file():
            raise ValidationError(
                "commit log file",
                str(path),
                "is not a file named by a 20-digit base offset",
                "point SRC_DIR at a RocketMQ store's commitlog/ directory and move other entries out",
            )
        files.append(SegmentFile(int(path.name), path, path.stat().st_size))
    if not files:
        raise ValidationError("src_dir", str(src_dir), "holds no commit log files", "give a commitlog/ directory")
    size = files[0].size
    for previous, current in zip([None, *files], files, strict=False):
        _check_file(current, size, files[0], previous)
    return files


def _check_file(current: SegmentFile, size: int, first: SegmentFile, previous: SegmentFile | None) -> None:
    where = str(current.path)
    if current.size != size:
        raise ValidationError(
            "commit log file",
            where,
            f"is {current.size} bytes but {first.path.name} is {size} bytes",
            "every file of a commit log has the same size; restore the file from the store",
        )
    if size < MIN_SEGMENT_SIZE:
        raise ValidationError(
            "commit log file",
            where,
            f"is {size} bytes, below the smallest segment size {MIN_SEGMENT_SIZE}",
            "import files written with mappedFileSizeCommitLog >= 4096",
        )
    if current.base % size:
        raise ValidationError(
            "commit log file",
            where,
            f"base offset {current.base} is not a multiple of the file size {size}",
            "file names must be the offsets RocketMQ gave them",
        )
    if current.base > c.JAVA_LONG_MAX - size:  # offsets are Java longs
        raise ValidationError(
            "commit log file", where, f"base offset {current.base} is beyond a Java long", "rename it as RocketMQ did"
        )
    if previous is not None and current.base != previous.base + size:
        raise ValidationError(
            "commit log file",
            where,
            f"base offset {current.base} does not follow {previous.path.name} (expected {previous.base + size})",
            "a file is missing between them; restore it from the store",
        )


# -- import --------------------------------------------------------------------------------------


def import_commitlog(
    lake: Path,
    broker_name: str,
    src_dir: Path,
    store_host_override: str | None = None,
    *,
    chunk_rows: int = IMPORT_CHUNK_ROWS,
    chunk_bytes: int = IMPORT_CHUNK_BYTES,
) -> ImportReport:
    """Import the RocketMQ commit log files of ``src_dir`` as broker ``broker_name`` of ``lake``.

    Every file is walked from byte 0: a BLANK marker (whose TOTALSIZE must be the bytes left)
    moves to the next file; a zero header ends the log, and later files must then hold no data;
    a v1 or v2 record is decoded with its body CRC checked, its PHYSICALOFFSET field must equal
    file base + position and it must leave room for a blank marker, as RocketMQ's writer always
    does. Rows are written in chunks of ``chunk_rows`` rows or ``chunk_bytes`` record bytes and
    committed to ``commitlog`` in ONE commit (operation ``IMPORT``) after the broker's ``brokers``
    row (segment size = file size, ASYNC_FLUSH, store host of the first record unless
    ``store_host_override``) and ``topic_config`` rows (queue count = highest queue id + 1,
    perm 6) are appended. The broker name lock is held throughout.

    Raises:
        ValidationError: bad file set, bad broker name or store host, no records, or the broker
            already has records; nothing is written.
        CorruptRecordError: a record or marker is wrong (names the file and the byte position);
            nothing is committed and the Parquet files already written are deleted.
        BrokerLockedError: a broker with this name is running on the lake.

    The ``brokers`` row goes first so that records are never visible without their segment size.
    If the final commit itself fails (I/O), that row stays (a known broker without records, which a
    new import may fill) and so do the written Parquet files, which no commit references.
    """
    validate_name(broker_name, "broker_name", c.GROUP_MAX_LENGTH)
    if chunk_rows < 1:
        raise ValidationError("chunk_rows", chunk_rows, "must be positive")
    if chunk_bytes < 1:
        raise ValidationError("chunk_bytes", chunk_bytes, "must be positive")
    if store_host_override is not None:
        store_host_override = str(parse_host(store_host_override, "store_host_override"))
    files = list_commitlog_files(Path(src_dir))
    with BrokerNameLock(lake, broker_name):
        ensure_table(lake, COMMITLOG)
        _refuse_existing_records(lake, broker_name)
        log = AppendLog(COMMITLOG.location(lake), COMMITLOG)
        writer = ChunkWriter(log, broker_name, chunk_rows, chunk_bytes)
        try:
            scan = _scan_files(files, broker_name, writer.add)
            writer.flush()
            if scan.records == 0:
                raise ValidationError(
                    "src_dir",
                    str(src_dir),
                    "holds no records (the first file starts with a zero header)",
                    "import a commit log that holds messages",
                )
            store_host = store_host_override or scan.store_host
            _register_broker(lake, broker_name, store_host, files[0].size, scan.queue_max)
        except BaseException:
            writer.discard()
            raise
        # a failed commit may still have linked its log entry, so its files are never deleted
        params = {"mode": "Append", "broker_name": broker_name, "source": str(src_dir)}
        version = log.commit(writer.adds, operation="IMPORT", info={"operationParameters": params})
        log.wait_for_checkpoint()
    return ImportReport(
        broker_name,
        len(files),
        scan.segments,
        scan.records,
        scan.bytes,
        files[0].size,
        scan.first_offset,
        scan.last_offset,
        scan.end_offset,
        {t: q + 1 for t, q in sorted(scan.queue_max.items())},
        store_host,
        version,
    )


def _refuse_existing_records(lake: Path, broker_name: str) -> None:
    segments = segment_count(lake, broker_name)
    if segments:
        raise ValidationError(
            "broker_name",
            broker_name,
            f"already has records in the commitlog table ({segments} segments)",
            "import under a new broker name (a broker's log can only be imported once)",
        )


def segment_count(lake: Path, broker_name: str) -> int:
    """How many segments of ``broker_name`` hold records in the lake's ``commitlog`` (which exists)."""
    table = load_table(COMMITLOG.location(lake))
    segments = table.partitions(file_pruning_predicate=[("broker_name", "=", broker_name)])
    return sum(p["broker_name"] == broker_name for p in segments)


@dataclass
class _Scan:
    """Running totals of an import walk."""

    records: int = 0
    bytes: int = 0
    segments: int = 0
    first_offset: int = -1
    last_offset: int = -1
    end_offset: int = -1
    store_host: str = ""
    queue_max: dict[str, int] = field(default_factory=dict)
    end: tuple[Path, int] | None = None  # where a zero header ended the log

    def count(self, row: dict[str, Any], opens_segment: bool) -> None:
        """Account for one imported record."""
        if self.records == 0:
            self.first_offset = row["commit_log_offset"]
            self.store_host = row["store_host"]
        self.segments += opens_segment
        self.records += 1
        self.bytes += row["store_size"]
        self.last_offset = row["commit_log_offset"]
        self.end_offset = row["commit_log_offset"] + row["store_size"]
        self.queue_max[row["topic"]] = max(self.queue_max.get(row["topic"], -1), row["queue_id"])


def _scan_files(files: list[SegmentFile], broker_name: str, sink: Callable[[dict[str, Any]], None]) -> _Scan:
    scan = _Scan()
    for segment_file in files:
        with open(segment_file.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                _scan_file(view, segment_file, broker_name, scan, sink)
            finally:
                view.release()
    return scan


def _scan_file(
    data: memoryview, segment_file: SegmentFile, broker_name: str, scan: _Scan, sink: Callable[[dict[str, Any]], None]
) -> None:
    """Walk one file from byte 0 to its blank marker or zero header, passing each row to ``sink``."""
    source = str(segment_file.path)
    if scan.end is not None:
        if peek_header(data, 0) != (0, 0):
            end_path, end_position = scan.end
            raise CorruptRecordError(
                source, 0, f"data after the end of the log (zero header in {end_path} at byte {end_position})"
            )
        return
    position = 0
    while True:
        size, magic = peek_header(data, position)
        if size == 0 and magic == 0:
            scan.end = (segment_file.path, position)
            return
        if magic == c.BLANK_MAGIC_CODE:
            left = segment_file.size - position
            if size != left:
                raise CorruptRecordError(source, position, f"blank marker TOTALSIZE {size} but {left} bytes are left")
            return
        row = decode_file_record(data, segment_file, position, magic)
        scan.count(row, opens_segment=position == 0)
        row["broker_name"] = broker_name
        row["segment"] = segment_file.base
        sink(row)
        position += size


def decode_file_record(data: memoryview, segment_file: SegmentFile, position: int, magic: int) -> dict[str, Any]:
    """Decode and check the record at ``position``.

    Raises:
        CorruptRecordError: unknown magic, undecodable record, size or CRC mismatch,
            PHYSICALOFFSET different from base + position, or no room left for a blank marker.
    """
    source = str(segment_file.path)
    if magic not in (c.MAGIC_CODE_V1, c.MAGIC_CODE_V2):
        raise CorruptRecordError(
            source,
            position,
            f"magic code {magic} (0x{magic & 0xFFFFFFFF:08X}) is neither a message (v1 0xDAA320A7, "
            "v2 0xDAA320AB) nor a blank marker (0xCBD43194), and TOTALSIZE/MAGIC are not zero",
        )
    row = decode_record(data, position, source)
    expected = segment_file.base + position
    if row["commit_log_offset"] != expected:
        raise CorruptRecordError(
            source,
            position,
            f"physical offset field {row['commit_log_offset']} at position {position}; expected {expected}",
        )
    left = segment_file.size - position - row["store_size"]
    if left < c.END_FILE_MIN_BLANK_LENGTH:
        raise CorruptRecordError(
            source, position, f"record of {row['store_size']} bytes leaves {left} bytes, fewer than a blank marker"
        )
    return row


class ChunkWriter:
    """Buffers rows and writes them as uncommitted Parquet files; can delete what it wrote."""

    def __init__(self, log: AppendLog, broker_name: str, chunk_rows: int, chunk_bytes: int) -> None:
        self.log = log
        self.chunk_rows = chunk_rows
        self.chunk_bytes = chunk_bytes
        self.adds: list[AddFile] = []
        self._rows: list[dict[str, Any]] = []
        self._bytes = 0
        self._directory = log.path / f"broker_name={escape_partition_value(broker_name)}"
        self._before = _tree(self._directory)

    def add(self, row: dict[str, Any]) -> None:
        """Buffer ``row``; write the buffer once it reaches a chunk limit."""
        self._rows.append(row)
        self._bytes += row["store_size"]
        if len(self._rows) >= self.chunk_rows or self._bytes >= self.chunk_bytes:
            self.flush()

    def write_table(self, rows: pa.Table) -> None:
        """Write ``rows`` (``commitlog`` columns) as uncommitted files at once."""
        self.adds.extend(self.log.write_files(rows))

    def flush(self) -> None:
        """Write the buffered rows (nothing is committed)."""
        if self._rows:
            self.adds.extend(self.log.write_files(rows_to_table(self._rows)))
            self._rows, self._bytes = [], 0

    def discard(self) -> None:
        """Delete every file and directory this writer created under the broker's partition.

        The caller holds the broker name lock and the broker has no committed records, so
        whatever appeared there since this writer was made is its own.
        """
        self._rows = []
        created = sorted(_tree(self._directory) - self._before, key=lambda p: len(p.parts), reverse=True)
        for path in created:
            if path.is_dir():
                if not any(path.iterdir()):
                    path.rmdir()
            else:
                path.unlink(missing_ok=True)


def _tree(directory: Path) -> set[Path]:
    if not directory.exists():
        return set()
    return {directory, *directory.rglob("*")}


def _register_broker(
    lake: Path, broker_name: str, store_host: str, segment_size: int, queue_max: dict[str, int]
) -> None:
    register_broker(lake, broker_name, store_host, segment_size)
    append_topic_config(lake, broker_name, {topic: q + 1 for topic, q in queue_max.items()})


def register_broker(lake: Path, broker_name: str, store_host: str, segment_size: int) -> None:
    """Append the ``brokers`` row of a broker whose log comes from RocketMQ files (ASYNC_FLUSH,
    RocketMQ's default, started now by this process)."""
    broker = {
        "broker_name": [broker_name],
        "store_host": [store_host],
        "segment_size": [segment_size],
        "flush_mode": ["ASYNC_FLUSH"],
        "started_timestamp": [now_ms()],
        "process": [f"{os.getpid()}@{socket.gethostname()}"],
    }
    append_rows(lake, BROKERS, pa.table(broker))


def append_topic_config(lake: Path, broker_name: str, queue_nums: Mapping[str, int]) -> None:
    """Append ``topic_config`` rows giving each topic of ``queue_nums`` its queue count on
    ``broker_name``, with the permission and message type of its latest row (read and write and
    none for a new topic); nothing when it is empty."""
    if not queue_nums:
        return
    rows = read_table(lake, TOPIC_CONFIG)
    latest = {
        row["topic"]: row
        for row in rows.filter(pc.equal(rows["broker_name"], broker_name)).sort_by("updated_timestamp").to_pylist()
    }
    moment = now_ms()
    config = [
        {
            "broker_name": broker_name,
            "topic": topic,
            "queue_nums": queue_nums[topic],
            "perm": latest[topic]["perm"] if topic in latest else c.PERM_READ | c.PERM_WRITE,
            "updated_timestamp": moment,
            "message_type": latest[topic]["message_type"] if topic in latest else None,
        }
        for topic in sorted(queue_nums)
    ]
    append_rows(lake, TOPIC_CONFIG, pa.Table.from_pylist(config, schema=TOPIC_CONFIG.arrow_schema))


# -- export --------------------------------------------------------------------------------------


def export_commitlog(lake: Path, broker_name: str, out_dir: Path) -> ExportReport:
    """Write broker ``broker_name``'s log as RocketMQ commit log files into ``out_dir``.

    One file per segment, named ``%020d`` of its base, each exactly the broker's segment size (from
    its latest ``brokers`` row): the records at ``commit_log_offset - segment``, an 8-byte blank
    marker after the last record of every segment but the last, zeros elsewhere. Rows are read from
    one table version, one segment at a time; the broker may keep running meanwhile. Records must be
    contiguous: the first record of a segment at its base, each next one at the previous end, each
    segment right after the previous one.

    Raises:
        ValidationError: unknown broker, or ``out_dir`` is a file or already holds commit log files.
        CorruptRecordError: the rows are not a contiguous log, or a row does not encode to its
            ``store_size``; ``source`` names the broker and segment, ``position`` is the commit log
            offset. The files written so far are deleted.
    """
    out_dir = Path(out_dir)
    segment_size = broker_segment_size(lake, broker_name)
    _check_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        table = load_table(COMMITLOG.location(lake))
    except TableNotFoundError:
        return ExportReport(broker_name, out_dir, 0, 0, 0, segment_size, None, None, None)
    segments = sorted(
        {
            int(p["segment"])
            for p in table.partitions(file_pruning_predicate=[("broker_name", "=", broker_name)])
            if p["broker_name"] == broker_name
        }
    )
    exporter = _Exporter(table, broker_name, out_dir, segment_size)
    try:
        for index, segment in enumerate(segments):
            exporter.write_segment(segment, last=index == len(segments) - 1)
    except BaseException:
        for path in exporter.written:
            path.unlink(missing_ok=True)
        raise
    return ExportReport(
        broker_name,
        out_dir,
        len(exporter.written),
        exporter.records,
        exporter.bytes,
        segment_size,
        exporter.first_offset,
        exporter.end_offset,
        table.version(),
    )


def broker_segment_size(lake: Path, broker_name: str) -> int:
    """The segment size of ``broker_name``'s latest ``brokers`` row.

    Raises:
        ValidationError: the lake has no broker of that name.
    """
    size = registered_segment_size(lake, broker_name)
    if size is None:
        known = sorted(set(read_table(lake, BROKERS, ["broker_name"])["broker_name"].to_pylist()))
        raise ValidationError("broker_name", broker_name, f"no such broker in lake {lake}", f"use one of {known}")
    return size


def registered_segment_size(lake: Path, broker_name: str) -> int | None:
    """The segment size of ``broker_name``'s latest ``brokers`` row, None when it has none."""
    rows = read_table(lake, BROKERS, ["broker_name", "segment_size", "started_timestamp"])
    mine = rows.filter(pc.equal(rows["broker_name"], broker_name))
    if mine.num_rows == 0:
        return None
    return int(mine.sort_by([("started_timestamp", "descending")])["segment_size"][0].as_py())


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ValidationError("out_dir", str(out_dir), "is not a directory", "give a new or empty directory")
    if out_dir.is_dir() and any(SEGMENT_FILE_NAME.match(p.name) for p in out_dir.iterdir()):
        raise ValidationError(
            "out_dir", str(out_dir), "already holds commit log files", "export into a new or empty directory"
        )


class _Exporter:
    """Writes segment files one at a time, checking that the records are contiguous."""

    def __init__(self, table: DeltaTable, broker_name: str, out_dir: Path, segment_size: int) -> None:
        self.dataset = table.to_pyarrow_dataset()  # one snapshot, opened once: segments prune by partition
        self.broker_name = broker_name
        self.out_dir = out_dir
        self.segment_size = segment_size
        self.written: list[Path] = []
        self.records = 0
        self.bytes = 0
        self.first_offset: int | None = None
        self.end_offset: int | None = None  # the byte after the last record written
        self.previous_segment: int | None = None

    def write_segment(self, segment: int, last: bool) -> None:
        """Write the file of ``segment``; ``last`` marks the last segment holding records."""
        source = f"{COMMITLOG.name} table, broker_name={self.broker_name} segment={segment}"
        self._check_segment_start(segment, source)
        where = (ds.field("broker_name") == self.broker_name) & (ds.field("segment") == segment)
        rows = self.dataset.to_table(filter=where, columns=list(RECORD_COLUMNS)).sort_by("commit_log_offset")
        path = self.out_dir / f"{segment:020d}"
        with open(path, "xb") as handle:
            self.written.append(path)
            end = self._write_records(handle, rows, segment, source)
            left = segment + self.segment_size - end
            if not last:
                if left < c.END_FILE_MIN_BLANK_LENGTH:
                    raise CorruptRecordError(
                        source, end, f"{left} bytes left after the last record, fewer than a blank marker needs"
                    )
                handle.write(encode_blank(left))
            handle.truncate(self.segment_size)
            handle.flush()
            os.fsync(handle.fileno())
        self.previous_segment = segment
        self.end_offset = end

    def _check_segment_start(self, segment: int, source: str) -> None:
        if segment % self.segment_size:
            raise CorruptRecordError(
                source, segment, f"segment base {segment} is not a multiple of the segment size {self.segment_size}"
            )
        if self.previous_segment is not None and segment != self.previous_segment + self.segment_size:
            raise CorruptRecordError(
                source,
                segment,
                f"segment {segment} follows segment {self.previous_segment}; segment "
                f"{self.previous_segment + self.segment_size} is missing",
            )

    def _write_records(self, handle: BinaryIO, rows: pa.Table, segment: int, source: str) -> int:
        """Write the segment's rows (sorted by offset) from byte 0; return the end offset."""
        expected = segment  # a segment's first record sits at its base
        limit = segment + self.segment_size
        for batch in rows.to_batches(max_chunksize=EXPORT_BATCH_ROWS):
            for row in batch.to_pylist():
                offset, size = row["commit_log_offset"], row["store_size"]
                if offset != expected:
                    raise CorruptRecordError(source, offset, f"record at {offset} but the log continues at {expected}")
                if offset + size > limit:
                    raise CorruptRecordError(
                        source, offset, f"record of {size} bytes runs past the segment end {limit}"
                    )
                handle.write(_encode(row, source))
                if self.first_offset is None:
                    self.first_offset = offset
                self.records += 1
                self.bytes += size
                expected = offset + size
        return expected


def _encode(row: dict[str, Any], source: str) -> bytes:
    offset = row["commit_log_offset"]
    try:
        record = encode_record(row)
    except (struct.error, ValidationError) as exc:
        raise CorruptRecordError(source, offset, f"row does not encode as a record: {exc}") from None
    if len(record) != row["store_size"]:
        raise CorruptRecordError(
            source, offset, f"store_size {row['store_size']} but the row's fields encode to {len(record)} bytes"
        )
    return record


# -- command line --------------------------------------------------------------------------------
