"""EKA on Qwen2.5-7B-Instruct (configs/eka_7b.py) with LoRA on one accelerator: the bf16 base frozen (15.2 GB,
also the reference policy), rank-64 adapters on every projection trained in fp32 with their AdamW moments,
the sampler reading base + adapters merged once per step. Plan it on ONE 80 GB device:

    python launch/plan.py --config configs/eka_7b_lora.py --mesh fsdp=1
    python launch/train.py --config configs/eka_7b_lora.py --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct

Not from the EKA paper (it fine-tunes every parameter): the rank, alpha and learning rate are our defaults.
"""

from configs import eka_7b


def with_lora(c):
    """`c` (an EKA config) trained with LoRA: the base frozen in bf16, rank-64 adapters on every projection."""
    c.model.param_dtype = "bfloat16"  # the frozen base: no fp32 master copy (only the adapters train)
    c.lora.update(dict(rank=64, alpha=64.0, dropout=0.0, target_modules="all-linear"))
    c.optim.lr = 1e-5  # LoRA wants a larger learning rate than full fine-tuning (eka_7b, eka_14b: 1e-6)
    return c


def get_config():
    c = with_lora(eka_7b.get_config())
    # one device: 8-row micro-batches of the 256-row mini-batches, 64 rollout rows at a time (a 15 GB KV
    # cache of 64 x 4096 tokens instead of 120 GB for 512)
    c.algo.micro_batches = 32
    c.rollout.micro_batch = 64
    c.rollout.decode_layout = "train"  # the merged copy keeps the base's layout (one device: whole)
    return c
