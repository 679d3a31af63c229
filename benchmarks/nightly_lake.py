"""The lake of ``benchmarks/run_all.py`` in one of two shapes (:data:`SHAPES`), on an empty lake
(:func:`write_lake`), or written once for both engines with what it holds beside it
(:func:`write_source`) and copied for each (:func:`copy_lake`); and the increment written into it
before the incremental runs (:func:`append_increment`). Written alone, to run on copies later:

    python benchmarks/nightly_lake.py DIR --messages N [--shape benchmark|users] [--seed 1]

then ``python benchmarks/run_all.py --lake DIR`` (once per lake: several give the growth over them).

- ``benchmark``: the feature traffic (the nightly demo's workload), then ``messages`` bulk messages
  sent in batches of 1,000 through two brokers;
- ``users``: ``messages`` messages of the workload's whole mix through three brokers, as a user's
  lake grows (``python -m broker_model workload --brokers 3 --transactions N --retries``): ordered,
  batched and delayed sends, consumer groups pulling and committing their offsets many times, 3
  transactions per 1,000 messages with their check-backs, and push consumers failing into retries
  and dead letters. Its increment is the same mix, 1 % of the size, with its consumers committing
  again and no new retries.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from consume_queue import write_messages
from deltalake import DeltaTable

from broker_model.client import PullConsumer
from broker_model.tools import run_workload, start_brokers

FEATURE_MESSAGES = 20_000  # the nightly demo's size: its retry phase grows with it, not with the bulk
TRANSACTIONS = 2_000  # fixed, not a share of the bulk: each costs Python round trips and check-backs
NEW_FEATURE_MESSAGES = 1_000  # the plan mix (ordered, delayed, batches) around the new transactions
NEW_TRANSACTIONS = 200
OFFSET_GROUP = "cg-orders"  # the group that commits once more per queue before the incremental runs
LAKE_FACTS = "lake.json"  # beside a lake written once for both engines: what write_lake wrote, and the seed
SHAPES = ("benchmark", "users")
USERS_BROKERS = 3
USERS_TRANSACTIONS_PER_MILLE = 3  # transactions per 1,000 messages of the users' shape


def segment_size(messages: int) -> int:
    """Commit log segment bytes for a bulk of ``messages``: 32 bytes per message (about a tenth of a
    record, so each broker seals about five segments), between 1 MiB and 64 MiB."""
    return max(1 << 20, min(64 << 20, messages * 32))


def users_transactions(messages: int) -> int:
    """Transactions of a users'-shape lake of ``messages`` messages."""
    return max(1, messages * USERS_TRANSACTIONS_PER_MILLE // 1000)


def write_lake(lake: Path, messages: int, seed: int, shape: str = "benchmark") -> dict[str, Any]:
    """The lake of ``shape`` (the module's docstring); what was written and how long it took."""
    if shape == "users":
        return _write_users_lake(lake, messages, seed)
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
        "shape": "benchmark",
        "brokers": 2,
        "transactions_sent": TRANSACTIONS,
        "feature_messages": report.messages,
        "feature_seconds": round(feature_seconds, 2),
        "consumed": dict(report.consumed),
        "transactions": dict(report.transactions),
        "retries": dict(report.retries),
        "bulk_messages": messages,
        "bulk_seconds": round(bulk_seconds, 2),
        "segment_size": segment_size(messages),
    }


