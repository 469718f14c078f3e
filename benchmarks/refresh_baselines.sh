#!/usr/bin/env bash
# Rewrite results/baselines/: the `ci` suite's runs and the pytest-benchmark results of
# benchmarks/, from this machine. Run it on a quiet machine (nothing else running), then
# commit results/baselines/. About 2 minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf results/baselines
hetbench run ci --out results/baselines --no-progress
# Keep what `hetbench compare` reads (manifest with the environment, steps): the parameters
# and traces are a few hundred kB a run and describe nothing about speed.
find results/baselines/ci -mindepth 2 \( -name params.npz -o -name trace.json -o -name parts \
    -o -name logs \) -prune -exec rm -rf {} +
rm -rf results/baselines/ci/figures
pytest benchmarks/ -p no:cacheprovider --benchmark-only -q \
    --benchmark-storage=results/baselines/benchmarks --benchmark-save=baseline
du -sh results/baselines
