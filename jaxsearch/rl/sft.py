"""Supervised fine-tuning on agent trajectories: masked next-token cross-entropy, a jitted AdamW step, a loop.

    optimizer = sft_optimizer(lr=3e-3, warmup=20, steps=300)
    step = make_sft_step(config, optimizer)                  # jitted; params and opt_state are donated
    params, opt_state, metrics = step(params, opt_state, ids, attention_mask, loss_mask)
    params, history = sft_train(config, params, batches, steps=300, lr=3e-3, warmup=20, log_every=25)

`train_tiny_searcher()` fine-tunes a tiny Qwen2 on the tiny synthetic world's Search-R1 trajectories: a model
that really searches, for tests of the rollout code. It caches the result on disk (see its docstring).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from jaxsearch.checkpoint import TrainCheckpointer
from jaxsearch.files import atomic_write, atomic_write_text
from jaxsearch.models import qwen2


def masked_nll(config: qwen2.Qwen2Config, params, ids, attention_mask, loss_mask):
    """Mean cross-entropy of the tokens where loss_mask is 1, each predicted from the tokens before it.

    ids, attention_mask, loss_mask: [B, T]. The prediction at t scores token t+1, so position 0 is never
    scored. Returns (mean loss, number of scored tokens), both scalars.
    """
    targets = jnp.roll(ids, -1, axis=1)  # column T-1 wraps around; its weight is 0 below
    logp = qwen2.token_logprobs(config, params, ids, attention_mask, targets)
    weights = jnp.pad(loss_mask[:, 1:], ((0, 0), (0, 1))).astype(jnp.float32)
    count = weights.sum()
    return -(logp * weights).sum() / jnp.maximum(count, 1.0), count


def sft_optimizer(
    lr: float, warmup: int, steps: int, weight_decay: float = 0.01, clip_norm: float = 1.0
) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW with linear warmup to `lr` and cosine decay to lr/10 at `steps`."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr / 10)
    return optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(schedule, weight_decay=weight_decay))


def make_sft_step(config: qwen2.Qwen2Config, optimizer: optax.GradientTransformation) -> Callable:
    """`step(params, opt_state, ids, attention_mask, loss_mask) -> (params, opt_state, metrics)`, jitted
    with params and opt_state donated; metrics: loss, tokens (scored), grad_norm (before clipping)."""

    def step(params, opt_state, ids, attention_mask, loss_mask):
        def loss_fn(p):
            return masked_nll(config, p, ids, attention_mask, loss_mask)

        (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "tokens": count, "grad_norm": optax.tree.norm(grads)}

    return jax.jit(step, donate_argnums=(0, 1))


def sft_train(
    config: qwen2.Qwen2Config,
    params,
    batches_iter: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]],
    steps: int,
    lr: float,
    warmup: int,
    log_every: int,
    progress: bool = True,
    checkpointer: TrainCheckpointer | None = None,
) -> tuple[object, list[float]]:
    """`steps` SFT steps over (ids, attention_mask, loss_mask) [B, T] batches (`data.sft.sft_batches`).

    Returns the trained params and the loss of every step. `params` is donated to the first step: do not use
    the array passed in afterwards. The progress bar shows the loss every `log_every` steps.

    `checkpointer`: params, optimizer state and the losses so far are saved at its save steps, and a run
    that finds a checkpoint there continues from the newest one: the batches it had consumed are drawn again
    and dropped (`batches_iter` must be the same deterministic sequence), so a resumed run ends with the
    params and losses of one that was never stopped, bit for bit.
    """
    optimizer = sft_optimizer(lr, warmup, steps)
    step = make_sft_step(config, optimizer)
    opt_state = optimizer.init(params)
    start, losses, pending = 0, [], []
    if checkpointer is not None:
        restored = checkpointer.restore_latest({"params": params, "opt_state": opt_state})
        if restored is not None:
            start, state, meta = restored
            params, opt_state, losses = state["params"], state["opt_state"], list(meta["losses"])
            if start > steps or len(losses) != start:
                raise ValueError(
                    f"{checkpointer.directory}: a checkpoint of step {start} with {len(losses)} losses does not"
                    f" belong to a run of {steps} steps"
                )
    batches = iter(batches_iter)
    for _ in range(start):
        next(batches)
    with tqdm(total=steps, initial=start, desc="sft", disable=not progress) as bar:
        for i in range(start, steps):
            ids, attention_mask, loss_mask = next(batches)
            params, opt_state, metrics = step(params, opt_state, ids, attention_mask, loss_mask)
            pending.append(metrics["loss"])
            saving = checkpointer is not None and checkpointer.should_save(i + 1) and i + 1 < steps
            if (i + 1) % log_every == 0 or i + 1 == steps or saving:
                losses += [float(x) for x in jax.device_get(pending)]
                pending = []
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if saving:
                checkpointer.save(i + 1, {"params": params, "opt_state": opt_state}, {"losses": losses})
            bar.update(1)
    if checkpointer is not None:
        checkpointer.wait()
    return params, losses


# ---------------------------------------------------------------------------------------------- tiny searcher

TINY_SEARCHER = {"k": 1, "max_len": 256, "truncate": True, "batch_size": 8, "lr": 5e-3, "warmup": 10}
CACHE_ENV = "JAXSEARCH_TEST_CACHE"


def tiny_searcher_config(vocab_size: int) -> qwen2.Qwen2Config:
    """The tiny model: hidden 64, 2 layers, 4 heads (2 kv), MLP 192, untied embeddings."""
    return qwen2.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=192,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        max_position_embeddings=2048,
    )


def train_tiny_searcher(
    seed: int = 0, steps: int = 600, cache_dir: str | os.PathLike | None = None, progress: bool = False
):
    """A tiny Qwen2 fine-tuned on the tiny world's Search-R1 trajectories (BM25, k=1): it answers a prompt
    with `<think> I need the ... </think>\\n<search> ... </search>`.

    Returns (config, params, tokenizer, world, retriever). Deterministic in (seed, steps). Cached on disk under
    `cache_dir`, default `$JAXSEARCH_TEST_CACHE` or `~/.cache/jaxsearch-tests/`, in `tiny-searcher-{key}/`
    (params.npz, history.json, the world's corpus.jsonl that the BM25 retriever reads, and a lock file that
    concurrent callers wait on while one trains); the key hashes seed, steps, `TINY_SEARCHER` and the source
    of the modules the result depends on, so a code change retrains. Delete the directory to retrain by hand.
    """
    from jaxsearch.agent.protocols import get_protocol
    from jaxsearch.data import sft as sft_data
    from jaxsearch.data.world.generator import generate_world, world_config
    from jaxsearch.retrieval.factory import make_retriever

    world = generate_world(world_config("tiny", seed))
    tokenizer = sft_data.build_world_tokenizer(world)
    config = tiny_searcher_config(tokenizer.vocab_size)
    out = _cache_dir(seed, steps, cache_dir)
    out.mkdir(parents=True, exist_ok=True)
    # held while checking and training: concurrent callers (pytest-xdist workers) train it once, the rest wait
    with open(out / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "corpus.jsonl").exists():
            atomic_write(out / "corpus.jsonl", lambda path: _write_corpus(world, path))
        retriever = make_retriever("bm25", corpus=str(out / "corpus.jsonl"), progress=False)
        if (out / "params.npz").exists():
            return config, _load_params(config, out / "params.npz"), tokenizer, world, retriever

        hp = TINY_SEARCHER
        protocol = get_protocol("search_r1")
        examples = sft_data.sft_dataset(
            world, "train", protocol, tokenizer, retriever, hp["k"], hp["max_len"], hp["truncate"]
        )
        batches = sft_data.sft_batches(examples, hp["batch_size"], hp["max_len"], seed, tokenizer.pad_id)
        params = qwen2.init_params(config, jax.random.PRNGKey(seed))
        start = time.perf_counter()
        params, losses = sft_train(config, params, batches, steps, hp["lr"], hp["warmup"], 25, progress)
        history = {"loss": losses, "seconds": time.perf_counter() - start, "examples": len(examples)}
        atomic_write_text(out / "history.json", json.dumps(history))
        atomic_write(out / "params.npz", lambda path: _save_params(params, path))
    return config, params, tokenizer, world, retriever


def tiny_searcher_history(
    seed: int = 0, steps: int = 600, cache_dir: str | os.PathLike | None = None
) -> dict:
    """The training record of a cached `train_tiny_searcher(seed, steps)`: loss per step, seconds, examples."""
    return json.loads((_cache_dir(seed, steps, cache_dir) / "history.json").read_text())


def _cache_dir(seed: int, steps: int, cache_dir: str | os.PathLike | None) -> Path:
    """`{cache root}/tiny-searcher-{key}`: the key hashes the arguments and the code the result depends on."""
    import jaxsearch

    package = Path(jaxsearch.__file__).parent
    sources = ["data/sft.py", "data/world/generator.py", "data/world/oracle.py", "data/world/tables.py"]
    sources += ["data/word_tokenizer.py", "models/qwen2.py", "agent/protocols.py", "rl/sft.py"]
    digest = hashlib.sha256(json.dumps([seed, steps, TINY_SEARCHER]).encode())
    for source in sources:
        digest.update((package / source).read_bytes())
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "jaxsearch-tests")
    return root / f"tiny-searcher-{digest.hexdigest()[:16]}"


def _write_corpus(world, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for passage in world.passages:
            f.write(json.dumps({"id": passage.id, "contents": passage.contents}) + "\n")


def _save_params(params, path: str) -> None:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    arrays = {jax.tree_util.keystr(key): np.asarray(value) for key, value in flat}
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _load_params(config: qwen2.Qwen2Config, path: Path):
    shapes = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))
    with np.load(path) as arrays:
        return jax.tree_util.tree_map_with_path(
            lambda key, _: jnp.asarray(arrays[jax.tree_util.keystr(key)]), shapes
        )
