#!/usr/bin/env bash
# Everything issue 32 asks of a machine with a GPU, in one command:
#   benchmarks/gpu_check.sh [OUT]      # OUT defaults to results/gpu-check
#   REPEATS=1 BLOCKS=1000 PART_TIMEOUT=150 benchmarks/gpu_check.sh OUT   # a short lease
# 1. the GPU tests (they skip without a GPU; here they must run), the profiler's CUDA
#    activity read by HTA among them;
# 2. Choi's strategy 1 against strategy 2 on the exchange alone, 1e5 to 1e8 floats
#    (benchmarks/choi_sizes.py);
# 3. phase-timing overhead on cuda:0: bare steps, CUDA events (what a GPU worker uses) and
#    a device wait per phase, alternating step by step in one process (benchmarks/overhead.py);
# 4. Choi's two strategies inside training steps (benchmarks/choi_strategies.toml);
# 5. Choi's question: the GPU alone against the GPU with 1-2 CPU workers, profiled and
#    leaving workers out, on the study workloads (benchmarks/choi_question.toml);
# 6. a cuda:0 worker beside CPU workers for each framework (benchmarks/gpu.toml).
# Each part goes on when one before it fails or runs out of its time (PART_TIMEOUT
# seconds, default 900); the exit status is the number that failed. REPEATS overrides the
# suites' repeats; BLOCKS is overhead.py's rounds (default 2000); ONLY="tests choi-sizes"
# runs just the parts named (a lease too short for all of them, split over calls).
set -u
out=${1:-results/gpu-check}
repeats=${REPEATS:+--repeats $REPEATS}
mkdir -p "$out"
failed=0
part() {  # part NAME COMMAND...: run it, its output also in $out/NAME.log
    local name=$1
    shift
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
        return 0
    fi
    echo "== $name ($(date +%T))"
    if ! timeout -k 20 "${PART_TIMEOUT:-900}" "$@" 2>&1 | tee "$out/$name.log"; then
        echo "== $name FAILED (log: $out/$name.log)"
        failed=$((failed + 1))
    fi
}
set -o pipefail
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: nothing to check')" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)" \
    | tee -a "$out/gpu.txt"
# Kineto's INFO log (record counts, out-of-range drops) lands in each run's worker logs,
# kept under $out/pytest: the first lease's profiled GPU worker traced no kernel.
part tests env KINETO_LOG_LEVEL=1 python -m pytest -q -rs -m gpu -p no:cacheprovider \
    --basetemp "$out/pytest" tests/test_timer.py tests/test_device_allreduce.py \
    tests/test_profiling.py
part choi-sizes python benchmarks/choi_sizes.py --out "$out/choi-sizes.csv"
for workload in mlp cnn; do
    part "overhead-$workload" python benchmarks/overhead.py --workload "$workload" \
        --device cuda:0 --blocks "${BLOCKS:-2000}" --parts
done
# shellcheck disable=SC2086  # $repeats is empty or two words
part choi-run hetbench run benchmarks/choi_strategies.toml $repeats --no-progress --out "$out"
part choi python benchmarks/choi_strategies.py "$out/choi-strategies"
# shellcheck disable=SC2086
part question-run hetbench run benchmarks/choi_question.toml $repeats --no-progress --out "$out"
part question python benchmarks/choi_question.py "$out/choi-question"
# shellcheck disable=SC2086
part frameworks hetbench run benchmarks/gpu.toml $repeats --skip-unavailable --no-progress \
    --out "$out"
part frameworks-report hetbench report "$out/gpu" --out "$out/gpu-report"
echo "== $failed part(s) failed; logs and results in $out ($(date +%T))"
exit "$failed"
