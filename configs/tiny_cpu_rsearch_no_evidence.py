"""R-Search's evidence-free ablation (seed 002 §5.2, Table 3) on the tiny world: configs/tiny_cpu_rsearch.py
with the evidence removed from the rollout and from the rewards ("removes evidence from rollout and disables
evidence-related rewards in the evidence and format reward"); everything else as there.

    python launch/train.py --config configs/tiny_cpu_rsearch_no_evidence.py
"""

from configs import tiny_cpu_rsearch


def get_config():
    c = tiny_cpu_rsearch.get_config()
    # the rollout: R-Search's prompt without its evidence sentences (agent/protocols.py
    # RSEARCH_NO_EVIDENCE_SYSTEM_PROMPT; the authors publish none), and SFT traces without the evidence block
    c.protocol.name = "rsearch_no_evidence"
    # the rewards: answer F1 as in qa_f1.py compute_score_f1; its evidence F1 term dropped, and of the format
    # reward (0.2 answer + 0.2 evidence) only the answer's 0.2
    c.reward.terms = (("rsearch_f1", 1.0), ("rsearch_format_no_evidence", 1.0))
    c.evidence_model.kind = ""  # no evidence reader: nothing reads evidence
    # rollout.max_segment_tokens stays tiny_cpu_rsearch's 64 (room for the evidence it no longer writes):
    # only the evidence differs between the two runs
    return c
