"""Qwen2 / Qwen2.5 / Qwen3 decoder in Flax linen, with pure functions over a params pytree.

One file holds the model (its attention in `models/attention.py`, its config and presets in
`models/qwen2_config.py`, re-exported here: `qwen2.Qwen2Config`, `qwen2.preset`): modules with
logical-axis annotations on every parameter and main activation (flax's logical-axis rules map them to a
mesh: `jaxsearch.parallel` holds the rules and enters them), and the pure entry points the rest of
jaxsearch calls:

    params = init_params(config, rng)
    logits = forward(config, params, input_ids, attention_mask)            # [B, T] -> [B, T, V]
    logp   = token_logprobs(config, params, input_ids, attention_mask, targets)   # [B, T]
    cache  = init_cache(config, batch, max_len)
    logits, cache = extend(config, params, cache, tokens, token_mask)        # prefill / decode / append

`params` is the pytree below, or `lora.with_adapters(base, adapters)`: every projection with an adapter then
adds scale * (x A) B (`models/lora.py`; the config from `lora.lora_config`).

Parameter layout (shapes; logical axes in brackets). Kernels keep heads as their own axis so they shard by
head without reshapes; q, k and v (grouped by kv head, G = H / K query heads each), and gate and up, are fused
into one matmul each, since a decode step costs per op (per kernel on a GPU) rather than per FLOP on small
models. hf_io splits them again for transformers' checkpoints.

    embed/embedding          [V, E]        (vocab, embed)
    layers_i/input_norm/scale           [E]          (norm,)
    layers_i/attn/qkv_kernel [E, K, G+2, D] (embed, kv_heads, None, head_dim)  qkv_bias [K, G+2, D] (Qwen2)
    layers_i/attn/{q,k}_norm/scale      [D]          (norm,)                                     (Qwen3)
    layers_i/attn/o_kernel   [H, D, E]     (heads, head_dim, embed)
    layers_i/post_attn_norm/scale       [E]
    layers_i/mlp/gate_up_kernel [E, 2, F]  (embed, None, mlp)
    layers_i/mlp/down_kernel [F, E]        (mlp, embed)
    final_norm/scale         [E]
    lm_head/kernel           [E, V]        (embed, vocab)    absent when embeddings are tied

The KV cache is a `KVCache` pytree: k (L arrays [B, K, D, S]), v (L arrays [B, K, S, D]) (one per layer, so
each decode step updates every layer's buffer in place; laid out so that a decode step's attention is two
plain matmuls per row and kv head, `models/attention.py`) and lengths [B]: row b holds its valid tokens in slots
[0, lengths[b]) and its next token has position lengths[b]. `extend` appends a
chunk of tokens per row (padding anywhere in the chunk is skipped), which serves prefill (empty
cache), one-token decode and appending retrieved observations at each row's own offset.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxsearch.models import lora, random_init
from jaxsearch.models.attention import attend
from jaxsearch.models.qwen2_config import PRESETS, Qwen2Config, preset  # noqa: F401 (qwen2.Qwen2Config, ...)
from jaxsearch.models.spans import cache_spans, first_span
from jaxsearch.parallel import fit_rules

Params = Any  # a nested dict of arrays


# ----------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------


def _param(module: nn.Module, name: str, shape, axes, init, dtype):
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


def _constrain(x, axes):
    """`nn.with_logical_constraint` of activation `x` by its logical `axes`, under flax's logical-axis
    rules and jax's (abstract) mesh context (`parallel.with_activation_sharding` enters both), with the
    rules fitted to x's shape (`fit_rules`). Outside that context (single device, tests): x unchanged."""
    rules = nn.get_logical_axis_rules()
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return x
    return nn.with_logical_constraint(x, axes, rules=fit_rules(axes, x.shape, mesh.shape, rules))


