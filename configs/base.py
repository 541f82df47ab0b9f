"""Base config: Search-R1's published GRPO setting (Qwen2.5-7B, NQ + HotpotQA, e5 retrieval).

Every other config starts from `get_config()` here and overrides what differs. Keys are locked: a typo in
`--config.x=y` is an error that names the key.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.total_steps = 1005  # Search-R1: 1005 steps
    c.log_every = 1
    c.eval_every = 100
    c.save_every = 50
    c.keep_checkpoints = 3

    # The policy: an HF checkpoint dir (hf_path), an orbax params dir (orbax_path), or a random init of
    # `preset` / the explicit shape fields (tests and the synthetic world).
    c.model = dict(
        hf_path="",
        orbax_path="",
        preset="qwen2.5-7b",
        dtype="bfloat16",
        param_dtype="float32",
        remat=True,
        logprob_chunk=512,
        attention_chunk=512,  # query chunk of the training forward's attention (0: dense)
        scan_layers=False,  # training passes scan the layers (the 7B/14B configs: bounds fsdp gathers)
        vocab_size=0,
        hidden_size=0,
        intermediate_size=0,
        num_attention_heads=0,
        num_key_value_heads=0,
        num_hidden_layers=0,
        tie_word_embeddings=False,
    )
    c.tokenizer = dict(kind="qwen", path="")  # kind: qwen | word (path: a WordTokenizer json)

    c.protocol = dict(name="search_r1", tags="search_r1")  # tags: EKA's tag set (search_r1 | graph_r1)
    c.protocol.data_prompt = True  # search_r1: prompt with a dataset row's own `prompt` (Search-R1 parquet)
    # In-loop retriever; kind: bm25 | dense | remote. EKA's P0 may come from another one (noisy-P0 ablation).
    # split_across_hosts: each process of a multi-host run searches 1/N of the queries and the results are
    # all-gathered (retrieval/host_split.py); off, every process searches the whole batch itself
    c.retriever = dict(
        kind="remote",
        corpus="",
        index="",
        url="http://127.0.0.1:8000/retrieve",
        encoder="e5",
        split_across_hosts=False,
    )
    c.initial_retriever = dict(kind="", corpus="", index="", url="", encoder="")  # kind "": same as above

    c.data = dict(
        train="data/nq_hotpotqa_train/train.parquet",
        eval=ml_collections.ConfigDict({"nq": "data/nq/test.jsonl"}),  # name -> FlashRAG JSONL / parquet
        eval_examples=512,  # per dataset and evaluation
        batch_size=512,  # questions per step (Search-R1 train_batch_size)
        group_size=5,  # GRPO samples per question
        shuffle=True,
    )
    c.rollout = dict(
        max_turns=4,
        retrieval_k=3,
        initial_k=3,
        internal_k=3,
        max_segment_tokens=500,
        max_obs_tokens=500,
        cache_len=4096,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        eval_temperature=0.0,
        eval_retrieval_k=3,
        micro_batch=0,  # rows per sampler call (0: the whole batch)
    )
    # (name, weight): names of jaxsearch/rl/rewards.py's registry, plus "evidence" (R-Search's evidence
    # reward, needs evidence_model) and "grounded" (SOAR's judge: 1 when grounded, needs judge)
    c.reward = dict(terms=(("em", 1.0),))  # Search-R1's reward: exact match of the last <answer>
    # Chat models behind SOAR's fabrication judge and R-Search's evidence answerer; kind "" = none, openai
    # (an OpenAI-compatible server such as vLLM: base_url, model) or local (a checkpoint dir: path, tokenizer).
    chat = dict(kind="", base_url="", model="", path="", tokenizer="qwen", cache_len=4096, max_new_tokens=512)
    c.judge = dict(chat)
    c.evidence_model = dict(chat)
    c.algo = dict(
        advantage="grpo",  # grpo | dr_grpo | gae (PPO with a critic)
        policy_loss="ppo",
        clip_eps=0.2,
        agg_mode="token-mean",
        kl_coef=0.001,
        kl_kind="low_var_kl",  # KL to the reference as a loss
        kl_in_reward=0.0,  # > 0: KL as a per-token reward penalty instead (PPO)
        entropy_coef=0.0,
        ppo_epochs=1,
        mini_batches=2,  # Search-R1: ppo_mini_batch_size 256 of 512
        micro_batches=16,  # gradient accumulation inside each mini-batch
        pad_multiple=0,  # > 0: update batches padded to a multiple of this, not to cache_len (a compile each)
        gamma=1.0,
        lam=1.0,
    )
    c.optim = dict(lr=1e-6, warmup_ratio=0.285, schedule="constant", weight_decay=0.01, grad_clip=1.0)
    c.critic = dict(lr=1e-5, warmup_ratio=0.015, clip_eps=0.5)  # PPO only
    # A synthetic world under WORKDIR/world (size tiny | small; "" = none): it then provides the data,
    # the retriever's corpus and a word-level tokenizer (model.vocab_size = -1 takes its size).
    c.world = dict(size="", seed=0, eval_split="test")
    # The optional warm start stage. truncate: cut examples longer than max_len instead of leaving them out;
    # mistake ("" | early_stop | no_search | verbose_answer): a base model's error that replaces a question's
    # ideal trace in mistake_share of its draws (data/sft.py); questions: the world's first N training
    # questions are SFT's, the rest RL's (0: both use all).
    c.sft = dict(steps=0, lr=1e-3, batch_size=32, warmup=20, max_len=512, truncate=False)
    c.sft.update(dict(mistake="", mistake_share=0.0, questions=0))
    c.sft.pad_multiple = 0  # > 0: batches padded to their longest example rounded up to this, not max_len
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.distributed = dict(coordinator="", num_processes=0, process_id=-1)  # empty: from the environment
    c.lock()
    return c
