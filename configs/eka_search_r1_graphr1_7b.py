"""EKA on Search-R1 (GRPO) in the Graph-R1 setting: the "Search-R1 + EKA" row of seed 000 Table 2 (§5:
"We also run EKA on Search-R1 in the Graph-R1 setting with a smaller, dataset-specific chunk-based retrieval
set"). configs/search_r1_graphr1_7b.py plus P0: the top 5 passages of the same chunk server for the raw
question, in `<knowledge>` at the end of the user turn, before the first think (§3; the `eka` protocol,
search_r1 tags). Nothing else changes (appendix D.4: "The models with EKA share the same hyperparameters with
the backbone method").

    python launch/serve_retriever.py --corpus datasets/2WikiMultiHopQA/corpus.jsonl --retriever dense \\
        --index indexes/e5/2WikiMultiHopQA --port 8002
    python launch/train.py --config configs/eka_search_r1_graphr1_7b.py:2WikiMultiHopQA \\
        --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct

The authors publish no Search-R1 prompt with P0 (EKA's script_process.py has the Graph-R1 one only): the
search_r1 tags use Search-R1's prompt with EKA's sentence about the initial knowledge (agent/protocols.py).
"""

from configs import search_r1_graphr1_7b


def add_p0(c):
    """c (a Search-R1 config of the Graph-R1 setting) with EKA's P0; the rest as it was (D.4)."""
    c.protocol.update(dict(name="eka", tags="search_r1"))
    # P0's k: get_knowledge.py --top_n 5 (README), the top-5 files run_grpo.sh trains on
    # (processed_with_top_5_knowledge); from the loop's own retriever (initial_retriever.kind "": the same)
    c.rollout.initial_k = 5
    return c


def get_config(dataset: str = "2WikiMultiHopQA"):
    """dataset: one of graphr1_7b.DATASETS (`--config configs/eka_search_r1_graphr1_7b.py:HotpotQA`)."""
    return add_p0(search_r1_graphr1_7b.get_config(dataset))
