"""Milliseconds per decode step of the tiny searcher's decode call, by cache length and rows: how a step's cost
follows the cache length when the rows use only a little of it.

  python bench/decode_call.py [--caches 256 512 1024] [--rows 10 50] [--prompt 110] [--steps 32] [--reps 5]

Every row holds a `--prompt`-token random prompt and decodes `--steps` tokens greedily in one call (no stop
strings, so every row runs every step). A line per (cache, rows): the median over `--reps` calls (after one
untimed) divided by the steps, and the first tokens of row 0 (for comparing two checkouts: the same params,
tokens and shapes give the same tokens). To compare code versions, run it from each checkout with
PYTHONPATH set to that checkout.
"""

import argparse
import json
import time

import jax
import numpy as np

from jaxsearch.agent import sampler as S
from jaxsearch.rl.sft import train_tiny_searcher


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caches", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--prompt", type=int, default=110, help="prompt tokens per row")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per call")
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
            times = []
            for _ in range(args.reps + 1):
                state = sampler.start(params, prompts, 0)  # the decode call donates its state
                jax.block_until_ready(state.logits)
                start = time.perf_counter()
                segment, _ = sampler.decode(params, state, args.steps)  # returns host arrays
                times.append(time.perf_counter() - start)
            ms = float(np.median(times[1:])) / args.steps * 1e3
            line = dict(bench="decode_call", cache=cache, rows=rows, prompt=args.prompt, steps=args.steps)
            print(json.dumps({**line, "ms_per_step": round(ms, 3), "row0": segment.tokens[0, :6].tolist()}))


if __name__ == "__main__":
    main()
