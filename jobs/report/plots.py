"""The report's plots: small collected rows in, SVG bytes out, each drawn again only when its rows
changed (:class:`PlotCache`).

SVG, not PNG: its text stays text for the browser to set, where rasterizing every tick label's
glyphs took most of a PNG's drawing time (about 2.5 times as long per plot); the page is as
self-contained, and the plots sharp at any zoom."""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


MAX_BARS = 30  # bars beyond this are unreadable on a page-wide chart
MAX_TOPIC_LINES = 10  # more lines than a legend can tell apart; the rest is summed as "other"
_DPI = 100


def _figure(width: float = 10.0, height: float = 4.0, left: float = 1.05, bottom: float = 0.9) -> Figure:
    """A figure of ``width`` x ``height`` inches whose axes leave ``left`` and ``bottom`` inches for
    tick labels and axis titles (fixed margins: a layout engine measuring every label took 40 % of
    the drawing time)."""
    from matplotlib.figure import Figure

    # a Figure without pyplot: no global state, no display, the Agg canvas by default
    figure = Figure(figsize=(width, height), dpi=_DPI)
    figure.subplots_adjust(
        left=left / width, right=1 - 0.25 / width, bottom=bottom / height, top=1 - 0.45 / height, hspace=0.25
    )
    return figure


def _label_inches(labels: Sequence[str], font_size: float) -> float:
    """About the width of the longest of ``labels`` at ``font_size`` points, in inches."""
    return max((len(label) for label in labels), default=0) * font_size * 0.6 / 72


def _svg(figure: Figure) -> bytes:
    """The figure as SVG: text as ``<text>`` elements in the page's sans-serif fonts, not glyph
    paths; element ids from the content alone, so the same rows give the same bytes."""
    from matplotlib import rc_context

    buffer = io.BytesIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "report"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    return buffer.getvalue()


Plot = Callable[[Sequence[Mapping[str, Any]]], bytes]
PLOTS_FILE = "plots.json"
_PLOTS_FORMAT = 3  # bump when a plot function draws differently from the same rows


class PlotCache:
    """Draws a plot only when its rows changed: the plot files a report wrote stay in its directory
    with ``plots.json`` (per file, a digest of the rows and the drawing, and of the file's bytes); a
    plot whose rows, drawing and file are all unchanged is read back instead of drawn again."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        try:
            known = json.loads((out_dir / PLOTS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
        self.known: dict[str, dict[str, str]] = known if isinstance(known, dict) else {}
        self.drawn: dict[str, dict[str, str]] = {}
        self.read_back: set[str] = set()
        self.drawing_seconds = 0.0  # spent drawing the plots that changed

    def draw(self, name: str, plot: Plot, rows: Sequence[Mapping[str, Any]]) -> tuple[str, bytes]:
        """``(name, SVG bytes)`` of ``plot`` over ``rows``."""
        from matplotlib import __version__ as matplotlib_version

        drawing = [_PLOTS_FORMAT, plot.__module__, plot.__qualname__, matplotlib_version, _DPI]
        text = json.dumps([drawing, list(rows)], sort_keys=True, default=str)
        inputs = hashlib.sha256(text.encode("utf-8")).hexdigest()
        cached = self.known.get(name)
        if isinstance(cached, dict) and cached.get("inputs") == inputs:
            try:
                drawn = (self.out_dir / name).read_bytes()
            except OSError:
                drawn = b""
            if drawn and hashlib.sha256(drawn).hexdigest() == cached.get("file"):
                self.drawn[name] = cached
                self.read_back.add(name)
                return name, drawn
        started = time.perf_counter()
        drawn = plot(rows)
        self.drawing_seconds += time.perf_counter() - started
        self.drawn[name] = {"inputs": inputs, "file": hashlib.sha256(drawn).hexdigest()}
        self.read_back.discard(name)
        return name, drawn

    def stale(self) -> list[str]:
        """The files the previous report recorded that this one did not draw (a section now empty,
        a plot renamed): to remove, so the directory holds this report's plots alone."""
        return sorted(name for name in self.known if name not in self.drawn and Path(name).name == name)

    def save(self) -> None:
        """Record the plots of this report (after its plot files are written)."""
        (self.out_dir / PLOTS_FILE).write_text(json.dumps(self.drawn, sort_keys=True), encoding="utf-8")


