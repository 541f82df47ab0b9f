"""The embedded default: a search agent trained end to end on a CPU in minutes.

A synthetic multi-hop world (fictional facts: no model can know them), BM25 over its passages, a word-level
tokenizer, a ~0.95M-parameter Qwen2 (4 layers x 128); an SFT warm start on templated trajectories, then GRPO.
The SFT start is a base model with a format error: in half of its traces the answer tag holds a sentence
("The answer is X."), which exact match scores 0; GRPO's EM reward has to teach it to answer with the
entity alone. Held-out: the 100 dev + test questions, greedy, at GRPO's first, middle and last step
(bench/RESULTS.md: Tiny world).

    python launch/train.py --config configs/tiny_cpu.py
"""

from configs import base


def get_config():
    c = base.get_config()
    c.seed = 0
    c.world.update(dict(size="tiny", seed=0, eval_split="dev+test"))  # 100 held-out questions
    c.model.update(
        dict(
            preset="",
            dtype="float32",
            param_dtype="float32",
            remat=False,
            # dense attention: chunking's padding and rematerialised chunks made an SFT step 1.7-1.8x slower
            # at 768-1,152 tokens (8 rows, one process, AMD EPYC); a 40-row update of 1,152 tokens holds
            # 6.5 GiB of temporaries this way, 3.1 chunked (compile().memory_analysis())
            attention_chunk=0,
            logprob_chunk=512,
            vocab_size=-1,
            hidden_size=128,
            intermediate_size=384,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=4,
            tie_word_embeddings=True,
        )
    )
    c.retriever.update(dict(kind="bm25", url="", encoder=""))
    c.data.update(dict(batch_size=8, group_size=5, eval_examples=100))
    c.rollout.update(
        dict(
            max_turns=4,
            retrieval_k=1,
            initial_k=1,
            max_segment_tokens=48,
            max_obs_tokens=96,
            cache_len=512,
            temperature=1.0,
            eval_retrieval_k=1,  # as in training and in the SFT traces
            eval_temperature=0.0,  # held-out figures are greedy
        )
    )
    # SFT on every training question's ideal trace, with a verbose answer in half of the draws; max_len holds
    # the longest trace of search_r1 / eka / rsearch (397 / 455 / 438 tokens), so none is cut
    c.sft.update(dict(steps=800, lr=3e-3, batch_size=8, warmup=20, max_len=512, truncate=True))
    c.sft.update(dict(mistake="verbose_answer", mistake_share=0.5, pad_multiple=128))
    # update batches padded to the longest trajectory (rounded up to 128), not to cache_len: ~2x faster here
    c.algo.update(dict(kl_coef=0.001, mini_batches=1, micro_batches=1, pad_multiple=128))
    c.optim.update(dict(lr=2e-4, warmup_ratio=0.0))
    c.reward.terms = (("em", 1.0),)
    c.judge.kind = "world"  # the rule-based fabrication judge (world.oracle.WorldChatModel) at evaluation
    c.total_steps = 40
    c.eval_every = 20
    c.save_every = 20
    c.mesh.update(dict(data=1, fsdp=1, tensor=1))
    return c
