"""What ``benchmarks/run_all.py`` measures, shared by the modules that run and print it: the jobs
and the lake engines, a row of its table (:class:`Measured`), the machine, and how every job's
seconds grow with the lake (``--sizes``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ENGINES = ("bridge", "delta-spark")  # the lake engines (jobs.lake.build_session); --engine both runs each
JOBS = ("compact_commitlog", "rebuild_consume_queue", "consumer_offsets", "resolve_transactions", "route_dlq", "report")


@dataclass
class Measured:
    """One row of the table."""

    job: str
    mode: str
    seconds: float
    floor: float | None = None
    peer: float | None = None
    notes: str = ""
    status: str = ""
    message: str = ""  # the job's job_runs message
    row_counts: dict[str, int] | None = None
    stages: list[dict[str, Any]] | None = None
    spark_seconds: float | None = None
    peer_same: bool | None = None  # None: no peer
    peer_report: list[str] = field(default_factory=list)  # every table compared, examples of differences
    writes: list[str] = field(default_factory=list)  # tables whose Delta version the run moved (job_runs aside)
    floor_lacks: list[str] = field(default_factory=list)  # of those, tables its floor did not write
    samples: list[float] = field(default_factory=list)  # every timed run's seconds, when there were several
    floor_samples: list[float] = field(default_factory=list)  # and its floor's
    group: str = ""  # the Spark job group its run's stages ran in

    @property
    def failed(self) -> bool:
        """Whether the row's ratios cannot be trusted: its peer computed something else, or its
        floor left out a table the job writes."""
        return self.peer_same is False or bool(self.floor_lacks)


def machine() -> dict[str, Any]:
    """Cores, memory and load of this machine."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cores": os.cpu_count() or 1,
        "memory_gib": round(memory / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def fmt(value: float | None, spec: str = ".1f") -> str:
    """A cell of a table: ``value`` formatted by ``spec``, ``-`` for None."""
    return "-" if value is None else format(value, spec)


def growth_rows(measured: dict[int, list[Measured]]) -> list[dict[str, Any]]:
    """Per (job, mode) measured at every size (a ``full after`` row is not): the seconds at each
    size and the exponent of the power-law fit, and that of its floor's seconds when it has a floor
    at every size (a job reading files that grow faster than the messages grows as they do)."""
    sizes = sorted(measured)
    rows = []
    for job, mode in ((r.job, r.mode) for r in measured[sizes[0]]):
        found = [[r for r in measured[n] if (r.job, r.mode) == (job, mode)] for n in sizes]
        if not all(found):
            continue
        seconds = [at_size[0].seconds for at_size in found]
        floors = [at_size[0].floor for at_size in found]
        known = [f for f in floors if f]
        rows.append(
            {
                "job": job,
                "mode": mode,
                "seconds": seconds,
                "exponent": fit_exponent(sizes, seconds),
                "floor_exponent": fit_exponent(sizes, known) if len(known) == len(sizes) else None,
            }
        )
    return rows


def fit_exponent(sizes: Sequence[int], seconds: Sequence[float]) -> float:
    """The slope of the least-squares line through (log size, log seconds)."""
    xs = [math.log(n) for n in sizes]
    ys = [math.log(max(t, 1e-3)) for t in seconds]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def print_growth(growth: Sequence[dict[str, Any]], sizes: Sequence[int], engine: str) -> None:
    """Seconds per size and the fitted exponent of every job and mode on ``engine``."""
    header = f"{'job':<22}{'mode':<12}" + "".join(f"{n:>12,}" for n in sizes) + f"{'exponent':>10}{'floor':>8}"
    print(
        f"\ngrowth over {', '.join(f'{n:,}' for n in sizes)} messages (the bulk, or the users' shape's "
        f"whole mix), engine {engine} (seconds)"
    )
    print(header)
    print("-" * len(header))
    for row in growth:
        floor = row.get("floor_exponent")
        flag = "  above linear" if row["exponent"] > 1.1 else ""
        if flag and floor is not None:
            flag += ", as its floor" if row["exponent"] <= floor + 0.1 else ", above its floor"
        cells = "".join(f"{t:>12.1f}" for t in row["seconds"])
        print(f"{row['job']:<22}{row['mode']:<12}{cells}{row['exponent']:>10.2f}{fmt(floor, '.2f'):>8}{flag}")
