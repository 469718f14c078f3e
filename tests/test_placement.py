"""Layer placement on the parameter servers (issue 14, after arXiv 1901.05803): every
placement trains the all-reduce path's parameters, and the bytes each worker counted on
the wire show what each placement moves.

VGG small (two fully connected layers of 0.52M and 0.26M parameters against 23k in the
convolutions), 2 workers, 2 servers, plain ps-sync: the reference is the same run over
the all-reduce. ps-sync applies one update per step from every worker's sums, and the
tail server one update from every worker's tail gradients, so the parameters agree up to
float32 summation order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetbench.analysis.measures.traffic import per_endpoint, traffic_table
from hetbench.harness.records.results import Run, load_run
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import parse_run
from tests.conftest import completed_runs

STEPS = 4
SUITE = f"""
[suite]
name = "placement"

[defaults]
workload = "vgg"
size = "small"
global_batch = 32
steps = {STEPS}
lr = 0.05
optimizer = "momentum"
eval_every = 2
workers = [ {{}}, {{}} ]

[[runs]]
name = "allreduce"

[[runs]]
name = "data-parallel"
aggregator = {{ name = "ps-sync", servers = 2 }}
placement = "data-parallel"

[[runs]]
name = "sharded"
aggregator = {{ name = "ps-sync", servers = 2 }}
placement = "sharded"

[[runs]]
name = "fc-on-server"
aggregator = {{ name = "ps-sync", servers = 2 }}
placement = "fc-on-server"
"""


@pytest.fixture(scope="module")
def placed(tmp_path_factory) -> dict[str, Path]:
    return completed_runs(tmp_path_factory.mktemp("placement"), SUITE)


@pytest.mark.slow
def test_every_placement_trains_the_all_reduce_parameters(placed):
    reference = np.load(placed["allreduce"] / "params.npz")
    for name in ("data-parallel", "sharded", "fc-on-server"):
        params = np.load(placed[name] / "params.npz")
        for key in reference.files:
            np.testing.assert_allclose(params[key], reference[key], atol=2e-5,
                                       err_msg=f"{name} {key}")
    # the held-out evaluations read the tail's parameters from its server
    evals = load_run(placed["fc-on-server"]).evals
    assert evals["loss"].tolist() == pytest.approx(load_run(placed["allreduce"]).evals["loss"]
                                                   .tolist(), abs=1e-4)


@pytest.mark.slow
def test_the_wire_carries_what_each_placement_places(placed):
    four = 4  # bytes per float32
    meta = {n: json.loads((d / "manifest.json").read_text()) for n, d in placed.items()}
    spec = {p["server"]: p for p in meta["sharded"]["aggregator"]["placement"]}
    elements = sum(p["elements"] for p in spec.values())
    for name in ("data-parallel", "sharded"):
        workers, servers = per_endpoint(meta[name])
        # every parameter and the loss slot pushed and pulled once a step by each worker
        assert workers["sent_mb"].tolist() == pytest.approx([(elements + 1) * four / 1e6] * 2)
        assert workers["received_mb"].tolist() == workers["sent_mb"].tolist()
    dealt = per_endpoint(meta["data-parallel"])[1].set_index("server")["total_mb"]
    balanced = per_endpoint(meta["sharded"])[1].set_index("server")["total_mb"]
    # round-robin puts both fully connected weights on ps0: its load is the larger
    assert dealt.max() > balanced.max() and dealt["ps1"] < balanced["ps1"]
    # fc-on-server: the tail's 0.78M parameters never cross; a step moves the 23k
    # convolution parameters and a slice's activations (16 x 1024) and their gradients
    fc = meta["fc-on-server"]["aggregator"]["placement"]
    assert fc[-1]["elements"] == 0 and fc[-1]["computes"][0] == "fc1.weight"
    workers, _ = per_endpoint(meta["fc-on-server"])
    convolution = fc[0]["elements"]
    activations = 16 * 1024 * four + 16 * 8  # features, int64 labels
    expected_sent = ((convolution + 1) * four + activations) / 1e6
    assert workers["sent_mb"].tolist() == pytest.approx([expected_sent] * 2, rel=1e-6)
    assert workers["total_mb"].max() < balanced.max() / 10
    table = traffic_table([Run.of(m, load_run(placed[n]).steps) for n, m in meta.items()])
    assert sorted(table["placement"]) == ["data-parallel", "fc-on-server", "sharded"]


BASE = {"name": "p", "workload": "vgg", "size": "small", "global_batch": 32,
        "workers": [{}, {}], "aggregator": {"name": "ps-sync", "servers": 2}}


@pytest.mark.parametrize("change,words", [
    ({"placement": "layer-wise"}, "data-parallel, fc-on-server, sharded"),
    ({"aggregator": "torch", "placement": "sharded"}, "needs aggregator ps-sync"),
    ({"aggregator": "ps-async", "placement": "fc-on-server"}, "aggregator 'ps-sync'"),
    ({"workload": "mlp", "dataset": "digits", "placement": "fc-on-server"},
     "no convolutional layers"),
    ({"workers": [{}, {"framework": "tensorflow"}], "placement": "fc-on-server"},
     "framework 'pytorch'"),
])
def test_a_bad_placement_is_refused_naming_the_field(change, words):
    with pytest.raises(UsageError) as caught:
        parse_run({**BASE, **change}, "runs[0]")
    assert caught.value.where == "runs[0].placement" and words in caught.value.message
