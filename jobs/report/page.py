"""The report's page: sections of text, tables and plots rendered as one self-contained HTML file."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Table:
    """A table of the page: column names and rows (values are shown with ``str``)."""

    columns: list[str]
    rows: list[list[Any]]
    truncated: bool = False


@dataclass
class Section:
    """A section of the page: a title, a note, plots (file name, SVG bytes) and tables."""

    title: str
    note: str = ""
    plots: list[tuple[str, bytes]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)


_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f0f0f0; } td.text { text-align: left; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
p.note { color: #555; } p.empty { color: #a00; }
"""


def render_html(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole page: plots embedded as ``data:image/svg+xml;base64`` URIs, every text escaped."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><p class='note'>{html.escape(subtitle)}</p>",
    ]
    for section in sections:
        parts.append(f"<section><h2>{html.escape(section.title)}</h2>")
        if section.note:
            css = "empty" if not section.plots and not section.tables else "note"
            parts.append(f"<p class='{css}'>{html.escape(section.note)}</p>")
        for name, drawn in section.plots:
            data = base64.b64encode(drawn).decode("ascii")
            label = html.escape(name)
            parts.append(f'<img alt="{label}" data-file="{label}" src="data:image/svg+xml;base64,{data}">')
        parts.extend(_table_html(table) for table in section.tables)
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _table_html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in table.rows)
    more = f"<p class='note'>first {len(table.rows)} rows shown</p>" if table.truncated else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    css = "" if isinstance(value, int | float) else " class='text'"
    return f"<td{css}>{html.escape(text)}</td>"
