"""launch/eval.py and jaxsearch.eval.evaluate: a tiny searcher on its world's test split and the shipped
FlashRAG samples, metrics recomputed from the per-example JSONL, resume, R-S, judge, bad input."""

import dataclasses
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pyarrow.parquet as pq
import pytest

from jaxsearch import parallel
from tiny_models import save_tiny_searcher
from jaxsearch.data import qa
from jaxsearch.eval import evaluate as ev
from jaxsearch.scoring.metrics import answer_in_text, exact_match, f1_score, normalize_answer, sub_exact_match
from jaxsearch.eval.retrieval_similarity import RetrievalSimilarity
from jaxsearch.agent import segments
from hang import HANG_S

# pytest-xdist: the module's tests share its costly fixtures, so one worker runs them all
pytestmark = pytest.mark.xdist_group("evaluate")

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "launch" / "eval.py"
SAMPLES = sorted(p.name for p in (ROOT / "tests" / "data" / "qa").iterdir())
TINY_LIMIT = 16


def cli(*args, timeout=HANG_S):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # one CPU device: faster than 8 fake ones
    return subprocess.run(
        [sys.executable, str(EVAL), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )


def load_launch_module():
    """The command's module (launch/eval.py is its wrapper)."""
    return importlib.import_module("jaxsearch.cli.eval")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny searcher saved as a params checkpoint, its tokenizer JSON, its world's test split."""
    d = tmp_path_factory.mktemp("tiny")
    config, params, tokenizer, world, retriever = save_tiny_searcher(d)
    return dict(dir=d, config=config, params=params, tokenizer=tokenizer, corpus=retriever.corpus.path)


def common_args(tiny):
    d = tiny["dir"]
    return [
        "--checkpoint", d / "ckpt", "--tokenizer", d / "tokenizer.json", "--dtype", "float32",
        "--retriever", "bm25", "--corpus", tiny["corpus"], "--topk", 1, "--max-turns", 4,
        "--max-segment-tokens", 48, "--max-obs-tokens", 150, "--cache-len", 768, "--batch-size", 8,
        "--no-progress", "--rs-encoder", "minilm",
    ]  # fmt: skip


def dataset_args(tiny):
    return ["--datasets", f"tiny={tiny['dir'] / 'test.jsonl'}"] + [
        f"{name}={ROOT / 'tests' / 'data' / 'qa' / name / 'test.jsonl'}" for name in SAMPLES
    ]


@pytest.fixture(scope="module")
def run(tiny):
    """One evaluation through the command line: the tiny split (first 16) and every shipped sample."""
    out = tiny["dir"] / "out"
    proc = cli(*common_args(tiny), "--limit", TINY_LIMIT, *dataset_args(tiny), "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.fixture(scope="module")
def minilm():
    from jaxsearch.retrieval.encoders import Encoder

    return Encoder("minilm")


def corpus_contents(path):
    with open(path) as f:
        return {row["id"]: row["contents"] for row in map(json.loads, f)}


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# ------------------------------------------------------------------------------------------- CLI


def test_help():
    proc = cli("--help")
    assert proc.returncode == 0
    for flag in ("--checkpoint", "--protocol", "--eka-tags", "--retriever", "--initial-corpus", "--topk",
                 "--rs-encoder", "--judge-url", "--datasets", "--limit", "--out"):  # fmt: skip
        assert flag in proc.stdout


def test_outputs_and_metrics_recomputed_from_the_jsonl(tiny, run, minilm):
    out, proc = run
    summary = json.loads((out / "summary.json").read_text())
    names = ["tiny"] + SAMPLES
    assert list(summary["datasets"]) == names
    contents = corpus_contents(tiny["corpus"])
    for name in names:
        source = (
            tiny["dir"] / "test.jsonl" if name == "tiny" else ROOT / "tests/data/qa" / name / "test.jsonl"
        )
        expected = read_jsonl(source)[:TINY_LIMIT]
        records = read_jsonl(out / f"{name}.jsonl")
        assert [r["id"] for r in records] == [e["id"] for e in expected]
        s = summary["datasets"][name]
        assert s["n"] == len(records)
        preds = [(r["prediction"] or "", e["golden_answers"]) for r, e in zip(records, expected)]
        assert s["em"] == pytest.approx(np.mean([exact_match(p, g) for p, g in preds]))
        assert s["f1"] == pytest.approx(np.mean([f1_score(p, g) for p, g in preds]))
        assert s["sub_em"] == pytest.approx(np.mean([sub_exact_match(p, g) for p, g in preds]))
        recall = [
            any(answer_in_text(contents[i], e["golden_answers"]) for ids in r["doc_ids"] for i in ids)
            for r, e in zip(records, expected)
        ]
        assert s["recall"] == pytest.approx(np.mean(recall))
        assert s["turns"] == pytest.approx(np.mean([r["turns"] for r in records]))
        assert s["searches"] == pytest.approx(np.mean([len(r["doc_ids"]) for r in records]))
        # entropy of the policy's tokens, per segment type, token-weighted
        ent = np.concatenate([r["entropy"] for r in records])
        seg = np.concatenate([r["segment_ids"] for r in records])
        pol = np.concatenate([r["loss_mask"] for r in records]) == 1
        assert s["entropy"] == pytest.approx(ent[pol].mean())
        for seg_name, sid in segments.SEGMENT_IDS.items():
            sel = pol & (seg == sid)
            assert s.get(f"entropy/{seg_name}") == (pytest.approx(ent[sel].mean()) if sel.any() else None)
        for r in records:  # the token row: the prompt is never policy; the answer is in the policy's tokens
            assert len(r["tokens"]) == len(r["loss_mask"]) == len(r["segment_ids"]) == len(r["entropy"])
            assert not any(r["loss_mask"][: r["prompt_length"]]) and any(r["loss_mask"])
            if r["prediction"] is not None:
                policy = [t for t, m in zip(r["tokens"], r["loss_mask"]) if m]
                assert r["prediction"] in tiny["tokenizer"].decode(policy)
        assert s["fabrication_rate"] is None  # no judge
        if name != "tiny":  # the shipped samples have no supporting_ids: no R-S
            assert s["rs"] is None and s["rs_n"] == 0
    # R-S of the tiny split: gold passages vs everything retrieved, numpy cosine of MiniLM embeddings
    records = read_jsonl(out / "tiny.jsonl")
    examples = {e.id: e for e in qa.load_examples(tiny["dir"] / "test.jsonl")}
    rs = []
    for r in records:  # both sides SQuAD-normalized as EKA's eval_r.py; nothing retrieved scores 0 (rsim.py)
        gold = normalize_answer("\n".join(contents[i] for i in examples[r["id"]].supporting_ids))
        retrieved = "\n".join(dict.fromkeys(contents[i] for ids in r["doc_ids"] for i in ids))
        if not retrieved:
            rs.append(0.0)
            assert r["metrics"]["rs"] == 0.0
            continue
        a, b = minilm.encode_passages([gold, normalize_answer(retrieved)]).astype(np.float64)
        rs.append(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
        assert r["metrics"]["rs"] == pytest.approx(rs[-1], abs=1e-5)
    assert summary["datasets"]["tiny"]["rs"] == pytest.approx(np.mean(rs), abs=1e-5)
    # the average row: mean over datasets, None skipped
    for key in ("em", "f1", "recall", "turns", "entropy"):
        assert summary["average"][key] == pytest.approx(np.mean([summary["datasets"][n][key] for n in names]))
    assert summary["average"]["rs"] == pytest.approx(summary["datasets"]["tiny"]["rs"])
    assert summary["average"]["n"] == TINY_LIMIT + 5 * len(SAMPLES)
    # the table: a row per dataset and the average, values as in the summary
    table = (out / "results.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == names + ["average"]
    header = [h.strip() for h in table[0].split("|")]
    row = [c.strip() for c in table[2].split("|")]
    assert row[header.index("EM")] == f"{summary['datasets']['tiny']['em']:.3f}"
    assert row[header.index("R-S")] == f"{summary['datasets']['tiny']['rs']:.3f}"
    assert "| average |" in proc.stdout


def test_rerun_skips_finished_examples(tiny, run, tmp_path):
    """Nothing left to run: no model is loaded, the records stay as they are, the summary is rewritten."""
    out = tmp_path / "out"
    shutil.copytree(run[0], out)
    before = {p.name: p.read_bytes() for p in out.glob("*.jsonl")}
    (out / "summary.json").unlink()
    proc = cli(*common_args(tiny), "--limit", TINY_LIMIT, *dataset_args(tiny), "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "evaluated 0 new examples" in proc.stdout
    assert {p.name: p.read_bytes() for p in out.glob("*.jsonl")} == before
    assert (out / "summary.json").read_text() == (run[0] / "summary.json").read_text()


def test_a_different_setting_into_the_same_out_is_refused(tiny, run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(run[0], out)
    args = [*common_args(tiny), "--limit", TINY_LIMIT, *dataset_args(tiny), "--out", out]
    args[args.index("--max-turns") + 1] = 3
    proc = cli(*args)
    assert proc.returncode == 2
    assert "max_turns: 4 -> 3" in proc.stderr and str(out / "run.json") in proc.stderr


def test_bad_input_is_a_one_line_error_naming_the_file_and_line(tiny, tmp_path):
    missing = tmp_path / "nope" / "test.jsonl"
    proc = cli(*common_args(tiny), "--datasets", f"nq={missing}", "--out", tmp_path / "out")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {missing}: no such QA file"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": "b", "question": \n')
    proc = cli(*common_args(tiny), "--datasets", f"bad={bad}", "--out", tmp_path / "out")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {bad}:2: not valid JSON")

    bad.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": "b", "question": "q"}\n')
    proc = cli(*common_args(tiny), "--datasets", f"bad={bad}", "--out", tmp_path / "out")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {bad}:2: missing field 'golden_answers'"]


def test_a_corrupt_record_line_is_an_error_naming_it(tmp_path):
    path = tmp_path / "nq.jsonl"
    path.write_text('{"id": "a", "metrics": {}}\nnot json\n{"id": "c", "metrics": {}}\n')
    with pytest.raises(ev.EvalError, match=f"{path}:2: not a valid record"):
        ev.read_records(str(path))
    path.write_text('{"id": "a", "metrics": {}}\n{"id": "b", "met')  # only a partial last line is dropped
    assert [r["id"] for r in ev.read_records(str(path))] == ["a"]
    assert path.read_text() == '{"id": "a", "metrics": {}}\n'


# ------------------------------------------------------------------------------------------- library


def test_retrieval_similarity_hand_case(minilm):
    class Table:  # hand vectors per text
        vectors = {"g1 g2": [3.0, 4.0], "r1": [4.0, 3.0], "same": [1.0, 0.0]}  # normalized texts

        def encode_passages(self, texts):
            return np.array([self.vectors[t] for t in texts])

    rs = RetrievalSimilarity(Table())
    assert rs([["G1.", "the g2"], ["Same!"], [], ["g1"]], [["r1"], ["same"], ["r1"], []]) == [
        pytest.approx(24 / 25),
        pytest.approx(1.0),
        None,  # no gold passages
        0.0,  # nothing retrieved
    ]
    gold = ["Padan Truteim was born in Draifaitheth.", "Feirum Night was directed by Padan Truteim."]
    retrieved = ["The birthplace of Padan Truteim is Draifaitheth.", "Draifaitheth lies in Zapousland."]
    norm = "padan truteim was born in draifaitheth feirum night was directed by padan truteim"
    assert normalize_answer("\n".join(gold)) == norm
    a, b = minilm.encode_passages([norm, normalize_answer("\n".join(retrieved))]).astype(np.float64)
    (score,) = RetrievalSimilarity(minilm)([gold], [retrieved])
    assert score == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), abs=1e-6)


def test_gold_passages_prefer_the_rows_own_context():
    class Corpus:
        def get(self, doc_id):
            return type("D", (), {"contents": f"text of {doc_id}"})()

    graph_r1 = qa.QAExample("a", "q", ["x"], metadata={"context": ["P1", "P2"]})
    flashrag = qa.QAExample("b", "q", ["x"], supporting_ids=["d1", "d2"])
    assert ev.gold_passages(graph_r1) == ["P1", "P2"]  # no corpus needed
    assert ev.gold_passages(graph_r1, Corpus()) == ["P1", "P2"]
    assert ev.gold_passages(flashrag, Corpus()) == ["text of d1", "text of d2"]
    assert ev.gold_passages(flashrag) == [] and ev.gold_passages(qa.QAExample("c", "q", ["x"]), Corpus()) == []


def test_retrieved_texts_follow_the_setting():
    from jaxsearch.agent.protocols import get_protocol
    from jaxsearch.retrieval.base import Doc

    a, b = Doc("a", "", "Fact A.", 2.0, raw_contents="Fact A."), Doc("b", "", "Fact B.", 0.5, raw_contents="Fact B.")
    # Graph-R1 (EKA rsim.py): every <knowledge> block's text, in order, repeats kept
    assert ev.retrieved_texts(get_protocol("eka", tags="graph_r1"), [a, b], [[b], [b]]) == [
        "Fact A.\nFact B.",
        '{"results": [{"<knowledge>": "Fact B.", "<coherence>": 0.5}]}',
        '{"results": [{"<knowledge>": "Fact B.", "<coherence>": 0.5}]}',
    ]
    # elsewhere: each distinct passage once
    assert ev.retrieved_texts(get_protocol("eka"), [a, b], [[b], [b]]) == ["Fact A.", "Fact B."]


def test_summarize_hand_case():
    def record(em, rs, fab, entropy, seg, mask, prediction="x"):
        metrics = dict(em=em, f1=em, sub_em=em, recall=1.0, rs=rs, fabrication=fab)
        return dict(metrics=metrics, prediction=prediction, turns=2, searches=1, truncated=False,
                    entropy=entropy, segment_ids=seg, loss_mask=mask)  # fmt: skip

    think, answer = segments.SEGMENT_IDS["think"], segments.SEGMENT_IDS["answer"]
    records = [
        record(1.0, 0.5, 1.0, [9.0, 1.0, 2.0], [0, think, answer], [0, 1, 1]),
        record(0.0, None, 0.0, [1.0, 3.0, 5.0], [think, think, answer], [1, 1, 0], prediction=None),
        record(0.0, 0.25, None, [4.0], [think], [1]),
    ]
    s = ev.summarize(records)
    assert s["n"] == 3 and s["em"] == pytest.approx(1 / 3) and s["finish_ratio"] == pytest.approx(2 / 3)
    assert s["rs"] == pytest.approx(0.375) and s["rs_n"] == 2
    assert s["fabrication_rate"] == pytest.approx(0.5) and s["fabrication_n"] == 2
    # SOAR's Table 4 split: the EM-1 record fabricated, the judged EM-0 one did not
    assert s["fabrication_rate/correct"] == 1.0 and s["fabrication_rate/wrong"] == 0.0
    assert s["entropy"] == pytest.approx((1 + 2 + 1 + 3 + 4) / 5)
    assert s["entropy/think"] == pytest.approx((1 + 1 + 3 + 4) / 4)
    assert s["entropy/answer"] == pytest.approx(2.0)
    avg = ev.average({"a": s, "b": dict(s, em=0.0, rs=None)})
    assert avg["n"] == 6 and avg["em"] == pytest.approx(1 / 6) and avg["rs"] == pytest.approx(0.375)


def test_in_process_judge_and_resume_counts_retriever_calls(tiny, tmp_path):
    """evaluate() with a scripted judge: fabrication per example and rate; a rerun makes no retriever call."""
    launch = load_launch_module()
    args = launch.parse_args(
        [str(a) for a in common_args(tiny)]
        + ["--datasets", f"tiny={tiny['dir'] / 'test.jsonl'}", "--out", "x"]
    )
    from jaxsearch.agent.build import build_engine

    cfg = launch.agent_config(args)
    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    setup = build_engine(cfg, tiny["config"], mesh, evaluation=True)

    class Counting:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def search(self, queries, k):
            self.calls += 1
            return self.inner.search(queries, k)

    class Judge:  # grounded unless the question asks about a birthplace; unparseable for "spouse"
        def judge(self, conversations):
            verdicts = []
            for system, user in conversations:
                assert system["role"] == "system" and user["role"] == "user"
                question = user["content"].split("Question: ")[-1].split("\n")[0]
                if "spouse" in question:
                    verdicts.append("no idea")
                else:
                    verdicts.append('{"grounded": %s}' % ("false" if "birthplace" in question else "true"))
            return verdicts

    counting = Counting(setup.retriever)
    setup = setup.replace(retriever=counting, initial_retriever=counting)
    examples = qa.load_examples(tiny["dir"] / "test.jsonl")[:6]
    summary = ev.evaluate(
        setup, tiny["params"], {"tiny": examples}, str(tmp_path), batch_size=8, progress=False, judge=Judge()
    )
    assert counting.calls > 0
    expected = [None if "spouse" in e.question else float("birthplace" in e.question) for e in examples]
    records = read_jsonl(tmp_path / "tiny.jsonl")
    assert [r["metrics"]["fabrication"] for r in records] == expected
    scored = [x for x in expected if x is not None]
    assert summary["datasets"]["tiny"]["fabrication_rate"] == pytest.approx(np.mean(scored))
    assert all(r["metrics"]["rs"] is None for r in records)  # no encoder given
    before = (tmp_path / "tiny.jsonl").read_bytes()
    counting.calls = 0
    again = ev.evaluate(
        setup, tiny["params"], {"tiny": examples}, str(tmp_path), batch_size=8, progress=False, judge=Judge()
    )
    assert counting.calls == 0 and again == summary
    # a crash mid-write: the last line lost its end; the rerun redoes that example only
    lines = before.split(b"\n")[:-1]
    (tmp_path / "tiny.jsonl").write_bytes(b"\n".join(lines[:-1]) + b"\n" + lines[-1][:100])
    ev.evaluate(
        setup, tiny["params"], {"tiny": examples}, str(tmp_path), batch_size=8, progress=False, judge=Judge()
    )
    assert counting.calls > 0
    after = (tmp_path / "tiny.jsonl").read_bytes().split(b"\n")[:-1]
    assert after[:-1] == lines[:-1]
    redone, original = json.loads(after[-1]), json.loads(lines[-1])
    for key in ("id", "prediction", "tokens", "loss_mask", "doc_ids", "metrics"):  # greedy: the same episode
        assert redone[key] == original[key]


# ------------------------------------------------------------------------------------------- Search-R1 data

# Search-R1's merged test set (qa_search_test_merge.py's output, tests/data/search_r1/README.md): nq, triviaqa
# and custom rows, ids repeated across them.
MERGED = ROOT / "tests" / "data" / "search_r1" / "test_merged.parquet"


def _setup(tiny, *extra):
    launch = load_launch_module()
    args = launch.parse_args(
        [str(a) for a in common_args(tiny)] + ["--datasets", f"m={MERGED}", "--out", "x", *extra]
    )
    from jaxsearch.agent.build import build_engine

    mesh = parallel.make_mesh({"fsdp": 1}, jax.devices()[:1])
    return build_engine(launch.agent_config(args), tiny["config"], mesh, evaluation=True)


def test_merged_search_r1_test_set_per_data_source(tiny, tmp_path):
    launch = load_launch_module()
    examples = launch.load_datasets({"merged": str(MERGED)}, 0)["merged"]  # repeated ids are not refused
    setup = _setup(tiny)
    summary = ev.evaluate(setup, tiny["params"], {"merged": examples}, str(tmp_path), 8, progress=False)
    records = read_jsonl(tmp_path / "merged.jsonl")
    rows = pq.read_table(MERGED).to_pylist()
    assert [(r["data_source"], r["id"]) for r in records] == [(r["data_source"], r["id"]) for r in rows]
    assert summary["datasets"]["merged"]["n"] == 12
    sources = summary["data_sources"]["merged"]
    assert list(sources) == ["nq", "triviaqa", "custom"]
    assert [sources[s]["n"] for s in sources] == [5, 5, 2]
    for source, s in sources.items():  # recomputed from the JSONL
        mine = [r for r in records if r["data_source"] == source]
        preds = [(r["prediction"] or "", r["golden_answers"]) for r in mine]
        assert s["em"] == pytest.approx(np.mean([exact_match(p, g) for p, g in preds]))
        assert s["f1"] == pytest.approx(np.mean([f1_score(p, g) for p, g in preds]))
        assert s["turns"] == pytest.approx(np.mean([r["turns"] for r in mine]))
    assert summary["average"]["n"] == 12  # the average is over datasets, not data sources
    table = (tmp_path / "results.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == [
        "merged", "merged/nq", "merged/triviaqa", "merged/custom", "average"
    ]  # fmt: skip
    # the prompt is the parquet's own chat list, as the chat template renders it
    tok = tiny["tokenizer"]
    for r, ex in zip(records, examples):
        text = tok.apply_chat_template(ex.prompt, add_generation_prompt=True)
        assert r["tokens"][: r["prompt_length"]] == tok.encode(text, allow_special=True)
    # a rerun finds every example by (data_source, id): nothing is searched again
    calls = []
    setup.retriever.search = lambda q, k: calls.append(q) or []
    again = ev.evaluate(setup, tiny["params"], {"merged": examples}, str(tmp_path), 8, progress=False)
    assert again == summary
    assert calls == []


def test_records_without_data_source_still_resume(tiny, tmp_path):
    """Records written before data sources were recorded (no `data_source` field) count as done."""
    examples = [ex for ex in qa.load_examples(MERGED) if ex.data_source == "nq"]
    setup = _setup(tiny)
    ev.evaluate(setup, tiny["params"], {"nq": examples}, str(tmp_path), batch_size=8, progress=False)
    path = tmp_path / "nq.jsonl"
    old = [{k: v for k, v in r.items() if k != "data_source"} for r in read_jsonl(path)]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    before = path.read_bytes()
    assert ev.pending(str(tmp_path), {"nq": examples}) == {"nq": []}
    summary = ev.write_summary(str(tmp_path), {"nq": examples})
    assert summary["datasets"]["nq"]["n"] == summary["data_sources"]["nq"]["nq"]["n"] == 5
    assert path.read_bytes() == before


def test_custom_prompt_is_used_and_builtin_prompt_restores_ours(tiny, tmp_path):
    custom = [{"role": "user", "content": "question who wrote it <search>"}]
    examples = [dataclasses.replace(ex, prompt=custom) for ex in qa.load_examples(MERGED)[:2]]
    tok = tiny["tokenizer"]
    with pytest.warns(UserWarning, match="differs from the built-in search_r1 template"):
        ev.evaluate(_setup(tiny), tiny["params"], {"a": examples}, str(tmp_path / "a"), 8, progress=False)
    for r in read_jsonl(tmp_path / "a" / "a.jsonl"):
        assert r["tokens"][: r["prompt_length"]] == tok.encode(
            tok.apply_chat_template(custom, add_generation_prompt=True), allow_special=True
        )
    launch = load_launch_module()
    argv = [str(a) for a in common_args(tiny)] + ["--datasets", f"m={MERGED}", "--out", "x"]
    assert launch.settings(launch.parse_args(argv + ["--builtin-prompt"]))["builtin_prompt"] is True
    assert "builtin_prompt" not in launch.settings(launch.parse_args(argv))  # old run.json files still match
    setup = _setup(tiny, "--builtin-prompt")
    out = str(tmp_path / "b")
    ev.evaluate(setup, tiny["params"], {"b": examples}, out, 8, progress=False, use_data_prompt=False)
    for r, ex in zip(read_jsonl(tmp_path / "b" / "b.jsonl"), examples):
        messages = setup.protocol.build_messages(ex.question)
        assert r["tokens"][: r["prompt_length"]] == tok.encode(
            tok.apply_chat_template(messages, add_generation_prompt=True), allow_special=True
        )


def test_duplicate_data_source_and_id_is_refused(tmp_path):
    launch = load_launch_module()
    rows = [
        {"id": "test_0", "question": "q?", "golden_answers": ["a"], "metadata": {"data_source": "nq"}},
        {"id": "test_0", "question": "q?", "golden_answers": ["a"], "metadata": {"data_source": "nq"}},
    ]
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(qa.QADataError, match="duplicate example id 'test_0' in data_source 'nq'"):
        launch.load_datasets({"dup": str(path)}, 0)


def test_pooler_encoder_is_simcse_embedding(tmp_path):
    """The simcse preset's pooling: a RoBERTa's pooler_output (CLS through dense + tanh) of at most 128 tokens,
    unit length (EKA's simcse/tool.py); checked on a tiny random RoBERTa against transformers directly."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaModel

    from jaxsearch.retrieval.encoders import PRESETS, Encoder

    assert PRESETS["simcse"].model == "princeton-nlp/sup-simcse-roberta-large"
    assert (PRESETS["simcse"].pooling, PRESETS["simcse"].max_length) == ("pooler", 128)
    words = ["<s>", "</s>", "<pad>", "<unk>"] + "padan was born in draifaitheth the river".split()
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=160, pad_token_id=2)  # fmt: skip
    RobertaModel(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    texts = ["padan was born in draifaitheth", "the river " * 100, "padan"]
    got = Encoder({"model": str(tmp_path), "pooling": "pooler", "max_length": 128}).encode_passages(texts)
    model = RobertaModel.from_pretrained(tmp_path).eval()
    for text, row in zip(texts, got):
        ids = tok(text, truncation=True, max_length=128, return_tensors="pt")
        with torch.no_grad():
            ref = model(**ids).pooler_output[0].numpy()
        np.testing.assert_allclose(row, ref / np.linalg.norm(ref), atol=1e-5)


def test_eval_subset():
    examples = [qa.QAExample(id=str(i), question=f"q{i}?", golden_answers=["a"]) for i in range(10)]
    assert [e.id for e in qa.eval_subset(examples, 3)] == ["0", "1", "2"]
    assert qa.eval_subset(examples, 0) == examples and qa.eval_subset(examples, 50, "random", 44) == examples
    drawn = qa.eval_subset(examples, 4, "random", 44)
    expected = sorted(np.random.default_rng(44).choice(10, size=4, replace=False))
    assert [e.id for e in drawn] == [str(i) for i in expected]  # file order kept
    assert drawn == qa.eval_subset(examples, 4, "random", 44) and drawn != qa.eval_subset(
        examples, 4, "random", 1
    )
    with pytest.raises(ValueError, match="eval sample 'all'"):
        qa.eval_subset(examples, 4, "all")


def test_heldout_recall_counts_a_hyperedge_as_its_source_passages():
    from types import SimpleNamespace

    from jaxsearch.scoring.episodes import trajectory_stats
    from jaxsearch.retrieval.base import Doc

    passage = Doc("p1", "t", "x")
    hyperedge = Doc("17", "", "fact", 1.0, "fact", sources=("p2", "p3"))
    n, t = 2, 4
    traj = SimpleNamespace(
        answers=["a", None],
        attention_mask=np.ones((n, t), int),
        prompt_lengths=np.full(n, 2),
        loss_mask=np.ones((n, t), int),
        turns=np.array([1, 1]),
        searches=np.array([1, 1]),
        truncated=np.zeros(n, bool),
        entropy=np.zeros((n, t)),
        segment_ids=np.zeros((n, t), int),
        docs=[[[passage, hyperedge]], [[hyperedge]]],
    )
    examples = [qa.QAExample("a", "q", ["a"], ["p1", "p2"]), qa.QAExample("b", "q", ["b"], ["p3", "p4"])]
    # row 0 found p1 (itself) and p2 (through the hyperedge): 2/2; row 1 found p3 of p3, p4: 1/2
    assert trajectory_stats(traj, examples)["recall"] == pytest.approx((1.0 + 0.5) / 2)
