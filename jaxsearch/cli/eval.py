"""Evaluate a search agent checkpoint on QA datasets (FlashRAG JSONL or parquet, or tfds:NAME?split=S).

    python launch/eval.py --checkpoint ckpt/ --protocol search_r1 --retriever bm25 --corpus wiki-18.jsonl \\
        --index indexes/wiki18_bm25 --datasets nq=data/nq/test.jsonl hotpotqa=data/hotpotqa/dev.jsonl \\
        --out runs/eval_search_r1
    python launch/eval.py --checkpoint Qwen2.5-7B-Instruct/ --protocol eka --eka-tags graph_r1 ...   # EKA
                                                                                    # training-free
    python launch/eval.py --checkpoint Qwen2.5-7B-Instruct/ --protocol eka_infer --topk 10 --initial-k 5 \
        --cache-len 32768 ...                                       # EKA training-free, the authors' own loop

--checkpoint is an HF safetensors dir or a jaxsearch params dir (config.json + params/, e.g. from SFT or
convert_checkpoint.py). Writes to --out: NAME.jsonl (one record per example with the full trajectory),
summary.json and results.md (EM, F1, sub-EM, retrieval recall@k, R-S, turns, searches, fabrication rate,
entropy per segment type; per dataset, per Search-R1 `data_source` within a dataset, and on average).
Rerunning the same command skips finished examples;
--out refuses results of different settings (run.json), and a directory of files it did not write.

Recall@k counts an example when a golden answer occurs in any passage the episode retrieved (each search's
top-k, and EKA's P0 unless --exclude-p0). R-S needs gold passages: the dataset's metadata.supporting_ids,
looked up in the retriever's corpus (or --corpus with a remote retriever); a dataset without them reports
R-S as null (as do all with --rs-encoder none). R-S is EKA's: SQuAD-normalized texts under SimCSE
(sup-simcse-roberta-large, the default; --rs-encoder minilm needs no download), 0 when nothing was retrieved.
The fabrication rate needs a judge (--judge-url); it is also given among answer-correct and answer-wrong
examples (SOAR's Table 4). --limit N --sample random --sample-seed S draws N questions at random (R-Search:
500, seed 44).

R-Search's own evaluation loop (src/eval/main.py, for its checkpoints): --protocol rsearch_eval (their tags
<observation> / <original_evidence>, no stop at </answer>) --max-turns 8192 (no cap) --max-segment-tokens 1024
--temperature 0.1 --top-p 0.9 --topk 5, and --dataset-url for the per-dataset corpora (configs/rsearch_7b.py
rollout.eval_* and data.eval_retrievers); results carry R-Search's Acc beside EM and F1 (plain token F1 under
rsearch, rsearch_eval and graph_r1 protocols, as their authors' scripts; FlashRAG's yes/no rule otherwise).

Training-free EKA as its authors run it (yxzwang/EarlyKnowledgeAlignment agent/vllm_infer/EKA_infer.py; seed
000 §5.4): --protocol eka_infer, evaluation only (jaxsearch/agent/eka_infer.py). Their prompt with P0 (the top
--initial-k passages for the raw question, from --initial-corpus if given; --initial-k 0: their prompt without
P0, the no-EKA row) as one user message under the chat template; a `<query>{"query": ...}</query>` call is cut
there and answered in a `<knowledge>` user turn, and the whole text is re-templated and prefilled for each
call; the answer by their rule, scored with their plain token F1. Their defaults unless given: --temperature
1.0 --top-p 1.0 --max-segment-tokens 4096 (max_tokens per call) --max-turns 20 (chat calls). Give --cache-len
room for a whole episode (vLLM's max_model_len; Qwen2.5: 32768), --topk (Graph-R1's server: 10) and
--initial-k (get_knowledge.py: 5). --scheduler, --slots, --steps-per-call, --max-obs-tokens and --eka-tags do
not apply.

Search-R1 parquet: examples are identified by (data_source, id), so a merged test set (nq, triviaqa, ... with
ids repeated across sources) is one dataset, broken down by data source in results.md and summary.json. Under
the search_r1 protocol a row's own `prompt` is what the policy sees (a warning says when it differs from the
built-in template); --builtin-prompt uses the built-in one instead.
"""

import argparse
import os
import re
import sys


# FAISS's OpenMP threads spin between calls and starve its BLAS threads (see build_index.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from jaxsearch.agent.cli import (  # noqa: E402
    add_agent_arguments,
    agent_config,
    checkpoint_kind,
    finish_agent_args,
    model_config,
)

