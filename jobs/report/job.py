"""The ``report`` job: one self-contained HTML page with SVG plots about the lake (lag, dead letters,
transactions, traffic, what ingested RocketMQ stores hold that the lake does not read, integrity,
runs), each section from the latest version of its tables, the log
and the offset commits through their hourly summaries (:mod:`jobs.hours`); a table not there yet
gives a "no data yet" section. See docs/jobs.md (report).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from broker_model.common import QUEUE_KEY
from broker_model.store.store_ingest import STORE_FILES
from jobs import hours
from jobs.cli import add_as_of, as_of_of, job_parser, run_spark_job
from jobs.lake import IncrementalReadError, Lake
from jobs.report.page import Section, Table, render_html
from jobs.report.plots import (
    PLOTS_FILE,
    Plot,
    PlotCache,
    plot_dead_letters,
    plot_lag_over_time,
    plot_lag_per_queue,
    plot_topic_traffic,
    plot_transaction_outcomes,
)
from jobs.report.rows import (
    Row,
    ascending,
    dead_letters_per_day,
    integrity_summary,
    lag_per_group,
    lag_per_queue,
    store_files,
    transaction_outcomes,
    utc_datetime,
)
from jobs.runs import JobRun, Parameter, last_reusable, recorded_run, same_inputs, table_versions
from schemas.catalog import (
    COMMIT_HOURS,
    COMMITLOG,
    CONSUME_QUEUE_INTEGRITY,
    CONSUMER_OFFSET_COMMITS,
    CONSUMER_OFFSETS,
    DLQ,
    JOB_RUNS,
    QUEUE_HOURS,
    STORE_INGESTS,
    TRANSACTION_STATE,
    TableSpec,
)
from schemas.errors import LakeError, ValidationError

JOB = "report"
INPUTS = (
    CONSUMER_OFFSETS,
    CONSUMER_OFFSET_COMMITS,
    COMMITLOG,
    TRANSACTION_STATE,
    DLQ,
    CONSUME_QUEUE_INTEGRITY,
    STORE_INGESTS,
    JOB_RUNS,
)
DEFAULT_SAMPLES = 24  # one point per hour of a day-long log
MAX_TABLE_ROWS = 200  # a page stays readable; the tables hold the rest
RUNS_LISTED = 30
UNLISTED_RUNS = ("report", "nightly")  # the runs section lists the runs of the other jobs that did something


@dataclass(frozen=True)
class ReportConfig:
    """Options of the job.

    Attributes:
        lake: the lake root.
        as_of: the report's time, epoch ms: its title and its default directory's date.
        out: the output directory; None for ``<lake>/../reports/<UTC date of as_of>``.
        samples: most hourly points of the lag-over-time series, >= 2.
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.

    Raises:
        ValidationError: ``samples`` below 2.
    """

    lake: Path
    as_of: int
    out: Path | None = None
    samples: int = DEFAULT_SAMPLES
    engine: str = "auto"

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValidationError("samples", self.samples, "not >= 2", "a series needs two points")

    @property
    def out_dir(self) -> Path:
        """The directory the report goes to."""
        if self.out is not None:
            return self.out
        day = datetime.fromtimestamp(self.as_of / 1000, UTC).date().isoformat()
        return self.lake.absolute().parent / "reports" / day


def _table(rows: list[dict[str, Any]], columns: Sequence[str], limit: int = MAX_TABLE_ROWS) -> Table:
    return Table(list(columns), [[r[c] for c in columns] for r in rows[:limit]], len(rows) > limit)


def _missing(title: str, *specs: TableSpec) -> Section:
    names = ", ".join(s.name for s in specs)
    return Section(title, f"no data yet: the table(s) {names} do not exist in this lake")


def _lag_section(lake: Lake, versions: Mapping[str, int], plots: PlotCache) -> Section:
    title = "Lag per group and queue"
    if CONSUMER_OFFSETS.name not in versions:
        return _missing(title, CONSUMER_OFFSETS)
    offsets = lake.read_rows(CONSUMER_OFFSETS, version=versions[CONSUMER_OFFSETS.name]).to_pylist()
    queues = lag_per_queue(offsets)[: MAX_TABLE_ROWS + 1]
    groups = lag_per_group(offsets)
    as_of = max((r["as_of"] for r in offsets), default=None)
    note = f"consumer_offsets version {versions[CONSUMER_OFFSETS.name]}, as of {_iso(as_of)}"
    if not queues:
        return Section(title, note + ": no rows")
    return Section(
        title,
        note,
        [plots.draw("lag_per_queue.svg", plot_lag_per_queue, queues)],
        [
            _table(groups, ["group", "lag", "queues"]),
            _table(queues, ["group", *QUEUE_KEY, "consumer_offset", "broker_offset", "diff"]),
        ],
    )


def _lag_history_section(lake: Lake, versions: Mapping[str, int], samples: int, plots: PlotCache) -> Section:
    title = "Lag over time"
    missing = [s for s in (QUEUE_HOURS, COMMIT_HOURS) if s.name not in versions]
    if missing:
        return _missing(title, *missing)
    queue_hours = lake.read_rows(QUEUE_HOURS, version=versions[QUEUE_HOURS.name]).to_pylist()
    if not queue_hours:
        return Section(title, "no data yet: the commit log is empty")
    rows = hours.lag_over_time(
        queue_hours, lake.read_rows(COMMIT_HOURS, version=versions[COMMIT_HOURS.name]).to_pylist(), samples
    )
    first = min(r["hour"] for r in queue_hours)
    last = max(r["hour"] for r in queue_hours)
    note = (
        f"at the end of the hours from {_iso(first)} to {_iso(last)}, at most {samples} of them; a group's lag "
        "sums the queues it had committed on by then"
    )
    if not rows:
        return Section(title, note + ": no offset commits in that span")
    return Section(
        title,
        note,
        [plots.draw("lag_over_time.svg", plot_lag_over_time, rows)],
        [_table(rows, ["group", "sample", "as_of", "lag"])],
    )


def _traffic_section(lake: Lake, versions: Mapping[str, int], plots: PlotCache) -> Section:
    title = "Messages and bytes per topic per hour"
    if QUEUE_HOURS.name not in versions:
        return _missing(title, QUEUE_HOURS)
    rows = hours.topic_traffic(lake.read_rows(QUEUE_HOURS, version=versions[QUEUE_HOURS.name]).to_pylist())
    note = f"queue_hours version {versions[QUEUE_HOURS.name]}"
    if not rows:
        return Section(title, note + ": no rows")
    return Section(
        title,
        note,
        [plots.draw("topic_traffic.svg", plot_topic_traffic, rows)],
        [_table(rows, ["topic", "hour", "messages", "bytes"])],
    )


def _system_topics_section(lake: Lake, versions: Mapping[str, int]) -> Section:
    title = "RocketMQ 5 system topics: stored, not interpreted yet"
    if QUEUE_HOURS.name not in versions:
        return _missing(title, QUEUE_HOURS)
    rows = hours.uninterpreted_traffic(lake.read_rows(QUEUE_HOURS, version=versions[QUEUE_HOURS.name]).to_pylist())
    note = (
        f"queue_hours version {versions[QUEUE_HOURS.name]}: records of RocketMQ 5 brokers' own system topics "
        "(timer wheel, POP revive log and checkpoints) are in the log and counted under their topic, but no job "
        "reads their meaning yet"
    )
    if not rows:
        return Section(title, note + ": none in the log")
    for row in rows:
        row["first"], row["last"] = _iso(row.pop("first_store_timestamp")), _iso(row.pop("last_store_timestamp"))
    columns = ["broker_name", "topic", "holds", "messages", "bytes", "first", "last"]
    return Section(title, note, [], [_table(rows, columns)])


def _store_files_section(lake: Lake, versions: Mapping[str, int]) -> Section:
    title = "RocketMQ store files: kept by the broker, not read into the lake"
    if STORE_INGESTS.name not in versions:
        return Section(title, "no broker of this lake was ingested from a RocketMQ store")
    columns = ["broker_name", "store_dir", "ingested_timestamp", "commitlog_version", "unread"]
    ingests = lake.read_rows(STORE_INGESTS, columns, version=versions[STORE_INGESTS.name]).to_pylist()
    rows = store_files(ingests, STORE_FILES)
    note = (
        f"store_ingests version {versions[STORE_INGESTS.name]}: what each ingested store held, at its latest ingest, "
        "besides its commit log, consume queues and the config files the ingest reads (RocketMQ 5's timer wheel and "
        "log among them); the records they concern are in the log, their own state is not"
    )
    if not rows:
        return Section(title, note + ": nothing else")
    for row in rows:
        row["listed"] = _iso(row.pop("ingested_timestamp"))
    return Section(title, note, [], [_table(rows, ["broker_name", "path", "bytes", "holds", "listed", "store_dir"])])


def _simple_section(
    lake: Lake,
    versions: Mapping[str, int],
    title: str,
    spec: TableSpec,
    columns: Sequence[str],
    build: Callable[[pa.Table], list[Row]],
    plot: tuple[str, Plot],
    plots: PlotCache,
) -> Section:
    if spec.name not in versions:
        return _missing(title, spec)
    rows = build(lake.read_rows(spec, columns, version=versions[spec.name]))
    note = f"{spec.name} version {versions[spec.name]}"
    if not rows:
        return Section(title, note + ": no rows")
    return Section(title, note, [plots.draw(*plot, rows)], [_table(rows, list(rows[0]))])


def _integrity_section(lake: Lake, versions: Mapping[str, int]) -> Section:
    title = "Integrity findings"
    if CONSUME_QUEUE_INTEGRITY.name not in versions:
        return _missing(title, CONSUME_QUEUE_INTEGRITY)
    findings = lake.read_rows(CONSUME_QUEUE_INTEGRITY, version=versions[CONSUME_QUEUE_INTEGRITY.name]).to_pylist()
    summary = integrity_summary(findings)
    note = f"consume_queue_integrity version {versions[CONSUME_QUEUE_INTEGRITY.name]}"
    if not summary:
        return Section(title, note + ": no findings, the consume queues are consistent with the log")
    columns = CONSUME_QUEUE_INTEGRITY.column_names
    order = ("broker_name", "commit_log_offset", "problem")
    rows = sorted(findings, key=lambda r: tuple(ascending(r[k]) for k in order))[: MAX_TABLE_ROWS + 1]
    return Section(title, note, [], [_table(summary, ["problem", "findings", "brokers"]), _table(rows, columns)])


def _runs_section(lake: Lake, versions: Mapping[str, int]) -> Section:
    title = "Recent job runs"
    if JOB_RUNS.name not in versions:
        return _missing(title, JOB_RUNS)
    columns = ["job", "status", "started_timestamp", "duration_ms", "message", "run_id"]
    runs = lake.read_rows(JOB_RUNS, columns, version=versions[JOB_RUNS.name]).to_pylist()
    listed = [r for r in runs if r["status"] != "NOOP" and r["job"] not in UNLISTED_RUNS]
    rows = sorted(listed, key=lambda r: (-r["started_timestamp"], r["run_id"]))[:RUNS_LISTED]
    for row in rows:
        row["started"] = _iso(row["started_timestamp"])
    return Section(
        title,
        f"job_runs version {versions[JOB_RUNS.name]}, the latest {RUNS_LISTED} runs that wrote or failed"
        f" (no-op runs and the {' and '.join(UNLISTED_RUNS)} runs are left out)",
        tables=[_table(rows, ["started", "job", "status", "duration_ms", "message"])],
    )


def _iso(epoch_ms: int | None) -> str:
    return "-" if epoch_ms is None else utc_datetime(epoch_ms).isoformat(timespec="seconds").replace("+00:00", "Z")


def build_sections(lake: Lake, versions: Mapping[str, int], samples: int, plots: PlotCache) -> list[Section]:
    """Every section of the page, reading the given table versions (absent names: missing tables);
    ``plots`` draws what changed."""
    return [
        _lag_section(lake, versions, plots),
        _lag_history_section(lake, versions, samples, plots),
        _simple_section(
            lake,
            versions,
            "Dead letters per group and day",
            DLQ,
            ["group", "dlq_timestamp"],
            dead_letters_per_day,
            ("dead_letters.svg", plot_dead_letters),
            plots,
        ),
        _simple_section(
            lake,
            versions,
            "Transaction outcomes",
            TRANSACTION_STATE,
            ["state", "anomaly"],
            transaction_outcomes,
            ("transaction_outcomes.svg", plot_transaction_outcomes),
            plots,
        ),
        _traffic_section(lake, versions, plots),
        _system_topics_section(lake, versions),
        _store_files_section(lake, versions),
        _integrity_section(lake, versions),
        _runs_section(lake, versions),
    ]


def write_report(out_dir: Path, page: str, sections: Sequence[Section], plots: PlotCache) -> Path:
    """Write ``report.html``, every plot as an SVG file (those read back are left as they are) and
    ``plots.json`` into ``out_dir``, and remove the plot files of the previous report that this one
    does not have; the page's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / PLOTS_FILE).unlink(missing_ok=True)  # a run that stops here draws every plot next time
    for section in sections:
        for name, drawn in section.plots:
            if name not in plots.read_back:
                (out_dir / name).write_bytes(drawn)
    for name in plots.stale():
        (out_dir / name).unlink(missing_ok=True)
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    plots.save()
    return path


