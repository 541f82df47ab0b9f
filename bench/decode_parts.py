"""What each part of a decode step costs where it runs: the sampler's decode call at bench/rollout.py's
workload, compiled whole and with one part taken out, timed in alternation in one process.

  python bench/decode_parts.py [--size S] [--reps 11]

Batch 16, 64-token random prompts, 128 greedy steps over a 192-slot cache. Variants (their tokens are wrong
on purpose; only their time counts):
  full             the decode call as the sampler runs it
  no attention     each layer's attention returns its queries (the cache is still written)
  cache read only  each layer's attention only sums its keys and values (every cache byte read, no dots)
  no LM head       the logits are the final hidden state tiled to the vocabulary (no [E, V] matmul)
  no sampling      the next token is the argmax of the first 8 logits; no log-prob or entropy
A part's cost is the full step's time minus the step without it: what it adds with the rest of the step
around it (the weights and the cache it evicts), which on a small-cache machine is more than its time in a
loop of its own, also printed ("alone": the 4 layers' cache writes and attention over the same shapes, and the
LM head with greedy sampling's stats, each in a loop of 128 steps; bench/RESULTS.md, issue 41). Each variant
is compiled ahead of time, so its stub stays in.
"""

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import SIZES, alternated
from decode_floor import per_iteration_us
from rollout import BATCH, NEW, PROMPT, greedy_sampler

from jaxsearch.agent import sampler as sampler_lib
from jaxsearch.models import attention, qwen2

_FULL = {
    "attend": attention.attend_decode_cpu,
    "logits": qwen2.Qwen2.logits,
    "sample": sampler_lib.sample_tokens,
}


def _no_attention(q, k, v, mask):
    return q


def _cache_read_only(q, k, v, mask):
    total = jnp.sum(k, axis=(1, 2, 3)) + jnp.sum(v, axis=(1, 2, 3))  # [B]
    return q + 1e-9 * total[:, None, None, None].astype(q.dtype)


def _no_lm_head(self, hidden):
    return jnp.tile(hidden.astype(jnp.float32), (1, self.config.vocab_size // hidden.shape[-1] + 1))[
        :, : self.config.vocab_size
    ]


def _no_sampling(logits, keys, counters, sampling, rows=None):
    tokens = jnp.argmax(logits[:, :8], axis=-1).astype(jnp.int32)
    zeros = jnp.zeros(tokens.shape, jnp.float32)
    return tokens, zeros, zeros


VARIANTS = {
    "full": {},
    "no attention": {"attend": _no_attention},
    "cache read only": {"attend": _cache_read_only},
    "no LM head": {"logits": _no_lm_head},
    "no sampling": {"sample": _no_sampling},
}


def _patch(parts: dict):
    chosen = {**_FULL, **parts}
    attention.attend_decode_cpu = chosen["attend"]
    qwen2.Qwen2.logits = chosen["logits"]
    sampler_lib.sample_tokens = chosen["sample"]


def compiled_decode(config, params, parts: dict):
    """(decode call compiled with `parts` stubbed in, its prefilled start state)."""
    smp = greedy_sampler(config)
    prompts = np.random.default_rng(1234).integers(1, config.vocab_size, (BATCH, PROMPT)).tolist()
    start = smp.start(params, prompts, 0)
    budget = np.full((BATCH,), NEW, np.int32)
    _patch(parts)
    jax.clear_caches()  # trace anew with the stubs (jax caches traces per function)
    try:
        fn = jax.jit(sampler_lib.decode_segment, static_argnums=(0, 5, 6), donate_argnums=(2,))
        compiled = fn.lower(config, params, start, budget, smp.table, smp.sampling, NEW).compile()
    finally:
        _patch({})
    return (lambda state: compiled(params, state, budget, smp.table)), start


def alone_us(config, params, reps: int) -> dict:
    """us per step of two parts in loops of their own (every array an argument, nothing else streaming)."""
    b, s = BATCH, PROMPT + NEW
    kvh, d, h = config.num_key_value_heads, config.head_dim, config.num_attention_heads
    rng = np.random.default_rng(0)
    caches = tuple(
        (
            jnp.asarray(rng.standard_normal((b, kvh, d, s)), jnp.float32),
            jnp.asarray(rng.standard_normal((b, kvh, s, d)), jnp.float32),
        )
        for _ in range(config.num_hidden_layers)
    )
    rows = jnp.arange(b)[:, None]

    def attention_step(i, carry):  # as a decode step writes and reads each layer's cache
        q, caches = carry
        slot = jnp.full((b, 1), PROMPT, jnp.int32) + i
        mask = jnp.arange(s)[None, None, :] <= slot[:, :, None]  # [B, 1, S]
        new = []
        for k, v in caches:
            kv = q.reshape(b, 1, kvh, h // kvh, d)[:, :, :, 0]  # [B, 1, K, D]
            k = k.at[rows, :, :, slot].set(kv, mode="drop")
            v = v.at[rows, :, slot].set(kv, mode="drop")
            q = q + 1e-3 * attention.attend_decode_cpu(q, k, v, mask)
            new.append((k, v))
        return q, tuple(new)

    head = params["embedding"].T.copy()  # the decode loop's [E, V] head (qwen2.for_decoding)
    sampling = sampler_lib.SamplingParams(temperature=0.0)

    def head_step(i, x):
        logits = jnp.einsum("be,ev->bv", x, head)
        _, logprob, entropy = sampler_lib.sample_tokens(logits, None, None, sampling)
        return x + 1e-6 * (logprob + entropy)[:, None]

    q0 = jnp.asarray(rng.standard_normal((b, 1, h, d)), jnp.float32)
    x0 = jnp.asarray(rng.standard_normal((b, config.hidden_size)), jnp.float32)
    loops = {
        "attention": (lambda c: jax.lax.fori_loop(0, NEW, attention_step, c), (q0, caches)),
        "LM head and sampling": (lambda x: jax.lax.fori_loop(0, NEW, head_step, x), x0),
    }
    return {
        name: round(per_iteration_us(jax.jit(loop), (arg,), NEW, reps), 1)
        for name, (loop, arg) in loops.items()
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="S", choices=sorted(SIZES))
    ap.add_argument("--reps", type=int, default=11, help="alternated rounds")
    args = ap.parse_args()
    config = qwen2.Qwen2Config(**SIZES[args.size], tie_word_embeddings=True, attention_chunk=0)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    calls = {name: compiled_decode(config, params, parts) for name, parts in VARIANTS.items()}

    def step_us(name):
        run, start = calls[name]
        state = jax.tree.map(lambda x: x.copy(), start)  # the call donates its state
        jax.block_until_ready(state)
        t0 = time.perf_counter()
        jax.block_until_ready(run(state)[0])
        return 1e6 * (time.perf_counter() - t0) / NEW

    times = alternated({name: functools.partial(step_us, name) for name in calls}, args.reps)
    full = statistics.median(times["full"])
    steps = {name: round(statistics.median(t), 1) for name, t in times.items()}
    print(
        json.dumps(
            {
                "bench": "decode_parts",
                "size": args.size,
                "step_us": steps,
                "part_us": {name: round(full - us, 1) for name, us in steps.items() if name != "full"},
                "alone_us": alone_us(config, params, args.reps),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
