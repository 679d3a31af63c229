"""Whether a DuckDB peer computed what a job wrote: every column of the job's table against the
peer's result, compared as multisets of rows.

Both sides are first brought to one form in DuckDB (:func:`canonical`): each catalog column cast to
the catalog's type, maps as lists of ``{key, value}`` entries sorted by key (a map's order means
nothing), lists kept in their order with their elements brought to the same form, structs field by
field. Then the rows of each side that the other lacks (``EXCEPT ALL`` both ways, so duplicates
count) must be none. When they are not, the rows left over are paired by the table's key: the
columns whose values differ within pairs, the rows with no partner, and a few examples say how.

What a peer cannot compute faithfully is named, never dropped silently: a column left out of the
comparison (``skip_columns``) or rows of either side left out by a SQL predicate (``skip_rows``),
each with the reason, is printed with the outcome.

Imports nothing from the other benchmark scripts, so that the tests can import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from schemas.catalog import TableSpec

EXAMPLES = 3  # differing rows shown per table
VALUE_CHARS = 60  # longest value printed in an example

_INTEGERS = {8: "TINYINT", 16: "SMALLINT", 32: "INTEGER", 64: "BIGINT"}


def quoted(name: str) -> str:
    """A DuckDB identifier (``group`` and ``offset`` are keywords)."""
    return '"' + name.replace('"', '""') + '"'


def canonical(expr: str, kind: pa.DataType, depth: int = 0) -> str:
    """The SQL of ``expr`` (a value of Arrow type ``kind``) in the comparable form: scalars cast to
    the type, structs rebuilt field by field (a null struct stays null), lists element by element in
    order, maps as their entries sorted by key then value.

    Raises:
        ValueError: a type no catalog table uses (floats, timestamps, ...).
    """
    if pa.types.is_integer(kind):
        return f"CAST({expr} AS {'U' if pa.types.is_unsigned_integer(kind) else ''}{_INTEGERS[kind.bit_width]})"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return f"CAST({expr} AS VARCHAR)"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return f"CAST({expr} AS BLOB)"
    if pa.types.is_boolean(kind):
        return f"CAST({expr} AS BOOLEAN)"
    element = f"x{depth}"
    if pa.types.is_map(kind):
        entry = (
            f"{{'key': {canonical(f'{element}.key', kind.key_type, depth + 1)}, "
            f"'value': {canonical(f'{element}.value', kind.item_type, depth + 1)}}}"
        )
        return f"list_sort(list_transform(map_entries({expr}), lambda {element}: {entry}))"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list_transform({expr}, lambda {element}: {canonical(element, kind.value_type, depth + 1)})"
    if pa.types.is_struct(kind):
        fields = ", ".join(
            f"{_literal(f.name)}: {canonical(f'struct_extract({expr}, {_literal(f.name)})', f.type, depth)}"
            for f in kind
        )
        return f"CASE WHEN {expr} IS NULL THEN NULL ELSE {{{fields}}} END"
    raise ValueError(f"no comparable form for {kind}")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def delta_relation(con: duckdb.DuckDBPyConnection, name: str, table_dir: Path) -> str:
    """Register the latest snapshot of the Delta table at ``table_dir`` (partition values from its
    log) as ``name``; ``name``."""
    con.register(name, DeltaTable(str(table_dir)).to_pyarrow_dataset())
    return name


@dataclass
class TableCheck:
    """The comparison of one job table with the peer's result."""

    table: str
    columns: tuple[str, ...]
    job_rows: int
    peer_rows: int
    only_job: int = 0  # rows of the job's table the peer's result lacks (duplicates counted)
    only_peer: int = 0  # and the other way
    unpaired_job: int = 0  # of those, rows whose key the other side's leftover rows lack
    unpaired_peer: int = 0
    differing: dict[str, int] = field(default_factory=dict)  # column -> pairs (same key) differing in it
    examples: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # what was left out -> why
    perturbed: str | None = None
    missing: tuple[str, ...] = ()  # columns the peer's result lacks (compared as nulls)

    @property
    def same(self) -> bool:
        """Whether both sides hold the same rows, and the peer every column."""
        return self.only_job == 0 and self.only_peer == 0 and not self.missing

    def differences(self) -> list[str]:
        """What differs, short: ``table.column`` per differing column, then rows without a partner."""
        if self.same:
            return []
        found = [f"{self.table}.{c} (not in the peer's result)" for c in self.missing]
        found += [f"{self.table}.{c}" for c in self.differing if c not in self.missing]
        if self.unpaired_job or self.unpaired_peer:
            found.append(
                f"{self.table} rows ({self.unpaired_job} only in the job's, {self.unpaired_peer} only in the peer's)"
            )
        return found or [f"{self.table} rows (every column agrees within pairs; keys repeat)"]

    def summary(self) -> str:
        """One line: the outcome, the rows and columns compared, what was left out."""
        verdict = "same" if self.same else "DIFFERS: " + ", ".join(self.differences())
        rows = (
            f"{self.job_rows:,} rows"
            if self.job_rows == self.peer_rows
            else f"{self.job_rows:,} vs {self.peer_rows:,} rows"
        )
        line = f"{self.table}: {verdict} ({rows}, {len(self.columns)} columns)"
        if self.skipped:
            line += "; not compared: " + "; ".join(f"{what} ({why})" for what, why in self.skipped.items())
        if self.perturbed:
            line += f"; peer perturbed: {self.perturbed}"
        return line


