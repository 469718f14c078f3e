"""How exact gradient accumulation in a user's loop is: the own-loop fixture
(tests/fixtures/own_loop/train.py) under torchrun, two ranks (the second 3x slowed),
accumulating with `session.no_sync()` over loader batches, over chunks of each batch, or
both, under moving and fixed slices; its parameters after 20 optimizer steps against a
textbook loop over whole 64-sample batches in one process (tests/test_own_loop.py's).

    python benchmarks/accumulation_exactness.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.test_own_loop import SCRIPT, textbook  # noqa: E402 - the textbook is the tests'

CASES = [  # accumulate, chunks, partition
    (4, 1, ["proportional"]),
    (1, 3, ["40", "24"]),
    (2, 2, ["profiled"]),
    (1, 1, ["proportional"]),  # no accumulation: the reference's own rounding
]
STEPS = 20


def run_case(accumulate: int, chunks: int, partition: list[str], out: Path) -> dict[str, object]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "HETBENCH_WORKERS": json.dumps([{"device": "cpu"},
                                           {"device": "cpu", "slowdown": 3.0}])}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes",
                    "1", "--nproc-per-node", "2", str(SCRIPT), "--out", str(out), "--steps",
                    str(STEPS), "--accumulate", str(accumulate), "--chunks", str(chunks),
                    "--partition", *partition], check=True, env=env, cwd=out.parent,
                   capture_output=True, timeout=600)
    (run_dir,) = list((out / "train").glob("*-r0-*"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    expected = textbook(STEPS, 64)
    with np.load(run_dir / "params.npz") as got:
        worst = max(float(np.abs(got[name] - value).max()) for name, value in expected.items())
    sizes = [tuple(h["sizes"]) for h in manifest["partition_history"]]
    return {"accumulate": accumulate, "chunks": chunks, "partition": " ".join(partition),
            "slices": sizes, "worst_abs_difference": f"{worst:.2e}"}


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        for i, (accumulate, chunks, partition) in enumerate(CASES):
            out = Path(folder) / f"case{i}" / "out"
            out.parent.mkdir(parents=True)
            print(json.dumps(run_case(accumulate, chunks, partition, out)), flush=True)


if __name__ == "__main__":
    main()
