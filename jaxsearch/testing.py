"""The tiny trained searcher that the tests and benches share: a tiny Qwen2 fine-tuned (`rl.sft.sft_train`) on
the tiny synthetic world's Search-R1 trajectories, a model that really searches, for tests of the rollout code.

    config, params, tokenizer, world, retriever = train_tiny_searcher()

It is cached on disk (see `train_tiny_searcher`); the tests give each session a fresh cache (tests/conftest.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxsearch.files import atomic_write, atomic_write_text
from jaxsearch.models import qwen2
from jaxsearch.rl.sft import sft_train

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
    from jaxsearch.agent import sft_traces as sft_data
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
    sources = [p for d in ("models", "data", "agent") for p in sorted((package / d).rglob("*.py"))]
    digest = hashlib.sha256(json.dumps([seed, steps, TINY_SEARCHER]).encode())
    for source in sources + [package / "rl" / "sft.py", package / "testing.py"]:
        digest.update(source.read_bytes())
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