DATASET_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# --protocol eka_infer: the defaults of the authors' EKA_infer.py (`main`'s argparse), for the flags not given
EKA_INFER_DEFAULTS = {
    "temperature": 1.0,  # --temperature default 1.0
    "top_p": 1.0,  # --top-p default 1.0
    "max_segment_tokens": 4096,  # --max-tokens default 4096: new tokens per chat call
    "max_turns": 20,  # --max-turns default 20: chat calls per question
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    agent, retrieval = add_agent_arguments(p)
    p.add_argument("--datasets", nargs="+", required=True, metavar="NAME=PATH", help="QA files to evaluate")
    p.add_argument("--limit", type=int, default=0, help="N examples of each dataset (0: all; see --sample)")
    p.add_argument(
        "--sample",
        default="first",
        choices=["first", "random"],
        help="with --limit: the first N, or N drawn at random with --sample-seed (R-Search: random 500, seed 44)",
    )
    p.add_argument("--sample-seed", type=int, default=0, help="seed of --sample random")
    p.add_argument("--out", required=True, help="output directory (reused on rerun)")
    p.add_argument("--batch-size", type=int, default=64, help="episodes per sampler call")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    agent.add_argument(
        "--builtin-prompt", action="store_true", help="search_r1: ignore the dataset's own prompt, use ours"
    )
    retrieval.add_argument(
        "--exclude-p0", action="store_true", help="recall and R-S without EKA's P0 passages"
    )
    retrieval.add_argument(
        "--dataset-url",
        nargs="+",
        default=[],
        metavar="NAME=URL",
        help="search dataset NAME in its own corpus, a remote /retrieve URL (NAME *: every other dataset); "
        "R-Search: configs/rsearch_7b.py data.eval_retrievers",
    )
    g = p.add_argument_group("metrics")
    g.add_argument(
        "--rs-encoder",
        default="simcse",
        help="R-S sentence encoder: simcse (sup-simcse-roberta-large, as EKA / Graph-R1) | minilm (offline) | "
        "e5 | model | none",
    )
    g.add_argument("--judge-url", default="", help="OpenAI-compatible server of the fabrication judge")
    g.add_argument("--judge-model", default="", help="the judge's model name")
    defaults = {key: p.get_default(key) for key in EKA_INFER_DEFAULTS}
    p.set_defaults(**dict.fromkeys(EKA_INFER_DEFAULTS))  # None: not given
    args = p.parse_args(argv)
    for key, default in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, EKA_INFER_DEFAULTS[key] if args.protocol == "eka_infer" else default)
    _check_eka_infer(p, args)
    args = finish_agent_args(args)
    args.datasets = dict(_dataset(p, spec) for spec in args.datasets)
    args.dataset_url = dict(_dataset_url(p, spec) for spec in args.dataset_url)
    if bool(args.judge_url) != bool(args.judge_model):
        p.error("--judge-url and --judge-model go together")
    return args


def _check_eka_infer(parser, args) -> None:
    """--initial-k 0 (no P0) only under eka_infer, without --initial-corpus; flags eka_infer cannot honour."""
    if args.initial_k is not None and args.initial_k < 0:
        parser.error(f"--initial-k {args.initial_k}: expected >= 0")
    if args.protocol != "eka_infer":
        if args.initial_k == 0:
            parser.error("--initial-k 0 (no P0) is --protocol eka_infer's no-EKA prompt; others take >= 1")
        return
    if args.initial_k == 0 and args.initial_corpus:
        parser.error("--protocol eka_infer: --initial-k 0 (no P0) contradicts --initial-corpus (P0's source)")
    if args.builtin_prompt:
        parser.error("--protocol eka_infer prompts with the authors' prompt; --builtin-prompt is search_r1's")
    if args.max_turns < 1 or args.max_segment_tokens < 1:
        parser.error("--protocol eka_infer: --max-turns (chat calls) and --max-segment-tokens must be >= 1")


def eka_infer_initial_k(args) -> int:
    """eka_infer's P0 passages: --initial-k (0: none), else --topk."""
    return args.topk if args.initial_k is None else args.initial_k


def _dataset(parser, spec: str) -> tuple[str, str]:
    name, sep, path = spec.partition("=")
    if not sep or not path or not DATASET_NAME.match(name) or name == "average":
        parser.error(
            f"--datasets {spec!r}: expected NAME=PATH with NAME of letters, digits, _ . - (not average)"
        )
    if path.startswith("tfds:"):  # a tensorflow-datasets builder spec (jaxsearch/data/tfds_source.py)
        return name, path
    return name, os.path.abspath(path)


def _dataset_url(parser, spec: str) -> tuple[str, str]:
    name, sep, url = spec.partition("=")
    if not sep or not url.startswith(("http://", "https://")) or not (name == "*" or DATASET_NAME.match(name)):
        parser.error(f"--dataset-url {spec!r}: expected NAME=http(s)://... with NAME a dataset or *")
    return name, url


def settings(args) -> dict:
    """What the results depend on (run.json): a rerun into the same --out must match."""
    keys = (
        "tokenizer dtype protocol eka_tags topk initial_k temperature top_p max_turns max_segment_tokens "
        "max_obs_tokens cache_len retriever corpus index url encoder initial_corpus initial_index exclude_p0 "
        "rs_encoder judge_url judge_model seed"
    ).split()
    out = {k: getattr(args, k) for k in keys + ["checkpoint"]}
    if args.protocol != "eka":
        out["eka_tags"] = None
    if args.protocol == "eka_infer":
        out["initial_k"] = eka_infer_initial_k(args)
    elif args.protocol != "eka":
        out["initial_k"] = None
    if args.builtin_prompt:  # recorded only when set: run.json files written before the option still match
        out["builtin_prompt"] = True
    if args.initial_retriever != "bm25":  # likewise (recorded only when not the default)
        out["initial_retriever"] = args.initial_retriever
    if args.dataset_url:  # likewise
        out["dataset_url"] = args.dataset_url
    if args.sample == "random":  # likewise
        out["sample"], out["sample_seed"] = args.sample, args.sample_seed
    return out


