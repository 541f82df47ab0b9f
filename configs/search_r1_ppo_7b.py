"""Search-R1 with PPO: a critic initialised from the policy (lr 1e-5, warmup 0.015), GAE (gamma = lambda
= 1), KL 0.001 as a per-token reward penalty, one sample per prompt (Search-R1's train_ppo.sh).

    python launch/train.py --config configs/search_r1_ppo_7b.py --config.model.hf_path=/ckpt/Qwen2.5-7B
"""

from configs import search_r1_7b


def get_config():
    c = search_r1_7b.get_config()
    # train_ppo.sh: algorithm.kl_ctrl.kl_coef=0.001 (in the reward), no KL loss; ppo_trainer.yaml gamma = lam = 1
    c.algo.update(dict(advantage="gae", kl_coef=0.0, kl_in_reward=0.001, gamma=1.0, lam=1.0))
    c.data.group_size = 1  # train_ppo.sh: rollout.n_agent=1
    # train_ppo.sh: ppo_mini_batch_size=256 of train_batch_size=512 -> 2 updates per step. Gradient accumulation
    # is sized for memory, not copied: 8 micro-batches of 32 rows (the plan in README's table) where Search-R1
    # accumulates 4 of 64 (ppo_micro_batch_size=64); the update is the same
    c.algo.update(dict(mini_batches=2, micro_batches=8))
    return c
