"""``reset_offsets``: move consumer groups' offsets (dry run unless ``--execute``).

Examples:
  python -m jobs reset_offsets --group cg-orders --topic Orders --to-datetime 2026-11-22T00:00:00Z
  python -m jobs reset_offsets --group cg-orders --topic Orders:0,1 --shift-by -100 --execute --reason "replay"
  python -m jobs reset_offsets --group cg-orders --all-topics --to-latest --export plan.csv
  python -m jobs reset_offsets --undo reset-1a2b3c4d5e6f --execute
  python -m jobs reset_offsets --group cg-orders --topic Orders --to-earliest --execute --broker-config /data/store

Time lookups follow RocketMQ: the first message stored at or after the time. Targets outside a
queue's [min, max] are clamped and the clamp is reported. Unlike the other jobs this tool needs no
Spark session: it reads the live commit log so that a reset acts on what is there now.

Consumers of the group should be stopped first: a running consumer commits its own offsets and
overwrites the reset (as with RocketMQ's client-side resets).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from broker_model.common import parse_duration, parse_instant
from broker_model.store.store_configs import write_store_offsets
from broker_model.store.store_ingest import broker_of_store
from broker_model.tools import (
    PLAN_COLUMNS,
    PlanRow,
    ResetTool,
    Strategy,
    TopicSelection,
    export_plan,
    plan_records,
    read_targets_file,
)
from jobs.cli import job_parser, text_table
from schemas.errors import ValidationError


@dataclass(frozen=True)
class ResetConfig:
    """Options of ``reset_offsets``."""

    lake: Path
    groups: tuple[str, ...]
    topics: tuple[TopicSelection, ...]
    all_topics: bool
    strategy: Strategy | None
    undo: str | None
    execute: bool
    export: Path | None
    reason: str | None
    broker_config: Path | None = None


def build_parser() -> argparse.ArgumentParser:
    """Options of ``reset_offsets``."""
    parser = job_parser("reset_offsets", __doc__, engine=False)
    parser.add_argument("--group", action="append", default=[], help="consumer group (repeatable)")
    parser.add_argument("--topic", action="append", default=[], help="TOPIC or TOPIC:0,1 (repeatable)")
    parser.add_argument("--all-topics", action="store_true", help="every topic the group has offsets on")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--to-earliest", action="store_true", help="the queue's min offset")
    target.add_argument("--to-latest", action="store_true", help="the queue's max offset (skip the backlog)")
    target.add_argument("--to-offset", type=int, help="this queue offset")
    target.add_argument("--shift-by", type=int, help="the current offset plus N (negative: re-read)")
    target.add_argument("--to-timestamp", help="first message stored at or after this epoch ms")
    target.add_argument("--to-datetime", help="first message stored at or after this ISO-8601 time (zone required)")
    target.add_argument("--by-duration", help="first message stored at or after now minus this ISO-8601 duration")
    target.add_argument("--from-file", help="CSV of broker_name,topic,queue_id,target_offset[,group]")
    target.add_argument("--undo", metavar="RESET_ID", help="put back the offsets an executed reset replaced")
    parser.add_argument("--execute", action="store_true", help="write the reset (default: dry run, nothing written)")
    parser.add_argument("--export", help="write the plan as CSV to this file")
    parser.add_argument("--reason", help="why the reset is made (kept in the audit rows)")
    parser.add_argument(
        "--broker-config",
        metavar="STORE_DIR",
        help="with --execute, also write the reset into the consumerOffset.json of the stopped RocketMQ broker "
        "this store root belongs to (ingested with ingest-store), keeping a .bak copy as the broker does",
    )
    return parser


def config_from_args(args: argparse.Namespace, now: int) -> ResetConfig:
    """Validate the options into a config (raises ValidationError naming the option)."""
    strategy = None
    if args.to_earliest:
        strategy = Strategy("to_earliest")
    elif args.to_latest:
        strategy = Strategy("to_latest")
    elif args.to_offset is not None:
        strategy = Strategy("to_offset", args.to_offset)
    elif args.shift_by is not None:
        strategy = Strategy("shift_by", args.shift_by)
    elif args.to_timestamp is not None:
        strategy = Strategy("to_timestamp", parse_instant(args.to_timestamp, "to_timestamp"))
    elif args.to_datetime is not None:
        strategy = Strategy("to_datetime", parse_instant(args.to_datetime, "to_datetime"))
    elif args.by_duration is not None:
        strategy = Strategy("by_duration", now - parse_duration(args.by_duration, "by_duration"))
    elif args.from_file is not None:
        strategy = Strategy("from_file", file_targets=read_targets_file(args.from_file))
    return ResetConfig(
        Path(args.lake),
        tuple(args.group),
        tuple(TopicSelection.parse(t) for t in args.topic),
        args.all_topics,
        strategy,
        args.undo,
        args.execute,
        Path(args.export) if args.export else None,
        args.reason,
        Path(args.broker_config) if args.broker_config else None,
    )


def run(config: ResetConfig) -> list[PlanRow]:
    """Plan (and with ``execute``, write) the reset; print the plan; return it."""
    tool = ResetTool(config.lake)
    reason: str | None
    if config.undo is not None:
        plan = tool.undo_plan(config.undo)
        reason = config.reason or f"undo of {config.undo}"
    else:
        if not config.groups:
            raise ValidationError("group", None, "no group chosen", "give --group GROUP")
        if config.strategy is None:
            raise ValidationError("strategy", None, "no target chosen", "give one of --to-earliest, --to-latest, ...")
        plan = tool.plan(config.groups, config.topics, config.all_topics, config.strategy)
        reason = config.reason
    _print_plan(plan)
    if config.export is not None:
        export_plan(plan, config.export)
        print(f"plan written to {config.export}")
    if not any(row.moves for row in plan):
        print("nothing to move: every offset is already at its target")
    elif config.execute:
        if config.broker_config is not None:
            _write_back(config.lake, config.broker_config, plan)
        reset_id = tool.execute(plan, reason)
        print(
            f"executed reset {reset_id}: {sum(r.moves for r in plan)} queue(s) moved"
            f" (undo with --undo {reset_id} --execute)"
        )
    else:
        print("dry run: nothing written (add --execute to apply)")
    return plan


def _write_back(lake: Path, store_dir: Path, plan: Sequence[PlanRow]) -> None:
    """Write the plan's moves of the store's broker into its ``consumerOffset.json`` (before the
    lake: a failed lake commit leaves a file a rerun writes again with the same offsets).

    Raises:
        ValidationError: no broker of the lake was ingested from ``store_dir``, or its broker runs.
    """
    broker_name = broker_of_store(lake, store_dir)
    if broker_name is None:
        raise ValidationError(
            "--broker-config",
            str(store_dir),
            "no broker of the lake was ingested from this store",
            "give the store root an ingest-store run read (see store_ingests)",
        )
    moves = {(r.group, r.topic, r.queue_id): r.target for r in plan if r.moves and r.broker_name == broker_name}
    if not moves:
        print(f"no offset of broker {broker_name} moves: {store_dir} left as it is")
        return
    path = write_store_offsets(store_dir, moves)
    print(f"wrote {len(moves)} offset(s) of broker {broker_name} into {path} (the previous file kept as .bak)")


def _print_plan(plan: Sequence[PlanRow]) -> None:
    records = [tuple(str(v) for v in record) for record in plan_records(plan)]
    for line in text_table([PLAN_COLUMNS, *records]):
        print(line)
    print(
        f"total: {sum(r.redelivered for r in plan)} message(s) delivered again, {sum(r.skipped for r in plan)} skipped"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv`` and run."""
    args = build_parser().parse_args(argv)
    run(config_from_args(args, time.time_ns() // 1_000_000))
    return 0


if __name__ == "__main__":  # python -m jobs.reset_offsets: the same as python -m jobs reset_offsets
    from broker_model.cli_exit import run_and_exit, run_command

    run_and_exit(lambda: run_command(lambda: main(sys.argv[1:])))
