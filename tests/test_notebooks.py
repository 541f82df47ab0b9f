"""notebooks/entropy_curves.ipynb on the logs of two real tiny runs (Search-R1 baseline and EKA).

The runs are launch/train.py subprocesses (one CPU device each); the notebook runs
under nbclient with JAXSEARCH_RUNS pointing at them, and draws with jaxsearch.eval.curves (tests/test_curves.py
tests those functions on hand-written logs). The references are the metrics files parsed here
with json, independently of notebooks/runs.py.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
NOTEBOOK = os.path.join(NOTEBOOKS, "entropy_curves.ipynb")
sys.path.insert(0, NOTEBOOKS)

import runs  # noqa: E402
from hang import HANG_S

# pytest-xdist: the module's tests share its costly fixtures, so one worker runs them all
pytestmark = pytest.mark.xdist_group("notebooks")

TRAIN_FLAGS = [
    "--config=configs/tiny_cpu.py",
    "--progress=false",
    "--config.total_steps=3",
    "--config.sft.steps=10",
    "--config.sft.batch_size=4",  # the warm start's compute: ~5 s less per run on 2 cores
    "--config.data.batch_size=4",
    "--config.data.group_size=2",
    "--config.data.eval_examples=4",
    "--config.rollout.max_turns=2",
    "--config.rollout.max_segment_tokens=24",
    "--config.eval_every=3",
]
PNGS = (
    "learning_curve.png",
    "entropy_by_segment.png",
    "entropy_by_segment_eval.png",
    "turns_searches.png",
    "reward_em.png",
    "sft_loss.png",
)
# per-example records in launch/eval.py's format (jaxsearch/eval/evaluate.py: <out>/<dataset>.jsonl), for the
# trajectory browser; the first has a token row whose per-segment entropy is worked out by hand below
EXAMPLES = [
    {
        "id": "dev_0",
        "question": "Who founded the city where Vorlan Keth was born?",
        "golden_answers": ["Ilsa Marrow"],
        "prediction": "Ilsa Marrow",
        "metrics": {"em": 1.0, "f1": 1.0, "sub_em": 1.0, "recall": 1.0, "rs": None, "fabrication": None},
        "turns": 2,
        "searches": 1,
        "truncated": False,
        "response": "<think>Need the birthplace first.</think><search>Vorlan Keth born</search>"
        "<information>Doc 1: Vorlan Keth was born in Ostrel.</information><answer>Ilsa Marrow</answer>",
        "prompt_length": 2,
        "tokens": [5, 6, 7, 8, 9, 10, 11, 12],
        # other other think think search information information answer
        "segment_ids": [0, 0, 1, 1, 2, 6, 6, 3],
        "loss_mask": [0, 0, 1, 1, 1, 0, 0, 1],
        "entropy": [9.0, 9.0, 0.5, 1.5, 2.0, 7.0, 7.0, 0.25],
    },
    {
        "id": "dev_1",
        "question": "What river flows through Ostrel?",
        "golden_answers": ["the Dune"],
        "prediction": "the Kavel",
        "metrics": {"em": 0.0, "f1": 0.5, "sub_em": 0.0, "recall": 0.0, "rs": None, "fabrication": None},
        "turns": 1,
        "searches": 0,
        "truncated": False,
        "response": "<think>Search it.</think><answer>the Kavel</answer>",
    },
]
# the policy's tokens only (loss mask 1): think (0.5 + 1.5) / 2, search 2.0, answer 0.25
EXAMPLE_ENTROPY = "entropy: think=1  search=2  answer=0.25"


def _json_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _direct_series(path, key):
    """(steps, values) of the rows of a metrics file that logged `key`, by a plain json parse."""
    rows = [r for r in _json_rows(path) if key in r]
    return [r["step"] for r in rows], [r[key] for r in rows]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Train the two runs one after the other; the second reuses the first's compiled programs (same
    shapes) from the test session's persistent compilation cache (conftest: every compile, however short),
    which is faster on 2 cores than in parallel."""
    base = tmp_path_factory.mktemp("runs")
    env = dict(os.environ, XLA_FLAGS="")  # one CPU device per process: the trainer's own mesh
    dirs = {"baseline": str(base / "run_a"), "eka": str(base / "run_b")}
    extra = {"baseline": [], "eka": ["--config.protocol.name=eka"]}
    for name, workdir in dirs.items():
        cmd = [sys.executable, "launch/train.py", *TRAIN_FLAGS, f"--workdir={workdir}", *extra[name]]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S)
        assert proc.returncode == 0, f"{name} training failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return dirs


