"""EKA (seed 000) on Qwen3-4B-Instruct-2507: appendix B.1's run ("We show the Qwen3-4B-Instruct-2507 model's
performances in the training step in Figure B.1"), in the Search-R1 setting of configs/eka_7b.py; the appendix
names no other change, and D.4 gives EKA the backbone method's hyperparameters.

    python launch/train.py --config configs/eka_qwen3_4b.py --config.model.hf_path=/ckpt/Qwen3-4B-Instruct-2507
    python launch/plan.py --config configs/eka_qwen3_4b.py       # memory plan of the preset's shapes

Known gap: the tokenizer is the Qwen2.5 BPE (`models/tokenizer.py`); Qwen3's own adds <tool_response>,
</tool_response>, <think> and </think> as single ids 151665-151668, which this one encodes as ordinary text.
"""

from configs import eka_7b


def get_config():
    c = eka_7b.get_config()
    # seed 000 appendix B.1: the Qwen3-4B-Instruct-2507 backbone (the preset holds its config.json shapes, for a
    # random init or `launch/plan.py`; a checkpoint's own config.json is read when hf_path is set)
    c.model.update(dict(hf_path="checkpoints/Qwen3-4B-Instruct-2507", preset="qwen3-4b-instruct-2507"))
    # not the paper's: a token's KV cache is 2.6x Qwen2.5-7B's (36 layers x 8 kv heads of 128 against 28 x 4),
    # so the rollout decodes 256 of the 2560 rows at a time: 155 GB of cache in all instead of 309 GB
    # (`launch/plan.py --config configs/eka_qwen3_4b.py`, fsdp=8 on CPU: rollout phase 91 GB per device against
    # 149 GB at 512 rows and eka_7b's 104 GB)
    c.rollout.micro_batch = 256
    return c
