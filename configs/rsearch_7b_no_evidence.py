"""R-Search's evidence-free ablation (seed 002 §5.2, Table 3: "removes evidence from rollout and disables
evidence-related rewards in the evidence and format reward") on Qwen2.5-7B-Instruct: configs/rsearch_7b.py
with those changes, everything else as there. QingFei1/R-Search (commit ecba08d) ships no script, prompt or
flag for this variant; the changes below follow the paper's sentence, applied to the authors' reward code.

    python launch/train.py --config configs/rsearch_7b_no_evidence.py \\
        --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct
"""

from configs import rsearch_7b


def get_config():
    c = rsearch_7b.get_config()
    # "removes evidence from rollout": scripts/pre_train_data.sh's system template without its three
    # evidence sentences (agent/protocols.py RSEARCH_NO_EVIDENCE_SYSTEM_PROMPT)
    c.protocol.name = "rsearch_no_evidence"
    # "disables evidence-related rewards in the evidence and format reward": of qa_f1.py compute_score_f1
    # (src/verl/utils/reward_score/; format + answer F1 + evidence F1) the evidence F1 and the evidence's
    # 0.2 format credit (extract_solution on <original_evidence>) go; answer F1 and the answer's 0.2 stay
    c.reward.terms = (("rsearch_f1", 1.0), ("rsearch_format_no_evidence", 1.0))
    # no evidence reward, so no evidence reader (scripts/evidence_server.sh's Llama-3.2-3B-Instruct) to serve
    c.evidence_model.kind = ""
    return c
