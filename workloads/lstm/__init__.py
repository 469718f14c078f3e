"""lstm: character language model: embedding, one LSTM layer, dense decoder over the
vocabulary; every position predicts the next character."""

from __future__ import annotations

import math

from hetbench.workloads.models import ModelSpec, ParamSpec, Workload, check_size, dense

WIDTHS = {"tiny": (16, 64), "small": (32, 128), "base": (64, 512)}  # (embedding, hidden)


def spec(size: str, sample_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    check_size("lstm", size)
    vocab, (e, h) = num_classes, WIDTHS[size]
    bound = 1.0 / math.sqrt(h)
    params = [
        ParamSpec("embed.weight", (vocab, e), 0.1),
        ParamSpec("lstm.weight_ih", (4 * h, e), bound),
        ParamSpec("lstm.weight_hh", (4 * h, h), bound),
        ParamSpec("lstm.bias_ih", (4 * h,), bound),
        ParamSpec("lstm.bias_hh", (4 * h,), bound),
        *dense("decoder", h, vocab),
    ]
    return ModelSpec("lstm", sample_shape, num_classes, tuple(params),
                     {"embed": e, "hidden": h, "seq_len": sample_shape[0]},
                     loss="tokens", size=size, input_dtype="int64",
                     target_shape=(sample_shape[0],))


WORKLOAD = Workload("lstm", ("text", "synthetic"), "tokens", spec,
                    "character language model (embedding, LSTM, decoder)")
