"""Where a compiled step's bytes go: the buffers live at its memory peak, read from XLA's dump of the compile
(buffer liveness, assignment and the optimized HLO), sorted into terms by their shapes, and a phase's
breakdown: the exact terms (the step's arguments, what is resident beside it), those temporaries and the
remainder of the compiler's figure. XLA:CPU's fp32 copies of bf16 values are named: a TPU or GPU makes none.
"""

from __future__ import annotations

import glob
import os
import re

import jax
import numpy as np

from jaxsearch.models import qwen2

GB = 1e9


def _tuple_elements(shape: str) -> list[str]:
    """'(s32[], bf16[2,3]{1,0}, /*index=2*/f32[4])' -> ['s32[]', 'bf16[2,3]{1,0}', 'f32[4]'] (top level)."""
    inner = re.sub(r"/\*[^*]*\*/", "", shape.strip())[1:-1]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    parts.append(inner[start:].strip())
    return parts


_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\((.*?)\)", re.M)
_PEAK_VALUE = re.compile(r"^\s+([\w.\-]+)\{([\d,]*)\}: (\d+) bytes", re.M)


def _allocation_kinds(assignment: str) -> dict[str, str]:
    """XLA's buffer-assignment dump -> {value name ('fusion.3', 'while.2{1}'): the kind of allocation it
    lives in}: argument (an entry parameter's buffer, donated outputs included), output, temp or constant."""
    kinds, kind = {}, "temp"
    for line in assignment.splitlines():
        if line.startswith("allocation "):
            head = line.split(":", 1)[1]
            if "parameter " in head:
                kind = "argument"
            elif "constant" in head or "thread-local" in head:
                kind = "constant"
            elif "output" in head or "live-out" in head:
                kind = "output"
            else:
                kind = "temp"
        elif line.startswith(" value: <"):
            kinds.setdefault(line.split()[2].replace("{}", ""), kind)
    return kinds


def peak_buffers(dump_dir: str) -> list[dict]:
    """The buffers live at a compiled module's memory peak, read from XLA's dump of it in `dump_dir`
    (`*after_optimizations-live-range.txt`: "Live ranges at N (peak)"; `*after_optimizations.txt`: each
    instruction's shape and operands; `*-buffer-assignment.txt`: which allocation each value lives in). Each:
    name, shape ('bf16[8,4096]', no layout), bytes, allocation (argument | output | temp | constant),
    source_live (every operand lives in an argument or is live at the peak: a copy of it adds its own bytes,
    no more) and upcast (an fp32 convert of bf16 operands). [] when the backend's compiler writes no such
    dump."""
    ranges = glob.glob(os.path.join(dump_dir, "*after_optimizations-live-range.txt"))
    if len(ranges) != 1:
        return []
    stem = ranges[0][: -len("-live-range.txt")]
    text = open(ranges[0]).read()
    start = text.find("(peak):")
    if start < 0 or not os.path.exists(stem + ".txt"):
        return []
    block = text[start : text.find("Stack trace", start)]
    hlo = open(stem + ".txt").read()
    assignment = stem + "-buffer-assignment.txt"
    kinds = _allocation_kinds(open(assignment).read()) if os.path.exists(assignment) else {}
    instructions = {}
    for m in _HLO_INSTRUCTION.finditer(hlo):
        operands = re.findall(r"%([\w.\-]+)", m.group(4))
        instructions.setdefault(m.group(1), (m.group(2), m.group(3), operands))
    live = {m.group(1) for m in _PEAK_VALUE.finditer(block)}
    out = []
    for m in _PEAK_VALUE.finditer(block):
        name, index, size = m.group(1), m.group(2), int(m.group(3))
        shape, opcode, operands = instructions.get(name, ("?", "?", []))
        if shape.startswith("("):
            for i in (int(x) for x in index.split(",") if x):
                shape = _tuple_elements(shape)[i]
        key = name + (f"{{{index}}}" if index else "")
        held = lambda o: o in live or kinds.get(o) == "argument"
        sources = {_dims(instructions[o][0])[0] for o in operands if o in instructions}
        out.append(
            dict(
                name=key,
                shape=re.sub(r"\{[^}]*\}$", "", shape),
                bytes=size,
                allocation=kinds.get(key, "argument" if opcode == "parameter" else "temp"),
                source_live=bool(operands) and all(held(o) for o in operands),
                # XLA:CPU's fp32 copy of a bf16 value: a convert (or a fusion around one) from bf16 to f32
                upcast=shape.startswith("f32") and "convert" in name and bool(sources & {"bf16", "f16"}),
            )
        )
    return out


