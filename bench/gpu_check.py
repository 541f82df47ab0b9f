"""The prepared GPU check (issue 41): every figure one lent H100 should give, in one call of under 8 minutes.

    bash bench/gpu_check.sh [--dry-run]          # the wrapper (environment, nvidia-smi, wheels), then:
    python bench/gpu_check.py --out DIR [--dry-run] [--budget-s 470]

Parts, each in a process of its own under a time budget (`Mode.parts`; one past it is killed and recorded as
"timeout", one that fails as "failed" with its exit code and last lines; the others go on):

  rollout    the sampler (agent/sampler.py) at Qwen2.5-0.5B's shape, random bf16 weights, batch 16 / 64 /
             256, bench/rollout.py's workload (64-token prompts, 128 greedy tokens): tokens/s, prefill and
             decode step time, and the step's fraction of HBM bandwidth (the bytes a step must read, every
             weight and the live KV cache, as `rollout.hbm_fraction` counts them) of a device copy measured in
             the same process and of the datasheet
  grpo:S     one GRPO update (rl/train_step.py, configs/base.py's objective) of the S shape (0.5b, 1.5b):
             16 rows x 1024 tokens in 2 micro-batches, fsdp=1, the reference params resident: step time
             (compile apart) and the device's peak memory (memory_stats()["peak_bytes_in_use"]) beside
             launch/plan.py's figure for the same config and mesh (--backend cpu, run meanwhile on the
             host's CPU: an upper bound; and its accelerator figure, less XLA:CPU's fp32 upcasts)
  tiny       the main job, launch/train.py --config configs/tiny_cpu.py for 4 GRPO steps without the SFT
             warm start, on the GPU: the whole command's wall time (imports, the synthetic world, BM25,
             compiles, held-out evaluation of 20 questions at steps 0 and 4, checkpoints) and each step's
             time/step_s
  attention  prefill / training attention (models/attention.py) forward + backward at the 0.5B step's
             shape (8 x 1024 tokens, 14 heads over 2 kv heads, causal + padding mask): ms of each impl and
             its largest difference from the reference

Everything goes to OUT/gpu_check.json (rewritten after each part), every part's output to OUT/gpu_check.log;
a summary table ends stdout. --dry-run runs the same parts on the CPU at tiny shapes
(tests/test_gpu_check.py).
Where cuDNN's attention (the bf16 default on a GPU, `attention.resolve_impl`) fails to compile, rollout and
grpo measure with the reference attention and say so (`attention_fallback`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 1e9
_T0 = time.monotonic()


def _log(message: str) -> None:
    """A progress line of a part, with the seconds since its process started."""
    print(f"[{time.monotonic() - _T0:7.1f} s] {message}", flush=True)


@dataclasses.dataclass(frozen=True)
class Mode:
    """What one run measures: the GPU check, or its dry run at tiny shapes on the CPU."""

    name: str
    budget_s: float  # the whole run; a part gets the least of its own budget and what is left
    parts: tuple  # (part, budget seconds), in order
    rollout_model: dict  # a qwen2 preset name and overrides, or explicit sizes
    rollout_batches: tuple
    copy_bytes: int  # the device copy that measures bandwidth (bytes of one array)
    grpo: dict  # shape -> configs/base.py overrides: the GRPO step's config and launch/plan.py's
    tiny_flags: tuple  # launch/train.py overrides of configs/tiny_cpu.py
    attention: dict  # batch, length, heads, kv_heads, head_dim, dtype, chunk
    reps: int


# configs/base.py's GRPO objective (Search-R1's: clip 0.2, low-var KL 0.001, entropy 0.001, remat, bf16
# compute over fp32 params) on 16 rows of 1024 tokens, 2 micro-batches, one device; rollout.micro_batch sizes
# the decode step that launch/plan.py also compiles
_GRPO = {
    "data.batch_size": 4,
    "data.group_size": 4,
    "algo.mini_batches": 1,
    "algo.micro_batches": 2,
    "rollout.cache_len": 1024,
    "rollout.micro_batch": 16,
    "total_steps": 1,
}
# the tiny main job, shortened: no SFT (its 800 steps are minutes of their own), 4 GRPO steps
_TINY = ("--config.sft.steps=0", "--config.total_steps=4", "--config.eval_every=4", "--config.save_every=4")

GPU = Mode(
    name="gpu",
    budget_s=450,  # + the wrapper's wheel install and nvidia-smi: under 8 minutes
    parts=(("rollout", 115), ("grpo:0.5b", 85), ("grpo:1.5b", 105), ("tiny", 90), ("attention", 40)),
    rollout_model={"preset": "qwen2.5-0.5b", "dtype": "bfloat16", "param_dtype": "bfloat16"},
    rollout_batches=(16, 64, 256),
    copy_bytes=2**30,
    grpo={
        "0.5b": {"model.preset": "qwen2.5-0.5b", **_GRPO},
        "1.5b": {"model.preset": "qwen2.5-1.5b", **_GRPO},
    },
    tiny_flags=(*_TINY, "--config.data.eval_examples=20"),
    attention=dict(batch=8, length=1024, heads=14, kv_heads=2, head_dim=64, dtype="bfloat16", chunk=512),
    reps=3,
)

# tiny explicit sizes instead of the presets; the same code, config keys and flags otherwise
_TINY_MODEL = {
    "model.preset": "",
    "model.vocab_size": 256,
    "model.hidden_size": 32,
    "model.intermediate_size": 64,
    "model.num_attention_heads": 4,
    "model.num_key_value_heads": 2,
}
_SHORT = (  # tests/test_tiny_configs.py's shortening: 2 x 2 rows, 2 turns, a 1-layer model
    "--config.data.batch_size=2",
    "--config.data.group_size=2",
    "--config.data.eval_examples=4",
    "--config.rollout.max_turns=2",
    "--config.rollout.max_segment_tokens=24",
    "--config.model.hidden_size=32",
    "--config.model.intermediate_size=64",
    "--config.model.num_hidden_layers=1",
)
DRY = Mode(
    name="dry-run",
    budget_s=1200,  # generous: a loaded 2-core CI machine, where the check is of the code, not of its time
    parts=(("rollout", 300), ("grpo:tiny", 300), ("tiny", 300), ("attention", 300)),
    rollout_model={
        "vocab_size": 512,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "tie_word_embeddings": True,
    },
    rollout_batches=(2, 4),
    copy_bytes=2**22,
    grpo={  # one shape: a second costs the CI machine a plan's and a step's compiles, and tests no more code
        "tiny": {
            **_TINY_MODEL,
            "model.num_hidden_layers": 1,
            **_GRPO,
            "data.batch_size": 2,
            "data.group_size": 2,
            "rollout.cache_len": 64,
            "rollout.micro_batch": 4,
            "rollout.max_segment_tokens": 16,
        }
    },
    tiny_flags=(
        "--config.sft.steps=0",
        "--config.total_steps=2",
        "--config.eval_every=2",
        "--config.save_every=2",
        *_SHORT,
    ),
    attention=dict(batch=2, length=48, heads=4, kv_heads=2, head_dim=16, dtype="float32", chunk=32),
    reps=2,
)


# ------------------------------------------------------------------------------------------------ the parts
# Each runs in its own process (`--part NAME`) and ends its output with one line "RESULT {json}".


def _jax_device(mode: Mode):
    import jax

    device = jax.devices()[0]
    if mode is GPU and device.platform != "gpu":
        raise SystemExit(f"gpu_check: jax sees no GPU (devices: {jax.devices()}); use --dry-run on a CPU")
    return device


def _device_info(device) -> dict:
    import jax

    return {"platform": device.platform, "device_kind": device.device_kind, "jax": jax.__version__}


def _datasheet_tb_s(kind: str) -> float | None:
    """HBM bandwidth of the datasheet, TB/s: H100 SXM 3.35 (jaxsearch/plan.py HARDWARE), H200 4.8."""
    from jaxsearch import plan
    import rollout

    if "H200" in kind:
        return rollout.H200_HBM_TB_S
    if "H100" in kind:
        return plan.HARDWARE["h100"]["hbm"] / 1e12
    return None


def _sig(x: float, digits: int = 4) -> float:
    """x to `digits` significant digits (the dry run's tiny figures would round to 0 at fixed decimals)."""
    return float(f"{x:.{digits}g}")


def step_bytes(config, params, batch: int) -> int:
    """The bytes a decode step must read at least: bench/rollout.py `hbm_fraction`'s floor (every weight once,
    the tied embedding being the head, and the live KV cache averaged over the segment), unrounded."""
    import jax
    import jax.numpy as jnp

    import rollout

    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    per_token *= jnp.dtype(config.dtype).itemsize
    return int(weights + batch * per_token * (rollout.PROMPT + (rollout.NEW - 1) / 2))


def part_rollout(mode: Mode) -> dict:
    """bench/rollout.py's workload through the sampler, per batch size (see the module docstring)."""
    import jax
    import numpy as np

    import rollout
    from jaxsearch.agent import sampler as S
    from jaxsearch.models import attention, qwen2

    device = _jax_device(mode)
    _log(f"rollout on {device.device_kind}")
    m = dict(mode.rollout_model)
    config = qwen2.preset(m.pop("preset"), **m) if "preset" in m else qwen2.Qwen2Config(**m)
    params = jax.jit(qwen2.init_params, static_argnums=0)(config, jax.random.PRNGKey(0))
    _log(f"params initialised ({config.num_params() / 1e6:.1f}M)")
    copy_tb_s = rollout.copy_bandwidth(mode.copy_bytes)
    _log(f"device copy: {copy_tb_s:.3f} TB/s")
    datasheet = _datasheet_tb_s(device.device_kind)
    out = {
        **_device_info(device),
        "params_M": _sig(config.num_params() / 1e6, 3),
        "dtype": config.dtype,
        "prompt": rollout.PROMPT,
        "new": rollout.NEW,
        "copy_TB_s": _sig(copy_tb_s),
        "datasheet_TB_s": datasheet,
        "attention_impl": attention.resolve_impl(
            config.attention_impl, config.compute_dtype, config.head_dim
        ),
        "batches": [],
    }

    def sampler(config):
        return S.Sampler(
            config,
            S.StopTable.eos_only(config.vocab_size),  # no stop token: every row decodes NEW tokens
            cache_len=rollout.PROMPT + rollout.NEW,
            max_segment=rollout.NEW,
            sampling=S.SamplingParams(temperature=0.0),
            prompt_buckets=[rollout.PROMPT],
        )

    for batch in mode.rollout_batches:
        prompts = (
            np.random.default_rng(batch).integers(1, config.vocab_size, (batch, rollout.PROMPT)).tolist()
        )
        smp = sampler(config)

        def rollout_once():
            """(prefill s, decode s, tokens): a prefill into a fresh cache, then NEW greedy steps."""
            t0 = time.perf_counter()
            state = jax.block_until_ready(smp.start(params, prompts, 0))
            t1 = time.perf_counter()
            seg, _ = smp.decode(params, state, rollout.NEW)  # host arrays: the steps are done
            return t1 - t0, time.perf_counter() - t1, seg.tokens

        try:
            first = rollout_once()
        except Exception as e:  # the prefill's cuDNN attention refused: the reference's prefill instead
            if out["attention_impl"] != "cudnn":
                raise
            out["attention_fallback"] = f"{type(e).__name__}: {str(e)[:500]}"
            _log(f"attention impl cudnn failed, falling back to reference: {out['attention_fallback']}")
            config, out["attention_impl"] = config.replace(attention_impl="reference"), "reference"
            smp = sampler(config)
            first = rollout_once()
        reps = [rollout_once() for _ in range(mode.reps)]
        tokens = first[2]
        t_prefill, t_decode = (statistics.median(r[i] for r in reps) for i in (0, 1))
        t_whole = statistics.median(r[0] + r[1] for r in reps)
        step_s = t_decode / rollout.NEW
        reached = step_bytes(config, params, batch) / step_s / 1e12
        row = {
            "batch": batch,
            "tokens": int(tokens.size),
            "tok_s": _sig(batch * rollout.NEW / t_whole),
            "rollout_s": _sig(t_whole),
            "prefill_ms": _sig(1e3 * t_prefill),
            "decode_step_ms": _sig(1e3 * step_s),
            "compile_s": round(first[0] + first[1] - t_whole, 2),
            "step_bytes": step_bytes(config, params, batch),
            "reached_TB_s": _sig(reached),
            "of_copy": _sig(reached / copy_tb_s),
        }
        if datasheet:
            row["of_datasheet"] = _sig(reached / datasheet)
        _log(json.dumps(row))
        out["batches"].append(row)
    return out


def run_config(overrides: dict):
    """configs/base.py's ConfigDict with `overrides` ({"data.batch_size": 4, ...}) set, as launch/plan.py's
    --config.KEY=VALUE flags (`plan_flags`) set them."""
    from configs import base  # the repo root is on PYTHONPATH (gpu_check.sh), or jaxsearch is installed

    cfg = base.get_config()
    for key, value in overrides.items():
        *path, last = key.split(".")
        node = cfg
        for name in path:
            node = node[name]
        node[last] = value
    return cfg


def plan_flags(overrides: dict) -> list[str]:
    return [f"--config.{k}={v}" for k, v in overrides.items()]


def _update_batch(rows: int, width: int, vocab: int) -> dict:
    """A GRPO update batch (`algorithms.example_batch`'s arrays) of plausible content: right-padded rows of
    width / 2 to width tokens, the first 128 (or a quarter) the prompt, advantages ~ N(0, 1), log-probs
    below 0."""
    import numpy as np

    from jaxsearch.rl import algorithms

    rng = np.random.default_rng(0)
    batch = algorithms.example_batch(rows, width, ppo=False)
    cols = np.arange(width)[None]
    attn = cols < rng.integers(width // 2, width + 1, (rows, 1))
    logp = -rng.exponential(2.0, (rows, width)).astype(np.float32) * attn
    batch.update(
        tokens=rng.integers(1, vocab, (rows, width)).astype(np.int32),
        attention_mask=attn.astype(np.int32),
        loss_mask=(attn & (cols >= min(128, width // 4))).astype(np.int32),
        advantages=rng.standard_normal(rows).astype(np.float32),
        old_logprobs=logp,
        ref_logprobs=logp - 0.01,
    )
    return batch


def part_grpo(mode: Mode, shape: str) -> dict:
    """One GRPO update of `shape`, as the trainer builds it (see the module docstring)."""
    import resource

    import jax
    import jax.numpy as jnp
    import numpy as np

    from common import median_time
    from jaxsearch import parallel, plan
    from jaxsearch.agent.policy import load_policy
    from jaxsearch.config import RunConfig
    from jaxsearch.models import attention
    from jaxsearch.rl import algorithms
    from jaxsearch.rl import train_step as ts

    device = _jax_device(mode)
    cfg = RunConfig.from_dict(run_config(mode.grpo[shape]))
    mesh = parallel.make_mesh(dict(cfg.mesh), devices=jax.devices()[:1])  # fsdp=1, as the plan's --mesh
    _log(f"grpo:{shape} on {device.device_kind}")
    config, params = load_policy(cfg.model, cfg.seed, mesh)
    _log(f"policy initialised ({config.num_params() / 1e6:.1f}M params)")
    optimizer = algorithms.optimizers(cfg)["policy"]
    reference = jax.tree.map(jnp.copy, params) if cfg.algo.kl_coef else None  # resident beside the step
    state = ts.init_state(params, optimizer, mesh)
    del params  # donated to the first update
    rows, width = algorithms.mini_batch_rows(cfg), cfg.rollout.cache_len
    batch = _update_batch(rows, width, config.vocab_size)
    loss_cfg = algorithms.loss_config(cfg)
    box, losses, fallback = {"state": state}, [], None

    def step():
        box["state"], metrics = box["update"](box["state"], batch)
        losses.append(float(metrics["loss"]))  # a host sync: the step is done

    def build(config):
        loss_fn = ts.policy_loss_fn(config, loss_cfg)
        args = (cfg.algo.agg_mode, cfg.algo.micro_batches, optimizer, mesh, box["state"], batch)
        box["update"] = ts.make_train_step(loss_fn, *args)

    impl = attention.resolve_impl(config.attention_impl, config.compute_dtype, config.head_dim)
    build(config)
    t0 = time.perf_counter()
    try:
        step()
    except Exception as e:  # cuDNN refused (at compile: the state was not donated): measure the reference
        if impl != "cudnn":
            raise
        fallback = f"{type(e).__name__}: {str(e)[:500]}"
        _log(f"attention impl cudnn failed, falling back to reference: {fallback}")
        impl, config = "reference", config.replace(attention_impl="reference")
        build(config)
        t0 = time.perf_counter()
        step()
    first_s = time.perf_counter() - t0
    _log(f"first step (compile included) {first_s:.1f} s")
    step_s = median_time(step, mode.reps)
    _log(f"step {step_s:.4f} s")
    stats = device.memory_stats()
    if stats:
        peak, source = int(stats["peak_bytes_in_use"]), "device.memory_stats()['peak_bytes_in_use']"
    else:  # the CPU has no allocator statistics: the process's peak resident memory stands in
        peak, source = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process max RSS (no GPU)"
    tokens = rows * width
    n = config.num_params()
    out = {
        **_device_info(device),
        "shape": shape,
        "num_params": n,
        "rows": rows,
        "width": width,
        "micro_batches": cfg.algo.micro_batches,
        "attention_impl": impl,
        "attention_fallback": fallback,
        "step_s": _sig(step_s),
        "compile_s": round(first_s - step_s, 2),
        "tok_s": _sig(tokens / step_s),
        "tflop_s_6nt": _sig(6 * n * tokens / step_s / 1e12),  # model FLOPs: 6 N T (attention, remat apart)
        "peak_bytes": peak,
        "peak_source": source,
        "reference_resident": reference is not None,
        "loss_finite": bool(np.all(np.isfinite(losses))),
    }
    if "H100" in device.device_kind or "H200" in device.device_kind:
        out["mfu_6nt"] = _sig(out["tflop_s_6nt"] * 1e12 / plan.HARDWARE["h100"]["flops"])
    return out


def part_attention(mode: Mode) -> dict:
    """Forward + backward of `attention.attend` per impl at one shape; ms and the largest difference from the
    reference impl, of the output and of the gradients of q, k and v (relative to the reference's largest)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from common import median_time
    from jaxsearch.models import attention

    device = _jax_device(mode)
    _log(f"attention on {device.device_kind}")
    a = mode.attention
    b, t, dt = a["batch"], a["length"], jnp.dtype(a["dtype"])
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((b, t, a["heads"], a["head_dim"])), dt)
    kv_shape = (b, a["kv_heads"], t, a["head_dim"])  # `attend`'s layouts: keys [B, K, D, S], values [B, K, S, D]
    k, v = (jnp.asarray(rng.standard_normal(kv_shape), dt) for _ in range(2))
    k = k.swapaxes(2, 3)
    valid = np.arange(t)[None] >= rng.integers(0, t // 4, (b, 1))  # left padding, as the prompts have
    mask = jnp.asarray(np.tril(np.ones((t, t), bool))[None] & valid[:, None, :])
    w = jnp.asarray(rng.standard_normal(q.shape), dt)

    def fwd_bwd(impl):
        def f(q, k, v):
            out = attention.attend(q, k, v, mask, a["chunk"], impl)
            return jnp.sum(out.astype(jnp.float32) * w), out

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))

    out = {**_device_info(device), **a, "impls": {}}
    ref = None
    for impl in ("reference", "xla", "cudnn"):
        if impl == "cudnn" and device.platform != "gpu":
            out["impls"][impl] = {"status": "skipped: cuDNN needs a GPU"}
            continue
        try:
            fn = fwd_bwd(impl)
            (_, y), grads = jax.block_until_ready(fn(q, k, v))
            ms = 1e3 * median_time(lambda: jax.block_until_ready(fn(q, k, v)), mode.reps * 3)
            _log(f"{impl}: {ms:.3f} ms")
        except Exception as e:  # an impl that does not run here is a finding, not the end of the check
            out["impls"][impl] = {"status": f"failed: {type(e).__name__}: {str(e)[:300]}"}
            continue
        arrays = [np.asarray(x, np.float32) for x in (y, *grads)]
        row = {"status": "ok", "fwd_bwd_ms": _sig(ms)}
        if ref is None:
            ref = arrays
        row["max_rel_diff"] = {
            name: float(np.max(np.abs(x - r)) / max(np.max(np.abs(r)), 1e-30))
            for name, x, r in zip(("out", "dq", "dk", "dv"), arrays, ref)
        }
        out["impls"][impl] = row
    return out


def part_tiny(mode: Mode, work: str) -> dict:
    """The main job's tiny config, shortened (`Mode.tiny_flags`), as its own command: its wall time, and each
    step's from its metrics.jsonl."""
    workdir = os.path.join(work, "tiny_run")
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = [
        sys.executable,
        os.path.join(ROOT, "launch", "train.py"),
        "--config",
        os.path.join(ROOT, "configs", "tiny_cpu.py"),
    ]
    cmd += [f"--workdir={workdir}", "--progress=false", *mode.tiny_flags]
    print(" ".join(cmd), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, stdout=sys.stdout, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"launch/train.py exited with {done.returncode}")
    rows = [json.loads(line) for line in open(os.path.join(workdir, "grpo", "metrics.jsonl"))]
    steps = [r for r in rows if "time/step_s" in r]
    evals = [r for r in rows if "eval/synthetic/em" in r]
    times = [r["time/step_s"] for r in steps]
    return {
        "flags": list(mode.tiny_flags),
        "wall_s": round(wall, 2),
        "steps": len(steps),
        "step_s": [round(x, 3) for x in times],
        "first_step_s": round(times[0], 3),  # its compiles included
        "later_step_s": round(statistics.median(times[1:]), 3) if len(times) > 1 else None,
        "rollout_s": [round(r["time/rollout_s"], 3) for r in steps],
        "update_s": [round(r["time/update_s"], 3) for r in steps],
        "tokens_per_s": [round(r["tokens_per_s"], 1) for r in steps],
        "evaluations": [r["step"] for r in evals],
        "eval_em_last": evals[-1]["eval/synthetic/em"] if evals else None,
        "metrics": os.path.join(workdir, "grpo", "metrics.jsonl"),
    }


def run_part(mode: Mode, part: str, work: str) -> dict:
    name, _, arg = part.partition(":")
    if name == "rollout":
        return part_rollout(mode)
    if name == "grpo":
        return part_grpo(mode, arg)
    if name == "attention":
        return part_attention(mode)
    if name == "tiny":
        return part_tiny(mode, work)
    raise SystemExit(f"--part {part!r}: expected one of rollout, grpo:SHAPE, attention, tiny")


# ------------------------------------------------------------------------------------------- orchestration


class Run:
    """One check: the parts' processes, their logs in `work`, the JSON and log in `out`."""

    def __init__(self, mode: Mode, out: str, work: str, budget_s: float):
        self.mode, self.out, self.work = mode, out, work
        self.deadline = time.monotonic() + budget_s
        self.log_path = os.path.join(out, "gpu_check.log")
        self.json_path = os.path.join(out, "gpu_check.json")
        self.result = {
            "mode": mode.name,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": {"python": platform.python_version(), "machine": platform.machine(), "commit": _commit()},
            "budget_s": budget_s,
            "parts": {},
            "plans": {},
        }
        open(self.log_path, "w").close()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def spawn(self, name: str, cmd: list[str], env: dict | None = None, stdout: str = "") -> tuple:
        """Start `cmd` in a process group of its own, its output to WORK/NAME.log (stdout to `stdout` when
        given: a JSON printer's). Returns the job `finish` takes."""
        log = open(os.path.join(self.work, name.replace(":", "_") + ".log"), "w")
        out = open(stdout, "w") if stdout else log
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=out,
            stderr=log if stdout else subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        if stdout:
            out.close()
        return proc, log, time.monotonic()

    def finish(self, name: str, job: tuple, timeout: float) -> dict:
        """Wait for a spawned process up to `timeout` s (then kill its process group); its log appended to
        the run's log; {"status": ok | failed | timeout, "seconds": ..., ...}."""
        proc, log, start = job
        try:
            proc.wait(timeout=max(timeout, 0))
            status = "ok" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "timeout"
        log.close()
        seconds = round(time.monotonic() - start, 1)
        text = open(log.name).read()
        with open(self.log_path, "a") as f:
            f.write(f"===== {name}: {status} after {seconds} s\n{text}\n")
        entry = {"status": status, "seconds": seconds}
        if status == "timeout":
            entry["error"] = f"killed after {seconds} s (its budget)"
        elif status == "failed":
            entry["error"] = f"exit code {proc.returncode}: " + "\n".join(text.strip().splitlines()[-15:])
        entry["output"] = text
        return entry

    def save(self) -> None:
        with open(self.json_path, "w") as f:
            json.dump(self.result, f, indent=1)

    def part(self, part: str, budget: float) -> None:
        cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--work", self.work]
        if self.mode is DRY:
            cmd.append("--dry-run")
        entry = self.finish(part, self.spawn(part, cmd), min(budget, self.left()))
        text = entry.pop("output")
        results = [line[len("RESULT ") :] for line in text.splitlines() if line.startswith("RESULT ")]
        if entry["status"] == "ok":
            if results:
                entry.update(json.loads(results[-1]))
            else:
                entry.update(status="failed", error="no RESULT line in its output")
        if entry.get("metrics"):  # the tiny run's metrics.jsonl comes back beside the JSON
            entry["metrics"] = shutil.copy(entry["metrics"], os.path.join(self.out, "tiny_metrics.jsonl"))
        self.result["parts"][part] = entry
        self.save()

    def plans(self) -> dict:
        """launch/plan.py of every GRPO shape, on the CPU (no GPU memory taken), started now."""
        env = dict(os.environ, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
        jobs = {}
        for shape, overrides in self.mode.grpo.items():
            cmd = [
                sys.executable,
                os.path.join(ROOT, "launch", "plan.py"),
                "--config",
                os.path.join(ROOT, "configs", "base.py"),
            ]
            cmd += ["--mesh", "fsdp=1", "--json", *plan_flags(overrides)]
            jobs[shape] = self.spawn(f"plan:{shape}", cmd, env, stdout=self._plan_path(shape))
        return jobs

    def _plan_path(self, shape: str) -> str:
        return os.path.join(self.work, f"plan_{shape}.json")

    def collect_plan(self, shape: str, job: tuple) -> None:
        entry = self.finish(f"plan:{shape}", job, self.left())
        entry.pop("output")
        if entry["status"] == "ok":
            try:
                with open(self._plan_path(shape)) as f:
                    plan = json.load(f)
                entry.update(
                    backend=plan.get("backend"),
                    mesh=plan.get("mesh"),
                    train_step_bytes=plan["phases"]["train_step"],
                    train_step_total_bytes=plan["train_step"]["memory"]["total"],
                    reference_bytes=plan["resident"].get("reference_params", 0),
                    peak_bytes=plan["peak"],
                    compile_s=plan["train_step"].get("compile_s"),
                    # the same less XLA:CPU's fp32 copies of bf16 values, which a GPU does not make (issue 41)
                    train_step_accelerator_bytes=plan.get("breakdown", {})
                    .get("train_step", {})
                    .get("accelerator"),
                    plan=plan,
                )
            except (ValueError, KeyError, TypeError) as e:  # no JSON, or not the fields read above
                entry.update(status="failed", error=f"launch/plan.py's JSON: {type(e).__name__}: {e}")
        self.result["plans"][shape] = entry
        grpo = self.result["parts"].get(f"grpo:{shape}", {})
        if entry["status"] == "ok" and grpo.get("status") == "ok":
            grpo["plan_train_step_bytes"] = entry["train_step_bytes"]
            grpo["measured_over_plan"] = _sig(grpo["peak_bytes"] / entry["train_step_bytes"])
            accelerator = entry["train_step_accelerator_bytes"]
            grpo["plan_accelerator_bytes"] = accelerator
            grpo["measured_over_accelerator_plan"] = (
                _sig(grpo["peak_bytes"] / accelerator) if accelerator else None
            )
        self.save()


def _commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def summary(result: dict) -> str:
    """The run as a table: one line per part (and per rollout batch, per attention impl)."""
    lines = [f"gpu_check ({result['mode']}): {result.get('device_kind', '?')}, {result['total_s']} s", ""]
    lines.append(f"{'part':<22}{'status':<9}{'s':>7}  figures")
    for name, p in result["parts"].items():
        head = f"{name:<22}{p['status']:<9}{p['seconds']:>7.1f}  "
        if p["status"] != "ok":
            lines.append(head + p.get("error", "").splitlines()[-1][:90] if p.get("error") else head)
            continue
        if name == "rollout":
            lines.append(
                head + f"{p['params_M']}M params {p['dtype']}, prefill attention {p['attention_impl']}, "
                f"copy {p['copy_TB_s']} TB/s"
            )
            for r in p["batches"]:
                sheet = f", {r['of_datasheet']:.0%} of datasheet" if "of_datasheet" in r else ""
                lines.append(
                    f"{'':<38}batch {r['batch']:>4}: {r['tok_s']:>10,.0f} tok/s, "
                    f"step {r['decode_step_ms']:.3f} ms, "
                    f"{r['reached_TB_s']:.3g} TB/s = {r['of_copy']:.0%} of copy{sheet}"
                )
        elif name.startswith("grpo"):
            plan = p.get("plan_train_step_bytes")
            vs = f" vs plan {plan / GB:.3g} GB ({p['measured_over_plan']:.3g}x" if plan else " (no plan)"
            if plan and p.get("plan_accelerator_bytes"):
                vs += f"; accelerator terms {p['plan_accelerator_bytes'] / GB:.3g} GB"
                vs += f", {p['measured_over_accelerator_plan']:.3g}x)"
            elif plan:
                vs += ")"
            rss = "" if p["peak_source"].startswith("device") else " (process RSS)"
            lines.append(
                head + f"{p['num_params'] / 1e6:.3g}M, {p['rows']}x{p['width']}, {p['attention_impl']}: "
                f"step {p['step_s']:.3f} s, {p['tok_s']:,.0f} tok/s, "
                f"peak {p['peak_bytes'] / GB:.3g} GB{rss}{vs}"
            )
        elif name == "tiny":
            lines.append(
                head + f"{p['steps']} steps in {p['wall_s']} s wall; step 1 {p['first_step_s']} s, "
                f"later {p['later_step_s']} s; evaluations at {p['evaluations']}"
            )
        elif name == "attention":
            lines.append(
                head + f"{p['batch']}x{p['length']}, {p['heads']}/{p['kv_heads']} heads, {p['dtype']}"
            )
            for impl, r in p["impls"].items():
                if r["status"] != "ok":
                    lines.append(f"{'':<38}{impl:<10} {r['status'][:80]}")
                    continue
                diff = max(r["max_rel_diff"].values())
                lines.append(f"{'':<38}{impl:<10} fwd+bwd {r['fwd_bwd_ms']:.3f} ms, max rel diff {diff:.2e}")
    for shape, p in result["plans"].items():
        if p["status"] != "ok":
            lines.append(
                f"{'plan:' + shape:<22}{p['status']:<9}{p['seconds']:>7.1f}  {p.get('error', '')[-90:]}"
            )
    return "\n".join(lines)


def orchestrate(mode: Mode, out: str, work: str, budget_s: float) -> int:
    run = Run(mode, out, work, budget_s)
    start = time.monotonic()
    plans = run.plans()
    for part, budget in mode.parts:
        if run.left() <= 5:
            run.result["parts"][part] = {
                "status": "timeout",
                "seconds": 0.0,
                "error": "not started: budget spent",
            }
            continue
        print(
            f"[{time.monotonic() - start:6.1f} s] {part} (budget {min(budget, run.left()):.0f} s)", flush=True
        )
        run.part(part, budget)
    for shape, job in plans.items():
        run.collect_plan(shape, job)
    run.result["total_s"] = round(time.monotonic() - start, 1)
    kinds = [p.get("device_kind") for p in run.result["parts"].values() if p.get("device_kind")]
    run.result["device_kind"] = kinds[0] if kinds else None
    run.result["ok"] = all(
        p["status"] == "ok" for p in (*run.result["parts"].values(), *run.result["plans"].values())
    )
    run.save()
    print(summary(run.result), flush=True)
    print(f"\nJSON: {run.json_path}\nlog:  {run.log_path}", flush=True)
    return 0 if run.result["ok"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", default=os.environ.get("OUT") or "/tmp/gpu_check", help="where the JSON and log go"
    )
    ap.add_argument(
        "--work",
        default=os.path.join(tempfile.gettempdir(), "gpu_check_work"),
        help="the parts' logs and the tiny run's workdir",
    )
    ap.add_argument("--dry-run", action="store_true", help="the same parts on the CPU at tiny shapes")
    ap.add_argument("--budget-s", type=float, default=0, help="the whole run's seconds (default: the mode's)")
    ap.add_argument("--part", default="", help=argparse.SUPPRESS)  # one part, in its own process
    args = ap.parse_args(argv)
    mode = DRY if args.dry_run else GPU
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    if args.part:
        print("RESULT " + json.dumps(run_part(mode, args.part, work)), flush=True)
        return 0
    os.makedirs(args.out, exist_ok=True)
    return orchestrate(mode, os.path.abspath(args.out), work, args.budget_s or mode.budget_s)


if __name__ == "__main__":
    raise SystemExit(main())
