"""Sampler throughput: jaxsearch's jitted decode loop vs transformers' generate, same weights, one run.

  python bench/rollout.py [--size S M] [--reps 3] [--host-devices 2]
  python bench/rollout.py --size 0.5B --dtype bfloat16 --batch 16 64 256   # on a GPU: HBM fraction too

Batch 16, 64-token random prompts, exactly 128 new tokens, greedy (the setting of
../shared/anchors/hf_generate.py). Prints one JSON line per size: tokens/s of each, their ratio, and
whether the greedy tokens agree. With --host-devices N on a CPU, XLA splits it into N host devices and the
sampler decodes over a data mesh of them with the params whole on each: one prefill and one decode loop per
device, no collective (`Sampler._per_device`); transformers keeps its torch threads. With --tunix-python (a
Python that has `google-tunix`), the anchor script ../shared/anchors/tunix_sample.py runs on the same saved
weights in the same invocation.

--episode adds a 4-turn Search-R1 episode (batch 16, the tiny searcher model of jaxsearch.testing) with
BM25 over a 10k-passage corpus (the tiny world's passages + generated distractors), and its time split:
device (prefill / decode / append), host retrieval, host parsing and bookkeeping.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from host_devices import split_cpu

if __name__ == "__main__":  # before jax is imported
    split_cpu(default=1)

import jax
import jax.numpy as jnp
import numpy as np
import torch

from common import SIZES, hf_model, median_time
from jaxsearch import parallel
from jaxsearch.models import hf_io
from jaxsearch.agent import sampler as S

BATCH, PROMPT, NEW = 16, 64, 128
H200_HBM_TB_S = 4.8  # the H200's datasheet memory bandwidth


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", nargs="+", default=["S", "M"], choices=sorted(SIZES))
    ap.add_argument("--batch", nargs="+", type=int, default=[BATCH], help="rows per batch (each one a run)")
    ap.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="weights, cache, math"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tunix-python", default="", help="python with google-tunix for the tunix anchor")
    ap.add_argument("--episode", action="store_true", help="also time a 4-turn episode with BM25")
    ap.add_argument(
        "--profile", default="", help="trace one rollout of the first batch into DIR and summarise it"
    )
    ap.add_argument(
        "--host-devices", type=int, default=1, help="CPU only: XLA host devices, the rows split over them"
    )
    args = ap.parse_args()
    platform, kind = jax.devices()[0].platform, jax.devices()[0].device_kind
    # on a GPU both run on it (transformers on torch's CUDA device); on a CPU both on the CPU
    torch_device = "cuda" if platform == "gpu" and torch.cuda.is_available() else "cpu"
    print(
        f"jax {jax.__version__} {platform} ({kind}), torch {torch.__version__} "
        f"on {torch_device}, threads={torch.get_num_threads()}, dtype {args.dtype}",
        flush=True,
    )
    if args.host_devices > 1 and (platform != "cpu" or len(jax.devices()) != args.host_devices):
        raise SystemExit(
            f"--host-devices {args.host_devices}: for a CPU, got {len(jax.devices())} {platform} devices"
        )
    mesh = parallel.make_mesh({"data": args.host_devices}) if args.host_devices > 1 else None
    copy_tb_s = copy_bandwidth() if platform == "gpu" else None
    if copy_tb_s:
        print(f"device-to-device copy: {copy_tb_s:.2f} TB/s (bytes read + written)", flush=True)
    for size in args.size:
        model = hf_model(size)
        weights = tempfile.mkdtemp()
        os.makedirs(os.path.join(weights, size))
        model.save_pretrained(os.path.join(weights, size))
        config, params = hf_io.load_hf(os.path.join(weights, size), dtype=jnp.dtype(args.dtype))
        model = model.to(device=torch_device, dtype=getattr(torch, args.dtype))
        for batch in args.batch:
            profile = args.profile if batch == args.batch[0] else ""
            result, hf_tokens, prompts = compare(
                config, params, model, torch_device, batch, args.reps, profile, mesh
            )
            if copy_tb_s:
                result.update(hbm_fraction(config, params, batch, result["decode_step_ms"], copy_tb_s, kind))
            print(json.dumps({"bench": "rollout", "size": size, "dtype": args.dtype, **result}), flush=True)
            if args.tunix_python and batch == BATCH:  # what the anchor script reads beside the weights
                np.save(os.path.join(weights, size, "prompts.npy"), prompts)
                np.save(os.path.join(weights, size, "hf_greedy.npy"), hf_tokens)
                with torch.inference_mode():
                    ids = torch.tensor(prompts, device=torch_device)
                    last = model(input_ids=ids).logits[:, -1].float().cpu().numpy()
                np.save(os.path.join(weights, size, "hf_last_logits.npy"), last)
                tunix_anchor(args.tunix_python, size, weights, args.reps)
    if args.episode:
        episode_bench()


def greedy_sampler(config, mesh=None) -> S.Sampler:
    """The workload's sampler: greedy, NEW tokens a call, a cache of PROMPT + NEW slots, PROMPT-token prompts."""
    return S.Sampler(
        config,
        S.StopTable.eos_only(config.vocab_size),
        cache_len=PROMPT + NEW,
        max_segment=NEW,
        sampling=S.SamplingParams(temperature=0.0),
        prompt_buckets=[PROMPT],
        mesh=mesh,
    )


