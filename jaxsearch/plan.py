"""Memory plan of a config on a mesh without allocating weights: abstract state, AOT-compiled train and
decode steps, and XLA's per-device memory analysis against a target accelerator.

The caller must have created enough devices (e.g. XLA_FLAGS=--xla_force_host_platform_device_count=N
before jax is imported); `launch/plan.py` does that.
"""

from __future__ import annotations

import functools
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsearch import parallel
from jaxsearch.agent import sampler as sampler_lib
from jaxsearch.agent import slots as slots_lib
from jaxsearch.config import RunConfig
from jaxsearch.models import qwen2
from jaxsearch.agent.policy import model_config
from jaxsearch.rl import algorithms
from jaxsearch.rl import train_step as ts
from jaxsearch.models.sharding import decode_param_shardings, param_shardings

GB = 1e9
# memory per device in bytes (the marketing numbers: H100 80 GB, v5p 95 GB, H200 141 GB)
TARGETS = {"h100-80gb": 80 * GB, "v5p-95gb": 95 * GB, "h200-141gb": 141 * GB}


def target_bytes(target: str) -> float:
    """A TARGETS name or a number of GB per device ('0.5')."""
    if target in TARGETS:
        return TARGETS[target]
    try:
        return float(target) * GB
    except ValueError:
        raise ValueError(
            f"--target {target!r}: expected one of {sorted(TARGETS)} or a number of GB"
        ) from None


def parse_mesh(text: str) -> dict[str, int]:
    """'data=2,fsdp=4,tensor=2' or 'fsdp=8' -> {'data': 2, 'fsdp': 4, 'tensor': 2}."""
    shape = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, size = part.partition("=")
        if name not in parallel.MESH_AXES or not size.isdigit() or int(size) < 1:
            raise ValueError(f"--mesh {text!r}: expected axis=size pairs over {parallel.MESH_AXES}")
        shape[name] = int(size)
    if not shape:
        raise ValueError("--mesh is empty")
    return shape


def mesh_size(shape: dict[str, int]) -> int:
    return int(np.prod(list(shape.values())))


# TPU v5p slices by chip count (one JAX device per chip): the 3D torus shapes of Cloud TPU's v5p-{2N}.
V5P_TOPOLOGIES = {
    1: "1x1x1",
    2: "1x2x1",
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
}


def plan_devices(n: int, backend: str = "cpu") -> list:
    """`n` devices to compile for. cpu: the host's fake CPU devices (XLA_FLAGS device count); tpu: abstract
    TPU v5p chips of a slice of `n` chips, compiled by libtpu's compiler without any TPU attached
    (`pip install -e ".[tpu]"`)."""
    if backend == "cpu":
        devices = jax.devices("cpu")
        if len(devices) < n:
            raise ValueError(
                f"{n} devices needed, {len(devices)} CPU devices exist: set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before jax is imported"
            )
        return devices[:n]
    if backend == "tpu":
        if n not in V5P_TOPOLOGIES:
            raise ValueError(
                f"--backend tpu: {n} chips is not a v5p slice; use one of {sorted(V5P_TOPOLOGIES)}"
            )
        from jax.experimental import topologies

        try:
            topology = topologies.get_topology_desc(topology_name=f"v5p:{V5P_TOPOLOGIES[n]}", platform="tpu")
        except Exception as e:  # no libtpu, or one this jax cannot load
            raise RuntimeError(
                f"--backend tpu needs libtpu to compile for TPU without one (pip install -e '.[tpu]'): {e}"
            ) from None
        return list(topology.devices)
    raise ValueError(f"--backend {backend!r}: expected 'cpu' or 'tpu'")


def device_bytes(tree) -> int:
    """Bytes one device holds of a pytree of ShapeDtypeStructs (or arrays) with NamedShardings."""
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
    return total


def _mesh_of(tree):
    """The mesh of a pytree whose leaves carry NamedShardings."""
    return jax.tree_util.tree_leaves(tree)[0].sharding.mesh


