"""EKA (seed 000) on Qwen2.5-7B-Instruct: early knowledge P0 (top-k passages for the raw question) inside
<knowledge> before the first think, in Graph-R1's setting (<query> / <knowledge> tags, F1 reward).

    python launch/train.py --config configs/eka_7b.py --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct

Noisy-P0 ablation: --config.initial_retriever.kind=bm25 --config.initial_retriever.corpus=OTHER.jsonl
"""

from configs import search_r1_7b


def get_config():
    c = search_r1_7b.get_config()
    c.model.hf_path = "checkpoints/Qwen2.5-7B-Instruct"
    c.protocol.update(dict(name="eka", tags="graph_r1"))
    c.rollout.initial_k = 5
    # Graph-R1 scores answer F1; its format gate checks Graph-R1's own tags, which rewards.is_valid_sequence
    # (Search-R1's tag grammar) does not, so the ungated F1 is used.
    c.reward.terms = (("f1", 1.0),)
    return c
