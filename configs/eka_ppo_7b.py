"""EKA with PPO (critic + GAE) instead of GRPO: the eka_7b recipe with search_r1_ppo_7b's algorithm."""

from configs import eka_7b, search_r1_ppo_7b


def get_config():
    c = eka_7b.get_config()
    ppo = search_r1_ppo_7b.get_config()
    c.algo.update(ppo.algo)
    c.data.group_size = ppo.data.group_size
    # the critic's state stays resident through the rollout: decode the 512 rows in two slot batches of 256 so
    # the replicated copy and the KV cache fit beside it on 8 x H100 (bench/RESULTS.md "Memory plans")
    c.rollout.micro_batch = 256
    return c
