from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.tf_layers import dense, tf

# The input packs pixels and word ids in one float32 array, so the adapter cannot transpose
# it: the model cuts out the image and makes it NHWC itself.
NHWC = False


def encode_image(v: dict[str, Any], image: Any) -> Any:
    """conv3x3+ReLU+maxpool2 twice, conv3x3+ReLU, global average pool: (N, c3). "SAME" at
    stride 1 pads 1 on each side, as PyTorch's padding=1."""
    for name in ("conv1", "conv2", "conv3"):
        image = tf.nn.relu(tf.nn.conv2d(image, v[f"{name}.weight"], 1, "SAME")
                           + v[f"{name}.bias"])
        if name != "conv3":
            image = tf.nn.max_pool2d(image, 2, 2, "VALID")
    return tf.reduce_mean(image, axis=(1, 2))


def logits(spec: ModelSpec, v: dict[str, Any], x: Any) -> Any:
    o = spec.options
    hidden, steps, pixels = o["hidden"], o["steps"], o["pixels"]
    pixel_values, word_values = tf.split(x, [pixels, steps], axis=1)
    image = tf.transpose(tf.reshape(pixel_values, (-1, *o["image_shape"])), (0, 2, 3, 1))
    f = encode_image(v, image)
    h = tf.tanh(dense(v, "init_h", f))
    c = tf.tanh(dense(v, "init_c", f))
    words = tf.cast(word_values, tf.int64)  # ids stored as floats: exact below 2^24
    emb = tf.reshape(tf.gather(v["embed.weight"], words), (-1, o["embed"]))  # (N*L, E)
    # the input projections of every step at once; the recurrence is unrolled (static L)
    xw = tf.matmul(emb, v["lstm.weight_ih"], transpose_b=True)
    xw = tf.reshape(xw, (-1, steps, 4 * hidden)) + v["lstm.bias_ih"] + v["lstm.bias_hh"]
    outputs = []
    # unstack, not xw[:, t]: a strided slice's gradient is a zero-filled copy of the whole
    # (N, L, 4H) tensor per step (workloads/lstm/tensorflow.py); unstack's is one stack
    for xt in tf.unstack(xw, num=steps, axis=1):
        gates = xt + tf.matmul(h, v["lstm.weight_hh"], transpose_b=True)
        i, fg, g, og = tf.split(gates, 4, axis=1)  # the spec's gate order i, f, g, o
        c = tf.sigmoid(fg) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(og) * tf.tanh(c)
        outputs.append(h)
    out = tf.reshape(tf.stack(outputs, axis=1), (-1, hidden))
    return tf.reshape(dense(v, "out", out), (-1, steps, spec.num_classes))
