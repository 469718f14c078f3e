"""A few consecutive steps up close, for the figures people look at rather than read: each
worker's phases as spans on one time axis (idle before the all-reduce visible), and Choi's
table (each worker's compute time per batch for consecutive batches, the straggler of each
batch marked).

The spans tile a step exactly as the trace's do (hetbench.harness.records.trace.slice_table): one
definition of where idle ends and communication begins."""

from __future__ import annotations

import pandas as pd

from hetbench.analysis.view.metrics import after_warmup, complete_steps, instrumented
from hetbench.harness.records.trace import slice_table

STEPS_SHOWN = 6  # consecutive steps in a timeline or a table


def window(steps: pd.DataFrame, warmup_steps: int, count: int = STEPS_SHOWN) -> pd.DataFrame:
    """The rows of the first `count` steps after warm-up that every worker computed and
    timed (a step some worker sat out is kept: its row is simply absent)."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty or not instrumented(steps):
        return steps.iloc[0:0]
    chosen = sorted(steps["step"].unique())[:count]
    return steps[steps["step"].isin(chosen)].sort_values(["step", "rank"])


def step_spans(steps: pd.DataFrame, warmup_steps: int, count: int = STEPS_SHOWN
               ) -> pd.DataFrame:
    """Columns rank, step, phase, start_ms, duration_ms: each worker's phases over the
    window, from the window's first begin (idle before the exchange and comm after the
    last arrival apart); empty phases left out."""
    rows = window(steps, warmup_steps, count)
    columns = ["rank", "step", "phase", "start_ms", "duration_ms"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    origin = int(rows["begin_ns"].min())
    arrival = rows.groupby("step")["ready_ns"].transform("max")
    # the trace's "allreduce" slice is the communication after the last arrival: "comm",
    # as the analysis names it
    t = pd.DataFrame(slice_table(rows, arrival.to_numpy(), origin))
    t = t[(t["cat"] == "phase") & (t["dur_ns"] > 0)]
    return pd.DataFrame({"rank": t["pid"] - 1, "step": t["step"],
                         "phase": t["name"].replace({"allreduce": "comm"}),
                         "start_ms": t["ts_ns"] / 1e6, "duration_ms": t["dur_ns"] / 1e6},
                        columns=columns).reset_index(drop=True)


def batch_times(steps: pd.DataFrame, warmup_steps: int, count: int = STEPS_SHOWN
                ) -> tuple[pd.DataFrame, pd.Series]:
    """Choi's table: compute time per batch (ms, begin to ready) with a row per worker
    (rank) and a column per step; and per step the straggler, the worker ready last."""
    rows = window(steps, warmup_steps, count)
    if rows.empty:
        return pd.DataFrame(), pd.Series(dtype=int)
    rows = rows.assign(compute_ms=(rows["ready_ns"] - rows["begin_ns"]) / 1e6)
    table = rows.pivot(index="rank", columns="step", values="compute_ms")
    last = rows.loc[rows.groupby("step")["ready_ns"].idxmax(), ["step", "rank"]]
    return table, last.set_index("step")["rank"]
