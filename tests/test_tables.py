"""harness/spec/tables.py: a run written as a [[runs]] table reads back as the same run."""

from __future__ import annotations

import pytest

from hetbench.harness.spec.builtin import builtin_suites
from hetbench.harness.spec.suite import _parse_toml, load_suite, parse_suite
from hetbench.harness.spec.tables import run_table, suite_text, toml_value

BUILTIN = [(name, run) for name in builtin_suites() for run in load_suite(name).runs]


@pytest.mark.parametrize(("suite", "run"), BUILTIN, ids=[f"{s}-{r.name}" for s, r in BUILTIN])
def test_every_builtin_run_reads_back_as_itself(suite: str, run) -> None:  # type: ignore[no-untyped-def]
    text = suite_text("again", "written back", 2, [run_table(run)], comment="a\n\nb")
    back = parse_suite(_parse_toml(text, "again.toml"), "again.toml")
    assert back.runs == (run,)
    assert back.repeats == 2 and text.startswith("# a\n#\n# b\n[suite]")


def test_only_what_differs_from_the_defaults_is_written() -> None:
    run = next(r for s, r in BUILTIN if s == "sync" and r.name == "ssp2")
    table = run_table(run)
    assert table["aggregator"] == {"name": "ssp", "staleness": 2}
    assert "partition" not in table and "seed" not in table
    assert table["workers"][0] == {}


def test_a_pipelined_run_is_written_as_a_suite_gives_it() -> None:
    """Its allocation, not the groups it made; its wave bound's exchange not written."""
    runs = {r.name: r for r in load_suite("pipeline").runs}
    table = run_table(runs["hetpipe-1f1b-d2"])
    assert table["virtual_workers"] == {"allocation": "spread", "size": 2}
    assert table["pipeline"] == {"schedule": "1f1b", "wave_bound": 2}
    assert "aggregator" not in table and runs["hetpipe-1f1b-d2"].aggregator.name == "wsp"
    given = parse_suite({"runs": [{"name": "p", "workers": [{}, {}, {}],
                                   "virtual_workers": [[2, 0], [1]]}]}).runs[0]
    assert run_table(given)["virtual_workers"] == [[2, 0], [1]]


@pytest.mark.parametrize(("value", "written"), [
    ("a \"b\"", '"a \\"b\\""'), (True, "true"), (2, "2"), (0.5, "0.5"),
    ([1, [2, 3]], "[1, [2, 3]]"),
    ({}, "{}"), ({"p": 0.2, "f": "x"}, '{ p = 0.2, f = "x" }'),
])
def test_inline_values(value: object, written: str) -> None:
    assert toml_value(value) == written


def test_values_without_a_toml_form() -> None:
    with pytest.raises(ValueError):
        toml_value(float("nan"))
    with pytest.raises(ValueError):
        toml_value(None)
