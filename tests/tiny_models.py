"""Tiny model configs and jitted model calls shared by the tests, so the same architecture literal is not
repeated in every file."""

import jax
import numpy as np

from jaxsearch.models import qwen2

# The model functions jitted (config static; token_logprobs' return_entropy and temperature too): eager, each of
# a tiny model's ~150 ops compiles apart for every new shape and a call costs seconds.
FORWARD = jax.jit(qwen2.forward, static_argnums=0)
INIT = jax.jit(qwen2.init_params, static_argnums=0)
LOGPROBS = jax.jit(qwen2.token_logprobs, static_argnums=0, static_argnames=("return_entropy", "temperature"))


def tiny_qwen2_config(vocab_size: int, **overrides) -> qwen2.Qwen2Config:
    """A 1-layer, 32-wide Qwen2 (4 query heads of 8 dims, 2 kv heads, MLP 64): fast on CPU, yet exercises GQA.

    `overrides` replace any Qwen2Config field, e.g. num_hidden_layers=2 or logprob_chunk=8.
    """
    fields = dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
    )
    fields.update(overrides)
    return qwen2.Qwen2Config(vocab_size=vocab_size, **fields)


def numpy_logprobs(config, params, tokens, attn, temperature=1.0):
    """log p(tokens[b, t] | tokens[b, :t]) from the model's logits (jitted forward) by a float64 numpy
    log-softmax: [B, T], 0 at t = 0."""
    logits = np.asarray(FORWARD(config, params, tokens, attn), np.float64)
    logits = logits / temperature
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    out = np.zeros(tokens.shape)
    out[:, 1:] = np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    return out


def save_tiny_searcher(directory):
    """The tiny trained searcher (`testing.train_tiny_searcher`, cached) written under `directory` as a params
    checkpoint `ckpt/`, its `tokenizer.json` and its world's `test.jsonl`, for launchers to read.
    Returns (config, params, tokenizer, world, retriever)."""
    from jaxsearch.models import orbax_io
    from jaxsearch.data import qa
    from jaxsearch.testing import train_tiny_searcher

    config, params, tokenizer, world, retriever = searcher = train_tiny_searcher()
    orbax_io.save_params(str(directory / "ckpt"), config, params)
    tokenizer.save(directory / "tokenizer.json")
    qa.write_jsonl(world.questions["test"], directory / "test.jsonl")
    return searcher
