"""Device mesh, logical-axis rules, and the shardings they give params, batches and activations.

The model annotates every parameter and main activation with logical axis names (`qwen2.logical_axes`,
`nn.with_logical_constraint`). Rules map each logical name to a mesh axis (or None: replicated), in
flax's format. A dimension whose size the mesh axis does not divide is replicated instead (e.g. 2 kv
heads over a tensor axis of 4; `qwen2.fit_rules`), so every rule set works for every model size.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with params sharded), `tensor`
(heads / mlp / vocab split inside each matmul).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxsearch.models import qwen2

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (a name, a tuple of names, or None)
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("norm", None),
)


def make_mesh(shape: dict[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over `devices` (default: all) with axes data/fsdp/tensor.

    shape: sizes per axis; at most one may be -1 (takes the remaining devices); missing axes are 1.
    Default: everything on `fsdp`.
    """
    devices = list(devices if devices is not None else jax.devices())
    shape = dict(shape or {"fsdp": -1})
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"unknown mesh axis {sorted(unknown)}; expected a subset of {MESH_AXES}")
    sizes = [shape.get(a, 1) for a in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh shape {shape}: at most one axis may be -1")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"mesh shape {shape}: {len(devices)} devices are not divisible by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"mesh shape {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} devices, "
            f"{len(devices)} are available"
        )
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules=DEFAULT_RULES) -> P:
    """PartitionSpec for one array with logical `axes` and `shape` under `rules`.

    A mesh axis is used at most once per array, and only where it divides the dimension.
    """
    return nn.logical_to_mesh_axes(tuple(axes), qwen2.fit_rules(axes, shape, mesh.shape, rules))


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


def with_activation_sharding(fn, mesh: Mesh, rules=DEFAULT_RULES):
    """`fn` traced under flax's `nn.logical_axis_rules(rules)` and jax's mesh context for `mesh`: wrap a
    function before `jax.jit`, so the activations the model annotates stay sharded along the batch
    instead of being left to propagation.

    Inside `jax.jit` a mesh is abstract (`jax.set_mesh` is for outside it), so this enters
    `jax.sharding.use_abstract_mesh`; the devices come from the jitted function's input shardings, as
    they do in the train step, the sampler and the planner (host inputs without shardings run on one
    device, where every constraint is trivial)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with nn.logical_axis_rules(rules), jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)

    return wrapped


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=DEFAULT_RULES) -> NamedSharding:
    """Sharding of a [B, ...] batch array: batch over the data-parallel axes, the rest replicated."""
    batch_axes = tuple(n for n in (dict(rules)["batch"] or ()) if mesh.shape[n] > 1)
    first = batch_axes if len(batch_axes) > 1 else (batch_axes[0] if batch_axes else None)
    return NamedSharding(mesh, P(first, *([None] * (ndim - 1))))


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
