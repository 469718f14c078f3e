"""`hetbench explain`'s measures and what it writes: each run's step time, cost of
variability, idle before the all-reduce, step p99/p50 and straggler excess by cause; each
intervention set against the recorded configuration run beside it (the same repeat, the
runs interleaved), with 95% intervals over the repeats; explain.md, explain.csv and
figures/explain.png."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.advice.interventions import Intervention, Plan

RECORDED = "recorded"  # the run name of the recorded configuration in the explain suite
AGREEMENT = 0.10  # measured reduction this near the predicted share agrees with it
RESOLVED = 0.25  # a measured reduction whose interval is wider either side says nothing
MEASURES = ("step_ms", "cost_of_variability", "idle_fraction", "step_p99_p50", "lost",
            "excess_per_step_ms")
SHOWN = {"step_ms": ("step (ms)", ".2f"), "cost_of_variability": ("cost of variability", ".1%"),
         "idle_fraction": ("idle before all-reduce", ".1%"),
         "step_p99_p50": ("step p99/p50", ".2f"), "lost": ("lost", ".1%"),
         "excess_per_step_ms": ("straggler excess (ms a step)", ".2f")}


def run_measures(run: Any) -> dict[str, Any]:
    """One recorded run's measures: MEASURES, excess_ms (the attribution's straggler
    excess) and cause_ms (each cause's part of it); excess_per_step_ms: the time the
    stragglers lost a step, as the attribution splits it (not over the median step: a cause
    present in every step, a starved loader, makes the median step itself longer); `lost`
    the time lost from the clocks alone: (mean step - median step) / median step."""
    from hetbench.analysis.measures.stragglers import attribute, cause_shares
    from hetbench.analysis.measures.whatif import costs, what_if
    from hetbench.analysis.view.metrics import (
        after_warmup,
        complete_steps,
        run_summary,
        with_derived,
    )

    d = with_derived(complete_steps(after_warmup(run.steps, run.warmup_steps)))
    summary = run_summary(d)
    per_step = d.groupby("step").agg(begin=("begin_ns", "min"), end=("end_ns", "max"))
    wall = (per_step["end"] - per_step["begin"]) / 1e6
    attribution = attribute(d, 0, None, None, run.manifest)
    pooled = cause_shares(attribution)
    pooled = pooled[pooled["rank"] == -1]
    return {
        "step_ms": float(wall.mean()),
        "step_p99_p50": float(wall.quantile(0.99) / wall.quantile(0.5)),
        "lost": float(wall.mean() / wall.median() - 1.0),
        "idle_fraction": float(summary["idle_fraction"]),
        "cost_of_variability": costs(what_if(d, 0, run.manifest))["cost_of_variability"],
        "excess_ms": float(attribution["excess_ms"].sum()),
        "excess_per_step_ms": float(attribution["excess_ms"].sum() / max(len(wall), 1)),
        "cause_ms": dict(zip(pooled["cause"], pooled["excess_ms"].astype(float),
                             strict=True)),
    }


def pooled_shares(measures: list[dict[str, Any]]) -> dict[str, float]:
    """Each cause's share of the straggler excess of all the runs together."""
    total = sum(m["excess_ms"] for m in measures)
    causes = {c for m in measures for c in m["cause_ms"]}
    return {c: (sum(m["cause_ms"].get(c, 0.0) for m in measures) / total if total > 0
                else math.nan) for c in causes}


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """Mean and Student's 95% interval of `values` (one per repeat); NaN bounds for one."""
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    from scipy import stats

    half = float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1)
                 / math.sqrt(len(values)))
    return mean, mean - half, mean + half


def compared(rows: pd.DataFrame, plan: Plan) -> pd.DataFrame:
    """Per intervention, against the recorded configuration of the same repeat: the change
    of each measure, and the measured reduction of the time the stragglers lost (1 - its
    excess_per_step_ms / the recorded's) beside the share the attribution gave its cause over
    the recorded repeats (`predicted`), with 95% intervals over the repeats. `rows`: one
    per run and repeat, columns run, repeat, measures (run_measures) and MEASURES."""
    recorded = rows[rows["run"] == RECORDED].set_index("repeat")
    predicted = pooled_shares(list(recorded["measures"])) if len(recorded) else {}
    out = []
    for item in plan:
        if not isinstance(item, Intervention):
            continue
        mine = rows[rows["run"] == item.run.name].set_index("repeat")
        both = mine.index.intersection(recorded.index)
        row: dict[str, Any] = {"cause": item.cause, "intervention": item.name,
                               "what": item.what, "repeats": len(both),
                               "predicted": predicted.get(item.cause, math.nan)}
        for measure in MEASURES:
            change = mine.loc[both, measure].to_numpy(float) - \
                recorded.loc[both, measure].to_numpy(float)
            row[f"{measure}_change"], row[f"{measure}_low"], row[f"{measure}_high"] = \
                interval(change)
        lost = recorded.loc[both, "excess_per_step_ms"].to_numpy(float)
        kept = mine.loc[both, "excess_per_step_ms"].to_numpy(float)
        row["measured"], row["measured_low"], row["measured_high"] = interval(
            1.0 - np.divide(kept, lost, out=np.full_like(kept, np.nan), where=lost > 0))
        row["agrees"] = agrees(row["predicted"], row["measured"], row["measured_low"],
                               row["measured_high"])
        out.append(row)
    return pd.DataFrame(out)


