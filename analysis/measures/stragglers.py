"""Straggler attribution: who makes the others wait, how often, and why.

The straggler of a step is the worker whose gradients were ready last. Its *excess* is its
compute time minus its typical compute for that step: its fitted cost model
(hetbench.analysis.measures.costmodel) for the slice it had and the emulated slowdown of that step,
at its median residual. How much slower than usual it was, not how much more work it had or how
much its emulated device slowed down on schedule.

The excess is split, in this order, over what the records can measure:

- gc:        time in the cyclic garbage collector above the worker's median (gc.callbacks);
- interference: time off the CPU (compute wall - stretch - main-thread CPU time) and CPU
             time above the median, in a step during which processes outside the run (or
             the hypervisor's steal) kept at least INTERFERENCE_CORES more cores busy than
             during the worker's median step (the launcher's samples of the host,
             harness/system/sampler.py): waiting for a core, and running slower beside another
             process (caches, memory bandwidth);
- frequency: CPU time above the median, without such interference, in a step during which
             the cores' clock (the same samples, harness/system/sampler.py) ran at least
             FREQUENCY_DROP below the worker's median step's: the same work takes 1 - f /
             f_median of its CPU time longer (thermal or power limits, a governor);
- preempted: off-CPU time, without such interference, in a step with more involuntary
             context switches than the worker's median: another of the run's processes or
             threads took the core;
- off_cpu:   time off the CPU with no extra involuntary switches (blocked, page faults,
             I/O; voluntary switches say which);
- on_cpu:    more CPU time than usual that no recorded signal explains (cache, memory,
             data; a clock that /proc/cpuinfo does not show, as in most VMs);
- emulation: for a worker with an emulated slowdown, the stretch beyond (f - 1) times its
             natural compute: the sleep overshooting when no core is free to wake it;
- load:      its wait on the input pipeline above what its peers' waits in that step predict
             for its slice (per sample, emulated slowdown divided out), the part of it that
             is its usual one (its median load): a DataLoader with fewer processes, a slower
             disk. Measured against the others, not its own median, as network is: a
             starved pipeline is starved every step, so its typical compute holds it;
- network:   in a run across hosts only, its exchange above the median of the other
             workers' exchanges in that step for the same bytes, when its host's link is
             slower than another worker's host's
             (hetbench.analysis.measures.network.slow_link_excess_ns);
- unexplained: what is left (the measured parts sum to less than the excess).

A worker with an emulated slowdown f stretches every natural delay d to f*d, so measured
delays are multiplied by its factor. Attributions are capped at the excess. A cause is named
for a step only when it explains at least NAME_SHARE of that step's excess.

`load` adds to the excess, as network does, what the straggler's input pipeline keeps it
waiting beyond its peers'; a spike of its own load above its median is compute excess
(off_cpu, on_cpu), not counted twice.

The exchange is not part of compute, so the excess above holds none of it. `network` adds
to the excess what a slower link makes the straggler's exchange take beyond its peers' (a
worker whose exchange ended late begins, and so is ready, late): measured in the step it
was last, all of it explained. An exchange longer for another reason, or on links whose
rates the manifest does not give or that are equal, is not counted: no recorded signal
would explain it. On one host network is 0 and the excess is compute alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.measures import costmodel
from hetbench.analysis.measures.network import slow_link_excess_ns
from hetbench.analysis.view.metrics import (
    after_warmup,
    complete_steps,
    instrumented,
    step_metrics,
    with_derived,
)
from hetbench.harness.records.collector import SAMPLED_FIELDS, UNMEASURED

CAUSES = ("gc", "interference", "frequency", "preempted", "off_cpu", "on_cpu", "emulation",
          "load", "network", "unexplained")
NAME_SHARE = 0.2
INTERFERENCE_CORES = 0.25  # others' extra busy cores during a step that count as interference
FREQUENCY_DROP = 0.05  # a clock this much below the median step's counts as a slower core
COMPUTE_PHASES = ("load", "to_device", "forward", "backward", "pack")


def straggler_summary(steps: pd.DataFrame, warmup_steps: int = 0,
                      per_step: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per worker: steps_last (how many steps it was ready last), share_last, and
    mean_lead_ms (its mean lead over the second latest worker in those steps).
    `per_step`: step_metrics of the same steps, if already computed."""
    if per_step is None:
        per_step = step_metrics(steps, warmup_steps)
    columns = ["rank", "steps_last", "share_last", "mean_lead_ms"]
    if per_step.empty:
        return pd.DataFrame(columns=columns)
    ranks = sorted(complete_steps(after_warmup(steps, warmup_steps))["rank"].unique())
    g = per_step.groupby("straggler")
    out = pd.DataFrame({"rank": ranks})
    out["steps_last"] = out["rank"].map(g.size()).fillna(0).astype(int)
    out["share_last"] = out["steps_last"] / len(per_step)
    out["mean_lead_ms"] = out["rank"].map(g["lead_ms"].mean())
    return out[columns]


