"""The attention implementations of prefill and training (`attention.IMPLS`, `Qwen2Config.attention_impl`):
jax.nn.dot_product_attention ("xla") against a float64 numpy attention and against the reference, forward and
gradient, under padding, GQA and causal masks; the cuDNN wrapper's padding of odd lengths; "auto" on CPU; the
decode step left as it is; and the config key's validation."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsearch.config import ConfigError, RunConfig
from jaxsearch.models import attention, qwen2
from tiny_models import tiny_qwen2_config

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the configs package
from configs import tiny_cpu  # noqa: E402


def _numpy_attention(q, k, v, mask):
    """float64 softmax attention; q [B, T, H, D], k [B, K, D, S], v [B, K, S, D], mask [B, T, S]. A query whose
    keys are all masked averages every key's value uniformly (what `attend` documents for padding queries)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k.transpose(0, 3, 1, 2), v.swapaxes(1, 2)))
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)  # head j reads kv head j // rep
    scores = np.einsum("bthd,bshd->bths", q, k) / np.sqrt(q.shape[-1])
    mask = np.asarray(mask)[:, :, None, :]
    scores = np.where(mask.any(-1, keepdims=True), np.where(mask, scores, -np.inf), 0.0)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bths,bshd->bthd", probs, v)


def _inputs(t, s, heads, kv_heads, seed=0, d=8, b=3):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, t, heads, d)).astype(np.float32) * 2
    k, v = (rng.normal(size=(b, kv_heads, s, d)).astype(np.float32) for _ in range(2))
    return q, np.ascontiguousarray(k.swapaxes(2, 3)), v  # keys [B, K, D, S]


def _training_mask(t):
    """causal & key padding as `qwen2.hidden_states` builds it: row 0 left-padded by 3 (its first 3 queries
    see no key), row 1 right-padded by 2, row 2 unpadded."""
    valid = np.ones((3, t), bool)
    valid[0, :3] = False
    valid[1, -2:] = False
    return np.tril(np.ones((t, t), bool))[None] & valid[:, None, :]


def _cache_mask(t, s):
    """`qwen2.extend`'s mask: row b's chunk of t queries appended after lengths[b] cached keys, query i at
    slot lengths[b] + i seeing slots <= its own (row 2's last 2 entries skipped: they see slot 0 only)."""
    lengths = np.array([0, 5, s - t])
    slot = lengths[:, None] + np.arange(t)[None]
    slot[2, -2:] = 0
    return np.arange(s)[None, None, :] <= slot[:, :, None]


MASKS = {"training": lambda t, s: _training_mask(t), "cache": _cache_mask}


def test_xla_attention_equals_numpy_and_reference():
    """Forward: "xla" and "reference" are the float64 softmax attention (padding queries included), for kv
    heads shared by 2 or 4 query heads or none, whether the queries go at once or in chunks of 4 (T not a
    multiple)."""
    for heads, kv_heads, kind, t, s, chunk in [
        (4, 2, "training", 9, 9, 0),
        (4, 1, "cache", 6, 16, 4),
        (4, 4, "training", 9, 9, 4),
    ]:
        q, k, v = _inputs(t, s, heads, kv_heads, seed=heads * 10 + kv_heads + t)
        mask = MASKS[kind](t, s)
        want = _numpy_attention(q, k, v, mask)
        for impl in ("xla", "reference"):
            out = jax.jit(lambda *a: attention.attend(*a, chunk=chunk, impl=impl))(q, k, v, mask)
            np.testing.assert_allclose(np.asarray(out), want, atol=3e-6, err_msg=f"{impl} {kind} {kv_heads}")


def test_xla_attention_gradient_equals_reference():
    """Backward: the gradients of a weighted sum of the output with respect to q, k and v are the reference's
    (queries at once and in chunks), and the reference's match central finite differences of the float64
    numpy attention at a few entries."""
    for kind, t, s, chunk in [("training", 9, 9, 4), ("cache", 6, 16, 0)]:
        q, k, v = _inputs(t, s, 4, 2, seed=t + s)
        mask = MASKS[kind](t, s)
        w = np.random.default_rng(1).normal(size=q.shape).astype(np.float32)

        def grads(impl):
            f = lambda q, k, v: jnp.sum(attention.attend(q, k, v, mask, chunk, impl) * w)  # noqa: E731
            return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)

        ref = grads("reference")
        for a, b in zip(grads("xla"), ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5, err_msg=kind)
        eps, x64 = 1e-4, [np.asarray(x, np.float64) for x in (q, k, v)]
        for arg, index in [(0, (0, 5, 1, 3)), (1, (1, 0, 4, 2)), (2, (0, 1, 5, 0)), (1, (0, 1, 2, 1))]:
            plus, minus = [x.copy() for x in x64], [x.copy() for x in x64]
            plus[arg][index] += eps
            minus[arg][index] -= eps
            diff = np.sum(_numpy_attention(*plus, mask) * w) - np.sum(_numpy_attention(*minus, mask) * w)
            np.testing.assert_allclose(float(ref[arg][index]), diff / (2 * eps), atol=1e-4, rtol=1e-3)


