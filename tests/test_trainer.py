"""The trainer end to end on a tiny world: resume after SIGKILL is exact, SIGTERM checkpoints, bad keys fail."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hang import HANG_S

# pytest-xdist: the module's tests share its costly fixtures, so one worker runs them all
pytestmark = pytest.mark.xdist_group("trainer")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "launch", "train.py")
# a very small run: 6 GRPO steps of 4 questions x 2 samples, checkpoint every 2 steps, 10 SFT steps
FLAGS = [
    "--config",
    os.path.join(ROOT, "configs", "tiny_cpu.py"),
    "--progress=false",
    "--config.total_steps=6",
    "--config.save_every=2",
    "--config.eval_every=0",
    "--config.sft.steps=10",
    "--config.data.batch_size=4",
    "--config.data.group_size=2",
    "--config.data.eval_examples=4",
    "--config.rollout.max_turns=2",
    "--config.rollout.max_segment_tokens=24",
    "--config.model.hidden_size=64",  # the former tiny_cpu model (2 x 64): what is tested is the loop
    "--config.model.intermediate_size=192",
    "--config.model.num_hidden_layers=2",
]


def _env():
    env = dict(os.environ)
    env["XLA_FLAGS"] = ""  # one CPU device per process: the trainer's own mesh
    return env


def _run(workdir, *extra, wait=True):
    cmd = [sys.executable, TRAIN, *FLAGS, f"--workdir={workdir}", *extra]
    if wait:
        return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=HANG_S)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())


def _final_params(workdir):
    """The last checkpoint's params, as numpy arrays keyed by path."""
    import jax
    from jaxsearch import checkpoint

    ckpt = checkpoint.TrainCheckpointer(os.path.join(workdir, "grpo"), save_every=1)
    step = max(ckpt.all_steps())
    path = os.path.join(ckpt.directory, str(step), "state")
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().restore(path)
    return step, {
        jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)
    }


def _wait_for_checkpoint(workdir, step, proc, limit=400):
    target = os.path.join(workdir, "grpo", "checkpoints", str(step))
    start = time.time()
    while not os.path.exists(os.path.join(target, "commit_success.txt")) and not os.path.isdir(
        os.path.join(target, "meta")
    ):
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() - start < limit, "no checkpoint in time"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("clean"))
    done = _run(workdir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return workdir


def test_resume_after_sigkill_is_bit_identical(uninterrupted, tmp_path):
    workdir = str(tmp_path / "killed")
    proc = _run(workdir, wait=False)
    _wait_for_checkpoint(workdir, 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = _run(workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    step_a, a = _final_params(uninterrupted)
    step_b, b = _final_params(workdir)
    assert step_a == step_b == 6
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    # the metrics file has each step once, as if never interrupted
    steps = [json.loads(line)["step"] for line in open(os.path.join(workdir, "grpo", "metrics.jsonl"))]
    assert steps == sorted(set(steps)) and steps[-1] == 6
    # the run's config is in the workdir, once: the resume ran the same config
    recorded = json.load(open(os.path.join(workdir, "config.json")))
    assert recorded["total_steps"] == 6 and recorded["model"]["hidden_size"] == 64
    assert not os.path.exists(os.path.join(workdir, "config.1.json"))
    assert "another config" not in again.stderr


def test_finished_run_exports_its_final_policy_as_a_params_dir(uninterrupted):
    """grpo/params (what launch/eval.py reads) holds exactly the last checkpoint's policy params."""
    import jax
    from jaxsearch.models import orbax_io

    _, state = _final_params(uninterrupted)
    config, params = orbax_io.restore_params(os.path.join(uninterrupted, "grpo", "params"))
    exported = {
        jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)
    }
    assert config.num_hidden_layers == 2 and len(exported) > 0
    for key, value in exported.items():
        np.testing.assert_array_equal(value, state["['policy']['params']" + key], err_msg=key)


def test_sigterm_writes_a_checkpoint_and_exits_cleanly(tmp_path):
    workdir = str(tmp_path / "term")
    proc = _run(workdir, "--config.total_steps=50", "--config.save_every=100", wait=False)
    metrics = os.path.join(workdir, "grpo", "metrics.jsonl")
    start = time.time()
    while not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 2):
        assert proc.poll() is None and time.time() - start < 400
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG_S) == 0
    steps = os.listdir(os.path.join(workdir, "grpo", "checkpoints"))
    assert [s for s in steps if s.isdigit()], steps


def test_unknown_config_key_is_an_error_naming_it(tmp_path):
    done = _run(str(tmp_path / "typo"), "--config.algo.kl_coeff=0.1")
    assert done.returncode != 0
    assert "kl_coeff" in done.stderr


def test_rerun_with_another_config_keeps_the_earlier_one_and_names_what_changed(tmp_path, caplog):
    import ml_collections
    from jaxsearch.rl.pipeline import record_config

    cfg = ml_collections.ConfigDict(dict(total_steps=40, reward=dict(terms=(("em", 1.0),)), seed=0))
    record_config(cfg, str(tmp_path))
    first = (tmp_path / "config.json").read_text()
    assert json.loads(first) == {"reward": {"terms": [["em", 1.0]]}, "seed": 0, "total_steps": 40}
    record_config(cfg, str(tmp_path))  # the same config: nothing kept, nothing said
    assert sorted(os.listdir(tmp_path)) == ["config.json"] and not caplog.records
    cfg.total_steps = 100
    cfg.reward.terms = (("f1", 1.0),)
    with caplog.at_level("WARNING"):
        record_config(cfg, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.1.json", "config.json"]
    assert (tmp_path / "config.1.json").read_text() == first
    assert json.loads((tmp_path / "config.json").read_text())["total_steps"] == 100
    message = caplog.records[-1].getMessage()
    assert "reward.terms ([['em', 1.0]] -> [['f1', 1.0]])" in message and "total_steps (40 -> 100)" in message
    assert "seed" not in message
    # a half-written record (a kill before atomic writes) is kept too, not a crash
    (tmp_path / "config.json").write_text('{"total_steps": 1')
    with caplog.at_level("WARNING"):
        record_config(cfg, str(tmp_path))
    assert (tmp_path / "config.2.json").read_text() == '{"total_steps": 1'
    assert "not valid JSON" in caplog.records[-1].getMessage()
    assert json.loads((tmp_path / "config.json").read_text())["total_steps"] == 100
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_eval_summary_reports_first_and_last_evaluation(tmp_path):
    from jaxsearch.rl.pipeline import eval_summary

    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "eval/nq/em": 0.25, "eval/nq/f1": 0.5, "eval/nq/turns": 2.0},
        {"step": 1, "reward": 1.0},
        {"step": 4, "eval/nq/em": 0.5, "eval/nq/f1": 0.75},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert eval_summary(str(path)).splitlines() == [
        "eval/nq/em: 0.250 at step 0 -> 0.500 at step 4",
        "eval/nq/f1: 0.500 at step 0 -> 0.750 at step 4",
    ]
