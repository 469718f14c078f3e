"""A history of regression gates: a slowdown that creeps in a few percent a commit.

Each gate (`hetbench ci --history DIR`) sees its commit against its parent only, and a 3%
slowdown is within any gate's threshold; ten of them are 34%. So every gate keeps, per
commit, what it measured of each gate metric: the mean log ratio of its paired rounds and
its interval's half-width (analysis/tables/paired.py). The gates whose commits follow one
another (each gate's base the commit the gate before it judged) form a chain; over the
last k of them (k = 2 .. `last`), the log ratios add and their half-widths add in
quadrature (independent gates), widened for the k - 1 windows looked at (Bonferroni, by
normal quantiles). A window whose sum is clear of 0 and beyond the threshold is a drift:
`regressed` (or `improved`) since the window's first commit.

The history is a folder of JSON files, one per gate (`<UTC time>-<commit>.json`), which a
CI job keeps between runs (a cache, an artifact, a branch).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.analysis.tables.compare import LOWER
from hetbench.analysis.tables.paired import GATE, PairedComparison

SCHEMA = 1
DEFAULT_LAST = 10  # the gates a window may reach back over
COLUMNS = ["run", "worker", "metric", "gates", "since", "ratio", "ci_low", "ci_high",
           "threshold", "verdict"]


def entry(comparison: PairedComparison, commit: str, base: str, suite: str,
          dirty: bool) -> dict[str, Any]:
    """What one gate keeps: its commits, verdict and each gate row's log ratio and
    half-width."""
    rows = []
    gating = comparison.table[comparison.table["role"] == GATE]
    level = 1 - comparison.settings.alpha / max(1, len(gating))  # each row's (paired.py)
    for r in gating.itertuples(index=False):
        if not (r.ratio > 0 and r.ci_low > 0 and r.ci_high > 0):
            continue
        rows.append({"run": r.run, "worker": int(r.worker), "metric": r.metric,
                     "better": r.better, "pairs": int(r.pairs),
                     "log_ratio": math.log(r.ratio),
                     "half_width": (math.log(r.ci_high) - math.log(r.ci_low)) / 2,
                     "threshold": float(r.threshold), "level": level})
    return {"schema": SCHEMA, "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": commit, "dirty": dirty, "base": base, "suite": suite,
            "verdict": comparison.verdict, "rows": rows}


def write_entry(folder: Path, kept: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = kept["time"].replace(":", "").replace("-", "").split("+")[0]
    path = folder / f"{stamp}-{kept['commit'][:12]}.json"
    path.write_text(json.dumps(kept, indent=1) + "\n")
    return path


def read_history(folder: Path) -> list[dict[str, Any]]:
    """The gates kept in `folder`, oldest first (unreadable or foreign files skipped)."""
    entries = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(kept, dict) and kept.get("schema") == SCHEMA:
            entries.append(kept)
    return sorted(entries, key=lambda e: str(e.get("time", "")))


def chain(entries: list[dict[str, Any]], suite: str, last: int) -> list[dict[str, Any]]:
    """The newest gate of `suite` and, going back, each gate whose commit was the base of
    the one after it (a commit gated twice: its newest gate), at most `last`, oldest first.
    A gate of a dirty tree ends the chain: its code is no commit."""
    newest: dict[str, dict[str, Any]] = {}
    for kept in entries:
        if kept.get("suite") == suite:
            newest[str(kept["commit"])] = kept  # oldest first: the newest stays
    ordered = [e for e in entries if e.get("suite") == suite]
    if not ordered:
        return []
    out = [ordered[-1]]
    while len(out) < last:
        previous = newest.get(str(out[-1]["base"]))
        if previous is None or previous.get("dirty") or previous in out:
            break
        out.append(previous)
    return out[::-1]


def drift(gates: list[dict[str, Any]]) -> pd.DataFrame:
    """Per gate metric row and window of the last k >= 2 gates of the chain: the summed
    ratio, its interval and its verdict (COLUMNS)."""
    rows = []
    windows = max(1, len(gates) - 1)
    for newest in (gates[-1]["rows"] if gates else []):
        key = (newest["run"], newest["worker"], newest["metric"])
        # back from the newest gate, each gate's row of this metric, to the first that
        # did not measure it
        series: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for gate in reversed(gates):
            match = [r for r in gate["rows"] if (r["run"], r["worker"], r["metric"]) == key]
            if not match:
                break
            series.insert(0, (gate, match[0]))
        for k in range(2, len(series) + 1):
            window = series[-k:]
            # each half-width is at its gate's level; widened for the windows looked at
            total = sum(r["log_ratio"] for _, r in window)
            half = math.sqrt(sum((r["half_width"] * _widen(r["level"], windows)) ** 2
                                 for _, r in window))
            threshold = float(newest["threshold"])
            rows.append({"run": key[0], "worker": key[1], "metric": key[2], "gates": k,
                         "since": str(window[0][0]["base"]),
                         "ratio": math.exp(total), "ci_low": math.exp(total - half),
                         "ci_high": math.exp(total + half), "threshold": threshold,
                         "verdict": _verdict(total, half, newest["better"], threshold)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _widen(level: float, windows: int) -> float:
    from scipy.stats import norm

    return float(norm.ppf(1 - (1 - level) / (2 * windows)) / norm.ppf(1 - (1 - level) / 2))


def _verdict(total: float, half: float, better: str, threshold: float) -> str:
    worse = total if better == LOWER else -total
    limit = math.log1p(threshold)
    if worse - half > 0 and worse > limit:
        return "regressed"
    if worse + half < 0 and worse < -limit:
        return "improved"
    return "no drift shown"


def findings(table: pd.DataFrame) -> list[str]:
    """One line per gate metric row that drifted worse: its widest regressed window."""
    lines = []
    worse = table[table["verdict"] == "regressed"]
    for (run, worker, metric), rows in worse.groupby(["run", "worker", "metric"], sort=True):
        r = rows.sort_values("gates").iloc[-1]
        lines.append(f"{run}{'' if worker < 0 else f' worker {worker}'}: {metric} "
                     f"{(r.ratio - 1) * 100:+.1f}% [{(r.ci_low - 1) * 100:+.1f}%, "
                     f"{(r.ci_high - 1) * 100:+.1f}%] over the last {r.gates} gates (since "
                     f"{r.since[:12]})")
    return lines
