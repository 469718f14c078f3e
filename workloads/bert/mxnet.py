from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.mx_layers import gluon
from hetbench.workloads.transformer.mxnet import EncoderLayer, LayerNorm, Positions, dense


class Bert(gluon.HybridBlock):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        o = spec.options
        self.num_layers = o["layers"]
        with self.name_scope():
            self.embed = gluon.nn.Embedding(spec.num_classes + 1, o["d"])  # + MASK
            self.pos = Positions(spec.sample_shape[0], o["d"])
            for i in range(self.num_layers):  # attribute names are the spec's prefixes
                setattr(self, f"enc{i}", EncoderLayer(o["d"], o["heads"], o["ff"], o["scale"]))
            self.enc_ln = LayerNorm(o["d"])
            self.out = dense(spec.num_classes, o["d"])

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803 - Gluon's signature
        h = self.pos(self.embed(x))
        for i in range(self.num_layers):
            h = getattr(self, f"enc{i}")(h)  # no mask: every position sees every other
        return self.out(self.enc_ln(h))


def build(spec: ModelSpec) -> tuple[Any, dict[str, Any]]:
    net = Bert(spec)
    layers: dict[str, Any] = {"embed": net.embed, "pos": net.pos, "enc_ln": net.enc_ln,
                              "out": net.out}
    for i in range(net.num_layers):
        layers.update(getattr(net, f"enc{i}").layers(f"enc{i}"))
    return net, layers
