from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.tf_layers import dense, tf

NHWC = False


def logits(spec: ModelSpec, v: dict[str, Any], x: Any) -> Any:
    hidden, seq_len = spec.options["hidden"], spec.options["seq_len"]
    n = tf.shape(x)[0]
    emb = tf.gather(v["embed.weight"], x)  # (N, L, E)
    # input projections of every step at once; the recurrence is unrolled (static L)
    xw = tf.matmul(tf.reshape(emb, (-1, emb.shape[-1])), v["lstm.weight_ih"], transpose_b=True)
    xw = tf.reshape(xw, (n, seq_len, 4 * hidden)) + v["lstm.bias_ih"] + v["lstm.bias_hh"]
    h = tf.zeros((n, hidden))
    c = tf.zeros((n, hidden))
    outputs = []
    # unstack, not xw[:, t]: the gradient of a strided slice is a zero-filled copy of the
    # whole (N, L, 4H) tensor per step (4-5x slower backward); unstack's is a stack
    for xt in tf.unstack(xw, num=seq_len, axis=1):
        gates = xt + tf.matmul(h, v["lstm.weight_hh"], transpose_b=True)
        i, f, g, o = tf.split(gates, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
        outputs.append(h)
    out = tf.reshape(tf.stack(outputs, axis=1), (-1, hidden))
    return tf.reshape(dense(v, "decoder", out), (n, seq_len, spec.num_classes))
