"""Faults a user meets with the commands (issue 42): an output directory that is not ours is refused and never
touched, two trainers in one workdir, a config typo, a resumed or corrupt checkpoint said in one plain line.
Each test runs the real command: its `main(argv)` in-process, or a subprocess where two processes are needed."""

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from hang import HANG_S

from jaxsearch.data.qa_example import QADataError
from jaxsearch.files import MARKER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_LINES = open(os.path.join(ROOT, "tests", "data", "corpus", "corpus.jsonl")).readlines()[:20]
CONFIG = os.path.join(ROOT, "configs", "tiny_cpu.py")
# a training run that fails fast once it has started (a train file that does not exist): no world, no SFT
FAILING_RUN = ["--progress=false", "--config.world.size=", "--config.sft.steps=0", "--config.data.train=/nonexistent"]


def snapshot(directory):
    """Every file under `directory` with its bytes: what a refused command must leave as it was."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory)] = open(path, "rb").read()
    return out


def env():
    """A subprocess's environment: this checkout first on the path, one CPU device."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), XLA_FLAGS="",
                JAX_PLATFORMS="cpu")


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(CORPUS_LINES))
    return str(path)


def build_index(*argv):
    from jaxsearch.cli import build_index as cli

    return cli.main(["--retriever", "bm25", "--no-progress", *argv])


def train(argv, capsys):
    """launch/train.py in-process -> (exit status, stderr)."""
    from jaxsearch.cli import train as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--config", CONFIG, *argv])
    return exit_.value.code, capsys.readouterr().err


# --- 1. an output directory that is not ours is refused before any work, and never deleted or renamed


def test_build_index_refuses_a_directory_of_user_files_and_the_corpus_itself(tmp_path, corpus, capsys):
    notes = tmp_path / "mine"
    notes.mkdir()
    (notes / "notes.txt").write_text("my notes")
    assert build_index("--corpus", corpus, "--out", str(notes)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(notes) in err and "notes.txt" in err, err
    assert snapshot(notes) == {"notes.txt": b"my notes"}
    assert sorted(os.listdir(tmp_path)) == ["corpus.jsonl", "mine"]  # no mine.partial, no mine.old

    # --out naming the corpus file: the corpus stays where it is, as it was
    assert build_index("--corpus", corpus, "--out", corpus) == 2
    assert str(corpus) in capsys.readouterr().err
    assert open(corpus).read() == "".join(CORPUS_LINES)
    assert sorted(os.listdir(tmp_path)) == ["corpus.jsonl", "mine"]


def test_build_index_writes_an_absent_or_empty_directory_and_rebuilds_its_own(tmp_path, corpus):
    from jaxsearch.retrieval import make_retriever

    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "index", tmp_path / "empty"):
        assert build_index("--corpus", corpus, "--out", str(out)) == 0
        assert (out / MARKER).is_file()
        assert build_index("--corpus", corpus, "--out", str(out), "--k1", "1.2") == 0  # its own: replaced
        title = json.loads(CORPUS_LINES[3])["contents"].split("\n")[0].strip('"')
        hits = make_retriever("bm25", corpus=corpus, index=str(out), progress=False).search([title], 1)
        assert hits[0][0].title == title
        assert json.load(open(out / "meta.json"))["k1"] == 1.2


def test_an_index_written_before_the_marker_is_still_rebuilt(tmp_path, corpus):
    out = tmp_path / "index"
    assert build_index("--corpus", corpus, "--out", str(out)) == 0
    os.remove(out / MARKER)  # as an earlier version wrote it: meta.json, no marker
    assert build_index("--corpus", corpus, "--out", str(out)) == 0
    assert (out / MARKER).is_file()


def test_train_refuses_a_workdir_of_user_files_before_any_work(tmp_path, capsys):
    workdir = tmp_path / "mine"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("my notes")
    status, err = train([f"--workdir={workdir}", *FAILING_RUN], capsys)
    assert status == 2 and err.count("\n") == 1 and str(workdir) in err and "Traceback" not in err, err
    assert snapshot(workdir) == {"notes.txt": b"my notes"}