def plot_lag_per_queue(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """Horizontal bars of ``diff`` per (group, queue), rows in the order given (largest first)."""
    shown = list(rows)[:MAX_BARS]
    labels = [f"{r['group']}  {r['broker_name']}/{r['topic']}/{r['queue_id']}" for r in shown]
    height = max(2.5, 0.28 * len(shown) + 1)
    figure = _figure(10, height, left=min(5.0, _label_inches(labels, 7) + 0.3), bottom=0.6)
    axes = figure.subplots()
    axes.barh(range(len(shown)), [r["diff"] for r in shown], color="#d62728")
    axes.set_yticks(range(len(shown)), labels, fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("lag (messages)")
    axes.set_title(f"lag per group and queue (largest {len(shown)})")
    return _svg(figure)


def plot_lag_over_time(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """One line per group: lag against time (UTC)."""
    figure = _figure()
    axes = figure.subplots()
    for group in sorted({r["group"] for r in rows}):
        points = sorted((r["as_of"], r["lag"]) for r in rows if r["group"] == group)
        axes.plot(_dates([t for t, _ in points]), [lag for _, lag in points], marker=".", label=group)
    axes.set_ylabel("lag (messages)")
    axes.set_title("lag over time per group")
    axes.legend(fontsize=7)
    axes.xaxis_date("UTC")
    figure.autofmt_xdate()
    return _svg(figure)


NOT_WRITTEN_DAY = "not written yet"  # the bar of POLICY_NOT_WRITTEN letters, which have no day


def plot_dead_letters(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """Stacked bars: dead letters per day, one color per group; letters not written yet (no day)
    in a bar of their own, first."""
    days = sorted({r["day"] for r in rows}, key=lambda day: (day is not None, day or ""))
    labels = [NOT_WRITTEN_DAY if day is None else day for day in days]
    figure = _figure(bottom=0.55)
    axes = figure.subplots()
    bottom = [0] * len(days)
    for group in sorted({r["group"] for r in rows}):
        counts = {r["day"]: r["dead_letters"] for r in rows if r["group"] == group}
        heights = [counts.get(day, 0) for day in days]
        axes.bar(labels, heights, bottom=bottom, label=group)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes.set_ylabel("dead letters")
    axes.set_title("dead letters per group and day (UTC)")
    axes.legend(fontsize=7)
    return _svg(figure)


def plot_transaction_outcomes(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """Bars: transactions per state."""
    figure = _figure(8, 3.5, bottom=0.5)
    axes = figure.subplots()
    axes.bar([r["state"] for r in rows], [r["transactions"] for r in rows], color="#1f77b4")
    axes.set_ylabel("transactions")
    axes.set_title("transaction outcomes")
    return _svg(figure)


def plot_topic_traffic(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """Two panels, messages and bytes per hour, one line per topic (the busiest ones)."""
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["topic"]] = totals.get(r["topic"], 0) + r["messages"]
    shown = sorted(totals, key=lambda t: (-totals[t], t))[:MAX_TOPIC_LINES]
    figure = _figure(10, 6)
    messages_axes, bytes_axes = figure.subplots(2, 1, sharex=True)
    for topic in shown:
        points = sorted((r["hour"], r["messages"], r["bytes"]) for r in rows if r["topic"] == topic)
        hours = _dates([h for h, _, _ in points])
        messages_axes.plot(hours, [m for _, m, _ in points], marker="o", label=topic)
        bytes_axes.plot(hours, [b for _, _, b in points], marker="o", label=topic)
    messages_axes.set_ylabel("messages per hour")
    bytes_axes.set_ylabel("bytes per hour")
    messages_axes.set_title("traffic per topic and hour (UTC)")
    messages_axes.legend(fontsize=7, ncol=2)
    bytes_axes.xaxis_date("UTC")
    figure.autofmt_xdate()
    return _svg(figure)


def _dates(epoch_ms: Sequence[int]) -> list[float]:
    """Matplotlib date numbers (days since the epoch) of epoch milliseconds: an x axis of dates."""
    return [t / 86_400_000 for t in epoch_ms]
