"""GSPO (Zheng et al. 2025, arXiv 2507.18071) on the tiny world: tiny_cpu's main job with a sequence-level
importance ratio (length-normalised, Eq. 7), sequence-level clipping and a per-sequence loss (Eq. 5).

    python launch/train.py --config configs/tiny_cpu_gspo.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    c.algo.update(
        dict(
            advantage="grpo",  # Eq. 6: GRPO's group-normalised reward
            policy_loss="gspo",
            clip_eps_low=3e-4,  # §5.1: left and right clipping ranges 3e-4 and 4e-4
            clip_eps_high=4e-4,
            agg_mode="seq-mean-token-mean",  # Eq. 5: 1/G sum over sequences
            mini_batches=4,  # §5.1: each rollout batch is split into four mini-batches for the updates
            kl_coef=0.0,  # Eq. 5 has no KL term (TRL's GSPO setting: beta 0, from the authors)
            entropy_coef=0.0,
        )
    )
    return c
