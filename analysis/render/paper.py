"""A study's table for a paper: one row per configuration (a run of the suite), the
headline metrics as mean ± 95% t half-interval over its repeats, written as Markdown and as
LaTeX (booktabs). `hetbench paper` writes it beside every figure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from hetbench.analysis.render.report import markdown_table
from hetbench.analysis.tables import registry
from hetbench.analysis.tables.runs import group_table, runs_table
from hetbench.harness.records.results import Run

# the headline metrics (hetbench.analysis.tables.registry gives each its heading, format and
# definition)
PAPER_METRICS = ("samples_per_s", "mean_step_ms", "idle_fraction", "compute_cv_max",
                 "efficiency", "oracle_efficiency")


def _cell(row: pd.Series | None, fmt: str) -> str:
    """mean ± half-interval; the mean alone for one repeat; empty without a value."""
    if row is None or not math.isfinite(row["mean"]):
        return ""
    if not math.isfinite(row["ci_high"]):
        return format(row["mean"], fmt)
    half = float(f"{row['ci_high'] - row['mean']:.2g}")  # two significant digits, as 150
    return f"{format(row['mean'], fmt)} ± {half:g}"


def study_table(runs: Sequence[Run]) -> pd.DataFrame:
    """A row per run name in the suite's order: its devices, repeats and PAPER_METRICS."""
    table = runs_table(runs)
    table = table[table["status"] == "completed"]
    if table.empty:
        return pd.DataFrame()
    groups = group_table(table, ("run",), PAPER_METRICS).set_index(["run", "metric"])
    rows = []
    for name, part in table.groupby("run", sort=False):
        row: dict[str, Any] = {"run": name, "devices": part["devices"].iloc[0],
                               "repeats": len(part)}
        for metric in (registry.BY_NAME[n] for n in PAPER_METRICS):
            key = (name, metric.name)
            row[metric.heading] = _cell(groups.loc[key] if key in groups.index else None,
                                        metric.fmt)
        rows.append(row)
    out = pd.DataFrame(rows)
    # a metric no run has (no standalone rates: no efficiency) is left out
    return out[[c for c in out.columns if (out[c] != "").any()]]


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}"}


def _latex_escape(text: str) -> str:
    escaped = "".join(LATEX_SPECIALS.get(c, c) for c in text)
    return escaped.replace("±", r"$\pm$")


def latex_table(table: pd.DataFrame, caption: str) -> str:
    """A booktabs table environment (needs \\usepackage{booktabs})."""
    align = "l" * 2 + "r" * (len(table.columns) - 2)
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(_latex_escape(str(c)) for c in table.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(_latex_escape(str(v)) for v in row) + r" \\"
              for row in table.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{_latex_escape(caption)}}}",
              r"\end{table}"]
    return "\n".join(lines) + "\n"


def caption(runs: Sequence[Run], table: pd.DataFrame) -> str:
    """What the table shows, with the definition of each of its metrics that needs one."""
    suites = sorted({run.manifest.get("suite", {}).get("name", "?") for run in runs})
    defined = [f"{m.heading}: {m.definition}" for m in (registry.BY_NAME[n] for n in PAPER_METRICS)
               if m.heading in table.columns]
    return (f"Suite {', '.join(suites)}: mean ± 95% t half-interval over repeats, after "
            "warm-up. " + "; ".join(defined) + ("." if defined else ""))


def markdown(table: pd.DataFrame, text: str) -> str:
    return f"{markdown_table(table)}\n\n{text}\n"