def _with(x, sharding):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def abstract_params(config: qwen2.Qwen2Config, mesh):
    """Params as ShapeDtypeStructs carrying `models.sharding.param_shardings` (nothing is allocated)."""
    shapes = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))
    return jax.tree_util.tree_map(_with, shapes, param_shardings(config, mesh))


def abstract_critic(config: qwen2.Qwen2Config, params):
    """The critic of `ts.init_critic`: a trunk like the policy and a replicated fp32 value head."""
    mesh = _mesh_of(params)
    rep = NamedSharding(mesh, P())
    head = {
        "kernel": jax.ShapeDtypeStruct((config.hidden_size,), jnp.float32, sharding=rep),
        "bias": jax.ShapeDtypeStruct((), jnp.float32, sharding=rep),
    }
    return {"trunk": params, "value_head": head}


def abstract_state(params, optimizer) -> ts.TrainState:
    """TrainState of `params` with `optimizer`'s state: subtrees shaped like the params (adam's mu / nu)
    take the params' shardings, everything else (counts) is replicated."""
    mesh = _mesh_of(params)
    rep = NamedSharding(mesh, P())
    treedef = jax.tree_util.tree_structure(params)
    shardings = jax.tree_util.tree_map(lambda x: x.sharding, params)
    opt = jax.eval_shape(optimizer.init, params)

    def place(node):
        if jax.tree_util.tree_structure(node) == treedef:
            return jax.tree_util.tree_map(_with, node, shardings)
        return _with(node, rep)

    opt = jax.tree_util.tree_map(place, opt, is_leaf=lambda n: jax.tree_util.tree_structure(n) == treedef)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
    return ts.TrainState(params, opt, scalar, scalar)


def abstract_batch(mesh, rows: int, width: int, ppo: bool, critic: bool = False) -> dict:
    """One update batch as the algorithm builds it (`algorithms.example_batch`), abstract and sharded over the
    data axes as the jitted update takes it."""
    example = algorithms.example_batch(rows, width, ppo, critic)
    return jax.tree_util.tree_map(
        lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        example,
        ts.batch_shardings(mesh, example),
    )


def memory(compiled) -> dict:
    """XLA's per-device memory analysis of a compiled executable, in bytes."""
    m = compiled.memory_analysis()
    out = dict(
        argument=int(m.argument_size_in_bytes),
        output=int(m.output_size_in_bytes),
        temp=int(m.temp_size_in_bytes),
        alias=int(m.alias_size_in_bytes),
        generated_code=int(getattr(m, "generated_code_size_in_bytes", 0)),
    )
    # donated outputs reuse their argument buffers
    out["total"] = out["argument"] + out["temp"] + out["output"] - out["alias"]
    return out


_HLO_ARRAY = re.compile(r"\b(f64|f32|bf16|f16|s64|s32|u32|s8|u8|pred)\[([\d,]+)\]")
_ITEMSIZE = dict(f64=8, f32=4, bf16=2, f16=2, s64=8, s32=4, u32=4, s8=1, u8=1, pred=1)


def largest_arrays(hlo_text: str, n: int = 5) -> list[tuple[str, int]]:
    """The n largest distinct array shapes (per device) in a compiled module's HLO, with their bytes: where
    a blown-up temp comes from (e.g. a batch the partitioner gathered instead of the weights)."""
    sizes = {}
    for m in _HLO_ARRAY.finditer(hlo_text):
        dims = [int(d) for d in m.group(2).split(",")]
        sizes[m.group(0)] = int(np.prod(dims, dtype=np.int64)) * _ITEMSIZE[m.group(1)]
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:n]


