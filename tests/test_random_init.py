"""Random initial weights (`models/random_init.py`, `qwen2.init_params`, `lora.init_adapters`): what flax's own
init of the same modules gives (zeros, ones, normal(0.02)), the normal and uniform laws, and the same bits on any
mesh."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from scipy import stats

from jaxsearch import parallel
from jaxsearch.models import lora, qwen2, random_init
from jaxsearch.models.sharding import param_shardings
from tiny_models import tiny_qwen2_config

QWEN2 = tiny_qwen2_config(vocab_size=64, tie_word_embeddings=False)  # one layer holds every kind of leaf
QWEN3 = tiny_qwen2_config(vocab_size=64, family="qwen3", head_dim=8)


@pytest.mark.parametrize("config", [QWEN2, QWEN3], ids=["qwen2", "qwen3"])
def test_init_params_gives_what_flax_initialisers_of_the_modules_give(config):
    """flax's init of the modules (their declared initialisers) against ours, leaf by leaf: the same tree,
    shapes and dtypes; zeros and ones exactly; the normal(0.02) kernels' std within sampling error of each other."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    with jax.threefry_partitionable(False):  # flax's per-leaf draws compile ~2x faster so
        flax_init = jax.jit(lambda k: qwen2.Qwen2(config).init(k, dummy, method=qwen2.Qwen2.init_all))(
            jax.random.PRNGKey(0)
        )
    theirs = jax.tree_util.tree_leaves_with_path(
        jax.tree.map(np.asarray, qwen2.nn.meta.unbox(flax_init["params"]))
    )
    ours = jax.tree_util.tree_leaves_with_path(qwen2.init_params(config, jax.random.PRNGKey(0)))
    assert [p for p, _ in ours] == [p for p, _ in theirs]
    normals = 0
    for (path, a), (_, b) in zip(ours, theirs):
        a = np.asarray(a)
        assert (a.shape, a.dtype) == (b.shape, b.dtype), path
        if np.all(b == 0) or np.all(b == 1):  # biases, norm scales
            np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
        else:
            normals += 1
            assert a.std() == pytest.approx(0.02, rel=8 / np.sqrt(a.size)) and b.std() == pytest.approx(
                0.02, rel=8 / np.sqrt(b.size)
            ), path
    assert normals == 2 + 4 * config.num_hidden_layers  # embedding, lm_head; qkv, o, gate_up, down a layer


def test_normal_and_uniform_follow_their_laws_and_streams_are_independent():
    seed = random_init.seed_word(jax.random.PRNGKey(7))
    z = np.asarray(random_init.normal(seed, 0, (512, 256), 1.0), np.float64).ravel()
    assert stats.kstest(z, "norm").pvalue > 1e-3  # 131,072 draws against N(0, 1)
    assert abs(z.mean()) < 5 / np.sqrt(z.size) and z.std() == pytest.approx(1.0, abs=0.01)
    other = np.asarray(random_init.normal(seed, 1, (512, 256), 1.0), np.float64).ravel()
    assert abs(np.corrcoef(z, other)[0, 1]) < 5 / np.sqrt(z.size)  # another leaf: another stream
    shifted = np.asarray(random_init.normal(seed, 0, (512, 257), 1.0), np.float64)[:, :256].ravel()
    assert abs(np.corrcoef(z, shifted)[0, 1]) < 0.05  # neighbours in index are not copies
    u = np.asarray(random_init.uniform(seed, 2, (256, 256), -0.5, 0.25), np.float64).ravel()
    assert u.min() >= -0.5 and u.max() < 0.25 and stats.kstest(u, stats.uniform(-0.5, 0.75).cdf).pvalue > 1e-3
    again = np.asarray(random_init.normal(random_init.seed_word(jax.random.PRNGKey(8)), 0, (512, 256), 1.0))
    assert abs(np.corrcoef(z, again.ravel())[0, 1]) < 5 / np.sqrt(z.size)  # another seed
    # a typed key and the legacy uint32[2] key of the same seed give the same draws
    assert random_init.seed_word(jax.random.key(7)) == seed
    with pytest.raises(ValueError, match="2\\^32"):
        random_init.normal(seed, 0, (2**16, 2**16), 1.0)


def test_a_sharded_init_draws_the_same_bits_as_one_device():
    """init_params and lora.init_adapters jitted with shardings over 8 devices (fsdp=4 x tensor=2): the same
    draws as one device (each shard draws its own elements from the iota): the hash bits and the uniform
    adapters bit for bit; the normal leaves to an ulp, as XLA:CPU may round Box-Muller's log / cos of an element
    differently where a shard's loop vectorizes it and the whole leaf's does not (1 of 2,048 on one machine)."""
    mesh = parallel.make_mesh({"fsdp": 4, "tensor": 2}, jax.devices()[:8])
    bits = functools.partial(random_init._uniform_bits, jnp.uint32(5), 3, 0, (64, 32))
    spread = jax.jit(bits, out_shardings=NamedSharding(mesh, P("fsdp", "tensor")))()
    np.testing.assert_array_equal(np.asarray(spread), np.asarray(jax.jit(bits)()))
    key = jax.random.PRNGKey(3)
    sharded = jax.jit(lambda k: qwen2.init_params(QWEN2, k), out_shardings=param_shardings(QWEN2, mesh))(key)
    assert any(
        len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
        for x in jax.tree.leaves(sharded)
    )
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(qwen2.init_params(QWEN2, key))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=0)
    spec = lora.LoraSpec(rank=4, alpha=8.0)
    row = NamedSharding(mesh, P("fsdp"))
    adapters = jax.jit(lambda k: lora.init_adapters(QWEN2, spec, k), out_shardings=row)(key)
    one_device = jax.jit(lambda k: lora.init_adapters(QWEN2, spec, k))(key)
    for a, b in zip(jax.tree.leaves(adapters), jax.tree.leaves(one_device)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
