"""The broker command line's import-commitlog, export-commitlog, export-store and ingest-store
commands (see docs/jobs.md and docs/ingest.md)."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from broker_model.store import export_commitlog, import_commitlog, ingest_store
from broker_model.store.store_configs import ConfigCounts
from broker_model.store.store_export import export_store
from schemas.errors import ValidationError


def add_import_export_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``import-commitlog``, ``export-commitlog``, ``export-store`` and ``ingest-store``
    on ``subparsers``.

    Each sub-command sets ``func``: a callable taking the parsed namespace, printing a one-line
    summary and returning the exit code 0. Errors (``ValidationError``, ``CorruptRecordError``,
    ``BrokerLockedError``) propagate to the caller.
    """
    importer = _command(
        subparsers,
        "import-commitlog",
        "import a RocketMQ store's commitlog/ directory as a broker of the lake",
        "Import RocketMQ commit log files (4.9 or 5.x) byte-exactly as one broker's log; a broker started "
        "afterwards under that name continues it.",
        ("broker to import as (must have no records yet)", "src_dir", "directory of files named by base offsets"),
        run_import_command,
    )
    importer.add_argument("--store-host", default=None, help="store host to register (default: the first record's)")
    _command(
        subparsers,
        "export-commitlog",
        "write a broker's log as RocketMQ commit log files",
        "Write one file per segment, each exactly the broker's segment size, as RocketMQ lays it out.",
        ("broker to export", "out_dir", "new or empty directory for the files"),
        run_export_command,
    )
    _command(
        subparsers,
        "export-store",
        "write a broker of the lake as a RocketMQ store root (commitlog/, consumequeue/, config/)",
        "Write the broker's commit log files, the consume queue files of its own index, and RocketMQ's config "
        "files (consumerOffset.json, topics.json, subscriptionGroup.json, delayOffset.json).",
        ("broker to export", "out_dir", "new or empty directory: the store root"),
        run_export_store_command,
    )
    ingester = _command(
        subparsers,
        "ingest-store",
        "ingest what a RocketMQ broker's store gained since the last run, as a broker of the lake",
        "Append the records of a RocketMQ store's commit log after the last ingested offset (one commit; a rerun "
        "neither skips nor repeats a record), and what its config files changed. STORE_DIR is the broker's "
        "storePathRootDir.",
        ("the broker's name in the lake", "store_dir", "the store root: commitlog/, consumequeue/, config/"),
        run_ingest_command,
    )
    ingester.add_argument(
        "--follow", action="store_true", help="keep ingesting, one run per interval, until SIGTERM or SIGINT"
    )
    ingester.add_argument(
        "--interval", type=float, default=5.0, help="seconds between the runs of --follow (default 5)"
    )


def _command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str,
    arguments: tuple[str, str, str],
    func: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """A sub-command taking ``--lake``, ``--broker-name`` and one directory (``arguments``: the
    broker name's help, the directory's name and help), running ``func``."""
    broker_help, directory, directory_help = arguments
    parser = subparsers.add_parser(name, help=summary, description=description)
    parser.add_argument("--lake", type=Path, required=True, help="lake root directory")
    parser.add_argument("--broker-name", required=True, help=broker_help)
    parser.add_argument(directory, type=Path, help=directory_help)
    parser.set_defaults(func=func)
    return parser


def run_import_command(args: argparse.Namespace) -> int:
    """Run ``import-commitlog`` from parsed arguments; print the summary and return 0."""
    report = import_commitlog(args.lake, args.broker_name, args.src_dir, args.store_host)
    print(report.summary())
    return 0


def run_export_command(args: argparse.Namespace) -> int:
    """Run ``export-commitlog`` from parsed arguments; print the summary and return 0."""
    report = export_commitlog(args.lake, args.broker_name, args.out_dir)
    print(report.summary())
    return 0


def run_ingest_command(args: argparse.Namespace) -> int:
    """Run ``ingest-store`` from parsed arguments; print the summary and return 0. With
    ``--follow``, run again every ``--interval`` seconds, printing the runs that changed something,
    until SIGTERM or SIGINT: the run under way finishes, one last run takes what the store gained
    meanwhile, and the command returns 0. An error ends it as a single run's would.

    Raises:
        ValidationError: ``--interval`` not a positive number of seconds.
    """
    if not args.follow:
        print(ingest_store(args.lake, args.broker_name, args.store_dir).summary())
        return 0
    if not args.interval > 0:
        raise ValidationError("--interval", args.interval, "is not a positive number of seconds", "e.g. 5")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while True:
        stopping = stop.is_set()
        report = ingest_store(args.lake, args.broker_name, args.store_dir)
        if report.version is not None or report.configs != ConfigCounts():
            print(report.summary(), flush=True)
        if stopping:
            print(f"ingest-store {args.broker_name!r}: stopped, ingested up to offset {report.end}", flush=True)
            return 0
        stop.wait(args.interval)


def run_export_store_command(args: argparse.Namespace) -> int:
    """Run ``export-store`` from parsed arguments; print the summary and return 0."""
    print(export_store(args.lake, args.broker_name, args.out_dir).summary())
    return 0
