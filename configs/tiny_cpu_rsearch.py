"""R-Search (seed 002) on the tiny world: `<evidence>` before `<answer>`; reward = answer F1 + evidence F1 +
format (0.2 + 0.2) as in configs/rsearch_7b.py. The frozen evidence answerer is a rule-based reader of the
world's sentence templates (`world.oracle.read_answer` behind `world.oracle.WorldChatModel`): another "family" than
the policy, and it answers from the evidence alone.

    python launch/train.py --config configs/tiny_cpu_rsearch.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.protocol.name = "rsearch"
    c.reward.terms = (("rsearch_f1", 1.0), ("evidence", 1.0), ("rsearch_format", 1.0))
    c.evidence_model.kind = "world"
    # The answer segment holds every hop's fact sentence as evidence: up to 52 tokens in the SFT traces, which
    # 48 (tiny_cpu's budget, and that of the recorded 3-seed runs) cut for 14 of the 400 training questions.
    c.rollout.max_segment_tokens = 64
    return c
