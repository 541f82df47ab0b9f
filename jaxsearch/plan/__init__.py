"""Memory plan of a config on a mesh without allocating weights: abstract state, AOT-compiled train and
decode steps, and XLA's per-device memory analysis against a target accelerator.

The caller must have created enough devices (e.g. XLA_FLAGS=--xla_force_host_platform_device_count=N
before jax is imported); `launch/plan.py` does that.
"""

from __future__ import annotations

import functools
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsearch import parallel
from jaxsearch.agent import sampler as sampler_lib
from jaxsearch.agent import slots as slots_lib
from jaxsearch.config import RunConfig
from jaxsearch.models import lora as lora_lib
from jaxsearch.models import qwen2
from jaxsearch.agent.policy import model_config
from jaxsearch.rl import algorithms
from jaxsearch.rl import train_step as ts
from jaxsearch.models.sharding import copy_shardings, param_shardings
from jaxsearch.plan.estimate import HARDWARE as HARDWARE, format_estimate as format_estimate
from jaxsearch.plan.estimate import step_time_estimate as step_time_estimate
from jaxsearch.plan.breakdown import GB, format_breakdown, peak_buffers, shape_facts, step_breakdown

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
    # fewer than a host's 4 chips: that many chips of a 2x2x1 (libtpu refuses smaller v5p topologies:
    # "not divisible by the given (or default) chips_per_host_bounds 2x2x1")
    1: "2x2x1",
    2: "2x2x1",
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
        return list(topology.devices)[:n]
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


def abstract_adapters(config: qwen2.Qwen2Config, spec, mesh):
    """LoRA adapters as the trainer makes them (`algorithms.init_adapters`): fp32, replicated."""
    shapes = jax.eval_shape(lambda: lora_lib.init_adapters(config, spec, jax.random.PRNGKey(0)))
    return jax.tree_util.tree_map(lambda x: _with(x, NamedSharding(mesh, P())), shapes)


def policy_state(config: qwen2.Qwen2Config, spec, params, optimizer):
    """(abstract policy TrainState, frozen base or None, the loss's model config): the params' state, or with
    LoRA `spec` the adapters' state beside the frozen base `params` (the reference too)."""
    if spec is None:
        return abstract_state(params, optimizer), None, config
    adapters = abstract_adapters(config, spec, _mesh_of(params))
    return abstract_state(adapters, optimizer), params, lora_lib.lora_config(config, spec)


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
    """AOT-compile the jitted function on abstract `args`; (memory analysis + largest arrays + the buffers
    live at the memory peak (`peak_buffers`, from XLA's dump of this one compile), compile s)."""
    start = time.perf_counter()
    lowered = jitted.lower(*args)
    # a persistent compilation cache hit compiles nothing and so dumps nothing (launch/plan.py turns it off)
    with tempfile.TemporaryDirectory(prefix="jaxsearch-plan-") as dump:
        try:
            compiled = lowered.compile(compiler_options={"xla_dump_to": dump, "xla_dump_hlo_as_text": True})
        except jax.errors.JaxRuntimeError as e:
            # a TPU compiler refuses a program larger than its HBM; it says how much the temporaries need
            need = _HBM_NEED.search(str(e))
            if need is None:
                raise
            mem = dict(argument=device_bytes(args), output=0, temp=int(float(need.group(1)) * 2**30), alias=0)
            mem.update(generated_code=0, compiled=False, largest_arrays=[], peak_buffers=[])
            mem["total"] = mem["argument"] + mem["temp"]
            return mem, time.perf_counter() - start
        seconds = time.perf_counter() - start
        mem = memory(compiled)
        mem["compiled"] = True
        mem["largest_arrays"] = largest_arrays(compiled.as_text())
        mem["peak_buffers"] = peak_buffers(dump)
    return mem, seconds


_HBM_NEED = re.compile(r"memory required for HLO temporaries \(([\d.]+)G\) exceeds")


def _shardings(tree):
    return jax.tree_util.tree_map(lambda x: x.sharding, tree)


def plan_train_step(
    loss_fn, agg_mode, micro_batches, optimizer, state, batch, frozen=None
) -> tuple[dict, float]:
    """The trainer's update (`train_step.jit_train_step`) compiled on the abstract state and batch (and a LoRA
    run's frozen base)."""
    mesh = _mesh_of(state.params)
    f_shard = None if frozen is None else _shardings(frozen)
    jitted = ts.jit_train_step(
        loss_fn, agg_mode, micro_batches, optimizer, mesh, _shardings(state), _shardings(batch), f_shard
    )
    return compile_fn(jitted, state, batch, *(() if frozen is None else (frozen,)))


