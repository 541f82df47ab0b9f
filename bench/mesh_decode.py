"""The sampler on one CPU device against a data mesh of host devices: under the mesh's jit (GSPMD, the
path for sharded params) and as one program per device (`Sampler._per_device`, for params whole on every
device).

  python bench/mesh_decode.py [--host-devices 2] [--reps 7]

bench/rollout.py's S workload (batch 16, 64-token random prompts, 128 greedy tokens over a 192-slot cache).
XLA splits the CPU into `--host-devices` devices; the three samplers run in one process, in turn, `--reps`
times each after a warm-up, on the same params (fp32 random weights of the S shape), on one device or whole
on each. Prints one JSON line: per sampler the rollout's tok/s, the prefill's ms and the decode step's us
(medians), its speedup over one device's rollout in the same turn (median of the ratios, their range), and
whether its greedy tokens are one device's.
"""

import argparse
import functools
import json
import time

from host_devices import split_cpu

if __name__ == "__main__":  # before jax is imported
    split_cpu(default=2)

import jax
import numpy as np
from common import SIZES, alternated
from jax.sharding import NamedSharding, PartitionSpec
from rollout import BATCH, NEW, PROMPT, greedy_sampler

from jaxsearch import parallel
from jaxsearch.models import qwen2


def timed(smp, params, prompts):
    """(rollout s, prefill s, decode s, tokens) of a rollout: a prefill, then a decode call of NEW tokens."""
    t0 = time.perf_counter()
    state = smp.start(params, prompts, 0)
    jax.block_until_ready(state)
    t1 = time.perf_counter()
    seg, _ = smp.decode(params, state, NEW)
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, t2 - t1, seg.tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host-devices", type=int, default=2, help="XLA host devices the CPU is split into")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    if jax.devices()[0].platform != "cpu" or len(jax.devices()) != args.host_devices:
        raise SystemExit(f"expected {args.host_devices} CPU devices, got {jax.devices()}")
    config = qwen2.Qwen2Config(**SIZES["S"], tie_word_embeddings=True, attention_chunk=0)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    prompts = np.random.default_rng(1234).integers(1, config.vocab_size, (BATCH, PROMPT)).tolist()
    mesh = parallel.make_mesh({"data": args.host_devices})
    whole = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    mesh_jit = greedy_sampler(config, mesh)
    mesh_jit._per_device = lambda params, rows: None  # the mesh's jit also for params whole on every device
    runs = {
        "one_device": (greedy_sampler(config), jax.device_put(params, jax.devices()[0])),
        "mesh_jit": (mesh_jit, whole),
        "per_device": (greedy_sampler(config, mesh), whole),
    }
    assert runs["per_device"][0]._per_device(whole, BATCH) is not None
    results = alternated(
        {name: functools.partial(timed, *run, prompts) for name, run in runs.items()}, args.reps
    )
    tokens = {name: r[0][3] for name, r in results.items()}
    base = np.array([r[0] for r in results["one_device"]])
    out = {"bench": "mesh_decode", "size": "S", "host_devices": args.host_devices}
    for name, rs in results.items():
        rollout, prefill, decode = (np.array([r[i] for r in rs]) for i in range(3))
        ratio = base / rollout
        out[name] = {
            "tok_s": round(BATCH * NEW / float(np.median(rollout))),
            "prefill_ms": round(1e3 * float(np.median(prefill)), 2),
            "decode_step_us": round(1e6 * float(np.median(decode)) / NEW, 1),
            "speedup": round(float(np.median(ratio)), 3),
            "speedup_range": [round(float(ratio.min()), 2), round(float(ratio.max()), 2)],
            "same_tokens": bool((tokens[name] == tokens["one_device"]).all()),
        }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
