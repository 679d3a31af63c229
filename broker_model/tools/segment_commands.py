"""The broker command line's import-commitlog, export-commitlog and ingest-store commands (see
docs/jobs.md and docs/ingest.md)."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from broker_model.store import export_commitlog, import_commitlog, ingest_store
from broker_model.store.store_configs import ConfigCounts
from schemas.errors import ValidationError


def add_import_export_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``import-commitlog`` and ``export-commitlog`` on ``subparsers``.

    Each sub-command sets ``func``: a callable taking the parsed namespace, printing a one-line
    summary and returning the exit code 0. Errors (``ValidationError``, ``CorruptRecordError``,
    ``BrokerLockedError``) propagate to the caller.
    """
    importer = subparsers.add_parser(
        "import-commitlog",
        help="import a RocketMQ store's commitlog/ directory as a broker of the lake",
        description="Import RocketMQ commit log files (4.9 or 5.x) byte-exactly as one broker's log; "
        "a broker started afterwards under that name continues it.",
    )
    importer.add_argument("--lake", type=Path, required=True, help="lake root directory")
    importer.add_argument("--broker-name", required=True, help="broker to import as (must have no records yet)")
    importer.add_argument("--store-host", default=None, help="store host to register (default: the first record's)")
    importer.add_argument("src_dir", type=Path, help="directory of files named by 20-digit base offsets")
    importer.set_defaults(func=run_import_command)
    exporter = subparsers.add_parser(
        "export-commitlog",
        help="write a broker's log as RocketMQ commit log files",
        description="Write one file per segment, each exactly the broker's segment size, as RocketMQ lays it out.",
    )
    exporter.add_argument("--lake", type=Path, required=True, help="lake root directory")
    exporter.add_argument("--broker-name", required=True, help="broker to export")
    exporter.add_argument("out_dir", type=Path, help="new or empty directory for the files")
    exporter.set_defaults(func=run_export_command)
    ingester = subparsers.add_parser(
        "ingest-store",
        help="ingest what a RocketMQ broker's store gained since the last run, as a broker of the lake",
        description="Append the records of a RocketMQ store's commit log after the last ingested offset "
        "(one commit; a rerun neither skips nor repeats a record). STORE_DIR is the broker's storePathRootDir.",
    )
    ingester.add_argument("--lake", type=Path, required=True, help="lake root directory")
    ingester.add_argument("--broker-name", required=True, help="the broker's name in the lake")
    ingester.add_argument("store_dir", type=Path, help="the store root: commitlog/, consumequeue/, config/")
    ingester.add_argument(
        "--follow", action="store_true", help="keep ingesting, one run per interval, until SIGTERM or SIGINT"
    )
    ingester.add_argument(
        "--interval", type=float, default=5.0, help="seconds between the runs of --follow (default 5)"
    )
    ingester.set_defaults(func=run_ingest_command)


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
