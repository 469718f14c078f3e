"""Framework-neutral workloads: model specs (parameter names, shapes, initial values), data
with a held-out split, and each framework's builder beside its spec:

    workloads/<name>/__init__.py     WORKLOAD: data sets, loss, metric, spec at each size
    workloads/<name>/pytorch.py      build(spec) -> nn.Module returning logits
    workloads/<name>/tensorflow.py   logits(spec, variables, x) in raw TensorFlow ops
    workloads/<name>/mxnet.py        build(spec) -> (HybridBlock, {spec name: Parameter})

Adding a workload is one new package and one line here; nothing here imports a framework.
"""

from __future__ import annotations

import importlib

from hetbench.workloads.models import DEFAULT_SIZE, ModelSpec, Workload

WORKLOADS: dict[str, str] = {
    "mlp": "hetbench.workloads.mlp:WORKLOAD",
    "cnn": "hetbench.workloads.cnn:WORKLOAD",
    "lstm": "hetbench.workloads.lstm:WORKLOAD",
    "resnet": "hetbench.workloads.resnet:WORKLOAD",
    "vgg": "hetbench.workloads.vgg:WORKLOAD",
    "transformer": "hetbench.workloads.transformer:WORKLOAD",
    "bert": "hetbench.workloads.bert:WORKLOAD",
    "captioning": "hetbench.workloads.captioning:WORKLOAD",
}
DATASETS: dict[str, str] = {
    "digits": "hetbench.workloads.data:load_digits",
    "text": "hetbench.workloads.data:load_text",
    "synthetic": "hetbench.workloads.data:load_synthetic",
    "scenes": "hetbench.workloads.data:load_scenes",
    "numbers": "hetbench.workloads.data:load_numbers",
}


def get_workload(name: str) -> Workload:
    module_name, attr = WORKLOADS[name].split(":")
    return getattr(importlib.import_module(module_name), attr)  # type: ignore[no-any-return]


def build_spec(workload: str, sample_shape: tuple[int, ...], num_classes: int,
               size: str = DEFAULT_SIZE) -> ModelSpec:
    """The model of `workload` at `size` for samples of `sample_shape` and `num_classes`."""
    return get_workload(workload).spec(size, tuple(sample_shape), num_classes)
