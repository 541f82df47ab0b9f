"""Base config: Search-R1's published GRPO setting (Qwen2.5-7B, NQ + HotpotQA, e5 retrieval).

Sources, cited beside each value: Search-R1's `scripts/nq_hotpotqa/v0.2/train_grpo.sh` (the script of its
published GRPO runs) and the defaults of its veRL fork, `verl/trainer/config/ppo_trainer.yaml`, for what the
script leaves unset. tests/test_configs.py checks every one of them.

Every other config starts from `get_config()` here and overrides what differs. Keys are locked: a typo in
`--config.x=y` is an error that names the key.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.total_steps = 1005  # train_grpo.sh: trainer.total_training_steps=1005
    # > 0: total_steps = total_epochs x (train questions // data.batch_size), as veRL counts them (ray_trainer.py:
    # len(train_dataloader) x trainer.total_epochs, the loader dropping the last partial batch)
    c.total_epochs = 0
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
        # prefill / training attention: reference | xla | cudnn | auto (cuDNN flash on a GPU for bf16 / fp16,
        # reference elsewhere; models/attention.py)
        attention_impl="auto",
        scan_layers=False,  # training passes scan the layers (the 7B/14B configs: bounds fsdp gathers)
        vocab_size=0,
        hidden_size=0,
        intermediate_size=0,
        num_attention_heads=0,
        num_key_value_heads=0,
        num_hidden_layers=0,
        tie_word_embeddings=False,
        family="qwen2",  # explicit sizes: qwen2 | qwen3 (a preset or checkpoint names its own)
        head_dim=0,  # explicit sizes: 0 = hidden_size // num_attention_heads
    )
    c.tokenizer = dict(kind="qwen", path="")  # kind: qwen | word (path: a WordTokenizer json)

    c.protocol = dict(name="search_r1", tags="search_r1")  # tags: EKA's tag set (search_r1 | graph_r1)
    c.protocol.data_prompt = True  # search_r1: prompt with a dataset row's own `prompt` (Search-R1 parquet)
    # In-loop retriever; kind: bm25 | dense | remote | hypergraph (index: a launch/build_hypergraph.py dir; with a
    # synthetic world and no index, the world's own, built with the rule extractor). EKA's P0 may come from another one (noisy-P0 ablation).
    # split_across_hosts: each process of a multi-host run searches 1/N of the queries and the results are
    # all-gathered (retrieval/host_split.py); off, every process searches the whole batch itself
    c.retriever = dict(
        kind="remote",
        corpus="",
        index="",
        url="http://127.0.0.1:8000/retrieve",
        encoder="e5",
        split_across_hosts=False,
        # remote: seconds a search call may take in all / one attempt of it (retrieval/client.py); past the
        # deadline training stops with an error, the checkpoints already written kept
        deadline_s=30.0,
        attempt_timeout_s=15.0,
        # SOAR's "w/ disturb" training (seed 001, Tables 5-6): this share of each search's passages replaced by
        # passages for another training question, in training rollouts only (retrieval/disturb.py); 0: off
        disturb_rate=0.0,
        disturb_seed=0,
    )
    c.initial_retriever = dict(kind="", corpus="", index="", url="", encoder="")  # kind "": same as above

    c.data = dict(
        train="data/nq_hotpotqa_train/train.parquet",
        eval=ml_collections.ConfigDict({"nq": "data/nq/test.jsonl"}),  # name -> FlashRAG JSONL / parquet
        # per dataset and evaluation; 0: the whole test set, as Search-R1 (train_grpo.sh data.val_data_num=null)
        # and SOAR (Table 8: the full test sets, e.g. PopQA 14,267) evaluate. A smaller number subsamples
        # (eval_sample) for quicker in-training evaluation
        eval_examples=0,
        eval_sample="first",  # which eval_examples: "first" in file order, or "random" (drawn with eval_seed)
        eval_seed=0,
        batch_size=512,  # questions per step (train_grpo.sh: data.train_batch_size=512)
        group_size=5,  # GRPO samples per question (train_grpo.sh: actor_rollout_ref.rollout.n_agent=5)
        shuffle=True,
        # eval dataset name -> /retrieve URL of its own corpus ("*": the others); empty: `retriever` for all
        eval_retrievers=ml_collections.ConfigDict(),
    )
    c.rollout = dict(
        max_turns=4,  # train_grpo.sh: max_turns=4
        retrieval_k=3,  # train_grpo.sh: retriever.topk=3
        initial_k=3,
        internal_k=3,
        max_segment_tokens=500,  # train_grpo.sh: data.max_response_length=500
        max_obs_tokens=500,  # train_grpo.sh: data.max_obs_length=500
        cache_len=4096,  # train_grpo.sh: data.max_prompt_length=4096 (prompt + all turns)
        temperature=1.0,  # train_grpo.sh: actor_rollout_ref.rollout.temperature=1
        # ppo_trainer.yaml: rollout.top_p=0.95, top_k=-1. vLLM's rollout (vllm_rollout.py) passes every
        # rollout key that SamplingParams has, so training samples at top_p 0.95; validation is greedy
        # (ray_trainer.py _validate: do_sample=False -> temperature 0, top_p 1)
        top_p=0.95,
        top_k=0,
        # Search-R1's validation (ray_trainer.py _validate) asks for greedy decoding (do_sample=False), but its
        # agent loop rebuilds each turn's batch without that meta_info (generation.py run_llm_loop:
        # DataProto.from_dict), so vLLM samples with the rollout's temperature 1 and top_p 0.95: its published
        # figures are sampled. Ours match that; set eval_temperature=0 for greedy evaluation.
        eval_temperature=1.0,
        eval_top_p=0.95,
        eval_retrieval_k=3,  # train_grpo.sh: retriever.topk=3 in validation too
        # the evaluation's turn cap and tokens per decode call (R-Search's evaluation loop); 0: as in training
        eval_max_turns=0,
        eval_max_segment_tokens=0,
        micro_batch=0,  # rows per sampler call, or decode slots (0: the whole batch)
        # lockstep: each turn decodes a segment for every row, then acts for every row (a turn waits for its
        # slowest row); slots: rows decode in `micro_batch` slots, steps_per_call tokens per device call, and
        # are acted on as soon as they stop, while the other rows decode (agent/slots.py)
        scheduler="slots",
        steps_per_call=16,
        # the params the sampler reads (jaxsearch/parallel.py): train = the trainer's fsdp-sharded params
        # (every decode step all-gathers the weights); replicated / tensor = a copy in the compute dtype made
        # once per step, read from local HBM (launch/plan.py counts it in the fit verdict)
        decode_layout="train",
    )
    # (name, weight): names of jaxsearch/scoring/rewards.py's registry, plus "evidence" (R-Search's evidence
    # reward, needs evidence_model) and "grounded" (SOAR's judge: 1 when grounded, needs judge)
    c.reward = dict(terms=(("em", 1.0),))  # Search-R1's reward: exact match of the last <answer>
    # Chat models behind SOAR's fabrication judge and R-Search's evidence answerer; kind "" = none, openai
    # (an OpenAI-compatible server such as vLLM: base_url, model) or local (a checkpoint dir: path, tokenizer).
    chat = dict(kind="", base_url="", model="", path="", tokenizer="qwen", cache_len=4096, max_new_tokens=512)
    chat.update(temperature=0.0, top_p=1.0)
    c.judge = dict(chat)
    c.evidence_model = dict(chat)
    c.algo = dict(
        advantage="grpo",  # grpo | dr_grpo | gae (PPO with a critic)
        policy_loss="ppo",
        clip_eps=0.2,  # ppo_trainer.yaml: actor.clip_ratio=0.2
        agg_mode="token-mean",
        kl_coef=0.001,  # train_grpo.sh: actor.kl_loss_coef=0.001
        kl_kind="low_var_kl",  # KL to the reference as a loss (train_grpo.sh: use_kl_loss, low_var_kl)
        kl_in_reward=0.0,  # > 0: KL as a per-token reward penalty instead (PPO)
        entropy_coef=0.001,  # ppo_trainer.yaml: actor.entropy_coeff=0.001 (train_grpo.sh leaves it)
        ppo_epochs=1,  # ppo_trainer.yaml: actor.ppo_epochs=1
        # train_grpo.sh: ppo_mini_batch_size=256 trajectories; fsdp_workers.py multiplies it by rollout.n (1),
        # not by n_agent (5), so a step's 512 x 5 = 2560 trajectories make 10 updates
        mini_batches=10,
        micro_batches=4,  # train_grpo.sh: ppo_micro_batch_size=64 -> 256 / 64 = 4 accumulation steps
        pad_multiple=0,  # > 0: update batches padded to a multiple of this, not to cache_len (a compile each)
        gamma=1.0,
        lam=1.0,
        # PPO: the tokens GAE runs over, whitens over and trains the critic on. "response": every response token,
        # retrieved ones included (Search-R1's and EKA's veRL: core_algos.py compute_gae_advantage_return over
        # ray_trainer.py compute_advantage's response_mask = attention_mask; dp_critic.py eos_mask likewise);
        # "policy": only the policy's tokens, the recursion passing over the rest (later veRL's multi-turn rule)
        gae_tokens="response",
        # DAPO / Dr.GRPO / GSPO (jaxsearch/config.py AlgoConfig; configs/tiny_cpu_{dapo,drgrpo,gspo}.py);
        # 0 = unset: clip bounds clip_eps, norm and L_max the most policy tokens per row, no overlong shaping
        clip_eps_low=0.0,
        clip_eps_high=0.0,
        loss_norm_tokens=0,
        dynamic_sampling=False,
        max_draws=10,
        overlong_buffer=0,
        overlong_max_tokens=0,
    )
    # train_grpo.sh: actor.optim.lr=1e-6, lr_warmup_steps_ratio=0.285 (warmup int(0.285 * 1005) = 286 training
    # steps: veRL's scheduler steps once per training step); ppo_trainer.yaml: warmup_style constant,
    # grad_clip 1.0; fsdp_workers.py: AdamW betas (0.9, 0.999), weight_decay 1e-2
    c.optim = dict(lr=1e-6, warmup_ratio=0.285, schedule="constant", weight_decay=0.01, grad_clip=1.0)
    c.critic = dict(lr=1e-5, warmup_ratio=0.015, clip_eps=0.5)  # PPO only
    # A synthetic world under WORKDIR/world (size tiny | small; "" = none): it then provides the data,
    # the retriever's corpus and a word-level tokenizer (model.vocab_size = -1 takes its size).
    c.world = dict(size="", seed=0, eval_split="test")
    # The optional warm start stage. truncate: cut examples longer than max_len instead of leaving them out;
    # mistake ("" | early_stop | no_search | verbose_answer): a base model's error that replaces a question's
    # ideal trace in mistake_share of its draws (agent/sft_traces.py); questions: the world's first N training
    # questions are SFT's, the rest RL's (0: both use all).
    c.sft = dict(steps=0, lr=1e-3, batch_size=32, warmup=20, max_len=512, truncate=False)
    c.sft.update(dict(mistake="", mistake_share=0.0, questions=0))
    c.sft.save_every = 100  # a stopped SFT stage resumes from its last checkpoint (WORKDIR/sft/checkpoints)
    c.sft.pad_multiple = 0  # > 0: batches padded to their longest example rounded up to this, not max_len
    c.sft.use_p0 = (
        False  # EKA: ideal traces read from P0 what it holds instead of searching (agent/sft_traces.p0_trace)
    )
    # LoRA (rank 0: off, every parameter trained): the base frozen and shared with the reference, adapters on
    # target_modules (transformers' names, comma-separated, or "all-linear") trained and checkpointed, saved in
    # peft's format at the end (WORKDIR/grpo/adapter); the sampler reads base + adapters merged once per step
    c.lora = dict(rank=0, alpha=32.0, dropout=0.0, target_modules="all-linear", rslora=False)
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.distributed = dict(coordinator="", num_processes=0, process_id=-1)  # empty: from the environment
    c.lock()
    return c
