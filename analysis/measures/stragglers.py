"""Straggler attribution: who makes the others wait, how often, and why.

The straggler of a step is the worker whose gradients were ready last. Its *excess* is its
compute time minus its typical compute for that step: its fitted cost model
(hetbench.analysis.measures.costmodel) for the slice it had and the emulated slowdown of that
step, at its median residual. How much slower than usual it was, not how much more work it
had or how much its emulated device slowed down on schedule.

What the records measure of a step's compute (harness/loop/counters.py), for the main
thread that drives it: its time on a CPU (`compute_cpu_ns`), its wait on a run queue for a
CPU (`compute_wait_ns`, less the emulation's own wait to wake from its sleeps), and the
rest of its natural compute (compute less the emulated stretch), time it was blocked
(asleep: a loader's queue, a lock, I/O). With a slowdown f the stretch adds (f - 1) x the
natural compute, and whatever it overshot that. So, exactly,

    compute - typical = f x (cpu - typical cpu) + f x (wait - typical wait)
                        + f x (blocked - typical blocked) + overshoot

where the typical parts are the typical natural compute ((typical - the median step's
overshoot) / f) split as the worker's median step splits it, and the overshoot is counted
beyond its median step's; the stretch's own CPU time and its wait to wake from its sleeps
are the stretch's, not the natural compute's. The excess is then split over the parts
that are above typical (those below it are the time the step made up elsewhere), in
proportion, so that the named causes add up to the excess:

- noise:     a step whose compute excess is within the worker's own noise (NOISE_SIGMAS
             robust standard deviations of its compute around its typical compute) is not
             split: its lateness is the worker's usual spread, no cause's;
- gc:        time in the cyclic garbage collector above the worker's median (gc.callbacks),
             out of the on-CPU part;
- interference: waiting for a CPU, or more CPU time, in a step during which processes
             outside the run (or the hypervisor's steal) kept at least INTERFERENCE_CORES
             cores busy (the launcher's samples of the host, harness/system/sampler.py): a
             load that lasts the whole run counts in every step, and the run's summary
             (`compute_breakdown`) says what share of the compute it waited;
- preempted: waiting for a CPU with no such outside load: the run's own processes and
             threads outnumbered the cores;
- blocked:   more time asleep than usual (voluntary switches: a loader's queue, a lock,
             I/O, major faults);
- page_faults: more CPU time in a step with at least FAULTS_MORE more page faults than
             the worker's median (a sampled step: counters_every);
- frequency: more CPU time while the cores' clock ran at least FREQUENCY_DROP below the
             worker's median step's: 1 - f / f_median of the CPU time;
- on_cpu:    more CPU time than usual that no recorded signal explains (caches, memory,
             data);
- emulation: the emulated stretch beyond (f - 1) x the natural compute (the sleeps'
             overshoot, carried into the next phase: harness/spec/emulation.py), beyond its
             median step's, less the time its sleeps waited for a CPU to wake on (that is
             interference or preempted, as any wait for a CPU); in a step beside outside
             load (interference's rule) all of it is interference: its spin lost its core or
             the hypervisor stole it, which the guest never counts as a wait;
- jitter:    the emulated jitter's extra stretch (a worker's `jitter`, drawn per step):
             its typical compute at the schedule's slowdown times the jitter's factor, less
             that at the schedule's alone. Variability injected on purpose, counted as the
             straggler's excess (the cost model reads the jitter as scheduled, so the rest
             of that step's compute is split as any step's);
- load:      its wait on the input pipeline above what its peers' waits in that step
             predict for its slice (per sample, emulated slowdown divided out), the part of it
             that is its usual one (its median load): a DataLoader with fewer processes, a
             slower disk. Measured against the others, not its own median, as network is: a
             starved pipeline is starved every step, so its typical compute holds it. And,
             where the run loads through a DataLoader (its `loader`), out of the compute
             excess, its load phase above its median: a spike of the input pipeline (a
             read that hiccups, a DataLoader started again: its thread forks it, waits for
             a CPU behind its processes, sleeps on its queue); in a step beside outside
             load, only the time its thread slept beyond its usual is load (its waits for a
             CPU are interference). The rest of the excess is split as above;
- network:   in a run across hosts only, its exchange above the median of the other
             workers' exchanges in that step for the same bytes, when its host's link is
             slower than another worker's host's
             (hetbench.analysis.measures.network.slow_link_excess_ns);
- unexplained: what the records could not split: a step whose main thread's CPU time was
             not measured (a run recorded before it was, or an adapter that records none).

Runs recorded before the wait for a CPU was measured split the off-CPU time as they did:
interference (outside load, as above), preempted (more involuntary switches than the
median, on the steps getrusage sampled), else off_cpu.

A cause is named for a step only when it explains at least NAME_SHARE of that step's
excess. `load` and `network` add to the excess what the straggler waited beyond its peers
(a spike of its own load above its median is compute excess, not counted twice: `load`
there too); on one host network is 0.
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

CAUSES = ("noise", "gc", "interference", "preempted", "blocked", "page_faults", "frequency",
          "off_cpu", "on_cpu", "emulation", "jitter", "load", "network", "unexplained")
NAME_SHARE = 0.2
INTERFERENCE_CORES = 0.25  # cores busy outside the run during a step that make it interference
FREQUENCY_DROP = 0.05  # a clock this much below the median step's counts as a slower core
FAULTS_MORE = 256  # page faults above the median step's that name on-CPU excess page_faults
NOISE_SIGMAS = 1.0  # a compute excess within this many of the worker's robust sigmas is noise
COMPUTE_PHASES = ("load", "to_device", "forward", "backward", "pack")
_SIGNALS = ("natural_ns", "cpu_ns", "wait_ns", "blocked_ns", "off_cpu_ns", "overshoot_ns",
            "wake_ns", "gc_ns", "faults",
            "ctx_involuntary", *(f"{p}_ns" for p in COMPUTE_PHASES))


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
    typical, plus load and network), top_phase (the compute phase furthest above that
    worker's own median), one `<cause>_ms` column per cause in CAUSES (they sum to
    excess_ms), `cause` (the largest named cause, or 'none'), and the raw signals
    wait_ms, others_cores, faults, ctx_involuntary, ctx_voluntary, rss_growth_bytes.
    `manifest`: across hosts, its `nodes` give the links network is measured against."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    cause_columns = [f"{c}_ms" for c in CAUSES]
    columns = ["step", "rank", "lead_ms", "excess_ms", "top_phase", *cause_columns, "cause",
               "wait_ms", "others_cores", "faults", "ctx_involuntary", "ctx_voluntary",
               "rss_growth_bytes"]
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=columns)
    d = _row_signals(steps, slowdown, manifest)
    host = [c for c in ("others_cores", "steal_cores") if c in d]  # sampled, local runs
    clock = ["cpu_mhz"] if "cpu_mhz" in d else []
    medians = d.groupby("rank")[[*_SIGNALS, *clock]].median()
    deviation = d["compute_ns"] - d["typical_ns"]
    centred = deviation - deviation.groupby(d["rank"]).transform("median")
    medians["sigma_ns"] = 1.4826 * centred.abs().groupby(d["rank"]).median()
    per_step = (step_metrics(steps) if per_step is None else per_step).set_index("step")
    straggler = d["step"].map(per_step["straggler"])
    # the others' natural load per sample in each step: the straggler's at its peers' pace
    per_sample = d["load_ns"] / (d["batch_size"] * d["factor"]).where(d["batch_size"] > 0)
    peers_load = per_sample.where(d["rank"] != straggler).groupby(d["step"]).median()
    s = d[d["rank"] == straggler].reset_index(drop=True)
    s["lead_ms"] = s["step"].map(per_step["lead_ms"])
    m = medians.loc[s["rank"].to_numpy()].reset_index(drop=True)  # each row's own medians

    # a DataLoader's spikes are the input pipeline's; slicing in line is the step's own work
    loader = bool(((manifest or {}).get("run") or {}).get("loader"))
    parts, compute_excess = _compute_parts(s, m, host, clock, loader)
    # the input pipeline's usual wait beyond its peers', outside the compute excess (its
    # typical compute holds it): no more than this step's gap to them
    expected_load = s["step"].map(peers_load).fillna(np.inf) * s["batch_size"] * s["factor"]
    gap = s["load_ns"] - expected_load
    usual_load = np.minimum(gap, m["load_ns"] - expected_load).clip(lower=0).fillna(0.0)
    parts["load"] += usual_load
    # the exchange's excess, outside compute: all of it explained by the slower link
    parts["network"] = s["network_ns"]
    # the jitter's stretch, as far as the step was above its compute without it
    parts["jitter"] = np.minimum(s["jitter_ns"], (s["compute_ns"] - s["typical_ns"]
                                                  + s["jitter_ns"]).clip(lower=0)).fillna(0.0)
    excess = compute_excess + parts["network"] + usual_load + parts["jitter"]
    return _straggler_rows(s, m, parts, excess)[columns]


def _row_signals(steps: pd.DataFrame, slowdown: Mapping[int, float] | None,
                 manifest: dict[str, Any] | None) -> pd.DataFrame:
    """Every row's signals (after warm-up, complete steps): its typical compute, its
    emulated factor, its natural compute (compute less the stretch) split into the main
    thread's time on a CPU, waiting for one and blocked (off_cpu where the wait was not
    measured), the stretch's overshoot, the page faults and the RSS growth; NaN where a
    signal was not measured."""
    # Only the columns read below, sorted for the per-worker RSS difference: sorting the
    # whole frame was a third of the 1M-record analysis.
    derived = with_derived(steps)
    optional = [c for c in ("compute_cpu_ns", "compute_wait_ns", "stretch_wait_ns",
                            "stretch_cpu_ns", "compute_faults", "others_cores", "steal_cores",
                            "cpu_mhz") if c in derived]
    needed = ["step", "rank", "batch_size", "compute_ns", "stretch_ns", "gc_ns", "ctx_involuntary",
              "ctx_voluntary", "rss_bytes", *(f"{p}_ns" for p in COMPUTE_PHASES), *optional]
    slow_link = slow_link_excess_ns(derived, manifest)
    d = derived[needed].assign(network_ns=0.0 if slow_link is None else slow_link)
    # UNMEASURED (-1: a step between the sampled ones, a counter this host lacks): NaN here
    for column in SAMPLED_FIELDS:
        if column in d:
            d[column] = d[column].where(d[column] != UNMEASURED)
    d = d.sort_values(["rank", "step"])
    d["rss_growth_bytes"] = d.groupby("rank")["rss_bytes"].diff().fillna(0)
    # typical compute and emulated slowdown of each row's step (the schedule's, where the
    # manifest gives one; else the constant `slowdown`)
    fit = costmodel.fit(steps, manifest).rows.set_index(["rank", "step"])
    key = pd.MultiIndex.from_arrays([d["rank"], d["step"]])
    level = fit["residual"].groupby(level="rank").transform("median")
    d["typical_ns"] = (fit["model_ns"] * level).reindex(key).to_numpy()
    factor = d["rank"].map(pd.Series(slowdown or {}, dtype=float)).fillna(1.0)
    if manifest is not None:
        factor = pd.Series(fit["slowdown"].reindex(key).to_numpy(), index=d.index)
    d["factor"] = factor
    # the jitter's share of the typical compute: what the schedule alone would not stretch
    scheduled = costmodel.slowdowns(d, manifest, jitter=False) if manifest else factor
    d["jitter_ns"] = (d["typical_ns"] * (1.0 - scheduled / factor)).clip(lower=0)
    natural = d["compute_ns"] - d["stretch_ns"]
    d["natural_ns"] = natural
    d["overshoot_ns"] = d["stretch_ns"] - (factor - 1.0) * natural
    nan = pd.Series(np.nan, index=d.index)
    cpu = d["compute_cpu_ns"].where(d["compute_cpu_ns"] > 0) if "compute_cpu_ns" in d else nan
    wait = d["compute_wait_ns"] if "compute_wait_ns" in d else nan
    # the stretch's own CPU time and its wait to wake from its sleeps are not the natural
    # compute's; the wake is the overshoot's part that waited for a CPU
    wake = d["stretch_wait_ns"].fillna(0) if "stretch_wait_ns" in d else 0.0
    if "stretch_cpu_ns" in d:
        cpu = cpu - d["stretch_cpu_ns"].fillna(0)
    wait = wait - wake
    d["cpu_ns"], d["wait_ns"], d["wake_ns"] = cpu, wait, wake
    d["blocked_ns"] = natural - cpu - wait
    d["off_cpu_ns"] = (natural - cpu).where(wait.isna())
    d["faults"] = d["compute_faults"] if "compute_faults" in d else nan
    return d


def _compute_parts(s: pd.DataFrame, m: pd.DataFrame, host: list[str], clock: list[str],
                   loader: bool = False) -> tuple[pd.DataFrame, pd.Series]:
    """Each straggler row's compute excess over its typical compute, and that excess split
    over the compute causes (the module docstring): they sum to it; `m` holds each row's
    worker's medians."""
    factor = s["factor"]
    compute_excess = (s["compute_ns"] - s["typical_ns"]).clip(lower=0).fillna(0.0)
    # the typical stretch overshoots as the worker's median step's did
    typical_natural = (s["typical_ns"] - m["overshoot_ns"].fillna(0)) / factor
    waits = s["wait_ns"].notna()
    # the typical natural compute split as the worker's median step splits it
    whole = (m["cpu_ns"] + m["wait_ns"].fillna(0) + m["blocked_ns"].fillna(0)).where(
        waits, m["cpu_ns"] + m["off_cpu_ns"])

    def above(signal: str) -> pd.Series:
        typical = typical_natural * m[signal] / whole.where(whole > 0)
        return ((s[signal] - typical) * factor).clip(lower=0).fillna(0.0)

    cpu, wait, blocked, off = (above(c) for c in ("cpu_ns", "wait_ns", "blocked_ns",
                                                     "off_cpu_ns"))
    gc_part = np.minimum((s["gc_ns"] - m["gc_ns"]).clip(lower=0) * factor, cpu)
    on = cpu - gc_part
    interfered = pd.Series(False, index=s.index)
    for column in host:  # NaN (a step outside the sampled span) is no evidence
        interfered |= s[column] >= INTERFERENCE_CORES
    faulted = ((s["faults"] - m["faults"]) >= FAULTS_MORE) & ~interfered
    slowed = pd.Series(0.0, index=s.index)
    if clock:  # a slower clock stretches the step's CPU time by 1 - f / f_median of it
        drop = (1.0 - s["cpu_mhz"] / m["cpu_mhz"]).fillna(0.0)
        slowed = (s["cpu_ns"].fillna(0.0) * factor * drop).where(drop >= FREQUENCY_DROP, 0.0)
    own_cpu = ~interfered & ~faulted
    frequency = np.minimum(on, slowed).where(own_cpu, 0.0)
    switched = s["ctx_involuntary"] > m["ctx_involuntary"]  # runs before the wait was measured
    # the stretch's overshoot beyond its median: waiting for a CPU to wake on, as any wait
    # for one; the rest is the emulation's own (its timer's lateness)
    wake = (s["wake_ns"] - m["wake_ns"]).fillna(0.0)
    overshoot = (s["overshoot_ns"] - m["overshoot_ns"]).fillna(0.0)
    wait = wait + wake.clip(lower=0)
    # the rest is the emulation's own (its timer's lateness), but in a step beside outside
    # load: its spin lost its core, or the hypervisor stole it (a steal the guest's run
    # queues never show as a wait)
    late = (overshoot - wake).clip(lower=0)
    parts = pd.DataFrame({
        "gc": gc_part,
        "interference": (on + wait + off + late).where(interfered, 0.0),
        "preempted": wait.where(~interfered, 0.0) + off.where(~interfered & switched, 0.0),
        "blocked": blocked,
        "page_faults": on.where(faulted, 0.0),
        "frequency": frequency,
        "off_cpu": off.where(~interfered & ~switched, 0.0),
        "on_cpu": (on - frequency).where(own_cpu, 0.0),
        "emulation": late.where(~interfered, 0.0),
    })
    # The parts above typical hold the excess and what the parts below it made up: scaled to
    # the excess, they add up to it. Within the worker's noise, no part is named.
    total = parts.sum(axis=1)
    measured = s["cpu_ns"].notna() & (total > 0)
    noise = measured & (compute_excess <= NOISE_SIGMAS * m["sigma_ns"])
    # with a DataLoader (`loader`), the load phase beyond its median is the input
    # pipeline's, whatever its thread did in it (forked a DataLoader started again, waited
    # for a CPU behind its processes, slept on its queue); beside outside load, only the
    # time it slept beyond its usual (on the queue, for a batch not ready): its waits for a
    # CPU there are the others'
    spike = np.minimum((s["load_ns"] - m["load_ns"]).clip(lower=0).fillna(0.0),
                       compute_excess).where(measured & ~noise & loader, 0.0)
    spike = spike.where(~interfered, np.minimum(spike, blocked))
    asleep = spike.where(interfered, 0.0)
    parts["blocked"] -= asleep
    total = total - asleep
    scale = ((compute_excess - spike) / total.where(total > 0, 1.0)).where(
        measured & ~noise, 0.0)
    parts = parts.mul(scale, axis=0)
    parts["load"] = spike
    parts["noise"] = compute_excess.where(noise, 0.0)
    left = compute_excess - parts.sum(axis=1)
    parts["unexplained"] = left.where(left > 1.0, 0.0)  # below a nanosecond: rounding
    return parts, compute_excess


