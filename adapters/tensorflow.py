"""TensorFlow adapter: raw ops, GradientTape, tf.function.

Layouts: activations are NHWC and conv filters HWIO, as TensorFlow's CPU convolutions
require; the data (NCHW) is transposed in to_device and the filters are converted when
weights cross. The dense layer after the convolutions therefore sees its features in H, W,
C order, so its kernel columns are permuted from the spec's C, H, W order (the same
features: the same mathematics). Dense and LSTM kernels stay (out, in) and are multiplied
with transpose_b, the same MatMul kernels a Keras (in, out) kernel runs with the operands'
roles swapped; this spares a transposed copy of every dense gradient in pack and unpack
(MLP: pack 0.43 -> 0.1 ms, unpack 0.22 -> 0.05 ms). The LSTM is written out with the
spec's gate order (i, f, g, o) and both biases, so no parameter is merged.

Forward and backward stay separate phases: forward() calls the compiled forward function
under a GradientTape; TensorFlow then runs a forward variant that also outputs the
activations the gradient needs, and backward() runs the compiled backward function from
the tape. What the split costs against one fused tf.function (grappler cannot optimise
across the two functions, and each is one more call of ~0.1-0.2 ms) is measured in the
issue 4 report.

Gradients cross into the torch communication buffer through DLPack: pack() views each TF
gradient as a torch tensor (no copy) and copies it into the buffer, through a permuted
view where the layouts differ. unpack() copies the reduced sums into a torch staging
buffer in TF layout that TensorFlow aliased once at start (zero-copy reads); apply() runs
one in-place ResourceApplyGradientDescent per variable. TensorFlow treats tensors as
immutable, but the staging memory is written only by torch, in unpack(), never while
TensorFlow reads it.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch
from torch.utils.dlpack import to_dlpack

from hetbench.adapters.base import Batch, Loss
from hetbench.workloads.models import IGNORE, ModelSpec, builder
from hetbench.workloads.tf_layers import layouts, tf

ALIGN_FLOATS = 16  # 64 bytes: the alignment TensorFlow requires of a tensor's memory


def loss_sum(spec: ModelSpec, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """The loss summed over samples (hetbench.workloads.models: the two loss kinds)."""
    if spec.loss == "classify":
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    counted = tf.cast(tf.not_equal(y, IGNORE), logits.dtype)
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.maximum(y, 0), logits)
    per_sample = tf.reduce_sum(per_token * counted, axis=1)
    return tf.reduce_sum(per_sample / tf.maximum(tf.reduce_sum(counted, axis=1), 1.0))


def hits(spec: ModelSpec, logits: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(correct predictions, predictions counted): labels, or tokens that count."""
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1), y), tf.float32)
    counted = tf.cast(tf.not_equal(y, IGNORE), tf.float32)
    return tf.reduce_sum(correct * counted), tf.reduce_sum(counted)


def _input_signature(spec: ModelSpec, nhwc: bool) -> list[tf.TensorSpec]:
    """Batch dimension left open: any slice size runs the same traced function."""
    shape = spec.sample_shape
    if nhwc:
        shape = (*shape[1:], shape[0])
    return [tf.TensorSpec((None, *shape), tf.as_dtype(spec.input_dtype)),
            tf.TensorSpec((None, *spec.target_shape), tf.int64)]


