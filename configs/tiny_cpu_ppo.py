"""Search-R1 with PPO on the tiny world: a critic initialised from the policy, GAE (gamma = lambda = 1), KL
0.001 as a per-token reward penalty, one sample per prompt, as in configs/search_r1_ppo_7b.py. The same rows
per step as tiny_cpu (batch_size x group_size questions); the critic's lr is 10x the policy's, as there.

    python launch/train.py --config configs/tiny_cpu_ppo.py
"""

from configs import tiny_cpu


def get_config():
    c = tiny_cpu.get_config()
    rows = c.data.batch_size * c.data.group_size
    c.data.update(dict(batch_size=rows, group_size=1))
    c.algo.update(dict(advantage="gae", kl_coef=0.0, kl_in_reward=0.001, gamma=1.0, lam=1.0))
    c.critic.update(dict(lr=10 * c.optim.lr, warmup_ratio=0.0))
    return c
