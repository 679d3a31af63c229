"""A RocketMQ store written the way a RocketMQ broker writes it, by the tests' own code.

:class:`StoreWriter` lays out ``{root}/commitlog/`` as pre-allocated mapped files named by their
20-digit base offset, appends records with RocketMQ's ``MessageExtEncoder`` layout (packed here
field by field, not by the product's encoder), rolls to the next file with an 8-byte blank marker
when a record and a blank no longer fit, and keeps each queue's next offset. It can leave a torn
last record, flip a byte, delete files as retention does, and pre-allocate the next file.
"""

from __future__ import annotations

import os
import socket
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB
BLANK_MAGIC = -875286124  # 0xCBD43194
BORN_V6, STORE_V6 = 0x1 << 4, 0x1 << 5


CQ_UNIT = 20  # CQ_STORE_UNIT_SIZE: commit log offset (8), size (4), tags code (8)


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (of UTF-16 code units, 32-bit wrap), as the tags code."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@dataclass(frozen=True)
class Written:
    """One record the writer appended: where, and what a reader must find."""

    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    store_timestamp: int


def _host(address: str) -> bytes:
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.inet_pton(family, host) + struct.pack(">i", int(port))


def encode(
    *,
    topic: str,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    body: bytes,
    properties: str,
    born: str,
    store: str,
    born_timestamp: int,
    store_timestamp: int,
    sys_flag: int = 0,
) -> bytes:
    """One record's bytes, as ``CommitLog.MessageExtEncoder`` writes them (4.9 and 5.x)."""
    born_bytes, store_bytes = _host(born), _host(store)
    sys_flag |= (BORN_V6 if len(born_bytes) == 20 else 0) | (STORE_V6 if len(store_bytes) == 20 else 0)
    topic_bytes, props = topic.encode(), properties.encode()
    v2 = len(topic_bytes) > 127
    topic_len = struct.pack(">h", len(topic_bytes)) if v2 else struct.pack(">b", len(topic_bytes))
    tail = (
        struct.pack(">q", store_timestamp)
        + store_bytes
        + struct.pack(">iq", 0, 0)  # RECONSUMETIMES, PREPARED_TRANSACTION_OFFSET
        + struct.pack(">i", len(body))
        + body
        + topic_len
        + topic_bytes
        + struct.pack(">h", len(props))
        + props
    )
    head_len = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + len(born_bytes)
    total = head_len + len(tail)
    head = struct.pack(
        ">iiiiiqqiq",
        total,
        MAGIC_V2 if v2 else MAGIC_V1,
        zlib.crc32(body) & 0x7FFFFFFF,
        queue_id,
        0,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp,
    )
    return head + born_bytes + tail