def test_train_resumes_into_a_workdir_of_an_earlier_version(tmp_path, capsys):
    """A workdir that an earlier version wrote (config.json beside grpo/, no marker) is still ours: the run
    gets past the checks (and then fails on the missing train file)."""
    workdir = tmp_path / "run"
    (workdir / "grpo" / "checkpoints").mkdir(parents=True)
    (workdir / "config.json").write_text("{}")
    from jaxsearch.cli import train as cli

    with pytest.raises(QADataError, match="nonexistent: no such QA file"):
        cli.main(["train", "--config", CONFIG, f"--workdir={workdir}", *FAILING_RUN])
    assert (workdir / MARKER).is_file() and not (workdir / "train.lock").exists()


# --- 2. two trainers in one workdir


def test_a_second_trainer_in_a_locked_workdir_refuses_naming_the_holder(tmp_path, capsys):
    workdir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from jaxsearch.files import DirLock, claim_output_dir
            claim_output_dir({str(workdir)!r}, "--workdir")
            DirLock({str(workdir / "train.lock")!r}).acquire()
            print("locked", flush=True)
            time.sleep({HANG_S})
        """)],
        stdout=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "locked\n"
        before = snapshot(workdir)
        start = time.monotonic()
        status, err = train([f"--workdir={workdir}", *FAILING_RUN], capsys)
        seconds = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert status == 2 and err.count("\n") == 1, err
    assert f"pid {holder.pid}" in err and socket.gethostname() in err and str(workdir / "train.lock") in err, err
    assert snapshot(workdir) == before  # nothing written: no config.json, no stage directory
    print(f"refused in {seconds:.2f} s")


def test_a_lock_left_by_a_dead_trainer_is_taken_over_with_a_warning(tmp_path, caplog):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / MARKER).write_text("")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = workdir / "train.lock"
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    from jaxsearch.cli import train as cli

    with caplog.at_level(logging.WARNING, logger="jaxsearch.files"):
        with pytest.raises(QADataError, match="nonexistent: no such QA file"):  # past the lock: the run started
            cli.main(["train", "--config", CONFIG, f"--workdir={workdir}", *FAILING_RUN])
    warnings = [r.getMessage() for r in caplog.records if r.name == "jaxsearch.files"]
    assert any(str(lock) in w and f"pid {dead.pid}" in w for w in warnings), warnings
    assert not lock.exists()  # released when the run ended


def test_a_lock_of_another_host_is_refused_with_the_fix(tmp_path):
    from jaxsearch.files import DirLock, LockedError

    lock = tmp_path / "train.lock"
    lock.write_text(json.dumps({"pid": 1234, "host": "elsewhere"}))
    with pytest.raises(LockedError, match="pid 1234 on host elsewhere.*delete the lock file"):
        DirLock(str(lock)).acquire()
    assert json.loads(lock.read_text()) == {"pid": 1234, "host": "elsewhere"}


# --- 6. a config typo is one line naming the key and the nearest valid one


@pytest.mark.parametrize(
    "override, expected",
    [
        ("--config.rollout.max_turnz=3", ["max_turnz", "did you mean --config.rollout.max_turns?"]),
        ("--config.nonexistent.key=1", ["no section 'nonexistent'", "rollout"]),
    ],
)
def test_train_config_typo_is_one_line_with_the_nearest_key(override, expected, tmp_path, capsys):
    status, err = train([f"--workdir={tmp_path / 'run'}", override], capsys)
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {override.split('=')[0]}:") and all(e in err for e in expected), err
    assert not (tmp_path / "run").exists()


def test_plan_config_typo_is_one_line_with_the_nearest_key():
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "launch", "plan.py"), "--config", CONFIG, "--config.algo.kl_coeff=1"],
        capture_output=True, text=True, env=env(), cwd=ROOT, timeout=HANG_S,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "did you mean --config.algo.kl_coef?" in done.stderr


# --- 7a. the resumed step, and a corrupt checkpoint, in one plain line

RESUME = """
import sys
import jax
import jax.numpy as jnp
from configs import tiny_cpu
from jaxsearch import checkpoint, parallel
from jaxsearch.agent.policy import load_policy, model_config
from jaxsearch.cli import train
from jaxsearch.config import RunConfig
from jaxsearch.data import qa
from jaxsearch.files import claim_output_dir
from jaxsearch.models import orbax_io, qwen2
from jaxsearch.rl import pipeline
from jaxsearch.rl.algorithms import make_algorithm