def compile_fn(jitted, *args) -> tuple[dict, float]:
    """AOT-compile the jitted function on abstract `args`; (memory analysis + largest arrays, compile s)."""
    start = time.perf_counter()
    lowered = jitted.lower(*args)
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        # a TPU compiler refuses a program larger than its HBM; it says how much the temporaries need
        need = _HBM_NEED.search(str(e))
        if need is None:
            raise
        mem = dict(argument=device_bytes(args), output=0, temp=int(float(need.group(1)) * 2**30), alias=0)
        mem.update(generated_code=0, compiled=False, largest_arrays=[])
        mem["total"] = mem["argument"] + mem["temp"]
        return mem, time.perf_counter() - start
    seconds = time.perf_counter() - start
    mem = memory(compiled)
    mem["compiled"] = True
    mem["largest_arrays"] = largest_arrays(compiled.as_text())
    return mem, seconds


_HBM_NEED = re.compile(r"memory required for HLO temporaries \(([\d.]+)G\) exceeds")


def _shardings(tree):
    return jax.tree_util.tree_map(lambda x: x.sharding, tree)


def plan_train_step(loss_fn, agg_mode, micro_batches, optimizer, state, batch) -> tuple[dict, float]:
    """The trainer's update (`train_step.jit_train_step`) compiled on the abstract state and batch."""
    mesh = _mesh_of(state.params)
    jitted = ts.jit_train_step(
        loss_fn, agg_mode, micro_batches, optimizer, mesh, _shardings(state), _shardings(batch)
    )
    return compile_fn(jitted, state, batch)


def abstract_cache(config: qwen2.Qwen2Config, mesh, batch: int, cache_len: int) -> qwen2.KVCache:
    """The decode KV cache, batch over the data axes and kv heads over `tensor` where it divides."""
    shapes = jax.eval_shape(functools.partial(qwen2.init_cache, config, batch, cache_len))
    kv = NamedSharding(
        mesh,
        parallel.logical_to_spec(qwen2.CACHE_AXES, shapes.k[0].shape, mesh),
    )
    lengths = NamedSharding(mesh, parallel.logical_to_spec(("batch",), (batch,), mesh))
    return qwen2.KVCache(
        k=tuple(_with(x, kv) for x in shapes.k),
        v=tuple(_with(x, kv) for x in shapes.v),
        lengths=_with(shapes.lengths, lengths),
    )


def abstract_decode_params(config: qwen2.Qwen2Config, params, layout: str):
    """The sampler's params (`models.sharding.to_decode_layout`): `params` for "train", else a copy in the compute
    dtype carrying the layout's shardings."""
    if layout == "train":
        return params
    shardings = decode_param_shardings(config, _mesh_of(params), layout)
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, config.compute_dtype, sharding=s), params, shardings
    )


def plan_decode_step(config: qwen2.Qwen2Config, params, cache, cfg) -> tuple[dict, float]:
    """The rollout's decode call compiled on the abstract params and cache, the state donated: the lockstep
    sampler's (`sampler.jit_decode`: a segment of up to max_segment_tokens steps) or, with
    `rollout.scheduler=slots`, the decode slots' (`slots.decode_steps`: steps_per_call steps)."""
    mesh = _mesh_of(params)
    lengths = cache.lengths
    rows = lengths.shape[0]
    logits = jax.ShapeDtypeStruct(
        (rows, config.vocab_size), jnp.float32, sharding=parallel.batch_sharding(mesh, 2)
    )
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), rows))
    keys = jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=NamedSharding(mesh, P()))
    state = sampler_lib.DecodeState(cache=cache, logits=logits, keys=keys)
    per_row = functools.partial(jax.ShapeDtypeStruct, sharding=lengths.sharding)
    table = sampler_lib.StopTable.eos_only(config.vocab_size, [0])
    r = cfg.rollout
    sampling = sampler_lib.SamplingParams(r.temperature, r.top_p, r.top_k)
    if r.scheduler == "slots":
        window = jax.ShapeDtypeStruct(
            (rows, sampler_lib.window_size(table)), jnp.uint8, sharding=parallel.batch_sharding(mesh, 2)
        )
        slot_state = slots_lib.SlotState(state, per_row((rows,), bool), per_row((rows,), jnp.int32), window)
        jitted = slots_lib.jit_decode_steps(mesh)
        return compile_fn(jitted, config, params, slot_state, table, sampling, r.steps_per_call)
    jitted = sampler_lib.jit_decode(mesh)
    budget = per_row((rows,), jnp.int32)
    return compile_fn(jitted, config, params, state, budget, table, sampling, r.max_segment_tokens)


