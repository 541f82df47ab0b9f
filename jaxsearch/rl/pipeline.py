"""The stages behind `launch/train.py`: an optional synthetic world, an optional SFT warm start, then RL.

    WORKDIR/world/   corpus.jsonl, train/dev/test.jsonl, tokenizer.json   (config.world.size set)
    WORKDIR/world/hypergraph/   the world's knowledge hypergraph          (and retriever.kind hypergraph)
    WORKDIR/sft/     metrics.jsonl, params/ (orbax); checkpoints/ until done (config.sft.steps > 0)
    WORKDIR/grpo/    metrics.jsonl, checkpoints/, tb/, params/            (GRPO; PPO runs write WORKDIR/ppo/)
    WORKDIR/config.json  the config as the RL stage runs it (`config.RunConfig`, paths resolved); a rerun
                         with another config keeps the earlier as config.N.json

Each stage is skipped when its output is already complete, so rerunning the same command resumes; a stopped
SFT or RL stage continues from its last checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

from dataclasses import replace

import jax

from jaxsearch import checkpoint
from jaxsearch.models import orbax_io
from jaxsearch.config import RunConfig, TokenizerConfig
from jaxsearch.files import atomic_write, atomic_write_text
from jaxsearch.agent.build import build_protocol, build_retriever, load_tokenizer
from jaxsearch.agent.policy import model_config
from jaxsearch.rl import trainer

log = logging.getLogger("jaxsearch.pipeline")


def prepare_world(cfg: RunConfig, workdir: str) -> RunConfig:
    """Write the synthetic world once; `cfg` with its data, retriever corpus and tokenizer pointed at it (and
    the model's vocabulary the world tokenizer's, for a random init of explicit sizes)."""
    from jaxsearch.agent import sft_traces as sft_data
    from jaxsearch.data.world.generator import generate_world, world_config

    world_dir = os.path.join(workdir, "world")
    if not os.path.exists(os.path.join(world_dir, "tokenizer.json")):
        world = generate_world(world_config(cfg.world.size, cfg.world.seed))
        world.write(world_dir)
        sft_data.build_world_tokenizer(world).save(os.path.join(world_dir, "tokenizer.json"))
    train = os.path.join(world_dir, "train.jsonl")
    if cfg.sft is not None and cfg.sft.questions:  # SFT takes the first questions, RL the rest
        train = rl_train_file(world_dir, cfg.sft.questions)
    data = replace(cfg.data, train=train, eval={"synthetic": held_out_file(world_dir, cfg.world.eval_split)})
    corpus = os.path.join(world_dir, "corpus.jsonl")
    initial = cfg.initial_retriever
    if initial is not None and initial.corpus is None:
        initial = replace(initial, corpus=corpus)
    tokenizer = TokenizerConfig(kind="word", path=os.path.join(world_dir, "tokenizer.json"))
    model = cfg.model
    if model.vocab_size is None and model.hidden_size is not None:  # the world tokenizer's vocabulary
        model = replace(model, vocab_size=load_tokenizer(tokenizer).vocab_size)
    retriever = replace(cfg.retriever, corpus=corpus)
    if retriever.kind == "hypergraph" and retriever.index is None:
        retriever = replace(retriever, index=world_hypergraph(world_dir, retriever.encoder or "minilm"))
    return cfg.replace(
        data=data,
        retriever=retriever,
        initial_retriever=initial,
        tokenizer=tokenizer,
        model=model,
    )


def world_hypergraph(world_dir: str, encoder: str) -> str:
    """`WORKDIR/world/hypergraph`: the world's knowledge hypergraph (Graph-R1's construction with the rule
    extractor: each fact sentence a hyper-relation of its subject and object), built once."""
    from jaxsearch.retrieval import hypergraph_build
    from jaxsearch.retrieval.encoders import Encoder
    from jaxsearch.retrieval.hypergraph import META_FILE, hypergraph_encoder_spec
    from jaxsearch.data.world.extractor import WorldExtractor

    out = os.path.join(world_dir, "hypergraph")
    if not os.path.exists(os.path.join(out, META_FILE)):
        hypergraph_build.build_hypergraph(
            os.path.join(world_dir, "corpus.jsonl"),
            out,
            WorldExtractor.from_dir(world_dir),
            Encoder(hypergraph_encoder_spec(encoder)),
            progress=False,
        )
    return out


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
    from jaxsearch.agent import sft_traces as sft_data
    from jaxsearch.data.world.generator import generate_world, world_config
    from jaxsearch.models import qwen2
    from jaxsearch.rl import sft as sft_lib

    out = os.path.join(workdir, "sft")
    params_dir = os.path.join(out, "params")
    if os.path.exists(os.path.join(params_dir, "config.json")):
        return params_dir
    os.makedirs(out, exist_ok=True)
    world = generate_world(world_config(cfg.world.size, cfg.world.seed))
    tokenizer = load_tokenizer(cfg.tokenizer)
    retriever = build_retriever(cfg.retriever)
    examples = sft_data.sft_dataset(
        world,
        "train",
        build_protocol(cfg.protocol),
        tokenizer,
        retriever,
        cfg.rollout.retrieval_k,
        cfg.sft.max_len,
        truncate=cfg.sft.truncate,
        mistake=cfg.sft.mistake or "",
        questions=cfg.sft.questions or 0,
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
    config = model_config(cfg.model)
    params = qwen2.init_params(config, jax.random.PRNGKey(cfg.seed))
    # WORKDIR/sft/checkpoints: a stopped SFT stage continues from its last save (removed once params/ is written)
    ckpt = checkpoint.TrainCheckpointer(out, save_every=cfg.sft.save_every, max_to_keep=1)
    params, losses = sft_lib.sft_train(
        config,
        params,
        batches,
        cfg.sft.steps,
        cfg.sft.lr,
        cfg.sft.warmup,
        log_every=10,
        progress=progress,
        checkpointer=ckpt,
    )
    ckpt.close()
    atomic_write_text(
        os.path.join(out, "metrics.jsonl"),
        "".join(json.dumps({"step": step, "sft/loss": loss}) + "\n" for step, loss in enumerate(losses, start=1)),
    )
    orbax_io.save_params(params_dir, config, params)
    if jax.process_index() == 0:
        shutil.rmtree(ckpt.directory, ignore_errors=True)
    return params_dir


def record_config(cfg, workdir: str) -> None:
    """Write `cfg` (a RunConfig, or any config with `to_dict()`) to WORKDIR/config.json. A workdir started with another config (a resume with changed
    overrides) keeps the earlier one as config.N.json and gets a warning naming the keys that differ."""
    path = os.path.join(workdir, "config.json")
    new = json.loads(json.dumps(cfg.to_dict(), sort_keys=True, default=str))
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
    """All configured stages; returns the RL stage's last metrics. `cfg`: a ConfigDict or RunConfig. The
    config resolved for the RL stage (the world's files, the SFT policy) is what WORKDIR/config.json records."""
    cfg = RunConfig.from_dict(cfg)
    os.makedirs(workdir, exist_ok=True)
    if cfg.world is not None:
        cfg = prepare_world(cfg, workdir)
    if cfg.sft is not None:  # RL starts from the warm-started policy
        cfg = cfg.replace(model=replace(cfg.model, orbax_path=os.path.join(workdir, "sft", "params")))
    if jax.process_index() == 0:
        record_config(cfg, workdir)
    if cfg.sft is not None:
        run_sft(cfg, workdir, progress)
    return trainer.train(cfg, os.path.join(workdir, rl_stage(cfg)), progress=progress)


def rl_stage(cfg) -> str:
    """The RL stage's directory name under WORKDIR: "ppo" for GAE with a critic, else "grpo"."""
    return "ppo" if cfg.algo.advantage == "gae" else "grpo"


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
