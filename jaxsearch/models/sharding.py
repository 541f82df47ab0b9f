"""The shardings of a model's parameters on a mesh: its logical axes (`qwen2.logical_axes`) under a rule set
(`parallel.DEFAULT_RULES`, or a decode layout's), and the decode-layout copy the sampler reads."""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxsearch.models import qwen2
from jaxsearch.parallel import DEFAULT_RULES, logical_to_spec


def param_shardings(config, mesh: Mesh, rules=DEFAULT_RULES):
    """NamedSharding for every Qwen2 parameter (a pytree shaped like the params)."""
    axes = qwen2.logical_axes(config)
    shapes = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))
    return jax.tree_util.tree_map(
        lambda spec, s: NamedSharding(mesh, logical_to_spec(tuple(spec), s.shape, mesh, rules)),
        axes,
        shapes,
        is_leaf=lambda x: isinstance(x, P),
    )


# ------------------------------------------------------------------------------------------- decode layout

# The policy's decode layouts (`rollout.decode_layout`), as parameter rules. The trainer keeps its params
# fsdp-sharded, so a sampler reading them gathers the whole model at every decode step; a decode layout
# is a copy in the compute dtype, made once per RL step, that a decode step reads from local HBM only:
#   replicated: every device holds all the weights (where they fit beside the train state and the cache)
#   tensor:     heads / kv heads / mlp / vocab split over the `tensor` axis, the rest replicated
#   train:      no copy: decode with the trainer's params as they are
_DECODE_RULES = {
    "replicated": tuple((name, None) for name, _ in DEFAULT_RULES),
    "tensor": (
        ("embed", None),
        ("heads", "tensor"),
        ("kv_heads", "tensor"),
        ("mlp", "tensor"),
        ("vocab", "tensor"),
        ("head_dim", None),
        ("norm", None),
    ),
}


def decode_param_shardings(config, mesh: Mesh, layout: str):
    """NamedSharding of every parameter in decode `layout` ("replicated" or "tensor")."""
    if layout not in _DECODE_RULES:
        raise ValueError(f"decode layout {layout!r}: expected one of {sorted(_DECODE_RULES)}")
    return param_shardings(config, mesh, _DECODE_RULES[layout])


def copy_shardings(config, params, mesh: Mesh, layout: str):
    """Where a decode copy of `params` goes (a LoRA run's merged one too): decode `layout`'s shardings, or for
    "train" the params' own."""
    if layout == "train":
        return jax.tree_util.tree_map(lambda x: x.sharding, params)
    return decode_param_shardings(config, mesh, layout)


def to_decode_layout(config, params, mesh: Mesh, layout: str):
    """`params` as the sampler should read them: a copy in the compute dtype in decode `layout`, or, for
    "train", `params` themselves. Compiled once per (config, mesh, layout)."""
    if layout == "train":
        return params
    return _decode_copy(config, mesh, layout)(params)


@functools.lru_cache(maxsize=None)
def _decode_copy(config, mesh: Mesh, layout: str):
    dtype = config.compute_dtype
    return jax.jit(
        lambda p: jax.tree_util.tree_map(lambda x: x.astype(dtype), p),
        out_shardings=decode_param_shardings(config, mesh, layout),
    )