def attribute(steps: pd.DataFrame, warmup_steps: int = 0,
              slowdown: Mapping[int, float] | None = None,
              per_step: pd.DataFrame | None = None,
              manifest: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per step with its straggler: step, rank, lead_ms, excess_ms (compute above
    typical, plus network), top_phase (the compute phase furthest above that worker's own
    median), one `<cause>_ms` column per cause in CAUSES, `cause` (the largest named cause,
    or 'none'), and the raw signals ctx_involuntary, ctx_voluntary, rss_growth_bytes.
    `manifest`: across hosts, its `nodes` give the links network is measured against."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    cause_columns = [f"{c}_ms" for c in CAUSES]
    columns = ["step", "rank", "lead_ms", "excess_ms", "top_phase", *cause_columns, "cause",
               "ctx_involuntary", "ctx_voluntary", "rss_growth_bytes"]
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=columns)
    d, has_cpu = _row_signals(steps, slowdown, manifest)
    host = [c for c in ("others_cores", "steal_cores") if c in d]  # sampled, local runs
    clock = ["cpu_mhz"] if "cpu_mhz" in d else []
    medians = d.groupby("rank")[["compute_ns", "gc_ns", "off_cpu_ns", "cpu_ns", "overshoot_ns",
                                 "ctx_involuntary", *host, *clock,
                                 *(f"{p}_ns" for p in COMPUTE_PHASES)]].median()
    per_step = (step_metrics(steps) if per_step is None else per_step).set_index("step")
    straggler = d["step"].map(per_step["straggler"])
    # the others' natural load per sample in each step: the straggler's at its peers' pace
    per_sample = d["load_ns"] / (d["batch_size"] * d["factor"]).where(d["batch_size"] > 0)
    peers_load = per_sample.where(d["rank"] != straggler).groupby(d["step"]).median()
    s = d[d["rank"] == straggler].reset_index(drop=True)
    s["lead_ms"] = s["step"].map(per_step["lead_ms"])
    m = medians.loc[s["rank"].to_numpy()].reset_index(drop=True)  # each row's own medians

    parts, compute_excess = _compute_parts(s, m, host, clock)
    # the input pipeline's usual wait beyond its peers', outside the compute excess (its
    # typical compute holds it): no more than this step's gap to them
    expected_load = s["step"].map(peers_load).fillna(np.inf) * s["batch_size"] * s["factor"]
    gap = s["load_ns"] - expected_load
    parts["load"] = np.minimum(gap, m["load_ns"] - expected_load).clip(lower=0).fillna(0.0)
    # the exchange's excess, outside compute: all of it explained by the slower link
    parts["network"] = s["network_ns"]
    excess = compute_excess + parts["network"] + parts["load"]
    return _straggler_rows(s, m, parts, excess, has_cpu)[columns]


