"""bench/gpu_check.sh --dry-run: the GPU check's code end to end on the CPU at tiny shapes (its JSON's
fields, positive and mutually consistent figures, the summary and the files that come back), and its handling
of a part that fails or outlives its budget."""

import json
import os
import subprocess
import sys

import pytest

from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_check  # noqa: E402


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    env = dict(os.environ, OUT=str(tmp / "out"), PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", os.path.join(ROOT, "bench", "gpu_check.sh"), "--dry-run", "--work", str(tmp / "work")],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_S,
    )
    return done, tmp / "out"


@pytest.mark.slow
def test_dry_run_measures_every_part(dry_run):
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads((out / "gpu_check.json").read_text())
    assert r["mode"] == "dry-run" and r["ok"] and r["device_kind"] == "cpu"
    parts = r["parts"]
    assert list(parts) == [name for name, _ in gpu_check.DRY.parts]
    assert all(p["status"] == "ok" and p["seconds"] > 0 for p in parts.values())
    assert sum(p["seconds"] for p in parts.values()) <= r["total_s"] + 1

    roll = parts["rollout"]
    assert [b["batch"] for b in roll["batches"]] == list(gpu_check.DRY.rollout_batches)
    assert roll["copy_TB_s"] > 0 and roll["datasheet_TB_s"] is None
    for b in roll["batches"]:
        assert b["tokens"] == b["batch"] * roll["new"]  # no row stopped early
        assert b["tok_s"] == pytest.approx(b["tokens"] / b["rollout_s"], rel=2e-3)
        assert (
            0 < b["prefill_ms"] < 1e3 * b["rollout_s"]
            and 0 < b["decode_step_ms"] * roll["new"] < 1e3 * b["rollout_s"]
        )
        assert b["step_bytes"] > 0
        step_s = b["decode_step_ms"] / 1e3
        assert b["reached_TB_s"] == pytest.approx(b["step_bytes"] / step_s / 1e12, rel=2e-3)
        assert b["of_copy"] == pytest.approx(b["reached_TB_s"] / roll["copy_TB_s"], rel=2e-3)
    # the floor: weights once, plus the batch's KV cache (grows with the batch)
    small, large = roll["batches"][0], roll["batches"][-1]
    assert large["step_bytes"] > small["step_bytes"]

    (shape,) = gpu_check.DRY.grpo
    g, plan = parts[f"grpo:{shape}"], r["plans"][shape]
    assert plan["status"] == "ok" and plan["backend"] == "cpu" and plan["mesh"]["fsdp"] == 1
    # the train step's phase: the step's own memory and the reference params resident beside it
    assert plan["train_step_bytes"] == plan["train_step_total_bytes"] + plan["reference_bytes"]
    assert plan["reference_bytes"] > 0 and plan["train_step_total_bytes"] > 0
    assert g["shape"] == shape and (g["rows"], g["width"], g["micro_batches"]) == (4, 64, 2)
    assert g["attention_impl"] == "reference" and g["reference_resident"] and g["loss_finite"]
    assert g["num_params"] > 0 and g["step_s"] > 0
    assert g["tok_s"] == pytest.approx(g["rows"] * g["width"] / g["step_s"], rel=2e-3)
    assert g["peak_bytes"] > 0 and g["plan_train_step_bytes"] == plan["train_step_bytes"]
    assert g["measured_over_plan"] == pytest.approx(g["peak_bytes"] / plan["train_step_bytes"], rel=2e-3)
    # the accelerator figure: the CPU compiler's less its fp32 copies of bf16 values (base.py: bf16 compute)
    assert 0 < plan["train_step_accelerator_bytes"] <= plan["train_step_bytes"]
    assert g["measured_over_accelerator_plan"] == pytest.approx(
        g["peak_bytes"] / plan["train_step_accelerator_bytes"], rel=2e-3
    )

    tiny = parts["tiny"]
    assert tiny["steps"] == len(tiny["step_s"]) == 2 and tiny["evaluations"] == [0, 2]
    assert 0 < sum(tiny["step_s"]) < tiny["wall_s"] and tiny["first_step_s"] == tiny["step_s"][0]
    assert all(x > 0 for x in tiny["tokens_per_s"] + tiny["rollout_s"] + tiny["update_s"])
    metrics = [json.loads(line) for line in (out / "tiny_metrics.jsonl").read_text().splitlines()]
    assert [m["time/step_s"] for m in metrics if "time/step_s" in m] == pytest.approx(
        tiny["step_s"], abs=1e-3
    )

    att = parts["attention"]["impls"]
    assert att["cudnn"]["status"].startswith("skipped")
    assert att["reference"]["status"] == att["xla"]["status"] == "ok"
    assert all(v == 0 for v in att["reference"]["max_rel_diff"].values())
    assert 0 <= max(att["xla"]["max_rel_diff"].values()) < 1e-5  # fp32: the same attention
    assert att["xla"]["fwd_bwd_ms"] > 0

    # the summary table and the log of every process
    assert "gpu_check (dry-run): cpu" in done.stdout
    log = (out / "gpu_check.log").read_text()
    for name in [*parts, *(f"plan:{s}" for s in r["plans"])]:
        assert f"===== {name}: ok" in log
    assert all(f"\n{name} " in done.stdout for name in parts)


def test_a_failed_or_overdue_part_is_recorded_and_the_run_goes_on(tmp_path):
    """A part whose process exits non-zero is "failed" with its exit code and last output lines; one past its
    budget is killed (its whole process group) and "timeout"; both logged."""
    run = gpu_check.Run(gpu_check.DRY, str(tmp_path), str(tmp_path), budget_s=60)
    failed = run.finish("broken", run.spawn("broken", ["bash", "-c", "echo partial output; exit 3"]), 30)
    assert failed["status"] == "failed" and failed["error"].startswith("exit code 3")
    assert "partial output" in failed["error"]
    job = run.spawn("slow", ["bash", "-c", "sleep 60 & echo started; wait"])
    late = run.finish("slow", job, 1)
    assert late["status"] == "timeout" and late["seconds"] < 30
    assert job[0].poll() is not None
    log = (tmp_path / "gpu_check.log").read_text()
    assert "===== broken: failed" in log and "===== slow: timeout" in log and "started" in log
