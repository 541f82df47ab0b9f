"""The stages behind `launch/train.py`: an optional synthetic world, an optional SFT warm start, then RL.

    WORKDIR/world/   corpus.jsonl, train/dev/test.jsonl, tokenizer.json   (config.world.size set)
    WORKDIR/sft/     metrics.jsonl, params/ (orbax)                       (config.sft.steps > 0)
    WORKDIR/grpo/    metrics.jsonl, checkpoints/, tb/                     (always; PPO too)
    WORKDIR/config.json  the config as run; a rerun with another config keeps the earlier as config.N.json

Each stage is skipped when its output is already complete, so rerunning the same command resumes.
"""

from __future__ import annotations

import json
import logging
import os

import jax
import ml_collections

from jaxsearch import checkpoint
from jaxsearch.data.world.oracle import WorldChatModel  # noqa: F401  (config kind "world"; still importable from here)
from jaxsearch.files import atomic_write, atomic_write_text
from jaxsearch.rl import trainer

log = logging.getLogger("jaxsearch.pipeline")


def prepare_world(cfg, workdir: str) -> ml_collections.ConfigDict:
    """Write the synthetic world once and point the config's data, retriever and tokenizer at it."""
    from jaxsearch.data import sft as sft_data
    from jaxsearch.data.world.generator import generate_world, world_config

    world_dir = os.path.join(workdir, "world")
    if not os.path.exists(os.path.join(world_dir, "tokenizer.json")):
        world = generate_world(world_config(cfg.world.size, cfg.world.seed))
        world.write(world_dir)
        sft_data.build_world_tokenizer(world).save(os.path.join(world_dir, "tokenizer.json"))
    cfg = ml_collections.ConfigDict(cfg.to_dict())  # an unlocked copy to fill in
    cfg.data.train = os.path.join(world_dir, "train.jsonl")
    if cfg.sft.steps and cfg.sft.questions:  # SFT takes the first questions, RL the rest
        cfg.data.train = rl_train_file(world_dir, cfg.sft.questions)
    cfg.data.eval = {"synthetic": held_out_file(world_dir, cfg.world.eval_split)}
    cfg.retriever.corpus = os.path.join(world_dir, "corpus.jsonl")
    if cfg.initial_retriever.kind and not cfg.initial_retriever.corpus:
        cfg.initial_retriever.corpus = cfg.retriever.corpus
    cfg.tokenizer.kind, cfg.tokenizer.path = "word", os.path.join(world_dir, "tokenizer.json")
    if cfg.model.vocab_size == -1:  # the model's vocabulary is the world tokenizer's
        cfg.model.vocab_size = trainer.load_tokenizer(cfg).vocab_size
    cfg.lock()
    return cfg


def rl_train_file(world_dir: str, sft_questions: int) -> str:
    """`train_rl.jsonl`: the training questions after the first `sft_questions` (those are SFT's)."""
    from jaxsearch.data import qa

    rows = qa.load_examples(os.path.join(world_dir, "train.jsonl"))
    if not 0 < sft_questions < len(rows):
        raise ValueError(
            f"config.sft.questions={sft_questions}: expected 1..{len(rows) - 1} of the training questions"
        )
    path = os.path.join(world_dir, f"train_rl_{sft_questions}.jsonl")
    if not os.path.exists(path):
        atomic_write(path, lambda tmp: qa.write_jsonl(rows[sft_questions:], tmp))
    return path


def held_out_file(world_dir: str, eval_split: str) -> str:
    """The held-out questions' file: a split ("test") or splits joined by "+" ("dev+test", written once as
    `dev+test.jsonl`: the splits' rows in that order)."""
    from jaxsearch.data import qa

    splits = eval_split.split("+")
    unknown = [s for s in splits if s not in ("train", "dev", "test")]
    if unknown:
        raise ValueError(f"config.world.eval_split={eval_split!r}: unknown split {unknown[0]!r}")
    path = os.path.join(world_dir, eval_split + ".jsonl")
    if len(splits) > 1 and not os.path.exists(path):
        rows = [e for s in splits for e in qa.load_examples(os.path.join(world_dir, s + ".jsonl"))]
        atomic_write(path, lambda tmp: qa.write_jsonl(rows, tmp))
    return path