def test_cudnn_wrapper_pads_odd_lengths_and_crops(monkeypatch):
    """The cuDNN call (no GPU here: jax.nn.dot_product_attention's XLA form stands in for it) gets even T and
    S, the pad key masked and the pad query dropped, so forward and gradient are the reference's."""
    real = jax.nn.dot_product_attention
    seen = []

    def stand_in(q, k, v, mask=None, implementation=None):
        assert implementation == "cudnn" and q.shape[1] % 2 == 0 and k.shape[1] % 2 == 0
        seen.append((q.shape[1], k.shape[1]))
        return real(q, k, v, mask=mask)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    q, k, v = _inputs(7, 11, 4, 2, seed=3)
    mask = _cache_mask(7, 11)
    w = np.random.default_rng(2).normal(size=q.shape).astype(np.float32)

    def run(impl):
        f = lambda q, k, v: jnp.sum(attention.attend(q, k, v, mask, 0, impl) * w)  # noqa: E731
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, v)

    (value, grads), (ref_value, ref_grads) = run("cudnn"), run("reference")
    assert seen and set(seen) == {(8, 12)}
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


def test_auto_is_the_reference_on_cpu_and_an_unknown_impl_is_named():
    """On a CPU backend "auto" resolves to the reference for every dtype; cudnn only where it applies."""
    assert jax.default_backend() == "cpu"
    for dtype in (jnp.float32, jnp.bfloat16):
        assert attention.resolve_impl("auto", dtype, 64) == "reference"
    assert attention.resolve_impl("xla", jnp.float32, 64) == "xla"
    with pytest.raises(ValueError, match="'flash'"):
        attention.resolve_impl("flash", jnp.float32, 64)
    with pytest.raises(ValueError, match="attention_impl='flash'"):
        tiny_qwen2_config(64, attention_impl="flash")
    cfg = tiny_cpu.get_config()
    assert cfg.model.attention_impl == "auto"  # the portable default every config inherits from base
    cfg.model.attention_impl = "flash"
    with pytest.raises(ConfigError, match=r"config\.model\.attention_impl='flash': expected one of"):
        RunConfig.from_dict(cfg)


def test_model_follows_the_impl_in_training_and_prefill_but_not_in_decode():
    """A 1-layer Qwen2 (random params, left- and right-padded rows): token_logprobs with attention_impl "xla"
    (queries chunked by 4) and a prefill into the cache give the reference's log-probs, logits and cache; a
    decode step (one query per row) traces to the same program whatever the impl (the sampler's own form)."""
    config = tiny_qwen2_config(64, attention_impl="reference")
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))
    params = jax.tree.map(
        lambda x: (rng.normal(size=x.shape) * 0.2 + (x.ndim == 1)).astype(np.float32), shapes
    )
    ids = rng.integers(1, 64, (3, 10)).astype(np.int32)
    mask = np.ones((3, 10), np.int32)
    mask[0, :4] = 0  # left padding
    mask[1, 8:] = 0  # right padding
    xla = config.replace(attention_impl="xla")

    logprobs = jax.jit(qwen2.token_logprobs, static_argnums=0)
    ref = logprobs(config, params, ids, mask, np.roll(ids, -1, axis=1))
    out = logprobs(xla.replace(attention_chunk=4), params, ids, mask, np.roll(ids, -1, axis=1))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5)

    prefill = jax.jit(qwen2.prefill, static_argnums=(0, 4))
    logits, cache = prefill(config, params, ids, mask, 16)
    xla_logits, xla_cache = prefill(xla, params, ids, mask, 16)
    np.testing.assert_allclose(np.asarray(xla_logits), np.asarray(logits), atol=2e-5)
    for a, b in zip(jax.tree.leaves(xla_cache), jax.tree.leaves(cache)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)

    token = jnp.asarray(ids[:, -1])
    for chunk in (0, 512):
        programs = {
            str(
                jax.make_jaxpr(
                    lambda p, c: qwen2.decode_step(cfg.replace(attention_chunk=chunk), p, c, token)
                )(params, cache)
            )
            for cfg in (config, xla, config.replace(attention_impl="cudnn"))
        }
        assert len(programs) == 1
