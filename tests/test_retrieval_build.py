"""launch/build_index.py: a killed build leaves the previous index loadable and resumes encoding."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from jaxsearch.retrieval import make_retriever
from jaxsearch.retrieval.build import commit, recover
from jaxsearch.retrieval.encoders import minilm_path
from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "data", "corpus", "corpus.jsonl")
BUILD = [sys.executable, os.path.join(ROOT, "launch", "build_index.py"), "--no-progress"]


def run_build(*args):
    return subprocess.run(BUILD + list(args), capture_output=True, text=True, timeout=HANG_S)


@pytest.fixture
def small_corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(open(CORPUS).readlines()[:120]))
    return str(path)


@pytest.mark.slow  # started first under pytest-xdist (conftest)
def test_killed_dense_build_keeps_previous_index_and_resumes(tmp_path, small_corpus):
    out = str(tmp_path / "index")
    done = run_build("--corpus", small_corpus, "--retriever", "bm25", "--out", out)
    assert done.returncode == 0, done.stderr
    before = make_retriever("bm25", corpus=small_corpus, index=out, progress=False).search(["Lisul River"], 3)

    progress = os.path.join(out + ".partial", "progress.json")
    args = ["--corpus", small_corpus, "--retriever", "dense", "--encoder", "minilm", "--batch-size", "2", "--out", out]
    proc = subprocess.Popen(BUILD + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(progress) and json.load(open(progress))["rows_done"] >= 8:
                break
            time.sleep(0.005)
        assert proc.poll() is None, proc.stderr.read().decode()  # still encoding: kill it midway
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.stderr.close()
    rows_done = json.load(open(progress))["rows_done"]
    assert 8 <= rows_done < 120

    after = make_retriever("bm25", corpus=small_corpus, index=out, progress=False).search(["Lisul River"], 3)
    assert after == before and after[0][0].title == "Lisul River"

    resumed = run_build(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming encoding at row {rows_done} of 120" in resumed.stderr
    assert not os.path.exists(out + ".partial")
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["kind"] == "dense" and meta["num_docs"] == 120

    # Every vector, the first rows encoded before the kill and the rest after, equals a fresh encoding.
    dense = make_retriever("dense", corpus=small_corpus, index=out, progress=False, use_gpu=False)
    contents = [json.loads(line)["contents"] for line in open(small_corpus)]
    reference = SentenceTransformer(minilm_path(), device="cpu").encode(contents, normalize_embeddings=True)
    np.testing.assert_allclose(dense.index.reconstruct_n(0, 120), reference, atol=1e-4)


def test_swap_cut_between_renames_is_recovered(tmp_path):
    out, old, new = tmp_path / "idx", tmp_path / "idx.old", tmp_path / "idx.partial"
    old.mkdir()
    (old / "meta.json").write_text("previous")
    recover(str(out))  # a crash left the previous index aside and none in place
    assert (out / "meta.json").read_text() == "previous" and not old.exists()
    new.mkdir()
    (new / "meta.json").write_text("next")
    commit(str(new), str(out))
    assert (out / "meta.json").read_text() == "next" and not old.exists() and not new.exists()


def test_bad_input_is_a_one_line_error(tmp_path):
    missing = run_build("--corpus", str(tmp_path / "none.jsonl"), "--retriever", "bm25", "--out", str(tmp_path / "o"))
    assert missing.returncode == 2 and "no such corpus file" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "a"}\n{"id": "1", "text": 3}\n')
    malformed = run_build("--corpus", str(bad), "--retriever", "bm25", "--out", str(tmp_path / "o"))
    assert malformed.returncode == 2 and f"{bad}:2:" in malformed.stderr and "Traceback" not in malformed.stderr
    assert not os.path.exists(tmp_path / "o")