def compare(config, params, model, torch_device: str, batch: int, reps: int, profile: str = "", mesh=None):
    """Greedy decode of `batch` random 64-token prompts, NEW tokens each, by both; their times and tokens.
    mesh: jaxsearch's rows split over its data axis, the params whole on every device."""
    prompts = np.random.default_rng(1234).integers(1, config.vocab_size, (batch, PROMPT))
    smp = greedy_sampler(config, mesh)
    if mesh is not None:
        params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    rows = prompts.tolist()

    def ours():
        seg, _ = smp.decode(params, smp.start(params, rows, 0), NEW)
        return seg.tokens

    def ours_prefill():
        jax.block_until_ready(smp.start(params, rows, 0))

    ids = torch.tensor(prompts, device=torch_device)

    def theirs():
        with torch.inference_mode():
            return (
                model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=NEW,
                    min_new_tokens=NEW,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                    use_cache=True,
                )[:, PROMPT:]
                .cpu()
                .numpy()
            )

    t_prefill = median_time(ours_prefill, reps)
    t_ours, t_hf, pair_ratios = paired_times(ours, theirs, reps)
    hf_tokens = theirs()
    our_tokens = ours()
    if profile:
        try:
            trace_summary(ours, profile)
        except Exception as e:  # a profiler that does not work there must not cost the measurement
            print(f"profile failed: {e!r}", flush=True)
    n = batch * NEW
    result = {
        "params_M": round(config.num_params() / 1e6, 1),
        "jax_devices": 1 if mesh is None else mesh.size,
        "batch": batch,
        "prompt": PROMPT,
        "new": NEW,
        "jaxsearch_tok_s": round(n / t_ours),
        "transformers_tok_s": round(n / t_hf),
        "ratio": round(t_hf / t_ours, 2),
        "pair_ratios": [round(r, 2) for r in sorted(pair_ratios)],
        "prefill_ms": round(1e3 * t_prefill, 2),
        "decode_step_ms": round(1e3 * (t_ours - t_prefill) / NEW, 4),
        "greedy_token_agreement": float(np.mean(our_tokens == hf_tokens)),
        "first_token_agreement": float(np.mean(our_tokens[:, 0] == hf_tokens[:, 0])),
    }
    return result, hf_tokens, prompts


