"""Figures (the only module that plots). Each figure says which runs it shows and whether
heterogeneity was real or emulated; axes carry units."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis.metrics import after_warmup, instrumented, with_derived


def compute_time_frame(runs: Sequence[tuple[str, str, pd.DataFrame, int]]) -> pd.DataFrame:
    """Tidy per-batch compute time: columns run, heterogeneity, worker, step, compute_ms.
    Each input is (run label, heterogeneity, steps, warm-up steps)."""
    parts = []
    for label, heterogeneity, steps, warmup in runs:
        steps = after_warmup(steps, warmup)
        if steps.empty or not instrumented(steps):
            continue
        derived = with_derived(steps)
        parts.append(pd.DataFrame({
            "run": f"{label} ({heterogeneity})",
            "worker": derived["rank"].astype(str),
            "step": derived["step"],
            "compute_ms": derived["compute_ns"] / 1e6,
        }))
    columns = ["run", "worker", "step", "compute_ms"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def plot_compute_per_step(frame: pd.DataFrame, out: Path, title: str) -> list[Path]:
    """Per-batch compute time of each worker over steps, one panel per run; PNG and PDF."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    if frame.empty:
        return []
    grid = sns.relplot(data=frame, x="step", y="compute_ms", hue="worker", col="run",
                       col_wrap=min(3, frame["run"].nunique()), kind="line", height=2.8,
                       aspect=1.4, linewidth=0.8, facet_kws={"sharey": False})
    grid.set_axis_labels("step", "compute time per batch (ms)")
    grid.set_titles("{col_name}", size=8)
    grid.figure.suptitle(title, y=1.02, size=10)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "compute_per_step.png", out / "compute_per_step.pdf"]
    for path in paths:
        grid.figure.savefig(path, bbox_inches="tight", dpi=120)
    import matplotlib.pyplot as plt

    plt.close(grid.figure)
    return paths