def _row_signals(steps: pd.DataFrame, slowdown: Mapping[int, float] | None,
                 manifest: dict[str, Any] | None) -> tuple[pd.DataFrame, bool]:
    """Every row's signals (after warm-up, complete steps): its typical compute, its CPU time
    on and off the CPU, its emulated factor and the stretch's overshoot, the RSS growth;
    and whether CPU time was recorded."""
    # Only the columns read below, sorted for the per-worker RSS difference: sorting the
    # whole frame was a third of the 1M-record analysis.
    derived = with_derived(steps)
    needed = ["step", "rank", "batch_size", "compute_ns", "stretch_ns", "gc_ns", "ctx_involuntary",
              "ctx_voluntary", "rss_bytes", *(f"{p}_ns" for p in COMPUTE_PHASES),
              *[c for c in ("compute_cpu_ns", "compute_cpu_all_ns", "others_cores",
                            "steal_cores", "cpu_mhz") if c in derived]]
    slow_link = slow_link_excess_ns(derived, manifest)
    d = derived[needed].assign(network_ns=0.0 if slow_link is None else slow_link)
    # steps between the sampled ones (a run's counters_every) hold UNMEASURED: NaN here
    for column in SAMPLED_FIELDS:
        if column in d:
            d[column] = d[column].where(d[column] != UNMEASURED)
    d = d.sort_values(["rank", "step"])
    d["rss_growth_bytes"] = d.groupby("rank")["rss_bytes"].diff().fillna(0)
    has_cpu = "compute_cpu_ns" in d and bool((d["compute_cpu_ns"] > 0).any())
    cpu = d["compute_cpu_ns"] if has_cpu else pd.Series(np.nan, index=d.index)
    # typical compute and emulated slowdown of each row's step (the schedule's, where the
    # manifest gives one; else the constant `slowdown`)
    fit = costmodel.fit(steps, manifest).rows.set_index(["rank", "step"])
    key = pd.MultiIndex.from_arrays([d["rank"], d["step"]])
    level = fit["residual"].groupby(level="rank").transform("median")
    d["typical_ns"] = (fit["model_ns"] * level).reindex(key).to_numpy()
    # off the CPU: the main thread, which drives the step; CPU work: every thread's (an
    # intra-op pool doing more is on-CPU excess too), where recorded
    d["off_cpu_ns"] = (d["compute_ns"] - d["stretch_ns"] - cpu).clip(lower=0)
    every_thread = "compute_cpu_all_ns" in d and bool((d["compute_cpu_all_ns"] > 0).any())
    d["cpu_ns"] = d["compute_cpu_all_ns"] if has_cpu and every_thread else cpu
    factors = pd.Series(slowdown or {}, dtype=float)
    factor_of_row = d["rank"].map(factors).fillna(1.0)
    if manifest is not None:
        factor_of_row = pd.Series(fit["slowdown"].reindex(key).to_numpy(), index=d.index)
    d["factor"] = factor_of_row
    natural = d["compute_ns"] - d["stretch_ns"]
    d["overshoot_ns"] = (d["stretch_ns"] - (factor_of_row - 1.0) * natural).clip(lower=0)
    return d, has_cpu


