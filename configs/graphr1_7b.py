"""Graph-R1 (GRPO) on Qwen2.5-7B-Instruct: the backbone of EKA's main table (seed 000 Table 1), one dataset at a
time: a knowledge hypergraph built from the dataset's own contexts, searched by entity and by hyperedge
(`launch/build_hypergraph.py`, `launch/serve_retriever.py --retriever hypergraph`), the `<query>` / `<knowledge>`
agent of Graph-R1 and its reward.

Hyperparameters: EKA's `run_grpo.sh` (yxzwang/EarlyKnowledgeAlignment), with which EKA trained both the backbone
and itself (appendix D.4: "The models with EKA share the same hyperparameters with the backbone method"), and the
defaults of its veRL fork (`verl/trainer/config/ppo_trainer.yaml`) for what the script leaves unset.
LHRLAB/Graph-R1's own `run_grpo.sh` differs in the hardware only where it matters here (1 epoch on 4 GPUs).

    python launch/build_hypergraph.py --corpus datasets/2WikiMultiHopQA/corpus.jsonl \\
        --out indexes/hypergraph/2WikiMultiHopQA --llm-url https://api.openai.com/v1 --llm-model gpt-4o-mini
    python launch/serve_retriever.py --retriever hypergraph --index indexes/hypergraph/2WikiMultiHopQA --port 8001
    python launch/train.py --config configs/graphr1_7b.py --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct

Another dataset: `--config configs/graphr1_7b.py:HotpotQA` (its qa files, its own hypergraph server).
"""

import ml_collections

from configs import search_r1_7b

DATASETS = ("2WikiMultiHopQA", "HotpotQA", "Musique", "NQ", "PopQA", "TriviaQA")  # Graph-R1's six


def get_config(dataset: str = "2WikiMultiHopQA"):
    """dataset: one of DATASETS (trained and evaluated one at a time, as Graph-R1 and EKA do)."""
    if dataset not in DATASETS:
        raise ValueError(f"configs/graphr1_7b.py:{dataset}: expected one of {', '.join(DATASETS)}")
    c = search_r1_7b.get_config()  # the 7B memory plan: scanned layers, replicated decode copy
    c.model.hf_path = "checkpoints/Qwen2.5-7B-Instruct"
    c.protocol.update(dict(name="graph_r1", tags="graph_r1"))
    # Graph-R1's retrieval server (script_api.py: POST /search); ours serves the same hypergraph on /retrieve too
    c.retriever.update(dict(kind="remote", url="http://127.0.0.1:8001/retrieve", encoder=""))
    # Graph-R1's layout (script_process.py: datasets/NAME/raw/qa_{train,dev,test}.json); validation on the test
    # split (run_grpo.sh: data.val_files=.../test.parquet), all of it (veRL validates the whole file)
    c.data.train = f"datasets/{dataset}/raw/qa_train.json"
    c.data.eval = ml_collections.ConfigDict({dataset: f"datasets/{dataset}/raw/qa_test.json"})
    c.data.eval_examples = 0
    c.data.batch_size = 128  # run_grpo.sh: data.train_batch_size=128
    c.data.group_size = 5  # run_grpo.sh: actor_rollout_ref.rollout.n_repeat=5
    c.total_epochs = 3  # run_grpo.sh: trainer.total_epochs=3 (Graph-R1's own script: 1)
    c.eval_every = 10  # run_grpo.sh: trainer.test_freq=10
    c.save_every = 40  # run_grpo.sh: trainer.save_freq=40
    c.rollout.update(
        dict(
            max_turns=10,  # ppo_trainer.yaml: tool.max_turns=10
            # the server's fused top 10 (script_api.py: QueryParam(top_k=10)), in training and validation
            retrieval_k=10,
            eval_retrieval_k=10,
            initial_k=5,  # EKA's P0 (get_knowledge.py top_n; process_all_dataset.sh, run_grpo.sh: top 5)
            max_segment_tokens=4096,  # run_grpo.sh: data.max_response_length=4096
            max_obs_tokens=4096,  # run_grpo.sh: data.max_tool_response_length=4096
            cache_len=4096,  # run_grpo.sh: data.max_prompt_length=4096 (prompt + all turns)
            temperature=1.0,  # ppo_trainer.yaml: rollout.temperature=1.0
            top_p=1.0,  # ppo_trainer.yaml: rollout.top_p=1
            top_k=0,  # ppo_trainer.yaml: rollout.top_k=-1 (off)
            # validation asks for greedy decoding (ray_trainer.py _validate: do_sample=False), but the agent loop
            # rebuilds each turn's batch without that meta_info (generation.py run_llm_loop:
            # DataProto.from_dict), so vLLM samples as in training: the published figures are sampled
            eval_temperature=1.0,
            eval_top_p=1.0,
        )
    )
    c.reward.terms = (("graph_r1", 1.0),)  # Graph-R1's format + answer-F1 reward (rewards.graph_r1_score)
    c.algo.update(
        dict(
            kl_coef=0.001,  # run_grpo.sh: actor.kl_loss_coef=0.001
            kl_kind="low_var_kl",  # run_grpo.sh: actor.use_kl_loss=True, kl_loss_type=low_var_kl
            entropy_coef=0.001,  # ppo_trainer.yaml: actor.entropy_coeff=0.001
            clip_eps=0.2,  # ppo_trainer.yaml: actor.clip_ratio=0.2
            # run_grpo.sh: ppo_mini_batch_size=64 trajectories (fsdp_workers.py multiplies it by rollout.n = 1,
            # not by n_repeat = 5): a step's 128 x 5 = 640 trajectories make 10 updates
            mini_batches=10,
            # run_grpo.sh: ppo_micro_batch_size_per_gpu=4 on 8 GPUs: 32 rows per pass, 2 per mini-batch
            micro_batches=2,
        )
    )
    # run_grpo.sh: actor.optim.lr=5e-7; ppo_trainer.yaml: lr_warmup_steps_ratio=0, warmup_style constant
    c.optim.update(dict(lr=5e-7, warmup_ratio=0.0, schedule="constant"))
    return c
