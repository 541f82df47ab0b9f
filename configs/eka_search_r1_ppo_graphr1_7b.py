"""EKA on Search-R1-PPO in the Graph-R1 setting: the "Search-R1-PPO + EKA" row of seed 000 Table 2 (§5.2).
configs/search_r1_ppo_graphr1_7b.py plus P0 (eka_search_r1_graphr1_7b.add_p0); the PPO hyperparameters are the
backbone's (appendix D.4: "The models with EKA share the same hyperparameters with the backbone method").

    python launch/train.py --config configs/eka_search_r1_ppo_graphr1_7b.py:2WikiMultiHopQA \\
        --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct
"""

from configs import eka_search_r1_graphr1_7b, search_r1_ppo_graphr1_7b


def get_config(dataset: str = "2WikiMultiHopQA"):
    """dataset: one of graphr1_7b.DATASETS (`--config configs/eka_search_r1_ppo_graphr1_7b.py:HotpotQA`)."""
    return eka_search_r1_graphr1_7b.add_p0(search_r1_ppo_graphr1_7b.get_config(dataset))
