#!/usr/bin/env bash
# benchmarks/gpu_check.sh on a borrowed GPU machine whose image brings its own python3 and
# CUDA torch (not CI's pins) and nothing else of hetbench's: run from the checkout's root,
#   benchmarks/gpu_lease.sh "PARTS" PART_SECONDS TOTAL_SECONDS TAG [WHEELS...]
# installs the wheels carried along (what the image lacks: `pip download --no-deps` them
# for its Python; a pandas below 3 is replaced only if a pandas wheel is among them),
# runs hetbench from the checkout (PYTHONPATH, a `hetbench` and a `python` on PATH), then
# gpu_check.sh's PARTS (its ONLY), each bounded by PART_SECONDS, the whole by
# TOTAL_SECONDS, REPEATS=1. What it writes is copied into $OUT (default /tmp/gpu-out) as it
# comes, as one archive without figures and traces, and its log beside it: a lease that
# ends mid-command still brings back what was done. docs/howto/gpu.md.
set -u
parts=$1 part_s=$2 total_s=$3 tag=$4
shift 4
out=${OUT:-/tmp/gpu-out}
work=/tmp/gpu-check
mkdir -p "$out"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$out/lease-$tag.log") 2>&1
echo "start $(date +%T), $(nproc) cores"
rm -rf /tmp/gpu-bin && mkdir -p /tmp/gpu-bin  # fresh: never write through an old link
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/gpu-bin/python
printf '#!/bin/sh\nexec python3 -m hetbench.harness.cli.main "$@"\n' > /tmp/gpu-bin/hetbench
chmod +x /tmp/gpu-bin/python /tmp/gpu-bin/hetbench
export PATH=/tmp/gpu-bin:$PATH
wheels=()
for wheel in "$@"; do
    case $(basename "$wheel") in
        pandas-*) python3 -c "import pandas, sys; sys.exit(int(pandas.__version__.split('.')[0]) < 3)" \
                      || wheels+=("$wheel") ;;
        *) wheels+=("$wheel") ;;
    esac
done
if [ ${#wheels[@]} -gt 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu-site "${wheels[@]}"
fi
export PYTHONPATH=/tmp/gpu-site:$PWD
python3 -c "import torch, numpy, pandas; print('torch', torch.__version__, 'cuda', \
torch.cuda.is_available(), 'numpy', numpy.__version__, 'pandas', pandas.__version__)"
keep() {  # the results so far into $out, replaced whole (a lease may end at any moment)
    tar czf "$out/gpu-check-$tag.part" --exclude="*.png" --exclude="*.pdf" \
        --exclude="*.json.gz" --exclude="*.pt" --exclude=trace.json \
        -C "$(dirname "$work")" "$(basename "$work")" 2> /dev/null && mv "$out/gpu-check-$tag.part" "$out/gpu-check-$tag.tgz"
}
(while sleep 10; do keep; done) &
keeper=$!
ONLY="$parts" REPEATS=1 BLOCKS=${BLOCKS:-600} PART_TIMEOUT=$part_s \
    timeout -k 10 "$total_s" bash benchmarks/gpu_check.sh "$work"
status=$?
kill "$keeper"
keep
echo "gpu_check exit $status at $(date +%T)"
exit "$status"
