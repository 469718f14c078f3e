"""The input pipeline's options (`loader`) and their check; the pipeline itself is
harness/training/loader.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import (
    MAX_LOADER_WORKERS,
    MAX_PREFETCH,
    boolean,
    check_keys,
    choice,
    integer,
    table,
)

KINDS = ("threads", "processes")


@dataclass(frozen=True)
class LoaderSpec:
    workers: int = 2
    prefetch: int = 4  # steps made ahead
    kind: str = "threads"
    decode: bool = False  # images stored as PNG, decoded per batch
    augment: bool = False  # random crop and flip, fixed by (seed, step, place in the batch)
    # a job named by import path (torch's DataLoader): its batches in page-locked memory
    pin_memory: bool = False


LOADER_KEYS = {"workers", "prefetch", "kind", "decode", "augment", "pin_memory"}


def parse_loader(raw: Any, images: bool, where: str, job: bool = False) -> LoaderSpec | None:
    """`{ workers = 2, prefetch = 4, kind = "threads", decode = true, augment = true }`;
    decode and augment only where the samples are images with a label. A job named by import
    path loads through torch's DataLoader: its processes (kind "processes"), `prefetch` per
    process (DataLoader's prefetch_factor) and `pin_memory`; its own Dataset decodes."""
    if raw is None:
        return None
    raw = table(raw, where)
    default = LoaderSpec  # the fields' defaults, written once there
    check_keys(raw, LOADER_KEYS, where)
    workers = integer(raw.get("workers", default.workers), f"{where}.workers", minimum=1,
                      maximum=MAX_LOADER_WORKERS)
    prefetch = integer(raw.get("prefetch", default.prefetch), f"{where}.prefetch", minimum=1,
                       maximum=MAX_PREFETCH)
    decode = boolean(raw.get("decode", default.decode), f"{where}.decode")
    augment = boolean(raw.get("augment", default.augment), f"{where}.augment")
    pin_memory = boolean(raw.get("pin_memory", default.pin_memory), f"{where}.pin_memory")
    for key, on in (("decode", decode), ("augment", augment)):
        if on and (job or not images):
            raise UsageError(f"{where}.{key}", "only for image classification workloads "
                             "(mlp, cnn, resnet, vgg); a job's own Dataset decodes and "
                             "augments")
    if pin_memory and not job:
        raise UsageError(f"{where}.pin_memory", "only for a workload named by import path "
                         "(torch's DataLoader pins its batches)")
    kind = choice(raw.get("kind", "processes" if job else default.kind), KINDS,
                  f"{where}.kind")
    if job and kind != "processes":
        raise UsageError(f"{where}.kind", f"{kind!r} is not allowed for a workload named by "
                         "import path (allowed: 'processes': torch's DataLoader workers)")
    return LoaderSpec(workers=workers, prefetch=prefetch, kind=kind, decode=decode,
                      augment=augment, pin_memory=pin_memory)


def worker_loader(loader: LoaderSpec | None, workers: int | None) -> LoaderSpec | None:
    """A worker's input pipeline: the run's, with the worker's own number of processes
    (threads) where it sets `loader_workers` (0: it loads in the training process)."""
    if loader is None or workers is None:
        return loader
    return replace(loader, workers=workers)
