"""What every job's command line shares: the common options (``--lake``, ``--engine``, ``--as-of``),
one ``main`` wrapper that builds the session, runs the job and prints its status line, the text
table printer, and how times and durations are written for people.

Exit codes are decided in ``jobs/__main__.py``: 0 done, 1 failed, 2 bad input (see docs/jobs.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Protocol, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pyspark.sql import SparkSession

from broker_model.common import default_lake, parse_instant
from jobs.lake import ENGINES, build_session
from jobs.runs import JobRun
from schemas.errors import ValidationError


class SparkJobConfig(Protocol):
    """What :func:`run_spark_job` reads of a job's config."""

    @property
    def engine(self) -> str: ...


ConfigT = TypeVar("ConfigT", bound=SparkJobConfig)


def job_parser(job: str, description: str | None, engine: bool = True) -> argparse.ArgumentParser:
    """An argument parser for ``job`` with the options every job takes: ``--lake``, and ``--engine``
    unless the job runs without Spark (``engine=False``)."""
    parser = argparse.ArgumentParser(
        prog=job, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lake", default=str(default_lake()), help="lake root (default: $RMQ_LAKE or data/lake)")
    if engine:
        parser.add_argument(
            "--engine",
            choices=list(ENGINES),
            default="auto",
            help="lake engine (auto: delta-spark when its classes load, else the bridge)",
        )
    return parser


def add_as_of(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    """Add ``--as-of``, the time T a job computes its state at (read with :func:`as_of_of`)."""
    parser.add_argument(
        "--as-of",
        help=help_text or "time T: epoch ms or ISO-8601 with a zone, e.g. 2026-11-22T02:00:00Z (default: now)",
    )


def add_driver_limit(parser: argparse.ArgumentParser, option: str, default: int, what: str) -> None:
    """Add ``option``: up to how many ``what`` a job computes from the whole inputs on the driver
    (one process, no Spark job), above with Spark; 0 always with Spark."""
    parser.add_argument(
        option,
        type=int,
        default=default,
        help=f"compute from the whole inputs on the driver up to this many {what}, above with Spark; "
        f"0: always with Spark (default {default})",
    )


def non_negative_int(text: str) -> int:
    """An argparse ``type``: an integer 0 or more (argparse names the option and exits 2 otherwise)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return value


def as_of_of(text: str | None) -> int:
    """The epoch ms of an ``--as-of`` value, the current time when it is None.

    Raises:
        ValidationError: neither epoch ms nor ISO-8601 with a zone.
    """
    return parse_instant(text, "--as-of") if text is not None else time.time_ns() // 1_000_000


def run_spark_job(job: str, config: ConfigT, run: Callable[[SparkSession, ConfigT], JobRun]) -> JobRun:
    """Build the job's session on ``config.engine``, run it and print its status line."""
    spark = build_session(f"rmq-{job}", engine=config.engine)
    job_run = run(spark, config)
    print(f"{job} {job_run.status} in {job_run.duration_ms} ms (run {job_run.run_id})")
    return job_run


def text_table(lines: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as left-aligned text columns two spaces apart (trailing spaces dropped)."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]


def iso_utc(epoch_ms: int) -> str:
    """``epoch_ms`` as UTC ISO-8601 with milliseconds, e.g. ``2023-11-14T22:13:20.000Z``."""
    return iso_in_zone(epoch_ms, "UTC")


def iso_in_zone(epoch_ms: int, zone: str) -> str:
    """``epoch_ms`` as ISO-8601 with milliseconds in the time zone ``zone`` (an IANA name, as
    Spark's ``spark.sql.session.timeZone`` takes, or a fixed offset such as ``+08:00``): with its
    offset, ``Z`` for UTC, e.g. ``2023-11-15T06:13:20.000+08:00``.

    Raises:
        ValidationError: ``zone`` is neither a time zone name nor an offset.
    """
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=_zone(zone))
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _zone(zone: str) -> tzinfo:
    if zone.upper() in ("UTC", "Z", "GMT", "ETC/UTC"):
        return UTC
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        pass
    try:
        return datetime.strptime(zone, "%z").tzinfo or UTC
    except ValueError:
        raise ValidationError(
            "time zone", zone, "is neither a time zone name nor an offset", "use e.g. Europe/Berlin or +08:00"
        ) from None


def format_age(millis: int) -> str:
    """A duration for people: ``1d 2h 3m 4.005s`` with zero parts left out, ``-`` sign kept."""
    sign, rest = ("-", -millis) if millis < 0 else ("", millis)
    days, rest = divmod(rest, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest // 1000}.{rest % 1000:03d}s" if rest % 1000 else f"{rest // 1000}s"
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    parts.append(seconds if rest or not any(parts) else "")
    return sign + " ".join(part for part in parts if part)
