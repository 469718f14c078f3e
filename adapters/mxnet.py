"""MXNet adapter: Gluon blocks, autograd, hybridized (one CachedOp per model).

Gluon's layouts are the spec's (dense (out, in), conv OIHW over NCHW, LSTM gates i, f, c, o
with separate i2h and h2h biases), so no parameter is converted. As in the PyTorch adapter,
parameters and gradients live in two flat NDArrays and every Gluon parameter is a view into
them; the flat gradient array (plus one slot for the loss) is shared with torch through
DLPack (`to_dlpack_for_write`), so autograd writes the gradients straight into the
communication buffer: pack() writes only the loss and waits for the engine, unpack() has
nothing to do, and the SGD update is one fused op over all parameters (MXNet's own
sgd_update, as gluon.Trainer uses).

MXNet's engine is asynchronous even on the CPU: operators return before they have run.
`synchronize_on_host` tells the worker to call synchronize() (mx.nd.waitall) at every phase
boundary on the CPU too, so each phase ends when its work has ended. pack() always waits
for the gradients, timed or not: torch must not all-reduce memory the engine still writes.
"""

from __future__ import annotations

import os
from typing import Any, cast

import numpy as np
import torch

from hetbench.adapters.base import Batch, Loss
from hetbench.workloads.models import ModelSpec, builder
from hetbench.workloads.mx_layers import autograd, gluon, mx

ENGINE_DEFAULT = "ThreadedEnginePerDevice"


def loss_sum(F: Any, spec: ModelSpec, logits: Any, y: Any) -> Any:  # noqa: N803
    """The loss summed over samples (hetbench.workloads.models: the two loss kinds), in NDArray or
    Symbol ops (F is mx.nd or mx.sym)."""
    if spec.loss == "classify":
        return F.sum(F.pick(-F.log_softmax(logits, axis=-1), y, axis=-1))
    counted = F.cast(y >= 0, "float32")  # IGNORE (-1) does not count
    per_token = -F.pick(F.log_softmax(logits, axis=-1), F.relu(y), axis=-1)
    per_sample = F.sum(per_token * counted, axis=1) / F.maximum(F.sum(counted, axis=1), 1.0)
    return F.sum(per_sample)


class _LossSum(gluon.HybridBlock):
    """Model and loss in one hybridized graph."""

    def __init__(self, net: gluon.HybridBlock, spec: ModelSpec) -> None:
        super().__init__()
        with self.name_scope():
            self.net = net
        self.spec = spec

    def hybrid_forward(self, F: Any, x: Any, y: Any) -> Any:  # noqa: N803
        return loss_sum(F, self.spec, self.net(x), y)


def _gluon_parameter(layers: dict[str, Any], attributes: dict[str, str], name: str,
                     shape: tuple[int, ...]) -> gluon.Parameter:
    layer, kind = name.rsplit(".", 1)
    param = getattr(layers[layer], attributes.get(kind, kind))
    if tuple(param.shape) != shape:
        raise ValueError(f"{name}: Gluon shape {param.shape} != spec {shape}")
    return param