# the temporaries live at a step's peak, by what they hold (first matching rule; `classify_buffer`)
TEMP_TERMS = {
    "gathered": "gathered weights (whole: fsdp all-gather)",
    "weight_shaped": "weight-shaped: grads, updates, stacked or converted copies",
    "logits": "logits / log-softmax over the vocabulary",
    "checkpoints": "layer inputs kept for the backward (remat)",
    "kv": "KV cache copies and updates",
    "activations": "one layer's activations (attention, MLP)",
    "other": "other temporaries",
}


def _dims(shape: str) -> tuple[str, list[int]]:
    """'bf16[8,4096]' -> ('bf16', [8, 4096])."""
    m = re.match(r"(\w+)\[([\d,]*)\]", shape)
    if m is None:
        return "", []
    return m.group(1), [int(d) for d in m.group(2).split(",") if d]


def shape_facts(config: qwen2.Qwen2Config, params, seq_len: int, cache=None) -> dict:
    """What `classify_buffer` matches a buffer against: vocab, hidden, layers, the step's sequence lengths,
    the element counts of the params whole and of one device's shard (each leaf, and L of a layer's leaf
    stacked), and of one layer's KV cache on one device (a decode step: `cache` given, no backward)."""
    whole, shard = set(), set()
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        stacked = any("layers_" in str(p) for p in path)
        for numels, shape in ((whole, x.shape), (shard, x.sharding.shard_shape(x.shape))):
            n = int(np.prod(shape, dtype=np.int64))
            numels.add(n)
            if stacked:
                numels.add(n * config.num_hidden_layers)
    kv = set()
    if cache is not None:
        n = int(np.prod(cache.k[0].sharding.shard_shape(cache.k[0].shape), dtype=np.int64))
        kv = {n, n * config.num_hidden_layers}
    return dict(
        vocab=config.vocab_size,
        hidden=config.hidden_size,
        layers=config.num_hidden_layers,
        seq={seq_len, seq_len - 1},
        whole=whole - shard,  # a whole leaf that is not also some leaf's shard (replicated biases, norms)
        shard=shard,
        kv=kv,
    )


def classify_buffer(shape: str, facts: dict) -> str:
    """The TEMP_TERMS key of a temporary of `shape` ('f32[28,8,4095,3584]'): from its dims and size."""
    _, dims = _dims(shape)
    n = int(np.prod(dims, dtype=np.int64)) if dims else 0
    has_seq = any(d >= min(facts["seq"]) and any(d % s == 0 for s in facts["seq"]) for d in dims)
    if n in facts["kv"]:
        return "kv"
    if not has_seq and n in facts["whole"]:
        return "gathered"
    if not has_seq and n in facts["shard"]:
        return "weight_shaped"
    if facts["vocab"] in dims:
        return "logits"
    if facts["kv"] == set() and facts["layers"] in dims and facts["hidden"] in dims and has_seq:
        return "checkpoints"
    if has_seq:
        return "activations"
    return "other"


