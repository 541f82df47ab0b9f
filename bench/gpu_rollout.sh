#!/bin/bash
# The GPU measurement of issue 17, as one call of a lent machine (its own python3, jax and transformers):
#   bench/rollout.py at Qwen2.5-0.5B's shape with random weights, bf16, batch 16 / 64 / 256, against
#   transformers generate on the same GPU; tokens/s, the decode step's fraction of HBM bandwidth, and a
#   trace of one batch-16 rollout (per-kernel time, busy vs span). Logs and the trace go to ${OUT:-/tmp/gpu_out}.
#   With VARIANTS=1 instead: batch 16 under XLA flag variants (Triton GEMMs off, command buffers off).
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
python3 -c "import jax, flax, torch, transformers; print('jax', jax.__version__, 'flax', flax.__version__,
 'torch', torch.__version__, 'transformers', transformers.__version__, jax.devices())"
lscpu | grep "Model name"
run() {  # $1: log name; the rest: rollout.py's arguments
  local name=$1; shift
  timeout "${ROLLOUT_TIMEOUT:-330}" python3 bench/rollout.py --size 0.5B --dtype bfloat16 --reps 5 "$@" 2>&1 \
    | grep -v "Warning\|warn(\|Writing model" | tee "$out/$name.log"
}
if [ -z "$VARIANTS" ]; then
  run rollout_0.5B --batch 16 64 256 --profile "$out"
else
  run default --batch 16
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false run no_triton_gemm --batch 16 --profile "$out"
  XLA_FLAGS=--xla_gpu_enable_command_buffer= run no_command_buffer --batch 16
fi