class MXNetAdapter:
    framework = "mxnet"
    synchronize_on_host = True

    def __init__(self, spec: ModelSpec, device: str, threads: int) -> None:
        # MXNet's operator threads follow OMP_NUM_THREADS, set by the worker before import;
        # torch only reads the shared buffer here, but keep it to the same budget
        torch.set_num_threads(threads)
        self.spec = spec
        self.is_cuda = device.startswith("cuda")
        if self.is_cuda:
            index = int(device.split(":")[1])
            if index >= mx.context.num_gpus():
                raise ValueError(f"MXNet sees no {device} (the pip wheel is CPU-only)")
            self.ctx = mx.gpu(index)
        else:
            self.ctx = mx.cpu()
        workload = builder(spec.workload, "mxnet")
        net, layers = workload.build(spec)
        self.model = _LossSum(net, spec)
        self.model.initialize(ctx=self.ctx)
        attributes = getattr(workload, "ATTRIBUTES", {})
        params = [_gluon_parameter(layers, attributes, p.name, p.shape) for p in spec.params]
        if (found := len(self.model.collect_params().keys())) != len(params):
            # a parameter outside the spec would never train
            raise ValueError(f"{spec.workload}: the Gluon model has {found} parameters, "
                             f"the spec {len(params)}")
        n = spec.num_elements
        self.flat_params = mx.nd.zeros(n, ctx=self.ctx)
        self.flat_grads = mx.nd.zeros(n + 1, ctx=self.ctx)  # last element: the loss sum
        offset = 0
        for p, param in zip(spec.params, params, strict=True):
            data = self.flat_params[offset: offset + p.size].reshape(p.shape)
            grad = self.flat_grads[offset: offset + p.size].reshape(p.shape)
            # Gluon keeps one array per context; replace it with the view (and its
            # gradient), registered with autograd as Parameter._init_grad would
            param._data = [data]
            param._grad = [grad]
            autograd.mark_variables([data], [grad], grad_reqs="write")
            offset += p.size
        self._grads_view = self.flat_grads[:n]
        self._buffer = torch.from_dlpack(mx.nd.to_dlpack_for_write(self.flat_grads))
        self.model.hybridize(static_alloc=True)

    @staticmethod
    def versions() -> dict[str, str]:
        return {"mxnet": mx.__version__, "numpy": np.__version__,
                "mxnet_engine": os.environ.get("MXNET_ENGINE_TYPE", ENGINE_DEFAULT)}

    @staticmethod
    def probe() -> dict[str, Any]:
        devices = ["cpu"] + [f"gpu:{i}" for i in range(mx.context.num_gpus())]
        features = mx.runtime.Features()
        stores = ["kvstore local", "kvstore device"]
        if features.is_enabled("DIST_KVSTORE"):
            stores += ["kvstore dist_sync", "kvstore dist_device_sync", "kvstore dist_async"]
        if features.is_enabled("NCCL"):
            stores.append("kvstore nccl")
        return {"version": mx.__version__, "devices": devices, "strategies": stores}

    def load_parameters(self, values: dict[str, np.ndarray]) -> None:
        flat = np.concatenate([values[p.name].ravel() for p in self.spec.params])
        self.flat_params[:] = flat.astype(np.float32)
        self.flat_params.wait_to_read()

    def parameters(self) -> dict[str, np.ndarray]:
        flat = self.flat_params.asnumpy()
        out, offset = {}, 0
        for p in self.spec.params:
            out[p.name] = flat[offset: offset + p.size].reshape(p.shape).copy()
            offset += p.size
        return out

    def comm_buffer(self, on_device: bool) -> torch.Tensor:
        if self.is_cuda and not on_device:
            raise ValueError("MXNet on a GPU with a host communication buffer is not supported")
        return self._buffer

    def to_device(self, inputs: np.ndarray, targets: np.ndarray) -> Batch:
        return Batch(self._arrays(inputs, targets))

    def _arrays(self, inputs: np.ndarray, targets: np.ndarray
                ) -> tuple[mx.nd.NDArray, mx.nd.NDArray]:
        # zero-copy, as torch.from_numpy: MXNet marks the array it is given read-only, so
        # it gets a view and the caller's array stays writable
        x = mx.nd.from_numpy(np.ascontiguousarray(inputs).view(), zero_copy=True)
        y = mx.nd.from_numpy(np.ascontiguousarray(targets).view(), zero_copy=True)
        if self.is_cuda:
            x, y = x.as_in_context(self.ctx), y.as_in_context(self.ctx)
        return x, y

    def forward(self, batch: Batch) -> Loss:
        x, y = cast("tuple[mx.nd.NDArray, mx.nd.NDArray]", batch)
        with autograd.record():
            return Loss(self.model(x, y))

    def evaluate(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, float, float]:
        x, y = self._arrays(inputs, targets)
        # training mode, without recording: in inference mode MKLDNN reorders conv weights
        # in place into its own layout, and ours are views into the flat parameter array
        # (the reorder overwrote neighbouring parameters). No workload has dropout or
        # BatchNorm, so both modes compute the same.
        with autograd.train_mode():
            logits = self.model.net(x)
        correct = mx.nd.argmax(logits, axis=-1) == y.astype("float32")
        counted = (y >= 0).astype("float32")
        return (float(loss_sum(mx.nd, self.spec, logits, y).asscalar()),
                float((correct * counted).sum().asscalar()), float(counted.sum().asscalar()))

    def backward(self, loss: Loss) -> None:
        cast("mx.nd.NDArray", loss).backward()  # grad_req "write": overwrites the gradients

    def pack(self, loss: Loss) -> None:
        # fetching the scalar and writing it through torch costs ~20 us; an MXNet slice
        # assignment into the slot ~180 us
        self._buffer[-1] = float(cast("mx.nd.NDArray", loss).asscalar())
        # torch reads this memory next: the engine must have finished writing it
        self.flat_grads.wait_to_read()

    def unpack(self) -> None:
        pass  # the reduced sums are already in the gradient views

    def apply(self, scale: float) -> None:
        mx.nd.sgd_update(self.flat_params, self._grads_view, lr=scale, wd=0.0,
                         out=self.flat_params)

    def load_buffer(self) -> None:
        # torch wrote the buffer, which aliases the gradient array; the engine copies it
        self._grads_view.copyto(self.flat_params)

    def zero_grad(self) -> None:
        pass  # backward overwrites every gradient and pack the loss: nothing accumulates

    def synchronize(self) -> None:
        mx.nd.waitall()
