"""Forward throughput: jaxsearch's jitted Qwen2 forward vs transformers, same weights, in one run.

  python bench/forward.py [--size S M] [--batch 8] [--seq 256] [--reps 5]

Prints one JSON line per size with tokens/s of each and their ratio, and checks the logits agree.
"""

import argparse
import json
import tempfile


import jax
import numpy as np
import torch

from common import SIZES, hf_model, median_time
from jaxsearch.models import hf_io, qwen2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", nargs="+", default=["S", "M"], choices=sorted(SIZES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(
        f"jax {jax.__version__} {jax.devices()[0].platform}, torch {torch.__version__} "
        f"threads={torch.get_num_threads()}",
        flush=True,
    )
    for size in args.size:
        model = hf_model(size)
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            config, params = hf_io.load_hf(d)
        ids = np.random.default_rng(0).integers(1, config.vocab_size, (args.batch, args.seq))
        mask = np.ones_like(ids)
        fwd = jax.jit(qwen2.forward, static_argnums=0)
        ours = lambda: fwd(config, params, ids, mask).block_until_ready()
        t_ids, t_mask = torch.tensor(ids), torch.tensor(mask)

        def theirs():
            with torch.inference_mode():
                return model(input_ids=t_ids, attention_mask=t_mask).logits

        # jax first: torch's OpenMP threads keep spinning for a while after each call (see bench/rollout.py)
        t_ours = median_time(ours, args.reps)
        t_hf = median_time(theirs, args.reps)
        diff = float(np.abs(np.asarray(ours()) - theirs().numpy()).max())
        n = args.batch * args.seq
        print(
            json.dumps(
                {
                    "bench": "forward",
                    "size": size,
                    "params_M": round(config.num_params() / 1e6, 1),
                    "batch": args.batch,
                    "seq": args.seq,
                    "jaxsearch_tok_s": round(n / t_ours),
                    "transformers_tok_s": round(n / t_hf),
                    "ratio": round(t_hf / t_ours, 2),
                    "max_abs_logit_diff": diff,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