def _lora_delta(module: nn.Module, name: str, x):
    """scale * (dropout(x) @ A) @ B of the adapter of projection `name` ([..., in] -> [..., out]) when the
    params carry one (the "lora" collection, `lora.with_adapters`), else None. Dropout only where a "dropout"
    rng is given (a training forward)."""
    if not module.has_variable("lora", name):
        return None
    cfg = module.config
    if not cfg.lora_scale:  # adapters that would add nothing and learn nothing
        raise ValueError(
            "params carry LoRA adapters but config.lora_scale is 0: use lora.lora_config(config, spec)"
        )
    adapter = module.get_variable("lora", name)
    if cfg.lora_dropout and module.has_rng("dropout"):
        keep = jax.random.bernoulli(module.make_rng("dropout"), 1.0 - cfg.lora_dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - cfg.lora_dropout), 0).astype(x.dtype)
    dt = cfg.compute_dtype
    return ((x @ adapter["a"].astype(dt)) @ adapter["b"].astype(dt)) * jnp.asarray(cfg.lora_scale, dt)


def _plus(y, delta):
    """y + delta reshaped like y (delta None: y)."""
    return y if delta is None else y + delta.reshape(y.shape)


class RMSNorm(nn.Module):
    """x / rms(x) * scale, computed in fp32, returned in the compute dtype."""

    config: Qwen2Config

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        scale = _param(self, "scale", (x.shape[-1],), ("norm",), nn.initializers.ones, cfg.weight_dtype)
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + cfg.rms_norm_eps)
        # transformers casts back to the input dtype before multiplying by the weight
        return scale.astype(cfg.compute_dtype) * x32.astype(cfg.compute_dtype)


def rope_tables(config: Qwen2Config, positions):
    """cos, sin of shape [B, T, D] for integer positions [B, T] (rotate-half convention)."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
    """x [B, T, N, D]; cos/sin [B, T, D]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out = x.astype(jnp.float32) * cos[:, :, None] + rotated.astype(jnp.float32) * sin[:, :, None]
    return out.astype(x.dtype)


class Attention(nn.Module):
    config: Qwen2Config

    @nn.compact
    def __call__(self, x, cos, sin, mask, kv_write):
        """x [B, T, E]. kv_write(k, v) -> (k_all, v_all, extra): how the chunk's keys [B, T, K, D] meet the
        context (k_all [B, K, D, S], v_all [B, K, S, D], `attend`'s layout)."""
        cfg = self.config
        e, h, kvh, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        init = nn.initializers.normal(0.02)
        zeros, wdt = nn.initializers.zeros, cfg.weight_dtype
        g = h // kvh  # query heads per kv head
        # q, k and v in one kernel, grouped by kv head: [E, K, G + 2, D] holds kv head j's G query heads (heads
        # j*G .. j*G+G-1, transformers' GQA order), then its k, then its v; one matmul, sharded by kv head
        wqkv = _param(
            self, "qkv_kernel", (e, kvh, g + 2, d), ("embed", "kv_heads", None, "head_dim"), init, wdt
        )
        bqkv = (
            _param(self, "qkv_bias", (kvh, g + 2, d), ("kv_heads", None, "head_dim"), zeros, wdt)
            if cfg.qkv_bias
            else None
        )
        wo = _param(self, "o_kernel", (h, d, e), ("heads", "head_dim", "embed"), init, wdt)
        dt = cfg.compute_dtype
        qkv = jnp.einsum("bte,ekjd->btkjd", x, wqkv.astype(dt))
        if cfg.qkv_bias:  # Qwen2
            qkv = qkv + bqkv.astype(dt)
        b, t = x.shape[:2]
        q, k, v = qkv[:, :, :, :g].reshape(b, t, h, d), qkv[:, :, :, g], qkv[:, :, :, g + 1]
        q = _plus(q, _lora_delta(self, "q_proj", x))
        k, v = _plus(k, _lora_delta(self, "k_proj", x)), _plus(v, _lora_delta(self, "v_proj", x))
        if cfg.qk_norm:  # Qwen3: each head's q and k RMS-normalised over head_dim, before RoPE
            q, k = RMSNorm(cfg, name="q_norm")(q), RMSNorm(cfg, name="k_norm")(k)
        q = _constrain(apply_rope(q, cos, sin), ("batch", "length", "heads", "head_dim"))
        k = _constrain(apply_rope(k, cos, sin), ("batch", "length", "kv_heads", "head_dim"))
        v = _constrain(v, ("batch", "length", "kv_heads", "head_dim"))
        k_all, v_all, new_kv = kv_write(k, v)
        out = attend(q, k_all, v_all, mask, cfg.attention_chunk, cfg.attention_impl)
        # one [B*T, H*D] x [H*D, E] matmul: contracting (h, d) as two axes made XLA:CPU transpose the
        # weight on every decode step
        out = out.reshape(b, t, h * d)
        return _plus(out @ wo.astype(dt).reshape(h * d, e), _lora_delta(self, "o_proj", out)), new_kv


