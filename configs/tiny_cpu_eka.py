"""EKA (seed 000) on the tiny world: P0, the top passage for the raw question, in `<knowledge>` before the first
think; in the Search-R1 setting as configs/eka_7b.py: Search-R1's tags and the backbone's reward (tiny_cpu's EM);
P0 has retrieval_k passages, as in the SFT traces.

    python launch/train.py --config configs/tiny_cpu_eka.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.protocol.update(dict(name="eka", tags="search_r1"))
    c.rollout.initial_k = c.rollout.retrieval_k
    return c
