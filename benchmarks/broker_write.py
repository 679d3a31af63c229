"""Broker write throughput against raw Arrow-to-Parquet appends of the same rows, in one run.

    python benchmarks/broker_write.py [--batches 100] [--threads 64] [--per-thread 200] [--repeat 3]

(a) ``send_batch`` of 1,000 x 256-byte messages from one producer thread, under SYNC_FLUSH and
    under ASYNC_FLUSH (RocketMQ's default; the time includes the final flush);
(b) 64 threads of single SYNC_FLUSH sends.
The floor writes the very rows the broker stored, as Parquet files of the same sizes as the
broker's commits (one file per commit), with the same fsync, and nothing else. Each case runs
``--repeat`` times on a new lake; the row shows the run of median rate (and its floor).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from threads import run_timed

from broker_model.broker import Broker, BrokerConfig, FlushMode
from broker_model.client import Producer
from broker_model.common import Message
from schemas.catalog import COMMITLOG


def _floor(rows: pa.Table, chunk: int, directory: Path) -> float:
    """Seconds to append ``rows`` as Parquet files of ``chunk`` rows each, fsynced."""
    directory.mkdir(parents=True, exist_ok=True)
    data = rows.select(COMMITLOG.data_columns)
    started = time.perf_counter()
    for index, start in enumerate(range(0, data.num_rows, chunk)):
        with open(directory / f"part-{index}.parquet", "wb") as handle:
            pq.write_table(data.slice(start, chunk), handle, compression="snappy")
            handle.flush()
            os.fsync(handle.fileno())
    return time.perf_counter() - started


def _stored(lake: Path) -> pa.Table:
    return DeltaTable(str(lake / "commitlog")).to_pyarrow_table().sort_by("commit_log_offset")


def bench_batches(root: Path, batches: int, flush_mode: FlushMode) -> tuple[float, float, int]:
    lake = root / f"a-{flush_mode}"
    broker = Broker(BrokerConfig(lake=lake, flush_mode=flush_mode)).start()
    broker.ensure_topic("Bench", 8)
    producer = Producer([broker], seed=1)
    payloads = [[Message.create("Bench", os.urandom(256), tags="t") for _ in range(1000)] for _ in range(batches)]
    started = time.perf_counter()
    for batch in payloads:
        producer.send_batch(batch)
    broker.flush()
    elapsed = time.perf_counter() - started
    broker.shutdown()
    floor = _floor(_stored(lake), 1000, root / f"floor-a-{flush_mode}")
    return batches * 1000 / elapsed, batches * 1000 / floor, broker.commits


def bench_threads(root: Path, threads: int, per_thread: int) -> tuple[float, float, int]:
    lake = root / "b"
    broker = Broker(BrokerConfig(lake=lake, flush_mode="SYNC_FLUSH")).start()
    broker.ensure_topic("Bench", 8)
    producers = [Producer([broker], f"p{i}", seed=i) for i in range(threads)]
    messages = [[Message.create("Bench", os.urandom(256), tags="t") for _ in range(per_thread)] for _ in range(threads)]

    def work(index: int) -> None:
        for message in messages[index]:
            producers[index].send(message)

    elapsed = run_timed(threads, work)
    broker.shutdown()
    total = threads * per_thread
    chunk = max(1, round(total / broker.commits))
    floor = _floor(_stored(lake), chunk, root / "floor-b")
    return total / elapsed, total / floor, broker.commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--per-thread", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")

    def median(case: Callable[[Path], tuple[float, float, int]]) -> tuple[float, float, int]:
        runs = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="broker-bench-") as tmp:
                runs.append(case(Path(tmp)))
        return sorted(runs)[len(runs) // 2]

    rows = [
        (
            "(a) send_batch 1000 x 256 B, SYNC_FLUSH",
            *median(lambda root: bench_batches(root, args.batches, "SYNC_FLUSH")),
            "100,000",
        ),
        (
            "(a) send_batch 1000 x 256 B, ASYNC_FLUSH",
            *median(lambda root: bench_batches(root, args.batches, "ASYNC_FLUSH")),
            "100,000",
        ),
        (
            f"(b) {args.threads} threads single sends, SYNC_FLUSH",
            *median(lambda root: bench_threads(root, args.threads, args.per_thread)),
            "10,000",
        ),
    ]
    print(f"{'case':<46}{'msg/s':>10}{'floor msg/s':>13}{'ratio':>7}{'commits':>9}{'target':>10}")
    for name, rate, floor, commits, target in rows:
        print(f"{name:<46}{rate:>10,.0f}{floor:>13,.0f}{rate / floor:>7.2f}{commits:>9}{target:>10}")


if __name__ == "__main__":
    main()
