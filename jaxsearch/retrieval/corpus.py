"""A JSONL passage corpus kept on disk: one scan records byte offsets, passages are read on demand.

Accepted rows (Search-R1 / FlashRAG): `{"id", "contents"}` where the first line of `contents` is the
(quoted) title, kept byte for byte (`Doc.raw_contents`), or `{"id", "title", "text"}`, whose contents are
built as `"title"\ntext`. Memory: 8 bytes per passage for the offsets (wiki-18,
21M passages: ~170 MB) plus an id->row dict only when ids are not the row numbers "0", "1", ...
"""
from __future__ import annotations

import dataclasses
import json
import os
from array import array
from collections.abc import Iterator, Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxsearch.retrieval.base import Doc, content_id


class CorpusError(ValueError):
    """A corpus file that cannot be used; the message names the file and line."""


def parse_row(line: bytes | str, where: str) -> Doc:
    """One JSONL line -> Doc; `where` ("file:line") prefixes any error."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorpusError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return doc_from_dict(obj, where)


def doc_from_dict(obj: dict, where: str, score: float = 0.0, require_id: bool = True) -> Doc:
    """A corpus/server document dict -> Doc; errors name `where` and the field.

    `contents` is taken as given; without it, `title` and `text` make it as Search-R1's servers do
    (`"title"\ntext`). require_id=False (server responses): a missing id becomes `content_id(contents)`.
    """
    if not isinstance(obj, dict):
        raise CorpusError(f"{where}: expected a document object, got {type(obj).__name__}")
    doc_id = obj.get("id")
    if doc_id is not None or require_id:
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
            raise CorpusError(f"{where}: field 'id' must be a string or integer, got {doc_id!r}")
    if "contents" in obj:
        if not isinstance(obj["contents"], str):
            raise CorpusError(f"{where}: field 'contents' must be a string")
        contents = obj["contents"]
        return Doc.from_contents(content_id(contents) if doc_id is None else str(doc_id), contents, score)
    if "text" in obj:
        title, text = obj.get("title", ""), obj["text"]
        if not isinstance(title, str) or not isinstance(text, str):
            raise CorpusError(f"{where}: fields 'title' and 'text' must be strings")
        doc = Doc("", title, text, score)
        return dataclasses.replace(doc, id=content_id(doc.contents) if doc_id is None else str(doc_id))
    raise CorpusError(f"{where}: missing field 'contents' (or 'text' with 'title')")


class Corpus:
    """Random access to a JSONL corpus without holding its text: `corpus[row]`, `corpus.get(id)`."""

    def __init__(self, path: str | os.PathLike, progress: bool = True):
        self.path = os.fspath(path)
        if self.path.endswith(".gz"):
            raise CorpusError(f"{self.path}: compressed corpora cannot be read by offset; run `gzip -d` first")
        if not os.path.isfile(self.path):
            raise CorpusError(f"{self.path}: no such corpus file")
        self._file = open(self.path, "rb")
        try:
            self._offsets, self._row_of = self._scan(progress)
        except BaseException:
            self._file.close()
            raise

    def _scan(self, progress: bool) -> tuple[np.ndarray, dict[str, int] | None]:
        """Validate every line; return row start offsets (+ end of file) and the id->row dict (or None)."""
        starts = array("q")  # 8 bytes per passage, also while scanning
        row_of: dict[str, int] | None = None
        offset = 0
        size = os.path.getsize(self.path)
        with tqdm(total=size, unit="B", unit_scale=True, desc=f"scan {os.path.basename(self.path)}",
                  disable=not progress, mininterval=1.0) as bar:
            for line_no, line in enumerate(self._file, start=1):
                if line.strip():
                    doc_id = parse_row(line, f"{self.path}:{line_no}").id
                    row = len(starts)
                    if row_of is None and doc_id != str(row):
                        row_of = {str(r): r for r in range(row)}
                    if row_of is not None:
                        if doc_id in row_of:
                            raise CorpusError(f"{self.path}:{line_no}: duplicate id {doc_id!r}")
                        row_of[doc_id] = row
                    starts.append(offset)
                offset += len(line)
                if line_no % 4096 == 0:
                    bar.update(offset - bar.n)
            bar.update(offset - bar.n)
        if not starts:
            raise CorpusError(f"{self.path}: empty corpus (no passages)")
        starts.append(offset)
        return np.frombuffer(starts, dtype=np.int64), row_of

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, row: int) -> Doc:
        """The passage at 0-based `row` (the row order FAISS and BM25 indexes use)."""
        row = int(row)
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range for {self.path} ({len(self)} passages)")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return parse_row(os.pread(self._file.fileno(), end - start, start), f"{self.path}:row {row}")

    def docs(self, rows: Sequence[int], scores: Sequence[float] | None = None) -> list[Doc]:
        """Fetch several rows, optionally attaching scores."""
        if scores is None:
            return [self[r] for r in rows]
        return [d.with_score(s) for d, s in zip((self[r] for r in rows), scores)]

    def row_of(self, doc_id: str) -> int:
        """The row holding passage `doc_id`; KeyError if absent."""
        if self._row_of is not None:
            return self._row_of[doc_id]
        if doc_id.isdigit() and int(doc_id) < len(self) and str(int(doc_id)) == doc_id:
            return int(doc_id)
        raise KeyError(doc_id)

    def get(self, doc_id: str) -> Doc:
        """The passage with id `doc_id`; KeyError if absent."""
        return self[self.row_of(doc_id)]

    def iter_batches(self, batch_size: int, start: int = 0) -> Iterator[list[Doc]]:
        """Stream passages from row `start` in order, `batch_size` at a time (one sequential read)."""
        with open(self.path, "rb") as f:
            f.seek(int(self._offsets[start]))
            row, batch = start, []
            for line in f:
                if not line.strip():
                    continue
                batch.append(parse_row(line, f"{self.path}:row {row}"))
                row += 1
                if len(batch) == batch_size:
                    yield batch
                    batch = []
            if batch:
                yield batch

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Corpus:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