def configure_threads(threads: int) -> None:
    """intra-op = threads, inter-op = 1 (one CPU per thread, as torch.set_num_threads).
    Only possible before TensorFlow's runtime starts: a second adapter in the same process
    (tests) keeps the first setting."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass


class TensorFlowAdapter:
    framework = "tensorflow"
    # TensorFlow's CPU ops and functions return finished tensors: no host synchronisation
    synchronize_on_host = False

    def __init__(self, spec: ModelSpec, device: str, threads: int) -> None:
        configure_threads(threads)
        torch.set_num_threads(threads)  # torch does the layout copies in pack and unpack
        self.spec = spec
        self.is_cuda = device.startswith("cuda")
        if self.is_cuda:
            index = int(device.split(":")[1])
            if index >= len(tf.config.list_physical_devices("GPU")):
                raise ValueError(f"TensorFlow sees no {device} (tensorflow-cpu has no GPU)")
            self.tf_device = f"/GPU:{index}"
        else:
            self.tf_device = "/CPU:0"
        self.torch_device = torch.device(device)
        workload = builder(spec.workload, "tensorflow")
        self.nhwc = bool(workload.NHWC)  # image inputs transposed from NCHW in to_device
        self.layouts = layouts(spec, workload.layouts(spec) if hasattr(workload, "layouts")
                               else None)
        with tf.device(self.tf_device):
            self.variables = [tf.Variable(tf.zeros(lay.tf_shape), name=lay.name.replace(".", "_"))
                              for lay in self.layouts]
        named = {lay.name: var for lay, var in zip(self.layouts, self.variables, strict=True)}

        def forward(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            # stop_gradient: the backward of a function called under a tape computes the
            # gradients of all its float inputs, the images' too (ResNet small: 48 -> 43 ms)
            return loss_sum(spec, workload.logits(spec, named, tf.stop_gradient(x)), y)

        def evaluate(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, ...]:
            logits = workload.logits(spec, named, x)
            return (loss_sum(spec, logits, y), *hits(spec, logits, y))

        # one concrete function, batch dimension open: any slice size runs one trace, and
        # no signature matching per call (forward + backward ~10% faster for the MLP)
        signature = _input_signature(spec, self.nhwc)
        self._forward_fn = tf.function(forward).get_concrete_function(*signature)
        self._evaluate_fn = tf.function(evaluate).get_concrete_function(*signature)
        n = spec.num_elements
        # reduced gradient sums in TF layout, aliased by TensorFlow once (zero-copy reads)
        # Each parameter's slice starts on a 64-byte boundary: TensorFlow's kernels check
        # that a tensor is aligned (Eigen) and abort the process when it is not.
        starts = [0]
        for lay in self.layouts:
            starts.append(starts[-1] + -(-lay.size // ALIGN_FLOATS) * ALIGN_FLOATS)
        self._staging = torch.zeros(starts[-1], device=self.torch_device)
        slices = [self._staging[start: start + lay.size]
                  for start, lay in zip(starts, self.layouts, strict=False)]
        self._staging_views = [s if lay.is_identity else s.view(lay.tf_view)
                               for s, lay in zip(slices, self.layouts, strict=True)]
        self._staging_tf = [tf.experimental.dlpack.from_dlpack(to_dlpack(s.view(lay.tf_shape)))
                            for s, lay in zip(slices, self.layouts, strict=True)]
        self._set_buffer(torch.zeros(n + 1))  # gloo reduces host memory
        self._tape: tf.GradientTape | None = None
        self._grads: list[tf.Tensor] | None = None
        self._scale: tuple[float, tf.Tensor] | None = None

    def _set_buffer(self, buffer: torch.Tensor) -> None:
        """Per parameter, the buffer slice as the TF-layout tensor it is copied from (pack)
        and to (unpack): a permuted view where the layouts differ, else the flat slice."""
        self._buffer = buffer
        self._pack_targets: list[tuple[torch.Tensor, tuple[int, ...] | None]] = []
        self._unpack_sources = []
        for lay in self.layouts:
            flat = buffer[lay.offset: lay.offset + lay.size]
            if lay.is_identity:
                self._pack_targets.append((flat, None))
                self._unpack_sources.append(flat)
            else:
                self._pack_targets.append((lay.spec_to_tf(flat), lay.tf_view))
                self._unpack_sources.append(lay.spec_to_tf(flat))

    @staticmethod
    def versions() -> dict[str, str]:
        return {"tensorflow": tf.__version__, "numpy": np.__version__}

    @staticmethod
    def probe() -> dict[str, Any]:
        devices = [f"{d.device_type.lower()}:{d.name.rsplit(':', 1)[-1]}"
                   for d in tf.config.list_physical_devices()]
        strategies = ["MultiWorkerMirroredStrategy (collective all-reduce: ring"
                      + (", nccl" if tf.config.list_physical_devices("GPU") else "") + ")",
                      "ParameterServerStrategy (asynchronous)"]
        return {"version": tf.__version__, "devices": devices, "strategies": strategies}

    def load_parameters(self, values: dict[str, np.ndarray]) -> None:
        for lay, var in zip(self.layouts, self.variables, strict=True):
            spec_value = torch.from_numpy(np.ascontiguousarray(values[lay.name], np.float32))
            var.assign(lay.spec_to_tf(spec_value).contiguous().reshape(lay.tf_shape).numpy())

    def parameters(self) -> dict[str, np.ndarray]:
        out = {}
        for p, lay, var in zip(self.spec.params, self.layouts, self.variables, strict=True):
            tf_value = torch.from_numpy(var.numpy())
            out[p.name] = lay.tf_to_spec(tf_value).contiguous().numpy().reshape(p.shape)
        return out

    def comm_buffer(self, on_device: bool) -> torch.Tensor:
        device = self.torch_device if on_device and self.is_cuda else torch.device("cpu")
        if self._buffer.device != device:  # nccl: the buffer lives on the GPU
            self._set_buffer(torch.zeros(self.spec.num_elements + 1, device=device))
        return self._buffer

    def to_device(self, inputs: np.ndarray, targets: np.ndarray) -> Batch:
        return Batch(self._tensors(inputs, targets))

    def _tensors(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.device(self.tf_device):
            x = tf.convert_to_tensor(inputs)
            if self.nhwc:
                x = tf.transpose(x, (0, 2, 3, 1))  # NCHW data -> NHWC
            return x, tf.convert_to_tensor(targets)

    def forward(self, batch: Batch) -> Loss:
        x, y = cast("tuple[tf.Tensor, tf.Tensor]", batch)
        # watch only the parameters: the tape keeps nothing else alive
        self._tape = tf.GradientTape(watch_accessed_variables=False)
        with self._tape:
            self._tape.watch(self.variables)
            loss = self._forward_fn(x, y)
        return Loss(loss)

    def evaluate(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, float, float]:
        loss, correct, counted = self._evaluate_fn(*self._tensors(inputs, targets))
        return float(loss), float(correct), float(counted)

    def backward(self, loss: Loss) -> None:
        assert self._tape is not None, "backward() without forward()"
        grads = self._tape.gradient(loss, self.variables)
        # tf.gather's gradient (the embedding) comes as IndexedSlices: summing its rows into
        # a dense table is part of computing the gradient, so it happens here
        self._grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                       for g in grads]
        self._tape = None

    def pack(self, loss: Loss) -> None:
        assert self._grads is not None, "pack() without backward()"
        for (target, view), grad in zip(self._pack_targets, self._grads, strict=True):
            # torch reads TF's gradient memory through DLPack (no copy) and copies it into
            # the buffer, through a permuted view where the layouts differ
            source = torch.from_dlpack(grad)
            target.copy_(source.view(view) if view else source.view(-1))
        self._buffer[-1] = float(cast("tf.Tensor", loss))

    def unpack(self) -> None:
        for staging, source in zip(self._staging_views, self._unpack_sources, strict=True):
            staging.copy_(source)

    def apply(self, scale: float) -> None:
        if self._scale is None or self._scale[0] != scale:
            self._scale = (scale, tf.constant(scale, tf.float32))
        # one in-place kernel per variable, as TensorFlow's SGD does; eager raw ops cost
        # less here than one tf.function call (its overhead alone is ~0.1-0.2 ms)
        for var, grad in zip(self.variables, self._staging_tf, strict=True):
            tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=self._scale[1],
                                                    delta=grad)

    def load_buffer(self) -> None:
        self.unpack()  # the buffer, in TF layout, into the staging memory TF aliases
        for var, value in zip(self.variables, self._staging_tf, strict=True):
            var.assign(value)

    def zero_grad(self) -> None:
        # pack() overwrites every element of the buffer: only drop this step's tensors
        self._tape = None
        self._grads = None

    def synchronize(self) -> None:
        if self.is_cuda:
            tf.test.experimental.sync_devices()
