"""Milliseconds per decode step of the tiny searcher's decode call, by cache length and rows: how a step's cost
follows the cache length when the rows use only a little of it; and of the calls that fill the cache.

  python bench/decode_call.py [--caches 256 512 1024] [--rows 10 50] [--prompt 110] [--steps 32]
                              [--append 150] [--reps 5]

Every row holds a `--prompt`-token random prompt and decodes `--steps` tokens greedily in one call (no stop
strings, so every row runs every step). A line per (cache, rows): the median over `--reps` calls (after one
untimed) divided by the steps, and the first tokens of row 0 (for comparing two checkouts: the same params,
tokens and shapes give the same tokens); the prefill of all rows (`Sampler.start`, ms), the lockstep append
of `--append` tokens (or what fits) to every row after the decode call (`Sampler.append`, ms), and in decode
slots holding the rows, one slot's new prompt and that chunk after it (`Slots.insert` twice, ms). Chunks are
padded to the sampler's power-of-two buckets, as in a rollout. To compare code versions, run it from each checkout with
PYTHONPATH set to that checkout.
"""

import argparse
import json
import time

import jax
import numpy as np

from jaxsearch.agent import sampler as S
from jaxsearch.agent.slots import Slots
from jaxsearch.testing import train_tiny_searcher


def median_ms(run, reps: int) -> float:
    """Median milliseconds of `run()` (which blocks) over `reps` calls after an untimed one."""
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:])) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caches", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--prompt", type=int, default=110, help="prompt tokens per row")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per call")
    ap.add_argument("--append", type=int, default=150, help="tokens appended per row after the decode call")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    config, params, tokenizer, _, _ = train_tiny_searcher()
    table = S.StopTable.build(tokenizer, [], [], config.vocab_size)
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__} {jax.default_backend()}", flush=True)
    for cache in args.caches:
        for rows in args.rows:
            sampler = S.Sampler(
                config, table, cache, args.steps, S.SamplingParams(0.0), prompt_buckets=[args.prompt]
            )
            prompts = [list(rng.integers(5, config.vocab_size, args.prompt)) for _ in range(rows)]
            room = cache - args.prompt - args.steps  # the append must fit in the cache
            chunks = [list(rng.integers(5, config.vocab_size, min(args.append, room))) for _ in range(rows)]
            times, append_ms = [], []
            for _ in range(args.reps + 1):
                state = sampler.start(params, prompts, 0)  # the decode call donates its state
                jax.block_until_ready(state.logits)
                start = time.perf_counter()
                segment, state = sampler.decode(params, state, args.steps)  # returns host arrays
                times.append(time.perf_counter() - start)
                start = time.perf_counter()
                jax.block_until_ready(sampler.append(params, state, chunks).logits)
                append_ms.append((time.perf_counter() - start) * 1e3)
            ms = float(np.median(times[1:])) / args.steps * 1e3
            prefill_ms = median_ms(lambda: jax.block_until_ready(sampler.start(params, prompts, 0).logits), args.reps)
            slots = Slots(sampler, args.steps)
            filled = slots.empty(rows)
            for slot, prompt in enumerate(prompts):
                filled = slots.insert(params, filled, slot, prompt, 0, key=np.zeros(2, np.uint32))

            def insert():
                nonlocal filled  # the insert donates the state; the slot's row grows by a chunk per call
                filled = slots.insert(params, filled, 0, prompts[0], 0, key=np.zeros(2, np.uint32))
                filled = slots.insert(params, filled, 0, chunks[0], 0)
                jax.block_until_ready(filled.decode.logits)

            line = dict(bench="decode_call", cache=cache, rows=rows, prompt=args.prompt, steps=args.steps)
            timed = {
                "ms_per_step": round(ms, 3),
                "prefill_ms": round(prefill_ms, 2),
                "append_ms": round(float(np.median(append_ms[1:])), 2),
                "insert_prompt_and_chunk_ms": round(median_ms(insert, args.reps), 2),
            }
            print(json.dumps({**line, **timed, "row0": segment.tokens[0, :6].tolist()}), flush=True)

if __name__ == "__main__":
    main()