def run_sft(cfg, workdir: str, progress: bool = True) -> str:
    """Supervised warm start on the world's templated trajectories; returns the params directory."""
    from jaxsearch.data import sft as sft_data
    from jaxsearch.data.world.generator import generate_world, world_config
    from jaxsearch.models import qwen2
    from jaxsearch.rl import sft as sft_lib

    out = os.path.join(workdir, "sft")
    params_dir = os.path.join(out, "params")
    if os.path.exists(os.path.join(params_dir, "config.json")):
        return params_dir
    os.makedirs(out, exist_ok=True)
    world = generate_world(world_config(cfg.world.size, cfg.world.seed))
    tokenizer = trainer.load_tokenizer(cfg)
    retriever = trainer.build_retriever(cfg.retriever)
    examples = sft_data.sft_dataset(
        world,
        "train",
        cfg.protocol.name,
        tokenizer,
        retriever,
        cfg.rollout.retrieval_k,
        cfg.sft.max_len,
        truncate=cfg.sft.truncate,
        mistake=cfg.sft.mistake,
        questions=cfg.sft.questions,
        use_p0=cfg.sft.use_p0,
    )
    batches = sft_data.sft_batches(
        examples,
        cfg.sft.batch_size,
        cfg.sft.max_len,
        cfg.seed,
        tokenizer.pad_id,
        cfg.sft.mistake_share,
        cfg.sft.pad_multiple,
    )
    config = trainer.model_config(cfg)
    params = qwen2.init_params(config, jax.random.PRNGKey(cfg.seed))
    params, losses = sft_lib.sft_train(
        config, params, batches, cfg.sft.steps, cfg.sft.lr, cfg.sft.warmup, log_every=10, progress=progress
    )
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for step, loss in enumerate(losses, start=1):
            f.write(json.dumps({"step": step, "sft/loss": loss}) + "\n")
    checkpoint.save_params(params_dir, config, params)
    return params_dir


def record_config(cfg, workdir: str) -> None:
    """Write `cfg` to WORKDIR/config.json. A workdir started with another config (a resume with changed
    overrides) keeps the earlier one as config.N.json and gets a warning naming the keys that differ."""
    path = os.path.join(workdir, "config.json")
    new = json.loads(cfg.to_json_best_effort(sort_keys=True))
    if os.path.exists(path):
        try:
            with open(path) as f:
                old = json.load(f)
        except json.JSONDecodeError as e:
            old, changed = None, [f"the recorded one is not valid JSON ({e})"]
        if old == new:
            return
        if old is not None:
            before, after = _flatten(old), _flatten(new)
            changed = [
                f"{k} ({before.get(k, '-')} -> {after.get(k, '-')})"
                for k in sorted(before.keys() | after.keys())
                if before.get(k, "-") != after.get(k, "-")
            ]
        n = 1
        while os.path.exists(os.path.join(workdir, f"config.{n}.json")):
            n += 1
        os.replace(path, os.path.join(workdir, f"config.{n}.json"))
        log.warning(
            "%s was run before with another config (kept as config.%d.json): %s",
            workdir,
            n,
            ", ".join(changed),
        )
    atomic_write_text(path, json.dumps(new, indent=2, sort_keys=True) + "\n")


def _flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def run(cfg, workdir: str, progress: bool = True) -> dict:
    """All configured stages; returns the RL stage's last metrics."""
    os.makedirs(workdir, exist_ok=True)
    if jax.process_index() == 0:
        record_config(cfg, workdir)
    if cfg.world.size:
        cfg = prepare_world(cfg, workdir)
    if cfg.sft.steps:
        params_dir = run_sft(cfg, workdir, progress)
        cfg = ml_collections.ConfigDict(cfg.to_dict())
        cfg.model.orbax_path = params_dir
        cfg.lock()
    return trainer.train(cfg, os.path.join(workdir, "grpo"), progress=progress)


def eval_summary(metrics_path: str) -> str:
    """Held-out metrics at the RL stage's first and last evaluation, one line per dataset."""
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    if not evals:
        return "no evaluation logged"
    first, last = evals[0], evals[-1]
    lines = []
    for key in sorted(k for k in last if k.startswith("eval/") and k.rsplit("/", 1)[1] in ("em", "f1")):
        lines.append(
            f"{key}: {first.get(key, float('nan')):.3f} at step {first['step']} -> "
            f"{last[key]:.3f} at step {last['step']}"
        )
    return "\n".join(lines)
