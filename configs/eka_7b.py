"""EKA (seed 000) in the Search-R1 setting on Qwen2.5-7B-Instruct: Search-R1's loop, data, retriever, reward and
hyperparameters (appendix D.4: "In Search-R1 setting, the hyperparameters are the same as Search-R1. The models
with EKA share the same hyperparameters with the backbone method"), plus P0: the top-k passages for the raw
question inside <knowledge> before the first think (§3).

    python launch/train.py --config configs/eka_7b.py --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct

Noisy-P0 ablation: --config.initial_retriever.kind=bm25 --config.initial_retriever.corpus=OTHER.jsonl
EKA in Graph-R1's setting (hypergraph retrieval, <query>/<knowledge> tags, the `graph_r1` reward) is its own config.
"""

from configs import search_r1_7b


def get_config():
    c = (
        search_r1_7b.get_config()
    )  # Search-R1's data (NQ + HotpotQA), e5 retriever, EM reward, hyperparameters
    c.model.hf_path = "checkpoints/Qwen2.5-7B-Instruct"  # EKA's backbones are the Instruct models (§4.1)
    c.protocol.update(dict(name="eka", tags="search_r1"))
    # The paper gives no k for the Search-R1 setting; the EKA code builds P0 from the top 5
    # (yxzwang/EarlyKnowledgeAlignment get_knowledge.py top_n, process_all_dataset.sh: 5)
    c.rollout.initial_k = 5
    return c