def abstract_cache(config: qwen2.Qwen2Config, mesh, batch: int, cache_len: int) -> qwen2.KVCache:
    """The decode KV cache, batch over the data axes and kv heads over `tensor` where it divides."""
    shapes = jax.eval_shape(functools.partial(qwen2.init_cache, config, batch, cache_len))
    keys = NamedSharding(mesh, parallel.logical_to_spec(qwen2.KEY_CACHE_AXES, shapes.k[0].shape, mesh))
    values = NamedSharding(mesh, parallel.logical_to_spec(qwen2.CACHE_AXES, shapes.v[0].shape, mesh))
    lengths = NamedSharding(mesh, parallel.logical_to_spec(("batch",), (batch,), mesh))
    return qwen2.KVCache(
        k=tuple(_with(x, keys) for x in shapes.k),
        v=tuple(_with(x, values) for x in shapes.v),
        lengths=_with(shapes.lengths, lengths),
    )


def abstract_decode_params(config: qwen2.Qwen2Config, params, layout: str, merged: bool = False):
    """The sampler's params (`models.sharding.to_decode_layout`): `params` for "train", else a copy in the
    compute dtype carrying the layout's shardings. `merged` (LoRA): always a copy, base + adapters, in the
    compute dtype ("train": with the base's shardings)."""
    if layout == "train" and not merged:
        return params
    shardings = copy_shardings(config, params, _mesh_of(params), layout)
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, config.compute_dtype, sharding=s), params, shardings
    )


def plan_decode_step(config: qwen2.Qwen2Config, params, cache, cfg) -> tuple[dict, float]:
    """The rollout's decode call compiled on the abstract params and cache, the state donated: the lockstep
    sampler's (a segment of up to max_segment_tokens steps: `sampler.jit_decode`, or per device
    `sampler.jit_decode_per_device` for params whole on every device) or, with
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
    batch = sampler_lib.per_device_batch(mesh, params, rows)  # the call `Sampler.decode` makes
    jitted = sampler_lib.jit_decode(mesh) if batch is None else sampler_lib.jit_decode_per_device(mesh, batch)
    budget = per_row((rows,), jnp.int32)
    return compile_fn(jitted, config, params, state, budget, table, sampling, r.max_segment_tokens)


def _state_arguments(state: ts.TrainState, batch: dict, weights: str) -> dict:
    """A train step's arguments by term: the weights, the optimizer's moments (the params-shaped subtrees of
    its state), its counters with the step's, and the batch."""
    treedef = jax.tree_util.tree_structure(state.params)
    is_moment = lambda n: jax.tree_util.tree_structure(n) == treedef
    moments = [n for n in jax.tree_util.tree_leaves(state.opt_state, is_leaf=is_moment) if is_moment(n)]
    moment_bytes = sum(device_bytes(n) for n in moments)
    rest = device_bytes(state) - device_bytes(state.params) - moment_bytes
    return {
        weights: device_bytes(state.params),
        f"optimizer moments ({len(moments)} copies of the weights)": moment_bytes,
        "counters and update batch" if batch else "counters": rest + device_bytes(batch),
    }


def phase_breakdowns(
    config, cfg, resident: dict, train: tuple, critic: tuple | None, rollout: tuple, backend, frozen=None
) -> dict:
    """`plan`'s phases term by term (`breakdown.step_breakdown`): the update (the train step; the reference
    and critic resident), PPO's critic update (the policy's state and the reference resident), and the rollout
    (the decode step; the train state resident). train, critic: (step memory, state, batch, params);
    rollout: (decode step memory, decode params, cache); frozen: a LoRA run's base (an argument of its update,
    resident beside its rollout; the reference too)."""
    width, layout = cfg.rollout.cache_len, cfg.rollout.decode_layout
    if frozen is not None:
        weights = "LoRA adapters (fp32, trained)"
    elif config.weight_dtype == config.compute_dtype:
        weights = f"policy weights ({config.param_dtype}; no separate master copy)"
    else:
        weights = f"policy weights ({config.param_dtype} master; {config.dtype} casts per use)"
    mem, state, batch, params = train
    policy_state = _state_arguments(state, {}, weights)
    base = {}
    if frozen is not None:
        base = {f"frozen base weights ({config.param_dtype}; the reference policy too)": device_bytes(frozen)}
    reference = {"reference policy (its params)": resident["reference_params"]}
    beside = dict(reference, **{"critic state": resident["critic_state"]})
    facts = shape_facts(config, params, width)
    arguments = dict(base, **_state_arguments(state, batch, weights))
    out = {"train_step": step_breakdown(mem, arguments, beside, facts, backend)}
    policy_state = dict(base, **policy_state)
    if critic:
        mem, c_state, c_batch, c_params = critic
        arguments = _state_arguments(c_state, c_batch, weights.replace("policy", "critic"))
        facts = shape_facts(config, c_params, width)
        out["critic_step"] = step_breakdown(mem, arguments, dict(policy_state, **reference), facts, backend)
    mem, decode_params, cache = rollout
    if frozen is not None:
        name = f"rollout copy: base + adapters merged ({config.dtype}, {layout} layout)"
        arguments = {name: device_bytes(decode_params)}
    elif layout == "train":
        arguments = {"policy weights (read in place: the train layout)": policy_state.pop(weights)}
    else:
        arguments = {
            f"rollout copy of the weights ({config.dtype}, {layout} layout)": device_bytes(decode_params)
        }
    arguments[f"KV cache ({cache.lengths.shape[0]} rows x {width} tokens, split over the mesh)"] = (
        device_bytes(cache)
    )
    arguments["decode state (last logits, keys, flags, stop table; + padding)"] = mem["argument"] - sum(
        arguments.values()
    )
    facts = shape_facts(config, decode_params, width, cache)
    out["rollout"] = step_breakdown(mem, arguments, dict(policy_state, **beside), facts, backend)
    return out