def itemise_temps(buffers: list[dict], facts: dict, backend: str) -> dict:
    """The temporaries (and outputs not in a donated argument's buffer) live at the peak, summed by TEMP_TERMS
    key: {key: dict(bytes, cpu_upcast, cpu_excess)}. cpu_upcast: the bytes of fp32 copies XLA:CPU makes of
    bf16 values (it has no bf16 arithmetic: a convert to f32 feeds each bf16 dot, scatter and reduction); a
    TPU or GPU computes on the bf16 value. cpu_excess: what those copies cost beyond the accelerator's: all
    of it where the bf16 value is itself held (an argument, or live at the peak), half of it (the bf16
    value's own bytes) where only the copy is."""
    terms = {k: dict(bytes=0, cpu_upcast=0, cpu_excess=0) for k in TEMP_TERMS}
    for b in buffers:
        if b["allocation"] not in ("temp", "output"):
            continue
        t = terms[classify_buffer(b["shape"], facts)]
        t["bytes"] += b["bytes"]
        if backend == "cpu" and b["upcast"]:
            t["cpu_upcast"] += b["bytes"]
            t["cpu_excess"] += b["bytes"] if b["source_live"] else b["bytes"] // 2
    return terms


def step_breakdown(mem: dict, arguments: dict, resident: dict, facts: dict, backend: str) -> dict:
    """One phase, term by term (bytes per device): `arguments` (name -> bytes, exact: the shapes the compiled
    step takes, the same on every backend), padding (what the compiler's argument size adds to them: a TPU's
    tiles), the temporaries live at the step's peak (`itemise_temps`), the remainder of the compiler's temp +
    output - alias that no live buffer accounts for (buffer packing, outputs not written in place), and
    `resident` (name -> bytes: held beside the step, not among its arguments). total = the compiler's step
    total + resident; accelerator = total less XLA:CPU's fp32 upcasts beyond what the bf16 values need."""
    # a TPU lays small arrays out in padded tiles: its argument bytes exceed the shapes'
    padding = mem["argument"] - sum(arguments.values())
    temps = itemise_temps(mem.get("peak_buffers", []), facts, backend)
    itemised = sum(t["bytes"] for t in temps.values())
    remainder = mem["total"] - mem["argument"] - itemised
    total = mem["total"] + sum(resident.values())
    excess = sum(t["cpu_excess"] for t in temps.values())
    return dict(
        arguments=arguments,
        padding=padding,
        temps=temps,
        remainder=remainder,
        itemised=bool(mem.get("peak_buffers")),
        resident=resident,
        total=total,
        accelerator=total - excess,
    )


def format_breakdown(r: dict) -> list[str]:
    """Each phase of `plan`'s result term by term (GB per device): exact terms are the shapes the compiled
    step takes, the same on any backend; "backend" terms are what this backend's compiler made of it."""
    g = lambda b: f"{b / GB:8.2f}"
    lines = [
        f"{'where the bytes go (GB per device)':<64}{'GB':>8}{'CPU-only':>10}  basis",
    ]
    for name, b in r["breakdown"].items():
        lines.append(f"phase {name}")
        for k, v in b["arguments"].items():
            lines.append(f"  {k:<62}{g(v)}{'':>10}  exact (step argument)")
        if b["padding"]:
            lines.append(f"  {'layout padding of the arguments':<62}{g(b['padding'])}{'':>10}  backend")
        for k, v in b["resident"].items():
            if v:
                lines.append(f"  {k:<62}{g(v)}{'':>10}  exact (resident beside the step)")
        if b["itemised"]:
            for key, t in b["temps"].items():
                if t["bytes"]:
                    cpu = g(t["cpu_upcast"]) + "  " if t["cpu_upcast"] else f"{'':>10}"
                    lines.append(
                        f"  {TEMP_TERMS[key]:<62}{g(t['bytes'])}{cpu:>10}  backend (live at the peak)"
                    )
            # XLA:CPU: heap packing; libtpu: its peak list leaves out the buffers inside loops (scan bodies)
            rest = "remainder: compiler's bytes the peak's live list leaves out"
        else:
            rest = "temporaries (not itemised: no XLA dump, e.g. a compilation cache hit)"
        lines.append(f"  {rest:<62}{g(b['remainder'])}{'':>10}  backend")
        lines.append(f"  {'= total: the compiled step + the terms beside it':<62}{g(b['total'])}")
        if r["backend"] == "cpu":
            lines.append(
                f"  {'= on a TPU / GPU (less the CPU-only fp32 copies beyond bf16)':<62}{g(b['accelerator'])}"
            )
    return lines
