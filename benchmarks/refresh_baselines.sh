#!/usr/bin/env bash
# Rewrite results/baselines/: the `ci` suite's runs and the pytest-benchmark results of
# benchmarks/, from this machine. Run it on a quiet machine (nothing else running), then
# commit results/baselines/. About 2 minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# Built in a scratch folder and moved in only when everything succeeded: a failed refresh
# leaves the committed baselines as they were.
new=$(mktemp -d results/baselines.new.XXXXXX)
trap 'rm -rf "$new"' EXIT
hetbench run ci --out "$new" --no-progress
# Keep what `hetbench compare` reads (manifest with the environment, steps): the parameters
# and traces are a few hundred kB a run and describe nothing about speed.
find "$new/ci" -mindepth 2 \( -name params.npz -o -name trace.json -o -name parts \
    -o -name logs \) -prune -exec rm -rf {} +
rm -rf "$new/ci/figures"
pytest benchmarks/ -p no:cacheprovider --benchmark-only -q \
    --benchmark-storage="$new/benchmarks" --benchmark-save=baseline
rm -rf results/baselines
mv "$new" results/baselines
du -sh results/baselines
