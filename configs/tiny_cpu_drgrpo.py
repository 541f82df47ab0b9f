"""Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783) on the tiny world:
tiny_cpu's main job with GRPO's two biases removed (§3.2).

    python launch/train.py --config configs/tiny_cpu_drgrpo.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.algo.update(
        dict(
            advantage="dr_grpo",  # A_i = r_i - mean(group): no std normalisation
            policy_loss="ppo",
            # each row's token sum over a constant, the most policy tokens a row can hold ((4 + 1) x 48 = 240,
            # algo.loss_norm_tokens 0), not over the row's own length: the paper's Listing 1 (MAX_TOKENS)
            agg_mode="seq-mean-token-sum-norm",
            kl_coef=0.0,  # Oat-Zero's recipe trains without the KL term (§3.2 omits it from the objective)
            entropy_coef=0.0,
        )
    )
    return c
