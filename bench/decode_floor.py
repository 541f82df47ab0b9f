"""How close a decode step is to the CPU's floor: the sampler's decode step at bench/rollout.py's workload
beside loops of only its weight matmuls (the same weights and shapes, no sampling) with attention over a cache
of 0, 64, 128 or 192 slots, and the rate this CPU streams a weight through a 16-row matmul, by its size.

  python bench/decode_floor.py [--size S] [--slots 0 64 128 192]   # both cores
  taskset -c 0 python bench/decode_floor.py                         # one core

Batch 16, 128 greedy steps over a 192-slot cache. A step reads every weight once (3.75 MiB of layers and
4 MiB of head at S, fp32) and the whole KV cache (6 MiB at S); the loop without a cache shows what the weights
alone cost on this machine, the loops with one what reading and writing a cache of that size adds (the loops
timed in turn, so a drifting machine slows them alike), and the rest of the step (sampling, norms) is the
difference to the decode step.
"""

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import SIZES, alternated, median_time
from rollout import BATCH, NEW, PROMPT, greedy_sampler

from jaxsearch.models import attention, qwen2


def per_iteration_us(loop, args, iters: int, reps: int) -> float:
    return 1e6 * median_time(lambda: jax.block_until_ready(loop(*args)), reps) / iters


def weight_matmuls(config, params):
    """The decode step's weight matrices as the step multiplies them: 2-D [in, out] each."""
    e = config.hidden_size
    layers = [params[f"layers_{i}"] for i in range(config.num_hidden_layers)]
    return {
        "qkv": [p["attn"]["qkv_kernel"].reshape(e, -1) for p in layers],
        "o": [p["attn"]["o_kernel"].reshape(-1, e) for p in layers],
        "gate_up": [p["mlp"]["gate_up_kernel"].reshape(e, -1) for p in layers],
        "down": [p["mlp"]["down_kernel"] for p in layers],
        "head": params["embedding"].T,
    }


def step_loops(config, weights, slots: list[int], iters: int) -> dict:
    """Loops of the step's weight matmuls (`weight_matmuls`), one per cache size in `slots`: an iteration
    takes x [B, E] through every layer's qkv, o, gate/up and down matmuls and the head; with n > 0 slots
    each layer also writes a key and value into its cache (keys [B, K, D, n], values [B, K, n, D], as
    `qwen2.KVCache`) and attends over all n slots with the sampler's kernel (`attention.attend_decode_cpu`).
    Slots 0: the matmuls alone. Returns {n: (jitted loop, its arguments)}."""
    e, f = config.hidden_size, config.intermediate_size
    h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    layers = config.num_hidden_layers

    def make(n):
        @jax.jit
        def loop(x, w, k_cache, v_cache):
            def body(i, carry):
                x, ks, vs = carry
                ks, vs = list(ks), list(vs)
                for j, (qkv, o, gu, down) in enumerate(zip(w["qkv"], w["o"], w["gate_up"], w["down"])):
                    y = x @ qkv
                    if n:  # this layer's q [B, 1, H, D], k and v [B, K, D] from the fused product
                        kv = y[:, h * d :].reshape(BATCH, 2, kvh, d)
                        ks[j] = jax.lax.dynamic_update_slice_in_dim(
                            ks[j], kv[:, 0, :, :, None], i % n, axis=3
                        )
                        vs[j] = jax.lax.dynamic_update_slice_in_dim(vs[j], kv[:, 1, :, None], i % n, axis=2)
                        mask = jnp.ones((BATCH, 1, n), bool)
                        y = attention.attend_decode_cpu(
                            y[:, None, : h * d].reshape(BATCH, 1, h, d), ks[j], vs[j], mask
                        )
                    x = x + 0.01 * (y.reshape(BATCH, -1)[:, : o.shape[0]] @ o)
                    g = x @ gu
                    x = x + 0.01 * ((jax.nn.silu(g[:, :f]) * g[:, f:]) @ down)
                return x + 1e-6 * jnp.max(x @ w["head"], axis=-1, keepdims=True), tuple(ks), tuple(vs)

            return jax.lax.fori_loop(0, iters, body, (x, k_cache, v_cache))[0]

        k = tuple(jnp.full((BATCH, kvh, d, n), 0.01, jnp.float32) for _ in range(layers))
        v = tuple(jnp.full((BATCH, kvh, n, d), 0.01, jnp.float32) for _ in range(layers))
        return loop, (jnp.ones((BATCH, e), jnp.float32), weights, k, v)

    return {n: make(n) for n in slots}


