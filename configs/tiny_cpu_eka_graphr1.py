"""EKA in the Graph-R1 setting on the tiny world (configs/eka_graphr1_7b.py in miniature): configs/tiny_cpu_graphr1.py
plus P0, the hypergraph's top hyperedges for the raw question inside `<knowledge>` after the question.

    python launch/train.py --config configs/tiny_cpu_eka_graphr1.py
"""

from configs import tiny_cpu_graphr1


def get_config():
    c = tiny_cpu_graphr1.get_config()
    c.protocol.update(dict(name="eka", tags="graph_r1"))
    c.rollout.initial_k = c.rollout.retrieval_k
    return c
