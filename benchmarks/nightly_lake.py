"""The lake of ``benchmarks/run_all.py``: the feature traffic, then the bulk, on an empty lake
(:func:`write_lake`), or written once for both engines with what it holds beside it
(:func:`write_source`) and copied for each (:func:`copy_lake`); and the increment written into it
before the incremental runs (:func:`append_increment`).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from consume_queue import write_messages

from broker_model.client import PullConsumer
from broker_model.tools import run_workload, start_brokers

FEATURE_MESSAGES = 20_000  # the nightly demo's size: its retry phase grows with it, not with the bulk
TRANSACTIONS = 2_000  # fixed, not a share of the bulk: each costs Python round trips and check-backs
NEW_FEATURE_MESSAGES = 1_000  # the plan mix (ordered, delayed, batches) around the new transactions
NEW_TRANSACTIONS = 200
OFFSET_GROUP = "cg-orders"  # the group that commits once more per queue before the incremental runs
LAKE_FACTS = "lake.json"  # beside a lake written once for both engines: what write_lake wrote, and the seed


def segment_size(messages: int) -> int:
    """Commit log segment bytes for a bulk of ``messages``: 32 bytes per message (about a tenth of a
    record, so each broker seals about five segments), between 1 MiB and 64 MiB."""
    return max(1 << 20, min(64 << 20, messages * 32))


def write_lake(lake: Path, messages: int, seed: int) -> dict[str, Any]:
    """Feature traffic, then the bulk (the docstring of ``benchmarks/run_all.py``); what was written
    and how long it took."""
    started = time.perf_counter()
    report = run_workload(
        lake,
        FEATURE_MESSAGES,
        seed,
        segment_size=segment_size(messages),
        consumers=True,
        transactions=TRANSACTIONS,
        retries=True,
    )
    feature_seconds = time.perf_counter() - started
    bulk_seconds = write_messages(lake, messages, seed)
    return {
        "feature_messages": report.messages,
        "feature_seconds": round(feature_seconds, 2),
        "consumed": dict(report.consumed),
        "transactions": dict(report.transactions),
        "retries": dict(report.retries),
        "bulk_messages": messages,
        "bulk_seconds": round(bulk_seconds, 2),
        "segment_size": segment_size(messages),
    }


def write_source(source: Path, messages: int, seed: int) -> dict[str, Any]:
    """Write the lake once, into ``source/lake`` (:func:`write_lake`), and what it holds (with
    ``seed``) into ``source/lake.json``, for runs on copies of it (:func:`copy_lake`); what it holds."""
    print(f"writing the lake once: {FEATURE_MESSAGES:,} feature messages, then {messages:,} bulk messages", flush=True)
    shutil.rmtree(source / "lake", ignore_errors=True)  # a kept work directory's earlier lake, whole or not
    (source / LAKE_FACTS).unlink(missing_ok=True)
    written = {**write_lake(source / "lake", messages, seed), "seed": seed}
    (source / LAKE_FACTS).write_text(json.dumps(written, indent=2))
    print(f"lake written: {json.dumps(written)}", flush=True)
    return written


def read_lake_facts(source: Path) -> dict[str, Any]:
    """What the lake in ``source`` holds, as :func:`write_source` wrote it."""
    facts: dict[str, Any] = json.loads((source / LAKE_FACTS).read_text())
    return facts


def copy_lake(source: Path, lake: Path) -> dict[str, Any]:
    """Replace ``lake`` with a copy of the lake :func:`write_source` wrote in ``source``; what it holds."""
    started = time.perf_counter()
    shutil.rmtree(lake, ignore_errors=True)
    shutil.copytree(source / "lake", lake, symlinks=True)
    written = read_lake_facts(source)
    print(
        f"lake copied from {source / 'lake'} in {time.perf_counter() - started:.1f} s ({written['bulk_messages']:,} "
        f"bulk + {written['feature_messages']:,} feature messages, seed {written['seed']}; {source / LAKE_FACTS})",
        flush=True,
    )
    return written


def append_increment(lake: Path, messages: int, seed: int) -> dict[str, Any]:
    """1 % more bulk messages, new transactions (with check rounds) and one offset commit per queue
    of :data:`OFFSET_GROUP`; what was written."""
    new = max(1, messages // 100)
    started = time.perf_counter()
    write_messages(lake, new, seed + 1, first_key=messages)
    report = run_workload(
        lake, NEW_FEATURE_MESSAGES, seed + 1, consumers=False, transactions=NEW_TRANSACTIONS, retries=False
    )
    commits = commit_offsets(lake)
    return {
        "bulk_messages": new,
        "feature_messages": report.messages,
        "transactions": dict(report.transactions),
        "offset_commits": commits,
        "seconds": round(time.perf_counter() - started, 2),
    }


def commit_offsets(lake: Path) -> int:
    """Let :data:`OFFSET_GROUP` commit the end of each of its queues (no pulls); the commits made."""
    brokers = start_brokers(lake, 2)
    try:
        consumer = PullConsumer(brokers, OFFSET_GROUP, client_id="127.0.0.10@workload", offset_dir=lake / "_clients")
        queues = consumer.queues("Orders")
        for queue in queues:
            consumer.update_offset(queue, consumer.brokers[queue.broker_name].max_offset(queue.topic, queue.queue_id))
        consumer.persist()
        for broker in brokers:
            broker.offsets.persist()
            broker.flush()
        return len(queues)
    finally:
        for broker in brokers:
            broker.shutdown()
