from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.tf_layers import dense, tf
from hetbench.workloads.transformer.tensorflow import embed, encoder_layer, layer_norm

NHWC = False  # token inputs


def logits(spec: ModelSpec, v: dict[str, Any], x: Any) -> Any:
    o = spec.options
    length = spec.sample_shape[0]
    h = embed(v, "embed", "pos", x, o["d"])
    for i in range(o["layers"]):
        # no mask: every position sees every other (torch adds a zero, which changes nothing)
        h = encoder_layer(v, f"enc{i}", h, length, o["heads"], o["scale"], None)
    out = dense(v, "out", layer_norm(v, "enc_ln", h))
    return tf.reshape(out, (-1, length, spec.num_classes))
