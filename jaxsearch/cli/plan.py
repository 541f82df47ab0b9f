"""Memory plan of a config on a mesh, without weights: python launch/plan.py --config configs/eka_7b.py
--mesh fsdp=8 [--backend cpu|tpu] [--target h100-80gb|v5p-95gb|h200-141gb|GB] [--headroom 0.1] [--json]
[--config.key=value ...]

Builds the abstract policy / reference / AdamW state (and the critic for PPO), AOT-compiles the train step
and the decode step over a mesh of the --mesh size, and prints XLA's per-device memory analysis and each
phase (the update, the rollout) term by term: the exact terms (weights, optimizer moments, reference, KV
cache, the rollout's copy of the weights: the shapes the step takes, the same on any backend), the
temporaries live at the compiled step's memory peak (from XLA's buffer liveness: gathered weights,
gradients, remat checkpoints, one layer's activations, logits; these depend on the backend's compiler) and the
remainder of the compiler's figure that no live buffer accounts for.

--backend cpu (default): fake CPU devices. XLA:CPU has no bf16 arithmetic: it makes fp32 copies of bf16
values (the decode step's weights and KV cache, the remat checkpoints), which a TPU or GPU does not; the
report names them ("CPU-only") and gives the peak without them beside the CPU figure, and the verdict uses
that. --backend tpu: abstract TPU v5p chips compiled by libtpu (no TPU needed; `pip install -e ".[tpu]"`):
the plan a pod would run, and the closer proxy for GPUs too. On a GPU, JAX preallocates 75% of the memory
unless XLA_PYTHON_CLIENT_MEM_FRACTION says more (0.9 for a plan near the budget).
"""

import os
import sys


def _mesh_arg(argv) -> str:
    for i, a in enumerate(argv):
        if a.startswith("--mesh="):
            return a.split("=", 1)[1]
        if a == "--mesh" and i + 1 < len(argv):
            return argv[i + 1]
    return "fsdp=8"


# the fake device count must be set before jax is imported
_MESH = _mesh_arg(sys.argv)
_N = 1
for _part in filter(None, _MESH.split(",")):
    _N *= int(_part.partition("=")[2] or 1)
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_N}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# the breakdown reads XLA's dump of each compile: a persistent compilation cache hit would compile nothing
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"


from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxsearch.cli import run_absl  # noqa: E402

config_flags.DEFINE_config_file("config", None, "a configs/*.py file with get_config()", lock_config=True)
flags.DEFINE_string("mesh", "fsdp=8", "mesh axis sizes, e.g. fsdp=8 or data=2,fsdp=4,tensor=2")
flags.DEFINE_string("target", "h100-80gb", "h100-80gb | v5p-95gb | h200-141gb | a number of GB per device")
flags.DEFINE_float("headroom", 0.1, "fraction of the target's memory kept free")
flags.DEFINE_bool("json", False, "print the plan as JSON")
flags.DEFINE_enum("backend", "cpu", ["cpu", "tpu"], "compile for fake CPU devices or abstract TPU v5p chips")
flags.DEFINE_enum("estimate", "", ["", "v5p", "h100"], "also print a step-time estimate on this hardware")
flags.DEFINE_bool("estimate_only", False, "print only the step-time estimate (no compilation)")


def _run(argv):
    del argv
    import json

    from jaxsearch import plan

    cfg = flags.FLAGS.config
    if cfg is None:
        raise app.UsageError("--config is required, e.g. --config configs/eka_7b.py")
    shape = plan.parse_mesh(flags.FLAGS.mesh)
    estimate = None
    if flags.FLAGS.estimate:
        tensor = shape.get("tensor", 1)
        estimate = plan.step_time_estimate(cfg, plan.mesh_size(shape), flags.FLAGS.estimate, tensor=tensor)
    if flags.FLAGS.estimate_only:
        if estimate is None:
            raise app.UsageError("--estimate_only needs --estimate v5p or h100")
        print(json.dumps(estimate, indent=1) if flags.FLAGS.json else plan.format_estimate(estimate))
        return
    result = plan.plan(cfg, shape, flags.FLAGS.target, flags.FLAGS.headroom, flags.FLAGS.backend)
    if estimate is not None:
        result["estimate"] = estimate
    print(json.dumps(result, indent=1) if flags.FLAGS.json else plan.format_report(result))
    if estimate is not None and not flags.FLAGS.json:
        print(plan.format_estimate(estimate))


def main(argv=None):
    return run_absl(_run, __name__, argv)


if __name__ == "__main__":
    main()
