"""SOAR (seed 001) on Qwen2.5-7B-Instruct: internal-knowledge stream beside retrieval, a declared
<information_source>, the source-consistent reward, and the evidence-fabrication judge (Table 2).

    python launch/train.py --config configs/soar_7b.py --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct \\
        --config.judge.kind=openai --config.judge.base_url=http://127.0.0.1:8001 --config.judge.model=JUDGE
"""

from configs import search_r1_7b


def get_config():
    c = search_r1_7b.get_config()
    c.model.hf_path = "checkpoints/Qwen2.5-7B-Instruct"
    c.protocol.name = "soar"
    c.rollout.internal_k = 3
    c.reward.terms = (
        ("em", 1.0),
        ("source_consistency", 0.2),
    )  # add ("grounded", w) with a judge to train on it
    c.judge.update(dict(kind="openai", base_url="http://127.0.0.1:8001", model="Qwen2.5-72B-Instruct"))
    return c
