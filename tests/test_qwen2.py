"""Qwen2 in Flax against transformers' Qwen2ForCausalLM on the same random weights."""

import functools

import numpy as np
import pytest
import torch
from transformers import Qwen2Config as HFConfig
from transformers import Qwen2ForCausalLM

import jax
import jax.extend.core  # noqa: F401  (jaxprs_in_params)
import jax.numpy as jnp

from jaxsearch.models import attention, hf_io, qwen2
from jaxsearch.models.sharding import param_shardings
from hf_reference import TINY_CONFIGS, hf_logits, left_padded_batch, make_hf_model
from tiny_models import tiny_qwen2_config

# the sharding tests' model: 16 wide (4 heads of 4 dims, 2 kv heads), MLP 24, a 32-token vocabulary
SHARDED_TINY = tiny_qwen2_config(32, hidden_size=16, intermediate_size=24)

# The model's functions jitted, the config static: op by op (eager), one tiny model's gradient took ~30 s of a
# 2-core machine, jitted a few seconds.
forward = jax.jit(qwen2.forward, static_argnums=0)
prefill = jax.jit(qwen2.prefill, static_argnums=(0, 4))
extend = jax.jit(qwen2.extend, static_argnums=0)
extend_over_span = jax.jit(qwen2.extend_over_span, static_argnums=0)
decode_step = jax.jit(qwen2.decode_step, static_argnums=0)
token_logprobs = jax.jit(qwen2.token_logprobs, static_argnums=0, static_argnames="return_entropy")


@functools.partial(jax.jit, static_argnums=0)
def mean_logprob_grad(config, params, ids, mask):
    """Gradient of the mean next-token log-prob (targets: `ids` shifted left by one) over `params`."""
    return jax.grad(lambda p: qwen2.token_logprobs(config, p, ids, mask, jnp.roll(ids, -1, 1)).mean())(params)


@pytest.fixture(scope="module", params=sorted(TINY_CONFIGS))
def tiny(request, tmp_path_factory):
    """(name, transformers model, our config, our params loaded through load_hf from its save)."""
    model = make_hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    config, params = hf_io.load_hf(str(path))
    return request.param, model, config, params


def test_logits_match_transformers_left_padded(tiny):
    _, model, config, params = tiny
    ids, mask = left_padded_batch(config.vocab_size, [12, 7, 3, 12], seed=1)
    ref = hf_logits(model, ids, mask)
    ours = np.asarray(forward(config, params, ids, mask))
    valid = mask.astype(bool)
    assert np.abs(ours - ref)[valid].max() <= 1e-4
    # a left-padded row equals the same row unpadded
    short = np.asarray(forward(config, params, ids[2:3, -3:], mask[2:3, -3:]))
    np.testing.assert_allclose(ours[2, -3:], short[0], atol=1e-5)


def test_config_read_from_json_matches(tiny):
    name, model, config, _ = tiny
    expect = TINY_CONFIGS[name]
    assert config.rope_theta == expect["rope_theta"]
    assert config.tie_word_embeddings == expect["tie_word_embeddings"]
    assert config.head_dim == expect.get("head_dim", expect["hidden_size"] // expect["num_attention_heads"])
    assert config.num_params() == sum(p.numel() for p in model.parameters())


def test_rope_theta_read_from_top_level_or_rope_parameters():
    base = dict(
        vocab_size=10, hidden_size=8, intermediate_size=16, num_attention_heads=2, num_hidden_layers=1
    )
    assert qwen2.Qwen2Config.from_hf_dict({**base, "rope_theta": 123.0}).rope_theta == 123.0
    assert (
        qwen2.Qwen2Config.from_hf_dict({**base, "rope_parameters": {"rope_theta": 77.0}}).rope_theta == 77.0
    )


def test_presets_param_counts_equal_transformers():
    for name, config in qwen2.PRESETS.items():
        if config.family != "qwen2":  # the Qwen3 presets: tests/test_qwen3.py, against Qwen3ForCausalLM
            continue
        hf = {k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "torch_dtype")}
        with torch.device("meta"):
            model = Qwen2ForCausalLM(HFConfig(**hf))
        assert config.num_params() == sum(p.numel() for p in model.parameters()), name
    assert qwen2.preset("qwen2.5-7b").num_params() == 7_615_616_512  # the published count
    with pytest.raises(KeyError, match="qwen2.5-7b"):
        qwen2.preset("qwen2.5-8b")


