#!/usr/bin/env bash
# Everything issue 16 asks of a machine with a GPU, in one command (about 10 minutes):
#   benchmarks/gpu_check.sh [OUT]      # OUT defaults to results/gpu-check
# 1. the GPU tests (they skip without a GPU; here they must run), the profiler's CUDA
#    activity read by HTA among them;
# 2. phase-timing overhead on cuda:0: bare steps, CUDA events (what a GPU worker uses) and
#    a device wait per phase, side by side in one process (benchmarks/overhead.py);
# 3. a cuda:0 worker beside CPU workers for each framework (benchmarks/gpu.toml), reported;
# 4. Choi's strategy 1 against strategy 2 (benchmarks/choi_strategies.toml).
# Each part goes on when one before it fails; the exit status is the number that failed.
set -u
out=${1:-results/gpu-check}
mkdir -p "$out"
failed=0
part() {  # part NAME COMMAND...: run it, its output also in $out/NAME.log
    echo "== $1"
    local name=$1
    shift
    if ! "$@" 2>&1 | tee "$out/$name.log"; then
        echo "== $name FAILED (log: $out/$name.log)"
        failed=$((failed + 1))
    fi
}
set -o pipefail
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to check')" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
part tests python -m pytest -q -rs tests/test_timer.py tests/test_device_allreduce.py \
    tests/test_profiling.py
for workload in mlp cnn; do
    part "overhead-$workload" python benchmarks/overhead.py --workload "$workload" \
        --device cuda:0 --blocks 20
done
part frameworks hetbench run benchmarks/gpu.toml --skip-unavailable --out "$out"
part frameworks-report hetbench report "$out/gpu" --out "$out/gpu-report"
part choi-run hetbench run benchmarks/choi_strategies.toml --out "$out"
part choi python benchmarks/choi_strategies.py "$out/choi-strategies"
echo "== $failed part(s) failed; logs and results in $out"
exit "$failed"
