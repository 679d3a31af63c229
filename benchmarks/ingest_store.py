"""Ingest throughput of a RocketMQ store against reading its files with no decoding, in one run.

    python benchmarks/ingest_store.py [--size-mb 1024] [--file-mb 128] [--body 256] [--keep DIR] [--apache]

The store is laid out as a RocketMQ broker writes it: files of ``--file-mb`` MiB named by their
base offset, records of 64 distinct messages (8 topics x 4 queues, bodies of ``--body`` bytes and
up to 31 more, 5.x properties with a trailing separator) placed one after the other with their own
physical and queue offsets, a blank marker at each file's end, the last file zero-filled. Then:

- **full**: ``ingest-store`` of the whole store into an empty lake (MB/s and records/s);
- **floor**: reading the same files once more with no decoding;
- **incremental**: 1 % more records appended to the store, then ``ingest-store`` again, as a
  share of the full run (target: at most 5 %).

With ``--apache`` the store is one that Apache RocketMQ itself wrote: a name server and a broker
(the tests' harness, ``tests/apache_rocketmq.py``, with commit log files of ``--file-mb`` MiB) take
single sends of ``--body``-byte messages from RocketMQ's 4.x Java client (the harness's driver,
step ``flood``) until ``--size-mb`` MiB of bodies were acknowledged; the broker is stopped (SIGTERM),
the store ingested and read, then the broker started again on it, 1 % more sent, stopped, and
the store ingested again. The client compresses a body of 4 KiB or more (its
``compressMsgBodyOverHowmuch``): ``--body 4000`` fills the log with bodies as given.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker_model.common import body_crc, create_msg_id, encode_properties, parse_host
from broker_model.common import constants as c
from broker_model.store import encode_blank, encode_record, ingest_store, magic_for_topic, record_length

MIB = 1024 * 1024
STORE_HOST = "10.0.0.7:10911"
_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET at byte 20 of a record
_STORE_TIME = struct.Struct(">q")


def templates(body: int) -> list[bytes]:
    """64 encoded records (offsets to be patched in): 8 topics, 4 queues, bodies of ``body`` to ``body + 31`` bytes."""
    records = []
    for k in range(64):
        topic, payload = f"Topic{k % 8}", os.urandom(body + k % 32)
        properties = {"TAGS": f"tag{k % 5}", "KEYS": f"key-{k}", "UNIQ_KEY": f"{k:032X}", "WAIT": "true"}
        raw = encode_properties(properties).encode()
        size = record_length(len(payload), len(topic), len(raw))
        row = {
            "store_size": size,
            "magic_code": magic_for_topic(topic),
            "body_crc": body_crc(payload),
            "queue_id": k % 4,
            "flag": 0,
            "queue_offset": 0,
            "commit_log_offset": 0,
            "sys_flag": 0,
            "born_timestamp": 1_700_000_000_000,
            "born_host": "192.168.3.4:51200",
            "store_timestamp": 1_700_000_000_000,
            "store_host": STORE_HOST,
            "reconsume_times": 0,
            "prepared_transaction_offset": 0,
            "body": payload,
            "topic": topic,
            "raw_properties": raw,
        }
        records.append(encode_record(row))
    assert create_msg_id(parse_host(STORE_HOST), 0)  # the host parses: records are well formed
    return records


class StoreLayout:
    """Appends records to a store's commit log files the way a broker lays them out."""

    def __init__(self, root: Path, file_size: int, body: int) -> None:
        self.root = root
        self.directory = root / "commitlog"
        self.directory.mkdir(parents=True)
        self.file_size = file_size
        self.templates = templates(body)
        self.position = 0
        self.records = 0
        self.queue_offsets: dict[tuple[int, int], int] = {}
        self.clock = 1_700_000_000_000

    def append(self, size: int) -> None:
        """Append records until ``size`` more bytes of the log are written."""
        end = self.position + size
        while self.position < end:
            base = self.position - self.position % self.file_size
            data = bytearray(self._read(base))
            at = self.position - base
            while self.position < end:
                k = self.records % 64
                record = self.templates[k]
                if at + len(record) + c.END_FILE_MIN_BLANK_LENGTH > self.file_size:
                    data[at : at + 8] = encode_blank(self.file_size - at)
                    self.position = base + self.file_size
                    break
                queue = (k % 8, k % 4)
                queue_offset = self.queue_offsets.get(queue, 0)
                self.queue_offsets[queue] = queue_offset + 1
                data[at : at + len(record)] = record
                _OFFSETS.pack_into(data, at + 20, queue_offset, self.position)
                self.clock += 1
                _STORE_TIME.pack_into(data, at + 56, self.clock)  # after the 8-byte IPv4 born host
                at += len(record)
                self.position += len(record)
                self.records += 1
            (self.directory / f"{base:020d}").write_bytes(bytes(data))

    def _read(self, base: int) -> bytes:
        path = self.directory / f"{base:020d}"
        return path.read_bytes() if path.exists() else bytes(self.file_size)


