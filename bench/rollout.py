"""Sampler throughput: jaxsearch's jitted decode loop vs transformers' generate, same weights, one run.

  python bench/rollout.py [--size S M] [--reps 3]

Batch 16, 64-token random prompts, exactly 128 new tokens, greedy (the setting of
../shared/anchors/hf_generate.py). Prints one JSON line per size: tokens/s of each, their ratio, and
whether the greedy tokens agree. With --tunix-python (a Python that has `google-tunix`), the anchor
script ../shared/anchors/tunix_sample.py runs on the same saved weights in the same invocation.

--episode adds a 4-turn Search-R1 episode (batch 16, the tiny searcher model of jaxsearch.rl.sft) with
BM25 over a 10k-passage corpus (the tiny world's passages + generated distractors), and its time split:
device (prefill / decode / append), host retrieval, host parsing and bookkeeping.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import numpy as np
import torch

from common import SIZES, hf_model, median_time
from jaxsearch.models import hf_io
from jaxsearch.agent import sampler as S

BATCH, PROMPT, NEW = 16, 64, 128


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", nargs="+", default=["S", "M"], choices=sorted(SIZES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tunix-python", default="", help="python with google-tunix for the tunix anchor")
    ap.add_argument("--episode", action="store_true", help="also time a 4-turn episode with BM25")
    args = ap.parse_args()
    print(
        f"jax {jax.__version__} {jax.devices()[0].platform}, torch {torch.__version__} "
        f"threads={torch.get_num_threads()}",
        flush=True,
    )
    for size in args.size:
        model = hf_model(size)
        weights = tempfile.mkdtemp()
        os.makedirs(os.path.join(weights, size))
        model.save_pretrained(os.path.join(weights, size))
        config, params = hf_io.load_hf(os.path.join(weights, size))
        prompts = np.random.default_rng(1234).integers(1, config.vocab_size, (BATCH, PROMPT))
        vocab = config.vocab_size
        table = S.StopTable.from_arrays(
            np.zeros((vocab, S.MAX_TOKEN_BYTES), np.uint8), np.zeros(vocab, np.int32), [], []
        )
        smp = S.Sampler(
            config,
            table,
            cache_len=PROMPT + NEW,
            max_segment=NEW,
            sampling=S.SamplingParams(temperature=0.0),
            prompt_buckets=[PROMPT],
        )
        rows = prompts.tolist()

        def ours():
            seg, _ = smp.decode(params, smp.start(params, rows, 0), NEW)
            return seg.tokens

        ids = torch.tensor(prompts)

        def theirs():
            with torch.inference_mode():
                return model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=NEW,
                    min_new_tokens=NEW,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                    use_cache=True,
                )[:, PROMPT:].numpy()

        # jax first: torch's OpenMP threads keep spinning for a while after each call and would steal
        # the 2 cores from XLA's threads if jax ran right after torch
        t_ours = median_time(ours, args.reps)
        t_hf = median_time(theirs, args.reps)
        hf_tokens = theirs()
        agree = float(np.mean(ours() == hf_tokens))
        n = BATCH * NEW
        print(
            json.dumps(
                {
                    "bench": "rollout",
                    "size": size,
                    "params_M": round(config.num_params() / 1e6, 1),
                    "batch": BATCH,
                    "prompt": PROMPT,
                    "new": NEW,
                    "jaxsearch_tok_s": round(n / t_ours),
                    "transformers_tok_s": round(n / t_hf),
                    "ratio": round(t_hf / t_ours, 2),
                    "greedy_token_agreement": agree,
                }
            ),
            flush=True,
        )
        if args.tunix_python:  # what the anchor script reads beside the weights
            np.save(os.path.join(weights, size, "prompts.npy"), prompts)
            np.save(os.path.join(weights, size, "hf_greedy.npy"), hf_tokens)
            with torch.inference_mode():
                last = model(input_ids=ids).logits[:, -1].numpy()
            np.save(os.path.join(weights, size, "hf_last_logits.npy"), last)
            tunix_anchor(args.tunix_python, size, weights, args.reps)
    if args.episode:
        episode_bench()


def tunix_anchor(python: str, size: str, weights: str, reps: int) -> None:
    """Run ../shared/anchors/tunix_sample.py on the same weights; print its result lines."""
    script = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "anchors", "tunix_sample.py")
    done = subprocess.run(
        [python, script, "--size", size, "--reps", str(reps), "--weights-dir", weights],
        capture_output=True,
        text=True,
        env=dict(os.environ, XLA_FLAGS=""),
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{") or line.startswith("RESULTS")]
    print("\n".join(lines) if lines else f"tunix anchor failed: {done.stderr[-2000:]}", flush=True)


def episode_bench(batch: int = 16, passages: int = 10_000) -> None:
    from jaxsearch.retrieval.bm25 import BM25Retriever
    from jaxsearch.retrieval.corpus import Corpus
    from jaxsearch.rl.sft import train_tiny_searcher
    from jaxsearch.agent.engine import AgentEngine, EpisodeConfig
    from jaxsearch.agent.protocols import get_protocol

    config, params, tok, world, _ = train_tiny_searcher()
    rng = np.random.default_rng(0)
    words = sorted({w for p in world.passages for w in p.contents.split()})
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "corpus.jsonl")
        with open(path, "w") as f:
            for p in world.passages:
                f.write(json.dumps({"id": p.id, "contents": p.contents}) + "\n")
            for i in range(passages - len(world.passages)):
                text = " ".join(rng.choice(words, 60))
                f.write(json.dumps({"id": f"noise{i}", "contents": f'"Noise {i}"\n{text}'}) + "\n")
        retriever = BM25Retriever.build(Corpus(path, progress=False))
        protocol = get_protocol("search_r1")
        table = S.StopTable.build(tok, protocol.stop_strings, [tok.eos_id], config.vocab_size)
        smp = S.Sampler(
            config,
            table,
            cache_len=1024,
            max_segment=48,
            sampling=S.SamplingParams(1.0),
            prompt_buckets=[192],
            chunk_buckets=[160],
        )
        limits = EpisodeConfig(max_turns=4, retrieval_k=3, max_segment_tokens=48, max_obs_tokens=150)
        engine = AgentEngine(tok, protocol, retriever, smp, limits)
        questions = [q.question for q in world.questions["train"][:batch]]
        engine.rollout(params, questions, 0)  # warm-up
        t0 = time.perf_counter()
        traj = engine.rollout(params, questions, 1)
        wall = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "bench": "episode",
                "batch": batch,
                "passages": passages,
                "max_turns": 4,
                "wall_s": round(wall, 3),
                **{f"{k}_s": round(v, 3) for k, v in traj.timings.items()},
                "turns": float(traj.turns.mean()),
                "searches": float(traj.searches.mean()),
                "policy_tokens": int(traj.loss_mask.sum()),
                "all_tokens": int(traj.attention_mask.sum()),
                "policy_tok_s": round(traj.loss_mask.sum() / wall),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