class MLP(nn.Module):
    config: Qwen2Config

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        e, f = cfg.hidden_size, cfg.intermediate_size
        init = nn.initializers.normal(0.02)
        w_gu = _param(self, "gate_up_kernel", (e, 2, f), ("embed", None, "mlp"), init, cfg.weight_dtype)
        w_down = _param(self, "down_kernel", (f, e), ("mlp", "embed"), init, cfg.weight_dtype)
        dt = cfg.compute_dtype
        gu = jnp.einsum("bte,ejf->btjf", x, w_gu.astype(dt))
        gate = _plus(gu[:, :, 0], _lora_delta(self, "gate_proj", x))
        up = _plus(gu[:, :, 1], _lora_delta(self, "up_proj", x))
        hidden = _constrain(nn.silu(gate) * up, ("batch", "length", "mlp"))
        down = jnp.einsum("btf,fe->bte", hidden, w_down.astype(dt))
        return _plus(down, _lora_delta(self, "down_proj", hidden))


class DecoderLayer(nn.Module):
    config: Qwen2Config

    @nn.compact
    def __call__(self, x, cos, sin, mask, kv_write):
        attn_out, new_kv = Attention(self.config, name="attn")(
            RMSNorm(self.config, name="input_norm")(x), cos, sin, mask, kv_write
        )
        x = x + attn_out
        x = x + MLP(self.config, name="mlp")(RMSNorm(self.config, name="post_attn_norm")(x))
        return _constrain(x, ("batch", "length", "embed")), new_kv


class Qwen2(nn.Module):
    """The decoder. `__call__` returns final hidden states [B, T, E] and the new KV per layer."""

    config: Qwen2Config

    def setup(self):
        cfg = self.config
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
            (cfg.vocab_size, cfg.hidden_size),
            cfg.weight_dtype,
        )
        layer_cls = nn.remat(DecoderLayer, static_argnums=(5,)) if cfg.remat else DecoderLayer
        self.layers = [layer_cls(cfg, name=f"layers_{i}") for i in range(cfg.num_hidden_layers)]
        self.final_norm = RMSNorm(cfg, name="final_norm")
        if not cfg.tie_word_embeddings:
            self.lm_head = self.param(
                "lm_head",
                nn.with_logical_partitioning(nn.initializers.normal(0.02), ("embed", "vocab")),
                (cfg.hidden_size, cfg.vocab_size),
                cfg.weight_dtype,
            )

    def __call__(self, input_ids, positions, mask, kv_writes):
        """input_ids, positions [B, T]; mask [B, T, S]; kv_writes: one callable per layer."""
        x = self.embed(input_ids)
        cos, sin = rope_tables(self.config, positions)
        new_kvs = []
        for layer, kv_write in zip(self.layers, kv_writes):
            x, new_kv = layer(x, cos, sin, mask, kv_write)
            new_kvs.append(new_kv)
        return self.final_norm(x), new_kvs

    def embed(self, input_ids):
        """input_ids [B, T] -> embeddings [B, T, E] in the compute dtype."""
        x = jnp.take(self.embedding, input_ids, axis=0).astype(self.config.compute_dtype)
        return _constrain(x, ("batch", "length", "embed"))

    def final(self, x):
        return self.final_norm(x)

    def logits(self, hidden):
        """hidden [..., E] -> logits [..., V] in fp32."""
        dt = self.config.compute_dtype
        if self.config.tie_word_embeddings:  # contract with the [V, E] table as it is: no transposed copy
            return jnp.einsum(
                "...e,ve->...v",
                hidden.astype(dt),
                self.embedding.astype(dt),
                preferred_element_type=jnp.float32,
            )
        return jnp.einsum(
            "...e,ev->...v", hidden.astype(dt), self.lm_head.astype(dt), preferred_element_type=jnp.float32
        )

    def init_all(self, input_ids):
        positions = jnp.zeros_like(input_ids)
        t = input_ids.shape[1]
        mask = jnp.ones((input_ids.shape[0], t, t), bool)
        writes = [_no_cache] * self.config.num_hidden_layers
        hidden, _ = self(input_ids, positions, mask, writes)
        return self.logits(hidden)


