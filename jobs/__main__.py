"""Run a job: ``python -m jobs <job> [options]`` (also the ``spark-submit`` entry point).

Run as a program (``python -m jobs``, or as the driver script of ``spark-submit.sh``), the process
ends with the job's exit status (0 done, 1 failed, 2 bad input) after stopping the Spark session,
without finalizing the native libraries, which can abort an ending process
(:mod:`broker_model.cli_exit`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from broker_model.cli_exit import run_and_exit, run_command

JOBS = {
    "nightly": "jobs.nightly",
    "rebuild_consume_queue": "jobs.rebuild_consume_queue",
    "consumer_offsets": "jobs.consumer_offsets",
    "reset_offsets": "jobs.reset_offsets",
    "resolve_transactions": "jobs.resolve_transactions",
    "replay_ordered": "jobs.replay",
    "route_dlq": "jobs.dlq.job",
    "compact_commitlog": "jobs.compact_commitlog",
    "report": "jobs.report",
    "shell": "jobs.shell",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to ``<job>``'s ``main``: 0 done, 1 failed, 2 bad input (a clear one-line error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m jobs <job> [options]\njobs: " + ", ".join(sorted(JOBS)))
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in JOBS:
        print(f"error: job={name!r} is unknown; choose one of {sorted(JOBS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(JOBS[name])
    return run_command(lambda: int(module.main(rest)))


if __name__ == "__main__":
    from jobs.lake import stop_spark

    run_and_exit(main, cleanup=stop_spark)
