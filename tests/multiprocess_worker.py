"""One process of tests/test_multiprocess.py, and the scenario both sides run.

    python tests/multiprocess_worker.py PROCESS_ID PORT OUT_DIR     # env: XLA_FLAGS device count 4

Two such processes join through `jax.distributed` on 127.0.0.1:PORT into one 8-device mesh (fsdp=4 x
tensor=2: params, batches and the gradient reduction span both processes) and run `scenario`: EKA episode
rollouts (sampled and greedy) with an in-memory retriever, retrieval split across the processes, one GRPO
train step, both kinds of orbax checkpoint and an HF safetensors export into OUT_DIR. Process 0 writes the host results to OUT_DIR/results.npz. The test runs the
same `scenario` in its own single process (8 devices) as the reference.
"""

from __future__ import annotations

import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsearch import checkpoint, multihost, parallel
from jaxsearch.models import orbax_io
from jaxsearch.models.word_tokenizer import WordTokenizer
from jaxsearch.models import hf_io, qwen2
from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.host_split import HostSplitRetriever
from jaxsearch.rl import advantages
from jaxsearch.rl import train_step as ts
from jaxsearch.agent.engine import AgentEngine, EpisodeConfig
from jaxsearch.agent import sampler as S
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.models.sharding import param_shardings
from test_train_step import CONFIG, make_batch
from tiny_models import tiny_qwen2_config

MESH = {"fsdp": 4, "tensor": 2}
GROUP = 4  # GRPO group size: 8 rows = 2 questions x 4
DOCS = [
    Doc("d0", "Velmar", "Velmar is a river town founded by the guild of glassmakers."),
    Doc("d1", "Orsk", "Orsk lies north of Velmar and trades salt and copper."),
    Doc("d2", "Tarin Vale", "Tarin Vale was the birthplace of the astronomer Ilse Marr."),
    Doc("d3", "Ilse Marr", "Ilse Marr mapped the comets of the northern sky from Orsk."),
]
QUESTIONS = ["Who founded Velmar?", "Where was Ilse Marr born?", "What does Orsk trade?", "Where is Orsk?"]


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


class WordOverlapRetriever:
    """Top-k of DOCS by shared lower-case words with the query (ties by doc order)."""

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        out = []
        for q in queries:
            scores = [len(words(q) & words(d.title + " " + d.text)) for d in DOCS]
            order = sorted(range(len(DOCS)), key=lambda i: (-scores[i], i))[:k]
            out.append([DOCS[i] for i in order])
        return out


def host_leaves(tree) -> list[np.ndarray]:
    """Every leaf's global value, in `tree_leaves` order (a collective with several processes)."""
    return [multihost.to_host(x) for x in jax.tree_util.tree_leaves(tree)]


def init_params(config, mesh):
    shardings = param_shardings(config, mesh)
    return jax.jit(lambda k: qwen2.init_params(config, k), out_shardings=shardings)(jax.random.PRNGKey(0))


def episode_case(mesh) -> dict:
    """EKA rollouts of 4 questions (P0 from the retriever, turns that end at their budget, invalid-action hints
    appended): one sampled at temperature 1, one greedy. The sampler shards the rows over the mesh, as the
    trainer's does, so each process decodes rows whose tokens the other one also needs."""
    protocol = get_protocol("eka")
    retriever = WordOverlapRetriever()
    texts = [d.text for d in DOCS] + QUESTIONS + [protocol.user_prompt("q?", "<knowledge>k</knowledge>")]
    tok = WordTokenizer.build(texts + [protocol.invalid_hint(), 'Doc 1(Title: "t") x'])
    config = tiny_qwen2_config(tok.vocab_size)
    params = init_params(config, mesh)
    table = S.StopTable.build(tok, protocol.stop_strings, [tok.eos_id], config.vocab_size)
    limits = EpisodeConfig(
        max_turns=2, max_segment_tokens=12, max_obs_tokens=512, initial_k=2, scheduler="lockstep"
    )
    out = {}
    for name, temperature in (("sampled", 1.0), ("greedy", 0.0)):
        smp = S.Sampler(
            config, table, cache_len=512, max_segment=12, sampling=S.SamplingParams(temperature), mesh=mesh
        )
        traj = AgentEngine(tok, protocol, retriever, smp, limits).rollout(params, QUESTIONS, 1)
        for key in ("tokens", "loss_mask", "logprobs", "turns"):
            out[f"episode/{name}/{key}"] = getattr(traj, key)
    return out


