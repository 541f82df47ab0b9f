"""Search-R1-PPO in EKA's Graph-R1 setting: the "Search-R1-PPO" row of seed 000 Table 2 (§5.2: "we run
the Search-R1-PPO by ourselves as the PPO variants in the table"). configs/search_r1_graphr1_7b.py
(Search-R1's loop over the dataset's chunk server, Graph-R1's data) trained with PPO as the Graph-R1 setting
runs it: run_ppo.sh of yxzwang/EarlyKnowledgeAlignment (byte for byte LHRLAB/Graph-R1's run_ppo.sh) and the
defaults of their veRL fork (verl/trainer/config/ppo_trainer.yaml) for what it leaves unset.

    python launch/train.py --config configs/search_r1_ppo_graphr1_7b.py:2WikiMultiHopQA \\
        --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct

Not expressed: run_ppo.sh's trainer.critic_warmup=3 (the actor is not updated in the first 3 steps, only the
critic); this project's trainer updates both from the first step.
"""

from configs import search_r1_graphr1_7b


def get_config(dataset: str = "2WikiMultiHopQA"):
    """dataset: one of graphr1_7b.DATASETS (`--config configs/search_r1_ppo_graphr1_7b.py:HotpotQA`)."""
    c = search_r1_graphr1_7b.get_config(dataset)
    c.algo.update(
        dict(
            advantage="gae",  # run_ppo.sh algorithm.adv_estimator=gae; critic.model.path = the policy's
            # ppo_trainer.yaml actor.use_kl_loss=False, so ray_trainer.py apply_kl_penalty puts the KL in
            # the reward: algorithm.kl_ctrl.kl_coef=0.001 (run_ppo.sh), kl_ctrl.type fixed, kl_penalty "kl"
            # (old - ref)
            kl_coef=0.0,
            kl_in_reward=0.001,
            gamma=1.0,  # ppo_trainer.yaml algorithm.gamma
            lam=1.0,  # ppo_trainer.yaml algorithm.lam
            # GAE over every response token: ray_trainer.py compute_advantage, response_mask = attention_mask
            gae_tokens="response",
            # run_ppo.sh ppo_mini_batch_size=64 of train_batch_size=128 x n_repeat 1: 2 updates per step
            mini_batches=2,
            # run_ppo.sh ppo_micro_batch_size_per_gpu=2 on 4 GPUs: 8 rows per pass, 8 per 64-row mini-batch
            micro_batches=8,
        )
    )
    c.data.group_size = 1  # run_ppo.sh sets no rollout.n_repeat: ppo_trainer.yaml n_repeat=1
    c.total_epochs = 1  # run_ppo.sh trainer.total_epochs=1
    c.eval_every = 10  # run_ppo.sh trainer.test_freq=10
    # run_ppo.sh critic.optim.lr=1e-5; ppo_trainer.yaml critic.optim.lr_warmup_steps_ratio=0 (Search-R1's
    # train_ppo.sh warms up 0.015), critic.cliprange_value=0.5
    c.critic.update(dict(lr=1e-5, warmup_ratio=0.0, clip_eps=0.5))
    # the actor as in GRPO: run_ppo.sh actor.optim.lr=5e-7, ppo_trainer.yaml warmup 0, constant schedule
    c.optim.update(dict(lr=5e-7, warmup_ratio=0.0, schedule="constant"))
    # run_ppo.sh saves no checkpoint (trainer.save_freq=-1); graphr1_7b.py's save_every=40 is kept so that a
    # stopped run can resume (it changes no training value)
    return c
