"""Random init: `qwen2.init_params` (models/random_init.py's hash draws) against flax's own init of the same
modules (threefry, one draw per leaf), both jitted, in one process: seconds to compile and run, cold (no
persistent cache), and for a sharded 7B init the temporaries XLA plans per device.

  python bench/init.py [--sizes tiny_cpu S M] [--sharded-7b]

Prints one JSON line per size: compile and run seconds of each and their ratio; with --sharded-7b (8 fake CPU
devices, fsdp=8, abstract key: nothing runs), the per-device output and temporary bytes of each.
"""

import os
import sys

if "--sharded-7b" in sys.argv:  # before jax is imported
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # cold compiles

import argparse
import json
import time

import jax
import jax.numpy as jnp

from common import SIZES
from jaxsearch import parallel
from jaxsearch.models import qwen2
from jaxsearch.models.sharding import param_shardings

# configs/tiny_cpu.py's model with the tiny world's vocabulary
TINY_CPU = dict(vocab_size=700, hidden_size=128, intermediate_size=384, num_attention_heads=4,
                num_key_value_heads=2, num_hidden_layers=4)  # fmt: skip


def flax_init(config, rng):
    """flax's init of the modules: each parameter drawn by its declared initialiser (threefry)."""
    dummy = jnp.zeros((1, 1), jnp.int32)
    return qwen2.nn.meta.unbox(qwen2.Qwen2(config).init(rng, dummy, method=qwen2.Qwen2.init_all)["params"])


def timed(fn, config):
    """(compile s, run s) of jit(fn(config, key))."""
    jitted = jax.jit(lambda k: fn(config, k))
    start = time.perf_counter()
    compiled = jitted.lower(jax.random.PRNGKey(0)).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(compiled(jax.random.PRNGKey(0)))
    return compile_s, time.perf_counter() - start


def sharded_7b():
    config = qwen2.preset("qwen2.5-7b")
    mesh = parallel.make_mesh({"fsdp": 8}, jax.devices()[:8])
    out = {}
    for name, fn in (("jaxsearch", qwen2.init_params), ("flax", flax_init)):
        jitted = jax.jit(lambda k, fn=fn: fn(config, k), out_shardings=param_shardings(config, mesh))
        memory = jitted.lower(jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().memory_analysis()
        out[name] = {"output_gb": memory.output_size_in_bytes / 1e9, "temp_gb": memory.temp_size_in_bytes / 1e9}
    print(json.dumps({"bench": "init", "size": "qwen2.5-7b fsdp=8", **out}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["tiny_cpu", "S"], choices=["tiny_cpu", *sorted(SIZES)])
    ap.add_argument("--sharded-7b", action="store_true", help="also plan a sharded 7B init on 8 fake devices")
    args = ap.parse_args()
    print(f"jax {jax.__version__} {jax.devices()[0].platform}", flush=True)
    jax.jit(lambda x: x + 1).lower(1.0).compile()  # the first compile's one-time costs, out of the timings
    for size in args.sizes:
        config = qwen2.Qwen2Config(**(TINY_CPU if size == "tiny_cpu" else SIZES[size]))
        ours, theirs = timed(qwen2.init_params, config), timed(flax_init, config)
        print(json.dumps({
            "bench": "init", "size": size, "leaves": len(jax.tree.leaves(jax.eval_shape(
                lambda: qwen2.init_params(config, jax.random.PRNGKey(0))))),
            "jaxsearch_compile_s": round(ours[0], 3), "jaxsearch_run_s": round(ours[1], 4),
            "flax_compile_s": round(theirs[0], 3), "flax_run_s": round(theirs[1], 4),
            "compile_ratio": round(theirs[0] / ours[0], 2),
        }), flush=True)  # fmt: skip
    if args.sharded_7b:
        sharded_7b()


if __name__ == "__main__":
    main()