workdir, flags = sys.argv[1], sys.argv[2:]
c = tiny_cpu.get_config()
for flag in flags:
    if flag.startswith("--config."):
        key, value = flag[len("--config."):].split("=")
        section, _, name = key.rpartition(".")
        node = c[section] if section else c
        node[name] = type(node[name])(value)
claim_output_dir(workdir, "--workdir")
cfg = pipeline.prepare_world(RunConfig.from_dict(c), workdir)
# the starting policy: zeros (a random init compiles for long on a CPU)
model = model_config(cfg.model)
shapes = jax.eval_shape(lambda key: qwen2.init_params(model, key), jax.random.PRNGKey(0))
orbax_io.save_params(cfg.model.orbax_path, model, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
# step 3's checkpoint of this run, as the trainer saves it (rl/trainer.py), without training three steps
mesh = parallel.make_mesh(dict(cfg.mesh))
model, params = load_policy(cfg.model, cfg.seed, mesh)
state = make_algorithm(cfg, model, mesh).init_state(params)
iterator = qa.QAIterator(qa.load_examples(cfg.data.train), cfg.data.batch_size, cfg.data.group_size, cfg.seed, True)
ckpt = checkpoint.TrainCheckpointer(workdir + "/grpo", save_every=1)
ckpt.save(3, state, {"iterator": iterator.state()}, force=True)
ckpt.close()
open(workdir + "/grpo/metrics.jsonl", "w").close()  # what the three steps would have logged: nothing here
train.main(["train", "--config", tiny_cpu.__file__, "--workdir", workdir, *flags])
"""


def test_a_resumed_run_says_from_which_step_and_checkpoint(tmp_path):
    workdir = str(tmp_path / "run")
    flags = ["--progress=false", "--config.total_steps=3", "--config.sft.steps=0", "--config.model.hidden_size=32",
             "--config.model.intermediate_size=64", "--config.model.num_hidden_layers=1",
             f"--config.model.orbax_path={tmp_path / 'init'}"]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", RESUME, workdir, *flags], capture_output=True, text=True, env=env(),
                          cwd=ROOT, timeout=HANG_S)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint_dir = os.path.join(workdir, "grpo", "checkpoints", "3")
    assert f"resumed from step 3 (checkpoint {checkpoint_dir})\n" in done.stderr, done.stderr[-3000:]


def test_a_corrupt_checkpoint_warning_is_one_plain_line(tmp_path, caplog):
    import jax

    from jaxsearch.checkpoint import TrainCheckpointer

    ckpt = TrainCheckpointer(str(tmp_path), save_every=1)
    states = {step: {"w": jax.random.normal(jax.random.key(step), (64, 64))} for step in (1, 2)}
    for step, state in states.items():
        ckpt.save(step, state, {})
    ckpt.close()
    data = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(ckpt.directory, "2", "state")) for f in fs]
    biggest = max(data, key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)
    with caplog.at_level(logging.WARNING, logger="jaxsearch.checkpoint"):
        step, _, _ = TrainCheckpointer(str(tmp_path), save_every=1).restore_latest(states[1])
    assert step == 1
    warning = next(r.getMessage() for r in caplog.records if "unreadable" in r.getMessage())
    assert os.path.join(ckpt.directory, "2") in warning and "truncated or damaged" in warning, warning
    assert "\n" not in warning and "TensorStore" not in warning and len(warning) < 400, warning
