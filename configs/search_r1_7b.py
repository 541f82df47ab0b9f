"""Search-R1 (GRPO) on Qwen2.5-7B: NQ + HotpotQA training, e5 retrieval over wiki-18 from a retrieval server.

Published setting (Search-R1's train_grpo.sh): lr 1e-6, warmup ratio 0.285, 1005 steps, 512 prompts x 5
samples, KL 0.001 (low_var_kl), clip 0.2, 4 turns, top-3 passages, 500-token responses and observations.
Target: one v5p-64 pod slice (32 chips) or 8 x H100 80GB: `python launch/plan.py --backend tpu --config ...`
(README, "Memory plans").

    python launch/serve_retriever.py --corpus wiki-18.jsonl --retriever dense --index indexes/e5_flat --port 8000
    python launch/train.py --config configs/search_r1_7b.py --config.model.hf_path=/ckpt/Qwen2.5-7B
"""

from configs import base


def get_config():
    c = base.get_config()
    c.model.hf_path = "checkpoints/Qwen2.5-7B"
    c.model.scan_layers = True  # each layer's fsdp-gathered weights live for one scan iteration
    # base's 256-row mini-batches in 4 micro-batches of 64 rows (Search-R1's ppo_micro_batch_size): divisible
    # by 8, 16, 32 and 64 data-parallel devices
    # the rollout decodes 512 of the 2560 rows at a time: a 120 GB KV cache in all instead of 601 GB
    c.rollout.micro_batch = 512
    # decode from a replicated bf16 copy (15.2 GB) instead of all-gathering the fsdp-sharded weights at every
    # token: bench/RESULTS.md "Memory plans" (fits every documented 7B target)
    c.rollout.decode_layout = "replicated"
    c.protocol.name = "search_r1"
    c.data.train = "data/nq_hotpotqa_train/train.parquet"
    c.data.eval = {
        name: f"data/{name}/test.jsonl"
        for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
    }
    return c