def agrees(predicted: float, measured: float, low: float, high: float) -> bool | None:
    """The measured reduction within AGREEMENT of the predicted share, or its interval
    holding it; None where either was not measured or the interval is too wide to say
    (more than RESOLVED either side: more repeats or steps would)."""
    if not (math.isfinite(predicted) and math.isfinite(measured)):
        return None
    if math.isfinite(low) and (high - low) / 2 > RESOLVED:
        return None
    inside = math.isfinite(low) and low <= predicted <= high
    return bool(abs(measured - predicted) <= AGREEMENT or inside)


def plan_lines(plan: Plan, shares: dict[str, float]) -> list[str]:
    """A line per planned intervention or cause no key removes, with the recorded share."""
    lines = []
    for item in plan:
        share = shares.get(item.cause, math.nan)
        if isinstance(item, Intervention):
            lines.append(f"{item.cause} ({share:.0%} of the excess): {item.name}: {item.what}")
        else:
            lines.append(f"{item.cause} ({share:.0%} of the excess): no variant: {item.why}")
    return lines


def table(result: pd.DataFrame) -> str:
    """The terminal's table: one line per intervention."""
    head = (f"{'cause':<12} {'intervention':<13} {'predicted':>9} {'measured [95%]':>22} "
            f"{'step change':>12} {'cost of var.':>13} {'agrees':>6}")
    lines = [head, "-" * len(head)]
    for _, r in result.iterrows():
        measured = f"{r['measured']:.0%} [{_pct(r['measured_low'])}, {_pct(r['measured_high'])}]"
        lines.append(f"{r['cause']:<12} {r['intervention']:<13} {r['predicted']:>9.0%} "
                     f"{measured:>22} {r['step_ms_change']:>+10.2f}ms "
                     f"{r['cost_of_variability_change']:>+12.1%} {_yes(r['agrees']):>6}")
    return "\n".join(lines)


def _pct(value: float) -> str:
    return f"{value:.0%}" if math.isfinite(value) else "-"


def _yes(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else ("yes" if value else "no")


def write_explain(out: Path, result: pd.DataFrame, plan: Plan, recorded: Any,
                  shares: dict[str, float], rows: pd.DataFrame | None) -> None:
    """explain.md, explain.csv and (with measured rows) figures/explain.png in `out`."""
    from hetbench.analysis.render.figures import explain_figure

    name = recorded.name
    lines = [f"# Why {name}'s stragglers were late: each cause taken away", "",
             f"Recorded run: `{recorded.run_dir}` ({recorded.run_id}); the straggler excess "
             "by cause as the attribution gave it (all workers), and what takes each away:",
             "", *[f"- {line}" for line in plan_lines(plan, shares)], ""]
    if rows is not None and not result.empty:
        repeats = int(result["repeats"].max())
        lines += [f"Each variant ran beside the recorded configuration ({RECORDED}), the runs "
                  f"interleaved, {repeats} repeat{'s' * (repeats != 1)}. *predicted*: the "
                  "cause's share of the straggler excess in the recorded configuration's "
                  "repeats; *measured*: the reduction of the time its stragglers lost (their "
                  "excess over their typical compute, ms a step; 1 - "
                  "the variant's / the recorded's), the mean of the repeats with Student's "
                  "95% interval; *lost*, from the clocks alone, is the mean step above the "
                  "median step over the median step. They agree within "
                  f"{AGREEMENT:.0%} or where the interval holds the prediction; '-' where an "
                  f"interval wider than {RESOLVED:.0%} either side cannot say. The changes are "
                  "the variant's minus the recorded's.", "",
                  _markdown(result), ""]
        lines += ["![explain](figures/explain.png)", ""]
        explain_figure(result, out / "figures", f"hetbench explain: {name}")
    elif rows is None:
        lines += ["Nothing was run (no variant, or `--dry-run`).", ""]
    (out / "explain.md").write_text("\n".join(lines))
    result.to_csv(out / "explain.csv", index=False)


def _markdown(result: pd.DataFrame) -> str:
    head = ["cause", "intervention", "predicted", "measured [95%]",
            *[SHOWN[m][0] + " change" for m in MEASURES], "agrees"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in result.iterrows():
        cells = [r["cause"], f"{r['intervention']}: {r['what']}", f"{r['predicted']:.0%}",
                 f"{r['measured']:.0%} [{_pct(r['measured_low'])}, {_pct(r['measured_high'])}]"]
        for measure in MEASURES:
            fmt = SHOWN[measure][1]
            cells.append(f"{r[f'{measure}_change']:+{fmt}} "
                         f"[{_fmt(r[f'{measure}_low'], fmt)}, {_fmt(r[f'{measure}_high'], fmt)}]")
        cells.append(_yes(r["agrees"]))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def _fmt(value: float, fmt: str) -> str:
    return format(value, "+" + fmt) if math.isfinite(value) else "-"
