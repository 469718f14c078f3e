"""What the tensorflow-ps coordinator builds in TensorFlow: the connection to the cluster,
the variables on the ps servers, each worker's input pipeline, and the step function a
worker executes (harness/loop/tensorflow_coordinator.py says what a step is).

Imported by the coordinator process only: TensorFlow at module level.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from hetbench.adapters.tensorflow import TensorFlowAdapter, loss_sum, tf
from hetbench.harness.exchange.tensorflow_ps import RANK_FILE, TIMES
from hetbench.workloads.models import ModelSpec, builder

QUANTUM_US = 500  # one nap of the stretch (SleepDataset's element)
SPIN_SLACK_US = 200  # what a nap may overshoot; the stretch's end is spun


def connect(cluster: str) -> Any:
    """The ClusterCoordinator of the cluster spec `cluster` (JSON), as its chief."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(json.loads(cluster)), task_type="chief", task_id=0,
        rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    return tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)


class Model:
    """The model's variables on the ps servers (TensorFlow places them: round-robin over the
    ps tasks), a version counter beside them, and a local copy that converts layouts
    (hetbench's spec <-> TensorFlow's) and evaluates."""

    def __init__(self, coordinator: Any, spec: ModelSpec, initial: dict[str, np.ndarray]
                 ) -> None:
        self.spec = spec
        self.local = TensorFlowAdapter(spec, "cpu", 1)
        self.local.load_parameters(initial)
        with coordinator.strategy.scope():
            self.variables = [tf.Variable(v.numpy(), name=v.name.split(":")[0])
                              for v in self.local.variables]
            self.version = tf.Variable(tf.constant(0, tf.int64), name="hetbench_version")
        self.names = [lay.name for lay in self.local.layouts]
        self.workload = builder(spec.workload, "tensorflow")

    def pull(self) -> TensorFlowAdapter:
        """The local copy, holding the servers' parameters now."""
        for mine, theirs in zip(self.local.variables, self.variables, strict=True):
            mine.assign(theirs.read_value())
        return self.local

    def placement(self) -> dict[str, str]:
        """Which ps task holds each parameter."""
        return {name: v.device for name, v in zip(self.names, self.variables, strict=True)}


def batches_fn(inputs: np.ndarray, targets: np.ndarray, rows: np.ndarray,
               bounds: list[tuple[int, int]], nhwc: bool) -> Any:
    """A worker's input pipeline: (its rank, k, slice `rank` of global batch k) for k = 0,
    1, ...; `rows[k]` are global batch k's sample indices (repeated after the last). The
    rank is the worker's RANK_FILE, read from its working folder (tensorflow_ps.py)."""
    starts = np.array([lo for lo, _ in bounds], np.int32)
    ends = np.array([hi for _, hi in bounds], np.int32)

    def make() -> Any:
        rank = tf.strings.to_number(tf.io.read_file(RANK_FILE), tf.int32)
        lo, hi = tf.gather(starts, rank), tf.gather(ends, rank)

        def take(k: Any, row: Any) -> Any:
            index = row[lo:hi]
            x = tf.gather(inputs, index)
            if nhwc:
                x = tf.transpose(x, (0, 2, 3, 1))  # NCHW data -> NHWC
            return rank, k, x, tf.gather(targets, index)

        return tf.data.Dataset.from_tensor_slices(rows).repeat().enumerate().map(take)

    return make


def sleeper_fn() -> Any:
    """An endless pipeline each of whose elements takes QUANTUM_US to come (SleepDataset:
    the thread sleeps, no core is spent): TensorFlow has no sleep op for a function."""
    one = dict(output_types=[tf.int64], output_shapes=[[]])
    endless = tf.data.experimental.to_variant(tf.data.Dataset.range(1 << 62))
    slow = tf.raw_ops.SleepDataset(input_dataset=endless, sleep_microseconds=QUANTUM_US, **one)
    return tf.data.experimental.from_variant(slow, tf.TensorSpec([], tf.int64))


def stretch_until(target: Any, start: Any, sleeper: Any) -> Any:
    """The instant `target` (seconds), reached by napping on `sleeper` while more than a
    quantum is left, then spinning on the clock (a nap overshoots by tens of us)."""
    def far(t: Any) -> Any:
        return target - t > (QUANTUM_US + SPIN_SLACK_US) / 1e6

    def nap(t: Any) -> Any:
        with tf.control_dependencies([next(sleeper)]):
            return [tf.timestamp()]

    napped = tf.while_loop(far, nap, [start])
    return tf.while_loop(lambda t: t < target, lambda t: [tf.timestamp()], napped)[0]


def step_function(model: Model, lr_per_sample: float, factors: np.ndarray) -> Any:
    """The step a worker executes: pull, load, forward, backward, stretch, push (the module
    docstring of tensorflow_coordinator.py). `factors[rank, k]`: the emulated slowdown of
    worker rank's k-th step (k modulo the table's length)."""
    spec, workload, names = model.spec, model.workload, model.names
    variables, version = model.variables, model.version
    alpha = tf.constant(lr_per_sample, tf.float32)
    table = tf.constant(factors)
    length = factors.shape[1]

    @tf.function
    def step(batches: Any, sleeper: Any) -> dict[str, Any]:
        # every instant waits for the work before it: TensorFlow orders only what depends
        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            seen = version.read_value()
        with tf.control_dependencies([seen]):
            params = [tf.identity(v.read_value()) for v in variables]  # onto the worker
        with tf.control_dependencies(params):
            pulled = tf.timestamp()
        with tf.control_dependencies([pulled]):
            rank, k, x, y = next(batches)
        with tf.control_dependencies([x, y]):
            loaded = tf.timestamp()
        with tf.GradientTape() as tape:
            tape.watch(params)
            with tf.control_dependencies([loaded]):
                named = dict(zip(names, params, strict=True))
                loss = loss_sum(spec, workload.logits(spec, named, x), y)
        with tf.control_dependencies([loss]):
            forward = tf.timestamp()
        with tf.control_dependencies([forward]):
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, params)]
        with tf.control_dependencies(grads):
            backward = tf.timestamp()
        factor = tf.gather(tf.gather(table, rank), k % length)
        ready = stretch_until(backward + (factor - 1.0) * (backward - pulled), backward,
                              sleeper)
        with tf.control_dependencies([ready]):
            applied = [tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=alpha,
                                                               delta=g)
                       for v, g in zip(variables, grads, strict=True)]
        with tf.control_dependencies(applied):
            after = version.assign_add(1)
        with tf.control_dependencies([after]):
            pushed = tf.timestamp()
        return {"rank": rank, "step": k, "loss": loss, "samples": tf.shape(y)[0],
                "staleness": after - seen - 1,
                "times": tf.stack([t0, pulled, loaded, forward, backward, ready, pushed])}

    assert TIMES == ("t0", "pulled", "loaded", "forward", "backward", "ready", "pushed")
    return step
