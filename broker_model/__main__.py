"""Command line of the broker: ``python -m broker_model <command> --help``.

The process ends with the command's exit status (0 done, 1 failed, 2 bad input), without finalizing
the native libraries, which can abort an ending process (:mod:`broker_model.cli_exit`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from broker_model.cli_exit import run_and_exit, run_command
from broker_model.common import default_lake
from broker_model.tools import add_import_export_commands
from broker_model.tools.admin import add_admin_commands


def _workload(args: argparse.Namespace) -> int:
    from broker_model.tools import run_workload

    report = run_workload(
        Path(args.lake),
        args.messages,
        args.seed,
        brokers=args.brokers,
        threads=args.threads,
        segment_size=args.segment_size,
        flush_mode=args.flush_mode,
        transactions=args.transactions,
        retries=args.retries,
    )
    print(f"workload seed {args.seed} into {args.lake}: {report.summary()}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from broker_model.endpoint import EndpointConfig, serve

    config = EndpointConfig(
        Path(args.lake),
        tuple(name.strip() for name in args.brokers.split(",") if name.strip()),
        args.listen,
        args.flush_mode,
        args.auto_create_topics,
        check_interval_ms=args.transaction_check_interval_ms,
        check_timeout_ms=args.transaction_timeout_ms,
        check_max=args.transaction_check_max,
        acl=Path(args.acl) if args.acl else None,
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
        min_invisible_ms=args.min_invisible_ms,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def ready(address: str) -> None:
        print(f"serving brokers {', '.join(config.brokers)} of {config.lake} on {address}", flush=True)

    serve(config, stop, ready)
    try:
        print("stopped: the brokers flushed and released their names", flush=True)
    except BrokenPipeError:  # whoever read the output is gone; the stop itself is done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every broker command."""
    parser = argparse.ArgumentParser(prog="python -m broker_model", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    workload = commands.add_parser("workload", help="write a seeded, realistic workload through real brokers")
    workload.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    workload.add_argument("--messages", type=int, required=True, help="number of messages to write")
    workload.add_argument("--seed", type=int, default=1, help="seed of the plan: same seed, same messages")
    workload.add_argument("--brokers", type=int, default=2, help="number of brokers (broker-a, broker-b, ...)")
    workload.add_argument("--threads", type=int, default=4, help="producer threads")
    workload.add_argument("--segment-size", type=int, default=None, help="commit log segment size in bytes")
    workload.add_argument("--flush-mode", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], default="ASYNC_FLUSH")
    workload.add_argument(
        "--transactions", type=int, default=0, help="transactional sends with random outcomes, then check rounds"
    )
    workload.add_argument(
        "--retries",
        action="store_true",
        help="push consumer groups with failing listeners: retries, delays and dead letters on a simulated clock",
    )
    workload.set_defaults(func=_workload)
    server = commands.add_parser(
        "serve", help="serve brokers of the lake to RocketMQ 5 clients over gRPC (MessagingService)"
    )
    server.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    server.add_argument("--brokers", default="broker-a", help="comma-separated broker names (default broker-a)")
    server.add_argument("--listen", default="127.0.0.1:8081", help="host:port to listen on (default 127.0.0.1:8081)")
    server.add_argument("--flush-mode", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], default="ASYNC_FLUSH")
    server.add_argument(
        "--auto-create-topics", action="store_true", help="create an unknown topic on every broker at first use"
    )
    server.add_argument(
        "--transaction-check-interval-ms", type=int, default=60_000, help="transaction check rounds (default 60000)"
    )
    server.add_argument(
        "--transaction-timeout-ms", type=int, default=6_000, help="half messages younger are not checked (default 6000)"
    )
    server.add_argument(
        "--transaction-check-max", type=int, default=15, help="checks before a half message is discarded (default 15)"
    )
    server.add_argument("--acl", default=None, help="JSON file of accounts: requests must then be signed")
    server.add_argument("--tls-cert", default=None, help="PEM certificate chain: serve TLS (with --tls-key)")
    server.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    server.add_argument(
        "--min-invisible-ms",
        type=int,
        default=10_000,
        help="the shortest invisible time a consumer's receive may ask for (default 10000)",
    )
    server.set_defaults(func=_serve)
    add_import_export_commands(commands)
    add_admin_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one broker command: 0 done, 1 failed, 2 bad input (a clear one-line error)."""
    args = build_parser().parse_args(argv)
    return run_command(lambda: int(args.func(args)))


if __name__ == "__main__":
    run_and_exit(main)
