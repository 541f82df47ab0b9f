"""Corpus loading: both JSONL formats, on-demand reads, and errors that name the file and line."""
import json
import os
import tracemalloc

import pytest

from jaxsearch.retrieval.base import Doc, format_passages, make_contents, split_contents
from jaxsearch.retrieval.corpus import Corpus, CorpusError

DATA = os.path.join(os.path.dirname(__file__), "data", "corpus")
CONTENTS = os.path.join(DATA, "corpus.jsonl")
TITLE_TEXT = os.path.join(DATA, "corpus_title_text.jsonl")


def write_lines(path, lines):
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def test_both_formats_read_the_same_passages():
    rows = [json.loads(line) for line in open(TITLE_TEXT)]
    raw_contents = [json.loads(line)["contents"] for line in open(CONTENTS)]
    with Corpus(CONTENTS, progress=False) as a, Corpus(TITLE_TEXT, progress=False) as b:
        assert len(a) == len(b) == len(rows) == 300
        for row in (0, 1, 150, 299):
            assert b[row] == Doc(rows[row]["id"], rows[row]["title"], rows[row]["text"])
            assert (a[row].id, a[row].title, a[row].text) == (b[row].id, b[row].title, b[row].text)
            assert a[row].contents == b[row].contents == raw_contents[row]  # Search-R1's contents string


def test_contents_helpers_match_search_r1_conventions():
    assert make_contents("Aaron", "Aaron is a prophet.") == '"Aaron"\nAaron is a prophet.'
    assert split_contents('"Aaron"\nline one\nline two') == ("Aaron", "line one\nline two")
    assert split_contents("Unquoted title\ntext") == ("Unquoted title", "text")  # FlashRAG variant
    docs = [Doc("1", "A", "text a", 2.0), Doc("7", "B", "text b", 1.0)]
    # Search-R1's _passages2string takes the first line of contents (quotes kept) as the title.
    assert format_passages(docs) == 'Doc 1(Title: "A") text a\nDoc 2(Title: "B") text b\n'


def test_contents_kept_byte_for_byte(tmp_path):
    odd = ["Unquoted Title\nSome text.", '"Trailing"  \ntext  ', '"Title only"', '"A"\r\nwindows line', "  \n"]
    path = write_lines(tmp_path / "c.jsonl", [json.dumps({"id": str(i), "contents": c}) for i, c in enumerate(odd)])
    with Corpus(path, progress=False) as c:
        assert [c[i].contents for i in range(len(odd))] == odd
        assert [d.contents for b in c.iter_batches(2) for d in b] == odd
        assert [d.contents for d in c.docs([4, 0], [1.0, 2.0])] == [odd[4], odd[0]]
        assert (c[0].title, c[0].text) == ("Unquoted Title", "Some text.")


def test_fetch_by_id_and_streaming(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [
        json.dumps({"id": "doc-b", "title": "B", "text": "bee"}),
        "",  # blank lines are skipped, not counted as rows
        json.dumps({"id": 17, "contents": '"C"\nsea'}),
        json.dumps({"id": "doc-a", "title": "A", "text": "ay"}),
    ])
    with Corpus(path, progress=False) as c:
        assert len(c) == 3
        assert c.get("doc-a") == Doc("doc-a", "A", "ay")
        assert c.get("17") == Doc("17", "C", "sea", 0.0, '"C"\nsea')
        assert c.row_of("doc-b") == 0
        with pytest.raises(KeyError):
            c.get("missing")
        assert [d.id for b in c.iter_batches(2) for d in b] == ["doc-b", "17", "doc-a"]
        assert [d.id for b in c.iter_batches(2, start=1) for d in b] == ["17", "doc-a"]
        assert c.docs([2, 0], [0.5, 0.25]) == [Doc("doc-a", "A", "ay", 0.5), Doc("doc-b", "B", "bee", 0.25)]


def test_row_number_ids_need_no_table():
    with Corpus(CONTENTS, progress=False) as c:
        assert c.get("42") == c[42]
        with pytest.raises(KeyError):
            c.get("300")


@pytest.mark.parametrize("bad_line, message", [
    ('{"id": "1", "contents": "x"', "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"id": "1"}', "missing field 'contents'"),
    ('{"contents": "x"}', "field 'id'"),
    ('{"id": "1", "title": "t", "text": 5}', "must be strings"),
    ('{"id": "0", "contents": "dup"}', "duplicate id"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    good = [json.dumps({"id": "0", "contents": '"T"\ntext'}), json.dumps({"id": "x1", "contents": "t"})]
    path = write_lines(tmp_path / "bad.jsonl", good + [bad_line])
    with pytest.raises(CorpusError, match=f"bad.jsonl:3: .*{message}"):
        Corpus(path, progress=False)


def test_empty_and_missing_corpora_are_errors(tmp_path):
    for lines in ([], ["", "   "]):
        with pytest.raises(CorpusError, match="empty corpus"):
            Corpus(write_lines(tmp_path / "empty.jsonl", lines), progress=False)
    with pytest.raises(CorpusError, match="no such corpus file"):
        Corpus(tmp_path / "nope.jsonl", progress=False)
    with pytest.raises(CorpusError, match="gzip -d"):
        Corpus(tmp_path / "wiki-18.jsonl.gz", progress=False)


def test_text_is_not_held_in_memory(tmp_path):
    text = "lorem ipsum dolor sit amet " * 8
    path = write_lines(tmp_path / "big.jsonl",
                       [json.dumps({"id": str(i), "contents": f'"T{i}"\n{text}'}) for i in range(20000)])
    size = os.path.getsize(path)
    tracemalloc.start()
    corpus = Corpus(path, progress=False)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert held < size / 10, (held, size)  # offsets only: 8 bytes per passage
    assert corpus[19999].title == "T19999"
    corpus.close()