@dataclass
class PeerOutcome:
    """A peer's seconds and the comparison of each table it computed with the job's."""

    seconds: float
    checks: list[TableCheck]
    not_computed: dict[str, str] = field(default_factory=dict)  # job tables the peer does not compute -> why

    @property
    def same(self) -> bool:
        """Whether every table the peer computed equals the job's."""
        return all(check.same for check in self.checks)

    def differences(self) -> list[str]:
        """The differing columns (and rows) of every table."""
        return [d for check in self.checks for d in check.differences()]

    def note(self) -> str:
        """The table's note: the tables compared, or why the peer differs."""
        if not self.same:
            return "peer differs: " + ", ".join(self.differences())
        tables = ", ".join(f"{c.table} ({c.job_rows:,} rows)" for c in self.checks)
        return f"peer same on every column: {tables}"

    def lines(self) -> list[str]:
        """Every table's summary, examples of differing rows and the tables not computed."""
        lines: list[str] = []
        for check in self.checks:
            lines.append(check.summary())
            lines.extend(f"    {example}" for example in check.examples)
        lines.extend(f"{table}: not computed by the peer ({why})" for table, why in self.not_computed.items())
        return lines


def compare(
    con: duckdb.DuckDBPyConnection,
    spec: TableSpec,
    job: str,
    peer: str,
    key: Sequence[str],
    skip_columns: Mapping[str, str] | None = None,
    skip_rows: Mapping[str, str] | None = None,
    perturb: str | None = None,
) -> TableCheck:
    """Compare every column of ``spec`` between two DuckDB relations.

    Args:
        job, peer: relations (a registered name, or a table function such as ``read_parquet(...)``)
            with at least ``spec``'s columns not in ``skip_columns``, by name; other columns are ignored.
        key: the columns that pair a row of one side with its counterpart on the other, to say
            which columns differ (the verdict needs no key).
        skip_columns: columns left out (the peer cannot compute them faithfully) -> why.
        skip_rows: SQL predicates over ``spec``'s columns; rows of either side matching one are
            left out (the peer cannot compute them) -> why.
        perturb: a column to change in one row of the peer's result before comparing (to show
            that a difference is caught): +1 for a number, a ``*`` appended to a string, negated
            for a boolean, null for anything else.
    """
    skipped_columns = dict(skip_columns or {})
    unknown = set(skipped_columns) - set(spec.column_names)
    if unknown:
        raise ValueError(f"{spec.name} has no columns {sorted(unknown)}")
    columns = tuple(c for c in spec.column_names if c not in skipped_columns)
    types = {c.name: c.type for c in spec.columns}
    present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {peer}").fetchall()}
    missing = tuple(c for c in columns if c not in present)
    select = ", ".join(f"{canonical(quoted(c), types[c])} AS {quoted(c)}" for c in columns)
    where = " AND ".join(f"NOT coalesce(({p}), false)" for p in (skip_rows or {})) or "true"
    base = f"_cmp_{spec.name}"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {base}_job AS SELECT {select} FROM {job} WHERE {where}")
    if missing:  # the peer's rows get the columns they lack as nulls of the job's types, and differ
        kinds = {row[0]: row[1] for row in con.execute(f"DESCRIBE {base}_job").fetchall()}
        nulls = ", ".join(f"NULL::{kinds[c]} AS {quoted(c)}" for c in missing)
        peer = f"(SELECT *, {nulls} FROM {peer})"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {base}_peer AS SELECT {select} FROM {peer} WHERE {where}")
    perturbed = _perturb(con, f"{base}_peer", perturb, types) if perturb else None
    check = TableCheck(
        spec.name,
        columns,
        _count(con, f"{base}_job"),
        _count(con, f"{base}_peer"),
        skipped={
            **{f"column {c}": why for c, why in skipped_columns.items()},
            **{f"rows where {p}": why for p, why in (skip_rows or {}).items()},
        },
        perturbed=perturbed,
        missing=missing,
    )
    listed = ", ".join(quoted(c) for c in columns)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {base}_dj AS "
        f"SELECT {listed} FROM {base}_job EXCEPT ALL SELECT {listed} FROM {base}_peer"
    )
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {base}_dp AS "
        f"SELECT {listed} FROM {base}_peer EXCEPT ALL SELECT {listed} FROM {base}_job"
    )
    check.only_job, check.only_peer = _count(con, f"{base}_dj"), _count(con, f"{base}_dp")
    if not check.same:
        _explain(con, check, base, [k for k in key if k in columns])
    for suffix in ("job", "peer", "dj", "dp"):
        con.execute(f"DROP TABLE IF EXISTS {base}_{suffix}")
    return check


