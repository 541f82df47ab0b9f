"""DAPO (Yu et al. 2025, arXiv 2503.14476) on the tiny world: tiny_cpu's main job with DAPO's four changes to
GRPO and its removal of the KL term. Group-normalised advantages as GRPO's (Eq. 9).

    python launch/train.py --config configs/tiny_cpu_dapo.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.algo.update(
        dict(
            advantage="grpo",
            policy_loss="ppo",
            clip_eps_low=0.2,  # clip-higher: eps_low 0.2, eps_high 0.28 (§3.1, Eq. 10)
            clip_eps_high=0.28,
            agg_mode="token-mean",  # token-level policy gradient loss (§3.3, Eq. 12)
            kl_coef=0.0,  # no KL penalty (§2.3)
            entropy_coef=0.0,  # the objective (Eq. 8) has no entropy term
            dynamic_sampling=True,  # drop groups of equal rewards and refill (§3.2, Eq. 11)
            max_draws=10,  # veRL's DAPO recipe: max_num_gen_batches=10
            # soft overlong punishment (§3.4, Eq. 13): L_max = the most policy tokens per row ((4 + 1) x 48 =
            # 240, algo.overlong_max_tokens 0), L_cache = 48: the paper's 4096 of 20480, a fifth (§4.1)
            overlong_buffer=48,
        )
    )
    return c