def _check_greedy_decode_equals_full_forward(config, params, lengths, seed, steps, max_len):
    """Prefill left-padded prompts of `lengths`, decode `steps` greedy tokens in a cache of `max_len` slots,
    compare every step's logits to a full forward over the sequence so far."""
    ids, mask = left_padded_batch(config.vocab_size, lengths, seed=seed)
    logits, cache = prefill(config, params, ids, mask, max_len)
    seq, seq_mask, step_logits = ids, mask, [np.asarray(logits)]
    for _ in range(steps):
        tok = np.asarray(jnp.argmax(logits, -1))
        seq = np.concatenate([seq, tok[:, None]], 1)
        seq_mask = np.concatenate([seq_mask, np.ones_like(tok)[:, None]], 1)
        logits, cache = decode_step(config, params, cache, tok)
        step_logits.append(np.asarray(logits))
    full = np.asarray(forward(config, params, seq, seq_mask))
    t0 = ids.shape[1]
    for i, lg in enumerate(step_logits):
        np.testing.assert_allclose(lg, full[:, t0 - 1 + i], atol=2e-4, err_msg=f"step {i}")
    np.testing.assert_array_equal(np.asarray(cache.lengths), mask.sum(1) + steps)


def test_kv_cache_decode_equals_full_forward(tiny):
    """Prefill left-padded prompts, decode 20 greedy tokens, compare every step to a full forward."""
    _, _, config, params = tiny
    _check_greedy_decode_equals_full_forward(config, params, [9, 4, 6], seed=2, steps=20, max_len=40)


def test_extend_appends_at_each_rows_own_offset(tiny):
    """Rows append chunks of different lengths (padding anywhere); inactive rows do not move."""
    _, _, config, params = tiny
    rng = np.random.default_rng(3)
    v = config.vocab_size
    prompts = [rng.integers(0, v, n) for n in (5, 3, 7)]
    chunks = [rng.integers(0, v, n) for n in (4, 0, 2)]
    nexts = [rng.integers(0, v, 1) for _ in range(3)]
    ids, mask = left_padded_batch(v, [5, 3, 7])
    for b, p in enumerate(prompts):
        ids[b, ids.shape[1] - len(p) :] = p
    _, cache = prefill(config, params, ids, mask, 32)
    chunk_ids = np.zeros((3, 6), np.int64)
    chunk_mask = np.zeros((3, 6), np.int64)
    chunk_ids[0, [0, 2, 3, 5]] = chunks[0]
    chunk_mask[0, [0, 2, 3, 5]] = 1  # holes inside the chunk
    chunk_ids[2, 4:] = chunks[2]
    chunk_mask[2, 4:] = 1  # left padded
    _, cache = extend(config, params, cache, chunk_ids, chunk_mask)
    logits, cache = decode_step(config, params, cache, np.concatenate(nexts))
    for b in range(3):
        seq = np.concatenate([prompts[b], chunks[b], nexts[b]])[None]
        ref = np.asarray(forward(config, params, seq, np.ones_like(seq)))[0, -1]
        np.testing.assert_allclose(np.asarray(logits[b]), ref, atol=2e-4, err_msg=f"row {b}")
    assert list(np.asarray(cache.lengths)) == [5 + 4 + 1, 3 + 0 + 1, 7 + 2 + 1]


def test_extend_of_a_caches_first_rows_keeps_the_others(tiny):
    """Tokens for B rows appended to a cache of more rows (the decode slots' prefix): the first B rows get
    what a B-row cache gets, over a span and not; the rows past them keep every bit."""
    _, _, config, params = tiny
    rng = np.random.default_rng(11)
    for s in (64, 1024):  # one span, spans
        shape = (config.num_hidden_layers, 5, config.num_key_value_heads, s, config.head_dim)
        k, v = (tuple(jnp.asarray(rng.normal(size=shape), jnp.float32)) for _ in range(2))
        k = tuple(a.swapaxes(2, 3) for a in k)  # keys [B, K, D, S]
        full = qwen2.KVCache(k=k, v=v, lengths=jnp.asarray([7, 3, 20, 9, 1], jnp.int32))
        head = jax.tree.map(lambda a: a[:2], full)
        ids = rng.integers(0, config.vocab_size, (2, 6))
        logits, new = extend_over_span(config, params, full, ids)
        ref_logits, ref = extend_over_span(config, params, head, ids)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(new.lengths), [13, 9, 20, 9, 1])
        for name in ("k", "v"):
            for a, b, old in zip(getattr(new, name), getattr(ref, name), getattr(full, name)):
                np.testing.assert_allclose(np.asarray(a[:2]), np.asarray(b), atol=1e-5, rtol=1e-5)
                np.testing.assert_array_equal(np.asarray(a[2:]), np.asarray(old[2:]))


