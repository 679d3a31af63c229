"""``python -m jobs shell``: the ``pyspark`` shell on the lake, as Delta users know it.

One command opens an interactive Python shell with ``spark`` (Delta configured: its extension and
catalog, and the Delta jar of the installed ``delta-spark`` fetched by Ivy on first use), every
existing table of the lake registered by name in the database ``rmq`` (``spark.sql("SELECT ...
FROM rmq.dlq")``, and ``spark.read.format("delta").load(path)`` works as anywhere), and the
helpers imported: ``dlq`` (:mod:`jobs.dlq`) and ``lake`` (a :class:`~jobs.lake.Lake` on the lake
root, on the chosen engine). The session's time zone (``--time-zone``, UTC by default) is the one
the helpers print times in.

With ``--execute FILE`` it runs that file in the shell's namespace instead of reading commands
from the terminal (what a test or a script does).
"""

from __future__ import annotations

import argparse
import code
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from broker_model.common import default_lake
from broker_model.store import latest_version
from jobs import dlq
from jobs.cli import iso_in_zone
from jobs.lake import DELTA_CONF, ENGINES, Lake, build_session, with_delta_jars
from schemas.catalog import TABLES
from schemas.errors import ValidationError

DATABASE = "rmq"  # the database the lake's tables are registered in


def register_lake(spark: SparkSession, lake_root: Path, database: str = DATABASE) -> list[str]:
    """Register every catalog table of ``lake_root`` that exists as ``<database>.<table>`` (an
    external Delta table at its path, in the session's catalog); the names registered, sorted."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
    registered = []
    for spec in sorted(TABLES.values(), key=lambda s: s.name):
        location = spec.location(lake_root)
        if latest_version(location) < 0:
            continue
        path = str(location.resolve()).replace("'", "\\'")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {database}.{spec.name} USING DELTA LOCATION '{path}'")
        registered.append(spec.name)
    return registered


def build_parser() -> argparse.ArgumentParser:
    """Options of ``shell``."""
    parser = argparse.ArgumentParser(
        prog="shell", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    parser.add_argument(
        "--engine",
        default="delta-spark",
        choices=[e for e in ENGINES if e != "auto"],
        help="the engine of the helpers' Lake (default delta-spark; Delta is configured either way)",
    )
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--time-zone", default="UTC", help="the session's time zone, e.g. Europe/Berlin (default UTC)")
    parser.add_argument("--execute", type=Path, help="run this Python file in the shell instead of reading commands")
    return parser


def start(lake_root: Path, engine: str, master: str, time_zone: str) -> dict[str, Any]:
    """The shell's namespace: the session (Delta configured), the lake's tables registered, the helpers.

    Raises:
        ValidationError: ``lake_root`` is not a directory, or ``time_zone`` is no time zone
            (checked before Spark starts).
    """
    if not lake_root.is_dir():
        raise ValidationError("lake", str(lake_root), "is not a directory", "pass the lake root with --lake")
    iso_in_zone(0, time_zone)  # the zone the helpers print in: refused here, not at the first print
    conf = {
        **with_delta_jars(DELTA_CONF),  # Delta's classes whatever the engine: the shell's spark.read.format("delta")
        "spark.sql.session.timeZone": time_zone,
        "spark.sql.warehouse.dir": str((lake_root / "_locks" / "shell-warehouse").resolve()),
        "spark.ui.showConsoleProgress": "false",
    }
    spark = build_session("rmq-lake shell", master=master, engine=engine, extra_conf=conf)
    registered = register_lake(spark, lake_root)
    print(f"rmq-lake shell on {lake_root} (engine {engine}, time zone {time_zone}), Spark {spark.version}")
    print(f"tables in database {DATABASE}: {', '.join(registered) or 'none yet'}")
    print(
        "helpers: dlq (load, summary, show, redrive), lake (jobs.lake.Lake); spark.sql(...), spark.read.format('delta')"
    )
    return {"spark": spark, "dlq": dlq, "lake": Lake(spark, lake_root, engine), "lake_root": lake_root}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: open the shell (or run ``--execute``); 0 when it ends."""
    args = build_parser().parse_args(argv)
    namespace = start(Path(args.lake), args.engine, args.master, args.time_zone)
    if args.execute is not None:
        source = args.execute.read_text(encoding="utf-8")
        exec(compile(source, str(args.execute), "exec"), namespace)
        return 0
    try:
        import readline  # noqa: F401  line editing and history in the prompt, as in pyspark's shell
    except ImportError:  # Python built without it: the prompt still works, without editing
        pass
    code.interact(banner="", local=namespace, exitmsg="")
    sys.stdout.flush()
    return 0