class StoreWriter:
    """Writes a store root: ``commitlog/`` of ``file_size`` files.

    With ``first_base`` above 0 the store is one whose files before ``first_base`` retention
    deleted: records were written from offset 0 (over the queues :meth:`append_many` uses) up to
    ``first_base``, then the files below it and the consume queue files wholly below it deleted, as
    a broker's retention does. Its queues' offsets go on from where the deleted records left them,
    as in a real store; :attr:`written` holds only the records kept.
    """

    def __init__(
        self,
        root: Path,
        file_size: int = 8192,
        first_base: int = 0,
        store_host: str = "10.0.0.7:10911",
        trailing_separator: bool = True,
        cq_units_per_file: int = 64,
    ) -> None:
        self.root = Path(root)
        self.cq_file_size = CQ_UNIT * cq_units_per_file
        self.commitlog = self.root / "commitlog"
        self.commitlog.mkdir(parents=True, exist_ok=True)
        (self.root / "config").mkdir(exist_ok=True)
        self.file_size = file_size
        self.store_host = store_host
        self.trailing = trailing_separator
        self.position = 0  # the next physical offset
        self.queue_offsets: dict[tuple[str, int], int] = {}
        self.written: list[Written] = []
        self.clock = 1_700_000_000_000
        self._file(0)
        if first_base:
            self._write_history(first_base)

    def _write_history(self, first_base: int) -> None:
        if first_base % self.file_size:
            raise ValueError(f"first_base {first_base} is not a multiple of the file size {self.file_size}")
        count = 0
        while True:
            body = bytes([count % 251]) * (100 + count % 37)
            topic = ("Orders", "Audit")[count % 2]
            if self._rolls_into(self._record_size(topic, body, keys=f"h{count}"), first_base):
                break
            self.append(topic, (count // 2) % 4, body, keys=f"h{count}")
            count += 1
        left = first_base - self.position
        self._put(self.position, struct.pack(">ii", left, BLANK_MAGIC))  # the end of the last deleted file
        self.position = first_base
        self._file(first_base)
        while int(min(self.commitlog.iterdir()).name) < first_base:
            self.delete_first()
        self.written = []

    def _record_size(self, topic: str, body: bytes, keys: str | None = None) -> int:
        properties = {"TAGS": "TagA", "UNIQ_KEY": f"{self.clock + 7:032X}", "WAIT": "true"}
        if keys is not None:
            properties["KEYS"] = keys
        text = "".join(f"{k}\x01{v}\x02" for k, v in properties.items())
        return len(self._encode(topic, 0, 0, body, text if self.trailing else text[:-1], self.position))

    def _rolls_into(self, size: int, base: int) -> bool:
        """Whether a record of ``size`` bytes appended now would go into the file at ``base``."""
        current = self.position - self.position % self.file_size
        return current >= base or (
            self.position + size + 8 > current + self.file_size and current + self.file_size >= base
        )

    def _file(self, base: int) -> Path:
        path = self.commitlog / f"{base:020d}"
        if not path.exists():
            with open(path, "wb") as handle:
                handle.truncate(self.file_size)  # pre-allocated: zeros
        return path

    def _put(self, offset: int, data: bytes) -> None:
        base = offset - offset % self.file_size
        with open(self._file(base), "r+b") as handle:
            handle.seek(offset - base)
            handle.write(data)

    def append(self, topic: str, queue_id: int, body: bytes, keys: str | None = None) -> Written:
        """Append one record (rolling to the next file first when it and a blank do not fit)."""
        queue_offset = self.queue_offsets.get((topic, queue_id), 0)
        self.clock += 7
        properties = {"TAGS": "TagA", "UNIQ_KEY": f"{self.clock:032X}", "WAIT": "true"}
        if keys is not None:
            properties["KEYS"] = keys
        text = "".join(f"{k}\x01{v}\x02" for k, v in properties.items())
        if not self.trailing:
            text = text[:-1]
        record = self._encode(topic, queue_id, queue_offset, body, text, self.position)
        base = self.position - self.position % self.file_size
        if self.position + len(record) + 8 > base + self.file_size:
            left = base + self.file_size - self.position
            self._put(self.position, struct.pack(">ii", left, BLANK_MAGIC))
            self.position = base + self.file_size
            record = self._encode(topic, queue_id, queue_offset, body, text, self.position)
        self._put(self.position, record)
        self.unit(topic, queue_id, queue_offset, self.position, len(record), java_hash("TagA"))
        written = Written(self.position, len(record), topic, queue_id, queue_offset, body, self.clock)
        self.written.append(written)
        self.position += len(record)
        self.queue_offsets[(topic, queue_id)] = queue_offset + 1
        return written

    def unit(self, topic: str, queue_id: int, queue_offset: int, offset: int, size: int, tags_code: int) -> None:
        """Write the consume queue unit of ``queue_offset`` (20 bytes: physical offset, size, tags
        code) into ``consumequeue/<topic>/<queue_id>/``, files of ``cq_units_per_file`` units named
        by their first byte (queue offset x 20), pre-allocated with zeros."""
        directory = self.root / "consumequeue" / topic / str(queue_id)
        directory.mkdir(parents=True, exist_ok=True)
        position = queue_offset * CQ_UNIT
        base = position - position % self.cq_file_size
        path = directory / f"{base:020d}"
        if not path.exists():
            with open(path, "wb") as handle:
                handle.truncate(self.cq_file_size)
        with open(path, "r+b") as handle:
            handle.seek(position - base)
            handle.write(struct.pack(">qiq", offset, size, tags_code))

    def _encode(self, topic: str, queue_id: int, queue_offset: int, body: bytes, props: str, offset: int) -> bytes:
        return encode(
            topic=topic,
            queue_id=queue_id,
            queue_offset=queue_offset,
            physical_offset=offset,
            body=body,
            properties=props,
            born="192.168.3.4:51200",
            store=self.store_host,
            born_timestamp=self.clock - 3,
            store_timestamp=self.clock,
        )

    def append_many(self, count: int, topics: tuple[str, ...] = ("Orders", "Audit"), size: int = 100) -> None:
        """Append ``count`` records over ``topics`` and four queues each."""
        for i in range(count):
            topic = topics[i % len(topics)]
            self.append(topic, (i // len(topics)) % 4, bytes([i % 251]) * (size + i % 37), keys=f"k{i}")

    def torn(self, topic: str = "Orders", queue_id: int = 0, body: bytes = b"x" * 300, keep: int = 40) -> int:
        """Write only the first ``keep`` bytes of a next record (a crash mid-write); its offset.
        The writer's position stays before it, so a later append overwrites it."""
        queue_offset = self.queue_offsets.get((topic, queue_id), 0)
        record = self._encode(topic, queue_id, queue_offset, body, "TAGS\x01T\x02", self.position)
        self._put(self.position, record[:keep])
        return self.position

    def flip(self, offset: int) -> None:
        """Invert one byte of the log at physical ``offset``."""
        base = offset - offset % self.file_size
        path = self._file(base)
        data = bytearray(path.read_bytes())
        data[offset - base] ^= 0xFF
        path.write_bytes(bytes(data))

    def preallocate_next(self) -> Path:
        """Create the next (all-zero) file, as RocketMQ's AllocateMappedFileService does early."""
        base = self.position - self.position % self.file_size + self.file_size
        return self._file(base)

    def delete_first(self) -> None:
        """Delete the oldest file, as the broker's retention does, and the consume queue files whose
        every unit points below the oldest file left (``CleanConsumeQueueService``)."""
        min(self.commitlog.iterdir()).unlink()
        kept_from = int(min(self.commitlog.iterdir()).name) if any(self.commitlog.iterdir()) else self.position
        for path in sorted((self.root / "consumequeue").glob("*/*/*")):
            data = path.read_bytes()
            units = [struct.unpack_from(">qiq", data, i) for i in range(0, len(data), CQ_UNIT)]
            written = [offset for offset, size, _ in units if size > 0]
            if written and max(written) < kept_from:
                path.unlink()

    def config(self, name: str, text: str, mtime_ms: int | None = None) -> Path:
        """Write ``config/<name>`` as ``MixAll.string2File`` does: the text to ``<name>.tmp``, the
        previous content to ``<name>.bak``, then the rename; with ``mtime_ms``, that modification time."""
        path = self.root / "config" / name
        temp, backup = path.with_name(name + ".tmp"), path.with_name(name + ".bak")
        temp.write_text(text, encoding="utf-8")
        if path.exists():
            backup.write_bytes(path.read_bytes())
        temp.replace(path)
        if mtime_ms is not None:
            os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
        return path

    def files(self) -> list[Path]:
        """The commit log files, oldest first."""
        return sorted(self.commitlog.iterdir())


@dataclass(frozen=True)
class StoredRecord:
    """A record as a store's commit log file holds it, read by :func:`read_store`."""

    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    sys_flag: int
    body: bytes


def read_store(root: Path) -> list[StoredRecord]:
    """Every record of a store's ``commitlog/`` files, oldest first, parsed here field by field
    from RocketMQ's layout (not by the product's decoder): a file ends at its blank marker or at
    its first all-zero bytes (a pre-allocated tail)."""
    records = []
    for path in sorted((Path(root) / "commitlog").iterdir()):
        data, base, position = path.read_bytes(), int(path.name), 0
        while position + 8 <= len(data):
            size, magic = struct.unpack_from(">ii", data, position)
            if size == 0 or magic == BLANK_MAGIC:
                break
            records.append(_stored_record(data, position, base))
            position += size
    return records


def _stored_record(data: bytes, position: int, base: int) -> StoredRecord:
    size, magic, _, queue_id, _, queue_offset, offset, sys_flag, _ = struct.unpack_from(">iiiiiqqiq", data, position)
    assert offset == base + position, f"the record at {base + position} says it is at {offset}"
    at = position + 48 + (20 if sys_flag & BORN_V6 else 8) + 8 + (20 if sys_flag & STORE_V6 else 8) + 12
    (body_len,) = struct.unpack_from(">i", data, at)
    body = data[at + 4 : at + 4 + body_len]
    at += 4 + body_len
    if magic == MAGIC_V2:
        (topic_len,) = struct.unpack_from(">h", data, at)
        at += 2
    else:
        topic_len = data[at]
        at += 1
    topic = data[at : at + topic_len].decode()
    return StoredRecord(offset, size, topic, queue_id, queue_offset, sys_flag, body)


def read_consume_queues(root: Path) -> dict[tuple[str, int], dict[int, tuple[int, int, int]]]:
    """Every unit of a store's ``consumequeue/<topic>/<queue id>/`` files, by queue and queue
    offset: (commit log offset, size, tags code); the zero tail of a file and the blanks written
    before a queue's first unit (size ``Integer.MAX_VALUE``) left out."""
    queues: dict[tuple[str, int], dict[int, tuple[int, int, int]]] = {}
    for directory in sorted((Path(root) / "consumequeue").glob("*/*")):
        units = queues.setdefault((directory.parent.name, int(directory.name)), {})
        for path in sorted(directory.iterdir()):
            data, first = path.read_bytes(), int(path.name) // CQ_UNIT
            for index in range(len(data) // CQ_UNIT):
                offset, size, tags_code = struct.unpack_from(">qiq", data, index * CQ_UNIT)
                if 0 < size < (1 << 31) - 1:
                    units[first + index] = (offset, size, tags_code)
    return queues