def _compute_parts(s: pd.DataFrame, m: pd.DataFrame, host: list[str], clock: list[str]
                   ) -> tuple[pd.DataFrame, pd.Series]:
    """Each straggler row's compute excess over its typical compute, and that excess split
    over the compute causes (capped at it, `unexplained` the rest); `m` holds each row's
    worker's medians."""
    factor = s["factor"]
    compute_excess = (s["compute_ns"] - s["typical_ns"]).clip(lower=0)
    gc_part = (s["gc_ns"] - m["gc_ns"]).clip(lower=0)
    off = (s["off_cpu_ns"] - m["off_cpu_ns"]).clip(lower=0).fillna(0)
    on = ((s["cpu_ns"] - m["cpu_ns"]).clip(lower=0) - gc_part).clip(lower=0).fillna(0)
    interfered = pd.Series(False, index=s.index)
    for column in host:  # NaN (a step outside the sampled span) is no evidence
        interfered |= (s[column] - m[column]) >= INTERFERENCE_CORES
    preempted_signal = (s["ctx_involuntary"] > m["ctx_involuntary"]) & ~interfered
    # a slower clock stretches the step's CPU time by 1 - f / f_median of it; NaN (no clock
    # shown, a step outside the sampled span) is no evidence
    slowed = pd.Series(0.0, index=s.index)
    if clock:
        drop = (1.0 - s["cpu_mhz"] / m["cpu_mhz"]).fillna(0.0)
        slowed = (s["cpu_ns"].fillna(0.0) * drop).where(drop >= FREQUENCY_DROP, 0.0)
    frequency = np.minimum(on, slowed).where(~interfered, 0.0)
    # beside a process that keeps a core busy, a worker both waits for the core and, on
    # it, runs slower (caches, memory bandwidth, shared cores): both delays are its doing
    parts = pd.DataFrame({
        "gc": gc_part, "interference": (off + on).where(interfered, 0.0),
        "frequency": frequency,
        "preempted": off.where(preempted_signal, 0.0),
        "off_cpu": off.where(~preempted_signal & ~interfered, 0.0),
        "on_cpu": (on - frequency).where(~interfered, 0.0),
    }).mul(factor, axis=0)
    # The overshoot is added once, after the stretch: it is not multiplied by the factor.
    parts["emulation"] = (s["overshoot_ns"] - m["overshoot_ns"]).clip(lower=0)
    # Cap the measured parts at the compute excess, keeping their proportions.
    total = parts.sum(axis=1)
    scale = np.where(total > compute_excess, compute_excess / total.where(total > 0, 1.0), 1.0)
    parts = parts.mul(scale, axis=0)
    parts["unexplained"] = (compute_excess - parts.sum(axis=1)).clip(lower=0)
    return parts, compute_excess


def _straggler_rows(s: pd.DataFrame, m: pd.DataFrame, parts: pd.DataFrame,
                    excess: pd.Series, has_cpu: bool) -> pd.DataFrame:
    """attribute's table from the straggler rows, their medians and their causes' parts."""
    phase_excess = pd.DataFrame({p: s[f"{p}_ns"] - m[f"{p}_ns"] for p in COMPUTE_PHASES})
    out = pd.DataFrame({
        "step": s["step"], "rank": s["rank"], "lead_ms": s["lead_ms"],
        "excess_ms": excess / 1e6, "top_phase": phase_excess.idxmax(axis=1),
    })
    for cause in CAUSES:
        out[f"{cause}_ms"] = parts[cause] / 1e6
    named = parts[list(CAUSES[:-1])]
    best = named.idxmax(axis=1)
    share = named.max(axis=1) / excess.where(excess > 0, np.nan)
    out["cause"] = best.where(share >= NAME_SHARE, "none")
    out["ctx_involuntary"] = s["ctx_involuntary"]
    out["ctx_voluntary"] = s["ctx_voluntary"]
    out["rss_growth_bytes"] = s["rss_growth_bytes"]
    if not has_cpu:  # without CPU time, off- and on-CPU delays cannot be told apart
        out[["interference_ms", "frequency_ms", "preempted_ms", "off_cpu_ms",
             "on_cpu_ms"]] = np.nan
    return out.sort_values("step").reset_index(drop=True)


def cause_shares(attribution: pd.DataFrame) -> pd.DataFrame:
    """Per straggler worker and cause: excess_ms explained and its share of that worker's
    total straggler excess (shares of each worker sum to 1). Also rank -1: all workers."""
    columns = ["rank", "cause", "excess_ms", "share"]
    if attribution.empty:
        return pd.DataFrame(columns=columns)
    long = attribution.melt(id_vars=["rank"], value_vars=[f"{c}_ms" for c in CAUSES],
                            var_name="cause", value_name="ms").rename(columns={"ms": "excess_ms"})
    long["cause"] = long["cause"].str.removesuffix("_ms")
    both = pd.concat([long, long.assign(rank=-1)])
    out = both.groupby(["rank", "cause"], sort=False)["excess_ms"].sum().reset_index()
    totals = out.groupby("rank")["excess_ms"].transform("sum")
    out["share"] = out["excess_ms"] / totals.where(totals > 0, np.nan)
    return out[columns]
