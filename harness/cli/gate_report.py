"""How `hetbench ci` and `hetbench compare --paired` print a paired comparison
(analysis/tables/paired.py): the verdict first, with where the change is and, when it
cannot tell, how many rounds it would need; then the rows."""

from __future__ import annotations

import json
import math
from typing import Any

from hetbench.analysis.tables.paired import MOST_ROUNDS_PLANNED
from hetbench.harness.cli.statistics import plain

HEADER = ("run", "worker", "metric", "role", "pairs", "base", "current", "ratio", "95% CI",
          "verdict")


def headline(comparison: Any) -> list[str]:
    """The verdict, where, and what the wall clock and the machine did."""
    c = comparison
    s = c.settings
    verdict = c.verdict.upper()
    gate = ", ".join(s.gate)
    if c.verdict == "regressed" or c.verdict == "improved":
        head = f"verdict: {verdict} after {c.rounds} round(s)"
    elif c.verdict == "unchanged":
        head = (f"verdict: UNCHANGED after {c.rounds} round(s): every gate metric ({gate}) "
                f"within {s.threshold:.0%} either way")
    else:
        need = (f"more than {MOST_ROUNDS_PLANNED}" if c.rounds_needed is None
                else f"about {c.rounds_needed}")
        head = (f"verdict: INCONCLUSIVE after {c.rounds} round(s): at this spread the gate "
                f"metrics ({gate}) would need {need} rounds for a claim")
    lines = [head + f" (paired rounds, {1 - s.alpha:.0%} family-wise)"]
    moved = c.moved()
    if moved:
        lines.append("moved: " + "; ".join(moved))
    felt = c.table[(c.table["role"] == "felt") & (c.table["worker"] < 0)]
    if len(felt):
        lines.append("felt: " + "; ".join(
            f"{r.run} {r.metric} x{r.ratio:.3g} [{_num(r.ci_low)}, {_num(r.ci_high)}] "
            f"{r.verdict}" for r in felt.itertuples(index=False)))
    delayed = c.delayed
    if any(math.isfinite(v) for v in delayed.values()):
        lines.append("steps delayed by a wait for a CPU (over 10% of their compute): "
                     + ", ".join(f"{side.upper()} {_share(v)}" for side, v in delayed.items()))
    return lines


def format_table(comparison: Any, show_all: bool = False) -> str:
    """headline(), warnings, then the gate and felt rows and (with show_all) every row."""
    table = comparison.table
    lines = headline(comparison) + [f"warning: {w}" for w in comparison.warnings]
    shown = table if show_all else table[(table["role"] != "shown")
                                         | (table["verdict"].isin(["regressed", "improved"]))]
    if shown.empty:
        return "\n".join(lines)
    rows = [HEADER]
    for r in shown.itertuples(index=False):
        interval = (f"{_num(r.ci_low)}-{_num(r.ci_high)}"
                    if math.isfinite(r.ci_low) and math.isfinite(r.ci_high) else "-")
        planned = _rounds(r.rounds_needed)
        note = "; ".join(filter(None, [r.note, planned and f"~{planned} rounds"]))
        rows.append((r.run, "-" if r.worker < 0 else str(r.worker), r.metric, r.role,
                     str(r.pairs), _num(r.base_median, 4), _num(r.current_median, 4),
                     _num(r.ratio), interval, r.verdict + (f" ({note})" if note else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
              + "  " + row[-1] for row in rows]
    if not show_all:
        lines.append(f"({len(table) - len(shown)} more rows, the phases and the exchange: "
                     "--all lists them)")
    return "\n".join(lines)


def report(comparison: Any, base: Any, current: Any, as_json: bool,
           show_all: bool = False) -> None:
    """The comparison on stdout: JSON, or the table."""
    if as_json:
        print(json.dumps(to_json(comparison, base, current), indent=2))
    else:
        print(format_table(comparison, show_all))


def to_json(comparison: Any, base: Any, current: Any) -> dict[str, Any]:
    c = comparison
    return {
        "verdict": c.verdict, "exit_status": c.exit_status, "paired": True,
        "base": str(base), "current": str(current), "rounds": c.rounds,
        "rounds_needed": c.rounds_needed, "alpha": c.settings.alpha,
        "correction": "bonferroni over the gate rows", "threshold": c.settings.threshold,
        "gate": list(c.settings.gate), "felt": list(c.settings.felt), "moved": c.moved(),
        "delayed_steps": {k: plain(v) for k, v in c.delayed.items()},
        "warnings": c.warnings,
        "metrics": [{k: None if k == "worker" and v < 0 else plain(v) for k, v in row.items()}
                    for row in c.table.to_dict(orient="records")],
    }


def _rounds(value: Any) -> str:
    """A row's planned rounds ('' where none: a claim made, or more than any plan)."""
    return str(int(value)) if value is not None and math.isfinite(value) else ""


def _num(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}" if math.isfinite(value) else "-"


def _share(value: float) -> str:
    return f"{value:.0%}" if math.isfinite(value) else "not counted"
