"""A user's own PyTorch job, named by import path (`hetbench.Job`).

A suite's `workload = "mypkg.models:make"` (a module importable from the run's `project`
folder, by default the suite file's) or `workload = "train.py:make"` (a file in that folder)
names a factory: a function of no arguments that returns a `Job`. Each worker calls it
after `torch.manual_seed(run.seed)`; rank 0's parameters are then given to every worker.
hetbench slices each global batch of `train` over the workers and weights their gradients
so that an update is the whole batch's, whatever the slices (DESIGN.md, principle 4).

The model may be any `torch.nn.Module` (BatchNorm, dropout, buffers, tied weights, any
forward): what hetbench cannot make exact is measured at the start of each run and recorded
(harness/loop/exactness.py). This module imports no framework at its top: the suite check
and the CLI read `JOB_PATTERN` without torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

REDUCTIONS = ("mean", "sum")
# "package.module:factory" or "file.py:factory" (a path relative to the project folder)
JOB_PATTERN = re.compile(r"(?P<module>[A-Za-z_][\w.]*|[\w./-]+\.py):(?P<attr>[A-Za-z_]\w*)")
# what hetbench imports in a worker: a project folder holding one of these would shadow it
NEEDED_MODULES = ("hetbench", "torch", "numpy", "pandas", "pyarrow", "psutil", "scipy",
                  "sklearn", "PIL", "tqdm", "matplotlib", "seaborn")
FINGERPRINT_SAMPLES = 8  # samples read into a data set's fingerprint, spread over it
# the layers' composition against the model's forward, relative to the output's largest
# element: float32 arithmetic in another order differs by ~1e-7, a missing layer by ~1
LAYER_TOLERANCE = 1e-5


class JobError(ValueError):
    """What is wrong with a factory or its Job, in one line (the suite key is the caller's)."""


@dataclass(frozen=True)
class Job:
    """What a factory returns: the model, its loss and the data it trains on (each field's
    meaning: FIELD_HELP, also the reference's table)."""

    model: torch.nn.Module
    loss: Callable[[Any, Any], torch.Tensor]
    reduction: str
    train: torch.utils.data.Dataset[Any]
    heldout: torch.utils.data.Dataset[Any] | None = None
    metric: Callable[[Any, Any], tuple[float, float]] | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    split: Callable[[Any], tuple[Any, Any]] | None = None
    optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None = None
    layers: Callable[[torch.nn.Module], Sequence[torch.nn.Module]] | None = None

    def batch_parts(self, batch: Any) -> tuple[Any, Any]:
        """(inputs, targets) of a collated batch."""
        if self.split is not None:
            return self.split(batch)
        inputs, targets = batch
        return inputs, targets


FIELD_HELP = {
    "model": "any torch.nn.Module (BatchNorm, dropout, buffers, tied weights, any forward), "
             "its parameters and buffers on the CPU: hetbench moves it to each worker's "
             "device. Called as `model(inputs)`, or `model(**inputs)` where inputs is a "
             "mapping.",
    "loss": "`loss(outputs, targets)`: a 0-dim tensor over a batch, reduced as `reduction` "
            "says (torch's losses with that reduction are such functions).",
    "reduction": "required: \"mean\" over the batch's samples or \"sum\". hetbench makes "
                 "each worker's loss its slice's sum (a mean times the slice's samples), so "
                 "the workers' gradients add up to the global batch's; the suite's `lr` "
                 "applies to the global batch's mean gradient under both.",
    "train": "a map-style torch.utils.data.Dataset with `__len__`: hetbench picks each "
             "worker's samples by index, through torch's DataLoader.",
    "heldout": "the same kind of Dataset, evaluated every `eval_every` steps outside the "
               "timed steps; None: no held-out evaluation.",
    "metric": "`metric(outputs, targets) -> (correct, counted)` summed over a batch: the "
              "held-out accuracy is correct / counted; None: the loss alone.",
    "collate_fn": "makes a batch of a list of samples, as DataLoader's collate_fn; None: "
                  "torch's default_collate (samples of equal shapes).",
    "split": "a collated batch -> (inputs, targets); None: the batch is that pair.",
    "optimizer": "`optimizer(parameters) -> torch.optim.Optimizer` over the model's trained "
                 "parameters (every one of them), with its own learning rate: each worker "
                 "steps it once per global step on the global batch's mean gradient, in "
                 "place of the suite's `optimizer` and `lr`; for the all-reduce schemes "
                 "(torch, allreduce-host, allreduce-device, ddp). None: the suite's.",
    "layers": "`layers(model) -> [module, ...]`: the model cut into consecutive layers, "
              "each taking the one tensor the one before returns (the first the batch's "
              "inputs, a tensor), their composition the model's forward, sharing its "
              "parameters, each trained parameter in one layer and the layers' parameters "
              "in the model's order; what pipelines (`virtual_workers`) cut into stages. "
              "Called with the model hetbench trains (moved to the worker's device). None: "
              "no pipelines.",
}


def is_job(workload: str) -> bool:
    """A workload named by import path rather than a built-in name."""
    return ":" in workload


def parse_reference(workload: str) -> tuple[str, str]:
    """(module or file, factory name); JobError names what a reference looks like."""
    match = JOB_PATTERN.fullmatch(workload)
    if match is None:
        raise JobError(f"{workload!r} is not a factory's import path (allowed: a built-in "
                       "name, 'package.module:factory' or 'file.py:factory')")
    return match["module"], match["attr"]


def shadowed(project: Path) -> list[str]:
    """Modules hetbench needs that the project folder would shadow on the import path."""
    return [name for name in NEEDED_MODULES
            if (project / name).is_dir() or (project / f"{name}.py").is_file()]


@contextmanager
def on_import_path(folder: Path) -> Iterator[None]:
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        try:
            sys.path.remove(str(folder))
        except ValueError:
            pass


def load_factory(workload: str, project: Path) -> Callable[[], Any]:
    """The factory `workload` names, imported from `project`. The folder stays on the
    import path while the worker runs: the factory's module may import its neighbours
    later (a Dataset's __getitem__ in a DataLoader process)."""
    module_name, attr = parse_reference(workload)
    if shadows := shadowed(project):
        raise JobError(f"the project folder {project} holds {', '.join(shadows)}, which "
                       "would shadow what hetbench imports: rename it")
    if str(project) not in sys.path:
        sys.path.insert(0, str(project))
    try:
        if module_name.endswith(".py"):
            module = _import_file(project / module_name)
        else:
            module = importlib.import_module(module_name)
    except JobError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the user's import is reported
        raise JobError(f"cannot import {module_name!r} from {project}: "
                       f"{type(exc).__name__}: {first_line(exc)}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise JobError(f"{module_name!r} has no function {attr!r}")
    return factory  # type: ignore[no-any-return]


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise JobError(f"no file {path}")
    name = f"hetbench_job_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise JobError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_job(workload: str, project: Path, seed: int) -> Job:
    """Import the factory, call it with torch seeded, check what it returns."""
    import torch

    factory = load_factory(workload, project)
    torch.manual_seed(seed)
    try:
        job = factory()
    except Exception as exc:  # noqa: BLE001 - the factory's own error, reported in one line
        raise JobError(f"{workload} raised {type(exc).__name__}: {first_line(exc)}") from exc
    check_job(job, workload)
    return job  # type: ignore[no-any-return]


def check_job(job: Any, workload: str) -> None:
    """What a Job must be before a worker trains it; JobError names the field."""
    import torch
    from torch.utils.data import Dataset, IterableDataset

    if not isinstance(job, Job):
        raise JobError(f"{workload} returned {type(job).__name__}, not a hetbench.Job")
    if not isinstance(job.model, torch.nn.Module):
        raise JobError(f"Job.model is {type(job.model).__name__}, not a torch.nn.Module")
    if job.reduction not in REDUCTIONS:
        raise JobError(f"Job.reduction is {job.reduction!r} (allowed: 'mean' over the "
                       "batch's samples, 'sum'): hetbench weights the slices by it")
    if not callable(job.loss):
        raise JobError("Job.loss is not callable (loss(outputs, targets) -> a 0-dim tensor)")
    if not any(p.requires_grad for p in job.model.parameters()):
        raise JobError(f"Job.model ({type(job.model).__name__}) has no trained parameter "
                       "(none with requires_grad): there is no gradient to train or exchange")
    devices = {p.device for p in job.model.parameters()} | {
        b.device for b in job.model.buffers()}
    if len(devices) > 1:
        raise JobError("Job.model's parameters sit on several devices "
                       f"({', '.join(sorted(map(str, devices)))}): give it on the CPU, "
                       "hetbench moves it to each worker's device")
    for name in ("train", "heldout"):
        data = getattr(job, name)
        if data is None and name == "heldout":
            continue
        if isinstance(data, IterableDataset) or not isinstance(data, Dataset) \
                or not hasattr(data, "__len__"):
            raise JobError(f"Job.{name} is {type(data).__name__}, not a map-style "
                           "torch.utils.data.Dataset with __len__ (hetbench picks each "
                           "worker's samples by index)")
        if len(data) == 0:  # type: ignore[arg-type]
            raise JobError(f"Job.{name} holds no sample")
    for name in ("metric", "collate_fn", "split", "optimizer", "layers"):
        if getattr(job, name) is not None and not callable(getattr(job, name)):
            raise JobError(f"Job.{name} is not callable")
    if job.optimizer is not None:
        own_optimizer(job)


def own_optimizer(job: Job) -> torch.optim.Optimizer:
    """The job's optimizer over its trained parameters; JobError where it is not a torch
    optimizer or leaves a trained parameter out (it would never change)."""
    import torch

    assert job.optimizer is not None
    trained = [p for p in job.model.parameters() if p.requires_grad]
    try:
        optimizer = job.optimizer(trained)
    except Exception as exc:  # noqa: BLE001 - the user's code, reported in one line
        raise JobError(f"Job.optimizer raised {type(exc).__name__}: {first_line(exc)}") from exc
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise JobError(f"Job.optimizer returned {type(optimizer).__name__}, not a "
                       "torch.optim.Optimizer")
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if missing := [name for name, p in job.model.named_parameters()
                   if p.requires_grad and id(p) not in held]:
        raise JobError(f"Job.optimizer leaves out trained parameters ({_few(missing)}): "
                       "give it every one of them")
    return optimizer


def job_layers(job: Job, model: torch.nn.Module) -> list[torch.nn.Module]:
    """`Job.layers(model)`, checked: modules sharing `model`'s parameters, each trained one
    in exactly one layer, the layers' parameters in the model's order (a stage's are then
    one range of the flat buffer, harness/loop/stage.py)."""
    import torch

    assert job.layers is not None
    try:
        layers = list(job.layers(model))
    except Exception as exc:  # noqa: BLE001 - the user's code, reported in one line
        raise JobError(f"Job.layers raised {type(exc).__name__}: {first_line(exc)}") from exc
    if len(layers) < 2 or not all(isinstance(m, torch.nn.Module) for m in layers):
        raise JobError("Job.layers must return two or more torch.nn.Modules (a pipeline "
                       "cuts between them)")
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    order = {id(p): i for i, (_, p) in enumerate(trained)}
    seen: list[int] = []
    for layer in layers:
        for p in layer.parameters():
            if p.requires_grad:
                if id(p) not in order:
                    raise JobError("Job.layers returned a layer whose parameters are not "
                                   "the model's: build the layers from the model given")
                seen.append(order[id(p)])
    if missing := [name for i, (name, _) in enumerate(trained) if i not in seen]:
        raise JobError(f"Job.layers leaves trained parameters out of every layer "
                       f"({_few(missing)}): each must sit in exactly one layer")
    if twice := sorted({trained[i][0] for i in seen if seen.count(i) > 1}):
        raise JobError(f"Job.layers puts parameters in more than one layer ({_few(twice)}): "
                       "a weight tied across layers cannot be cut into stages")
    if seen != sorted(seen):
        raise JobError("Job.layers: the layers' parameters must come in the model's "
                       "order (model.parameters()), so that a stage's are consecutive")
    return layers


def check_layers(job: Job) -> None:
    """The layers composed in order compute the model's forward, on a few training samples
    with the model in eval mode (dropout off), its buffers untouched."""
    import torch

    if job.layers is None:
        return
    layers = job_layers(job, job.model)
    inputs, _ = read_batch(job, job.train, range(min(4, len(job.train))))  # type: ignore[arg-type]
    if not isinstance(inputs, torch.Tensor):
        raise JobError(f"Job.layers: a pipeline sends one tensor between stages, and the "
                       f"batch's inputs are {type(inputs).__name__}: give a tensor")
    was_training = job.model.training
    job.model.eval()
    try:
        with torch.no_grad():
            whole = job.model(inputs)
            composed = inputs
            for layer in layers:
                composed = layer(composed)
    except Exception as exc:  # noqa: BLE001 - the user's layers, reported in one line
        raise JobError(f"Job.layers: composing the layers raised {type(exc).__name__}: "
                       f"{first_line(exc)}") from exc
    finally:
        job.model.train(was_training)
    if not isinstance(whole, torch.Tensor) or not isinstance(composed, torch.Tensor) \
            or composed.shape != whole.shape:
        raise JobError("Job.layers: the last layer's output is not the model's output "
                       f"({_shape(composed)} against {_shape(whole)})")
    scale = max(float(whole.abs().max()), 1e-12)
    if (gap := float((composed - whole).abs().max()) / scale) > LAYER_TOLERANCE:
        raise JobError(f"Job.layers: the layers composed differ from the model's forward "
                       f"by {gap:.2g} of its largest output (at most {LAYER_TOLERANCE:g}): "
                       "a layer missing, or work the forward does between them")


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return type(value).__name__ if shape is None else str(tuple(shape))


def collate(job: Job, samples: list[Any]) -> Any:
    from torch.utils.data import default_collate

    return (job.collate_fn or default_collate)(samples)


def read_batch(job: Job, dataset: Any, indices: Iterable[int]) -> tuple[Any, Any]:
    """(inputs, targets) of the samples at `indices`, read and collated in this process."""
    return job.batch_parts(collate(job, [dataset[int(i)] for i in indices]))


def check_batches(job: Job, global_batch: int) -> None:
    """The data can make a global batch: enough samples, and a few collate into a batch
    that splits into inputs and targets."""
    count = len(job.train)  # type: ignore[arg-type]
    if count < global_batch:
        raise JobError(f"Job.train holds {count} samples, fewer than one global batch "
                       f"({global_batch})")
    for name, data in (("train", job.train), ("heldout", job.heldout)):
        if data is None:
            continue
        few = range(min(4, len(data)))  # type: ignore[arg-type]
        try:
            read_batch(job, data, few)
        except Exception as exc:  # noqa: BLE001 - reported as the data's problem
            hint = ("" if job.collate_fn is not None else
                    " (samples of unequal shapes need Job.collate_fn)")
            raise JobError(f"Job.{name}: samples {list(few)} do not make a batch: "
                           f"{type(exc).__name__}: {first_line(exc)}{hint}") from exc


def fingerprint(dataset: Any) -> str:
    """A data set's identity, cheaply: its own fingerprint() where it has one (hetbench's
    folder readers), else its type, length and a few samples' bytes."""
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        return str(own())
    digest = hashlib.sha256(f"{type(dataset).__qualname__}:{len(dataset)}".encode())
    count = len(dataset)
    for i in sorted({count * k // FINGERPRINT_SAMPLES for k in range(FINGERPRINT_SAMPLES)}):
        _digest_sample(digest, dataset[i])
    return digest.hexdigest()[:16]


def _digest_sample(digest: Any, value: Any) -> None:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(value, np.ndarray):
        digest.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(str(key).encode())
            _digest_sample(digest, value[key])
    elif isinstance(value, list | tuple):
        for item in value:
            _digest_sample(digest, item)
    else:
        digest.update(repr(value).encode())


def layers_of(model: torch.nn.Module, kinds: tuple[type, ...]) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, kinds)]


def describe(job: Job, workload: str) -> dict[str, Any]:
    """What the manifest and the suite check say of a job (JSON)."""
    import torch

    model = job.model
    trained = [p for p in model.parameters() if p.requires_grad]
    layers = None if job.layers is None else job_layers(job, model)
    return {
        "factory": workload,
        "model": type(model).__qualname__,
        "parameters": sum(p.numel() for p in trained),
        # each trained tensor's elements in the flat buffer's order: what the parameter
        # servers' shards and placements cut (advise's placements read it)
        "tensors": [p.numel() for p in trained],
        "frozen_parameters": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        "buffers": sum(b.numel() for b in model.buffers()),
        "reduction": job.reduction,
        "batchnorm": layers_of(model, (torch.nn.modules.batchnorm._BatchNorm,)),
        "dropout": [name for name, m in model.named_modules()  # those that draw masks
                    if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0],
        "train": data_identity(job.train),
        "heldout": None if job.heldout is None else data_identity(job.heldout),
        "metric": job.metric is not None,
        "optimizer": None if job.optimizer is None else optimizer_identity(own_optimizer(job)),
        "layers": None if layers is None else len(layers),
    }


def tail_facts(job: Job) -> dict[str, Any]:
    """What fc-on-server asks of a job (harness/run/jobcheck.py): its last layer's trained
    elements and buffers, and whether a batch's labels are one array. Learnt by the job
    check alone: reading a batch may draw random numbers (a collate that masks), which a
    worker's stream must not lose."""
    import numpy as np
    import torch

    if job.layers is None:
        return {}
    last = job_layers(job, job.model)[-1]
    with torch.random.fork_rng():
        _, targets = read_batch(job, job.train, range(min(2, len(job.train))))  # type: ignore[arg-type]
    return {"last_layer_parameters": sum(p.numel() for p in last.parameters()
                                         if p.requires_grad),
            "last_layer_buffers": sum(b.numel() for b in last.buffers()),
            "tensor_targets": isinstance(targets, torch.Tensor | np.ndarray)}


def optimizer_identity(optimizer: Any) -> dict[str, Any]:
    """A job's own optimizer as the manifest records it: its type and its first parameter
    group's settings (numbers, strings and booleans)."""
    group = optimizer.param_groups[0]
    return {"type": f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
            **{k: v for k, v in group.items()
               if k != "params" and isinstance(v, int | float | str | bool)}}


def data_identity(dataset: Any) -> dict[str, Any]:
    return {"type": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
            "source": str(getattr(dataset, "source", "")) or None,
            "samples": len(dataset), "fingerprint": fingerprint(dataset)}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def replace(job: Job, **changes: Any) -> Job:
    return dataclasses.replace(job, **changes)
