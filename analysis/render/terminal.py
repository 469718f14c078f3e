"""The report's summary for a terminal or a script: the headline first, then tables that fit
WIDTH columns (only the columns that hold a value; a table too wide is split into parts,
each repeating its key columns), or the same as JSON."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

WIDTH = 100
GAP = 2  # spaces between columns
INTERVAL = "±95%"  # a column "x ±95%" is x's half-interval: shown as "x ± half"


@dataclass(frozen=True)
class Table:
    """One topic's table; `keys`: the columns that name a row (repeated in every part)."""

    title: str
    frame: pd.DataFrame
    keys: tuple[str, ...] = ("run",)


@dataclass
class Summary:
    headline: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)

    def add(self, table: Table) -> None:
        if not table.frame.empty:
            self.tables.append(table)


def cell(value: Any) -> str:
    """A number in 3 significant digits, a missing value blank."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def with_values(frame: pd.DataFrame) -> pd.DataFrame:
    """Without the columns where no row has a value."""
    keep = [c for c in frame.columns if any(cell(v) for v in frame[c])]
    return frame[keep]


def fit(table: Table, width: int = WIDTH) -> list[str]:
    """The table as text lines no wider than `width`: its columns with values, split into
    parts that each repeat the key columns; a cell wider than the width is cut with '…'."""
    frame = with_values(table.frame)
    text = {c: [cell(v) for v in frame[c]] for c in frame.columns}
    for column in [c for c in frame.columns if f"{c} {INTERVAL}" in text]:  # "mean ± half"
        half = text.pop(f"{column} {INTERVAL}")
        text[column] = [f"{m} ± {h}" if h else m for m, h in zip(text[column], half,
                                                                   strict=True)]
    frame = frame[list(text)]
    natural = {c: max(len(str(c)), *(len(v) for v in text[c])) for c in frame.columns}
    keys = [c for c in table.keys if c in frame.columns]
    left = keys + [c for c in frame.columns if c not in keys and not _numeric(frame[c])]
    rest = [c for c in frame.columns if c not in keys]
    widths = {c: min(width // 2, natural[c]) for c in keys}
    key_width = sum(widths[c] + GAP for c in keys)
    widths |= {c: min(width - key_width, natural[c]) for c in rest}
    parts: list[list[str]] = []
    for column in rest:
        used = key_width + sum(widths[c] + GAP for c in parts[-1]) if parts else width + 1
        if used + widths[column] > width:
            parts.append([])
        parts[-1].append(column)
    lines = [table.title]
    for i, part in enumerate(parts or [[]]):
        columns = keys + part
        if i:
            lines.append("")
        aligned = [(widths[c], c in left) for c in columns]
        lines.append(_row([str(c) for c in columns], aligned))
        lines += [_row([text[c][r] for c in columns], aligned) for r in range(len(frame))]
    return lines


def _row(values: list[str], aligned: list[tuple[int, bool]]) -> str:
    """Cells padded to their column's width: text left-aligned, numbers right-aligned."""
    out = []
    for value, (w, left) in zip(values, aligned, strict=True):
        value = value if len(value) <= w else value[: w - 1] + "…"
        out.append(value.ljust(w) if left else value.rjust(w))
    return (" " * GAP).join(out).rstrip()


def _numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def render(summary: Summary, width: int = WIDTH) -> str:
    lines: list[str] = []
    for line in summary.headline:
        lines += textwrap.wrap(line, width, subsequent_indent="  ") or [""]
    for table in summary.tables:
        lines += ["", *fit(table, width)]
    return "\n".join(lines)


def as_data(summary: Summary) -> dict[str, Any]:
    """The same summary for scripts (json.dumps it): the headline, and each table's rows
    with every column, numbers unformatted, a missing value None."""
    def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
        return [{str(k): _plain(v) for k, v in row.items()}
                for row in frame.to_dict(orient="records")]

    return {"headline": summary.headline,
            "tables": [{"title": t.title, "keys": list(t.keys), "rows": records(t.frame)}
                       for t in summary.tables]}


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
