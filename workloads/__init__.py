"""Framework-neutral workloads: model specs (parameter names, shapes, initial values) and data.

Registries hold names only; nothing here imports a framework.
"""

from __future__ import annotations

WORKLOADS: dict[str, str] = {
    "mlp": "workloads.models:mlp_spec",
    "cnn": "workloads.models:cnn_spec",
    "lstm": "workloads.models:lstm_spec",
}
DATASETS: dict[str, str] = {
    "digits": "workloads.data:load_digits",
    "text": "workloads.data:load_text",
    "synthetic": "workloads.data:load_synthetic",
}
# Which datasets a workload can train on (images for mlp and cnn, tokens for lstm).
COMPATIBLE_DATASETS: dict[str, tuple[str, ...]] = {
    "mlp": ("digits", "synthetic"),
    "cnn": ("digits", "synthetic"),
    "lstm": ("text", "synthetic"),
}
