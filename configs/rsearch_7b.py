"""R-Search (seed 002) on Qwen2.5-7B-Instruct: <evidence> before <answer>; reward = answer F1 + evidence F1
(a frozen model of another family answers from the evidence alone) + format (0.2 + 0.2). Trained on
2WikiMultiHopQA, batch 256, at most 195 steps; top-3 passages in training, top-5 at evaluation.

    python launch/train.py --config configs/rsearch_7b.py --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct \\
        --config.evidence_model.base_url=http://127.0.0.1:8002 --config.evidence_model.model=Llama-3.1-8B-Instruct
"""

from configs import search_r1_7b


def get_config():
    c = search_r1_7b.get_config()
    c.model.hf_path = "checkpoints/Qwen2.5-7B-Instruct"
    c.protocol.name = "rsearch"
    c.data.train = "data/2wikimultihopqa/train.jsonl"
    c.data.batch_size = 256
    c.total_steps = 195
    c.rollout.eval_retrieval_k = 5
    c.reward.terms = (("f1", 1.0), ("evidence", 1.0), ("rsearch_format", 1.0))
    c.evidence_model.update(
        dict(kind="openai", base_url="http://127.0.0.1:8002", model="Llama-3.1-8B-Instruct")
    )
    return c
