"""Sampler throughput: jaxsearch's jitted decode loop vs transformers' generate, same weights, one run.

  python bench/rollout.py [--size S M] [--reps 3]

Batch 16, 64-token random prompts, exactly 128 new tokens, greedy (the setting of
../shared/anchors/hf_generate.py). Prints one JSON line per size: tokens/s of each, their ratio, and
whether the greedy tokens agree.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import numpy as np
import torch

from common import SIZES, hf_model, median_time
from jaxsearch.models import hf_io
from jaxsearch.rollout import sampler as S

BATCH, PROMPT, NEW = 16, 64, 128


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", nargs="+", default=["S", "M"], choices=sorted(SIZES))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"jax {jax.__version__} {jax.devices()[0].platform}, torch {torch.__version__} "
          f"threads={torch.get_num_threads()}", flush=True)
    for size in args.size:
        model = hf_model(size)
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            config, params = hf_io.load_hf(d)
        prompts = np.random.default_rng(1234).integers(1, config.vocab_size, (BATCH, PROMPT))
        vocab = config.vocab_size
        table = S.StopTable.from_arrays(np.zeros((vocab, S.MAX_TOKEN_BYTES), np.uint8),
                                        np.zeros(vocab, np.int32), [], [])
        smp = S.Sampler(config, table, cache_len=PROMPT + NEW, max_segment=NEW,
                        sampling=S.SamplingParams(temperature=0.0), prompt_buckets=[PROMPT])
        rows = prompts.tolist()

        def ours():
            seg, _ = smp.decode(params, smp.start(params, rows, 0), NEW)
            return seg.tokens

        ids = torch.tensor(prompts)

        def theirs():
            with torch.inference_mode():
                return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                      min_new_tokens=NEW, do_sample=False, eos_token_id=None,
                                      pad_token_id=0, use_cache=True)[:, PROMPT:].numpy()

        agree = float(np.mean(ours() == theirs()))
        t_ours, t_hf = median_time(ours, args.reps), median_time(theirs, args.reps)
        n = BATCH * NEW
        print(json.dumps({
            "bench": "rollout", "size": size, "params_M": round(config.num_params() / 1e6, 1),
            "batch": BATCH, "prompt": PROMPT, "new": NEW, "jaxsearch_tok_s": round(n / t_ours),
            "transformers_tok_s": round(n / t_hf), "ratio": round(t_hf / t_ours, 2),
            "greedy_token_agreement": agree}), flush=True)


if __name__ == "__main__":
    main()
