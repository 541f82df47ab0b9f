"""jaxsearch/eval/curves.py on hand-written metrics.jsonl files: the lines it draws are the logged values
(one run), their mean and std over seeds (several), worked out by hand here; the PNGs are images; and it
imports no jax."""

import json
import math
import os
import subprocess
import sys

import matplotlib.image
import pytest

from jaxsearch.eval import curves

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# two seeds of a baseline and one EKA run; evaluations at steps 0 and 2, training rows at steps 1-3
BASE = {
    "seed0": [
        {"step": 0, "eval/synthetic/em": 0.2, "eval/synthetic/entropy/think": 0.5},
        {"step": 1, "reward": 0.1, "entropy/think": 0.4, "entropy/search": 0.2, "entropy/answer": 0.9},
        {"step": 2, "reward": 0.3, "entropy/think": 0.6, "entropy/search": 0.1, "entropy/answer": 0.7},
        {"step": 2, "eval/synthetic/em": 0.4, "eval/synthetic/entropy/think": 0.3},  # same step: merged
        {"step": 3, "reward": 0.5, "entropy/think": 0.2, "entropy/search": 0.3, "entropy/answer": 0.5},
    ],
    "seed1": [
        {"step": 0, "eval/synthetic/em": 0.4, "eval/synthetic/entropy/think": 0.7},
        {"step": 1, "reward": 0.3, "entropy/think": 0.2, "entropy/search": 0.4, "entropy/answer": 0.3},
        {"step": 2, "reward": 0.7, "entropy/think": 0.8, "entropy/search": 0.3, "entropy/answer": 0.1},
        {"step": 2, "eval/synthetic/em": 0.8, "eval/synthetic/entropy/think": 0.1},
        {"step": 3, "reward": 0.9, "entropy/think": 0.6, "entropy/search": 0.1, "entropy/answer": 0.3},
    ],
}
EKA = [  # no answer tokens logged, a PPO run (ppo/metrics.jsonl)
    {"step": 0, "eval/synthetic/em": 0.1},
    {"step": 1, "reward": 0.2, "entropy/think": 0.3, "entropy/search": 0.05},
    {"step": 2, "reward": 0.4, "entropy/think": 0.1, "entropy/search": 0.15, "eval/synthetic/em": 0.3},
]


