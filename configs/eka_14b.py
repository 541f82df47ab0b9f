"""EKA on Qwen2.5-14B-Instruct (same recipe as eka_7b): params and optimizer sharded over fsdp, layer remat,
more micro-batches. Target: a v5p-64 slice (32 chips) or 2 x 8 H100 80GB.

    python launch/train.py --config configs/eka_14b.py --config.model.hf_path=/ckpt/Qwen2.5-14B-Instruct
"""

from configs import eka_7b


def get_config():
    c = eka_7b.get_config()
    c.model.update(dict(hf_path="checkpoints/Qwen2.5-14B-Instruct", preset="qwen2.5-14b"))
    c.algo.micro_batches = 8  # 32-row micro-batches of the 256-row mini-batches: divisible by 16 and 32 devices
    # a replicated bf16 copy (29.5 GB) beside the 25.8 GB KV cache and the train state does not fit 2 x 8 H100
    # (113 GB per device planned), and the fsdp=16 mesh has no tensor axis: decode from the trainer's params
    c.rollout.decode_layout = "train"
    return c