def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def _perturb(con: duckdb.DuckDBPyConnection, table: str, column: str, types: Mapping[str, pa.DataType]) -> str:
    """Change ``column`` in the first row of ``table``; what was changed."""
    kind = types[column]
    name = quoted(column)
    if pa.types.is_integer(kind):
        changed = f"coalesce({name}, 0) + 1"
    elif pa.types.is_string(kind):
        changed = f"coalesce({name}, '') || '*'"
    elif pa.types.is_boolean(kind):
        changed = f"NOT coalesce({name}, false)"
    else:
        changed = "NULL"
    if not _count(con, table):
        return f"{column}: nothing to change, the peer's result is empty"
    con.execute(f"UPDATE {table} SET {name} = {changed} WHERE rowid = (SELECT min(rowid) FROM {table})")
    return f"{column} changed in one row"


def _explain(con: duckdb.DuckDBPyConnection, check: TableCheck, base: str, key: list[str]) -> None:
    """Fill in the differing columns, unpaired rows and examples of a check that differs: the rows
    each side has and the other lacks are paired by ``key``; without a key, or when paired rows
    agree on every column (a key that repeats), the columns whose values alone differ."""
    dj, dp = f"{base}_dj", f"{base}_dp"
    on = " AND ".join(f"j.{quoted(k)} IS NOT DISTINCT FROM p.{quoted(k)}" for k in key) or "false"
    values = [c for c in check.columns if c not in key]
    counts = "".join(f", count(*) FILTER (WHERE j.{quoted(c)} IS DISTINCT FROM p.{quoted(c)})" for c in values)
    row = con.execute(f"SELECT count(*){counts} FROM {dj} j JOIN {dp} p ON {on}").fetchone() or (0,)
    check.differing = {c: int(n) for c, n in zip(values, row[1:], strict=True) if n}
    alone = {
        side: f"SELECT * FROM {table} j WHERE NOT EXISTS (SELECT 1 FROM {other} p WHERE {on})"
        for side, table, other in (("job's", dj, dp), ("peer's", dp, dj))
    }
    check.unpaired_job, check.unpaired_peer = (_scalar(con, f"SELECT count(*) FROM ({sql})") for sql in alone.values())
    if row[0] and not check.differing:
        check.differing = _column_multisets(con, check.columns, dj, dp)
    both = ", ".join([*(f"j.{quoted(c)}" for c in check.columns), *(f"p.{quoted(c)}" for c in check.columns)])
    for pair in con.execute(f"SELECT {both} FROM {dj} j JOIN {dp} p ON {on} LIMIT {EXAMPLES}").fetchall():
        job_row = dict(zip(check.columns, pair[: len(check.columns)], strict=True))
        peer_row = dict(zip(check.columns, pair[len(check.columns) :], strict=True))
        changed = [c for c in check.columns if job_row[c] != peer_row[c]]
        where = ", ".join(f"{k}={_shown(job_row[k])}" for k in key)
        check.examples.append(
            f"at {where}: " + "; ".join(f"{c} job {_shown(job_row[c])} peer {_shown(peer_row[c])}" for c in changed)
        )
    for side, sql in alone.items():
        shown = max(0, EXAMPLES - len(check.examples))
        for cells in con.execute(f"{sql} LIMIT {shown}").fetchall() if shown else []:
            text = ", ".join(f"{c}={_shown(v)}" for c, v in zip(check.columns, cells, strict=True))
            check.examples.append(f"only in the {side}: {text}")


def _column_multisets(con: duckdb.DuckDBPyConnection, columns: Sequence[str], dj: str, dp: str) -> dict[str, int]:
    """The columns whose values, taken alone, differ between the leftover rows of both sides."""
    differing = {}
    for column in columns:
        c = quoted(column)
        n = _scalar(
            con,
            f"SELECT count(*) FROM (SELECT {c} FROM {dj} EXCEPT ALL SELECT {c} FROM {dp}"
            f" UNION ALL (SELECT {c} FROM {dp} EXCEPT ALL SELECT {c} FROM {dj}))",
        )
        if n:
            differing[column] = n
    return differing


def _scalar(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."