def paired_times(ours, theirs, reps: int, pause_s: float = 0.3):
    """Median seconds of ours() and theirs() and the ratio theirs / ours of each pair, timed in alternation
    (after one untimed call of each), so that a machine whose speed drifts (a shared 2-core VM: 1.4-2.3x
    between invocations minutes apart) slows both alike. Before each timed ours() comes a pause and one
    untimed ours(): right after a torch call, torch's OpenMP threads keep spinning and the first jax call
    ran ~1.6x slower and the second ~1.1x on the 2-core machine (measured, bench/RESULTS.md, issue 17)."""
    ours(), theirs()
    t_ours, t_theirs = [], []
    for _ in range(reps):
        time.sleep(pause_s)
        ours()
        for fn, times in ((ours, t_ours), (theirs, t_theirs)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    ratios = [b / a for a, b in zip(t_ours, t_theirs)]
    return statistics.median(t_ours), statistics.median(t_theirs), ratios


def trace_summary(fn, out_dir: str, top: int = 12) -> None:
    """Trace one fn() with jax.profiler; keep the xplane file in out_dir and print, per device timeline
    (plane / line), the events, their busy time and the span, and the costliest event names."""
    import glob
    import shutil
    from collections import Counter

    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            fn()
        (path,) = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
        shutil.copy(path, os.path.join(out_dir, "decode.xplane.pb"))
    data = jax.profiler.ProfileData.from_file(os.path.join(out_dir, "decode.xplane.pb"))
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            events = list(line.events)
            if not events:
                continue
            busy = sum(e.duration_ns for e in events)
            span = max(e.end_ns for e in events) - min(e.start_ns for e in events)
            cost = Counter()
            for e in events:
                cost[e.name[:80]] += e.duration_ns
            print(
                json.dumps(
                    {
                        "trace": f"{plane.name} | {line.name}",
                        "events": len(events),
                        "busy_ms": round(busy / 1e6, 3),
                        "span_ms": round(span / 1e6, 3),
                        "top_ms": {k: round(v / 1e6, 3) for k, v in cost.most_common(top)},
                    }
                ),
                flush=True,
            )


def copy_bandwidth(n_bytes: int = 2**31, reps: int = 20) -> float:
    """Device memory bandwidth in TB/s (bytes read + written), the better of a jitted x + 1 over an n_bytes
    bf16 array and, where torch sees a GPU, torch's device-to-device copy of one."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal(n_bytes // 2, np.float32), jnp.bfloat16)
    add = jax.jit(lambda a: a + 1)
    best = 2 * n_bytes / median_time(lambda: add(x).block_until_ready(), reps)
    del x
    if torch.cuda.is_available():
        src = torch.randn(n_bytes // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)

        def copy():
            dst.copy_(src)
            torch.cuda.synchronize()

        best = max(best, 2 * n_bytes / median_time(copy, reps))
        del src, dst
        torch.cuda.empty_cache()
    return best / 1e12


def hbm_fraction(config, params, batch: int, step_ms: float, copy_tb_s: float, kind: str) -> dict:
    """The decode step's memory traffic floor and the bandwidth it reached.

    Floor per step: every weight once (the tied embedding is the lm head, read whole) plus the KV cache's
    live prefix (prompt + tokens so far, averaged over the segment), each byte once.
    """
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    itemsize = jnp.dtype(config.dtype).itemsize
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * itemsize
    kv_bytes = batch * per_token * (PROMPT + (NEW - 1) / 2)
    reached = (weight_bytes + kv_bytes) / (step_ms / 1e3) / 1e12
    out = {
        "weight_GB": round(weight_bytes / 1e9, 3),
        "kv_read_GB": round(kv_bytes / 1e9, 4),
        "reached_TB_s": round(reached, 3),
        "of_copy_bandwidth": round(reached / copy_tb_s, 3),
    }
    if "H200" in kind:
        out["of_h200_datasheet"] = round(reached / H200_HBM_TB_S, 3)
    return out


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
    from jaxsearch.testing import train_tiny_searcher
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
        limits = EpisodeConfig(
            max_turns=4, retrieval_k=3, max_segment_tokens=48, max_obs_tokens=150, scheduler="lockstep"
        )
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
