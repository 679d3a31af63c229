"""Incremental ingest of a real RocketMQ broker's store (its ``storePathRootDir``) into the lake.

Each run reads the broker's ``commitlog/`` files from the physical offset the previous run ended
at, by RocketMQ's own recovery rule (``CommitLog.checkMessageAndReturnSize``): a record counts when
its magic code, total size, body CRC and physical offset field hold; a blank marker whose size is
the bytes left moves to the next file; a zero header is the end of the written data (the rest of a
pre-allocated mapped file). The records go into the broker's partition of ``commitlog`` in ONE
commit that also records the Delta application transaction ``ingest-store/<broker>`` with the next
offset to read as its version, so a run killed at any point leaves the lake at the previous run's
end or at this one's, never between: the next run neither skips nor repeats a record.

Where the walk stops:

- END: a zero header (no more data yet) or the last file read;
- TORN: a record that does not check out, with nothing written after it (no later file holds
  data, zeros after its extent): the record being written, or the tail of a crash; it is read
  again by the next run;
- CORRUPT: a record that does not check out while data follows it. The records before it are
  committed, then :class:`~schemas.errors.CorruptRecordError` names the file and byte position.

Files the broker deleted by retention before they were read become a lost range, recorded in
``store_ingests`` (and in the commit's ``operationParameters``), not an error. What else the store
holds, that no run reads (RocketMQ 5's timer wheel and log, the index, ...), is listed in the same
row (:func:`unread_files`), so that it is known, not lost. A store whose data
ends before the lake's end, or whose record at the lake's last ingested offset differs from the
lake's (another broker's store, a replaced or rewound one) is refused before anything is written.
See docs/ingest.md.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from broker_model.common import constants as c
from broker_model.common import delay_progress_path, now_ms, validate_name
from broker_model.store.append_log import AppendLog
from broker_model.store.delta_commits import latest_version, load_table, read_change, retry_listing_gap
from broker_model.store.delta_tables import add_missing_columns, ensure_table, read_table
from broker_model.store.name_lock import BrokerNameLock
from broker_model.store.record import peek_header
from broker_model.store.record_columns import RecordColumns
from broker_model.store.segment_files import (
    IMPORT_CHUNK_BYTES,
    IMPORT_CHUNK_ROWS,
    ChunkWriter,
    SegmentFile,
    append_topic_config,
    decode_file_record,
    list_commitlog_files,
    register_broker,
    registered_segment_size,
    segment_count,
)
from broker_model.store.store_configs import CONFIG_FILES, ConfigCounts, read_snapshot, write_snapshot
from schemas.catalog import COMMITLOG, STORE_INGESTS, TOPIC_CONFIG
from schemas.errors import CorruptRecordError, ValidationError

APP_ID_PREFIX: Final = "ingest-store/"  # + broker name: the commitlog application transaction
OPERATION: Final = "INGEST STORE"  # the commitInfo operation of an ingest commit
_ZERO_CHUNK: Final = bytes(1 << 20)

END: Final = "END"
TORN: Final = "TORN"
CORRUPT: Final = "CORRUPT"

# What a store root holds besides what the lake reads (commitlog/, the config files of
# CONFIG_FILES, and consumequeue/, rebuilt from the log and compared by --verify-broker): RocketMQ
# 4.9 and 5.5 names (DefaultMessageStore, TimerMessageStore, BrokerPathConfigHelper), and what
# each holds. The ingest lists everything else it finds, known here or not.
STORE_FILES: Final = {
    "timerwheel": "RocketMQ 5 timer wheel: a slot per second of the timer messages still waiting "
    "(the messages are records of rmq_sys_wheel_timer in the log)",
    "timerlog/": "RocketMQ 5 timer log: one unit per timer message the wheel holds",
    "config/timercheck": "RocketMQ 5 timer checkpoint: how far the timer has read and delivered",
    "config/timermetrics": "RocketMQ 5 timer message counts per topic",
    "config/transactionMetrics": "transactional message counts per topic",
    "config/consumerOrderInfo.json": "RocketMQ 5 POP orderly consumption: the queues' locks and progress",
    "config/consumerFilter.json": "the SQL92 and tag filters consumers registered",
    "index/": "the index of message keys and unique keys (the log's records hold both)",
    "rocksdbstore/": "RocketMQ 5 RocksDB store: consume queues and metadata when the store type is RocksDB",
    "compaction/": "RocketMQ 5 compacted topics' logs",
    "checkpoint": "the store's flush checkpoint, for recovery",
    "lock": "the lock file a running broker holds",
    "abort": "the running (or crashed) broker's marker",
    "abort.bak": "the previous start's abort marker",
}
_READ_NAMES: Final = frozenset({"commitlog", "consumequeue", "config"})
_READ_CONFIG_FILES: Final = frozenset(CONFIG_FILES) | {name + ".bak" for name in CONFIG_FILES}


def unread_files(store_dir: Path) -> dict[str, int]:
    """What ``store_dir`` holds that no ingest run reads: each file and folder of the store root but
    ``commitlog/``, ``consumequeue/`` and ``config/``, and each file of ``config/`` but the config
    files the ingest reads (and their ``.bak`` copies; ``.tmp`` files being written are left out),
    named by its path under the root (a directory with a trailing ``/``), with its bytes (a
    directory's files summed). What vanishes while it is listed is left out."""
    found: dict[str, int] = {}
    for item in _scan(store_dir):
        if item.name not in _READ_NAMES:
            found[item.name + ("/" if _is_dir(item) else "")] = _bytes(item)
    for item in _scan(store_dir / "config"):
        if item.name not in _READ_CONFIG_FILES and not item.name.endswith(".tmp"):
            found["config/" + item.name + ("/" if _is_dir(item) else "")] = _bytes(item)
    return dict(sorted(found.items()))


def _scan(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as found:
            return list(found)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_dir(item: os.DirEntry[str]) -> bool:
    try:
        return item.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _bytes(item: os.DirEntry[str]) -> int:
    """The size of a file, or of the files under a directory, summed (0 for what vanished)."""
    try:
        if not _is_dir(item):
            return item.stat(follow_symlinks=False).st_size
    except OSError:
        return 0
    return sum(_bytes(child) for child in _scan(Path(item.path)))


def app_id(broker_name: str) -> str:
    """The application transaction id under which ``commitlog`` records how far ``broker_name``'s
    store was ingested (its version is the next physical offset to read)."""
    return APP_ID_PREFIX + broker_name


def ingested_end(lake: Path, broker_name: str) -> int | None:
    """The next physical offset to ingest of ``broker_name``, None when it was never ingested."""
    location = COMMITLOG.location(lake)
    if not DeltaTable.is_deltatable(str(location)):
        return None
    return load_table(location).transaction_version(app_id(broker_name))


# -- the walk ------------------------------------------------------------------------------------


@dataclass
class Walk:
    """What one walk of the commit log files read.

    Attributes:
        start: the physical offset read from (after a lost range).
        end: the offset after the last valid record: the next walk's start.
        records: records passed to the sink.
        bytes: their sizes summed.
        lost: (from, to) of a range no longer in the store, None when none.
        stop: END, TORN or CORRUPT.
        corrupt: the error of a CORRUPT stop.
        queue_max: the highest queue id seen per topic.
        first_store_host: the store host of the first record read (None when none).
    """

    start: int
    end: int
    records: int = 0
    bytes: int = 0
    lost: tuple[int, int] | None = None
    stop: str = END
    corrupt: CorruptRecordError | None = None
    queue_max: dict[str, int] = field(default_factory=dict)
    first_store_host: str | None = None


def walk_commitlog(
    files: list[SegmentFile],
    start: int | None,
    sink: Callable[[pa.Table], None],
    broker_name: str,
    chunk_rows: int = IMPORT_CHUNK_ROWS,
    chunk_bytes: int = IMPORT_CHUNK_BYTES,
) -> Walk:
    """Walk ``files`` (one RocketMQ commit log, in offset order) from physical offset ``start``
    (None: the first file's base), passing the valid records to ``sink`` as ``commitlog`` tables
    of at most ``chunk_rows`` rows or about ``chunk_bytes`` record bytes (:class:`RecordColumns`).

    Raises:
        ValidationError: ``start`` lies beyond the files' end (the store is behind the lake).
    """
    size, first_base = files[0].size, files[0].base
    lost = None
    if start is None:
        start, lost = first_base, ((0, first_base) if first_base > 0 else None)
    elif start < first_base:
        start, lost = first_base, (start, first_base)
    if start >= files[-1].base + size:
        raise _behind(files, start)
    walk = Walk(start, start, lost=lost)
    columns = RecordColumns(broker_name)

    def full() -> bool:
        return len(columns) >= chunk_rows or columns.bytes >= chunk_bytes

    def flush() -> None:
        if len(columns):
            table = columns.table()
            if walk.first_store_host is None:
                walk.first_store_host = table["store_host"][0].as_py()
            topics = pc.dictionary_encode(table["topic"]).combine_chunks()
            highest = np.full(len(topics.dictionary), -1, dtype=np.int64)
            np.maximum.at(highest, topics.indices.to_numpy(), table["queue_id"].to_numpy())
            for topic, queue_id in zip(topics.dictionary.to_pylist(), highest.tolist(), strict=True):
                walk.queue_max[topic] = max(walk.queue_max.get(topic, -1), queue_id)
            sink(table)

    index = (start - first_base) // size
    position = start - files[index].base
    while index < len(files):
        segment_file = files[index]
        with open(segment_file.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                walker = _FileWalk(view, segment_file, files[index + 1 :], walk, columns)
                next_file = walker.run(position, full, flush)
                flush()  # the columns hold views of the file: taken before it is unmapped
            finally:
                view.release()
        if not next_file:
            break
        index, position = index + 1, 0
    return walk


def _behind(files: list[SegmentFile], done: int) -> ValidationError:
    return ValidationError(
        "STORE_DIR",
        str(files[-1].path.parent.parent),
        f"its commit log ends at offset {files[-1].base + files[-1].size}, before offset {done} the lake has ingested",
        "the store was replaced or rewound: ingest it under a new broker name",
    )


@dataclass
class _FileWalk:
    """The walk of one mapped commit log file."""

    data: memoryview
    segment_file: SegmentFile
    later: list[SegmentFile]
    walk: Walk
    columns: RecordColumns

    def run(self, position: int, full: Callable[[], bool], flush: Callable[[], None]) -> bool:
        """Walk from ``position``, calling ``flush`` whenever ``full()``; True when the walk goes
        on with the next file."""
        data, segment_file, walk = self.data, self.segment_file, self.walk
        left = segment_file.size
        while True:
            total, magic = peek_header(data, position)
            if (total, magic) == (0, 0):
                if self.later and _holds_data(self.later[0]) and peek_header(data, position) == (0, 0):
                    _stop_corrupt(walk, segment_file, position, "a zero header, but the next file holds records")
                return False
            if magic == c.BLANK_MAGIC_CODE and total == left - position:
                return True
            if magic == c.BLANK_MAGIC_CODE or self.columns.add(data, position, segment_file.base, left) is None:
                self._stop(position, total, magic)
                return False
            walk.records += 1
            walk.bytes += total
            position += total
            walk.end = segment_file.base + position
            if full():
                flush()

    def _stop(self, position: int, total: int, magic: int) -> None:
        """The record or marker at ``position`` fails a check: its exact error from the reference
        decoder, then the stop it makes (:func:`_stop_invalid`)."""
        data, segment_file = self.data, self.segment_file
        try:
            if magic == c.BLANK_MAGIC_CODE:
                problem = f"blank marker TOTALSIZE {total} but {segment_file.size - position} bytes are left"
                raise CorruptRecordError(str(segment_file.path), position, problem)
            decode_file_record(data, segment_file, position, magic)
        except CorruptRecordError as err:
            _stop_invalid(self.walk, data, segment_file, self.later, position, total, err)
            return
        raise AssertionError(  # the two decoders must agree on what is a valid record
            f"the record at byte {position} of {segment_file.path} passes decode_file_record but not RecordColumns.add"
        )


def _stop_invalid(
    walk: Walk,
    data: memoryview,
    segment_file: SegmentFile,
    later: list[SegmentFile],
    position: int,
    total: int,
    err: CorruptRecordError,
) -> None:
    """A record at ``position`` that does not check out: TORN unless data follows it (a later file
    holds records, or a header follows its extent), and CORRUPT only when it still does not check
    out after that was seen (a live broker may have finished writing it meanwhile)."""
    plausible = c.END_FILE_MIN_BLANK_LENGTH < total <= segment_file.size - position
    if later and _holds_data(later[0]):
        follows = True
    elif plausible:
        follows = peek_header(data, position + total) != (0, 0)
    else:
        follows = not _zeros(data, position + 8)
    if not follows:
        walk.stop = TORN
        return
    _, magic_now = peek_header(data, position)
    try:
        decode_file_record(data, segment_file, position, magic_now)
    except CorruptRecordError:
        walk.stop, walk.corrupt = CORRUPT, err
        return
    walk.stop = TORN  # written meanwhile: the next run reads it


def _stop_corrupt(walk: Walk, segment_file: SegmentFile, position: int, problem: str) -> None:
    walk.stop, walk.corrupt = CORRUPT, CorruptRecordError(str(segment_file.path), position, problem)


def _holds_data(segment_file: SegmentFile) -> bool:
    with open(segment_file.path, "rb") as handle:
        return handle.read(8) != bytes(8)


def _zeros(data: memoryview, start: int) -> bool:
    for offset in range(start, len(data), len(_ZERO_CHUNK)):
        chunk = data[offset : offset + len(_ZERO_CHUNK)]
        if chunk != _ZERO_CHUNK[: len(chunk)]:
            return False
    return True


# -- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IngestReport:
    """What one :func:`ingest_store` run did.

    Attributes:
        broker_name: the lake's name of the broker.
        store_dir: the store read.
        start: the physical offset read from.
        end: the next offset to read.
        records: records ingested.
        bytes: their sizes summed.
        lost: a range lost before it was read, None when none.
        stop: END, TORN or CORRUPT.
        version: the ``commitlog`` version of the run's commit, None when nothing was committed.
        configs: the rows the config files added (:mod:`broker_model.store.store_configs`).
    """

    broker_name: str
    store_dir: Path
    start: int
    end: int
    records: int
    bytes: int
    lost: tuple[int, int] | None
    stop: str
    version: int | None
    configs: ConfigCounts = field(default_factory=ConfigCounts)

    def summary(self) -> str:
        """One line for the command line."""
        configs = self.configs
        changed = (
            f"; config: {configs.offsets} offset commits, {configs.topics} topics, {configs.groups} groups"
            f"{', schedule progress' if configs.delay else ''}"
        )
        if self.version is None:
            where = f"{self.store_dir} after offset {self.end}"
            return f"ingest-store {self.broker_name!r}: no new records in {where}{changed}"
        lost = f", offsets {self.lost[0]}..{self.lost[1]} lost before they were read" if self.lost else ""
        torn = ", an incomplete last record left for the next run" if self.stop == TORN else ""
        return (
            f"ingest-store {self.broker_name!r}: {self.records} records ({self.bytes} bytes) from {self.store_dir}, "
            f"offsets {self.start}..{self.end}{lost}{torn}, commitlog version {self.version}{changed}"
        )


def ingest_store(
    lake: Path,
    broker_name: str,
    store_dir: Path,
    *,
    chunk_rows: int = IMPORT_CHUNK_ROWS,
    chunk_bytes: int = IMPORT_CHUNK_BYTES,
) -> IngestReport:
    """Ingest the records ``store_dir``'s commit log gained since the last run, as broker
    ``broker_name`` of ``lake`` (see the module docstring). The broker name lock is held
    throughout, so a broker of ours cannot run under that name meanwhile.

    Raises:
        ValidationError: not a store directory, a bad broker name, a broker of the lake written
            another way, a store of another segment size, behind the lake or whose record at the
            lake's last offset differs; nothing is written.
        CorruptRecordError: a corrupt record with data after it; the records before it are
            committed first.
        BrokerLockedError: the broker name is held by another process.
    """
    validate_name(broker_name, "broker_name", c.GROUP_MAX_LENGTH)
    store_dir = Path(store_dir)
    commitlog_dir = _check_store_dir(store_dir)
    snapshot = read_snapshot(store_dir)  # a malformed config file stops the run before any write
    with BrokerNameLock(lake, broker_name):
        log = load_table(ensure_table(lake, COMMITLOG))  # one snapshot for every check of the run
        done = log.transaction_version(app_id(broker_name))
        if done is None:
            _refuse_other_writers(lake, broker_name)
        _record_missing_ingest(lake, broker_name, done)
        files = list_commitlog_files(commitlog_dir) if _has_files(commitlog_dir) else []
        registered = registered_segment_size(lake, broker_name)
        if files and registered is not None and registered != files[0].size:
            raise ValidationError(
                "STORE_DIR",
                str(store_dir),
                f"its commit log files are {files[0].size} bytes, broker {broker_name!r} has segments of {registered}",
                "this is another broker's store: ingest it under its own broker name",
            )
        if files and done is not None:
            _check_continuity(log, broker_name, files, done, store_dir)
        report, corrupt = (
            _ingest(lake, broker_name, store_dir, files, done, registered is None, chunk_rows, chunk_bytes)
            if files
            else (IngestReport(broker_name, store_dir, done or 0, done or 0, 0, 0, None, END, None), None)
        )
        if registered is not None or report.version is not None:  # configs of a broker the lake knows
            report = replace(
                report, configs=write_snapshot(lake, broker_name, snapshot, delay_progress_path(lake, broker_name))
            )
    if corrupt is not None:
        raise corrupt
    return report


def _ingest(
    lake: Path,
    broker_name: str,
    store_dir: Path,
    files: list[SegmentFile],
    done: int | None,
    register: bool,
    chunk_rows: int,
    chunk_bytes: int,
) -> tuple[IngestReport, CorruptRecordError | None]:
    """Walk and commit; the report, and the error of a CORRUPT stop (raised by the caller)."""
    log = AppendLog(COMMITLOG.location(lake), COMMITLOG)
    writer = ChunkWriter(log, broker_name, chunk_rows, chunk_bytes)
    try:
        walk = walk_commitlog(files, done, writer.write_table, broker_name, chunk_rows, chunk_bytes)
        # a lost range alone is committed (the next run starts after it), once the broker is known
        if walk.records == 0 and (walk.lost is None or register):
            writer.discard()
            nothing = IngestReport(broker_name, store_dir, walk.start, walk.end, 0, 0, None, walk.stop, None)
            return nothing, walk.corrupt
        if register:
            assert walk.first_store_host is not None  # a run that registers has read a record
            register_broker(lake, broker_name, walk.first_store_host, files[0].size)
        _append_new_topics(lake, broker_name, walk.queue_max)
    except BaseException:
        writer.discard()
        raise
    parameters = {
        "mode": "Append",
        "broker_name": broker_name,
        "source": str(store_dir),
        "from": str(walk.start),
        "to": str(walk.end),
        "records": str(walk.records),
        "bytes": str(walk.bytes),
        "stop": walk.stop,
        **({"lost_from": str(walk.lost[0]), "lost_to": str(walk.lost[1])} if walk.lost else {}),
        "unread": json.dumps(unread_files(store_dir)),
    }
    version = log.commit(
        writer.adds,
        operation=OPERATION,
        info={"operationParameters": parameters},
        app_transaction=(app_id(broker_name), walk.end),
    )
    log.wait_for_checkpoint()
    _record_ingest(lake, broker_name, parameters, version)
    report = IngestReport(
        broker_name, store_dir, walk.start, walk.end, walk.records, walk.bytes, walk.lost, walk.stop, version
    )
    return report, walk.corrupt


def _check_store_dir(store_dir: Path) -> Path:
    if not store_dir.is_dir():
        raise ValidationError("STORE_DIR", str(store_dir), "is not a directory", "give a RocketMQ storePathRootDir")
    commitlog_dir = store_dir / "commitlog"
    if not commitlog_dir.is_dir():
        raise ValidationError(
            "STORE_DIR",
            str(store_dir),
            "has no commitlog/ directory",
            "give the broker's storePathRootDir (holding commitlog/, consumequeue/, config/)",
        )
    return commitlog_dir


def _has_files(commitlog_dir: Path) -> bool:
    return any(commitlog_dir.iterdir())


def _refuse_other_writers(lake: Path, broker_name: str) -> None:
    """A broker of the lake with records but never ingested was written by our broker or by
    ``import-commitlog``: a store's records cannot continue its log."""
    if segment_count(lake, broker_name):
        raise ValidationError(
            "broker_name",
            broker_name,
            "already has records in the commitlog table that no ingest-store run wrote",
            "ingest the store under a broker name of its own",
        )


def _check_continuity(log: DeltaTable, broker_name: str, files: list[SegmentFile], done: int, store_dir: Path) -> None:
    """The lake's last ingested record (the one ending at ``done``) in ``log`` (the ``commitlog``
    table) must be the store's record at its offset, when the store still holds that file."""
    size = files[0].size
    segment = (done - 1) - (done - 1) % size
    if done <= 0 or segment < files[0].base:
        return  # the file of the last record is gone (retention): nothing left to compare
    if segment > files[-1].base:
        raise _behind(files, done)
    columns = ["commit_log_offset", "store_size", "body_crc", "store_timestamp", "msg_id"]
    dataset = log.to_pyarrow_dataset()
    where = (ds.field("broker_name") == broker_name) & (ds.field("segment") == segment)
    rows = dataset.to_table(filter=where, columns=columns)
    last = rows.filter(pc.equal(pc.add(rows["commit_log_offset"], rows["store_size"]), done))
    if last.num_rows == 0:
        return  # the run that ended here ingested no record in that file (a lost range ended there)
    lake_row = last.to_pylist()[0]
    segment_file = files[(segment - files[0].base) // size]
    position = lake_row["commit_log_offset"] - segment
    with open(segment_file.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            _, magic = peek_header(view, position)
            store_row: dict[str, Any] | None = decode_file_record(view, segment_file, position, magic)
        except CorruptRecordError:
            store_row = None
        finally:
            view.release()
    same = store_row is not None and all(store_row[k] == lake_row[k] for k in columns if k != "msg_id")
    if not same:
        found = (
            "no valid record"
            if store_row is None
            else f"a record of {store_row['store_size']} bytes stored at {store_row['store_timestamp']}"
        )
        raise ValidationError(
            "STORE_DIR",
            str(store_dir),
            f"holds {found} at offset {lake_row['commit_log_offset']}, where broker {broker_name!r} has message "
            f"{lake_row['msg_id']} ({lake_row['store_size']} bytes stored at {lake_row['store_timestamp']})",
            "the store was replaced or rewound, or belongs to another broker: ingest it under a new broker name",
        )


def _append_new_topics(lake: Path, broker_name: str, queue_max: dict[str, int]) -> None:
    """``topic_config`` rows for the topics first seen, or seen with more queues, in this run."""
    if not queue_max:
        return
    rows = read_table(lake, TOPIC_CONFIG, ["broker_name", "topic", "queue_nums", "updated_timestamp"])
    mine = rows.filter(pc.equal(rows["broker_name"], broker_name)).sort_by("updated_timestamp").to_pylist()
    known = {row["topic"]: row["queue_nums"] for row in mine}
    grown = {t: q + 1 for t, q in queue_max.items() if known.get(t, 0) < q + 1}
    append_topic_config(lake, broker_name, grown)


# -- the ingest record ---------------------------------------------------------------------------


def _record_ingest(lake: Path, broker_name: str, parameters: dict[str, str], version: int) -> None:
    """Append the ``store_ingests`` row of the ingest commit ``version`` with its parameters,
    recording the same application transaction as that commit."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    lost_from, lost_to = parameters.get("lost_from"), parameters.get("lost_to")
    unread = parameters.get("unread")  # absent from the commits of older releases
    end = int(parameters["to"])
    row: dict[str, object] = {
        "broker_name": broker_name,
        "store_dir": parameters["source"],
        "ingested_timestamp": int(parameters.get("timestamp", now_ms())),
        "from_offset": int(parameters["from"]),
        "end_offset": end,
        "records": int(parameters["records"]),
        "bytes": int(parameters["bytes"]),
        "lost_from": int(lost_from) if lost_from is not None else None,
        "lost_to": int(lost_to) if lost_to is not None else None,
        "stop": parameters["stop"],
        "commitlog_version": version,
        "unread": list(json.loads(unread).items()) if unread is not None else None,
    }
    path = ensure_table(lake, STORE_INGESTS)
    add_missing_columns(path, STORE_INGESTS)  # a table an older release created
    retry_listing_gap(
        lambda: write_deltalake(
            str(path),
            pa.Table.from_pylist([row], schema=STORE_INGESTS.arrow_schema),
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id(broker_name), end)]),
        )
    )


def _record_missing_ingest(lake: Path, broker_name: str, done: int | None) -> None:
    """A run killed between its ``commitlog`` commit and its ``store_ingests`` row: append that row
    now, from the commit's own parameters (found from the latest commit back). ``done`` is the
    broker's ingested end (:func:`ingested_end`)."""
    path = STORE_INGESTS.location(lake)
    recorded = (
        load_table(path).transaction_version(app_id(broker_name)) if DeltaTable.is_deltatable(str(path)) else None
    )
    if done is None or recorded == done:
        return
    table_dir = COMMITLOG.location(lake)
    version = latest_version(table_dir)  # one listing, no replay of the Delta log
    wanted = app_id(broker_name)
    while version >= 0:
        change = read_change(table_dir, version)
        if change is None:
            return  # the commit is gone with the Delta log's cleanup: nothing left to tell
        if wanted in change.app_transactions:
            parameters = {**change.info["operationParameters"], "timestamp": str(change.info["timestamp"])}
            _record_ingest(lake, broker_name, parameters, version)
            return
        version -= 1


def broker_of_store(lake: Path, store_dir: Path) -> str | None:
    """The broker of ``lake`` last ingested from ``store_dir`` (paths compared resolved), None when
    none was."""
    if not DeltaTable.is_deltatable(str(STORE_INGESTS.location(lake))):
        return None
    rows = read_table(lake, STORE_INGESTS, ["broker_name", "store_dir", "ingested_timestamp"])
    wanted = Path(store_dir).resolve()
    mine = [r for r in rows.sort_by("ingested_timestamp").to_pylist() if Path(r["store_dir"]).resolve() == wanted]
    return mine[-1]["broker_name"] if mine else None