def plan(
    cfg, mesh_shape: dict[str, int], target: str = "h100-80gb", headroom: float = 0.1, backend: str = "cpu"
) -> dict:
    """The memory plan of config `cfg` on a mesh of `mesh_shape` (bytes per device), compiled by the
    `backend`'s XLA compiler (see `plan_devices`)."""
    cfg = RunConfig.from_dict(cfg)
    config = model_config(cfg.model)
    mesh = parallel.make_mesh(mesh_shape, plan_devices(mesh_size(mesh_shape), backend))
    ppo = cfg.algo.advantage == "gae"
    rows = cfg.data.batch_size * cfg.data.group_size
    mb, width = algorithms.mini_batch_rows(cfg), cfg.rollout.cache_len

    params = abstract_params(config, mesh)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    optimizers = algorithms.optimizers(cfg)  # the run's: warmup, schedule, clipping
    state = abstract_state(params, optimizers["policy"])
    loss_cfg = algorithms.loss_config(cfg)
    batch = abstract_batch(mesh, mb, width, ppo)
    train, train_s = plan_train_step(
        ts.policy_loss_fn(config, loss_cfg),
        cfg.algo.agg_mode,
        cfg.algo.micro_batches,
        optimizers["policy"],
        state,
        batch,
    )

    resident = {"policy_state": device_bytes(state), "policy_params": device_bytes(params)}
    resident["reference_params"] = device_bytes(params) if (cfg.algo.kl_coef or cfg.algo.kl_in_reward) else 0
    critic = None
    if ppo:
        c_params = abstract_critic(config, params)
        c_state = abstract_state(c_params, optimizers["critic"])
        c_batch = abstract_batch(mesh, mb, width, ppo, critic=True)
        c_loss = functools.partial(ts.critic_loss, config, cfg.critic.clip_eps, cfg.algo.agg_mode)
        c_mem, c_s = plan_train_step(
            c_loss, cfg.algo.agg_mode, cfg.algo.micro_batches, optimizers["critic"], c_state, c_batch
        )
        critic = dict(memory=c_mem, compile_s=c_s)
        resident["critic_state"] = device_bytes(c_state)
    else:
        resident["critic_state"] = 0

    roll_rows = cfg.rollout.micro_batch or rows
    cache = abstract_cache(config, mesh, roll_rows, width)
    layout = cfg.rollout.decode_layout
    decode_params = abstract_decode_params(config, params, layout)
    decode, decode_s = plan_decode_step(config, decode_params, cache, cfg)
    kv = device_bytes(cache)
    resident["decode_params"] = 0 if layout == "train" else device_bytes(decode_params)

    # phases: the update (policy state in the step, the reference / critic resident beside it) and the
    # rollout (the whole train state stays resident; the decode step reads the params, or their decode
    # layout copy, and the cache: both are among its arguments)
    others = resident["reference_params"] + resident["critic_state"]
    phases = {"train_step": train["total"] + others}
    if critic:
        phases["critic_step"] = (
            critic["memory"]["total"] + resident["policy_state"] + resident["reference_params"]
        )
    in_decode_args = resident["policy_params"] if layout == "train" else 0
    phases["rollout"] = decode["total"] + others + resident["policy_state"] - in_decode_args
    peak = max(phases.values())
    capacity = target_bytes(target)
    budget = capacity * (1 - headroom)
    return dict(
        mesh=dict(mesh.shape),
        devices=mesh.size,
        backend=backend,
        model=dict(
            num_params=n_params,
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            remat=config.remat,
        ),
        algo=dict(advantage=cfg.algo.advantage, mini_batch_rows=mb, micro_batches=cfg.algo.micro_batches),
        seq_len=width,
        rollout_rows=roll_rows,
        decode_layout=layout,
        scheduler=cfg.rollout.scheduler,
        train_step=dict(memory=train, compile_s=train_s),
        critic_step=critic,
        decode_step=dict(memory=decode, compile_s=decode_s),
        kv_cache=dict(per_device=kv, total=kv_total(cache)),
        resident=resident,
        phases=phases,
        peak=peak,
        target=dict(name=target, capacity=capacity, headroom=headroom, budget=budget),
        fits=bool(peak <= budget),
    )


