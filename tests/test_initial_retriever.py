"""The eval CLI's P0 retriever (issue 39, 8b: EKA's noisy-P0 ablation): P0 searched in another corpus by BM25
(the default) or a dense encoder, chosen on the command line, recorded in run.json, refused without its corpus."""

import json
import os

import numpy as np
import pytest

from jaxsearch.agent.build import build_retriever
from jaxsearch.agent.cli import agent_config
from jaxsearch.agent.protocols import initial_docs
from jaxsearch.cli import eval as eval_cli
from jaxsearch.config import RetrieverConfig
from test_retrieval_dense import DATA, hf_embed

QUESTIONS = ["who founded the city by the river", "what is the capital built on a lake"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The main corpus (the first 40 passages of tests/data/corpus) and P0's own (the next 30)."""
    lines = open(os.path.join(DATA, "corpus.jsonl")).read().splitlines()
    out = tmp_path_factory.mktemp("corpora")
    (out / "main.jsonl").write_text("\n".join(lines[:40]) + "\n")
    (out / "p0.jsonl").write_text("\n".join(lines[40:70]) + "\n")
    return out, [json.loads(line) for line in lines[40:70]]


def _args(corpora, *extra):
    out, _ = corpora
    base = ["--checkpoint", str(out), "--tokenizer", str(out / "t.json"), "--protocol", "eka", "--retriever",
            "bm25", "--corpus", str(out / "main.jsonl"), "--datasets", f"d={out / 'd.jsonl'}", "--out",
            str(out / "run")]  # fmt: skip
    return eval_cli.parse_args([*base, *extra])


def test_dense_p0_from_another_corpus_ranks_as_the_encoder_does(corpora):
    out, p0_rows = corpora
    args = _args(corpora, "--initial-corpus", str(out / "p0.jsonl"), "--initial-retriever", "dense",
                 "--encoder", "minilm", "--topk", "3")  # fmt: skip
    cfg = agent_config(args)
    assert cfg.initial_retriever == RetrieverConfig("dense", str(out / "p0.jsonl"), None, None, "minilm")
    assert cfg.retriever.kind == "bm25"  # the searches' retriever is unchanged
    docs = initial_docs(QUESTIONS, build_retriever(cfg.initial_retriever), 3)
    # reference: all-MiniLM-L6-v2 through plain transformers (mean pooling, unit rows), inner products in numpy
    scores = hf_embed(QUESTIONS, "mean") @ hf_embed([r["contents"] for r in p0_rows], "mean").T
    expect = [[str(p0_rows[j]["id"]) for j in np.argsort(-row)[:3]] for row in scores]
    assert [[str(d.id) for d in row] for row in docs] == expect
    assert eval_cli.settings(args)["initial_retriever"] == "dense"


def test_bm25_stays_the_default_and_the_flags_need_their_corpus(corpora, capsys):
    out, _ = corpora
    args = _args(corpora, "--initial-corpus", str(out / "p0.jsonl"))
    assert agent_config(args).initial_retriever == RetrieverConfig("bm25", str(out / "p0.jsonl"), None, None, None)
    assert "initial_retriever" not in eval_cli.settings(args)  # run.json files written before the flag match
    for flag, value in (("--initial-retriever", "dense"), ("--initial-index", str(out))):
        with pytest.raises(SystemExit, match=f"{flag} searches --initial-corpus for P0"):
            _args(corpora, flag, value)
