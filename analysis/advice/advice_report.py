"""What `hetbench advise` writes and prints (harness/cli/advise.py): the ranked table on the
terminal, advice.md (the ranking, a sentence on each top remedy, the statistical model,
what was refused and why), advice.csv and the figure, and --verify's verdict: predicted
against measured, Kendall's tau, the error and the pick's regret."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

SHOWN = 12  # rows of the ranking printed; advice.md has them all


def verdict(ranked: Any) -> dict[str, Any]:
    """Predicted against measured over the verified remedies: Kendall's tau of the two
    rankings, the median error, the pick (the best ranked) and its regret (its measured
    time over the best measured, minus one). With a target, on time to target (runs that
    never reached it rank last), else on the time of the work."""
    import numpy as np
    from scipy.stats import kendalltau

    verified = ranked.dropna(subset=["measured_s"]).sort_values("rank")
    predicted, measured = "seconds", "measured_s"
    if "measured_to_target_s" in verified:
        predicted, measured = "time_to_target_s", "measured_to_target_s"
    times = verified[measured].fillna(np.inf)
    pick, best = verified.iloc[0], verified.loc[times.idxmin()]
    both = verified.dropna(subset=[predicted, measured])
    tau = kendalltau(both[predicted], both[measured]).statistic if len(both) > 1 \
        else float("nan")
    error = (both[predicted] / both[measured] - 1).abs().median()
    resolved, pairs = float("nan"), 0
    if f"{measured}_low" in verified:
        known = verified.dropna(subset=[predicted])
        resolved, pairs = resolved_tau(known[predicted], known[f"{measured}_low"],
                                       known[f"{measured}_high"])
    # each against the recorded job measured in the same launch: what the machine's drift
    # between the recording and the check leaves out
    ratio_error = float("nan")
    if (verified["kind"] == "recorded").any():
        base = verified[verified["kind"] == "recorded"].iloc[0]
        others = both[both["kind"] != "recorded"]
        ratio_error = ((others[predicted] / base[predicted]) /
                       (others[measured] / base[measured]) - 1).abs().median()
    return {"pick": pick["label"], "best": best["label"], "tau": float(tau),
            "resolved_tau": resolved, "resolved_pairs": pairs,
            "regret": float(times[pick.name] / times[best.name] - 1),
            "right": pick["remedy"] == best["remedy"], "verified": len(verified),
            "error": float(error), "compared": len(both), "ratio_error": float(ratio_error),
            "on": "time to target" if predicted != "seconds" else "time of the work"}


def resolved_text(v: dict[str, Any]) -> str:
    if not v["resolved_pairs"]:
        return "no pair of remedies whose repeats the measurement orders"
    return (f"{v['resolved_tau']:.2f} over the {v['resolved_pairs']} pair(s) whose repeats "
            "do not overlap")


def repeat_range(values: Any, groups: Any) -> tuple[Any, Any]:
    """Each group's range over its repeats, (low, high), for resolved_tau: NaN (a target
    never reached) counts as +inf; a group of one repeat has no range (-inf, +inf)."""
    by = values.fillna(math.inf).groupby(groups)
    several = by.size() > 1
    return by.min().where(several, -math.inf), by.max().where(several, math.inf)


def resolved_tau(predicted: Any, low: Any, high: Any) -> tuple[float, int]:
    """Kendall's tau over the pairs that the measurement itself orders: one's every repeat
    below every repeat of the other (their ranges apart). Pairs whose repeats overlap are
    left out: their measured order is the machine's noise, which no prediction can match.
    Predicted ties count as neither agreeing nor disagreeing. Returns (tau, pairs), tau NaN
    where no pair is ordered. A remedy with one repeat has no range: give it none."""
    concordant = discordant = pairs = 0
    values = list(zip(predicted, low, high, strict=True))
    for i, (p_i, low_i, high_i) in enumerate(values):
        for p_j, low_j, high_j in values[i + 1:]:
            if high_i < low_j:
                measured = 1  # i measured below j
            elif high_j < low_i:
                measured = -1
            else:
                continue
            if math.isnan(p_i) or math.isnan(p_j):
                continue
            pairs += 1
            agreement = measured * ((p_j > p_i) - (p_j < p_i))
            concordant += agreement > 0
            discordant += agreement < 0
    return ((concordant - discordant) / pairs if pairs else float("nan")), pairs


def table(ranked: Any, target: dict[str, Any] | None) -> str:
    lines = [f"{'#':>3} {'remedy':44s} {'time of work s':>22s} {'step ms':>8s} {'idle':>6s} "
             f"{'vs recorded':>11s}" + ("  to target s" if target else "")]
    for _, row in ranked.head(SHOWN).iterrows():
        interval = f"{row['seconds']:.2f} [{row['seconds_low']:.2f}, {row['seconds_high']:.2f}]"
        line = (f"{row['rank']:>3} {short(row['label'], 44):44s} {interval:>22s} "
                f"{row['mean_step_ms']:8.2f} {row['idle_fraction']:6.1%} "
                f"{row['vs_recorded']:+11.1%}")
        if target:
            line += "  " + (f"{row['time_to_target_s']:.2f}"
                            if math.isfinite(row["time_to_target_s"]) else "not predicted")
        lines.append(line)
    if len(ranked) > SHOWN:
        lines.append(f"    ... {len(ranked) - SHOWN} more in advice.md")
    return "\n".join(lines)


def short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def write_advice(out: Path, ranked: Any, refused: list[Any], job: dict[str, Any],
                 target: dict[str, Any] | None, suite: str | None, chosen: list[str],
                 repeats: int, top: int, model: dict[str, Any] | None) -> None:
    """advice.md, advice.csv and figures/advice.png in `out`: `chosen` the runs of the
    advised suite (`suite`.toml; None: none written), `repeats` the simulated repeats
    of each remedy, `top` the remedies explained."""
    from hetbench.analysis.advice.advisor import UNVALIDATED, explain
    from hetbench.analysis.render.figures import advice_figure

    recorded = ranked[ranked["kind"] == "recorded"].iloc[0]
    meta = job["fitted"][0].manifest
    ranked.to_csv(out / "advice.csv", index=False)
    advice_figure(ranked, out / "figures", f"hetbench advise: {meta['run']['name']} "
                  f"({len(meta['workers'])} workers), predicted")
    alike = f" and {len(job['fitted']) - job['job_runs']} of the same workers and exchange " \
        f"({', '.join(job['alike'])})" if job["alike"] else ""
    lines = [f"# Advice for {meta['run']['name']} ({meta.get('run_id')})", "",
             f"Devices fitted on the job's {job['job_runs']} run(s){alike}; "
             f"{len(ranked)} configurations "
             f"simulated ({repeats} repeats each: the interval is their range), "
             f"ranked by {'time to target' if target else 'the time of the recorded work'}"
             f" ({recorded['steps']} steps of {recorded['global_batch']} samples).", ""]
    if target:
        lines += [f"Target: {target['metric']} {target['value']:g}, reached by the recorded "
                  f"job in {target['steps']:g} steps (median of {target['runs']} run(s)).",
                  "", *model_lines(model), ""]
    lines += ["## Top remedies", ""]
    advised = ranked[(ranked["kind"] != "recorded") & ranked["advised"]]
    lines += [f"{i}. " + explain(row, recorded) for i, (_, row) in enumerate(
        advised.head(top).iterrows(), start=1)]
    lines += ["", "## Ranking", "", markdown(ranked), "",
              f"The advised suite ({suite}.toml) runs: {', '.join(chosen)}." if suite else
              "An imported job: no suite is written, its remedies are predictions.", ""]
    if "measured_s" in ranked:
        v = verdict(ranked)
        lines += ["## Verified", "",
                  f"{v['verified']} remedies run, compared on {v['on']}: Kendall's tau "
                  f"{v['tau']:.2f} between the predicted and measured rankings "
                  f"({resolved_text(v)}), median error "
                  f"{v['error']:.1%} ({v['compared']} predicted and measured; "
                  f"{v['ratio_error']:.1%} on each one's time over the recorded job's); "
                  "the pick "
                  f"({v['pick']}) "
                  + ("was the fastest measured" if v["right"] else
                     f"was wrong: {v['best']} measured fastest") +
                  f" (regret {v['regret']:.1%}).", ""]
        print(lines[-2])
    lines += ["## Not advised", ""] + [f"- {r.label}: {r.reason}" for r in refused]
    lines += [f"- {kind} remedies: {why}" for kind, why in UNVALIDATED.items()
              if (ranked["kind"] == kind).any()]
    if job["left_out"]:
        lines += ["", "Runs not fitted: " + "; ".join(job["left_out"])]
    (out / "advice.md").write_text("\n".join(lines) + "\n")


def model_lines(model: dict[str, Any] | None) -> list[str]:
    """What advice.md says of the statistical model: its coefficients, what it was fitted
    on, and each scheme predicted from the others."""
    if model is None:
        return ["Remedies that change the gradient have no predicted time to target: no "
                "run of the job given reached the target under BSP's gradient and another "
                "scheme (give the runs of the job's schemes, e.g. the `sync` suite's)."]
    fitted = model["model"]
    a, b, c = (f"{x:.3f}" if math.isfinite(x) else "unknown" for x in fitted.coefficients)
    lines = [f"Steps to target of the schemes that change the gradient (analysis/"
             f"statistical.py), fitted on {', '.join(fitted.schemes)}: BSP's "
             f"{fitted.bsp_steps:g} steps x (1 + {a} x staleness + {b} x dropped share + "
             f"{c} x (H - 1)). Each scheme predicted from the others:", ""]
    validation = model["validation"]
    if validation.empty:
        return [*lines, "(no scheme that changes the gradient reached the target)"]
    lines += ["| scheme | measured steps | predicted | error |", "|---|---|---|---|"]
    lines += [f"| {r.run} | {r.measured:g} | {cell(r.predicted)} | "
              f"{r.error:+.1%} |" if math.isfinite(r.error) else
              f"| {r.run} | {r.measured:g} | not predictable without it | |"
              for r in validation.itertuples()]
    return lines


def markdown(ranked: Any) -> str:
    columns = ["rank", "label", "seconds", "seconds_low", "seconds_high", "mean_step_ms",
               "idle_fraction", "p99_step_ms", "vs_recorded", "exact"]
    columns += [c for c in ("steps_to_target", "time_to_target_s", "measured_s",
                            "measured_step_ms",
                            "measured_idle", "measured_to_target_s") if c in ranked]
    head = "| " + " | ".join(columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(cell(row[c]) for c in columns) + " |"
            for _, row in ranked.iterrows()]
    return "\n".join([head, rule, *body])


def cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value)