def test_extend_over_a_span_equals_extend_and_keeps_the_slots_past_it(tiny):
    """Appending over the first span of a 1,024-slot cache that holds the rows' keys (128, 256, 512 or all
    slots) gives extend's logits and cache; slots past the rows' keys keep what they held, bit for bit."""
    _, _, config, params = tiny
    rng = np.random.default_rng(7)
    s, kvh, d = 1024, config.num_key_value_heads, config.head_dim
    cache = qwen2.init_cache(config, 2, s)
    cache = (
        cache.replace(  # every slot holds something, so a slot read or written past a row's keys would show
            k=tuple(jnp.asarray(rng.normal(size=(2, kvh, d, s)), jnp.float32) for _ in cache.k),
            v=tuple(jnp.asarray(rng.normal(size=(2, kvh, s, d)), jnp.float32) for _ in cache.v),
        )
    )
    ids = rng.integers(0, config.vocab_size, (2, 16))
    mask = np.ones((2, 16), np.int32)
    mask[1, 10:] = 0
    for lengths in ([100, 3], [200, 50], [480, 10], [1000, 0]):  # spans 128, 256, 512, 1024
        before = cache.replace(lengths=jnp.asarray(lengths, jnp.int32))
        logits, new = extend_over_span(config, params, before, ids, mask)
        ref_logits, ref = extend(config, params, before, ids, mask)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(new.lengths), np.asarray(ref.lengths))
        for name in ("k", "v"):
            for a, b, old in zip(getattr(new, name), getattr(ref, name), getattr(before, name)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
                slots = (lambda x, r, e: x[r, ..., e:]) if name == "k" else (lambda x, r, e: x[r, :, e:])
                for row, end in enumerate(np.asarray(ref.lengths)):  # keys [B, K, D, S], values [B, K, S, D]
                    np.testing.assert_array_equal(np.asarray(slots(a, row, end)), np.asarray(slots(old, row, end)))


def _numpy_attention(q, k, v, mask):
    """float64 reference: q [B, T, H, D], k [B, K, D, S], v [B, K, S, D], mask [B, T, S] -> [B, T, H, D]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k.transpose(0, 3, 1, 2), v.swapaxes(1, 2)))
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)  # head j reads kv head j // rep
    scores = np.einsum("bthd,bshd->bths", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(np.asarray(mask)[:, :, None, :], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bths,bshd->bthd", probs, v)


@pytest.mark.parametrize("cache", [1024, 1152])
def test_cpu_decode_attention_equals_numpy_and_a_rows_bits_are_its_own(cache):
    """The CPU decode attention (one query per row over the shortest span of the cache that holds every row's
    keys) is softmax attention (float64 reference), and a row's output is the same bits alone or among other
    rows, whatever span their longest row picks, and the same as over the whole cache: what decode slots'
    equality with the lockstep rollout rests on (their batches differ)."""
    rng = np.random.default_rng(cache)
    b, h, kvh, d = 50, 4, 2, 16
    q = rng.normal(size=(b, 1, h, d)).astype(np.float32) * 3
    k, v = (rng.normal(size=(b, kvh, cache, d)).astype(np.float32) for _ in range(2))
    k = np.ascontiguousarray(k.swapaxes(2, 3))  # keys [B, K, D, S]
    attend = jax.jit(attention.attend_decode_cpu)
    whole = jax.jit(functools.partial(attention._attend_one_query, exact=True))  # no span: every slot
    for longest in (60, 129, 700, cache):  # spans 128, 256, 1024 and the whole cache
        lengths = rng.integers(1, longest + 1, b)
        lengths[7] = longest
        mask = np.arange(cache)[None, None, :] < lengths[:, None, None]
        out = np.asarray(attend(q, k, v, mask))
        # fp32 scores of ~1,000 keys (q scaled 3x): rounding the scores alone to fp32, the rest in float64, moves
        # the output by up to 1.8e-6 at these inputs (measured), so the bound is twice that, not a tighter luck
        np.testing.assert_allclose(out, _numpy_attention(q, k, v, mask), atol=4e-6)
        np.testing.assert_array_equal(np.asarray(whole(q, k, v, mask)), out)
        for rows in (slice(0, 1), slice(3, 6), slice(8, 16), slice(10, 11), slice(48, 50)):
            alone = attend(q[rows], k[rows], v[rows], mask[rows])
            np.testing.assert_array_equal(np.asarray(alone), out[rows])


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 3), (4, 1), (4, 4)])
def test_cpu_decode_attention_of_a_short_cache_equals_numpy(heads, kv_heads):
    """Below SPANS_FROM slots the CPU decode attention reads the whole cache in one go (scores and the
    values' weighted sum each one batched matmul over the heads' own slots): softmax attention (float64 reference) for every
    grouping of query heads over kv heads, including one kv head and none shared."""
    rng = np.random.default_rng(heads * 10 + kv_heads)
    b, d, cache = 16, 16, 200
    q = rng.normal(size=(b, 1, heads, d)).astype(np.float32) * 3
    k, v = (rng.normal(size=(b, kv_heads, cache, d)).astype(np.float32) for _ in range(2))
    k = np.ascontiguousarray(k.swapaxes(2, 3))  # keys [B, K, D, S]
    lengths = rng.integers(1, cache + 1, b)
    mask = np.arange(cache)[None, None, :] < lengths[:, None, None]
    out = np.asarray(jax.jit(attention.attend_decode_cpu)(q, k, v, mask))
    np.testing.assert_allclose(out, _numpy_attention(q, k, v, mask), atol=2e-6)


def test_kv_cache_decode_over_a_long_cache_equals_full_forward(tiny):
    """The same over a 512-slot cache with prompts of up to 250 tokens (most of a decode step's keys masked)."""
    _, _, config, params = tiny
    _check_greedy_decode_equals_full_forward(config, params, [120, 5, 250], seed=5, steps=12, max_len=512)


def test_token_logprobs_equal_numpy_log_softmax(tiny):
    _, _, config, params = tiny
    config = config.replace(logprob_chunk=4)  # several chunks plus a ragged tail over T=11
    ids, mask = left_padded_batch(config.vocab_size, [11, 6], seed=4)
    targets = np.roll(ids, -1, axis=1)
    logits = np.asarray(forward(config, params, ids, mask), np.float64)
    logp_ref = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    picked = np.take_along_axis(logp_ref, targets[..., None], -1)[..., 0]
    entropy = -(np.exp(logp_ref) * logp_ref).sum(-1)
    logp, ent = token_logprobs(config, params, ids, mask, targets, return_entropy=True)
    valid = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(logp)[valid], picked[valid], atol=1e-4)
    np.testing.assert_allclose(np.asarray(ent)[valid], entropy[valid], atol=1e-4)


def test_bf16_forward_close_to_fp32(tiny):
    _, _, config, params = tiny
    ids, mask = left_padded_batch(config.vocab_size, [10, 5], seed=5)
    ref = np.asarray(forward(config, params, ids, mask))
    cfg16 = config.replace(dtype="bfloat16", param_dtype="bfloat16")
    p16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    out = np.asarray(forward(cfg16, p16, ids, mask))
    assert out.dtype == np.float32  # logits come back in fp32
    valid = mask.astype(bool)
    err = np.abs(out - ref)[valid]
    scale = np.abs(ref[valid]).max()
    assert err.max() <= 0.05 * scale, (err.max(), scale)  # bf16 has an 8-bit mantissa
    assert err.max() > 0  # it really ran in bf16


def test_remat_gives_same_gradients(tiny):
    _, _, config, params = tiny
    ids, mask = left_padded_batch(config.vocab_size, [8, 5], seed=6)

    g = mean_logprob_grad(config, params, ids, mask)
    g_remat = mean_logprob_grad(config.replace(remat=True), params, ids, mask)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_remat)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_chunked_attention_matches_transformers_and_dense_gradients(tiny):
    """Query-chunked attention (T=12 in chunks of 5: two full chunks and a padded one; left padding)
    against transformers' logits, and its gradients against the dense path's."""
    _, model, config, params = tiny
    ids, mask = left_padded_batch(config.vocab_size, [12, 7, 3, 12], seed=7)
    chunked = config.replace(attention_chunk=5)
    ours = np.asarray(forward(chunked, params, ids, mask))
    ref = hf_logits(model, ids, mask)
    valid = mask.astype(bool)
    np.testing.assert_allclose(ours[valid], ref[valid], atol=1e-4)

    g = mean_logprob_grad(config, params, ids, mask)
    g_chunked = mean_logprob_grad(chunked.replace(remat=True), params, ids, mask)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_chunked)):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_layers_equal_the_unrolled_loop(tiny, remat):
    """Layers in a lax.scan over stacked params: the same logits (and transformers'), the same gradients
    for every per-layer param."""
    _, model, config, params = tiny
    ids, mask = left_padded_batch(config.vocab_size, [9, 4, 9], seed=8)
    scanned = config.replace(scan_layers=True, remat=remat)
    ours = np.asarray(forward(scanned, params, ids, mask))
    valid = mask.astype(bool)
    np.testing.assert_allclose(ours[valid], hf_logits(model, ids, mask)[valid], atol=1e-4)

    g = mean_logprob_grad(config, params, ids, mask)
    g_scan = mean_logprob_grad(scanned, params, ids, mask)
    assert jax.tree_util.tree_structure(g) == jax.tree_util.tree_structure(g_scan)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_scan)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def _constraints(f, *args):
    """{shape: spec} of every sharding constraint in f's jaxpr, nested ones included."""
    found = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "sharding_constraint":
                found[tuple(eqn.invars[0].aval.shape)] = eqn.params["sharding"].spec
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(f)(*args).jaxpr)
    return found


