"""What a decode step is made of: the sampler's decode loop at bench/rollout.py's shapes, its compiled loop body
counted op by op, and one traced rollout's time per op.

  python bench/decode_ops.py [--size S] [--chunk 0 512] [--top 12]

Batch 16, 64-token random prompts, 128 new tokens, greedy (bench/rollout.py's workload). Per `--chunk` (the
model's attention_chunk: 0 as in bench/rollout.py, 512 as every config inherits from configs/base.py), one
JSON line: the ops of the while loop's body in XLA:CPU's optimized HLO (fusions, custom calls and copies;
bitcasts, constants, tuples and their elements left out), those whose op name falls in a decoder layer, per
layer; the decode call's milliseconds per step (median of `--reps` after an untimed call); and from a
jax.profiler trace of one call, the thunks' busy time per step summed by kind (matmul, attention, norm,
sampling, other) and the `--top` costliest ops. Busy times add both threads of the 2-core machine, so their
sum may exceed the step time. To compare code versions, run it from each checkout with PYTHONPATH set to it.
"""

import argparse
import collections
import glob
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

DUMP = tempfile.mkdtemp(prefix="decode_ops_")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*decode_segment.*"
)

import jax
import numpy as np
from common import SIZES
from rollout import BATCH, NEW, PROMPT, greedy_sampler

from jaxsearch.models import qwen2

_SKIP = ("get-tuple-element(", " bitcast(", " constant(", " parameter(", " tuple(")


def loop_body_ops(hlo: str) -> list[tuple[str, str, str]]:
    """(name, result type, op_name metadata) of each counted instruction of the first while loop's body."""
    body = re.search(r"while\(.*?body=%([\w.-]+)", hlo).group(1)
    start = hlo.index(f"%{body} ")
    lines = hlo[start : hlo.index("\n}\n", start)].splitlines()[1:]
    ops = []
    for line in lines:
        if " = " not in line or any(s in line for s in _SKIP):
            continue
        name, typ = re.match(r"\s*(?:ROOT )?%(\S+) = (\S+) ", line).groups()
        meta = re.search(r'op_name="([^"]+)"', line)
        ops.append((name, typ, meta.group(1) if meta else ""))
    return ops


def kind(op_name: str, name: str) -> str:
    """The part of the step an op belongs to, from its op name (the jitted function's scopes)."""
    if "/attn/cond/" in op_name or "/attn/scatter" in op_name:  # the decode attention and the cache writes
        return "attention"
    if "dot_general" in op_name:
        return "matmul"
    if "norm/" in op_name or "reduce-window" in name:  # XLA:CPU's split reductions carry no op name
        return "norm"
    if "layers_" in op_name:
        return "layer elementwise"
    return "sampling and loop"


def measure(size: str, chunk: int, reps: int, top: int) -> dict:
    config = qwen2.Qwen2Config(**SIZES[size], tie_word_embeddings=True, attention_chunk=chunk)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    smp = greedy_sampler(config)
    prompts = np.random.default_rng(1234).integers(1, config.vocab_size, (BATCH, PROMPT)).tolist()
    start = smp.start(params, prompts, 0)

    def call():
        state = jax.tree.map(lambda x: x.copy(), start)  # the decode call donates its state
        jax.block_until_ready(state)
        t0 = time.perf_counter()
        seg, _ = smp.decode(params, state, NEW)
        jax.block_until_ready(seg.tokens)
        return time.perf_counter() - t0

    call()
    step_ms = 1e3 * statistics.median(call() for _ in range(reps)) / NEW
    (path,) = sorted(glob.glob(os.path.join(DUMP, "*decode_segment*after_optimizations.txt")))[-1:]
    with open(path) as f:
        ops = loop_body_ops(f.read())
    by_name = {name: (typ, meta) for name, typ, meta in ops}
    layer_ops = sum("layers_" in meta for _, _, meta in ops)

    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            call()
        (trace,) = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
        data = jax.profiler.ProfileData.from_file(trace)
    busy = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                if e.name in by_name:
                    busy[e.name] += e.duration_ns
    kinds = collections.Counter()
    for name, ns in busy.items():
        kinds[kind(by_name[name][1], name)] += ns

    def us(ns):  # per step
        return round(ns / NEW / 1e3, 1)

    return {
        "bench": "decode_ops",
        "size": size,
        "attention_chunk": chunk,
        "loop_body_ops": len(ops),
        "ops_per_layer": layer_ops / config.num_hidden_layers,
        "decode_step_ms": round(step_ms, 3),
        "busy_us_per_step": us(sum(busy.values())),
        "busy_us_by_kind": {k: us(v) for k, v in kinds.most_common()},
        "top_ops": [
            [name, by_name[name][0], by_name[name][1].split("/body/")[-1][-60:], us(ns)]
            for name, ns in busy.most_common(top)
        ],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="S", choices=sorted(SIZES))
    ap.add_argument("--chunk", nargs="+", type=int, default=[0, 512], help="attention_chunk values")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--top", type=int, default=12, help="the costliest ops listed")
    args = ap.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, code {sys.path[0]}", flush=True)
    for chunk in args.chunk:
        shutil.rmtree(DUMP, ignore_errors=True)  # the previous chunk's dumps
        print(json.dumps(measure(args.size, chunk, args.reps, args.top)), flush=True)


if __name__ == "__main__":
    main()
