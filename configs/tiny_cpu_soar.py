"""SOAR (seed 001) on the tiny world: an internal-knowledge stream (the policy lists facts from its own
knowledge) beside retrieval, a declared `<information_source>`, EM + 0.2 source-consistency reward as in
configs/soar_7b.py; the fabrication judge is tiny_cpu's rule-based one (`world.oracle.WorldChatModel`).

    python launch/train.py --config configs/tiny_cpu_soar.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.protocol.name = "soar"
    c.rollout.internal_k = 3
    c.reward.terms = (("em", 1.0), ("source_consistency", 0.2))
    # each observation carries the internal stream too: traces run to 620 tokens, so neither is cut
    c.rollout.cache_len = 768
    c.sft.max_len = 768
    return c
