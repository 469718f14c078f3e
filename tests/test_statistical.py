"""analysis/tables/statistical.py: the steps-to-target model on schemes whose truth is known."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from hetbench.analysis.advice import advisor
from hetbench.analysis.tables import statistical

BSP_STEPS = 80.0
TRUTH = (0.2, 1.5, 0.1)  # per unit of staleness, of dropped share, per extra local step


def points(rows: list[tuple[str, float, float, float]]) -> pd.DataFrame:
    """Schemes (name, staleness, dropped, H) whose steps to target follow TRUTH."""
    frame = pd.DataFrame(rows, columns=["run", *statistical.FEATURES])
    x = statistical.design(frame)
    frame["steps_to_target"] = BSP_STEPS * (1 + x @ TRUTH)
    frame["repeats"] = frame["reached"] = 3
    return frame


SYNC = [("bsp", 0, 0, 1), ("ssp1", 0.8, 0, 1), ("ssp2", 1.4, 0, 1), ("ps-async", 2.5, 0, 1),
        ("backup1", 0.3, 0.33, 1), ("local4", 0, 0, 4), ("local8", 0, 0, 8)]


def test_the_fit_recovers_the_coefficients() -> None:
    model = statistical.fit(points(SYNC))
    assert model is not None and model.bsp_steps == BSP_STEPS
    assert model.coefficients == pytest.approx(TRUTH)
    assert model.steps(1.0, 0.0, 2) == pytest.approx(BSP_STEPS * (1 + 0.2 + 0.1))


def test_each_scheme_predicted_from_the_others() -> None:
    table = statistical.leave_one_out(points(SYNC)).set_index("run")
    assert set(table.index) == {"ssp1", "ssp2", "ps-async", "backup1", "local4", "local8"}
    # every feature is moved by another scheme too, except the dropped share (backup1)
    assert table.drop("backup1")["error"].abs().max() < 1e-9
    assert math.isnan(table.loc["backup1", "predicted"])


def test_without_bsp_there_is_no_model_and_unmoved_features_stay_unknown() -> None:
    assert statistical.fit(points(SYNC[1:])) is None
    model = statistical.fit(points(SYNC[:3]))  # staleness only
    assert model is not None and model.coefficients[0] == pytest.approx(TRUTH[0])
    assert math.isnan(model.coefficients[2]) and math.isnan(model.steps(0, 0, 4))
    assert model.steps(0, 0, 1) == BSP_STEPS  # BSP's own gradient needs no coefficient


def test_schemes_not_reached_are_left_out_of_the_fit() -> None:
    frame = points(SYNC)
    frame.loc[frame["run"] == "ps-async", "steps_to_target"] = float("nan")
    model = statistical.fit(frame)
    assert model is not None and "ps-async" not in model.schemes


def test_the_advisor_ranks_stale_remedies_by_their_predicted_steps() -> None:
    model = statistical.fit(points(SYNC))
    rows = [{"remedy": "recorded", "label": "recorded", "kind": "recorded", "exact": True,
             "seconds": 10.0, "train_seconds": 9.0, "steps": 100, "mean_staleness": 0.0,
             "dropped_fraction": 0.0, "period": 1},
            {"remedy": "ssp2", "label": "ssp:2", "kind": "scheme", "exact": False,
             "seconds": 5.0, "train_seconds": 4.5, "steps": 100, "mean_staleness": 2.0,
             "dropped_fraction": 0.0, "period": 1}]
    ranked = advisor.rank(rows, 60, model).set_index("remedy")
    # 60 steps x (1 + 0.2 x 2) at 0.045 s a step on the training clock (the evaluations
    # left out, as the measured time to target is)
    assert ranked.loc["ssp2", "steps_to_target"] == pytest.approx(84.0)
    assert ranked.loc["ssp2", "time_to_target_s"] == pytest.approx(3.78)
    assert ranked.loc["recorded", "time_to_target_s"] == pytest.approx(5.4)
    assert ranked.loc["ssp2", "rank"] == 1
    unknown = advisor.rank(rows, 60, None).set_index("remedy")
    assert math.isnan(unknown.loc["ssp2", "time_to_target_s"])
    assert unknown.loc["recorded", "rank"] == 1  # the unpredicted rank after the rest
