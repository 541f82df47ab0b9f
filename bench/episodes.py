"""Episodes with heavy-tailed rows: the decode-slot engine against the lockstep rollout, same parts, one run.

  python bench/episodes.py [--rows 50] [--slots 50 16] [--steps 8 16 32] [--reps 3] [--latency-ms 0]

The tiny searcher (jaxsearch.testing) answers the tiny world's test questions greedily with Search-R1's protocol
and BM25 (k=1), up to 4 searching turns + a last one: single-hop rows answer after one search, multi-hop rows
search once per hop and the rest use every turn, so turns per row are spread from 2 to 5 (printed). Cache 1024,
segments up to 128 tokens, prompts and observations padded to the training sampler's power-of-two length
buckets. Lockstep runs `--slots` rows per sampler call (its `micro_batch`); the slot engine
the same number of slots. Each line: wall seconds (median of --reps, the variants interleaved), the ratio
lockstep / slots, the device-idle fraction (1 - device busy / wall; the slot engine's busy time is a lower
bound, so its idle fraction an upper bound), whether the trajectories are identical token for token, and the
untimed first rollout's seconds (compiles included, where an earlier line's engine did not compile them).
--latency-ms adds a fixed delay to every retriever call (a remote retriever). --group G --temperature 1 is a
GRPO rollout: each question G times, sampled (`--rows` counts questions); --top-p 0.95 samples as the configs'
rollouts do (Search-R1's veRL default).
"""

import argparse
import json
import statistics
import time

import jax
import numpy as np

from jaxsearch.agent import sampler as S
from jaxsearch.agent.engine import AgentEngine, EpisodeConfig
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.models.spans import default_buckets
from jaxsearch.testing import train_tiny_searcher


class DelayedRetriever:
    def __init__(self, retriever, seconds: float):
        self.retriever, self.seconds = retriever, seconds

    def search(self, queries, k):
        time.sleep(self.seconds)
        return self.retriever.search(queries, k)


def same(a, b) -> bool:
    return a.tokens.shape == b.tokens.shape and bool(np.all(a.tokens == b.tokens)) and a.answers == b.answers


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--slots", type=int, nargs="+", default=[50, 16])
    ap.add_argument("--steps", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; 1: a training rollout's sampling")
    ap.add_argument("--group", type=int, default=1, help="samples per question (GRPO's group), with --temperature")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, with --temperature")
    args = ap.parse_args()
    config, params, tok, world, retriever = train_tiny_searcher()
    if args.latency_ms:
        retriever = DelayedRetriever(retriever, args.latency_ms / 1000)
    protocol = get_protocol("search_r1")
    table = S.StopTable.build(tok, protocol.stop_strings, [tok.eos_id], config.vocab_size)
    limits = EpisodeConfig(
        max_turns=4, retrieval_k=1, max_segment_tokens=128, max_obs_tokens=150, scheduler="lockstep"
    )
    # the length buckets of a training run's sampler (agent/build.build_sampler): powers of two
    smp = S.Sampler(
        config,
        table,
        1024,
        128,
        S.SamplingParams(args.temperature, args.top_p),
        chunk_buckets=default_buckets(limits.max_obs_tokens + 512),
    )
    questions = [q.question for q in (world.questions["test"] + world.questions["dev"])[: args.rows]]
    questions = [q for q in questions for _ in range(args.group)]  # as the RL data iterator repeats them
    print(f"jax {jax.__version__} {jax.devices()[0].platform}, {len(questions)} rows", flush=True)
    for n in args.slots:
        engines = {"lockstep": AgentEngine(tok, protocol, retriever, smp, limits.replace(micro_batch=n))}
        for steps in args.steps:
            in_slots = limits.replace(micro_batch=n, scheduler="slots", steps_per_call=steps)
            engines[f"slots/{steps}"] = engines["lockstep"].replace(limits=in_slots)
        trajs, first = {}, {}
        for name, e in engines.items():  # warm-up: a fresh process's first rollout of each compiles its calls
            t = time.perf_counter()
            trajs[name] = e.rollout(params, questions, 0)
            first[name] = time.perf_counter() - t
        walls = {name: [] for name in engines}
        device = {name: [] for name in engines}
        for _ in range(args.reps):
            for name, e in engines.items():
                t = time.perf_counter()
                traj = e.rollout(params, questions, 0)
                walls[name].append(time.perf_counter() - t)
                device[name].append(traj.timings["device"])
        base = statistics.median(walls["lockstep"])
        turns = np.bincount(trajs["lockstep"].turns, minlength=6).tolist()
        for name in engines:
            wall = statistics.median(walls[name])
            idle = 1 - statistics.median(d / w for d, w in zip(device[name], walls[name]))
            row = {
                "bench": "episodes",
                "engine": name,
                "slots": n,
                "rows": len(questions),
                "latency_ms": args.latency_ms,
                "turns_histogram": turns,
                "wall_s": round(wall, 3),
                "first_rollout_s": round(first[name], 2),
                "speedup": round(base / wall, 2),
                "device_idle": round(idle, 3),
                "identical_to_lockstep": same(trajs[name], trajs["lockstep"]),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
