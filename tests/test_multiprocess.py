"""Two real processes x 4 CPU devices (jax.distributed over 127.0.0.1) against this single 8-device process:
the same rollouts, the same GRPO step, and orbax checkpoints written by both that restore here."""

import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import multiprocess_worker as worker
from jaxsearch import checkpoint, parallel
from jaxsearch.models import orbax_io
from jaxsearch.models import hf_io
from jaxsearch.models.sharding import param_shardings
from net import free_port
from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_workers(out_dir: str) -> list[tuple[subprocess.Popen, str]]:
    """The two worker processes, each with 4 CPU devices, logging to OUT_DIR/worker<i>.log."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    env = dict(
        os.environ,
        XLA_FLAGS=(flags + " --xla_force_host_platform_device_count=4").strip(),
        JAX_PLATFORMS="cpu",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
    )
    port, procs = free_port(), []
    for i in range(2):
        log = os.path.join(out_dir, f"worker{i}.log")
        with open(log, "w") as f:
            cmd = [
                sys.executable,
                os.path.join(ROOT, "tests", "multiprocess_worker.py"),
                str(i),
                str(port),
                out_dir,
            ]
            procs.append((subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT), log))
    return procs


def wait_workers(procs) -> None:
    """Wait for both (up to HANG_S); on a failure or timeout kill the rest and fail with their logs."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        codes = [p.poll() for p, _ in procs]
        if all(c == 0 for c in codes) or any(c not in (None, 0) for c in codes):
            break
        time.sleep(0.2)
    for p, _ in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    if any(p.returncode != 0 for p, _ in procs):
        logs = "".join(
            f"\n--- worker {i} (exit {p.returncode}) ---\n{open(log).read()[-6000:]}"
            for i, (p, log) in enumerate(procs)
        )
        raise AssertionError(f"multi-process workers failed or timed out after {HANG_S} s:{logs}")


@pytest.mark.slow  # started first under pytest-xdist (conftest)
def test_two_processes_match_one_process(tmp_path):
    out_dir = str(tmp_path)
    procs = start_workers(out_dir)
    try:
        mesh = parallel.make_mesh(worker.MESH)  # this process: 8 devices, the same mesh shape
        reference, ref_state = worker.scenario(mesh)
    finally:
        wait_workers(procs)
    with np.load(os.path.join(out_dir, "results.npz")) as f:
        multi = dict(f)
    assert sorted(multi) == sorted(reference)

    # rollouts: the same tokens (sampled and greedy) and masks, the same recorded log-probs
    for key in reference:
        if key.startswith("episode/") and not key.endswith("logprobs"):
            np.testing.assert_array_equal(multi[key], reference[key], err_msg=key)
        elif key.startswith("episode/"):
            np.testing.assert_allclose(multi[key], reference[key], atol=1e-5, err_msg=key)
    assert (reference["episode/sampled/turns"] == 3).all()  # P0, then 3 decode segments with hints between

    # retrieval split across the processes: the same docs, in query order, as one process searching them all
    np.testing.assert_array_equal(multi["retrieval/ids"], reference["retrieval/ids"])
    assert reference["retrieval/ids"][4].tolist() == ["d1", "d0"]  # "salt and copper": Orsk's passage first

    # the GRPO step: old log-probs, metrics and the updated params
    for key in reference:
        if key.startswith("train/"):
            np.testing.assert_allclose(multi[key], reference[key], atol=1e-5, err_msg=key)
    ref_params = [np.asarray(x) for x in jax.tree_util.tree_leaves(ref_state.params)]
    assert len(ref_params) == sum(k.startswith("train/params/") for k in multi)
    init = [np.asarray(x) for x in jax.tree_util.tree_leaves(worker.init_params(worker.CONFIG, mesh))]
    assert max(np.abs(a - b).max() for a, b in zip(ref_params, init)) > 1e-3  # the step moved them

    # checkpoints written by the two processes restore here, bit for bit what they held
    restored = checkpoint.TrainCheckpointer(os.path.join(out_dir, "train"), save_every=1).restore_latest(
        {"policy": ref_state}
    )
    assert restored is not None
    step, state, meta = restored
    assert step == 1 and meta == {"iterator": {"position": 8}} and int(state["policy"].step) == 1
    for i, x in enumerate(jax.tree_util.tree_leaves(state["policy"].params)):
        np.testing.assert_array_equal(np.asarray(x), multi[f"train/params/{i}"])
    config, params = orbax_io.restore_params(
        os.path.join(out_dir, "params"), shardings=param_shardings(worker.CONFIG, mesh)
    )
    assert config.hidden_size == worker.CONFIG.hidden_size
    for i, x in enumerate(jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(x), multi[f"train/params/{i}"])
    # the HF export: process 0 wrote what both processes held; it loads here bit for bit (fp32)
    config, params = hf_io.load_hf(os.path.join(out_dir, "hf"))
    assert config.num_hidden_layers == worker.CONFIG.num_hidden_layers
    for i, x in enumerate(jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(x), multi[f"train/params/{i}"])
