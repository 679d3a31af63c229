"""The report job: its transforms on hand-built frames, a lake without tables, and a real report
opened in headless Chromium.

The Chromium test needs Debian's ``chromium`` package (``/usr/bin/chromium``); without it the
test fails and says how to install it (``.ci/run`` installs it on a fresh machine).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from jobs.report import (
    PLOTS_FILE,
    PlotCache,
    ReportConfig,
    Section,
    dead_letters_per_day,
    lag_per_group,
    lag_per_queue,
    run,
    store_files,
    transaction_outcomes,
    write_report,
)
from jobs.report.plots import NOT_WRITTEN_DAY, plot_dead_letters
from tests.helpers import ENGINE

pytestmark = pytest.mark.spark

CHROMIUM = "/usr/bin/chromium"
DEAD = pa.schema([("group", pa.string()), ("dlq_timestamp", pa.int64())])
STATES = pa.schema([("state", pa.string()), ("anomaly", pa.string())])
INSTALL_HINT = (
    "install it with: sudo apt-get update && sudo apt-get install -y chromium (tests/run.sh does so when it is missing)"
)


def test_dead_letters_are_counted_per_group_and_utc_day() -> None:
    day_ms = 86_400_000
    dead = [("cg-a", day_ms - 1), ("cg-a", day_ms), ("cg-a", day_ms + 5), ("cg-b", day_ms), ("cg-b", None)]
    assert dead_letters_per_day(pa.Table.from_pylist([{"group": g, "dlq_timestamp": t} for g, t in dead], DEAD)) == [
        {"group": "cg-b", "day": None, "dead_letters": 1},  # a letter not written yet (POLICY_NOT_WRITTEN)
        {"group": "cg-a", "day": "1970-01-01", "dead_letters": 1},
        {"group": "cg-a", "day": "1970-01-02", "dead_letters": 2},
        {"group": "cg-b", "day": "1970-01-02", "dead_letters": 1},
    ]


def test_letters_not_written_yet_get_a_bar_of_their_own_in_the_dead_letters_plot() -> None:
    """A lake whose retry chains ran out before ``route_dlq --execute`` wrote their letters has
    rows without a day: drawn as a bar of their own, first, not an error."""
    day_ms = 86_400_000
    dead = [("cg-a", day_ms), ("cg-b", None), ("cg-b", None), ("cg-a", 2 * day_ms)]
    rows = dead_letters_per_day(pa.Table.from_pylist([{"group": g, "dlq_timestamp": t} for g, t in dead], DEAD))
    svg = plot_dead_letters(rows).decode("utf-8")
    labels = [svg.index(f">{label}<") for label in (NOT_WRITTEN_DAY, "1970-01-02", "1970-01-03")]
    assert labels == sorted(labels)  # the x axis' tick labels, in this order


def test_transaction_outcomes_count_states_and_anomalies() -> None:
    states = [("ROLLED_BACK", None), ("COMMITTED", None), ("COMMITTED", "OP_ON_REPUT_COPY")]
    assert transaction_outcomes(pa.Table.from_pylist([{"state": s, "anomaly": a} for s, a in states], STATES)) == [
        {"state": "COMMITTED", "transactions": 2, "anomalies": 1},
        {"state": "ROLLED_BACK", "transactions": 1, "anomalies": 0},
    ]


def test_lag_is_listed_per_queue_and_summed_per_group_the_largest_first() -> None:
    def offsets(group: str, queue_id: int, diff: int | None) -> dict[str, object]:
        queue = {"broker_name": "broker-a", "topic": "Orders", "queue_id": queue_id}
        counts = {"consumer_offset": 1, "broker_offset": 9, "diff": diff, "oldest_unconsumed_timestamp": None}
        return {"group": group, **queue, **counts, "as_of": 5}

    rows = [offsets("cg-a", 0, 3), offsets("cg-b", 1, None), offsets("cg-b", 0, 7), offsets("cg-a", 1, 3)]
    assert [(r["group"], r["queue_id"], r["diff"]) for r in lag_per_queue(rows)] == [
        ("cg-b", 0, 7),
        ("cg-a", 0, 3),
        ("cg-a", 1, 3),
        ("cg-b", 1, 0),  # QUEUE_NOT_FOUND: no diff, counted as 0
    ]
    assert lag_per_group(rows) == [{"group": "cg-b", "lag": 7, "queues": 2}, {"group": "cg-a", "lag": 6, "queues": 2}]


def test_store_files_are_those_the_latest_ingest_of_each_broker_listed_with_what_they_hold() -> None:
    def ingest(broker: str, version: int, unread: list[tuple[str, int]] | None) -> dict[str, object]:
        row = {"broker_name": broker, "store_dir": "/s", "ingested_timestamp": version, "commitlog_version": version}
        return {**row, "unread": unread}

    ingests = [
        ingest("broker-b", 3, [("timerwheel", 8), ("odd", 1), ("config/timercheck.bak", 2)]),
        ingest("broker-b", 2, [("lock", 0)]),  # an earlier run: its listing is not the latest
        ingest("broker-a", 1, None),  # a row of an older release lists nothing
    ]
    known = {"timerwheel": "the wheel", "config/timercheck": "the checkpoint"}
    assert [(r["broker_name"], r["path"], r["bytes"], r["holds"]) for r in store_files(ingests, known)] == [
        ("broker-b", "config/timercheck.bak", 2, "the previous copy: the checkpoint"),
        ("broker-b", "odd", 1, "not known to this product"),
        ("broker-b", "timerwheel", 8, "the wheel"),
    ]


def test_a_lake_without_tables_gives_a_report_of_empty_sections(spark: SparkSession, tmp_path: Path) -> None:
    lake_root = tmp_path / "lake"
    job_run = run(spark, ReportConfig(lake_root, 1_795_000_000_000, engine=ENGINE))
    day = datetime.fromtimestamp(1_795_000_000, UTC).date().isoformat()
    page = (tmp_path / "reports" / day / "report.html").read_text(encoding="utf-8")
    assert job_run.status == "SUCCEEDED" and job_run.row_counts["plots"] == 0
    assert page.count("no data yet") == 8 and "<img" not in page


@pytest.mark.both_engines
def test_a_report_whose_inputs_did_not_change_is_not_drawn_again(spark: SparkSession, tmp_path: Path) -> None:
    from broker_model.tools import run_workload
    from jobs.dlq.job import RouteDlqConfig
    from jobs.dlq.job import run as route_dlq

    lake_root, out, as_of = tmp_path / "lake", tmp_path / "report", 1_795_000_000_000
    run_workload(lake_root, 300, seed=2, consumers=True)
    route_dlq(spark, RouteDlqConfig(lake_root, as_of, engine=ENGINE))
    config = ReportConfig(lake_root, as_of, out, engine=ENGINE)
    assert run(spark, config).status == "SUCCEEDED"
    page = out / "report.html"
    drawn = page.stat().st_mtime_ns

    route_dlq(spark, RouteDlqConfig(lake_root, as_of, engine=ENGINE))  # a no-op run: not listed
    again = run(spark, config)
    assert again.status == "NOOP" and again.row_counts["tables"] > 0 and page.stat().st_mtime_ns == drawn
    assert again.parameters == {"as_of": as_of, "samples": 24, "page": str(page)}

    from deltalake import DeltaTable

    from broker_model.store.delta_tables import SMALL_TABLE_FILES
    from jobs.lake import Lake
    from jobs.runs import JobRun, record_run
    from schemas.catalog import JOB_RUNS

    lake = Lake(spark, lake_root, ENGINE)
    for _ in range(SMALL_TABLE_FILES + 1):  # enough no-op runs for their records to be packed
        record_run(lake, JobRun("route_dlq").finish("NOOP", "nothing new"))
    assert any(h["operation"] == "OPTIMIZE" for h in DeltaTable(str(lake.location(JOB_RUNS))).history())
    assert run(spark, config).status == "NOOP" and page.stat().st_mtime_ns == drawn

    assert run(spark, ReportConfig(lake_root, as_of + 1, out, engine=ENGINE)).status == "SUCCEEDED"  # a new time
    route_dlq(spark, RouteDlqConfig(lake_root, as_of + 2, engine=ENGINE))  # a run that writes: listed
    assert run(spark, ReportConfig(lake_root, as_of + 1, out, engine=ENGINE)).status == "SUCCEEDED"
    page.unlink()
    assert run(spark, ReportConfig(lake_root, as_of + 1, out, engine=ENGINE)).status == "SUCCEEDED"
    assert page.is_file()


def test_a_plot_is_drawn_again_only_when_its_rows_its_drawing_or_its_file_changed(tmp_path: Path) -> None:
    calls: list[int] = []

    def bars(rows: Sequence[Mapping[str, Any]]) -> bytes:
        calls.append(len(rows))
        return f"plot of {len(rows)} rows".encode()

    def report(rows: list[dict[str, Any]], plot: Callable[[Sequence[Mapping[str, Any]]], bytes] = bars) -> bytes:
        plots = PlotCache(tmp_path)
        name, drawn = plots.draw("bars.svg", plot, rows)
        write_report(tmp_path, "<html></html>", [Section("s", plots=[(name, drawn)])], plots)
        return drawn

    assert report([{"a": 1}]) == b"plot of 1 rows" and calls == [1]
    written = (tmp_path / "bars.svg").stat().st_mtime_ns
    assert report([{"a": 1}]) == b"plot of 1 rows" and calls == [1]  # read back, file left as it was
    assert (tmp_path / "bars.svg").stat().st_mtime_ns == written
    assert report([{"a": 1}, {"a": 2}]) == b"plot of 2 rows" and calls == [1, 2]  # new rows
    (tmp_path / "bars.svg").write_bytes(b"edited")
    assert report([{"a": 1}, {"a": 2}]) == b"plot of 2 rows" and calls == [1, 2, 2]  # the file changed
    assert (tmp_path / "bars.svg").read_bytes() == b"plot of 2 rows"

    def other(rows: Sequence[Mapping[str, Any]]) -> bytes:
        return b"other drawing"

    assert report([{"a": 1}, {"a": 2}], other) == b"other drawing"  # another drawing of the same rows
    (tmp_path / PLOTS_FILE).write_text("not json", encoding="utf-8")
    assert report([{"a": 1}, {"a": 2}]) == b"plot of 2 rows" and calls == [1, 2, 2, 2]


def test_a_report_removes_the_plot_files_of_the_previous_report_it_does_not_have(tmp_path: Path) -> None:
    def bars(rows: Sequence[Mapping[str, Any]]) -> bytes:
        return b"<svg/>"

    def report(*names: str) -> None:
        plots = PlotCache(tmp_path)
        drawn = [plots.draw(name, bars, [{"a": 1}]) for name in names]
        write_report(tmp_path, "<html></html>", [Section("s", plots=drawn)], plots)

    (tmp_path / "lag.png").write_bytes(b"an older report's plot")  # recorded as a plot of the last report
    (tmp_path / "notes.txt").write_text("the user's", encoding="utf-8")  # not a plot: left alone
    (tmp_path / PLOTS_FILE).write_text('{"lag.png": {"inputs": "x", "png": "y"}, "../x": {}}', encoding="utf-8")
    report("lag.svg", "dead_letters.svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dead_letters.svg",
        "lag.svg",
        "notes.txt",
        PLOTS_FILE,
        "report.html",
    ]
    report("lag.svg")  # the dead letters' section has no plot this time
    assert not (tmp_path / "dead_letters.svg").exists() and (tmp_path / "lag.svg").read_bytes() == b"<svg/>"


@pytest.mark.both_engines
def test_a_report_at_a_new_time_reuses_the_plots_of_unchanged_rows(spark: SparkSession, tmp_path: Path) -> None:
    from broker_model.tools import run_workload

    lake_root, out, as_of = tmp_path / "lake", tmp_path / "report", 1_795_000_000_000
    run_workload(lake_root, 300, seed=3, consumers=True)
    first = run(spark, ReportConfig(lake_root, as_of, out, engine=ENGINE))
    assert first.status == "SUCCEEDED"
    drawn = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.svg")}
    assert drawn
    assert f"; {len(drawn)} plots drawn in " in (first.message or ""), first.message  # what the drawing took

    again = run(spark, ReportConfig(lake_root, as_of + 1, out, engine=ENGINE))
    assert again.status == "SUCCEEDED" and "; 0 plots drawn in 0.00 s" in (again.message or ""), again.message
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.svg")} == drawn
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/svg+xml;base64,') == len(drawn)


# ---------------------------------------------------------------------------------------------
# A real report in a real browser
# ---------------------------------------------------------------------------------------------


def _chromium(user_data: Path, *args: str) -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: the report is checked in headless Chromium; {INSTALL_HINT}")
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={user_data}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


# sets, once every image has loaded (or failed), its decoded width as an attribute --dump-dom shows
_PROBE = (
    "<script>window.addEventListener('load', function () {"
    " for (const img of document.images) { img.setAttribute('data-natural-width', String(img.naturalWidth)); }"
    " document.body.setAttribute('data-images', String(document.images.length)); });</script>"
)


@pytest.mark.both_engines
@pytest.mark.slow
def test_the_report_of_a_broker_workload_renders_with_its_plots_in_chromium(
    spark: SparkSession, tmp_path: Path
) -> None:
    from broker_model.tools import run_workload
    from jobs.consumer_offsets import ConsumerOffsetsConfig
    from jobs.consumer_offsets import run as consumer_offsets
    from jobs.rebuild_consume_queue import RebuildConfig
    from jobs.rebuild_consume_queue import run as rebuild
    from jobs.resolve_transactions import ResolveTransactionsConfig
    from jobs.resolve_transactions import run as resolve_transactions

    lake_root = tmp_path / "lake"
    run_workload(lake_root, 2000, seed=5, consumers=True, transactions=12)
    now = time.time_ns() // 1_000_000
    rebuild(spark, RebuildConfig(lake_root, engine=ENGINE))
    consumer_offsets(spark, ConsumerOffsetsConfig(lake_root, now, engine=ENGINE))
    resolve_transactions(spark, ResolveTransactionsConfig(lake_root, now, engine=ENGINE))
    out = tmp_path / "report"
    job_run = run(spark, ReportConfig(lake_root, now, out, engine=ENGINE))

    plots = sorted(p.name for p in out.glob("*.svg"))
    assert plots == ["lag_over_time.svg", "lag_per_queue.svg", "topic_traffic.svg", "transaction_outcomes.svg"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert job_run.row_counts["plots"] == 4 and page.count('src="data:image/svg+xml;base64,') == 4
    assert "Dead letters per group and day" in page and "no data yet: the table(s) dlq" in page

    probe = tmp_path / "probe.html"  # the page as written, plus a script reporting each image's width
    probe.write_text(page.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    dom = _chromium(tmp_path / "chromium", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    assert 'data-images="4"' in dom
    widths = [int(w) for w in re.findall(r'data-natural-width="(\d+)"', dom)]
    assert len(widths) == 4 and all(w >= 600 for w in widths)  # every plot decoded at its real size

    shot = tmp_path / "screenshot.png"
    _chromium(
        tmp_path / "chromium",
        "--hide-scrollbars",
        "--window-size=1200,2400",
        f"--screenshot={shot}",
        (out / "report.html").as_uri(),
    )
    from matplotlib.image import imread

    pixels = imread(str(shot))
    assert pixels.shape[0] == 2400 and pixels.shape[1] == 1200
    assert float(pixels[..., :3].std()) > 0.05  # not a blank page: text, tables and plots
    red_bars = (pixels[..., 0] > 0.75) & (pixels[..., 1] < 0.3) & (pixels[..., 2] < 0.3)
    assert int(red_bars.sum()) > 1000  # the lag bars are drawn, not just the page around them


def test_a_missing_browser_is_a_failure_that_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        _chromium(Path("unused"), "--version")