def retrieval_case() -> dict:
    """Five queries through `HostSplitRetriever` (split 3 + 2 over two processes, results all-gathered)."""
    queries = QUESTIONS + ["salt and copper"]
    docs = HostSplitRetriever(WordOverlapRetriever()).search(queries, 2)
    return {"retrieval/ids": np.array([[d.id for d in row] for row in docs])}


def train_case(mesh):
    """One GRPO step (2 micro-batches, clipped SGD) on a fixed batch; old log-probs from the sharded logprob fn.

    Returns (host results, the new TrainState on the mesh)."""
    params = init_params(CONFIG, mesh)
    batch = make_batch(b=8, t=24, seed=5)
    logprob_fn = ts.make_logprob_fn(CONFIG, mesh, params, batch)
    old = logprob_fn(params, batch["tokens"], batch["attention_mask"]) * batch["attention_mask"]
    scores = np.random.default_rng(6).integers(0, 2, 8).astype(np.float32)
    adv = np.asarray(advantages.get_advantage_fn("grpo")(jnp.asarray(scores), GROUP))
    batch = dict(batch, old_logprobs=old.astype(np.float32), advantages=adv)
    loss_cfg = ts.LossConfig(kl_coef=0.01, entropy_coef=0.01, micro_batches=2)
    # SGD, not the trainer's AdamW: Adam's first step is lr * g / |g| per element, which turns float noise in
    # (near-)zero gradients (the key bias's is exactly 0) into +-lr; SGD keeps a reduction-order difference small
    optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.1, momentum=0.9))
    state = ts.init_state(params, optimizer, mesh)
    update = ts.make_train_step(
        ts.policy_loss_fn(CONFIG, loss_cfg),
        loss_cfg.agg_mode,
        loss_cfg.micro_batches,
        optimizer,
        mesh,
        state,
        batch,
    )
    state, metrics = update(state, batch)
    out = {
        "train/old_logprobs": old,
        **{f"train/{k}": np.asarray(jax.device_get(metrics[k])) for k in metrics},
    }
    out.update({f"train/params/{i}": x for i, x in enumerate(host_leaves(state.params))})
    return out, state


def scenario(mesh, out_dir: str | None = None):
    """All cases on `mesh`; with `out_dir`, also save the trained state (TrainCheckpointer, step 1) and its
    params (save_params) there. Returns (host results, the trained TrainState)."""
    results = episode_case(mesh)
    results.update(retrieval_case())
    train, state = train_case(mesh)
    results.update(train)
    if out_dir is not None:
        ckpt = checkpoint.TrainCheckpointer(os.path.join(out_dir, "train"), save_every=1)
        ckpt.save(1, {"policy": state}, {"iterator": {"position": 8}}, force=True)
        ckpt.wait()
        ckpt.close()
        orbax_io.save_params(os.path.join(out_dir, "params"), CONFIG, state.params)
        hf_io.save_hf(CONFIG, state.params, os.path.join(out_dir, "hf"))
    return results, state


def main(process_id: int, port: int, out_dir: str) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    assert jax.device_count() == 8 and jax.local_device_count() == 4, jax.devices()
    results, _ = scenario(parallel.make_mesh(MESH), out_dir)
    if jax.process_index() == 0:
        np.savez(os.path.join(out_dir, "results.npz"), **results)
    multihost.sync("multiprocess_worker_done")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
