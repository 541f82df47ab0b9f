#!/bin/bash
# The GPU measurement of issue 17, as one call of a lent machine (its own python3, jax and transformers):
#   bench/rollout.py at Qwen2.5-0.5B's shape with random weights, bf16, batch 16 / 64 / 256, against
#   transformers generate on the same GPU; tokens/s, the decode step's fraction of HBM bandwidth, and a
#   trace of one batch-16 rollout (per-kernel time, busy vs span). Logs and the trace go to ${OUT:-/tmp/gpu_out}.
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
python3 -c "import jax, flax, torch, transformers; print('jax', jax.__version__, 'flax', flax.__version__,
 'torch', torch.__version__, 'transformers', transformers.__version__, jax.devices())"
lscpu | grep "Model name"
timeout "${ROLLOUT_TIMEOUT:-330}" python3 bench/rollout.py --size 0.5B --dtype bfloat16 --batch 16 64 256 --reps 5 \
  --profile "$out" 2>&1 | grep -v "Warning\|warn(" | tee "$out/rollout_0.5B.log"
