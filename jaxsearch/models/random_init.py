"""Random initial weights from a counter-based integer hash: cheap to compile, the same bits on any mesh.

jax.random's threefry costs XLA:CPU ~0.3-0.8 s of compile per draw (20 unrolled rounds of 2x32-bit mixing, more
for higher ranks), so drawing each of a model's ~20 kernels apart cost 6-10 s at every start of a tiny model. Here
element i of leaf j is a pure function of (seed, j, i): a few integer ops per element (Wellons' `lowbias32` mixer),
then Box-Muller. Computed from an iota over the leaf's own shape, a sharded leaf draws only its shard: the same
program gives the same bits on any mesh. The integer bits are the same on every backend and version; the float
transform (log, cos, a multiply-add) may round differently in the last place where XLA fuses it differently.
"""

import math

import jax
import jax.numpy as jnp


def _mix(x):
    """lowbias32 (C. Wellons, "Hash Prospector"): a bijective uint32 -> uint32 mixer with low avalanche bias."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def seed_word(rng) -> jax.Array:
    """One uint32 seed from a jax PRNG key (typed, or the legacy uint32[2])."""
    data = jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng
    data = jnp.asarray(data, jnp.uint32).reshape(-1)
    word = jnp.uint32(0)
    for d in range(data.shape[0]):
        word = _mix(word ^ data[d])
    return word


def _counters(shape) -> jax.Array:
    """Each element's row-major index [*shape] uint32, from per-axis iotas (so a shard computes its own)."""
    if math.prod(shape) >= 2**32:
        raise ValueError(f"random_init: a leaf of shape {shape} has 2^32 elements or more")
    index = jnp.zeros(shape, jnp.uint32)
    for axis in range(len(shape)):
        stride = jnp.uint32(math.prod(shape[axis + 1 :]))
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * stride
    return index


def _uniform_bits(seed, leaf: int, stream: int, shape) -> jax.Array:
    """24 uniform bits [*shape] (uint32 < 2^24) of stream `stream` of leaf number `leaf`."""
    key = _mix(seed ^ _mix(jnp.uint32(2 * leaf + stream + 1)))
    return _mix(_counters(shape) ^ key) >> 8


def normal(seed, leaf: int, shape, stddev: float, dtype=jnp.float32) -> jax.Array:
    """N(0, stddev^2) [*shape] for leaf number `leaf` (Box-Muller over two 24-bit uniforms)."""
    u1 = (_uniform_bits(seed, leaf, 0, shape).astype(jnp.float32) + 1.0) * 2.0**-24  # (0, 1]
    u2 = _uniform_bits(seed, leaf, 1, shape).astype(jnp.float32) * 2.0**-24  # [0, 1)
    z = jnp.sqrt(-2.0 * jnp.log(u1)) * jnp.cos(2.0 * jnp.pi * u2)
    return (stddev * z).astype(dtype)


def uniform(seed, leaf: int, shape, low: float, high: float, dtype=jnp.float32) -> jax.Array:
    """U[low, high) [*shape] for leaf number `leaf`."""
    u = _uniform_bits(seed, leaf, 0, shape).astype(jnp.float32) * 2.0**-24
    return (low + (high - low) * u).astype(dtype)