def test_activation_constraints_shard_the_layers_along_the_batch():
    """Under `parallel.with_activation_sharding` (flax's logical-axis rules and jax's mesh context) the
    MLP activation [B, T, F] is constrained to the rules' spec (batch over data x fsdp, mlp over tensor),
    the output equals the unconstrained one, and outside the context the model adds no constraint at all."""
    from jaxsearch import parallel

    config = SHARDED_TINY
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    ids = np.arange(8 * 6, dtype=np.int32).reshape(8, 6) % 32
    mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})

    def fn(p, x):
        return qwen2.forward(config, p, x)

    assert _constraints(fn, params, ids) == {}
    found = _constraints(parallel.with_activation_sharding(fn, mesh), params, ids)
    P = jax.sharding.PartitionSpec
    assert found[(8, 6, 24)] == P(("data", "fsdp"), None, "tensor")  # MLP hidden: batch and mlp split
    assert found[(8, 6, 16)] == P(("data", "fsdp"), None, None)  # residual: embed's fsdp is taken by batch
    assert found[(8, 6, 4, 4)] == P(("data", "fsdp"), None, "tensor", None)  # q: heads over tensor
    # inside jit the mesh is abstract: the devices come from the inputs, here placed on the mesh
    sharded_params = jax.device_put(params, param_shardings(config, mesh))
    sharded_ids = jax.device_put(ids, parallel.batch_sharding(mesh))
    out = jax.jit(parallel.with_activation_sharding(fn, mesh))(sharded_params, sharded_ids)
    assert out.sharding.mesh.devices.size == 8
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(fn)(params, ids)), atol=1e-6)