def alternated_us(loops: dict, iters: int, reps: int) -> dict:
    """Median microseconds an iteration of each loop ({name: (loop, args)}), the loops timed in turn
    (`common.alternated`)."""

    def timed(loop, args) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(loop(*args))
        return time.perf_counter() - t0

    times = alternated({name: functools.partial(timed, *loop) for name, loop in loops.items()}, reps)
    return {name: round(1e6 * statistics.median(t) / iters, 1) for name, t in times.items()}


def stream_rate_gb_s(megabytes: float, iters: int, reps: int) -> float:
    """GB/s of a [16, 1024] x [1024, N] matmul whose fp32 weight is `megabytes` MB, in a loop."""
    n = int(megabytes * 2**20 / 4 / 1024)
    w = jnp.full((1024, n), 1e-3, jnp.float32)

    @jax.jit
    def loop(x, w):
        return jax.lax.fori_loop(0, iters, lambda _, x: x + 1e-6 * jnp.sum(x @ w, axis=-1, keepdims=True), x)

    us = per_iteration_us(loop, (jnp.ones((BATCH, 1024), jnp.float32), w), iters, reps)
    return megabytes * 2**20 / us / 1e3


def decode_step_us(config, params, reps: int) -> float:
    smp = greedy_sampler(config)
    prompts = np.random.default_rng(1234).integers(1, config.vocab_size, (BATCH, PROMPT)).tolist()
    start = smp.start(params, prompts, 0)

    def decode():
        state = jax.tree.map(lambda x: x.copy(), start)  # the decode call donates its state
        return smp.decode(params, state, NEW)[0].tokens

    return 1e6 * median_time(lambda: jax.block_until_ready(decode()), reps) / NEW


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="S", choices=sorted(SIZES))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--slots", nargs="+", type=int, default=[0, 64, 128, 192], help="cache sizes")
    ap.add_argument("--stream-mb", nargs="+", type=float, default=[2, 4, 8, 16], help="weight sizes, MB")
    args = ap.parse_args()
    config = qwen2.Qwen2Config(**SIZES[args.size], tie_word_embeddings=True, attention_chunk=0)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    weights = weight_matmuls(config, params)
    mib = lambda tree: sum(w.size * 4 for w in jax.tree.leaves(tree)) / 2**20  # noqa: E731  fp32
    kv = config.num_hidden_layers * 2 * BATCH * config.num_key_value_heads * config.head_dim * (PROMPT + NEW)
    print(
        json.dumps(
            {
                "bench": "decode_floor",
                "size": args.size,
                "device": jax.devices()[0].device_kind,
                "cpus": len(jax.devices()),
                "layer_weights_mb": round(mib({k: v for k, v in weights.items() if k != "head"}), 2),
                "head_mb": round(mib(weights["head"]), 2),
                "kv_cache_mb": round(kv * 4 / 2**20, 2),
                "decode_step_us": round(decode_step_us(config, params, args.reps), 1),
                # us an iteration by cache slots (0: the weight matmuls alone)
                "step_loop_us": alternated_us(step_loops(config, weights, args.slots, NEW), NEW, args.reps),
                "stream_gb_s": {mb: round(stream_rate_gb_s(mb, 64, args.reps), 1) for mb in args.stream_mb},
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
