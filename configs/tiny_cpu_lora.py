"""The embedded default (configs/tiny_cpu.py) with LoRA: after the same SFT warm start, GRPO trains rank-8
adapters on every projection; the base stays frozen and is the reference. The final adapters are written in
peft's format (WORKDIR/grpo/adapter), the merged policy as a params dir (WORKDIR/grpo/params).

    python launch/train.py --config configs/tiny_cpu_lora.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.lora.update(dict(rank=8, alpha=16.0, dropout=0.0, target_modules="all-linear"))
    # not from a paper: LoRA trains with a larger learning rate than full fine-tuning (tiny_cpu's 2e-4)
    c.optim.lr = 2e-3
    return c