# ----------------------------------------------------------------------------------------------
# Pure entry points
# ----------------------------------------------------------------------------------------------


def init_params(config: Qwen2Config, rng) -> Params:
    """Random params as a plain nested dict, as the modules declare them: kernels and embeddings normal(0.02),
    biases 0, norm scales 1. The draws are `random_init`'s (compile in ~0.1 s a leaf where flax's threefry
    init took seconds; the same bits under any sharding), leaf j of the tree taking stream j of `rng`.
    Jitted (config static): eager, each op of every leaf's draw would compile apart."""
    return _init_params(config, rng)


@functools.partial(jax.jit, static_argnums=0)
def _init_params(config: Qwen2Config, rng) -> Params:
    seed = random_init.seed_word(rng)
    shapes = nn.meta.unbox(_abstract_variables(config)["params"])
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    values = []
    for j, (path, leaf) in enumerate(leaves):
        name = path[-1].key
        if name.endswith("kernel") or name in ("embedding", "lm_head"):
            values.append(random_init.normal(seed, j, leaf.shape, 0.02, leaf.dtype))
        elif name.endswith("bias") or name == "scale":
            values.append(jnp.full(leaf.shape, 0.0 if name.endswith("bias") else 1.0, leaf.dtype))
        else:
            raise ValueError(f"init_params: no initializer for {jax.tree_util.keystr(path)}")
    return jax.tree_util.tree_unflatten(treedef, values)


def _abstract_variables(config: Qwen2Config):
    """flax's variables of the model, abstract: shapes, dtypes and logical axes (`nn.Partitioned` boxes)."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    return jax.eval_shape(lambda: Qwen2(config).init(jax.random.PRNGKey(0), dummy, method=Qwen2.init_all))


def logical_axes(config: Qwen2Config) -> Params:
    """The logical axis names of every parameter: a pytree of `nn.Partitioned`-free tuples."""
    return nn.get_partition_spec(_abstract_variables(config)["params"])


def positions_from_mask(attention_mask):
    """Position ids [B, T] = number of earlier valid tokens (left padding gets position 0)."""
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)


def hidden_states(config: Qwen2Config, params: Params, input_ids, attention_mask, dropout_rng=None):
    """Final hidden states [B, T, E] of a full (cache-free) causal pass. `dropout_rng`: LoRA dropout on the
    adapters' input (params with adapters and config.lora_dropout > 0), else unused."""
    attention_mask = attention_mask.astype(bool)
    t = input_ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    mask = causal[None] & attention_mask[:, None, :]
    positions = positions_from_mask(attention_mask)
    if config.scan_layers:
        return _scanned_hidden_states(config, params, input_ids, positions, mask, dropout_rng)
    writes = [_no_cache] * config.num_hidden_layers
    rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
    hidden, _ = Qwen2(config).apply(lora.variables(params), input_ids, positions, mask, writes, rngs=rngs)
    return hidden


def _no_cache(k, v):
    """The chunk's own keys and values as the context: [B, T, K, D] -> k [B, K, D, T], v [B, K, T, D]."""
    return k.transpose(0, 2, 3, 1), v.swapaxes(1, 2), None


