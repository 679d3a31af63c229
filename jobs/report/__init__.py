"""The ``report`` job: one self-contained HTML page with SVG plots about the lake (see
:mod:`jobs.report.job` and docs/jobs.md).

Besides the job package's roles (docs/jobs.md, "How a job package is laid out"): ``rows`` (the
aggregations of its sections), ``plots`` (the drawings and their cache) and ``page`` (the HTML).
"""

from __future__ import annotations

from jobs.report.job import ReportConfig, build_config, build_parser, main, page_of, run, write_report
from jobs.report.page import Section, Table, render_html
from jobs.report.plots import PLOTS_FILE, PlotCache
from jobs.report.rows import (
    dead_letters_per_day,
    integrity_summary,
    lag_per_group,
    lag_per_queue,
    store_files,
    transaction_outcomes,
)

__all__ = [
    "PLOTS_FILE",
    "PlotCache",
    "ReportConfig",
    "Section",
    "Table",
    "build_config",
    "build_parser",
    "dead_letters_per_day",
    "integrity_summary",
    "lag_per_group",
    "lag_per_queue",
    "main",
    "page_of",
    "render_html",
    "run",
    "store_files",
    "transaction_outcomes",
    "write_report",
]
