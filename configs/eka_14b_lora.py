"""EKA on Qwen2.5-14B-Instruct (configs/eka_14b.py) with LoRA on one 8-device host (8 x H100 80GB, or a v5p-16
slice): the bf16 base frozen and fsdp-sharded (29.5 GB in all, 3.7 GB per device; the reference policy too),
rank-64 adapters on every projection trained in fp32.

    python launch/plan.py --config configs/eka_14b_lora.py --mesh fsdp=8
    python launch/train.py --config configs/eka_14b_lora.py --config.model.hf_path=/ckpt/Qwen2.5-14B-Instruct

Not from the EKA paper (it fine-tunes every parameter): the rank, alpha and learning rate are our defaults.
"""

from configs import eka_14b, eka_7b_lora


def get_config():
    c = eka_7b_lora.with_lora(eka_14b.get_config())  # eka_7b_lora's base dtype, adapters and learning rate
    # the rollout on 8 devices: a replicated merged copy (29.5 GB; the base's fsdp shards are gathered once per
    # step, not at every token) beside 64 rows' KV cache at a time (51.5 GB in all, 6.4 GB per device; with 128
    # rows libtpu plans the rollout phase at 79.5 GB per device, over an 80 GB card's 72 GB budget)
    c.rollout.decode_layout = "replicated"
    c.rollout.micro_batch = 64
    return c