def _scanned_hidden_states(config: Qwen2Config, params: Params, input_ids, positions, mask, dropout_rng=None):
    """`hidden_states` with the layers in a `lax.scan` over their stacked params [L, ...] (same math).

    Unrolled, XLA may keep every layer's all-gathered weights and whole gradients alive at once (measured on
    the TPU compiler: about four fp32 copies of a layer's weights per layer); inside a scan they are
    gathered, used and reduce-scattered per iteration."""
    model, layer = Qwen2(config), DecoderLayer(config)
    x = model.apply(lora.variables(params), input_ids, method=Qwen2.embed)
    cos, sin = rope_tables(config, positions)

    def body(h, xs):
        layer_vars, i = xs
        rngs = {} if dropout_rng is None else {"dropout": jax.random.fold_in(dropout_rng, i)}
        return layer.apply(layer_vars, h, cos, sin, mask, _no_cache, rngs=rngs)[0], None

    if config.remat:
        body = jax.checkpoint(body)
    variables = lora.variables(params)  # {"params": ...[, "lora": ...]}, each stacked over the layers
    layers = [
        {c: tree[f"layers_{i}"] for c, tree in variables.items()} for i in range(config.num_hidden_layers)
    ]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
    x, _ = jax.lax.scan(body, x, (stacked, jnp.arange(config.num_hidden_layers)))
    return model.apply(lora.variables(params), x, method=Qwen2.final)


def forward(config: Qwen2Config, params: Params, input_ids, attention_mask=None):
    """Logits [B, T, V] (fp32) for input_ids [B, T]; attention_mask [B, T] (1 = token, 0 = padding).

    Positions come from the mask, so left-padded rows give the same logits as unpadded ones.
    """
    if attention_mask is None:
        attention_mask = jnp.ones_like(input_ids)
    hidden = hidden_states(config, params, input_ids, attention_mask)
    return Qwen2(config).apply(lora.variables(params), hidden, method=Qwen2.logits)


def token_logprobs(
    config: Qwen2Config,
    params: Params,
    input_ids,
    attention_mask,
    targets,
    return_entropy: bool = False,
    temperature: float = 1.0,
    dropout_rng=None,
):
    """log p(targets[b, t] | input_ids[b, :t+1]) as [B, T] fp32 (and the entropy [B, T] if asked), of the
    distribution the sampler draws from at `temperature` (logits / temperature; static).

    The LM head and log-softmax run in sequence chunks of `config.logprob_chunk` under `lax.map`, so the
    largest temporary is [B, chunk, V], never a full [B, T, V] log-softmax.
    """
    hidden = hidden_states(config, params, input_ids, attention_mask, dropout_rng)
    b, t, e = hidden.shape
    chunk = min(config.logprob_chunk, t)
    pad = (-t) % chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    tgt = jnp.pad(targets, ((0, 0), (0, pad)))
    n = (t + pad) // chunk
    hidden = hidden.reshape(b, n, chunk, e).swapaxes(0, 1)
    tgt = tgt.reshape(b, n, chunk).swapaxes(0, 1)

    def one_chunk(args):
        h, y = args
        logits = Qwen2(config).apply(lora.variables(params), h, method=Qwen2.logits)
        if temperature != 1.0:
            logits = logits / temperature
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
        if not return_entropy:
            return picked - lse, jnp.zeros_like(lse)
        probs = jnp.exp(logits - lse[..., None])
        return picked - lse, lse - jnp.sum(probs * logits, axis=-1)

    # with several chunks, recompute each chunk's logits in the backward pass instead of keeping them all
    logp, ent = jax.lax.map(jax.checkpoint(one_chunk) if n > 1 else one_chunk, (hidden, tgt))
    logp = logp.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    ent = ent.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    return (logp, ent) if return_entropy else logp


# ----------------------------------------------------------------------------------------------
# KV cache
# ----------------------------------------------------------------------------------------------


# the KV cache's logical axes. Not [B, K, S, D]: that layout's write (slots indexed around the kv-head axis)
# made libtpu's decode step hold a cache-sized temporary (bench/RESULTS.md, issue 17)
CACHE_AXES = ("batch", "kv_heads", "length", "head_dim")  # the values' [B, K, S, D]
KEY_CACHE_AXES = ("batch", "kv_heads", "head_dim", "length")  # the keys' [B, K, D, S]