def _straggler_rows(s: pd.DataFrame, m: pd.DataFrame, parts: pd.DataFrame,
                    excess: pd.Series) -> pd.DataFrame:
    """attribute's table from the straggler rows, their medians and their causes' parts."""
    phase_excess = pd.DataFrame({p: s[f"{p}_ns"] - m[f"{p}_ns"] for p in COMPUTE_PHASES})
    out = pd.DataFrame({
        "step": s["step"], "rank": s["rank"], "lead_ms": s["lead_ms"],
        "excess_ms": excess / 1e6, "top_phase": phase_excess.idxmax(axis=1),
    })
    for cause in CAUSES:
        out[f"{cause}_ms"] = parts[cause] / 1e6
    named = parts[[c for c in CAUSES if c != "unexplained"]]
    best = named.idxmax(axis=1)
    share = named.max(axis=1) / excess.where(excess > 0, np.nan)
    out["cause"] = best.where(share >= NAME_SHARE, "none")
    out["wait_ms"] = s["wait_ns"] / 1e6
    out["others_cores"] = s["others_cores"] if "others_cores" in s else np.nan
    out["faults"] = s["faults"]
    out["ctx_involuntary"] = s["ctx_involuntary"]
    out["ctx_voluntary"] = s["ctx_voluntary"]
    out["rss_growth_bytes"] = s["rss_growth_bytes"]
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


