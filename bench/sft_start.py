"""A config's SFT start, comparable across checkouts: a digest of its SFT examples and first batches, then the
losses of N SFT steps from the checkout's own initial weights for the seed, or from a safetensors checkpoint, so
that two checkouts can train from the same weights on the same data and be compared step by step.

  python bench/sft_start.py --config configs/tiny_cpu_graphr1.py --seed 1 --steps 40 --out /tmp/a --save-init
  PYTHONPATH=OTHER python bench/sft_start.py --config OTHER/configs/tiny_cpu_graphr1.py --seed 1 --steps 40 \\
      --init /tmp/a/init --out /tmp/b        # OTHER: another checkout (a git worktree)
  python bench/sft_start.py --compare /tmp/a /tmp/b

The world (and Graph-R1's hypergraph) is built under --workdir/world as launch/train.py builds it; steps follow
the config's schedule (warmup and decay over sft.steps), so --steps 800 is the SFT stage of a tiny config. With
PYTHONPATH set, the jaxsearch package and configs are that checkout's; the script uses only what checkouts
since 5308f09 share. bench/RESULTS.md ("Why the Graph-R1 backbone's start differs") used it.
"""

import argparse
import hashlib
import json
import os
import runpy

import jax
import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="a configs/*.py file")
    ap.add_argument("--seed", type=int, default=0, help="config.seed: the initial weights' and batches' seed")
    ap.add_argument("--steps", type=int, default=40, help="SFT steps to run")
    ap.add_argument("--out", help="directory for sft_start.json (and init/ with --save-init)")
    ap.add_argument("--workdir", help="where the world is built (default: --out)")
    ap.add_argument(
        "--init", help="a safetensors checkpoint directory to start from instead of the seed's draw"
    )
    ap.add_argument("--save-init", action="store_true", help="write the starting weights to OUT/init")
    ap.add_argument("--compare", nargs=2, metavar="DIR", help="compare two runs' sft_start.json and exit")
    args = ap.parse_args()
    if args.compare:
        missing = [d for d in args.compare if not os.path.exists(os.path.join(d, "sft_start.json"))]
        if missing:
            ap.error(f"--compare: no sft_start.json in {missing[0]}")
        return compare(*args.compare)
    if not (args.config and args.out):
        ap.error("--config and --out are required (or --compare A B)")
    run(args)


def run(args):
    from jaxsearch.agent import sft_traces
    from jaxsearch.agent.build import build_protocol, build_retriever, load_tokenizer
    from jaxsearch.agent.policy import model_config
    from jaxsearch.config import RunConfig
    from jaxsearch.data.world.generator import generate_world, world_config
    from jaxsearch.models import hf_io, qwen2
    from jaxsearch.rl import pipeline
    from jaxsearch.rl import sft as sft_lib

    c = runpy.run_path(args.config)["get_config"]()
    c.unlock()
    c.seed = args.seed
    cfg = pipeline.prepare_world(RunConfig.from_dict(c), args.workdir or args.out)
    world = generate_world(world_config(cfg.world.size, cfg.world.seed))
    tokenizer = load_tokenizer(cfg.tokenizer)
    # the examples and batches as rl/pipeline.py's run_sft builds them; not a shared helper, so that a checkout
    # from before one existed runs this script unchanged
    examples = sft_traces.sft_dataset(
        world,
        "train",
        build_protocol(cfg.protocol),
        tokenizer,
        build_retriever(cfg.retriever),
        cfg.rollout.retrieval_k,
        cfg.sft.max_len,
        truncate=cfg.sft.truncate,
        mistake=cfg.sft.mistake or "",
        questions=cfg.sft.questions or 0,
        use_p0=cfg.sft.use_p0,
    )
    data = hashlib.sha256()
    for e in examples:
        for part in (e, e.mistake):
            if part is not None:
                _digest(data, part.ids, part.loss_mask)
    batches = sft_traces.sft_batches(
        examples,
        cfg.sft.batch_size,
        cfg.sft.max_len,
        cfg.seed,
        tokenizer.pad_id,
        cfg.sft.mistake_share,
        cfg.sft.pad_multiple,
    )
    config = model_config(cfg.model)
    if args.init:
        params = hf_io.load_hf(args.init)[1]
    else:
        params = qwen2.init_params(config, jax.random.PRNGKey(cfg.seed))
    os.makedirs(args.out, exist_ok=True)
    if args.save_init:
        hf_io.save_hf(config, params, os.path.join(args.out, "init"))
    init_std = {
        jax.tree_util.keystr(p): float(np.std(v)) for p, v in jax.tree_util.tree_leaves_with_path(params)
    }
    optimizer = sft_lib.sft_optimizer(cfg.sft.lr, cfg.sft.warmup, cfg.sft.steps)
    step = sft_lib.make_sft_step(config, optimizer)
    opt_state = optimizer.init(params)
    seen, losses = hashlib.sha256(), []
    for i in range(args.steps):
        ids, attention_mask, loss_mask = next(batches)
        _digest(seen, ids, loss_mask)
        params, opt_state, metrics = step(params, opt_state, ids, attention_mask, loss_mask)
        losses.append(float(metrics["loss"]))
        if (i + 1) % 50 == 0 or i + 1 == args.steps:
            print(f"step {i + 1}: loss {losses[-1]:.4f} (mean of the last 50: {np.mean(losses[-50:]):.4f})")
    out = dict(
        config=args.config,
        seed=args.seed,
        init=args.init or "the seed's draw",
        examples=len(examples),
        examples_sha256=data.hexdigest(),
        batches_sha256=seen.hexdigest(),
        init_std=init_std,
        losses=losses,
    )
    with open(os.path.join(args.out, "sft_start.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(
        f"{len(examples)} examples, sha256 {data.hexdigest()[:16]}; {os.path.join(args.out, 'sft_start.json')}"
    )


def _digest(h, ids, loss_mask) -> None:
    """Add token ids and their loss mask (an example's [T] or a batch's [B, T]) to the sha256 `h`."""
    h.update(np.asarray(ids, np.int64).tobytes() + np.asarray(loss_mask, np.int8).tobytes())


def compare(a: str, b: str):
    runs = [json.load(open(os.path.join(d, "sft_start.json"))) for d in (a, b)]
    n = min(len(r["losses"]) for r in runs)
    # the batches' digest covers every step a run took: compared only between runs of one length
    keys = ("examples", "examples_sha256", "batches_sha256")
    for key in keys if all(len(r["losses"]) == n for r in runs) else keys[:2]:
        print(f"{key}: {'same' if runs[0][key] == runs[1][key] else 'DIFFERENT'}")
    la, lb = (np.asarray(r["losses"][:n]) for r in runs)
    rel = np.abs(la - lb) / np.abs(la)
    print(
        f"losses over {n} steps: largest relative difference {rel.max():.2e} (step {int(rel.argmax()) + 1})"
    )
    for s in range(50, n + 1, 50):
        print(f"  mean of steps {s - 49}-{s}: {la[s - 50 : s].mean():.4f} / {lb[s - 50 : s].mean():.4f}")


if __name__ == "__main__":
    main()