@flax.struct.dataclass
class KVCache:
    """The decode cache of B rows and S slots: row b holds its valid tokens in slots [0, lengths[b])."""

    k: tuple  # L x [B, K, D, S] (KEY_CACHE_AXES): each layer's keys
    v: tuple  # L x [B, K, S, D] (CACHE_AXES): each layer's values
    lengths: jax.Array  # [B] int32: the row's tokens; its next one goes to slot (and position) lengths[b]

    @property
    def max_len(self) -> int:
        """S: slots per row."""
        return self.v[0].shape[2]


def init_cache(config: Qwen2Config, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache in the compute dtype: k, v tuples of L zero arrays, [B, K, D, S] and [B, K, S, D];
    lengths [B] zeros."""
    b, kvh, d = batch, config.num_key_value_heads, config.head_dim
    dtype = dtype or config.compute_dtype
    layers = range(config.num_hidden_layers)
    return KVCache(  # sharded like the activations, when they are
        k=tuple(_constrain(jnp.zeros((b, kvh, d, max_len), dtype), KEY_CACHE_AXES) for _ in layers),
        v=tuple(_constrain(jnp.zeros((b, kvh, max_len, d), dtype), CACHE_AXES) for _ in layers),
        lengths=_constrain(jnp.zeros((batch,), jnp.int32), ("batch",)),
    )


def extend(
    config: Qwen2Config, params: Params, cache: KVCache, tokens, token_mask=None, all_logits: bool = False
):
    """Append tokens [B, T] (token_mask [B, T]: 1 = append, 0 = skip) to the first B rows of the cache (its
    other rows, if it has more, are kept as they are: the decode slots decode a prefix of theirs).

    Row b's valid tokens go, in order, to slots lengths[b], lengths[b]+1, ... with matching positions;
    skipped entries write nothing. Returns (logits, new cache): logits [B, V] of each row's last appended
    token (rows that append nothing get the logits of a padding query: ignore them), or [B, T, V] for
    every chunk entry with `all_logits`. Slots past the cache end are dropped: size the cache.
    """
    if token_mask is None:
        token_mask = jnp.ones_like(tokens)
    token_mask = token_mask.astype(bool)
    b, t = tokens.shape
    s = cache.max_len
    lengths = cache.lengths[:b]
    offset = jnp.cumsum(token_mask.astype(jnp.int32), axis=1) - 1  # index among the row's valid tokens
    slot = lengths[:, None] + offset  # [B, T] slot (== position)
    write_slot = jnp.where(token_mask, slot, s)  # s: out of range, dropped
    new_lengths = jax.lax.dynamic_update_slice_in_dim(
        cache.lengths, lengths + token_mask.sum(axis=1, dtype=jnp.int32), 0, axis=0
    )
    # query at slot p sees keys at slots <= p; skipped queries see slot 0 only (finite, ignored)
    key_slots = jnp.arange(s)
    q_slot = jnp.where(token_mask, slot, 0)
    mask = key_slots[None, None, :] <= q_slot[:, :, None]
    rows = jnp.arange(b)[:, None]

    def writer(layer):
        def kv_write(k, v):
            k_cache, v_cache = cache.k[layer], cache.v[layer]
            # [rows, :, :, write_slot] and [rows, :, write_slot] pick [B, T, K, D] (the sliced axes after the
            # indexed ones): k and v as they are
            k_all = k_cache.at[rows, :, :, write_slot].set(k.astype(k_cache.dtype), mode="drop")
            v_all = v_cache.at[rows, :, write_slot].set(v.astype(v_cache.dtype), mode="drop")
            return k_all[:b], v_all[:b], (k_all, v_all)

        return kv_write

    model = Qwen2(config)
    hidden, new_kvs = model.apply(
        lora.variables(params),
        tokens,
        jnp.maximum(slot, 0),
        mask,
        [writer(i) for i in range(config.num_hidden_layers)],
    )
    new_cache = KVCache(
        k=tuple(kv[0] for kv in new_kvs), v=tuple(kv[1] for kv in new_kvs), lengths=new_lengths
    )
    if not all_logits:
        # the last valid entry of each row's chunk is where its offset is largest
        last_idx = jnp.argmax(jnp.where(token_mask, offset, -1), axis=1)
        hidden = jnp.take_along_axis(hidden, last_idx[:, None, None], axis=1)[:, 0]
    return model.apply(lora.variables(params), hidden, method=Qwen2.logits), new_cache


def extend_over_span(config: Qwen2Config, params: Params, cache: KVCache, tokens, token_mask=None):
    """`extend` (logits [B, V] of each row's last token, new cache) reading and writing only the cache's first
    span that holds every row's keys once the chunk is in (`spans.cache_spans`: 128, 256, ... slots, picked
    on the device), so a chunk's attention costs the slots in use, not the whole cache: appending 128 tokens
    to a row of a 1,024-slot cache holding ~200 is ~2x faster on CPU (bench/RESULTS.md, issue 17). The
    same as `extend` but for the rounding of sums over the attended slots."""
    if token_mask is None:
        token_mask = jnp.ones_like(tokens)
    spans = cache_spans(cache.max_len, at_least=tokens.shape[1])
    if len(spans) == 1:
        return extend(config, params, cache, tokens, token_mask)

    def over(n):
        def run(cache: KVCache):
            part = cache.replace(k=tuple(a[..., :n] for a in cache.k), v=tuple(a[:, :, :n] for a in cache.v))
            logits, new = extend(config, params, part, tokens, token_mask)

            def put(axis):
                return lambda whole, head: jax.lax.dynamic_update_slice_in_dim(whole, head, 0, axis=axis)

            k, v = tuple(map(put(3), cache.k, new.k)), tuple(map(put(2), cache.v, new.v))
            return logits, KVCache(k=k, v=v, lengths=new.lengths)

        return run

    appended = jnp.sum(token_mask.astype(bool), axis=1, dtype=jnp.int32)
    needed = jnp.max(cache.lengths[: tokens.shape[0]] + appended)
    return jax.lax.switch(first_span(spans, needed), [over(n) for n in spans], cache)


def prefill(config: Qwen2Config, params: Params, input_ids, attention_mask, max_len: int):
    """Encode prompts [B, T] (padding anywhere, usually left) into a fresh cache of max_len slots.

    Returns (logits [B, V] of each row's last prompt token, cache). The prompts are encoded into a cache of
    their own T slots (their attention reads no empty slot: over the whole 192-slot cache, bench/rollout.py's
    64-token prompts took 1.25x as long; issue 41), then the slots past T are zeros.
    """
    slots = min(input_ids.shape[1], max_len)
    logits, cache = extend(
        config, params, init_cache(config, input_ids.shape[0], slots), input_ids, attention_mask
    )
    if slots < max_len:
        more = max_len - slots
        k = tuple(_constrain(jnp.pad(a, ((0, 0),) * 3 + ((0, more),)), KEY_CACHE_AXES) for a in cache.k)
        v = tuple(_constrain(jnp.pad(a, ((0, 0), (0, 0), (0, more), (0, 0))), CACHE_AXES) for a in cache.v)
        cache = cache.replace(k=k, v=v)
    return logits, cache


def for_decoding(config: Qwen2Config, params: Params) -> tuple[Qwen2Config, Params]:
    """(config, params) for a loop of decode steps. On CPU a tied model reads its head from an untied [E, V]
    copy made once per call: XLA:CPU's matmul with the [V, E] table as laid out re-packs the table at every
    step (~0.33 against ~0.24 ms of a ~1.9 ms decode step at bench/rollout.py's S; bench/RESULTS.md, issue
    17). Elsewhere the copy is a transpose that XLA folds into the matmul, so nothing changes."""
    if not config.tie_word_embeddings or lora.has_adapters(params):
        return config, params
    # the barrier keeps XLA from folding the transpose back into the matmul
    head = jax.lax.platform_dependent(
        params["embedding"], cpu=lambda e: jax.lax.optimization_barrier(e.T), default=lambda e: e.T
    )
    return config.replace(tie_word_embeddings=False), {**params, "lm_head": head}


def decode_step(config: Qwen2Config, params: Params, cache: KVCache, token, active=None):
    """One token per row: token [B] int; active [B] bool (inactive rows append nothing).

    Returns (logits [B, V], cache).
    """
    mask = None if active is None else active[:, None]
    return extend(config, params, cache, token[:, None], mask)
