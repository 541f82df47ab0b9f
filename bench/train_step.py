"""GRPO update throughput: jaxsearch's jitted train step vs a PyTorch reference, and achieved FLOP/s.

  python bench/train_step.py [--size S M] [--reps 5]

The workload of ../shared/anchors/torch_grpo_step.py: batch 16 x 256 tokens (64 prompt tokens with loss
mask 0, 192 response tokens), random ids and per-sequence advantages; one step = forward + per-token
log-probs + clipped surrogate (eps 0.2) + 0.001 * k3 KL to reference log-probs (computed once, before
timing) + token-mean + backward + global-norm clip 1.0 + AdamW (lr 1e-6). The reference is transformers'
Qwen2 with the same loss in torch, same weights, same process (jax timed first: torch's OpenMP threads
spin after each call). FLOPs = 6 * params * tokens (the anchors' count, attention excluded), set against
each framework's float32 matmul peak (2048^3), measured in this run too.
"""

import argparse
import json
import tempfile
import time


import jax
import jax.numpy as jnp
import numpy as np
import torch

from common import SIZES, hf_model, median_time
from jaxsearch import parallel
from jaxsearch.models import hf_io
from jaxsearch.rl import train_step as ts

BATCH, SEQ, PROMPT = 16, 256, 64
EPS, BETA, LR, CLIP = 0.2, 0.001, 1e-6, 1.0


def flops_per_step(config, tokens: int) -> float:
    e, f, h, k, d, v = (
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.vocab_size,
    )
    per_layer = (e * h * d + h * d) + 2 * (e * k * d + k * d) + h * d * e + 3 * e * f + 2 * e
    return 6 * (config.num_hidden_layers * per_layer + e) * tokens + 6 * e * v * tokens


def matmul_peaks(n: int = 2048) -> dict:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    ja = jnp.asarray(a)
    dot = jax.jit(jnp.dot)
    t_jax = median_time(lambda: dot(ja, ja).block_until_ready(), 5)
    ta = torch.from_numpy(a)
    t_torch = median_time(lambda: torch.mm(ta, ta), 5)
    return {"jax": 2 * n**3 / t_jax / 1e9, "torch": 2 * n**3 / t_torch / 1e9}


def workload(size: str, rng: np.random.Generator):
    """(transformers' model of `size`, our config and params of the same weights, one update batch): BATCH x SEQ
    random ids, PROMPT prompt tokens outside the loss, per-sequence advantages, the reference log-probs (also
    the old ones) of the initial policy."""
    model = hf_model(size)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        config, params = hf_io.load_hf(d)
    tokens = rng.integers(1, config.vocab_size, (BATCH, SEQ)).astype(np.int32)
    adv = rng.standard_normal(BATCH).astype(np.float32)
    mask = np.zeros((BATCH, SEQ), np.int32)
    mask[:, PROMPT:] = 1
    attn = np.ones((BATCH, SEQ), np.int32)
    ref_lp = np.asarray(ts.sequence_logprobs(config, params, tokens, attn))
    batch = dict(
        tokens=tokens,
        attention_mask=attn,
        loss_mask=mask,
        advantages=adv,
        old_logprobs=ref_lp,
        ref_logprobs=ref_lp,
    )
    return model, config, params, batch


def update_fn(config, params, batch: dict, mesh, frozen=None):
    """One timed call of the trainer's jitted update on `batch`: of `params`, or (LoRA) of adapters `params`
    over the base `frozen`. The state is donated to it."""
    loss_cfg = ts.LossConfig(clip_eps=EPS, kl_coef=BETA, kl_kind="low_var_kl")
    optimizer = ts.make_optimizer(LR, total_steps=100, weight_decay=0.01, grad_clip=CLIP)
    state = {"s": ts.init_state(params, optimizer, mesh)}
    update = ts.make_train_step(
        ts.policy_loss_fn(config, loss_cfg), "token-mean", 1, optimizer, mesh, state["s"], batch, frozen=frozen
    )

    def call():
        state["s"], m = update(state["s"], batch)
        jax.block_until_ready(m["loss"])

    return call


def torch_step(model, batch: dict):
    """`torch_step_fn` of `model` on our update batch (the same numbers)."""
    return torch_step_fn(
        model,
        torch.from_numpy(batch["ref_logprobs"][:, 1:]),
        torch.from_numpy(batch["tokens"].astype(np.int64)),
        torch.from_numpy(batch["advantages"])[:, None],
        torch.from_numpy(batch["loss_mask"][:, 1:].astype(np.float32)),
    )


def torch_step_fn(model, ref_lp, ids, adv, mask):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(lp - lp.detach())
        pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - EPS, 1 + EPS))
        diff = ref_lp - lp
        loss = ((pg + BETA * (torch.exp(diff) - diff - 1)) * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", nargs="+", default=["S", "M"], choices=sorted(SIZES))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(
        f"jax {jax.__version__} {jax.devices()[0].platform}, torch {torch.__version__} "
        f"threads={torch.get_num_threads()}",
        flush=True,
    )
    peaks = matmul_peaks()
    print(
        json.dumps({"bench": "matmul_peak_gflops", **{k: round(v, 1) for k, v in peaks.items()}}), flush=True
    )
    rng = np.random.default_rng(4321)
    for size in args.size:
        model, config, params, batch = workload(size, rng)
        # jaxsearch: the trainer's update function on one device
        mesh = parallel.make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
        ours = update_fn(config, params, batch, mesh)

        t0 = time.perf_counter()
        ours()
        compile_s = time.perf_counter() - t0
        t_ours = median_time(ours, args.reps)

        # the torch reference (its reference log-probs are the same numbers)
        model.train()
        t_torch = median_time(torch_step(model, batch), args.reps)

        n = BATCH * SEQ
        flops = flops_per_step(config, n)
        print(
            json.dumps(
                {
                    "bench": "grpo_step",
                    "size": size,
                    "params_M": round(config.num_params() / 1e6, 1),
                    "tokens": n,
                    "jaxsearch_tok_s": round(n / t_ours),
                    "torch_tok_s": round(n / t_torch),
                    "ratio": round(t_torch / t_ours, 2),
                    "jaxsearch_gflops": round(flops / t_ours / 1e9, 1),
                    "jaxsearch_frac_of_jax_peak": round(flops / t_ours / 1e9 / peaks["jax"], 2),
                    "torch_gflops": round(flops / t_torch / 1e9, 1),
                    "torch_frac_of_torch_peak": round(flops / t_torch / 1e9 / peaks["torch"], 2),
                    "jaxsearch_compile_s": round(compile_s - t_ours, 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
