"""`hetbench compare BASE CURRENT`: is CURRENT slower than BASE, and can we tell?

BASE and CURRENT are each a run directory, a suite's results folder or a results folder of
suites. Exit status: 0 no regression, 1 regression, 3 inconclusive, 2 usage or harness
error. Statistics: analysis/tables/compare.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from hetbench.harness.cli import gate_report, launches
from hetbench.harness.cli.statistics import (
    add_statistics_arguments,
    paired_settings,
    plain,
    settings_from,
)

EPILOG = """\
One value per run and metric (median step time, samples/s, idle fraction; per worker:
median and CV of compute, the median of each phase). Runs, i.e. separate launches, are the unit of
replication, not steps: steps of one run are autocorrelated and share that launch's fate.
Per metric: ratio of medians CURRENT/BASE with a bootstrap 95% interval, two-sided
Mann-Whitney U test, Holm-corrected over all metrics compared. regressed = significant AND
worse by more than the threshold; improved = the mirror; unchanged = the ratio's
interval lies inside the threshold band (an equivalence test); inconclusive = beyond the
threshold but not significant, an interval reaching beyond the band, or too few runs for
p < alpha to be reachable at all
(with the default alpha: 7 runs per side for 1-3 metrics, 8 for 4-12, 9 for 13-48, 10 for
49-184; a two-worker run has 34 metrics). Exit status: 0 no regression, 1 regression,
3 inconclusive, 2 usage or harness error."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("base", type=Path, metavar="BASE",
                        help="run directory or results folder of the reference")
    parser.add_argument("current", type=Path, metavar="CURRENT",
                        help="run directory or results folder under test")
    parser.add_argument("--paired", action="store_true",
                        help="pair each BASE run with the CURRENT run that started nearest "
                             "it, as "
                             "`hetbench ci`'s rounds, and judge the gate metrics on the "
                             "rounds' ratios (every launch read, as --pool-launches)")
    add_statistics_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from hetbench.analysis.tables.compare import compare_runs
    from hetbench.harness.records.results import choose_launches, finished_runs, mixed_suites_note

    choice = launches.choice(args)
    if args.paired and choice.pattern is None:
        choice = dataclasses.replace(choice, pool=True)  # the rounds are separate launches
    base = choose_launches(finished_runs([args.base]), choice, f"BASE {args.base}")
    current = choose_launches(finished_runs([args.current]), choice,
                              f"CURRENT {args.current}")
    if args.paired:
        return paired(args, base, current)
    settings = settings_from(args)
    # Runs match by suite and run name, so suites are compared apart; still worth a line.
    mixed_suites_note([f"BASE {args.base}", f"CURRENT {args.current}"],
                      [r.suite for r in base + current], "compared suite by suite")
    comparison = compare_runs(base, current, settings)
    report(comparison, args.base, args.current, args.json, args.show_all)
    return int(comparison.exit_status)


def paired(args: argparse.Namespace, base: list[Any], current: list[Any]) -> int:
    from hetbench.analysis.tables.paired import GATE_METRICS, compare_paired

    comparison = compare_paired(base, current, paired_settings(args, ",".join(GATE_METRICS)))
    gate_report.report(comparison, args.base, args.current, args.json, args.show_all)
    return int(comparison.exit_status)


def report(comparison: Any, base: Path, current: Path, as_json: bool,
           show_all: bool = False) -> None:
    if as_json:
        print(json.dumps(to_json(comparison, base, current), indent=2))
    else:
        print(format_table(comparison, base, current, show_all))


def to_json(comparison: Any, base: Path, current: Path) -> dict[str, Any]:
    s = comparison.settings
    return {
        "verdict": comparison.verdict,
        "exit_status": comparison.exit_status,
        "base": str(base),
        "current": str(current),
        "alpha": s.alpha,
        "correction": "holm",
        "threshold": s.threshold,
        "metric_thresholds": dict(s.metric_thresholds),
        "metrics_compared": len(comparison.table),
        "min_repeats_per_side": comparison.min_repeats,
        "repeats": {"base": comparison.repeats_base, "current": comparison.repeats_current},
        "warnings": comparison.warnings,
        # worker is null for metrics of the whole run
        "metrics": [{k: None if k == "worker" and v < 0 else plain(v) for k, v in row.items()}
                    for row in comparison.table.to_dict(orient="records")],
    }


HEADER = ("run", "worker", "metric", "better", "n", "base", "current", "ratio", "95% CI",
          "p (Holm)", "verdict")


def format_table(comparison: Any, base: Path, current: Path, show_all: bool = False) -> str:
    """The answer first (the verdict, and whether the runs could give one at all), then the
    metrics that changed or could not be shown unchanged, largest change first; with
    `show_all`, the unchanged ones after them."""
    import pandas as pd

    table = comparison.table
    s = comparison.settings
    counts = {v: int((table["verdict"] == v).sum()) for v in
              ("regressed", "improved", "inconclusive", "unchanged")}
    lines = [
        f"verdict: {comparison.verdict.upper()} "
        f"({', '.join(f'{n} {v}' for v, n in counts.items())} of {len(table)} metrics); "
        f"threshold {s.threshold:g}, p < {s.alpha:g} family-wise (Holm over {len(table)}); "
        f"runs per side BASE {comparison.repeats_base}, CURRENT {comparison.repeats_current}, "
        f"at least {comparison.min_repeats} needed",
        f"BASE {base}  vs  CURRENT {current}"]
    lines += [f"warning: {w}" for w in comparison.warnings]
    changed = table[table["verdict"] != "unchanged"]
    order = changed.assign(size=_change_size(changed["ratio"])).sort_values(
        "size", ascending=False, kind="stable")
    shown = pd.concat([order, table[table["verdict"] == "unchanged"]]) if show_all else order
    if shown.empty:
        lines.append("no metric changed beyond the threshold (--all lists them)")
        return "\n".join(lines)
    rows = [HEADER]
    for r in shown.itertuples(index=False):
        interval = (f"{_num(r.ci_low, 3)}-{_num(r.ci_high, 3)}"
                    if math.isfinite(r.ci_low) and math.isfinite(r.ci_high) else "-")
        rows.append((
            f"{r.suite}/{r.run}", "-" if r.worker < 0 else str(r.worker), r.metric, r.better,
            f"{r.n_base}/{r.n_current}", _num(r.base_median), _num(r.current_median),
            _num(r.ratio, 3), interval, f"{r.p_adjusted:.2g}",
            r.verdict + (f" ({r.note})" if r.note else ""),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
                     + "  " + row[-1])
    if not show_all and counts["unchanged"]:
        lines.append(f"({counts['unchanged']} unchanged metrics not listed: --all lists them)")
    return "\n".join(lines)


def _change_size(ratios: Any) -> Any:
    """How far from 1 a ratio is, either way (1.25 and 0.8 alike); NaN last."""
    import numpy as np

    return np.abs(np.log(ratios.astype(float))).fillna(-1.0)


def _num(value: float, digits: int = 4) -> str:
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    return f"{value:.{digits}g}"