def test_activation_constraints_replicate_what_the_mesh_does_not_divide_and_follow_the_standard_context():
    """2 kv heads over a tensor axis of 4 stay replicated (4 q heads split); a batch of 2 over fsdp 2 splits.
    The plain flax / jax context (`jax.set_mesh` + `nn.logical_axis_rules`) gives the same constraints
    as `parallel.with_activation_sharding`."""
    import flax.linen as nn

    from jaxsearch import parallel

    config = SHARDED_TINY
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    ids = np.arange(2 * 6, dtype=np.int32).reshape(2, 6) % 32
    mesh = parallel.make_mesh({"fsdp": 2, "tensor": 4})

    def fn(p, x):
        return qwen2.forward(config, p, x)

    found = _constraints(parallel.with_activation_sharding(fn, mesh), params, ids)
    P = jax.sharding.PartitionSpec
    assert found[(2, 6, 4, 4)] == P("fsdp", None, "tensor", None)  # q: 4 heads over tensor 4
    assert found[(2, 6, 2, 4)] == P("fsdp", None, None, None)  # k, v: 2 kv heads replicated
    assert found[(2, 6, 24)] == P("fsdp", None, "tensor")
    with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.DEFAULT_RULES):
        assert _constraints(fn, params, ids) == found
    assert _constraints(fn, params, ids) == {}


def test_every_param_has_logical_axes():
    config = tiny_qwen2_config(32, hidden_size=16, intermediate_size=24, num_hidden_layers=2)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    axes = qwen2.logical_axes(config)
    flat_p = jax.tree_util.tree_leaves_with_path(params)
    flat_a = dict(
        jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    )
    for path, leaf in flat_p:
        spec = flat_a[path]
        assert len(spec) == leaf.ndim, (path, spec)
    assert flat_a[next(p for p, _ in flat_p if "qkv_kernel" in str(p))] == jax.sharding.PartitionSpec(
        "embed", "kv_heads", None, "head_dim"
    )