def run(spark: SparkSession, config: ReportConfig) -> JobRun:
    """Write the report of ``config.lake`` into ``config.out_dir``; print its path; record the run.

    A no-op (NOOP, nothing drawn) when the latest SUCCEEDED or NOOP report had the same time,
    samples and page, the page is still there, its data tables hold the same data, and the runs
    ``job_runs`` gained since are ones the page does not list (:data:`UNLISTED_RUNS`).

    Returns:
        The recorded run (``parameters``: ``as_of``, ``samples`` and the ``page`` path, read by
        :func:`page_of`, and per hourly summary written how and why, :func:`jobs.hours.update`;
        ``row_counts``: the plots and tables written), or FAILED re-raised.
    """
    lake = Lake(spark, config.lake, config.engine)
    path = config.out_dir / "report.html"
    settings: dict[str, Parameter] = {"as_of": config.as_of, "samples": config.samples, "page": str(path)}
    with recorded_run(lake, JOB, settings) as job_run:
        lake.add_missing_columns(STORE_INGESTS)  # a table an older release's ingest created
        job_run.input_versions = table_versions(lake, [s.name for s in INPUTS])
        previous = last_reusable(lake, JOB)
        if previous is not None and _drawn(lake, previous, job_run.input_versions, settings):
            job_run.row_counts = dict(previous["row_counts"])
            print(f"{JOB}: {path} shows these inputs already, nothing drawn")
            job_run.conclude("NOOP", "the page shows these inputs already")
            return job_run
        summaries: dict[str, str] = {}  # how each hourly summary was brought up to date, and why
        job_run.output_versions = hours.update(lake, choices=summaries)
        job_run.parameters.update(summaries)
        plots = PlotCache(config.out_dir)
        versions = {**job_run.input_versions, **job_run.output_versions}
        sections = build_sections(lake, versions, config.samples, plots)
        subtitle = f"lake {config.lake} (engine {lake.engine}), as of {_iso(config.as_of)}"
        page = render_html("rmq-lake report", subtitle, sections)
        path = write_report(config.out_dir, page, sections, plots)
        job_run.parameters["page"] = str(path)
        job_run.row_counts = {
            "plots": sum(len(s.plots) for s in sections),
            "tables": sum(len(s.tables) for s in sections),
            "empty_sections": sum(1 for s in sections if not s.plots and not s.tables),
        }
        drawn = job_run.row_counts["plots"] - len(plots.read_back)
        drawing = f"{drawn} plots drawn in {plots.drawing_seconds:.2f} s"
        print(f"{JOB}: wrote {path} ({job_run.row_counts['plots']} plots; {drawing}, the rest unchanged)")
        job_run.conclude("SUCCEEDED", f"report written; {drawing}")
    return job_run


