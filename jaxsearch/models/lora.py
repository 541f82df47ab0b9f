"""LoRA adapters on a Qwen2 / Qwen3 decoder: low-rank updates W + scale * A @ B of the attention and MLP
projections, the base frozen and shared (the reference policy is the base with the adapters off).

    spec = LoraSpec(rank=16, alpha=32, dropout=0.05, targets=("q_proj", "v_proj"))
    adapters = init_adapters(config, spec, rng)          # B = 0: the adapted model starts as the base
    params = with_adapters(base, adapters)                # what every `qwen2` entry point accepts
    logits = qwen2.forward(lora_config(config, spec), params, ids, mask)    # x W + scale * (x A) B per target
    merged = merge(config, spec, base, adapters)          # plain params: the sampler's, an export's

Adapters, one pair per targeted projection of every layer, named by transformers' module (as peft names them):

    layers_i/attn/{q,k,v,o}_proj/{a [in, r], b [r, out]}      layers_i/mlp/{gate,up,down}_proj/{a, b}

in, out: the projection's input and output features in transformers' order (q: E -> H*D, k and v: E -> K*D,
o: H*D -> E, gate and up: E -> F, down: F -> E), so peft's lora_A.weight [r, in] is a.T and lora_B.weight
[out, r] is b.T (`models/peft_io.py`). Initialised as peft's default (`LoraLayer.reset_lora_parameters`,
init_lora_weights=True): A kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)); B zeros.
scale = alpha / rank (alpha / sqrt(rank) with `rslora`). Dropout (training forward only) drops the input of A.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxsearch.config import LORA_TARGETS as TARGETS  # what a config's lora.target_modules may name
from jaxsearch.models import random_init

# transformers' projection names -> the module that holds them in `qwen2.py`: q/k/v/o attn, gate/up/down mlp
MODULE_OF = {name: "attn" if name in TARGETS[:4] else "mlp" for name in TARGETS}


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """What is adapted and how: rank r, alpha, dropout on the adapters' input, target projections."""

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS
    rslora: bool = False  # scale alpha / sqrt(rank) (peft's use_rslora) instead of alpha / rank

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoRA rank={self.rank}: expected >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout={self.dropout}: expected in [0, 1)")
        unknown = [t for t in self.targets if t not in MODULE_OF]
        if unknown or not self.targets:
            raise ValueError(
                f"LoRA targets {list(self.targets)}: expected a non-empty subset of {list(TARGETS)}"
            )

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def lora_config(config, spec: LoraSpec):
    """The model config that applies `spec`'s scale and dropout to adapters passed with `with_adapters`."""
    return config.replace(lora_scale=spec.scale, lora_dropout=spec.dropout)


def features(config, name: str) -> tuple[int, int]:
    """(in, out) features of projection `name` in transformers' layout."""
    e, f = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    return {
        "q_proj": (e, q),
        "k_proj": (e, kv),
        "v_proj": (e, kv),
        "o_proj": (q, e),
        "gate_proj": (e, f),
        "up_proj": (e, f),
        "down_proj": (f, e),
    }[name]


def init_adapters(config, spec: LoraSpec, rng, dtype=jnp.float32) -> dict:
    """Fresh adapters (see the module docstring): A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0, in `dtype`. The draws
    are `random_init`'s (cheap to compile, the same under any sharding), one stream per layer and target."""
    seed = random_init.seed_word(rng)
    out = {}
    for i in range(config.num_hidden_layers):
        layer = {}
        for name in spec.targets:
            n_in, n_out = features(config, name)
            bound = 1.0 / math.sqrt(n_in)
            stream = i * len(TARGETS) + TARGETS.index(name)
            a = random_init.uniform(seed, stream, (n_in, spec.rank), -bound, bound, dtype)
            layer.setdefault(MODULE_OF[name], {})[name] = {"a": a, "b": jnp.zeros((spec.rank, n_out), dtype)}
        out[f"layers_{i}"] = layer
    return out


def with_adapters(base, adapters) -> dict:
    """Params that carry adapters: every `qwen2` entry point runs them as x W + scale * (x A) B."""
    return {"base": base, "lora": adapters}


def has_adapters(params) -> bool:
    return isinstance(params, dict) and "lora" in params and "base" in params


def variables(params) -> dict:
    """flax variables of plain or adapter-carrying params."""
    if has_adapters(params):
        return {"params": params["base"], "lora": params["lora"]}
    return {"params": params}


def targets_of(adapters) -> tuple[str, ...]:
    """The projections `adapters` adapt (those of its first layer), in `TARGETS` order."""
    first = adapters["layers_0"]
    names = {n for module in first.values() for n in module}
    return tuple(t for t in TARGETS if t in names)


def merge(config, spec: LoraSpec, base, adapters, dtype=None):
    """Plain params with each adapted kernel replaced by W + scale * A @ B (computed in fp32), in `dtype`
    (None: each kernel's own). [E, K, G + 2, D] q/k/v, [H, D, E] o, [E, 2, F] gate/up, [F, E] down."""
    e, f = config.hidden_size, config.intermediate_size
    h, k, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim

    def delta(ad):
        return spec.scale * (ad["a"].astype(jnp.float32) @ ad["b"].astype(jnp.float32))  # [in, out]

    def add(kernel, update):
        return (kernel.astype(jnp.float32) + update).astype(dtype or kernel.dtype)

    out = {n: (jax.tree_util.tree_map(lambda x: x.astype(dtype or x.dtype), v)) for n, v in base.items()}
    for i in range(config.num_hidden_layers):
        layer, ads = base[f"layers_{i}"], adapters[f"layers_{i}"]
        attn, mlp = dict(out[f"layers_{i}"]["attn"]), dict(out[f"layers_{i}"]["mlp"])
        a_ads, m_ads = ads.get("attn", {}), ads.get("mlp", {})
        if {"q_proj", "k_proj", "v_proj"} & set(a_ads):  # the fused [E, K, G + 2, D]; an untargeted part adds 0
            def part(name, heads):  # [E, K, heads, D]
                if name not in a_ads:
                    return jnp.zeros((e, k, heads, d), jnp.float32)
                return delta(a_ads[name]).reshape(e, k, heads, d)

            parts = [part("q_proj", h // k), part("k_proj", 1), part("v_proj", 1)]
            attn["qkv_kernel"] = add(layer["attn"]["qkv_kernel"], jnp.concatenate(parts, axis=2))
        if "o_proj" in a_ads:
            attn["o_kernel"] = add(layer["attn"]["o_kernel"], delta(a_ads["o_proj"]).reshape(h, d, e))
        if "gate_proj" in m_ads or "up_proj" in m_ads:
            zero = jnp.zeros((e, f), jnp.float32)
            parts = [delta(m_ads[n]) if n in m_ads else zero for n in ("gate_proj", "up_proj")]
            mlp["gate_up_kernel"] = add(layer["mlp"]["gate_up_kernel"], jnp.stack(parts, axis=1))
        if "down_proj" in m_ads:
            mlp["down_kernel"] = add(layer["mlp"]["down_kernel"], delta(m_ads["down_proj"]))
        out[f"layers_{i}"] = dict(out[f"layers_{i}"], attn=attn, mlp=mlp)
    return out


def count(adapters) -> int:
    """Trainable parameters in `adapters`."""
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(adapters))