def _write(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.fixture
def logs(tmp_path):
    for seed, rows in BASE.items():
        _write(str(tmp_path / "base" / seed / "grpo" / "metrics.jsonl"), rows)
    _write(str(tmp_path / "base" / "seed0" / "sft" / "metrics.jsonl"), [{"step": 1, "sft/loss": 2.0}])
    _write(str(tmp_path / "eka" / "ppo" / "metrics.jsonl"), EKA)
    return {"base": str(tmp_path / "base"), "eka": str(tmp_path / "eka")}


def _std(a, b):  # sample std (ddof 1) of two values: |a - b| / sqrt(2)
    return abs(a - b) / math.sqrt(2)


def _close(got, want):
    assert len(got) == len(want) and all(math.isclose(g, w, abs_tol=1e-12) for g, w in zip(got, want)), (
        got,
        want,
    )


def _assert_png(path, panels):
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    # figsize 4.6 x 3.9 inches per panel at 110 dpi
    assert image.shape[:2] == (round(3.9 * 110), round(4.6 * panels * 110))
    assert image[..., :3].std() > 0.05  # not a blank canvas


def _figure_lines(fig, panel):
    (ax,) = [a for a in fig.axes if a.get_title() == panel]
    return {line.get_label(): line.get_xydata().tolist() for line in ax.lines}


def test_learning_curve_draws_each_seed_and_their_mean(logs, tmp_path):
    out = tmp_path / "out" / "learning_curve.png"
    fig, plotted = curves.plot_learning_curve(logs["base"], str(out), smooth=2)
    _assert_png(out, 2)
    assert fig._suptitle.get_text() == "Learning curve: base (2 seeds)"

    em = plotted["held-out EM (greedy)"]
    assert em["seed0"] == {"key": "eval/synthetic/em", "x": [0, 2], "y": [0.2, 0.4]}
    assert em["seed1"] == {"key": "eval/synthetic/em", "x": [0, 2], "y": [0.4, 0.8]}
    mean = em["mean ± std of 2"]
    assert mean["x"] == [0, 2]
    _close(mean["y"], [0.3, 0.6])
    _close(mean["std"], [_std(0.2, 0.4), _std(0.4, 0.8)])

    # the reward smoothed over a trailing window of 2 steps, per seed, then averaged
    reward = plotted["training reward (moving average of 2 steps)"]
    _close(reward["seed0"]["y"], [0.1, (0.1 + 0.3) / 2, (0.3 + 0.5) / 2])
    _close(reward["seed1"]["y"], [0.3, (0.3 + 0.7) / 2, (0.7 + 0.9) / 2])
    _close(reward["mean ± std of 2"]["y"], [0.2, 0.35, 0.6])
    assert reward["mean ± std of 2"]["x"] == [1, 2, 3]

    # the figure holds exactly these lines
    drawn = _figure_lines(fig, "held-out EM (greedy)")
    assert drawn["seed1"] == [[0, 0.4], [2, 0.8]]
    assert [x for x, _ in drawn["mean ± std of 2"]] == [0, 2]
    _close([y for _, y in drawn["mean ± std of 2"]], [0.3, 0.6])
    assert {ax.get_xlabel() for ax in fig.axes} == {"RL step"}


def test_entropy_per_tag_compares_groups_and_notes_what_is_missing(logs, tmp_path, capsys):
    out = tmp_path / "entropy.png"
    fig, plotted = curves.plot_entropy_per_tag(logs, str(out))
    _assert_png(out, 3)
    assert list(plotted) == ["<think> tokens", "<search> tokens", "<answer> tokens"]

    think = plotted["<think> tokens"]
    assert set(think) == {"base (mean ± std of 2)", "eka"}  # two groups: no per-seed lines by default
    base = think["base (mean ± std of 2)"]
    assert base["key"] == "entropy/think" and base["x"] == [1, 2, 3]
    _close(base["y"], [0.3, 0.7, 0.4])
    _close(base["std"], [_std(0.4, 0.2), _std(0.6, 0.8), _std(0.2, 0.6)])
    assert think["eka"] == {"key": "entropy/think", "x": [1, 2], "y": [0.3, 0.1]}  # found under ppo/
    _close(plotted["<search> tokens"]["base (mean ± std of 2)"]["y"], [0.3, 0.2, 0.2])

    assert "eka" not in plotted["<answer> tokens"]
    assert "note: eka logged no 'entropy/answer' (rl); not plotted" in capsys.readouterr().out
    _close(plotted["<answer> tokens"]["base (mean ± std of 2)"]["y"], [0.6, 0.4, 0.4])
    assert _figure_lines(fig, "<think> tokens")["eka"] == [[1, 0.3], [2, 0.1]]
    assert all(ax.get_ylabel() == "mean entropy per token (nats)" for ax in fig.axes)

    # the held-out evaluations' entropy instead, seed 0 alone, named on the command line's NAME=DIR way
    _, plotted = curves.plot_entropy_per_tag(
        [f"baseline={logs['base']}/seed0"], None, tags=["think"], source="eval"
    )
    assert plotted == {
        "<think> tokens": {"baseline": {"key": "eval/synthetic/entropy/think", "x": [0, 2], "y": [0.5, 0.3]}}
    }


def test_means_use_the_steps_every_run_logged(tmp_path):
    _write(str(tmp_path / "a" / "grpo" / "metrics.jsonl"), [{"step": s, "reward": s} for s in (1, 2, 3)])
    _write(str(tmp_path / "b" / "grpo" / "metrics.jsonl"), [{"step": s, "reward": 10 * s} for s in (2, 3, 4)])
    _, plotted = curves.plot_panels(
        {"both": [str(tmp_path / "a"), str(tmp_path / "b")]}, [("reward", ["reward"])], show_runs=False
    )
    mean = plotted["reward"]["mean ± std of 2"]  # one group: its name is the title's, not the line's
    assert list(plotted["reward"]) == ["mean ± std of 2"] and mean["x"] == [2, 3]
    _close(mean["y"], [(2 + 20) / 2, (3 + 30) / 2])
    _close(mean["std"], [_std(2, 20), _std(3, 30)])
    # columns in memory work as runs too
    _, plotted = curves.plot_panels({"mem": {"step": [5, 6], "reward": [0.5, None]}}, [("r", ["reward"])])
    assert plotted["r"]["mem"] == {"key": "reward", "x": [5], "y": [0.5]}


def test_smoothed_is_a_trailing_mean():
    assert curves.smoothed([1, 2, 3, 4], 1) == [1.0, 2.0, 3.0, 4.0]
    _close(curves.smoothed([1, 2, 3, 4], 3), [1.0, 1.5, 2.0, 3.0])


def test_command_line_writes_both_pictures_without_jax(logs, tmp_path):
    out = tmp_path / "docs"
    script = (
        "import sys; from jaxsearch.eval import curves; "
        f"rc = curves.main(['--curve-runs', {logs['base']!r}, "
        f"'--entropy-runs', 'Search-R1={logs['base']}', 'EKA={logs['eka']}', '--smooth', '2', "
        f"'--out', {str(out)!r}]); "
        "jax = [m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib', 'flax'))]; "
        "assert not jax, jax; "
        "sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out / 'learning_curve.png'}" in proc.stdout
    _assert_png(out / "learning_curve.png", 2)
    _assert_png(out / "entropy_per_tag.png", 3)

    help_text = subprocess.run(
        [sys.executable, "-m", "jaxsearch.eval.curves", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert help_text.returncode == 0 and "--entropy-runs" in help_text.stdout
    with pytest.raises(SystemExit):
        curves.main([])  # no runs: an argparse error
