"""Device mesh, logical-axis rules, and the shardings they give params and batches.

The model annotates every parameter with logical axis names (`qwen2.logical_axes`). Rules map each
logical name to a mesh axis (or None: replicated). A dimension whose size the mesh axis does not
divide is replicated instead (e.g. 2 kv heads over a tensor axis of 4), so every rule set works for
every model size.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with params sharded), `tensor`
(heads / mlp / vocab split inside each matmul).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Sequence

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


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules=DEFAULT_RULES) -> P:
    """PartitionSpec for one array with logical `axes` and `shape` under `rules`.

    A mesh axis is used at most once per array, and only where it divides the dimension.
    """
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        target = table.get(name) if name is not None else None
        names = (target,) if isinstance(target, str) else tuple(target or ())
        names = tuple(n for n in names if n not in used and mesh.shape[n] > 1)
        size = int(np.prod([mesh.shape[n] for n in names])) if names else 1
        if not names or dim % size:
            spec.append(None)
            continue
        used.update(names)
        spec.append(names[0] if len(names) == 1 else names)
    return P(*spec)


def param_shardings(config, mesh: Mesh, rules=DEFAULT_RULES):
    """NamedSharding for every Qwen2 parameter (a pytree shaped like the params)."""
    from jaxsearch.models import qwen2  # local: parallel has no model dependency otherwise

    axes = qwen2.logical_axes(config)
    shapes = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))
    return jax.tree_util.tree_map(
        lambda spec, s: NamedSharding(mesh, logical_to_spec(tuple(spec), s.shape, mesh, rules)),
        axes,
        shapes,
        is_leaf=lambda x: isinstance(x, P),
    )


_ACTIVATIONS = threading.local()  # .value = (mesh, rules) while `activation_sharding` is active


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules=DEFAULT_RULES):
    """While active (at trace time), `constrain` pins the model's annotated activations to `mesh` by
    `rules`; outside it, `constrain` is the identity (single-device code and tests)."""
    previous = getattr(_ACTIVATIONS, "value", None)
    _ACTIVATIONS.value = (mesh, rules)
    try:
        yield
    finally:
        _ACTIVATIONS.value = previous


def constrain(x, axes: Sequence[str | None]):
    """`x` with a sharding constraint from its logical `axes` under the active `activation_sharding`
    (with the same divisibility fallback as the params), else `x` unchanged."""
    active = getattr(_ACTIVATIONS, "value", None)
    if active is None:
        return x
    mesh, rules = active
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh, rules))
    )


def with_activation_sharding(fn, mesh: Mesh, rules=DEFAULT_RULES):
    """`fn` traced under `activation_sharding(mesh, rules)`: wrap a function before `jax.jit`, so the
    activations inside every layer stay sharded along the batch instead of being left to propagation."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with activation_sharding(mesh, rules):
            return fn(*args, **kwargs)

    return wrapped


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=DEFAULT_RULES) -> NamedSharding:
    """Sharding of a [B, ...] batch array: batch over the data-parallel axes, the rest replicated."""
    batch_axes = tuple(n for n in (dict(rules)["batch"] or ()) if mesh.shape[n] > 1)
    first = batch_axes if len(batch_axes) > 1 else (batch_axes[0] if batch_axes else None)
    return NamedSharding(mesh, P(first, *([None] * (ndim - 1))))
