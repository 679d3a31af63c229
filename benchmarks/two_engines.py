"""``benchmarks/run_all.py --engine both``: the lake written once, then each engine's run in a child
process of its own (a process holds one Spark session) on a copy of it, then one table with both
engines side by side; with ``--sizes``, the same per size, then each engine's growth.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from measured import ENGINES, JOBS, Measured, fmt, growth_rows, machine, print_growth
from nightly_lake import describe, read_lake_facts, write_source

RUN_ALL = Path(__file__).resolve().with_name("run_all.py")  # the script each engine runs, in a process of its own


def run_engine(engine: str, source: Path, seed: int, root: Path, json_path: Path, perturb: str | None) -> int:
    """``benchmarks/run_all.py`` on ``engine`` alone, in a child process (a process holds one Spark
    session, and its JVM keeps the jars it started with), on a copy of the lake in ``source``; its
    work directory ``root`` is kept (the caller discards it), its figures go to ``json_path``. Its
    exit status."""
    command = [sys.executable, str(RUN_ALL), "--engine", engine, "--lake", str(source)]
    command += ["--seed", str(seed), "--keep", str(root), "--json", str(json_path)]
    if perturb is not None:
        command += ["--perturb-peer", perturb]
    return subprocess.run(command, check=False).returncode


def both(
    root: Path,
    messages: int,
    seed: int,
    json_path: Path,
    perturb: str | None,
    source: Path | None,
    shape: str = "benchmark",
) -> tuple[int, dict[str, list[Measured]]]:
    """The lake written once into ``root/source`` (unless ``source`` holds one), then each engine in
    a child process on a copy of it (:func:`run_engine`), one after the other; then the table side
    by side, and both engines' figures in ``json_path``. The exit status (:func:`both_exit_status`)
    and each engine's rows (an engine whose run wrote no figures is left out)."""
    if source is None:
        source = root / "source"
        write_source(source, messages, seed, shape)
    figures: dict[str, dict[str, Any]] = {}
    statuses: dict[str, int] = {}
    for engine in ENGINES:
        engine_json = json_path.with_suffix(f".{engine}.json")
        engine_json.unlink(missing_ok=True)  # a kept work directory may hold an earlier run's
        print(f"\n=== engine {engine}, in a process of its own, on a copy of {source / 'lake'} ===", flush=True)
        statuses[engine] = run_engine(engine, source, seed, root / engine, engine_json, perturb)
        if engine_json.is_file():
            figures[engine] = json.loads(engine_json.read_text())
    measured = {engine: [Measured(**row) for row in f["rows"]] for engine, f in figures.items()}
    table = side_by_side(measured) if len(measured) == len(ENGINES) else None
    if table is not None:
        print_side_by_side(table, messages, figures)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    combined = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "messages": messages,
        "machine": machine(),
        "lake": read_lake_facts(source),
        "exit_statuses": statuses,
        "side_by_side": table,
        "engines": figures,
    }
    json_path.write_text(json.dumps(combined, indent=2, default=str))
    print(f"\nfigures of both engines: {json_path}")
    return both_exit_status(statuses, figures), measured


def both_exit_status(statuses: Mapping[str, int], figures: Mapping[str, Any]) -> int:
    """0 when every engine's run ended with 0 (every gate held: :func:`run_all.exit_status`) and
    wrote its figures, else 1 (after saying which did not)."""
    failed = [
        f"the {engine} run ended with exit status {status}" + ("" if engine in figures else " and no figures")
        for engine, status in statuses.items()
        if status != 0 or engine not in figures
    ]
    if failed:
        print(f"\nexit status 1: {'; '.join(failed)} (the output above says why)")
        return 1
    return 0


def side_by_side(measured: Mapping[str, Sequence[Measured]]) -> list[dict[str, Any]]:
    """Per job in the nightly's order, then for every job together (``job`` ``"every job"``): for
    each engine its full run's seconds, floor and DuckDB peer (None: none), the incremental run's
    and the rerun's seconds, and what failed a gate (``""``: nothing); and the ratios delta-spark /
    bridge of the full and incremental seconds. The total's peer counts only peers that agree with
    their job, as :func:`run_all.print_table` does."""
    table: list[dict[str, Any]] = []
    for job in JOBS:
        entry: dict[str, Any] = {"job": job}
        for engine, rows in measured.items():
            by_mode = {r.mode: r for r in rows if r.job == job}
            full = by_mode["full"]
            entry[engine] = {
                "full": full.seconds,
                "floor": full.floor,
                "peer": full.peer,
                "incremental": by_mode["incremental"].seconds,
                "rerun": by_mode["rerun"].seconds,
                "gate": gate_note(full),
            }
        table.append(entry)
    total: dict[str, Any] = {"job": "every job"}
    for engine, rows in measured.items():
        full_rows = [r for r in rows if r.mode == "full"]
        total[engine] = {
            "full": sum(r.seconds for r in full_rows),
            "floor": sum(r.floor or 0 for r in full_rows),
            "peer": sum(r.peer or 0 for r in full_rows if r.peer_same),
            "incremental": sum(r.seconds for r in rows if r.mode == "incremental"),
            "rerun": sum(r.seconds for r in rows if r.mode == "rerun"),
            "gate": "",
        }
    table.append(total)
    for entry in table:
        for mode in ("full", "incremental"):
            entry[f"ratio_{mode}"] = entry["delta-spark"][mode] / entry["bridge"][mode]
    return table