def compute_breakdown(steps: pd.DataFrame, warmup_steps: int = 0) -> pd.DataFrame:
    """Where each worker's compute went over the whole run (after warm-up, complete steps),
    as shares of its compute time: its main thread on a CPU (`cpu_share`), waiting for one
    (`wait_share`), blocked (`blocked_share`), the emulated stretch (`stretch_share`), the
    garbage collector (`gc_share`); the cores busy outside the run while it computed
    (`others_cores`, mean) and its page faults and migrations per sampled step. A load that
    lasts the whole run shows here (a worker's wait share beside busy cores outside the
    run) even where no step stands out. NaN where not measured."""
    columns = ["rank", "steps", "compute_ms", "cpu_share", "wait_share", "blocked_share",
               "stretch_share", "gc_share", "others_cores", "faults_per_step",
               "migrations_per_step"]
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=columns)
    d = with_derived(steps)

    def measured(column: str) -> pd.Series:
        if column not in d:
            return pd.Series(np.nan, index=d.index)
        return d[column].where(d[column] != UNMEASURED).astype(float)

    wait = measured("compute_wait_ns") - measured("stretch_wait_ns").fillna(0)
    cpu = measured("compute_cpu_ns").where(lambda c: c > 0) \
        - measured("stretch_cpu_ns").fillna(0)
    frame = pd.DataFrame({
        "rank": d["rank"], "compute": d["compute_ns"].astype(float),
        "cpu": cpu, "wait": wait,
        "blocked": d["compute_ns"] - d["stretch_ns"] - cpu - wait,
        "stretch": d["stretch_ns"].astype(float), "gc": d["gc_ns"].astype(float),
        "others": d["others_cores"] if "others_cores" in d else np.nan,
        "faults": measured("compute_faults"), "migrations": measured("compute_migrations")})
    g = frame.groupby("rank")
    total = g["compute"].sum()

    def share(column: str) -> pd.Series:
        # over the steps where the part was measured, of those steps' compute
        known = frame[column].notna()
        part = frame[column].where(known).groupby(frame["rank"]).sum(min_count=1)
        return part / frame["compute"].where(known).groupby(frame["rank"]).sum()

    out = pd.DataFrame({
        "steps": g.size(), "compute_ms": total / g.size() / 1e6,
        "cpu_share": share("cpu"), "wait_share": share("wait"),
        "blocked_share": share("blocked"), "stretch_share": g["stretch"].sum() / total,
        "gc_share": g["gc"].sum() / total, "others_cores": g["others"].mean(),
        "faults_per_step": g["faults"].mean(), "migrations_per_step": g["migrations"].mean(),
    }).reset_index()
    return out[columns]