def judge_config(args):
    """--judge-url / --judge-model as the judge's chat model (greedy, 512 new tokens), or None."""
    from jaxsearch.config import ChatModelConfig

    if not args.judge_url:
        return None
    return ChatModelConfig("openai", args.judge_url, args.judge_model, "", "qwen", 4096, 512, 0.0, 1.0)


def main(argv=None) -> int:
    args = parse_args(argv)
    progress = not args.no_progress
    try:  # every input error below is a ValueError (QADataError, EvalError, CorpusError) or a missing file
        checkpoint_kind(args.checkpoint)
        datasets = load_datasets(
            args.datasets, args.limit, args.sample, args.sample_seed
        )  # before the heavy imports: bad input fails fast
        from jaxsearch.eval import evaluate as ev
        from jaxsearch.files import claim_output_dir

        # results written before the marker file: their run.json
        claim_output_dir(args.out, "--out", legacy=[("run.json",)])
        ev.claim_out_dir(args.out, settings(args), args.datasets)
        todo = sum(map(len, ev.pending(args.out, datasets).values()))
        summary = run(args, datasets, progress) if todo else ev.write_summary(args.out, datasets)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(ev.markdown_table(summary), end="")
    print(f"evaluated {todo} new examples; results in {args.out} (results.md, summary.json, <dataset>.jsonl)")
    return 0


def load_datasets(paths: dict[str, str], limit: int, sample: str = "first", seed: int = 0) -> dict:
    """name -> `limit` (0: all) examples of its QA file (`qa.eval_subset`); (data_source, id) must be unique
    (records are keyed by it)."""
    import collections

    from jaxsearch.data import qa

    datasets = {}
    for name, path in paths.items():
        datasets[name] = qa.eval_subset(qa.load_examples(path), limit, sample, seed)
        counts = collections.Counter(ex.key for ex in datasets[name])
        repeated = [key for key, n in counts.items() if n > 1]
        if repeated:
            source, example_id = repeated[0]
            where = f"id {example_id!r}" + ("" if source is None else f" in data_source {source!r}")
            raise qa.QADataError(f"{path}: duplicate example {where} ({len(repeated)} repeated in all)")
    return datasets


def run(args, datasets, progress: bool) -> dict:
    """Load the policy, retriever(s), encoder and judge, then evaluate the missing examples."""
    from jaxsearch import parallel
    from jaxsearch.agent.build import build_engine, build_retriever
    from jaxsearch.config import RetrieverConfig
    from jaxsearch.eval import evaluate as ev
    from jaxsearch.agent.policy import load_policy
    from jaxsearch.retrieval.corpus import Corpus
    from jaxsearch.scoring.judge import chat_judge

    mesh = parallel.make_mesh({"fsdp": -1})
    config, params = load_policy(model_config(args), args.seed, mesh)
    if args.protocol == "eka_infer":  # the authors' inference loop (re-templates each call: evaluation only)
        from jaxsearch.agent.eka_infer import build_eka_infer

        engine = build_eka_infer(agent_config(args), config, mesh, eka_infer_initial_k(args))
    else:
        engine = build_engine(agent_config(args), config, mesh, evaluation=True)
    gold_corpus, encoder = None, None
    examples = [ex for exs in datasets.values() for ex in exs]
    if args.rs_encoder != "none" and any(ex.supporting_ids for ex in examples):
        gold_corpus = getattr(engine.retriever, "corpus", None)
        if gold_corpus is None and args.corpus:
            gold_corpus = Corpus(args.corpus, progress=progress)
    # R-S needs gold text: supporting passages of a corpus, or Graph-R1 rows' own `context`
    if args.rs_encoder != "none" and (gold_corpus is not None or any("context" in ex.metadata for ex in examples)):
        from jaxsearch.retrieval.encoders import Encoder

        encoder = Encoder(args.rs_encoder)
    return ev.evaluate(
        engine,
        params,
        datasets,
        args.out,
        batch_size=args.batch_size,
        seed=args.seed,
        gold_corpus=gold_corpus,
        rs_encoder=encoder,
        include_initial=not args.exclude_p0,
        progress=progress,
        use_data_prompt=not args.builtin_prompt,
        judge=chat_judge(judge_config(args)),
        retrievers={  # R-Search: datasets searched in their own corpora
            name: build_retriever(RetrieverConfig("remote", None, None, url, None))
            for name, url in ev.dataset_urls(args.dataset_url, datasets).items()
        },
    )


if __name__ == "__main__":
    sys.exit(main())