def kv_total(cache) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(cache))


def format_report(r: dict) -> str:
    """A readable table of `plan`'s result (GB = 1e9 bytes, per device unless said)."""

    def g(b):
        return f"{b / GB:9.2f}"

    lines = [
        f"mesh {r['mesh']} ({r['devices']} {r['backend']} devices); model {r['model']['num_params'] / 1e9:.2f}B params, "
        f"{r['model']['param_dtype']} params / {r['model']['dtype']} compute, remat={r['model']['remat']}",
        f"algo {r['algo']['advantage']}: mini-batch {r['algo']['mini_batch_rows']} rows x {r['seq_len']} tokens, "
        f"{r['algo']['micro_batches']} micro-batches; rollout {r['rollout_rows']} rows, "
        f"{r['scheduler']} scheduler, decode layout {r['decode_layout']}",
        "",
        f"{'per device (GB)':<22}{'argument':>10}{'temp':>10}{'output':>10}{'alias':>10}{'total':>10}"
        f"{'compile s':>11}",
    ]
    steps = [
        ("train_step", r["train_step"]),
        ("critic_step", r["critic_step"]),
        ("decode_step", r["decode_step"]),
    ]
    for name, s in steps:
        if s is None:
            continue
        m = s["memory"]
        lines.append(
            f"{name:<22}{g(m['argument']):>10}{g(m['temp']):>10}{g(m['output']):>10}{g(m['alias']):>10}"
            f"{g(m['total']):>10}{s['compile_s']:>11.1f}"
            + ("" if m.get("compiled", True) else "   refused: temporaries over the chip's HBM")
        )
    lines.append("")
    for k, v in r["resident"].items():
        lines.append(f"{'resident ' + k:<32}{g(v)}")
    kv = r["kv_cache"]
    lines.append(
        f"{'KV cache (rollout batch)':<32}{g(kv['per_device'])}   ({kv['total'] / GB:.1f} GB in all)"
    )
    for k, v in r["phases"].items():
        lines.append(f"{'phase ' + k:<32}{g(v)}")
    lines.append("")
    for name, s in steps:
        if s is not None:
            big = ", ".join(f"{a} {b / GB:.2f}" for a, b in s["memory"]["largest_arrays"][:3])
            lines.append(f"largest arrays in {name} (GB per device): {big}")
    t = r["target"]
    verdict = "FITS" if r["fits"] else "DOES NOT FIT"
    lines.append("")
    lines.append(
        f"peak {r['peak'] / GB:.2f} GB per device vs {t['name']} {t['capacity'] / GB:.0f} GB "
        f"(budget {t['budget'] / GB:.1f} GB with {t['headroom']:.0%} headroom): {verdict}"
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- step time

# Per chip: dense bf16 FLOP/s, HBM bytes/s, and the bytes/s one chip receives in an all-gather over its
# interconnect (v5p: 4,800 Gbps ICI = 600 GB/s; H100 SXM: NVLink 900 GB/s bidirectional = 450 GB/s in).
HARDWARE = {
    "v5p": dict(flops=459e12, hbm=2.765e12, gather=600e9),
    "h100": dict(flops=989e12, hbm=3.35e12, gather=450e9),
}


def step_time_estimate(
    cfg,
    chips: int,
    hardware: str,
    mfu: float = 0.4,
    seq_len: int = 2048,
    decode_steps: int | None = None,
    tensor: int = 1,
) -> dict:
    """Seconds per RL step of config `cfg` on `chips` chips, from FLOPs and bytes (no measurement):

    update    (6 + 2 remat) N T for fwd + bwd per token, + 2 x 2 N T for the old-policy and reference
              log-prob passes (4 when kl_coef = 0 and a single epoch: no reference); T = rows x seq_len;
              at `mfu` of the chips' peak
    rollout   `decode_steps` sequential steps (default max_turns x max_segment_tokens, every segment running
              to its budget: an upper bound) per rollout micro-batch; each step is bound by the slowest of
              all-gathering the bf16 weights (decode layout "train": the sampler reads the fsdp-sharded
              params), reading the KV cache (split over the chips) and the weights from HBM (a chip reads
              1 / chips of them in the train layout, all of them replicated, 1 / tensor of them
              tensor-parallel over a `tensor` axis of that size), and its FLOPs
    """
    cfg = RunConfig.from_dict(cfg)
    config = model_config(cfg.model)
    hw = HARDWARE[hardware]
    n = config.num_params()
    rows = cfg.data.batch_size * cfg.data.group_size
    tokens = rows * seq_len
    passes = 8 + 2 + (2 if (cfg.algo.kl_coef or cfg.algo.kl_in_reward) else 0)
    if cfg.algo.advantage == "gae":
        passes *= 2  # the critic: its own forward, backward and value pass
    update_flops = passes * n * tokens
    update_s = update_flops / (chips * hw["flops"] * mfu)

    steps = decode_steps or cfg.rollout.max_turns * cfg.rollout.max_segment_tokens
    micro = cfg.rollout.micro_batch or rows
    n_micro = -(-rows // micro)
    weight_bytes = 2 * n  # bf16
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
    kv_bytes = micro * seq_len * kv_per_token  # the cache read by each step (average context seq_len)
    layout = cfg.rollout.decode_layout
    gather_s = weight_bytes * (chips - 1) / chips / hw["gather"] if layout == "train" else 0.0
    weights_read = {"train": weight_bytes / chips, "replicated": weight_bytes, "tensor": weight_bytes / tensor}
    hbm_s = (weights_read[layout] + kv_bytes / chips) / hw["hbm"]
    flops_s = 2 * n * micro / (chips * hw["flops"])
    per_step = max(gather_s, hbm_s, flops_s)
    rollout_s = n_micro * steps * per_step
    return dict(
        chips=chips,
        hardware=hardware,
        update_tflop=update_flops / 1e12,
        update_s=update_s,
        decode_step_ms=per_step * 1e3,
        decode_bound="all-gather" if per_step == gather_s else ("hbm" if per_step == hbm_s else "flops"),
        rollout_s=rollout_s,
        step_s=update_s + rollout_s,
        assumptions=dict(
            mfu=mfu, seq_len=seq_len, decode_steps=steps, rollout_micro_batches=n_micro, decode_layout=layout
        ),
    )


def format_estimate(e: dict) -> str:
    a = e["assumptions"]
    return (
        f"estimated step on {e['chips']} x {e['hardware']}: {e['step_s']:.0f} s = update {e['update_s']:.0f} s "
        f"({e['update_tflop'] / 1e3:.0f} PFLOP at {a['mfu']:.0%} MFU) + rollout <= {e['rollout_s']:.0f} s "
        f"({a['rollout_micro_batches']} x {a['decode_steps']} decode steps of {e['decode_step_ms']:.1f} ms, "
        f"{e['decode_bound']}-bound, decode layout {a['decode_layout']}); {a['seq_len']} tokens per row on average"
    )
