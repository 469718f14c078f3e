from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.mx_layers import gluon

# spec parameter kind -> Gluon attribute, where they differ (the fused LSTM layer's names)
ATTRIBUTES = {"weight_ih": "l0_i2h_weight", "weight_hh": "l0_h2h_weight",
              "bias_ih": "l0_i2h_bias", "bias_hh": "l0_h2h_bias"}


class Captioner(gluon.HybridBlock):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        o = spec.options
        (c1, c2, c3), e, h = o["convs"], o["embed"], o["hidden"]
        self.pixels, self.image_shape = o["pixels"], tuple(o["image_shape"])
        with self.name_scope():
            self.conv1 = gluon.nn.Conv2D(c1, 3, padding=1, in_channels=self.image_shape[0],
                                         activation="relu")
            self.conv2 = gluon.nn.Conv2D(c2, 3, padding=1, in_channels=c1, activation="relu")
            self.conv3 = gluon.nn.Conv2D(c3, 3, padding=1, in_channels=c2, activation="relu")
            self.pool = gluon.nn.MaxPool2D(2)
            self.init_h = gluon.nn.Dense(h, in_units=c3)
            self.init_c = gluon.nn.Dense(h, in_units=c3)
            self.embed = gluon.nn.Embedding(spec.num_classes, e)
            self.lstm = gluon.rnn.LSTM(h, layout="NTC", input_size=e)
            self.out = gluon.nn.Dense(spec.num_classes, flatten=False, in_units=h)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803 - Gluon's signature
        # the packed sample: pixels (C, H, W order), then the word ids as floats, which
        # Embedding takes as they are
        image = F.reshape(F.slice_axis(x, axis=1, begin=0, end=self.pixels),
                          shape=(-1, *self.image_shape))
        words = F.slice_axis(x, axis=1, begin=self.pixels, end=None)
        f = self.pool(self.conv2(self.pool(self.conv1(image))))
        f = F.mean(self.conv3(f), axis=(2, 3))  # global average pooling
        # the LSTM's states are (layers, N, H)
        state = [F.expand_dims(F.tanh(self.init_h(f)), axis=0),
                 F.expand_dims(F.tanh(self.init_c(f)), axis=0)]
        out, _ = self.lstm(self.embed(words), state)
        return self.out(out)


def build(spec: ModelSpec) -> tuple[Any, dict[str, Any]]:
    net = Captioner(spec)
    names = ("conv1", "conv2", "conv3", "init_h", "init_c", "embed", "lstm", "out")
    return net, {name: getattr(net, name) for name in names}
