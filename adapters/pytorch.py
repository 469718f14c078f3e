"""PyTorch adapter.

Parameters and gradients live in two flat tensors; each module parameter is a view into
them. Autograd accumulates into the existing .grad views in place, so on a host worker the
gradient buffer *is* the communication buffer (pack costs one float for the loss) and the
SGD update is one fused add over all parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from workloads.models import ModelSpec


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        shapes = {p.name: p.shape for p in spec.params}
        self.fc1 = nn.Linear(*reversed(shapes["fc1.weight"]))
        self.fc2 = nn.Linear(*reversed(shapes["fc2.weight"]))
        self.fc3 = nn.Linear(*reversed(shapes["fc3.weight"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        shapes = {p.name: p.shape for p in spec.params}
        c1, c_in = shapes["conv1.weight"][:2]
        c2 = shapes["conv2.weight"][0]
        self.conv1 = nn.Conv2d(c_in, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc = nn.Linear(*reversed(shapes["fc.weight"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class CharLSTM(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        vocab, embed, hidden = spec.num_classes, spec.options["embed"], spec.options["hidden"]
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x))
        return self.decoder(out)


MODELS = {"mlp": MLP, "cnn": CNN, "lstm": CharLSTM}
# spec name -> torch parameter name, where they differ
TORCH_NAMES = {
    "lstm.weight_ih": "lstm.weight_ih_l0",
    "lstm.weight_hh": "lstm.weight_hh_l0",
    "lstm.bias_ih": "lstm.bias_ih_l0",
    "lstm.bias_hh": "lstm.bias_hh_l0",
}


class TorchAdapter:
    framework = "pytorch"
    synchronize_on_host = False  # CPU kernels run in the calling thread

    def __init__(self, spec: ModelSpec, device: str, threads: int) -> None:
        torch.set_num_threads(threads)
        self.spec = spec
        self.device = torch.device(device)
        self.model = MODELS[spec.workload](spec).to(self.device)
        n = spec.num_elements
        self.flat_params = torch.zeros(n, device=self.device)
        self.flat_grads = torch.zeros(n + 1, device=self.device)  # last element: loss sum
        named = dict(self.model.named_parameters())
        offset = 0
        for p in spec.params:
            param = named[TORCH_NAMES.get(p.name, p.name)]
            if tuple(param.shape) != p.shape:
                raise ValueError(f"{p.name}: torch shape {tuple(param.shape)} != spec {p.shape}")
            param.data = self.flat_params[offset : offset + p.size].view(p.shape)
            param.grad = self.flat_grads[offset : offset + p.size].view(p.shape)
            offset += p.size
        self._host_buffer: torch.Tensor | None = None
        self._is_tokens = spec.workload == "lstm"

    @staticmethod
    def versions() -> dict[str, str]:
        return {"torch": torch.__version__, "numpy": np.__version__}

    def load_parameters(self, values: dict[str, np.ndarray]) -> None:
        flat = np.concatenate([values[p.name].ravel() for p in self.spec.params])
        self.flat_params.copy_(torch.from_numpy(flat.astype(np.float32)))

    def parameters(self) -> dict[str, np.ndarray]:
        flat = self.flat_params.detach().cpu().numpy()
        out, offset = {}, 0
        for p in self.spec.params:
            out[p.name] = flat[offset : offset + p.size].reshape(p.shape).copy()
            offset += p.size
        return out

    def comm_buffer(self, on_device: bool) -> torch.Tensor:
        if on_device or self.device.type == "cpu":
            return self.flat_grads
        # gloo reduces host memory: a pinned staging buffer, copied in pack and out in unpack
        self._host_buffer = torch.zeros(self.flat_grads.numel(), pin_memory=True)
        return self._host_buffer

    def to_device(self, inputs: np.ndarray, targets: np.ndarray) -> Any:
        x = torch.from_numpy(inputs).to(self.device, non_blocking=True)
        y = torch.from_numpy(targets).to(self.device, non_blocking=True)
        return x, y

    def forward(self, batch: Any) -> Any:
        x, y = batch
        logits = self.model(x)
        if self._is_tokens:  # per-sample loss = mean over the sample's tokens
            seq_len = y.shape[1]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   reduction="sum") / seq_len
        else:
            loss = F.cross_entropy(logits, y, reduction="sum")
        return loss

    def backward(self, loss: Any) -> None:
        loss.backward()

    def pack(self, loss: Any) -> None:
        self.flat_grads[-1:].copy_(loss.detach().reshape(1))
        if self._host_buffer is not None:
            # Blocking: gloo reads this host buffer from the CPU as soon as pack returns,
            # also in the untimed loop, which does not synchronise the device.
            self._host_buffer.copy_(self.flat_grads)

    def unpack(self) -> None:
        if self._host_buffer is not None:
            self.flat_grads.copy_(self._host_buffer, non_blocking=True)

    def apply(self, scale: float) -> None:
        with torch.no_grad():
            self.flat_params.add_(self.flat_grads[:-1], alpha=-scale)

    def zero_grad(self) -> None:
        self.flat_grads.zero_()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
