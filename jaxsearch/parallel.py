"""Device mesh, logical-axis rules, and the shardings they give params, batches and activations.

The model annotates every parameter and main activation with logical axis names (`qwen2.logical_axes`,
`nn.with_logical_constraint`). Rules map each logical name to a mesh axis (or None: replicated), in
flax's format. A dimension whose size the mesh axis does not divide is replicated instead (e.g. 2 kv
heads over a tensor axis of 4; `fit_rules`), so every rule set works for every model size. This module
knows no model: `models.sharding` applies the rules to a model's parameters.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with params sharded), `tensor`
(heads / mlp / vocab split inside each matmul).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


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


def fit_rules(
    axes: Sequence[str | None], shape: Sequence[int], mesh_shape: Mapping[str, int], rules
) -> tuple[tuple[str, Any], ...]:
    """Logical-axis `rules` (name -> mesh axis, a tuple of them, or None) fitted to one array of `shape`
    with logical `axes`: each named dimension keeps the mesh axes of its rule that are larger than 1 and
    not taken by an earlier dimension, or gets None (replicated) when none are left or their product does
    not divide it (e.g. 2 kv heads over a tensor axis of 4), so every rule set works for every model size.
    `nn.logical_to_mesh_axes(axes, fit_rules(...))` is the array's PartitionSpec."""
    table = dict(rules)
    used: set[str] = set()
    fitted = []
    for name, dim in zip(axes, shape):
        if name is None:
            continue
        target = table.get(name)
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n not in used and mesh_shape[n] > 1)
        if not names or dim % int(np.prod([mesh_shape[n] for n in names])):
            fitted.append((name, None))
            continue
        used.update(names)
        fitted.append((name, names[0] if len(names) == 1 else names))
    return tuple(fitted)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules=DEFAULT_RULES) -> P:
    """PartitionSpec for one array with logical `axes` and `shape` under `rules`.

    A mesh axis is used at most once per array, and only where it divides the dimension.
    """
    return nn.logical_to_mesh_axes(tuple(axes), fit_rules(axes, shape, mesh.shape, rules))


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


def replicated_on(mesh: Mesh, tree) -> bool:
    """Every leaf of `tree` (arrays, or abstract ones with a sharding) is whole on each of `mesh`'s devices."""
    devices = set(mesh.devices.flat)

    def whole(x):
        sharding = getattr(x, "sharding", None)
        return sharding is not None and sharding.is_fully_replicated and sharding.device_set == devices

    return all(whole(x) for x in jax.tree.leaves(tree))


def jit_per_device(fn, mesh: Mesh, batch, static_argnums=(), replicated_argnums=(), donate_argnums=()):
    """`jax.jit` of `fn` run as one program per device of `mesh` (`jax.shard_map`): the positional arguments
    in `replicated_argnums` whole on every device, every other array argument and every output split along
    its first axis over the mesh axes `batch` (a PartitionSpec entry). Nothing passes between the devices,
    so this suits work that is independent per row over replicated weights, such as a decode loop: there
    jit's partitioner synchronises the devices at every step (the loop's condition reduces over all rows)."""
    rows = P(batch)

    def run(*args):
        dynamic = [i for i in range(len(args)) if i not in static_argnums]

        def local(*values):
            full = list(args)
            for i, value in zip(dynamic, values):
                full[i] = value
            return fn(*full)

        # a spec stands for every leaf of its argument (shard_map's specs are tree prefixes), `rows` for
        # every output
        in_specs = tuple(P() if i in replicated_argnums else rows for i in dynamic)
        per_device = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=rows, check_vma=False)
        return per_device(*(args[i] for i in dynamic))

    return jax.jit(run, static_argnums=static_argnums, donate_argnums=donate_argnums)