def _write_users_lake(lake: Path, messages: int, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    transactions = users_transactions(messages)
    report = run_workload(
        lake,
        messages,
        seed,
        brokers=USERS_BROKERS,
        segment_size=segment_size(messages),
        consumers=True,
        transactions=transactions,
        retries=True,
    )
    return {
        "shape": "users",
        "brokers": USERS_BROKERS,
        "transactions_sent": transactions,
        "feature_messages": report.messages,
        "feature_seconds": round(time.perf_counter() - started, 2),
        "consumed": dict(report.consumed),
        "transactions": dict(report.transactions),
        "retries": dict(report.retries),
        "bulk_messages": 0,
        "bulk_seconds": 0.0,
        "segment_size": segment_size(messages),
        "offset_commit_rows": offset_commit_rows(lake),
        "workload_seconds": report.seconds,
    }


def offset_commit_rows(lake: Path) -> int:
    """Rows of the lake's ``consumer_offset_commits`` (0 when it has none)."""
    path = lake / "consumer_offset_commits"
    return DeltaTable(str(path)).count() if DeltaTable.is_deltatable(str(path)) else 0


def describe(messages: int, written: dict[str, Any], increment: dict[str, Any]) -> str:
    """One line on what the lake and its increment hold."""
    if written.get("shape", "benchmark") == "users":
        return (
            f"users' shape: {written['feature_messages']:,} messages through {written['brokers']} brokers, "
            f"{written['transactions_sent']:,} transactions, retries and dead letters, "
            f"{written['offset_commit_rows']:,} offset commits; increment {increment['feature_messages']:,} messages, "
            f"{increment['transactions_sent']:,} transactions, {increment['offset_commits']:,} offset commits"
        )
    return (
        f"{messages:,} bulk + {written['feature_messages']:,} feature messages, {TRANSACTIONS:,} transactions, "
        f"segments of {written['segment_size'] >> 20} MiB; increment {increment['bulk_messages']:,} + "
        f"{increment['feature_messages']:,} messages, {NEW_TRANSACTIONS} transactions, "
        f"{increment['offset_commits']} offset commits"
    )


def write_source(source: Path, messages: int, seed: int, shape: str = "benchmark") -> dict[str, Any]:
    """Write the lake once, into ``source/lake`` (:func:`write_lake`), and what it holds (with
    ``seed``) into ``source/lake.json``, for runs on copies of it (:func:`copy_lake`); what it holds."""
    what = f"{FEATURE_MESSAGES:,} feature messages, then {messages:,} bulk messages"
    if shape == "users":
        what = f"{messages:,} messages in the users' shape"
    print(f"writing the lake once: {what}", flush=True)
    shutil.rmtree(source / "lake", ignore_errors=True)  # a kept work directory's earlier lake, whole or not
    (source / LAKE_FACTS).unlink(missing_ok=True)
    written = {**write_lake(source / "lake", messages, seed, shape), "seed": seed}
    (source / LAKE_FACTS).write_text(json.dumps(written, indent=2))
    print(f"lake written: {json.dumps(written)}", flush=True)
    return written


def read_lake_facts(source: Path) -> dict[str, Any]:
    """What the lake in ``source`` holds, as :func:`write_source` wrote it."""
    facts: dict[str, Any] = json.loads((source / LAKE_FACTS).read_text())
    return facts


def lake_size(facts: dict[str, Any]) -> int:
    """The messages a kept lake was written with (:func:`read_lake_facts`): its bulk, or in the users'
    shape its whole mix."""
    key = "feature_messages" if facts.get("shape", "benchmark") == "users" else "bulk_messages"
    return int(facts[key])


def copy_lake(source: Path, lake: Path) -> dict[str, Any]:
    """Replace ``lake`` with a copy of the lake :func:`write_source` wrote in ``source``; what it holds."""
    started = time.perf_counter()
    shutil.rmtree(lake, ignore_errors=True)
    shutil.copytree(source / "lake", lake, symlinks=True)
    written = read_lake_facts(source)
    print(
        f"lake copied from {source / 'lake'} in {time.perf_counter() - started:.1f} s ({written['bulk_messages']:,} "
        f"bulk + {written['feature_messages']:,} feature messages, {written.get('shape', 'benchmark')} shape, "
        f"seed {written['seed']}; {source / LAKE_FACTS})",
        flush=True,
    )
    return written


def append_increment(lake: Path, messages: int, seed: int, shape: str = "benchmark") -> dict[str, Any]:
    """The increment of ``shape`` (the module's docstring): for the benchmark's, 1 % more bulk
    messages, new transactions (with check rounds) and one offset commit per queue of
    :data:`OFFSET_GROUP`; what was written."""
    new = max(1, messages // 100)
    started = time.perf_counter()
    if shape == "users":
        before = offset_commit_rows(lake)
        transactions = users_transactions(new)
        report = run_workload(
            lake, new, seed + 1, brokers=USERS_BROKERS, consumers=True, transactions=transactions, retries=False
        )
        return {
            "bulk_messages": 0,
            "feature_messages": report.messages,
            "transactions_sent": transactions,
            "transactions": dict(report.transactions),
            "offset_commits": offset_commit_rows(lake) - before,
            "seconds": round(time.perf_counter() - started, 2),
            "workload_seconds": report.seconds,
        }
    write_messages(lake, new, seed + 1, first_key=messages)
    report = run_workload(
        lake, NEW_FEATURE_MESSAGES, seed + 1, consumers=False, transactions=NEW_TRANSACTIONS, retries=False
    )
    commits = commit_offsets(lake)
    return {
        "transactions_sent": NEW_TRANSACTIONS,
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


def main(argv: Sequence[str] | None = None) -> int:
    """Write a lake once, to run ``run_all.py --lake DIR`` on copies of it later."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dir", type=Path, help="where the lake (DIR/lake) and what it holds (DIR/lake.json) go")
    parser.add_argument("--messages", type=int, required=True, help="bulk messages, or the users' shape's whole mix")
    parser.add_argument("--shape", choices=SHAPES, default="benchmark")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.messages <= 0:
        parser.error(f"--messages {args.messages}: give a positive number of messages")
    write_source(args.dir.resolve(), args.messages, args.seed, args.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
