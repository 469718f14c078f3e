"""The optimizers by name, their options and the check of a run's `optimizer` key. The
update rules are in harness/training/optim.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import (
    MAX_EPS,
    MAX_LR,
    MAX_STEPS,
    MAX_WEIGHT_DECAY,
    boolean,
    check_keys,
    choice,
    integer,
    number,
    table,
)

OPTIMIZERS = ("sgd", "momentum", "adamw")


DECAYS = ("none", "cosine", "linear")


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "sgd"
    momentum: float = 0.9
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    decay: str = "none"
    min_lr: float = 0.0


# optimizer key -> the optimizers it applies to
OPTIMIZER_KEYS = {"name": OPTIMIZERS, "weight_decay": OPTIMIZERS, "warmup_steps": OPTIMIZERS,
                  "decay": OPTIMIZERS, "min_lr": OPTIMIZERS, "momentum": ("momentum",),
                  "nesterov": ("momentum",), "beta1": ("adamw",), "beta2": ("adamw",),
                  "eps": ("adamw",)}


def parse_optimizer(raw: Any, lr: float, steps: int, where: str) -> OptimizerSpec:
    """`"adamw"` or `{ name = "adamw", weight_decay = 0.01, warmup_steps = 10, ... }`."""
    if isinstance(raw, str):
        raw = {"name": raw}
    raw = table(raw, where)
    default = OptimizerSpec  # the fields' defaults, written once there
    check_keys(raw, set(OPTIMIZER_KEYS), where)
    name = choice(raw.get("name", default.name), OPTIMIZERS, f"{where}.name")
    for key in raw:
        if name not in OPTIMIZER_KEYS[key]:
            raise UsageError(f"{where}.{key}", f"only allowed with optimizer "
                             f"{' or '.join(repr(o) for o in OPTIMIZER_KEYS[key])}, not {name!r}")

    def fraction(key: str) -> float:  # 0 <= value < 1
        return number(raw.get(key, getattr(default, key)), f"{where}.{key}", minimum=0.0,
                      maximum=1.0, below_maximum=True)

    warmup = integer(raw.get("warmup_steps", default.warmup_steps), f"{where}.warmup_steps",
                     minimum=0, maximum=MAX_STEPS)
    if warmup > steps:
        raise UsageError(f"{where}.warmup_steps", f"{warmup} exceeds steps ({steps})")
    min_lr = number(raw.get("min_lr", default.min_lr), f"{where}.min_lr", minimum=0.0,
                    maximum=MAX_LR)
    if min_lr > lr:
        raise UsageError(f"{where}.min_lr", f"{min_lr} is above lr ({lr})")
    return OptimizerSpec(
        name=name, momentum=fraction("momentum"),
        nesterov=boolean(raw.get("nesterov", default.nesterov), f"{where}.nesterov"),
        beta1=fraction("beta1"), beta2=fraction("beta2"),
        eps=number(raw.get("eps", default.eps), f"{where}.eps", minimum=0.0, maximum=MAX_EPS,
                   strict=True),
        weight_decay=number(raw.get("weight_decay", default.weight_decay),
                            f"{where}.weight_decay", minimum=0.0, maximum=MAX_WEIGHT_DECAY),
        warmup_steps=warmup,
        decay=choice(raw.get("decay", default.decay), DECAYS, f"{where}.decay"),
        min_lr=min_lr)
