"""Impossible values named (issue 72): a job whose inputs hold NaN trains to a NaN loss;
its run says so at its end and in its report, and its exactness is "not measured", not
"within nan"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.view.metrics import loss_not_finite
from tests.conftest import Spawn, hetbench_command

FACTORY = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
import hetbench


def make():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long()
    x[5, 3] = float("nan")  # one bad value in the data set: in step 0's global batch
    return hetbench.Job(model=nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)),
                        loss=nn.CrossEntropyLoss(), reduction="mean",
                        train=TensorDataset(x[:192], y[:192]),
                        heldout=TensorDataset(x[192:], y[192:]))
'''

SUITE = """
[suite]
name = "nonfinite"

[[runs]]
name = "pair"
workload = "nanjob:make"
steps = 4
global_batch = 32
workers = [ { threads = 1 }, { threads = 1 } ]
"""


@pytest.mark.slow
def test_a_nan_input_is_warned_at_the_runs_end_and_in_its_report(tmp_path: Path,
                                                                  spawn: Spawn) -> None:
    (tmp_path / "nanjob.py").write_text(FACTORY)
    (tmp_path / "suite.toml").write_text(SUITE)
    done = spawn.run(hetbench_command("run", "suite.toml", "--out", "out"), cwd=tmp_path,
                     capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "warning: the loss was not finite (NaN or inf) at 4 of 4 steps, first at step 0" \
        in done.stdout, done.stdout
    (run_dir,) = (tmp_path / "out" / "nonfinite").glob("pair-r0-*")
    exactness = json.loads((run_dir / "manifest.json").read_text())["exactness"]
    assert exactness["max_relative_difference"] is None
    assert exactness["reason"].startswith("not measured: the whole batch's gradient is not "
                                          "finite"), exactness
    report = spawn.run(hetbench_command("report", str(run_dir), "--no-figures"),
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (run_dir / "report.md").read_text() if (run_dir / "report.md").is_file() else \
        next((tmp_path / "out").rglob("report.md")).read_text()
    assert "**Warning**: the loss was not finite" in text
    assert "within nan" not in text
    assert "gradient is not finite" in text


def steps(losses: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"step": np.repeat(np.arange(len(losses)), 2),
                         "loss": np.repeat(losses, 2)})


def test_a_finite_loss_says_nothing_and_a_nan_or_inf_one_is_counted() -> None:
    assert loss_not_finite(steps([1.0, 0.9, 0.8])) is None
    said = loss_not_finite(steps([1.0, float("inf"), float("nan"), 0.5]))
    assert said is not None and said.startswith(
        "the loss was not finite (NaN or inf) at 2 of 4 steps, first at step 1")
    # imported traces measure no loss (all NaN): nothing to warn of
    assert loss_not_finite(steps([float("nan")] * 3), measured=False) is None