def _execute(runs_map, out_dir, monkeypatch):
    """Run the notebook with nbclient; returns the executed notebook and all its text output."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient

    if "python3" not in KernelSpecManager().find_kernel_specs():
        from ipykernel.kernelspec import install

        prefix = os.path.join(out_dir, "kernel_prefix")
        install(prefix=prefix, kernel_name="python3")
        monkeypatch.setenv("JUPYTER_PATH", os.path.join(prefix, "share", "jupyter"))
    monkeypatch.setenv("JAXSEARCH_RUNS", json.dumps(runs_map))
    monkeypatch.setenv("JAXSEARCH_NOTEBOOK_OUT", str(out_dir))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook cleared"
    NotebookClient(
        nb, kernel_name="python3", timeout=HANG_S, resources={"metadata": {"path": NOTEBOOKS}}
    ).execute()
    text = "\n".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream"
    )
    return nb, text


def test_loader_matches_json(two_runs):
    for run_dir in two_runs.values():
        for stage in runs.STAGES:
            path = runs.metrics_path(run_dir, stage)
            rows = _json_rows(path)
            assert rows, path
            columns = runs.load_columns(path)
            assert columns["step"] == [r["step"] for r in rows]  # one row per step, in order
            keys = {k for r in rows for k in r} - {"step"}
            assert set(columns) - {"step"} == keys
            for i, row in enumerate(rows):
                for key in keys:
                    assert columns[key][i] == row.get(key), (path, row["step"], key)
            for key in ("entropy/think", "turns", "eval/synthetic/em", "sft/loss"):
                assert runs.series(columns, key) == _direct_series(path, key)
    grpo = runs.load_run(two_runs["eka"])["rl"]
    assert runs.eval_datasets(grpo, "em") == ["synthetic"]
    assert runs.series(grpo, "no/such/key") == ([], [])
    assert not runs.has(grpo, "no/such/key")


def test_read_rows_errors(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": \n{"step": 3, "a": 3.0}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        runs.read_rows(str(path))
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a"')  # a write cut short by a kill
    with pytest.warns(UserWarning, match="unterminated"):
        assert runs.load_columns(str(path)) == {"step": [1], "a": [1.0]}
    path.write_text('{"a": 1.0}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: expected a JSON object with a 'step'"):
        runs.read_rows(str(path))


def test_notebook_plots_the_logged_values(two_runs, tmp_path, monkeypatch):
    eval_dir = os.path.join(two_runs["baseline"], "eval")
    os.makedirs(eval_dir, exist_ok=True)
    with open(os.path.join(eval_dir, "synthetic.jsonl"), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in EXAMPLES)

    out = tmp_path / "out"
    _, text = _execute(two_runs, out, monkeypatch)

    for name in PNGS:
        with open(out / name, "rb") as f:
            data = f.read()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n", name

    plotted = json.loads((out / "plotted_series.json").read_text())
    grpo = {name: runs.metrics_path(d, "rl") for name, d in two_runs.items()}
    checks = [  # (png, panel, line label, metrics file, key)
        ("learning_curve.png", "held-out EM (greedy)", "eka", grpo["eka"], "eval/synthetic/em"),
        ("learning_curve.png", "training reward", "baseline", grpo["baseline"], "reward"),
        ("entropy_by_segment.png", "<think> tokens", "baseline", grpo["baseline"], "entropy/think"),
        ("entropy_by_segment.png", "<answer> tokens", "eka", grpo["eka"], "entropy/answer"),
        ("turns_searches.png", "turns per episode", "eka", grpo["eka"], "turns"),
        ("turns_searches.png", "searches per episode", "baseline", grpo["baseline"], "searches"),
        ("reward_em.png", "reward", "baseline", grpo["baseline"], "reward"),
        ("reward_em.png", "EM (eval)", "eka", grpo["eka"], "eval/synthetic/em"),
        ("sft_loss.png", "sft/loss", "eka", runs.metrics_path(two_runs["eka"], "sft"), "sft/loss"),
    ]
    for png, panel, label, path, key in checks:
        steps, values = _direct_series(path, key)
        line = plotted[png][panel].get(label)
        if not steps:  # this tiny run never produced such tokens: the notebook must have said so
            assert line is None and f"{label} logged no {key!r}" in text
            continue
        assert line["key"] == key
        assert (line["x"], line["y"]) == (steps, values), (png, panel, label)
    assert len(plotted["sft_loss.png"]["sft/loss"]["eka"]["y"]) == 10

    assert "R-S panel skipped" in text  # no run logs eval/*/rs yet
    browser = text[text.index("=== baseline") :]
    assert EXAMPLES[0]["question"] in browser and "prediction: the Kavel" in browser
    assert "<search>Vorlan Keth born</search>" in browser
    assert "em=1  f1=1  sub_em=1  recall=1  turns=2  searches=1  truncated=False" in browser
    assert EXAMPLE_ENTROPY in browser
    eka_part = browser[browser.index("=== eka") :]
    assert "none found" in eka_part  # its world/*.jsonl splits are questions, not evaluated examples


def test_notebook_skips_missing_keys(two_runs, tmp_path, monkeypatch):
    """A run with no answer tokens, no evaluation and no SFT log yet: notes instead of errors."""
    run = tmp_path / "partial"
    (run / "grpo").mkdir(parents=True)
    rows = _json_rows(runs.metrics_path(two_runs["baseline"], "rl"))
    kept = [
        {k: v for k, v in r.items() if k != "entropy/answer" and not k.startswith("eval/")}
        for r in rows
        if "reward" in r
    ]
    (run / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))

    out = tmp_path / "out"
    _, text = _execute({"partial": str(run)}, out, monkeypatch)
    assert "partial logged no 'entropy/answer'" in text
    assert "evaluation entropy skipped" in text
    assert "SFT curve skipped" in text
    assert "none found" in text
    plotted = json.loads((out / "plotted_series.json").read_text())
    assert plotted["entropy_by_segment.png"]["<answer> tokens"] == {}
    assert plotted["learning_curve.png"]["held-out EM (greedy)"] == {}  # no evaluation: noted, not plotted
    assert "partial logged no 'eval/synthetic/em'" in text
    assert plotted["reward_em.png"]["reward"]["partial"]["y"] == [r["reward"] for r in kept]
    assert (out / "entropy_by_segment.png").stat().st_size > 1000
