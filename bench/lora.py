"""LoRA: the GRPO update of the adapters over a frozen base against the full-parameter update, peft's LoRA step
in torch as the reference, and the sampler on merged weights against the same sampler on the plain weights.

  python bench/lora.py [--size S M] [--rank 16] [--reps 5]

Update: bench/train_step.py's workload (16 x 256 tokens, clipped surrogate + 0.001 k3 KL, clip 1.0, AdamW);
LoRA rank `--rank`, alpha 2 x rank, on all seven projections; jaxsearch's jitted update (`frozen=` base) vs its
full-parameter update, and transformers + peft (`get_peft_model`, the same targets) with the same loss in torch,
same weights, same process. Decode: bench/rollout.py's workload (batch 16, 64-token prompts, 128 greedy tokens)
on `lora.merge(base, adapters)` vs on the base itself (the same shapes: the same program), plus the merge's own
time (once per RL step). One JSON line per size and part.
"""

import argparse
import json
import time

import jax
import numpy as np
import torch

from common import SIZES, median_time
from rollout import NEW, PROMPT, greedy_sampler
from train_step import BATCH, SEQ, torch_step, update_fn, workload

from jaxsearch import parallel
from jaxsearch.models import lora


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", nargs="+", default=["S", "M"], choices=sorted(SIZES))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import peft

    print(f"jax {jax.__version__}, torch {torch.__version__} threads={torch.get_num_threads()}, peft {peft.__version__}")
    rng = np.random.default_rng(4321)
    mesh = parallel.make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    spec = lora.LoraSpec(rank=args.rank, alpha=2.0 * args.rank)
    for size in args.size:
        model, config, params, batch = workload(size, rng)

        # jaxsearch: LoRA over the frozen base, then the full-parameter update (its state is donated: a copy)
        adapters = lora.init_adapters(config, spec, jax.random.PRNGKey(0))
        copy = lambda tree: jax.tree_util.tree_map(lambda x: x.copy(), tree)
        lora_call = update_fn(lora.lora_config(config, spec), copy(adapters), batch, mesh, frozen=params)
        full_call = update_fn(config, copy(params), batch, mesh)
        for call in (lora_call, full_call):
            call()  # compile
        t_lora, t_full = median_time(lora_call, args.reps), median_time(full_call, args.reps)

        # peft's LoRA step in torch, the same targets, rank and alpha
        peft_model = peft.get_peft_model(
            model,
            peft.LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets), lora_dropout=0.0),
        )
        peft_model.train()
        t_peft = median_time(torch_step(peft_model, batch), args.reps)
        n = BATCH * SEQ
        print(json.dumps({
            "bench": "lora_grpo_step", "size": size, "rank": spec.rank, "trained_M": round(lora.count(adapters) / 1e6, 3),
            "params_M": round(config.num_params() / 1e6, 1), "lora_tok_s": round(n / t_lora),
            "full_tok_s": round(n / t_full), "peft_tok_s": round(n / t_peft),
            "lora_vs_full": round(t_full / t_lora, 2), "lora_vs_peft": round(t_peft / t_lora, 2),
        }), flush=True)  # fmt: skip

        # decode on merged weights: one merge per RL step, then the plain sampler
        nonzero = jax.tree_util.tree_map(lambda x: x + 0.01, adapters)  # B != 0: a real merge
        merge = jax.jit(lambda p, a: lora.merge(config, spec, p, a))
        merged = jax.block_until_ready(merge(params, nonzero))
        t_merge = median_time(lambda: jax.block_until_ready(merge(params, nonzero)), args.reps)
        smp = greedy_sampler(config)
        rows = np.random.default_rng(1234).integers(1, config.vocab_size, (16, PROMPT)).tolist()

        def decode(p):
            def call():
                seg, _ = smp.decode(p, smp.start(p, rows, 0), NEW)
                return np.asarray(seg.tokens)

            return call

        plain_call, merged_call = decode(params), decode(merged)
        plain_call(), merged_call()  # compile (one program: the same shapes)
        times = {"plain": [], "merged": []}
        for _ in range(args.reps):  # in alternation: the machine's drift hits both
            for name, call in (("plain", plain_call), ("merged", merged_call)):
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
        t_plain, t_merged = (float(np.median(times[k])) for k in ("plain", "merged"))
        print(json.dumps({
            "bench": "lora_decode", "size": size, "batch": 16, "new_tokens": NEW,
            "plain_tok_s": round(16 * NEW / t_plain), "merged_tok_s": round(16 * NEW / t_merged),
            "merged_vs_plain": round(t_plain / t_merged, 2), "merge_ms": round(t_merge * 1e3, 2),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
