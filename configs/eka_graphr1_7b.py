"""EKA (seed 000) in the Graph-R1 setting, the paper's main table (Table 1): configs/graphr1_7b.py plus P0, the
top 5 of the hypergraph server for the raw question, after the question inside `<knowledge>` with EKA's two added
instruction sentences (script_process.py `instruction_following_Retrievalinitial`).

    python launch/serve_retriever.py --retriever hypergraph --index indexes/hypergraph/2WikiMultiHopQA --port 8001
    python launch/train.py --config configs/eka_graphr1_7b.py:2WikiMultiHopQA \\
        --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct
"""

from configs import graphr1_7b


def get_config(dataset: str = "2WikiMultiHopQA"):
    c = graphr1_7b.get_config(dataset)
    c.protocol.update(dict(name="eka", tags="graph_r1"))
    c.rollout.initial_k = 5  # get_knowledge.py top_n, run_grpo.sh: processed_with_top_5_knowledge
    return c
