from __future__ import annotations

from typing import Any

from hetbench.workloads.models import ModelSpec
from hetbench.workloads.mx_layers import gluon

# spec parameter kind -> Gluon attribute, where they differ (the fused LSTM layer's names)
ATTRIBUTES = {"weight_ih": "l0_i2h_weight", "weight_hh": "l0_h2h_weight",
              "bias_ih": "l0_i2h_bias", "bias_hh": "l0_h2h_bias"}


class CharLSTM(gluon.HybridBlock):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        vocab, embed, hidden = spec.num_classes, spec.options["embed"], spec.options["hidden"]
        with self.name_scope():
            self.embed = gluon.nn.Embedding(vocab, embed)
            self.lstm = gluon.rnn.LSTM(hidden, layout="NTC", input_size=embed)
            self.decoder = gluon.nn.Dense(vocab, flatten=False, in_units=hidden)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803 - Gluon's signature
        return self.decoder(self.lstm(self.embed(x)))


def build(spec: ModelSpec) -> tuple[Any, dict[str, Any]]:
    net = CharLSTM(spec)
    return net, {"embed": net.embed, "lstm": net.lstm, "decoder": net.decoder}
