"""bench/claims.py: the claims table's intervals against hand-computed cases and scipy's own Welch test, and the
record that several machines' runs add up in."""

import json
import math
import os
import sys

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import claims


def test_mean_ci_hand_computed():
    # [1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.302653 (tables), half-width 4.302653 / sqrt(3)
    mean, half = claims.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    # one seed: no interval
    assert math.isnan(claims.mean_ci([0.4])[1])


def test_diff_ci_matches_scipy_welch():
    rng = np.random.default_rng(0)
    for n_a, n_b in ((3, 3), (3, 5), (4, 2)):
        a = list(rng.normal(0.3, 0.05, n_a))
        b = list(rng.normal(0.2, 0.12, n_b))
        diff, half = claims.diff_ci(a, b)
        low, high = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        assert diff == pytest.approx((low + high) / 2, rel=1e-9)
        assert half == pytest.approx((high - low) / 2, rel=1e-9)


def test_seeds_to_settle_hand_computed():
    # d = 1, both variances 1: 2 (z_0.975 + z_0.8)^2 = 2 (1.959964 + 0.841621)^2 = 15.70 -> 16 seeds
    assert claims.seeds_to_settle([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]) == 16
    # half the difference: four times the seeds (62.8 -> 63)
    assert claims.seeds_to_settle([0.5, 1.5, 2.5], [0.0, 1.0, 2.0]) == 63
    assert math.isinf(claims.seeds_to_settle([1.0, 2.0], [2.0, 1.0]))
    assert math.isnan(claims.seeds_to_settle([1.0], [2.0, 1.0]))
    # 2 (1.96 + 0.8416)^2 0.005 / 1 = 0.08 seeds by the formula: two, the fewest an interval takes
    assert claims.seeds_to_settle([0.0, 0.1], [1.0, 1.1]) == 2


def test_verdict():
    assert claims.verdict(+1, 0.1, 0.05) == "paper's way, CI excludes 0"
    assert claims.verdict(+1, 0.1, 0.2) == "paper's way, within CI"
    assert claims.verdict(-1, 0.1, 0.05) == "opposite, CI excludes 0"
    assert claims.verdict(-1, 0.1, 0.2) == "opposite way, within CI"
    assert claims.verdict(0, 0.1, 0.05) == "no claim"


def _run(workdir, em, f1, turns, fabrication, commit=None):
    """A finished tiny_world workdir: GRPO metrics with two evaluations and the exported params/, and the
    commit of its code if given (tiny_world.run records it)."""
    grpo = os.path.join(workdir, "grpo")
    os.makedirs(os.path.join(grpo, "params"))
    first = {"step": 0, "eval/synthetic/em": 0.1, "eval/synthetic/f1": 0.2}
    last = {"step": 40, "eval/synthetic/em": em, "eval/synthetic/f1": f1, "eval/synthetic/turns": turns}
    last["eval/synthetic/fabrication_rate"] = fabrication
    with open(os.path.join(grpo, "metrics.jsonl"), "w") as f:
        f.write(json.dumps(first) + "\n" + json.dumps({"step": 1, "train/reward": 0.0}) + "\n")
        f.write(json.dumps(last) + "\n")
    if commit:
        with open(os.path.join(workdir, "wall_s.json"), "w") as f:
            json.dump({"wall_s": 60.0, "commit": commit}, f)


def test_record_folds_runs_of_several_machines(tmp_path):
    record = tmp_path / "record"
    # machine 1: both seeds of the backbone, one of SOAR; machine 2: SOAR's other seed, and seed 0 again (replaced)
    m1, m2 = tmp_path / "m1", tmp_path / "m2"
    _run(m1 / "tiny_cpu" / "seed0", 0.30, 0.35, 3.0, 0.30)
    _run(m1 / "tiny_cpu" / "seed1", 0.40, 0.45, 3.2, 0.20)
    _run(m1 / "tiny_cpu_soar" / "seed0", 0.10, 0.12, 3.0, 0.90)  # replaced below
    os.makedirs(m1 / "tiny_cpu_soar" / "seed2" / "grpo")  # unfinished: left out
    assert claims.main(["--record", str(record), "--runs", str(m1), "--commit", "aaa", "--no-plot"]) == 0
    _run(m2 / "tiny_cpu_soar" / "seed0", 0.20, 0.22, 3.0, 0.10)
    _run(m2 / "tiny_cpu_soar" / "seed1", 0.30, 0.31, 3.0, 0.05, commit="ran")
    assert claims.main(["--record", str(record), "--runs", str(m2), "--commit", "bbb", "--no-plot"]) == 0
    # a run that recorded its commit keeps it when folded again with another --commit
    assert claims.main(["--record", str(record), "--runs", str(m2), "--commit", "ccc", "--no-plot"]) == 0
    rows = claims.read_record(str(record / "seeds.csv"))
    assert [(r["config"], r["seed"], r["commit"]) for r in rows] == [
        ("tiny_cpu", "0", "aaa"),
        ("tiny_cpu", "1", "aaa"),
        ("tiny_cpu_soar", "0", "ccc"),
        ("tiny_cpu_soar", "1", "ran"),
    ]
    text = (record / "claims.md").read_text()
    fab = [line for line in text.splitlines() if "| fabrication |" in line]
    assert len(fab) == 1
    # backbone 0.25 ± t_1 * 0.0707/sqrt2, SOAR 0.075; difference -0.175 with Welch's interval
    diff, half = claims.diff_ci([0.10, 0.05], [0.30, 0.20])
    assert diff == pytest.approx(-0.175)
    assert f"{diff:.3f} ± {half:.3f}" in fab[0]
    assert "paper's way" in fab[0]
    # no EKA or R-Search runs: no rows for them
    assert "EKA" not in text and "R-Search" not in text
    # the table again from the record alone, and its plot
    assert claims.main(["--record", str(record)]) == 0
    assert (record / "claims.png").stat().st_size > 0


def test_empty_record_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        claims.main(["--record", str(tmp_path / "none"), "--no-plot"])
