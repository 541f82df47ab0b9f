#!/bin/bash
# The prepared GPU check of issue 41, one call of a lent GPU machine, under 8 minutes on one H100
# (bench/gpu_check.py says what it measures). Results in ${OUT:-/tmp/gpu_check}: gpu_check.json (every figure),
# gpu_check.log (every part's output), tiny_metrics.jsonl, nvidia-smi.txt; a summary table on stdout.
#
#   bash bench/gpu_check.sh --wheels    # HERE first: the packages the GPU image lacks, as wheels in .whl/
#   run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=560)       # then the device call
#   bash bench/gpu_check.sh --dry-run   # the same code on the CPU at tiny shapes (tests/test_gpu_check.py)
#
# Extra arguments go to bench/gpu_check.py (e.g. --budget-s 300). Exit status 0 when every part is "ok".
set -o pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/gpu_check}
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
# the GPU image's python3 (3.12: jax, flax, optax, orbax, torch) lacks these (setup.py's pins; what they need,
# absl-py, PyYAML, numpy, scipy, packaging, is there): configs/*.py, the tiny world's BM25, faiss (retrieval/build.py
# imports retrieval/dense.py)
WHEELS="ml-collections==1.1.0 bm25s==0.3.16 PyStemmer==3.1.0 faiss-cpu==1.15.1"
case "$1" in
  --wheels)
    mkdir -p .whl
    for w in $WHEELS; do
      $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$w" || exit 2
    done
    ls .whl; exit 0 ;;
  --dry-run)
    shift
    mkdir -p "$out"
    # one CPU device (a test session's XLA_FLAGS may ask for 8): the configs' one-device meshes
    exec env JAX_PLATFORMS=cpu XLA_FLAGS= "$py" bench/gpu_check.py --dry-run --out "$out" "$@" ;;
esac
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: installing .whl/*.whl failed"; exit 2; }
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
for m in ml_collections bm25s Stemmer faiss; do
  "$py" -c "import $m" 2>/dev/null || echo "gpu_check: python module $m missing (bash bench/gpu_check.sh --wheels here, carry .whl)"
done
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$out/nvidia-smi.txt"
"$py" bench/gpu_check.py --out "$out" "$@"
