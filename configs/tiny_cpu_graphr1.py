"""Graph-R1 on the tiny world, the miniature of EKA's main setting: the world's knowledge hypergraph (Graph-R1's
construction with the rule extractor: each fact sentence a hyperedge joining its subject and object; MiniLM
embeddings), entity + hyperedge retrieval fused as Graph-R1 fuses them, the `<query>` / `<knowledge>` agent whose
observations are the server's JSON, and Graph-R1's reward (format, then answer F1), as configs/graphr1_7b.py.

Scaled to the tiny model: the top 3 hyperedges per search instead of 10 (a trace's fact is among them for 96% of
the SFT traces' searches, 69% at 1; ~150 tokens of JSON each), so the cache holds 1,152 tokens (EKA's P0 adds
up to ~60 to the prompt); a query segment of JSON takes up to 50 tokens, so a turn may decode 64.

    python launch/train.py --config configs/tiny_cpu_graphr1.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.protocol.update(dict(name="graph_r1", tags="graph_r1"))
    c.retriever.update(dict(kind="hypergraph", encoder="minilm"))  # index: built under WORKDIR/world/hypergraph
    c.rollout.update(dict(retrieval_k=3, initial_k=3, eval_retrieval_k=3, max_obs_tokens=192, cache_len=1152))
    c.rollout.max_segment_tokens = 64
    c.sft.max_len = 1152
    c.reward.terms = (("graph_r1", 1.0),)
    return c
