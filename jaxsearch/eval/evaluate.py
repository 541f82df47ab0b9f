"""Evaluation of a search agent on QA datasets: episodes -> one record per example -> a summary per dataset.

    engine = agent.build.build_engine(cfg, model_config, mesh, evaluation=True)   # or an AgentEngine
    summary = evaluate(engine, params, {"nq": examples}, out_dir, batch_size=64, gold_corpus=corpus,
                       rs_encoder=Encoder("minilm"), judge=judge)

Files in `out_dir`:

    NAME.jsonl    one record per example, appended a batch at a time: id, question, golden_answers,
                  prediction, metrics, turns, searches, truncated, policy_tokens, response, initial_doc_ids
                  (EKA's P0), doc_ids (per search), and the token row: tokens, loss_mask, segment_ids, entropy
                  (prompt + response, unpadded; prompt_length marks where the response starts)
    summary.json  {"datasets": {NAME: metrics}, "data_sources": {NAME: {SOURCE: metrics}},
                  "average": metrics}, computed from the NAME.jsonl files; "data_sources" breaks a dataset whose examples carry
                  Search-R1's `data_source` (a merged test parquet: nq, triviaqa, ...) down by source
    results.md    the same as a markdown table: one row per dataset, a NAME/SOURCE row per data source
                  after it, and the average (over datasets)

Examples are identified by (data_source, id) (`QAExample.key`; records carry `data_source` when the example
has one): a merged Search-R1 test set repeats ids across sources. The prompt is the protocol's own, or for
search_r1 the dataset's `prompt` when it has one (`AgentEngine.rollout_examples`; `use_data_prompt=False`: ours).

Resumable: a rerun skips the examples (by key) already in NAME.jsonl. A last line without its newline (a crash
mid-write) is dropped and redone; any other unreadable line is an `EvalError` naming the file and line.

Metrics per example (`record["metrics"]`):

    em, f1, sub_em  the final <answer> against the golden answers (`scoring.metrics`; no answer scores ""); F1
                    with the protocol's rule (`f1_special_answers`: FlashRAG's yes/no rule, or the plain token
                    F1 of Graph-R1's and R-Search's own evaluation)
    acc             R-Search's Acc (`scoring.metrics.accuracy`): a golden answer is a substring of the answer
    recall          FlashRAG's retrieval recall@k: 1 if a golden answer occurs in a passage the episode
                    retrieved: any search's top-k, and EKA's P0 unless include_initial=False
    rs              R-S (`retrieval_similarity`): the gold passages (a Graph-R1 row's `context`, else its
                    `supporting_ids` looked up in `gold_corpus`) against every distinct retrieved passage (P0 as
                    for recall; Graph-R1 protocols: the text of every `<knowledge>` block, `retrieved_texts`);
                    None without gold passages or without rs_encoder; 0.0 without retrieved passages
    fabrication     SOAR's judge (`judge`, shown E_ext only): 1 fabricated, 0 grounded; None unparseable
                    or no judge
    asqa_f1         SOAR's Table 10 F1 on ASQA: the F1 above against the short answers of every reading of the
                    question (`data.asqa.short_answers`); only for a row with ASQA's `qa_pairs`

A dataset may be searched in its own corpus (`retrievers`, e.g. R-Search's per-dataset servers from
`config.data.eval_retrievers` via `dataset_urls`); the others use the engine's retriever.

Per dataset: n, the means of em / f1 / sub_em / recall / turns / searches / finish_ratio / truncated, acc (over
the records that have it), rs and fabrication_rate over their non-None values (None if there are none, with
rs_n / fabrication_n counted), the fabrication rate among answer-correct (EM 1) and answer-wrong examples (SOAR's Table 4: fabrication_rate/correct,
fabrication_rate/wrong), asqa_f1 over its non-None values (asqa_f1_n counted; a results.md column only
when some row has it), the token cost (`token_cost`: SOAR's Table 11, response tokens per turn;
`policy_tokens_per_turn`: the policy's own), and
the entropy of the policy's tokens, overall and per segment type (`entropy/think`, ...), token-weighted. The
average row is the mean over datasets of each metric (skipping None) and the total n.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import jax
import numpy as np
from tqdm import tqdm

from jaxsearch.agent import segments
from jaxsearch.agent.engine import AgentEngine
from jaxsearch.agent.protocols import GraphR1Protocol, knowledge_lines
from jaxsearch.data import asqa
from jaxsearch.data.qa import QAExample
from jaxsearch.scoring import metrics as qa_metrics
from jaxsearch.eval.retrieval_similarity import RetrievalSimilarity
from jaxsearch.files import atomic_write_text
from jaxsearch.retrieval.base import Doc, graph_r1_result_string
from jaxsearch.retrieval.metrics import recall_at_k
from jaxsearch.scoring import rewards as rewards_lib

MEAN_METRICS = ("em", "f1", "sub_em", "recall", "turns", "searches", "finish_ratio", "truncated")
TABLE_COLUMNS = (  # (summary key, header)
    ("n", "n"),
    ("em", "EM"),
    ("f1", "F1"),
    ("sub_em", "sub-EM"),
    ("acc", "Acc"),
    ("recall", "recall@k"),
    ("rs", "R-S"),
    ("turns", "turns"),
    ("searches", "searches"),
    ("fabrication_rate", "fabrication"),
    ("fabrication_rate/correct", "fabrication (EM 1)"),
    ("fabrication_rate/wrong", "fabrication (EM 0)"),
    ("token_cost", "token cost"),
    ("policy_tokens_per_turn", "policy tokens/turn"),
    ("entropy", "entropy"),
)
OPTIONAL_COLUMNS = (("asqa_f1", "F1 (ASQA short)"),)  # shown when a row has a value


class EvalError(ValueError):
    """An output directory or input that cannot be used; the message names the file (and line)."""


# ------------------------------------------------------------------------------------------- records


def records_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"{name}.jsonl")


def read_records(path: str) -> list[dict]:
    """The records of a NAME.jsonl ([] if absent). A last line without newline is cut off the file."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    complete = data.rfind(b"\n") + 1
    if complete < len(data):  # a crash mid-write: drop the partial line so the rerun appends after it
        with open(path, "r+b") as f:
            f.truncate(complete)
    records = []
    for line_no, line in enumerate(data[:complete].split(b"\n")[:-1], start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise EvalError(f"{path}:{line_no}: not a valid record ({e}); move the file aside to redo it")
        if not isinstance(record, dict) or "id" not in record or "metrics" not in record:
            raise EvalError(f"{path}:{line_no}: not an evaluation record (needs 'id' and 'metrics')")
        records.append(record)
    return records


def records_by_key(records: Sequence[dict]) -> dict[tuple, dict]:
    """(data_source, id) -> record. Records written before data sources were recorded have no `data_source`
    field: they key as (None, id) and `find_record` falls back to that (their ids were unique per file)."""
    return {(r.get("data_source"), r["id"]): r for r in records}


def find_record(by_key: dict[tuple, dict], example: QAExample) -> dict | None:
    return by_key.get(example.key) or by_key.get((None, example.id))


def pending(out_dir: str, datasets: dict[str, list[QAExample]]) -> dict[str, list[int]]:
    """Per dataset, the indices of the examples without a record yet."""
    out = {}
    for name, examples in datasets.items():
        done = records_by_key(read_records(records_path(out_dir, name)))
        out[name] = [i for i, ex in enumerate(examples) if find_record(done, ex) is None]
    return out


def check_supporting_ids(datasets: dict[str, list[QAExample]], corpus) -> None:
    """Every supporting id must be a passage of `corpus` (checked before any episode runs)."""
    for name, examples in datasets.items():
        for ex in examples:
            for doc_id in ex.supporting_ids or ():
                try:
                    corpus.row_of(doc_id)
                except KeyError:
                    raise EvalError(
                        f"dataset {name}: example {ex.id!r} has supporting id {doc_id!r}, which is not in "
                        f"the corpus {corpus.path}"
                    ) from None


# ------------------------------------------------------------------------------------------- episodes


def run_batch(
    engine: AgentEngine,
    params,
    examples: Sequence[QAExample],
    key,
    batch_size: int,
    judge=None,
    gold_corpus=None,
    similarity: RetrievalSimilarity | None = None,
    include_initial: bool = True,
    use_data_prompt: bool = True,
) -> list[dict]:
    """Episodes for `examples` (padded to `batch_size` rows with the last question: one compiled shape)
    -> one record each."""
    n = len(examples)
    padded = list(examples) + [examples[-1]] * (batch_size - n)
    traj = engine.rollout_examples(params, padded, key, use_data_prompt)
    fabrication = [None] * n
    if judge is not None:
        scores = rewards_lib.judge_fabrication(judge, rewards_lib.reward_inputs(traj, examples))
        fabrication = [None if np.isnan(s) else float(s) for s in scores]
    retrieved, gold, records = [], [], []
    for i, ex in enumerate(examples):
        p0 = traj.initial_docs[i] if include_initial else []
        lists = ([p0] if p0 else []) + traj.docs[i]
        recall = max([recall_at_k(docs, ex.golden_answers, len(docs)) for docs in lists], default=0.0)
        retrieved.append(retrieved_texts(engine.protocol, p0, traj.docs[i]))
        gold.append(gold_passages(ex, gold_corpus))
        prediction = traj.answers[i]
        length = int(traj.attention_mask[i].sum())
        short = asqa.short_answers(ex)  # ASQA: Table 10's F1 reads its readings' short answers
        asqa_f1 = {} if short is None else {
            "asqa_f1": qa_metrics.f1_score(prediction or "", short, engine.protocol.f1_special_answers)
        }
        records.append(
            {
                "id": ex.id,
                **({} if ex.data_source is None else {"data_source": ex.data_source}),
                "question": ex.question,
                "golden_answers": ex.golden_answers,
                "prediction": prediction,
                "metrics": {
                    "em": qa_metrics.exact_match(prediction or "", ex.golden_answers),
                    "f1": qa_metrics.f1_score(
                        prediction or "", ex.golden_answers, engine.protocol.f1_special_answers
                    ),
                    "sub_em": qa_metrics.sub_exact_match(prediction or "", ex.golden_answers),
                    "acc": qa_metrics.accuracy(prediction or "", ex.golden_answers),
                    "recall": recall,
                    "rs": None,
                    "fabrication": fabrication[i],
                    **asqa_f1,
                },
                "turns": int(traj.turns[i]),
                "searches": int(traj.searches[i]),
                "truncated": bool(traj.truncated[i]),
                "policy_tokens": int(traj.policy_tokens[i]),
                "response": traj.responses[i],
                "initial_doc_ids": [d.id for d in traj.initial_docs[i]],
                "doc_ids": [[d.id for d in docs] for docs in traj.docs[i]],
                "prompt_length": int(traj.prompt_lengths[i]),
                "tokens": traj.tokens[i, :length].tolist(),
                "loss_mask": traj.loss_mask[i, :length].tolist(),
                "segment_ids": traj.segment_ids[i, :length].tolist(),
                "entropy": np.round(traj.entropy[i, :length].astype(np.float64), 5).tolist(),
            }
        )
    if similarity is not None:
        for record, rs in zip(records, similarity(gold, retrieved)):
            record["metrics"]["rs"] = rs
    return records


def gold_passages(example: QAExample, gold_corpus=None) -> list[str]:
    """R-S's gold texts: a Graph-R1 row's own `context`, else its supporting passages in `gold_corpus`
    (none without one)."""
    if "context" in example.metadata:
        return list(example.metadata["context"])
    if gold_corpus is None:
        return []
    return [gold_corpus.get(d).contents for d in example.supporting_ids or ()]


def retrieved_texts(protocol, p0: list[Doc], searches: list[list[Doc]]) -> list[str]:
    """R-S's retrieved side. In the Graph-R1 setting as EKA scores it (evaluation/rsim.py): the text of each
    `<knowledge>` block the episode holds, in order: P0's knowledge lines, then each search's reply string.
    Otherwise every distinct passage of P0 and the searches."""
    if isinstance(protocol, GraphR1Protocol):
        return ([knowledge_lines(p0)] if p0 else []) + [graph_r1_result_string(docs) for docs in searches]
    return _unique_contents(([p0] if p0 else []) + searches)


def _unique_contents(doc_lists: list[list[Doc]]) -> list[str]:
    seen, out = set(), []
    for docs in doc_lists:
        for d in docs:
            if d.contents not in seen:
                seen.add(d.contents)
                out.append(d.contents)
    return out


def evaluate(
    engine: AgentEngine,
    params,
    datasets: dict[str, list[QAExample]],
    out_dir: str,
    batch_size: int = 64,
    seed: int = 0,
    gold_corpus=None,
    rs_encoder=None,
    include_initial: bool = True,
    progress: bool = True,
    use_data_prompt: bool = True,
    judge=None,
    retrievers: dict | None = None,
) -> dict:
    """Run the missing examples of every dataset, append their records, write the summary; return it.

    A batch is rolled out with key fold_in(key(seed), i), i the dataset index of its first example (greedy decoding
    does not depend on it). gold_corpus: a `Corpus` holding the supporting passages (R-S; not needed for rows
    with their own `context`); rs_encoder: the R-S sentence encoder (None: no R-S); include_initial: count EKA's
    P0 in recall and R-S; use_data_prompt: the search_r1 protocol prompts with a dataset's own `prompt` where it
    has one (False: the built-in one); retrievers: dataset name -> the retriever of its own corpus (others: the
    engine's).
    """
    os.makedirs(out_dir, exist_ok=True)
    if gold_corpus is not None:
        check_supporting_ids(datasets, gold_corpus)
    similarity = RetrievalSimilarity(rs_encoder) if rs_encoder is not None else None
    for name, todo in pending(out_dir, datasets).items():
        examples = datasets[name]
        agent = engine if name not in (retrievers or {}) else engine.replace(retriever=retrievers[name])
        bar = tqdm(total=len(examples), initial=len(examples) - len(todo), desc=name, disable=not progress)
        with open(records_path(out_dir, name), "a", encoding="utf-8") as f:
            for start in range(0, len(todo), batch_size):
                chunk = todo[start : start + batch_size]
                records = run_batch(
                    agent,
                    params,
                    [examples[i] for i in chunk],
                    jax.random.fold_in(jax.random.key(seed), chunk[0]),
                    batch_size,
                    judge,
                    gold_corpus,
                    similarity,
                    include_initial,
                    use_data_prompt,
                )
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
                f.flush()
                os.fsync(f.fileno())
                bar.update(len(chunk))
        bar.close()
    return write_summary(out_dir, datasets)


def dataset_urls(urls: dict[str, str], names) -> dict[str, str]:
    """Dataset name -> the /retrieve URL of its own corpus, for the `names` evaluated: its entry in `urls`
    (`config.data.eval_retrievers`, or launch/eval.py --dataset-url), else the "*" entry; a dataset with
    neither is left out (it uses the engine's retriever)."""
    out = {}
    for name in names:
        url = urls.get(name, urls.get("*"))
        if url:
            out[name] = url
    return out


# ------------------------------------------------------------------------------------------- summary


def summarize(records: Sequence[dict]) -> dict:
    """The dataset-level metrics of its records (see the module docstring)."""
    out: dict = {"n": len(records)}
    for key in MEAN_METRICS:
        values = [_metric(r, key) for r in records]
        out[key] = float(np.mean(values)) if values else None
    acc = [r["metrics"]["acc"] for r in records if "acc" in r["metrics"]]  # records written before Acc lack it
    out["acc"] = float(np.mean(acc)) if acc else None
    for key, name in (("rs", "rs"), ("fabrication", "fabrication_rate"), ("asqa_f1", "asqa_f1")):
        values = [r["metrics"][key] for r in records if r["metrics"].get(key) is not None]
        out[name] = float(np.mean(values)) if values else None
        out[f"{key}_n"] = len(values)
    for group, correct in (("correct", True), ("wrong", False)):  # SOAR's Table 4: by the answer's EM
        values = [
            r["metrics"]["fabrication"]
            for r in records
            if r["metrics"].get("fabrication") is not None and (r["metrics"]["em"] == 1.0) == correct
        ]
        out[f"fabrication_rate/{group}"] = float(np.mean(values)) if values else None
    policy = [
        (np.asarray(r["entropy"]), np.asarray(r["segment_ids"]), np.asarray(r["loss_mask"]) == 1)
        for r in records
    ]
    total = sum(float(e[m].sum()) for e, _, m in policy)
    count = sum(int(m.sum()) for _, _, m in policy)
    out["entropy"] = total / count if count else None
    out.update(token_cost(records))
    for name, sid in segments.SEGMENT_IDS.items():
        count = sum(int((m & (s == sid)).sum()) for _, s, m in policy)
        if count:
            out[f"entropy/{name}"] = sum(float(e[m & (s == sid)].sum()) for e, s, m in policy) / count
    return out


def token_cost(records: Sequence[dict]) -> dict:
    """SOAR's Table 11 "Token Cost", "the average output tokens per reasoning turn, encompassing both
    information and thinking content": the response's tokens (after the prompt: the policy's, and the
    observations and hints it read) over all the records' turns (decode segments), i.e. the mean over turns,
    not over examples; and `policy_tokens_per_turn`, the policy's own sampled tokens likewise. Each is None
    without turns or when a record lacks its field (`tokens`, `policy_tokens`: records of older versions)."""
    turns = sum(int(r["turns"]) for r in records)
    out = {"token_cost": None, "policy_tokens_per_turn": None}
    if turns and all("tokens" in r for r in records):
        out["token_cost"] = sum(len(r["tokens"]) - int(r["prompt_length"]) for r in records) / turns
    if turns and all("policy_tokens" in r for r in records):
        out["policy_tokens_per_turn"] = sum(int(r["policy_tokens"]) for r in records) / turns
    return out


def _metric(record: dict, key: str) -> float:
    if key in record["metrics"]:
        return float(record["metrics"][key])
    if key == "finish_ratio":
        return float(record["prediction"] is not None)
    return float(record[key])


def average(per_dataset: dict[str, dict]) -> dict:
    """The mean over datasets of each metric (None values skipped), and the total n."""
    keys = sorted({k for s in per_dataset.values() for k in s} - {"n", "rs_n", "fabrication_n", "asqa_f1_n"})
    out: dict = {"n": sum(s["n"] for s in per_dataset.values())}
    for key in keys:
        values = [s[key] for s in per_dataset.values() if s.get(key) is not None]
        out[key] = float(np.mean(values)) if values else None
    return out


def summary_from_files(out_dir: str, datasets: dict[str, list[QAExample]]) -> dict:
    """{"datasets": {name: metrics}, "data_sources": {name: {source: metrics}}, "average": metrics} over the
    records of the given examples; a dataset without data sources has no "data_sources" entry."""
    per_dataset, per_source = {}, {}
    for name, examples in datasets.items():
        by_key = records_by_key(read_records(records_path(out_dir, name)))
        found = [(ex, find_record(by_key, ex)) for ex in examples]
        found = [(ex, r) for ex, r in found if r is not None]
        per_dataset[name] = summarize([r for _, r in found])
        sources = list(dict.fromkeys(ex.data_source for ex in examples if ex.data_source is not None))
        if sources:
            per_source[name] = {s: summarize([r for ex, r in found if ex.data_source == s]) for s in sources}
    return {"datasets": per_dataset, "data_sources": per_source, "average": average(per_dataset)}


def markdown_table(summary: dict) -> str:
    """One row per dataset (then one NAME/SOURCE row per data source) and the average; the entropy of each
    segment type that occurs gets a column."""
    rows = {}
    for name, row in summary["datasets"].items():
        rows[name] = row
        for source, source_row in summary.get("data_sources", {}).get(name, {}).items():
            rows[f"{name}/{source}"] = source_row
    rows["average"] = summary["average"]
    segment_keys = [
        f"entropy/{s}" for s in segments.SEGMENT_IDS if any(f"entropy/{s}" in r for r in rows.values())
    ]
    optional = [(k, h) for k, h in OPTIONAL_COLUMNS if any(r.get(k) is not None for r in rows.values())]
    columns = list(TABLE_COLUMNS) + optional + [(k, k) for k in segment_keys]
    lines = [
        "| dataset | " + " | ".join(h for _, h in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for name, row in rows.items():
        cells = [_cell(row.get(key), key) for key, _ in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(value, key: str) -> str:
    if value is None:
        return "-"
    return str(value) if key == "n" else f"{value:.3f}"


def write_summary(out_dir: str, datasets: dict[str, list[QAExample]]) -> dict:
    """summary.json and results.md from the record files (each replaced atomically); returns the summary."""
    summary = summary_from_files(out_dir, datasets)
    atomic_write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2) + "\n")
    atomic_write_text(os.path.join(out_dir, "results.md"), markdown_table(summary))
    return summary


# ------------------------------------------------------------------------------------------- run settings


def claim_out_dir(out_dir: str, settings: dict, dataset_paths: dict[str, str]) -> None:
    """Record the run's settings in out_dir/run.json, or check that they match the recorded ones (a rerun
    must not mix results of another checkpoint / retriever / decoding setting into the same files)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "run.json")
    stored = {"settings": settings, "datasets": {}}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            try:
                stored = json.load(f)
            except json.JSONDecodeError as e:
                raise EvalError(f"{path}: not valid JSON ({e})") from None
        differ = sorted(
            k for k in set(settings) | set(stored["settings"]) if settings.get(k) != stored["settings"].get(k)
        )
        if differ:
            diffs = ", ".join(f"{k}: {stored['settings'].get(k)!r} -> {settings.get(k)!r}" for k in differ)
            raise EvalError(f"{path}: {out_dir} holds results of another run ({diffs}); use another --out")
    for name, dataset_path in dataset_paths.items():
        previous = stored["datasets"].get(name)
        if previous is not None and previous != dataset_path:
            raise EvalError(
                f"{path}: dataset {name} was evaluated from {previous}, not {dataset_path}; use another name"
            )
        stored["datasets"][name] = dataset_path
    atomic_write_text(path, json.dumps(stored, indent=2) + "\n")
