"""launch/plan.py: per-device memory of the AOT-compiled steps on a fake mesh (run in subprocesses: each
needs its own XLA device count)."""

import json
import os
import subprocess
import sys

import pytest
from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a tiny Qwen2: vocab 256, embed 64, 4 heads / 2 kv heads of 16, mlp 128, 2 layers, untied
TINY = [
    "--config.model.vocab_size=256",
    "--config.model.hidden_size=64",
    "--config.model.intermediate_size=128",
    "--config.model.num_attention_heads=4",
    "--config.model.num_key_value_heads=2",
    "--config.model.num_hidden_layers=2",
    "--config.model.dtype=float32",
    "--config.model.param_dtype=float32",
    "--config.data.batch_size=8",
    "--config.data.group_size=4",
    "--config.algo.mini_batches=2",
    "--config.algo.micro_batches=1",
    "--config.rollout.cache_len=64",
]


def run_plan(*args):
    cmd = [sys.executable, os.path.join(ROOT, "launch", "plan.py"), "--config", "configs/search_r1_7b.py"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(cmd + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_parse_mesh():
    from jaxsearch import plan

    assert plan.parse_mesh("data=2,fsdp=4,tensor=2") == {"data": 2, "fsdp": 4, "tensor": 2}
    assert plan.mesh_size(plan.parse_mesh("fsdp=8")) == 8
    with pytest.raises(ValueError):
        plan.parse_mesh("model=4")
    assert plan.target_bytes("h100-80gb") == 80e9 and plan.target_bytes("0.5") == 0.5e9


def test_tiny_plan_argument_bytes_and_verdict():
    r = json.loads(run_plan("--mesh", "fsdp=4", "--json", *TINY))
    assert r["devices"] == 4
    # by hand: kernels / embeddings have an embed dim (sharded over fsdp=4); biases and norms replicated
    v, e, h, k, d, f, layers = 256, 64, 4, 2, 16, 128, 2
    sharded = 2 * v * e + layers * (e * h * d + 2 * e * k * d + h * d * e + 3 * e * f)
    replicated = layers * (h * d + 2 * k * d + 2 * e) + e
    assert r["model"]["num_params"] == sharded + replicated
    params = 4 * (sharded // 4 + replicated)  # fp32 bytes on one device
    assert r["resident"]["policy_params"] == params
    # state: params + adam mu / nu, plus 4 int32 scalars (step, skipped, adam count, schedule count)
    state = 3 * params + 4 * 4
    assert r["resident"]["policy_state"] == state
    rows, width = 8 * 4 // 2, 64  # mini-batch rows over fsdp=4
    batch = (
        5 * (rows // 4) * width * 4 + (rows // 4) * 4
    )  # 5 [rows, T] int32 / fp32 arrays + advantages [rows]
    mem = r["train_step"]["memory"]
    assert mem["argument"] == state + batch  # XLA reports per device
    assert mem["alias"] == state  # the donated state
    assert r["kv_cache"]["per_device"] == r["kv_cache"]["total"] // 4 + 0  # rows split over fsdp
    assert r["fits"] is True

    # the breakdown: the step's arguments by hand, every term adding up to the compiler's figure
    b = r["breakdown"]["train_step"]
    assert list(b["arguments"].values()) == [params, 2 * params, 4 * 4 + batch] and b["padding"] == 0
    assert b["resident"]["reference policy (its params)"] == params
    itemised = sum(t["bytes"] for t in b["temps"].values())
    assert b["itemised"] and 0 < itemised <= mem["temp"] + mem["output"] - mem["alias"]
    terms = sum(b["arguments"].values()) + itemised + b["remainder"] + sum(b["resident"].values())
    assert terms == b["total"] == r["phases"]["train_step"] == mem["total"] + params
    d = r["breakdown"]["rollout"]
    kv = f"KV cache ({r['rollout_rows']} rows x 64 tokens, split over the mesh)"
    assert d["arguments"][kv] == r["kv_cache"]["per_device"]
    assert sum(d["arguments"].values()) == r["decode_step"]["memory"]["argument"]
    # an fp32 model: nothing bf16 for XLA:CPU to copy to fp32, so the TPU / GPU figure is the CPU one
    assert r["peak_accelerator"] == r["peak"]

    tiny = run_plan("--mesh", "fsdp=4", "--target", "0.0001", *TINY)
    assert "DOES NOT FIT" in tiny and "train_step" in tiny
    assert "optimizer moments (2 copies of the weights)" in tiny and "remainder" in tiny


def test_tiny_lora_plan_trains_the_adapters_beside_a_frozen_base():
    """LoRA: the update's state is the adapters and their moments (by hand), the frozen base an argument that is
    not donated and is also the reference (no second copy); the rollout reads a merged copy."""
    lora = ["--config.lora.rank=4", "--config.lora.target_modules=all-linear", "--config.rollout.decode_layout=train"]
    r = json.loads(run_plan("--mesh", "fsdp=4", "--json", *TINY, *lora))
    e, q, kv, f, layers, rank = 64, 64, 32, 128, 2, 4  # q = heads x head_dim, kv = kv heads x head_dim
    per_layer = rank * ((e + q) + 2 * (e + kv) + (q + e) + 2 * (e + f) + (f + e))
    adapters = 4 * layers * per_layer  # fp32, replicated
    assert r["model"]["lora"] == {"rank": 4, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "trained": layers * per_layer}  # fmt: skip
    state = 3 * adapters + 4 * 4
    base = r["resident"]["policy_params"]  # fp32 params, sharded as ever
    assert r["resident"]["policy_state"] == state and r["resident"]["frozen_base"] == base
    assert r["resident"]["reference_params"] == 0
    mem = r["train_step"]["memory"]
    assert mem["alias"] == state  # the adapters' state is donated, the base is not
    b = r["breakdown"]["train_step"]
    assert list(b["arguments"].values())[:3] == [base, adapters, 2 * adapters]
    assert sum(b["arguments"].values()) == mem["argument"]
    assert b["total"] == mem["total"]  # nothing resident beside the update: the base is its argument
    d = r["breakdown"]["rollout"]
    merged = "rollout copy: base + adapters merged (float32, train layout)"
    assert d["arguments"][merged] == base == r["resident"]["decode_params"]
    assert d["resident"]["frozen base weights (float32; the reference policy too)"] == base


def test_mesh_with_tensor_and_data_axes():
    r = json.loads(run_plan("--mesh", "data=2,fsdp=2,tensor=2", "--json", *TINY))
    assert r["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2} and r["devices"] == 8
    assert r["train_step"]["memory"]["total"] > 0 and r["decode_step"]["memory"]["argument"] > 0


def test_largest_arrays_parses_hlo_shapes():
    from jaxsearch import plan

    hlo = "%a = f32[8,1024]{1,0} add(...), %b = bf16[2,3]{1,0} ..., %c = s32[] ..., %d = pred[4096,4096]"
    top = plan.largest_arrays(hlo, 2)
    assert top == [("pred[4096,4096]", 4096 * 4096), ("f32[8,1024]", 8 * 1024 * 4)]


def test_tpu_backend_names_v5p_slices_and_reads_the_compilers_refusal():
    """--backend tpu: chips -> the v5p torus of that slice; a program over HBM is reported with the
    compiler's own figure for its temporaries (GiB) instead of crashing the plan."""
    from jaxsearch import plan

    assert plan.V5P_TOPOLOGIES[8] == "2x2x2" and plan.V5P_TOPOLOGIES[32] == "2x4x4"
    for n, topo in plan.V5P_TOPOLOGIES.items():
        x, y, z = (int(d) for d in topo.split("x"))
        assert x * y * z == max(n, 4)  # 1 or 2 chips: that many of one host's 2x2x1
    with pytest.raises(ValueError, match="not a v5p slice"):
        plan.plan_devices(12, "tpu")
    with pytest.raises(ValueError, match="backend"):
        plan.plan_devices(8, "gpu")
    message = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
        "(102.33G) exceeds available HBM (95.74G)."
    )
    assert float(plan._HBM_NEED.search(message).group(1)) == 102.33


def test_step_time_estimate_of_eka_7b_on_v5p_by_hand():
    """eka_7b on 32 v5p chips, computed by hand: N = 7,615,616,512 (Qwen2.5-7B), 512 x 5 rows x 2048
    tokens; 12 N T FLOPs (fwd + bwd + remat fwd + old-policy and reference passes) at 40% of 32 x 459
    TFLOP/s; a decode step all-gathers 2N bf16 bytes x 31/32 at 600 GB/s; 5 rollout micro-batches of 512
    rows x 4 turns x 500 tokens."""
    from configs import eka_7b
    from jaxsearch import plan

    cfg = eka_7b.get_config()
    cfg.rollout.decode_layout = "train"
    e = plan.step_time_estimate(cfg, 32, "v5p")
    n, tokens = 7_615_616_512, 512 * 5 * 2048
    assert e["update_tflop"] == pytest.approx(12 * n * tokens / 1e12)
    assert e["update_s"] == pytest.approx(12 * n * tokens / (32 * 459e12 * 0.4))
    assert e["decode_bound"] == "all-gather"
    assert e["decode_step_ms"] == pytest.approx(2 * n * 31 / 32 / 600e9 * 1e3)
    assert e["rollout_s"] == pytest.approx(5 * 2000 * 2 * n * 31 / 32 / 600e9)


def test_step_time_estimate_of_the_decode_layouts_by_hand():
    """eka_7b on 8 H100: replicated, a decode step reads all 2N bf16 weight bytes and an eighth of the cache
    (512 rows x 2048 tokens x 28 layers x k, v x 4 kv heads x 128 x 2 bytes) at 3.35 TB/s, nothing gathered;
    tensor-parallel over 2, half the weights. The issue's bound: rollout <= 75 s replicated."""
    from configs import eka_7b
    from jaxsearch import plan

    cfg = eka_7b.get_config()
    n, kv = 7_615_616_512, 512 * 2048 * 28 * 2 * 4 * 128 * 2
    cfg.rollout.decode_layout = "replicated"
    e = plan.step_time_estimate(cfg, 8, "h100")
    assert e["decode_bound"] == "hbm"
    assert e["decode_step_ms"] == pytest.approx((2 * n + kv / 8) / 3.35e12 * 1e3)
    assert e["rollout_s"] == pytest.approx(5 * 2000 * (2 * n + kv / 8) / 3.35e12) and e["rollout_s"] <= 75
    cfg.rollout.decode_layout = "tensor"
    e = plan.step_time_estimate(cfg, 8, "h100", tensor=2)
    assert e["decode_step_ms"] == pytest.approx((n + kv / 8) / 3.35e12 * 1e3)


@pytest.mark.parametrize("mesh, layout", [("fsdp=4", "replicated"), ("data=2,fsdp=2,tensor=2", "tensor")])
def test_tiny_plan_counts_the_decode_layout_copy(mesh, layout):
    """The decode layout's copy (fp32 compute here) is resident in the rollout phase beside the whole policy
    state; replicated, it is every parameter on every device. The slots scheduler's decode call compiles."""
    args = ["--mesh", mesh, "--json", *TINY, f"--config.rollout.decode_layout={layout}"]
    r = json.loads(run_plan(*args, "--config.rollout.scheduler=slots"))
    assert r["decode_layout"] == layout and r["scheduler"] == "slots"
    copy = r["resident"]["decode_params"]
    if layout == "replicated":
        assert copy == 4 * r["model"]["num_params"]
    else:  # heads, kv heads, mlp and vocab split over tensor=2: between half and all of the params
        assert 2 * r["model"]["num_params"] < copy < 4 * r["model"]["num_params"]
    assert r["decode_step"]["memory"]["argument"] >= copy + r["kv_cache"]["per_device"]
    others = r["resident"]["reference_params"] + r["resident"]["critic_state"]
    expected = r["decode_step"]["memory"]["total"] + others + r["resident"]["policy_state"]
    assert r["phases"]["rollout"] == expected


def test_peak_buffers_name_xla_cpus_fp32_copy_of_a_bf16_weight():
    """A bf16 matmul in a loop: XLA:CPU converts the weight to fp32 once, outside the loop, and keeps the copy
    live; the dump's peak holds it (256 x 256 x 4 bytes), flagged as an upcast of a live value: all of it is
    CPU-only. A TPU / GPU figure keeps none of it; on the TPU backend nothing is discounted."""
    import jax
    import jax.numpy as jnp

    from jaxsearch import plan
    from jaxsearch.plan import breakdown

    def f(w, x):
        return jax.lax.fori_loop(0, 4, lambda i, h: jnp.tanh(h @ w), x)

    w = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    x = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)
    mem, _ = plan.compile_fn(jax.jit(f), w, x)
    buffers = {b["name"]: b for b in mem["peak_buffers"]}
    (copy,) = [b for b in buffers.values() if b["upcast"]]  # the only fp32 convert of a bf16 value
    assert copy["shape"] == "f32[256,256]" and copy["bytes"] == 256 * 256 * 4 and copy["source_live"]
    args = [b for b in buffers.values() if b["allocation"] == "argument"]
    assert sorted(b["bytes"] for b in args) == [64 * 256 * 2, 256 * 256 * 2]
    assert sum(b["bytes"] for b in args) == mem["argument"]
    facts = dict(vocab=1000, hidden=256, layers=2, seq={100, 99}, whole={256 * 256}, shard=set(), kv=set())
    cpu = breakdown.itemise_temps(mem["peak_buffers"], facts, "cpu")
    assert cpu["gathered"] == dict(bytes=256 * 256 * 4, cpu_upcast=256 * 256 * 4, cpu_excess=256 * 256 * 4)
    tpu = breakdown.itemise_temps(mem["peak_buffers"], facts, "tpu")
    assert all(t["cpu_upcast"] == 0 for t in tpu.values())
    assert sum(t["bytes"] for t in cpu.values()) <= mem["temp"] + mem["output"]


def test_classify_buffer_by_shape():
    """eka_7b's shapes at fsdp=8 (vocab 152064, hidden 3584, 28 layers, 4096 tokens, 8 rows per device)."""
    from jaxsearch.plan import breakdown

    facts = dict(
        vocab=152064,
        hidden=3584,
        layers=28,
        seq={4096, 4095},
        whole={152064 * 3584, 3584 * 37888},  # embedding, one layer's gate/up, whole
        shard={152064 * 448, 28 * 448 * 37888},  # their fsdp=8 shards, the layers' stacked
        kv=set(),
    )
    c = lambda s: breakdown.classify_buffer(s, facts)
    assert c("f32[3584,152064]") == "gathered" and c("bf16[37888,3584]") == "gathered"
    assert c("f32[448,152064]") == "weight_shaped" and c("f32[28,448,2,18944]") == "weight_shaped"
    assert c("f32[8,512,152064]") == "logits" and c("f32[4096,152064]") == "logits"
    assert c("bf16[28,8,4095,3584]") == "checkpoints"
    assert c("f32[32760,37888]") == "activations" and c("f32[8,4,7,512,4095]") == "activations"
    assert c("f32[64,1]") == "other" and c("s32[]") == "other"
    kv = dict(facts, kv={64 * 4096 * 4 * 128, 28 * 64 * 4096 * 4 * 128})
    assert breakdown.classify_buffer("f32[64,4096,4,128]", kv) == "kv"
    # a decode step keeps no layer inputs for a backward
    assert breakdown.classify_buffer("f32[28,8,4096,3584]", kv) == "activations"