def _model_summary(config: qwen2.Qwen2Config, spec, n_params: int, state) -> dict:
    lora = None
    if spec is not None:
        lora = dict(rank=spec.rank, targets=list(spec.targets), trained=lora_lib.count(state.params))
    return dict(
        num_params=n_params,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        remat=config.remat,
        lora=lora,
    )


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
    spec = algorithms.lora_spec(cfg)
    state, frozen, policy_config = policy_state(config, spec, params, optimizers["policy"])
    loss_cfg = algorithms.loss_config(cfg)
    batch = abstract_batch(mesh, mb, width, ppo)
    train, train_s = plan_train_step(
        ts.policy_loss_fn(policy_config, loss_cfg),
        cfg.algo.agg_mode,
        cfg.algo.micro_batches,
        optimizers["policy"],
        state,
        batch,
        frozen,
    )

    resident = {"policy_state": device_bytes(state), "policy_params": device_bytes(params)}
    if frozen is not None:
        resident["frozen_base"] = device_bytes(frozen)
    kl = cfg.algo.kl_coef or cfg.algo.kl_in_reward
    resident["reference_params"] = device_bytes(params) if kl and frozen is None else 0
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
    decode_params = abstract_decode_params(config, params, layout, merged=frozen is not None)
    decode, decode_s = plan_decode_step(config, decode_params, cache, cfg)
    kv = device_bytes(cache)
    resident["decode_params"] = 0 if layout == "train" and frozen is None else device_bytes(decode_params)

    # phases: the update (policy state in the step, the reference / critic resident beside it) and the
    # rollout (the whole train state stays resident; the decode step reads the params, or their decode
    # layout copy, and the cache: both are among its arguments), term by term
    breakdown = phase_breakdowns(
        config,
        cfg,
        resident,
        (train, state, batch, params),
        critic and (critic["memory"], c_state, c_batch, c_params),
        (decode, decode_params, cache),
        backend,
        frozen,
    )
    phases = {name: b["total"] for name, b in breakdown.items()}
    for step in (train, decode) + ((critic["memory"],) if critic else ()):
        step.pop("peak_buffers", None)  # itemised above; thousands of entries
    peak = max(phases.values())
    peak_accelerator = max(b["accelerator"] for b in breakdown.values())
    capacity = target_bytes(target)
    budget = capacity * (1 - headroom)
    return dict(
        mesh=dict(mesh.shape),
        devices=mesh.size,
        backend=backend,
        model=_model_summary(config, spec, n_params, state),
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
        breakdown=breakdown,
        peak=peak,
        peak_accelerator=peak_accelerator,
        target=dict(name=target, capacity=capacity, headroom=headroom, budget=budget),
        fits=bool(peak_accelerator <= budget),
    )


def kv_total(cache) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(cache))


def format_report(r: dict) -> str:
    """A readable table of `plan`'s result (GB = 1e9 bytes, per device unless said)."""

    def g(b):
        return f"{b / GB:9.2f}"

    lines = [
        f"mesh {r['mesh']} ({r['devices']} {r['backend']} devices); model {r['model']['num_params'] / 1e9:.2f}B params, "
        f"{r['model']['param_dtype']} params / {r['model']['dtype']} compute, remat={r['model']['remat']}"
        + (
            f"; LoRA rank {r['model']['lora']['rank']} on {','.join(r['model']['lora']['targets'])}: "
            f"{r['model']['lora']['trained'] / 1e6:.1f}M trained, the base frozen"
            if r["model"].get("lora")
            else ""
        ),
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
    lines += [""] + format_breakdown(r)
    t = r["target"]
    verdict = lambda b: "FITS" if b <= t["budget"] else "DOES NOT FIT"
    lines.append("")
    lines.append(
        f"peak {r['peak'] / GB:.2f} GB per device as compiled for {r['backend']} vs {t['name']} "
        f"{t['capacity'] / GB:.0f} GB (budget {t['budget'] / GB:.1f} GB with {t['headroom']:.0%} headroom): "
        f"{verdict(r['peak'])}"
    )
    if r["backend"] == "cpu":
        lines.append(
            f"peak on a TPU / GPU {r['peak_accelerator'] / GB:.2f} GB per device (the CPU figure less "
            f"XLA:CPU's fp32 copies of bf16 values): {verdict(r['peak_accelerator'])}"
        )
    return "\n".join(lines)
