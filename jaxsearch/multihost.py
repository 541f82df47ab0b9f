"""Host data <-> global arrays, for meshes that span several processes (`jax.distributed`).

Every process runs the same host code on the same data: each one rolls out the whole batch (the
device work inside is one SPMD program, so every process reads back the same tokens), so every
process holds the same global numpy batch. Two conversions cross the host/device boundary:

    x = to_global(host_batch, sharding)     # numpy [B, ...], same on every process -> global jax.Array
    y = to_host(global_array)               # any jax.Array -> numpy holding the global value

With one process both are plain copies (the values are bit-identical to `jax.device_put` /
`np.asarray`). With several, `to_host` of an array split across processes is a collective: every
process must call it, in the same order.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def to_global(x, sharding: jax.sharding.Sharding) -> jax.Array:
    """A jax.Array with `sharding` from host data `x` (numpy [B, ...]) that every process holds whole.

    Each process copies only the slices its own devices hold. A jax.Array is returned unchanged
    (jit reshards it if needed).
    """
    if isinstance(x, jax.Array):
        return x
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def tree_to_global(tree: dict, shardings: dict) -> dict:
    """`to_global` for each entry of a dict of host arrays, with the matching entry of `shardings`."""
    return {k: to_global(v, shardings[k]) for k, v in tree.items()}


def to_host(x) -> np.ndarray:
    """The global value of `x` as numpy, on every process (a collective when `x` is split across them)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def sync(name: str) -> None:
    """A barrier over all processes (nothing with one process). `name` must be the same on all."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def init_distributed(d) -> None:
    """Multi-host from config.distributed: explicit coordinator / num_processes / process_id, or the
    environment (TPU pods, SLURM) when it says there are several processes."""
    import os

    # CPU devices of several processes talk through gloo (no effect on GPU / TPU collectives)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if d.coordinator:
        jax.distributed.initialize(d.coordinator, d.num_processes, d.process_id)
    elif (
        os.environ.get("JAX_COORDINATOR_ADDRESS")
        or os.environ.get("SLURM_NTASKS", "1") != "1"
        or os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0
    ):
        jax.distributed.initialize()