def page_of(job_run: JobRun) -> str:
    """The page path a report run recorded in its parameters."""
    return str(job_run.parameters["page"])


def _drawn(lake: Lake, previous: Mapping[str, Any], versions: Mapping[str, int], settings: Mapping[str, Any]) -> bool:
    """Whether the previous report had these ``settings`` and its page is there and shows the data
    of ``versions``."""
    recorded: Mapping[str, int] = previous["input_versions"]
    had = previous["parameters"]
    if any(had.get(name) != value for name, value in settings.items()) or not Path(str(settings["page"])).is_file():
        return False
    data = {name: version for name, version in versions.items() if name != JOB_RUNS.name}
    if not same_inputs(lake, {n: v for n, v in recorded.items() if n != JOB_RUNS.name}, data):
        return False
    before, now = recorded.get(JOB_RUNS.name), versions.get(JOB_RUNS.name)
    if before is None or now is None:
        return before == now
    try:
        runs = lake.read_appended_rows(JOB_RUNS, ["job", "status"], before, now).to_pylist()
    except IncrementalReadError:  # the run records were packed since: the runs of ``now`` not in ``before``
        try:
            earlier = set(lake.read_rows(JOB_RUNS, ["run_id"], version=before).column("run_id").to_pylist())
        except LakeError:  # ``before`` is gone from the log
            return False
        rows = lake.read_rows(JOB_RUNS, ["run_id", "job", "status"], version=now).to_pylist()
        runs = [r for r in rows if r["run_id"] not in earlier]
    return all(r["status"] == "NOOP" or r["job"] in UNLISTED_RUNS for r in runs)


def build_parser() -> argparse.ArgumentParser:
    """Options of ``report``."""
    parser = job_parser(JOB, __doc__)
    parser.add_argument(
        "--out", default=None, help="output directory (default: <lake>/../reports/<UTC date of --as-of>)"
    )
    add_as_of(parser, "the report's time: epoch ms or ISO-8601 with a zone (default: now)")
    parser.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        help=f"most hourly points of the lag-over-time series (default {DEFAULT_SAMPLES})",
    )
    return parser


def build_config(argv: Sequence[str] | None = None) -> ReportConfig:
    """The config of ``argv``; ``--as-of`` defaults to the current time.

    Raises:
        ValidationError: a bad ``--as-of`` or ``--samples``.
        SystemExit: argparse usage errors and ``--help``.
    """
    args = build_parser().parse_args(argv)
    as_of = as_of_of(args.as_of)
    out = Path(args.out) if args.out is not None else None
    return ReportConfig(Path(args.lake), as_of, out, args.samples, args.engine)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` (before starting Spark), build the session, run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