def gate_note(row: Measured) -> str:
    """What of a full run failed a gate: its peer differs, or its floor leaves out tables."""
    notes = ["peer differs"] if row.peer_same is False else []
    if row.floor_lacks:
        notes.append(f"floor lacks {', '.join(row.floor_lacks)}")
    return ", ".join(notes)


def print_side_by_side(table: Sequence[dict[str, Any]], messages: int, figures: Mapping[str, Any]) -> None:
    """Both engines' seconds of every job, and the ratios delta-spark / bridge."""
    lake, increment, facts = figures["bridge"]["lake"], figures["bridge"]["increment"], machine()
    print(
        f"\nboth engines: {describe(messages, lake, increment)}; the lake written once, a copy per engine, the "
        f"increment written into each copy (the same seed); seconds; {facts['cores']} cores, load "
        f"{facts['load_average']}"
    )
    cells = ("full", "floor", "peer", "incr")
    block = len(cells) * 8 + 2
    print(f"{'':<22}" + "".join(f"{engine:<{block}}" for engine in ENGINES) + "delta-spark/bridge")
    header = f"{'job':<22}" + ("".join(f"{c:>8}" for c in cells) + "  ") * len(ENGINES) + f"{'full':>8}{'incr':>8}"
    print(header + "  gates")
    print("-" * (len(header) + 7))
    for entry in table:
        if entry["job"] == "every job":
            print("-" * (len(header) + 7))
        line = f"{entry['job']:<22}"
        for engine in ENGINES:
            e = entry[engine]
            line += "".join(fmt(e[k], ".2f").rjust(8) for k in ("full", "floor", "peer", "incremental")) + "  "
        gates = "; ".join(f"{engine}: {entry[engine]['gate']}" for engine in ENGINES if entry[engine]["gate"])
        if entry["job"] != "every job":
            gates = gates or "held"
        print(f"{line}{entry['ratio_full']:>8.2f}{entry['ratio_incremental']:>8.2f}  {gates}".rstrip())
    reruns = {engine: table[-1][engine]["rerun"] for engine in ENGINES}
    print(
        "\nevery job: full, the nightly from scratch; incr, the nightly after the increment; peer, the "
        "DuckDB peers that agree with their job"
    )
    ratio = reruns["delta-spark"] / reruns["bridge"]
    print(
        "nightly rerun without new data, every job: "
        + ", ".join(f"{engine} {seconds:.2f} s" for engine, seconds in reruns.items())
        + f" (delta-spark/bridge {ratio:.2f})"
    )


def growth_both(
    root: Path, sizes: Sequence[int], seed: int, json_path: Path, perturb: str | None, shape: str = "benchmark"
) -> int:
    """For each size, :func:`both` on a lake of its own; then how each engine's jobs grow. The
    figures of a size go next to ``json_path`` (``run_all.<size>.json``), the growth to it."""
    measured: dict[str, dict[int, list[Measured]]] = {engine: {} for engine in ENGINES}
    statuses: dict[int, int] = {}
    for messages in sizes:
        print(f"\n=== {messages:,} bulk messages, both engines ===", flush=True)
        figures = json_path.with_suffix(f".{messages}.json")
        statuses[messages], rows = both(root / f"size-{messages}", messages, seed, figures, perturb, None, shape)
        for engine, engine_rows in rows.items():
            measured[engine][messages] = engine_rows
    growth = {engine: growth_rows(by_size) for engine, by_size in measured.items() if len(by_size) == len(sizes)}
    for engine, engine_growth in growth.items():
        print_growth(engine_growth, sizes, engine)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    summary = {"engines": list(ENGINES), "sizes": list(sizes), "growth": growth, "exit_statuses": statuses}
    json_path.write_text(json.dumps({**summary, "machine": machine()}, indent=2))
    print(f"\nfigures: {json_path}")
    failed = [f"{n:,}" for n, status in statuses.items() if status != 0]
    if failed:
        print(f"\nexit status 1: the runs at {', '.join(failed)} bulk messages failed (their output above says why)")
        return 1
    return 0
