"""tiny_cpu with a tiny Qwen3 in place of its Qwen2: q/k RMSNorm per head, no q/k/v biases, 4 heads of 48 dims
(head_dim != hidden_size / heads = 32), tied embeddings; the same world, SFT start, GRPO and schedule.

    python launch/train.py --config configs/tiny_cpu_qwen3.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.model.update(dict(family="qwen3", head_dim=48))
    return c
