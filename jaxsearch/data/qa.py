"""QA datasets: FlashRAG JSONL / parquet and Search-R1 parquet rows -> `QAExample`, and the RL batch iterator.

Accepted rows (one file per split, e.g. `nq/test.jsonl`):

- FlashRAG: `{"id", "question", "golden_answers": [...], "metadata": {...}}` (`metadata` optional). Our
  synthetic data puts the gold passage ids in `metadata["supporting_ids"]`.
- Search-R1 (`scripts/data_process/nq_search.py`): the FlashRAG columns plus `data_source`, `prompt` (a chat
  list whose user turn is `make_prefix`'s template around the question), `ability`, `reward_model: {"style",
  "ground_truth": {"target": [...]}}` and `extra_info: {"split", "index"}`. The answers come from
  `reward_model`; `id` falls back to `{data_source}_{split}_{index}`; `question` to the text between the
  template's known prefix and its final newline (a prompt of another template: the text after its last
  "Question:"). The chat list is kept as `QAExample.prompt`; `agent.protocols.prompt_messages` hands it to the search_r1
  protocol. A merged Search-R1 test set repeats ids across data sources: an example is identified by
  (`data_source`, `id`) (`QAExample.key`).

- ASQA (FlashRAG's long-form QA): a FlashRAG row whose `metadata.qa_pairs` holds the question's readings with
  their `short_answers` (checked here; `data.asqa` reads them for SOAR's Table 10 F1).

- Graph-R1 (LHRLAB/Graph-R1 `script_process.py` reads `datasets/NAME/raw/qa_{train,dev,test}.json`): one JSON
  array per split of `{"question", "golden_answers", "context"}`; `context` (the gold passages, a list of strings
  or one string) is kept deduplicated in `metadata["context"]` (R-S's gold text, as EKA's `compute_rs.py`
  reads it); a row without `id` gets `{file stem}_{index}` (index from 0, as `datasets.Dataset` numbers rows).

A path `tfds:NAME[/CONFIG][:VERSION]?split=SPLIT[&data_dir=DIR]` reads a prepared tensorflow-datasets builder
instead (trivia_qa, natural_questions, ...; optional extra `[tfds]`): see `jaxsearch/data/tfds_source.py`.

curatedtrec's golden answers are regular expressions (FlashRAG's rule, by dataset name): rows of a file in a
`curatedtrec/` directory (or named `curatedtrec.jsonl` / `.parquet`) or with `data_source` "curatedtrec" get
`Regex` answers (`data.qa_example`), which exact match and sub-exact match read as patterns.

Reading streams: one JSON line or one parquet record batch at a time. Any bad row is a `QADataError` naming
the file, the line (parquet: row) and the field; a file without examples is an error too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow.parquet as pq

from jaxsearch.data import asqa, tfds_source
from jaxsearch.data.qa_example import QADataError, QAExample, Regex
from jaxsearch.data.search_r1_prompt import SEARCH_R1_PROMPT

SUFFIXES = (".jsonl", ".parquet", ".json")
REGEX_DATASET = "curatedtrec"  # FlashRAG compares its golden answers as regular expressions


def example_from_dict(row: dict, where: str, regex_answers: bool = False) -> QAExample:
    """A FlashRAG or Search-R1 row -> QAExample; `where` ("file:line") prefixes any error. regex_answers: the
    golden answers are regular expressions (curatedtrec; also when the row's data_source says so)."""
    if not isinstance(row, dict):
        raise QADataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    metadata = row.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise QADataError(f"{where}: field 'metadata' must be an object, got {type(metadata).__name__}")
    metadata = dict(metadata)
    if row.get("reward_model") is not None:
        question, answers, example_id = _search_r1_fields(row, metadata, where)
    else:
        question = _require(row, "question", where)
        answers = _require(row, "golden_answers", where)
        example_id = _require(row, "id", where)
        if "context" in row:
            metadata["context"] = _gold_context(row["context"], where)
    if isinstance(example_id, bool) or not isinstance(example_id, (str, int)):
        raise QADataError(f"{where}: field 'id' must be a string or integer, got {example_id!r}")
    if not isinstance(question, str) or not question.strip():
        raise QADataError(f"{where}: field 'question' must be a non-empty string, got {question!r}")
    if "qa_pairs" in metadata:  # ASQA: its readings' short answers, what Table 10's F1 reads (data/asqa.py)
        asqa.check_qa_pairs(metadata["qa_pairs"], where)
    supporting = metadata.get("supporting_ids")
    prompt = row.get("prompt")
    answers = _string_list(answers, "golden_answers", where, allow_empty=False)
    if regex_answers or metadata.get("data_source") == REGEX_DATASET:
        answers = _regex_list(answers, where)
    return QAExample(
        id=str(example_id),
        question=question.strip(),
        golden_answers=answers,
        supporting_ids=None
        if supporting is None
        else _string_list(supporting, "metadata.supporting_ids", where),
        metadata=metadata,
        prompt=None if prompt is None else _chat_messages(prompt, where),
    )


def _gold_context(value: object, where: str) -> list[str]:
    """Graph-R1's `context`: the gold passages, deduplicated in order (EKA `evaluation/compute_rs.py`)."""
    passages = [value] if isinstance(value, str) else _string_list(value, "context", where)
    return list(dict.fromkeys(passages))


def _search_r1_fields(row: dict, metadata: dict, where: str) -> tuple[object, object, object]:
    """(question, answers, id) of a Search-R1 row; its data_source / extra_info / ability go into metadata."""
    reward = row["reward_model"]
    truth = reward.get("ground_truth") if isinstance(reward, dict) else None
    if not isinstance(truth, dict) or truth.get("target") is None:
        raise QADataError(f"{where}: missing field 'reward_model.ground_truth.target'")
    extra = row.get("extra_info") or {}
    for key in ("data_source", "ability"):
        if row.get(key) is not None:
            metadata[key] = row[key]
    if extra:
        metadata["extra_info"] = extra
    question = row.get("question")
    if question is None:
        question = _question_from_prompt(_require(row, "prompt", where), where)
    example_id = row.get("id")
    if example_id is None:
        if not isinstance(extra, dict) or "index" not in extra:
            raise QADataError(f"{where}: missing field 'id' (or 'extra_info.index')")
        example_id = f"{row.get('data_source', 'qa')}_{extra.get('split', 'unknown')}_{extra['index']}"
    return question, truth["target"], example_id


def _question_from_prompt(prompt: object, where: str) -> str:
    """The question in the prompt's user turn: exactly what Search-R1's `make_prefix` put between its prefix
    and its final newline; for another template, the text after the last "Question:"."""
    prefix, _, suffix = SEARCH_R1_PROMPT.partition("{question}")
    for message in _chat_messages(prompt, where):
        content = message["content"]
        if message["role"] != "user":
            continue
        if content.startswith(prefix) and content.endswith(suffix) and len(content) > len(prefix + suffix):
            return content[len(prefix) : len(content) - len(suffix)]
        if "Question:" in content:
            return content.rpartition("Question:")[2]
    raise QADataError(f"{where}: field 'prompt' has no user message containing 'Question:'")


def _chat_messages(prompt: object, where: str) -> list[dict]:
    """A chat list `[{"role": str, "content": str}, ...]` (extra keys dropped); errors name field 'prompt'."""
    if isinstance(prompt, np.ndarray):  # pandas-written parquet may hold lists as arrays
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise QADataError(
            f"{where}: field 'prompt' must be a non-empty list of chat messages, got {prompt!r:.200}"
        )
    out = []
    for i, message in enumerate(prompt):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise QADataError(
                f"{where}: field 'prompt[{i}]' must be an object with string 'role' and 'content', "
                f"got {message!r:.200}"
            )
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _require(row: dict, field: str, where: str) -> object:
    if row.get(field) is None:
        raise QADataError(f"{where}: missing field '{field}'")
    return row[field]


def _string_list(value: object, field: str, where: str, allow_empty: bool = True) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise QADataError(f"{where}: field '{field}' must be a list of strings, got {value!r}")
    if not value and not allow_empty:
        raise QADataError(f"{where}: field '{field}' is empty")
    return list(value)


def _regex_list(answers: list[str], where: str) -> list[Regex]:
    for i, answer in enumerate(answers):
        try:
            re.compile(answer)
        except re.error as e:
            raise QADataError(
                f"{where}: field 'golden_answers[{i}]' is not a valid regular expression ({e}): {answer!r}"
            ) from None
    return [Regex(a) for a in answers]


def has_regex_answers(path: str) -> bool:
    """FlashRAG's rule by dataset name: a file of the curatedtrec dataset holds regular-expression answers."""
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    stem = os.path.splitext(os.path.basename(path))[0]
    return REGEX_DATASET in (parent, stem)


def iter_examples(path: str | os.PathLike) -> Iterator[QAExample]:
    """Streams the examples of one `.jsonl`, `.parquet` or Graph-R1 `.json` file (blank JSONL lines are
    skipped) or tfds spec."""
    path = os.fspath(path)
    if path.startswith(tfds_source.TFDS_PREFIX):
        yield from tfds_source.iter_examples(path)
        return
    if not os.path.isfile(path):
        raise QADataError(f"{path}: no such QA file")
    if path.endswith(".jsonl"):
        rows = _jsonl_rows(path)
    elif path.endswith(".parquet"):
        rows = _parquet_rows(path)
    elif path.endswith(".json"):
        rows = _json_array_rows(path)
    else:
        raise QADataError(f"{path}: unknown QA file type (expected one of {', '.join(SUFFIXES)})")
    count = 0
    regex_answers = has_regex_answers(path)
    for where, row in rows:
        count += 1
        yield example_from_dict(row, where, regex_answers)
    if count == 0:
        raise QADataError(f"{path}: the file has no examples")


def _jsonl_rows(path: str) -> Iterator[tuple[str, object]]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise QADataError(f"{where}: not valid JSON ({e})") from None


def _json_array_rows(path: str) -> Iterator[tuple[str, object]]:
    """Graph-R1's qa_*.json: a JSON array of rows; rows without an `id` are numbered `{stem}_{index}`."""
    with open(path, encoding="utf-8") as f:
        try:
            rows = json.load(f)
        except json.JSONDecodeError as e:
            raise QADataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(rows, list):
        raise QADataError(f"{path}: expected a JSON array of rows, got {type(rows).__name__}")
    stem = os.path.splitext(os.path.basename(path))[0]
    for index, row in enumerate(rows):
        if isinstance(row, dict) and "id" not in row:
            row = {**row, "id": f"{stem}_{index}"}
        yield f"{path}: row {index + 1}", row


def _parquet_rows(path: str) -> Iterator[tuple[str, object]]:
    row_no = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            row_no += 1
            yield f"{path}: row {row_no}", row


def load_examples(path: str | os.PathLike) -> list[QAExample]:
    """All examples of one file (or tfds spec), in file order."""
    return list(iter_examples(path))


def find_split(directory: str | os.PathLike, split: str) -> str:
    """The file of `split` in a dataset directory: FlashRAG's `{split}.jsonl` / `{split}.parquet`, or Graph-R1's
    `qa_{split}.json`."""
    directory = os.fspath(directory)
    names = [split + suffix for suffix in (".jsonl", ".parquet")] + [f"qa_{split}.json"]
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    found = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    raise QADataError(f"{directory}: none of {', '.join(names)} (found: {found})")


def write_jsonl(examples: Sequence[QAExample], path: str | os.PathLike) -> None:
    """Writes examples as FlashRAG JSONL, one row per line."""
    with open(path, "w", encoding="utf-8") as f:
        for example in examples:
            f.write(json.dumps(example.to_json(), ensure_ascii=False) + "\n")


class QAIterator:
    """Endless, deterministic, resumable batches of questions for group-based RL (GRPO).

    Each `next()` returns `batch_size * group_size` examples: `batch_size` distinct draws, each repeated
    `group_size` times in a row (q0 x group, q1 x group, ...), so row `r` belongs to group `r // group_size`.

    Order: epoch `e` visits the examples in the permutation drawn by `np.random.default_rng([seed, e])` (the
    identity when `shuffle=False`). Batches run across epoch ends, so every batch is full and every example is
    seen once per epoch. The position is therefore just (epoch, index into that epoch's permutation):
    `state()` returns it as a JSON-able dict of ints, and `restore(state)` on an iterator built over the same
    examples and seed continues with exactly the batches the saved iterator would have produced.
    """

    def __init__(
        self, examples: Sequence[QAExample], batch_size: int, group_size: int, seed: int, shuffle: bool = True
    ):
        if not examples:
            raise ValueError("QAIterator needs at least one example")
        if batch_size < 1 or group_size < 1:
            raise ValueError(f"batch_size and group_size must be >= 1, got {batch_size}, {group_size}")
        self.examples = examples
        self.batch_size = batch_size
        self.group_size = group_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.index = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.examples))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))

    def __iter__(self) -> QAIterator:
        return self

    def __next__(self) -> list[QAExample]:
        batch = []
        for _ in range(self.batch_size):
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            example = self.examples[int(self._order[self.index])]
            self.index += 1
            batch.extend([example] * self.group_size)
        return batch

    def state(self) -> dict:
        """The position, plus what must match on restore (JSON-able; save it with the checkpoint)."""
        return {
            "epoch": self.epoch,
            "index": self.index,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_examples": len(self.examples),
        }

    def restore(self, state: dict) -> None:
        """Moves to a position saved by `state()`; the examples and seed must be those it was saved with."""
        mine = self.state()
        for key in ("seed", "shuffle", "num_examples"):
            if state[key] != mine[key]:
                raise ValueError(
                    f"iterator state has {key}={state[key]!r} but this iterator has {mine[key]!r}"
                )
        if not 0 <= state["index"] <= len(self.examples) or state["epoch"] < 0:
            raise ValueError(f"iterator state position out of range: {state}")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._permutation(self.epoch)


def eval_subset(examples: list[QAExample], n: int, sample: str = "first", seed: int = 0) -> list[QAExample]:
    """`n` examples (0 or more than there are: all) for evaluation: the first n in file order, or (sample
    "random") n drawn without replacement with `seed`, kept in file order. R-Search evaluates a random 500
    per dataset and all of a smaller one (Bamboogle's 125; seed 002 §A.1)."""
    if sample not in ("first", "random"):
        raise ValueError(f"eval sample {sample!r}: expected 'first' or 'random'")
    if not n or n >= len(examples):
        return list(examples)
    if sample == "first":
        return list(examples[:n])
    rows = np.random.default_rng(seed).choice(len(examples), size=n, replace=False)
    return [examples[i] for i in sorted(rows)]
