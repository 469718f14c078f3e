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

from workloads.models import DEFAULT_SIZE, ModelSpec, Workload

WORKLOADS: dict[str, str] = {
    "mlp": "workloads.mlp:WORKLOAD",
    "cnn": "workloads.cnn:WORKLOAD",
    "lstm": "workloads.lstm:WORKLOAD",
    "resnet": "workloads.resnet:WORKLOAD",
    "vgg": "workloads.vgg:WORKLOAD",
    "transformer": "workloads.transformer:WORKLOAD",
    "bert": "workloads.bert:WORKLOAD",
    "captioning": "workloads.captioning:WORKLOAD",
}
DATASETS: dict[str, str] = {
    "digits": "workloads.data:load_digits",
    "text": "workloads.data:load_text",
    "synthetic": "workloads.data:load_synthetic",
    "scenes": "workloads.data:load_scenes",
    "numbers": "workloads.data:load_numbers",
}


def get_workload(name: str) -> Workload:
    module_name, attr = WORKLOADS[name].split(":")
    return getattr(importlib.import_module(module_name), attr)  # type: ignore[no-any-return]


def build_spec(workload: str, sample_shape: tuple[int, ...], num_classes: int,
               size: str = DEFAULT_SIZE) -> ModelSpec:
    """The model of `workload` at `size` for samples of `sample_shape` and `num_classes`."""
    return get_workload(workload).spec(size, tuple(sample_shape), num_classes)
