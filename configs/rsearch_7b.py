"""R-Search (seed 002) on Qwen2.5-7B-Instruct: <evidence> before <answer>; reward = answer F1 + evidence F1 (a
frozen Llama-3.2-3B-Instruct answers from the evidence alone) + format (0.2 + 0.2), as QingFei1/R-Search's
`src/verl/utils/reward_score/qa_f1.py` computes them. Values from its `scripts/train_grpo_7b.sh` (the script),
`scripts/evidence.yaml` (the evidence model), `src/eval/main.py` (evaluation) and the paper's sections.

    python launch/train.py --config configs/rsearch_7b.py --config.model.hf_path=/ckpt/Qwen2.5-7B-Instruct \\
        --config.evidence_model.base_url=http://127.0.0.1:8004 --config.evidence_model.model=Llama-3.2-3B-Instruct
"""

import ml_collections

from configs import search_r1_7b


def get_config():
    c = search_r1_7b.get_config()
    c.model.hf_path = "checkpoints/Qwen2.5-7B-Instruct"  # train_grpo_7b.sh: BASE_MODEL
    c.protocol.name = "rsearch"
    c.data.train = "data/2wikimultihopqa/train.jsonl"  # §4.3: RL trains on 2WikiMQA only
    c.data.batch_size = 256  # train_grpo_7b.sh: data.train_batch_size=256 (§4.3: batch size 256)
    c.data.group_size = 5  # train_grpo_7b.sh: rollout.n_agent=5
    # train_grpo_7b.sh: trainer.total_training_steps=120 (§4.3 says "at most 195 steps"), lr 1e-6 with
    # lr_warmup_steps_ratio=0.95, ppo_mini_batch_size=256 of 1280 trajectories -> 5 updates per step,
    # ppo_micro_batch_size=64 -> 4 accumulation steps
    c.total_steps = 120
    c.optim.update(dict(lr=1e-6, warmup_ratio=0.95))
    c.algo.update(dict(mini_batches=5, micro_batches=4))
    c.rollout.update(
        dict(
            max_turns=4,  # train_grpo_7b.sh: max_turns=4
            retrieval_k=3,  # train_grpo_7b.sh: retriever.topk=3 (§4.3: training top-k 3)
            max_obs_tokens=1800,  # train_grpo_7b.sh: data.max_obs_length=1800
            cache_len=8192,  # train_grpo_7b.sh: data.max_prompt_length=8192
            # evaluation: src/eval/main.py samples at temperature 0.1, top_p 0.9 (§A.3: temperature 0.1) with
            # the top 5 passages (§4.3), observations uncut (1800 tokens hold 5 passages)
            eval_temperature=0.1,
            eval_top_p=0.9,
            eval_retrieval_k=5,
            # src/eval/main.py R_Search: no turn cap (its `if cnt>4: break` is commented out), so none short
            # of the cache (a turn decodes at least one token), and --max_tokens 1024 new tokens per vLLM call
            eval_max_turns=8192,
            eval_max_segment_tokens=1024,
        )
    )
    # src/eval/main.py + config.yaml `search` + scripts/retrieval_launch.sh: 2WikiMQA, HotpotQA and MuSiQue
    # are searched in their own corpora, every other dataset in wiki-18 ("*"); training searches the 2WikiMQA
    # corpus (`retriever`, train_grpo_7b.sh retriever.url port 8000). Name the eval datasets as below.
    c.data.eval_retrievers = ml_collections.ConfigDict(
        {
            "2wikimultihopqa": "http://127.0.0.1:8000/retrieve",
            "hotpotqa": "http://127.0.0.1:8003/retrieve",
            "musique": "http://127.0.0.1:8002/retrieve",
            "*": "http://127.0.0.1:8001/retrieve",  # wiki-18
        }
    )
    # §A.1: 500 test questions per dataset (single-hop ones sampled at random), all 125 of Bamboogle; the seed is
    # src/eval/main.py's seed_everything(44) (the authors ship their samples; ours are drawn with it)
    c.data.update(dict(eval_examples=500, eval_sample="random", eval_seed=44))
    c.reward.terms = (
        ("rsearch_f1", 1.0),
        ("evidence", 1.0),
        ("rsearch_format", 1.0),
    )  # qa_f1.py: sum of the three
    # scripts/evidence.yaml: LOCAL_MODEL Llama-3.2-3B-Instruct (§4.2), served by evidence_server.sh on port 8004;
    # qa_f1.py call_llm: max_tokens 512, temperature 0.1, top_p 0.9
    c.evidence_model.update(
        dict(
            kind="openai",
            base_url="http://127.0.0.1:8004",
            model="Llama-3.2-3B-Instruct",
            max_new_tokens=512,
            temperature=0.1,
            top_p=0.9,
        )
    )
    return c