class ApacheStore:
    """A store Apache RocketMQ writes: the broker runs while :meth:`append` sends, and is stopped
    between sends, so that each ingest reads a store its broker closed cleanly."""

    def __init__(self, work: Path, file_size: int, body: int) -> None:
        root = str(Path(__file__).resolve().parent.parent)
        if root not in sys.path:
            sys.path.append(root)  # the harness is a module of the tests
        from tests.apache_rocketmq import ApacheRocketMQ, TopicSpec

        overrides = {"mappedFileSizeCommitLog": file_size}
        self.rocketmq: Any = ApacheRocketMQ(work / "apache", broker_overrides=overrides)
        self.body = body
        self.records = 0
        self.rocketmq.start()
        self.rocketmq.create(TopicSpec("Bulk", queues=8))

    @property
    def root(self) -> Path:
        return Path(self.rocketmq.store_dir)

    def append(self, size: int) -> None:
        """Send until ``size`` bytes of bodies were acknowledged, then stop the broker."""
        if not self.rocketmq.running():
            self.rocketmq.start()
        wanted = -(-size // self.body)
        step = ["flood", "topic=Bulk", f"prefix=b{self.records}", f"size={self.body}"]
        with self.rocketmq.start_driver(step) as flood:
            what = f"{wanted:,} acknowledged sends"
            flood.wait_for(lambda d: len(d.events("sent")) >= wanted, what, deadline_s=3_600)
            self.records += sum(line.get("event") == "sent" for line in flood.finish())
        self.rocketmq.stop()

    def close(self) -> None:
        self.rocketmq.stop()


def floor(root: Path) -> float:
    """Seconds to read every commit log file once, with no decoding."""
    started = time.perf_counter()
    for path in sorted((root / "commitlog").iterdir()):
        with open(path, "rb") as handle:
            while handle.read(16 * MIB):
                pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB of records in the store (default 1024)")
    parser.add_argument("--file-mb", type=int, default=128, help="commit log file size in MiB (default 128)")
    parser.add_argument("--body", type=int, default=256, help="smallest body size in bytes (default 256)")
    parser.add_argument("--keep", type=Path, default=None, help="directory to keep the store and the lake in")
    parser.add_argument("--apache", action="store_true", help="the store written by Apache RocketMQ's broker")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    lake = work / "lake"
    layout: StoreLayout | ApacheStore
    if args.apache:
        layout = ApacheStore(work, args.file_mb * MIB, args.body)
    else:
        layout = StoreLayout(work / "store", args.file_mb * MIB, args.body)
    store = layout.root
    started = time.perf_counter()
    layout.append(args.size_mb * MIB)
    written_s = time.perf_counter() - started
    writer = "Apache RocketMQ's broker" if args.apache else "the layout"
    print(f"store written by {writer}: {layout.records:,} records in {written_s:.1f} s")

    started = time.perf_counter()
    full = ingest_store(lake, "broker-real", store)
    full_s = time.perf_counter() - started
    floor_s = floor(store)
    records_before = layout.records
    layout.append(args.size_mb * MIB // 100)
    started = time.perf_counter()
    increment = ingest_store(lake, "broker-real", store)
    increment_s = time.perf_counter() - started
    if isinstance(layout, ApacheStore):
        layout.close()
    assert full.records >= records_before and full.records + increment.records >= layout.records

    mb = full.bytes / 1e6
    bodies = f"bodies of {args.body} bytes" if args.apache else f"bodies of {args.body}-{args.body + 31} bytes"
    print(f"\n{os.cpu_count()} cores; commit log files of {args.file_mb} MiB; {bodies}")
    print(f"{'run':<14}{'MB':>10}{'records':>12}{'seconds':>10}{'MB/s':>10}{'records/s':>12}{'vs floor':>10}")
    rates = f"{mb / full_s:>10.1f}{full.records / full_s:>12,.0f}{full_s / floor_s:>10.1f}"
    print(f"{'full':<14}{mb:>10,.0f}{full.records:>12,}{full_s:>10.1f}{rates}")
    print(f"{'floor (read)':<14}{mb:>10,.0f}{'-':>12}{floor_s:>10.2f}{mb / floor_s:>10.0f}{'-':>12}{'1.0':>10}")
    inc_mb = increment.bytes / 1e6
    print(
        f"{'incremental':<14}{inc_mb:>10,.1f}{increment.records:>12,}{increment_s:>10.2f}{inc_mb / increment_s:>10.1f}"
        f"{increment.records / increment_s:>12,.0f}{'-':>10}   {100 * increment_s / full_s:.1f}% of full"
    )


if __name__ == "__main__":
    main()