def breakdown_lines(breakdown: pd.DataFrame) -> list[str]:
    """What a worker's whole run says of the lasting causes: a wait for a CPU of at least
    LASTING_WAIT of its compute, beside outside load or not; time blocked; GC."""
    lines = []
    for row in breakdown.itertuples():
        wait, others = row.wait_share, row.others_cores
        if isinstance(wait, float) and wait >= LASTING_WAIT:
            beside = (f" while {others:.2f} cores were busy outside the run (interference "
                      "for the whole run)" if others >= INTERFERENCE_CORES else
                      " with the cores taken by the run's own processes and threads")
            lines.append(f"Worker {row.rank} waited for a CPU {wait:.0%} of its compute "
                         f"time{beside}.")
        if isinstance(row.blocked_share, float) and row.blocked_share >= LASTING_WAIT:
            lines.append(f"Worker {row.rank} was blocked (asleep: its input pipeline, a lock, "
                         f"I/O) {row.blocked_share:.0%} of its compute time.")
        if row.gc_share >= LASTING_WAIT:
            lines.append(f"Worker {row.rank} spent {row.gc_share:.0%} of its compute time in "
                         "the garbage collector.")
    return lines


LASTING_WAIT = 0.05  # a share of a worker's compute that its run's summary names


def cause_evidence(attribution: pd.DataFrame, least_share: float = 0.05) -> list[str]:
    """A line of evidence for each cause of at least `least_share` of a run's straggler
    excess, from the steps named with it: how much it took and what the counters said."""
    if attribution.empty:
        return []
    total = attribution["excess_ms"].sum()
    lines = []
    for cause in CAUSES:
        ms = attribution[f"{cause}_ms"]
        if total <= 0 or ms.sum() / total < least_share:
            continue
        named = attribution[attribution["cause"] == cause]
        steps = len(named)
        each = named[f"{cause}_ms"].mean() if steps else ms[ms > 0].mean()
        said = _EVIDENCE.get(cause, "").format(
            wait=named["wait_ms"].mean(), others=named["others_cores"].mean(),
            faults=named["faults"].mean())
        if "nan" in said:  # the signal was not measured on those steps
            said = ""
        lines.append(f"{cause} {ms.sum() / total:.0%} of the excess ({steps} steps named, "
                     f"{each:.2f} ms each){': ' + said if said else ''}.")
    return lines


_EVIDENCE = {
    "noise": "late by less than the worker's own noise: no cause",
    "interference": "waited {wait:.2f} ms for a CPU while {others:.2f} cores were busy "
                    "outside the run",
    "preempted": "waited {wait:.2f} ms for a CPU with no load outside the run",
    "blocked": "asleep longer than usual (voluntary switches)",
    "page_faults": "{faults:.0f} page faults in the step",
    "gc": "in the cyclic garbage collector",
    "emulation": "the emulated device's sleeps overshot",
    "jitter": "the emulated jitter stretched the step",
    "unexplained": "the main thread's CPU time was not recorded",
}
