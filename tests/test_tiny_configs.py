"""The tiny-world configs: each builds and runs a shortened main job; the SFT data options (early stop, SFT
questions), the dev+test held-out file, and the world's rule-based judge and evidence reader on hand cases."""

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxsearch.agent.build import build_protocol
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.data import qa
from jaxsearch.agent.sft_traces import early_stop_trace, sft_dataset
from jaxsearch.data.world.generator import generate_world, world_config
from jaxsearch.data.world.oracle import read_answer, read_facts, solution_trace
from jaxsearch.scoring.world_chat import WorldChatModel
from jaxsearch.rl import pipeline
from jaxsearch.scoring import rewards
from hang import HANG_S

SEARCH_R1 = get_protocol("search_r1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the configs package
TRAIN = os.path.join(ROOT, "launch", "train.py")
SHORT = [  # 10 SFT steps, 2 RL steps of 2 x 2 rows, 4 held-out questions at steps 0 and 2, a 1-layer model
    "--progress=false",
    "--config.total_steps=2",
    "--config.eval_every=2",
    "--config.save_every=2",
    "--config.sft.steps=10",
    "--config.data.batch_size=2",
    "--config.data.group_size=2",
    "--config.data.eval_examples=4",
    "--config.rollout.max_turns=2",
    "--config.rollout.max_segment_tokens=24",
    "--config.model.hidden_size=32",  # a smaller model: the test is about the config's wiring, not its size
    "--config.model.intermediate_size=64",
    "--config.model.num_hidden_layers=1",
]


@pytest.fixture(scope="module")
def world():
    return generate_world(world_config("tiny", seed=0))


# tiny_cpu itself runs in tests/test_notebooks.py and tests/test_trainer.py
@pytest.mark.slow  # started first under pytest-xdist (conftest), the longest job first
@pytest.mark.parametrize(
    "name", ["tiny_cpu_eka_graphr1", "tiny_cpu_eka", "tiny_cpu_soar", "tiny_cpu_ppo", "tiny_cpu_rsearch"]
)
def test_tiny_config_runs_a_shortened_main_job(name, tmp_path):
    workdir = str(tmp_path / name)
    config = os.path.join(ROOT, "configs", f"{name}.py")
    extra = ["--config.data.batch_size=4", "--config.data.group_size=1"] if name == "tiny_cpu_ppo" else []
    env = dict(os.environ, XLA_FLAGS="")  # one CPU device: the config's own mesh
    done = subprocess.run(
        [sys.executable, TRAIN, f"--config={config}", f"--workdir={workdir}", *SHORT, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "eval/synthetic/em:" in done.stdout and "at step 0 ->" in done.stdout
    assert os.path.exists(os.path.join(workdir, "sft", "params", "config.json"))
    stage = "ppo" if name == "tiny_cpu_ppo" else "grpo"  # a PPO run writes under its own name
    rows = [json.loads(line) for line in open(os.path.join(workdir, stage, "metrics.jsonl"))]
    assert not os.path.exists(os.path.join(workdir, "grpo" if stage == "ppo" else "ppo"))
    evals = [r for r in rows if "eval/synthetic/em" in r]
    assert [r["step"] for r in evals] == [0, 2]
    last = evals[-1]
    assert 0 <= last["eval/synthetic/recall"] <= 1
    assert 0 <= last["eval/synthetic/fabrication_rate"] <= 1  # tiny_cpu's rule-based judge
    assert rows[-1]["step"] == 2
    if name == "tiny_cpu_ppo":
        assert "critic/vf_loss" in rows[-1]
    # each reward term is logged apart, and the config's weighted sum of them is the logged reward
    terms = importlib.import_module(f"configs.{name}").get_config().reward.terms
    trained = [r for r in rows if "reward" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for row in trained:
        assert {k for k in row if k.startswith("reward/")} == {f"reward/{t}" for t, _ in terms}
        np.testing.assert_allclose(sum(w * row[f"reward/{t}"] for t, w in terms), row["reward"], atol=1e-6)
    # the held-out set is dev then test (4 questions here); RL trains on the questions SFT did not see
    held_out = qa.load_examples(os.path.join(workdir, "world", "dev+test.jsonl"))
    assert [e.id for e in held_out[:2]] == ["dev_0", "dev_1"] and held_out[50].id == "test_0"
    if name.endswith("graphr1"):  # the world's hypergraph was built, and the RL stage searched it
        hypergraph = os.path.join(workdir, "world", "hypergraph")
        assert os.path.exists(os.path.join(hypergraph, "meta.json"))
        ran = json.load(open(os.path.join(workdir, "config.json")))
        assert (ran["retriever"]["kind"], ran["retriever"]["index"]) == ("hypergraph", hypergraph)


def test_early_stop_trace_answers_with_the_first_hop(world):
    # "Who employs the spouse of the author of The Hour of Shelai?": the author is Nouvei Broutros
    # (passage 198: "The Hour of Shelai is a novel written by Nouvei Broutros.")
    question = next(q for q in world.questions["train"] if "The Hour of Shelai" in q.question)
    assert question.question == "Who employs the spouse of the author of The Hour of Shelai?"
    trace = early_stop_trace(solution_trace(question, world))
    assert [(s.action, s.text) for s in trace] == [
        ("search", "The Hour of Shelai novel written wrote author"),
        ("answer", "Nouvei Broutros"),
    ]


@pytest.fixture(scope="module")
def sft_inputs(world, tmp_path_factory):
    from jaxsearch.agent.sft_traces import build_world_tokenizer
    from jaxsearch.retrieval.factory import make_retriever

    out = tmp_path_factory.mktemp("world")
    world.write(out)
    retriever = make_retriever("bm25", corpus=str(out / "corpus.jsonl"), progress=False)
    return build_world_tokenizer(world), retriever


def test_sft_dataset_carries_the_early_stop_mistake_of_chain_questions(world, sft_inputs):
    tokenizer, retriever = sft_inputs
    args = (world, "train", SEARCH_R1, tokenizer, retriever, 1, 10_000)
    plain = sft_dataset(*args, questions=20)
    with_mistakes = sft_dataset(*args, mistake="early_stop", questions=20)
    assert len(plain) == len(with_mistakes) == 20 and all(e.mistake is None for e in plain)
    types = [q.metadata["type"] for q in world.questions["train"][:20]]
    assert "bridge" in types or "compositional" in types
    for kind, a, b in zip(types, plain, with_mistakes):
        assert (a.ids, a.loss_mask, a.prompt_len) == (b.ids, b.loss_mask, b.prompt_len)
        if kind in ("bridge", "compositional"):  # the same prompt, one search, then an answer
            m = b.mistake
            assert m.ids[: m.prompt_len] == a.ids[: a.prompt_len]
            assert tokenizer.decode(m.ids[m.prompt_len :]).count("</search>") == 1 and len(m.ids) < len(a.ids)
        else:
            assert b.mistake is None


def test_p0_trace_skips_the_leading_searches_that_p0_holds(world, sft_inputs):
    """EKA's mechanism in SFT (sft.use_p0): the ideal trace does not search for what P0 already shows."""
    from jaxsearch.agent.sft_traces import p0_trace
    from jaxsearch.data.world.oracle import Step, solution_trace

    a, b, c = (Step("search", f"q{i}", passage_id=f"p{i}") for i in range(3))
    answer = Step("answer", "x")
    assert p0_trace([a, b, c, answer], {"p0"}) == [b, c, answer]
    assert p0_trace([a, b, c, answer], {"p0", "p1", "p2"}) == [answer]  # P0 answers it: no search
    assert p0_trace([a, b, c, answer], {"p1"}) == [a, b, c, answer]  # only a leading run is skipped
    tokenizer, retriever = sft_inputs
    args = (world, "train", get_protocol("eka"), tokenizer, retriever, 1, 10_000)
    plain, with_p0 = sft_dataset(*args, questions=12), sft_dataset(*args, questions=12, use_p0=True)
    p0 = retriever.search([q.question for q in world.questions["train"][:12]], 1)
    skipped = 0
    for question, docs, x, y in zip(world.questions["train"], p0, plain, with_p0):
        assert x.ids[: x.prompt_len] == y.ids[: y.prompt_len]  # the same prompt, P0 included
        searches = [s for s in solution_trace(question, world) if s.action == "search"]
        lead = searches[0].passage_id == docs[0].id and len(searches) > 0
        n_x, n_y = (tokenizer.decode(e.ids[e.prompt_len :]).count("</search>") for e in (x, y))
        assert n_y == n_x - lead
        skipped += lead
    assert skipped > 0
    with pytest.raises(ValueError, match="use_p0 is EKA's"):
        sft_dataset(world, "train", SEARCH_R1, tokenizer, retriever, 1, 10_000, questions=2, use_p0=True)


def test_sft_dataset_verbose_answer_mistake_differs_only_in_the_answer_tag(world, sft_inputs):
    from jaxsearch.scoring.metrics import exact_match, f1_score
    from jaxsearch.scoring.rewards import extract_answer

    tokenizer, retriever = sft_inputs
    args = (world, "train", SEARCH_R1, tokenizer, retriever, 1, 10_000)
    plain = sft_dataset(*args, questions=12)
    verbose = sft_dataset(*args, mistake="verbose_answer", questions=12)
    for question, a, b in zip(world.questions["train"], plain, verbose):
        gold = question.golden_answers[0]
        right, wrong = (tokenizer.decode(x.ids[x.prompt_len : -1]) for x in (a, b.mistake))
        # the same searches and observations; only the answer tag's text differs
        assert right.endswith(f"<answer> {gold} </answer>")
        assert wrong == right[: -len(f"{gold} </answer>")] + f"The answer is {gold}. </answer>"
        assert b.mistake.loss_mask[-1] == 1 and b.mistake.ids[-1] == tokenizer.eos_id
        # exact match scores the sentence 0, F1 gives it partial credit
        assert extract_answer(right) == gold and exact_match(extract_answer(wrong), [gold]) == 0
        assert 0 < f1_score(extract_answer(wrong), [gold]) < 1


def test_sft_dataset_no_search_mistake_answers_another_questions_answer(world, sft_inputs):
    tokenizer, retriever = sft_inputs
    train = world.questions["train"]
    examples = sft_dataset(world, "train", SEARCH_R1, tokenizer, retriever, 1, 10_000, mistake="no_search")
    assert len(examples) == 400 and all(e.mistake is not None for e in examples)
    for i in (0, 7, 399):
        other = (i + 1 + int(np.random.default_rng([i]).integers(399))) % 400
        assert other != i
        guess = train[other].golden_answers[0]
        m = examples[i].mistake
        assert m.ids[: m.prompt_len] == examples[i].ids[: examples[i].prompt_len]
        assert (
            tokenizer.decode(m.ids[m.prompt_len : -1])
            == f"<think> The answer is {guess}. </think>\n<answer> {guess} </answer>"
        )
        assert m.ids[-1] == tokenizer.eos_id and m.loss_mask[m.prompt_len :] == [1] * (
            len(m.ids) - m.prompt_len
        )
    with pytest.raises(ValueError, match="unknown SFT mistake 'guess'"):
        sft_dataset(world, "train", SEARCH_R1, tokenizer, retriever, 1, 10_000, mistake="guess")


def test_sft_batches_draw_the_mistake_at_its_share_each_epoch():
    from jaxsearch.agent.sft_traces import SFTExample, sft_batches

    wrong = SFTExample([3], [1], 0)
    examples = [SFTExample([1, 2], [0, 1], 1, mistake=wrong), SFTExample([4, 5], [0, 1], 1)]

    def rows(share, n):  # the first token of each row of n batches of 2 (one epoch each)
        batches = sft_batches(examples, 2, 4, seed=0, mistake_share=share)
        return [sorted(int(x) for x in next(batches)[0][:, 0]) for _ in range(n)]

    assert rows(0.0, 5) == [[1, 4]] * 5
    assert rows(1.0, 5) == [[3, 4]] * 5
    draws = rows(0.6, 400)
    assert all(r in ([1, 4], [3, 4]) for r in draws)
    assert 0.5 < sum(r == [3, 4] for r in draws) / 400 < 0.7  # redrawn every epoch, 60% of the time


def test_sft_batches_pad_to_the_longest_example_rounded_up():
    from jaxsearch.agent.sft_traces import SFTExample, sft_batches

    examples = [SFTExample(list(range(1, n + 1)), [0] + [1] * (n - 1), 1) for n in (3, 5, 9, 12)]
    widths = {next(sft_batches(examples, 2, 16, seed=s, pad_multiple=4))[0].shape[1] for s in range(20)}
    assert widths <= {8, 12} and len(widths) == 2  # pairs of (3|5|9|12) tokens: rounded up to 8 or 12
    ids, attention, loss = next(sft_batches(examples, 4, 16, seed=0, pad_multiple=8))
    assert ids.shape == (4, 16)  # the 12-token example: 16 (and never more than max_len)
    assert sorted(attention.sum(1).tolist()) == [3, 5, 9, 12] and loss.sum() == 3 + 5 + 9 + 12 - 4
    assert next(sft_batches(examples, 4, 14, seed=0, pad_multiple=8))[0].shape == (4, 14)
    assert next(sft_batches(examples, 4, 16, seed=0))[0].shape == (4, 16)  # off: max_len


TINY_CONFIGS = ["tiny_cpu", "tiny_cpu_eka", "tiny_cpu_soar", "tiny_cpu_rsearch"]
TINY_CONFIGS += ["tiny_cpu_graphr1", "tiny_cpu_eka_graphr1"]


@pytest.fixture(scope="module")
def shared_workdir(tmp_path_factory):
    """One workdir for the configs of one world: its files and hypergraph are written once."""
    return str(tmp_path_factory.mktemp("shared_workdir"))


@pytest.mark.parametrize("name", TINY_CONFIGS)
def test_tiny_configs_sft_traces_are_what_the_rl_stage_prompts_runs_and_parses(name, shared_workdir):
    """The SFT start learns the RL stage's own agent: every training question's trace (under the config's
    protocol, tags included, and its retriever) begins with the prompt the RL engine builds for the question,
    fits sft.max_len and rollout.cache_len, keeps each policy segment and observation within the rollout's
    limits (a cut segment loses its stop tag, a cut Graph-R1 observation its reopened <think>), and its
    segments parse under the RL protocol as the trace's searches and then its answer. Graph-R1's reward scores
    such a trace 1."""
    from jaxsearch import parallel
    from jaxsearch.agent.build import build_engine, build_retriever, load_tokenizer
    from jaxsearch.config import RunConfig
    from jaxsearch.agent.sft_traces import p0_trace
    from jaxsearch.agent.policy import model_config

    cfg = RunConfig.from_dict(importlib.import_module(f"configs.{name}").get_config())
    cfg = pipeline.prepare_world(cfg, shared_workdir)
    world = generate_world(world_config(cfg.world.size, cfg.world.seed))
    protocol, tokenizer = build_protocol(cfg.protocol), load_tokenizer(cfg.tokenizer)
    retriever, r = build_retriever(cfg.retriever), cfg.rollout
    traces = sft_dataset(world, "train", protocol, tokenizer, retriever, r.retrieval_k, 100_000)
    questions = world.questions["train"]
    assert len(traces) == len(questions) == 400
    assert max(len(e.ids) for e in traces) <= min(cfg.sft.max_len, r.cache_len)

    engine = build_engine(cfg, model_config(cfg.model), parallel.make_mesh({"fsdp": -1}))
    rows = engine._start_rows([q.question for q in questions[:8]], None, {"retrieval": 0.0})
    assert [e.ids[: e.prompt_len] for e in traces[:8]] == [row.prompt for row in rows]

    for question, trace in zip(questions, traces):
        mask = trace.loss_mask[trace.prompt_len : -1]  # the final EOS apart
        ids = trace.ids[trace.prompt_len : -1]
        cuts = [0] + [t for t in range(1, len(mask)) if mask[t] != mask[t - 1]] + [len(mask)]
        runs = [(mask[a], ids[a:b]) for a, b in zip(cuts, cuts[1:])]
        policy = [tokenizer.decode(run) for is_policy, run in runs if is_policy]
        assert max(len(run) for is_policy, run in runs if is_policy) <= r.max_segment_tokens
        assert max((len(run) for is_policy, run in runs if not is_policy), default=0) <= r.max_obs_tokens
        steps = solution_trace(question, world)
        if cfg.sft.use_p0:
            steps = p0_trace(steps, {d.id for d in retriever.search([question.question], r.retrieval_k)[0]})
        actions = [protocol.parse_action(text) for text in policy]
        assert [(a.kind, a.content) for a in actions] == [
            ("search" if s.action == "search" else "answer", s.text) for s in steps
        ]
        if protocol.segment_tags.get("<query>") == "search":  # Graph-R1's tags
            response = tokenizer.decode(trace.ids[trace.prompt_len :])
            assert rewards.graph_r1_score(response, question.golden_answers) == 1.0


def test_rl_train_file_leaves_out_the_sft_questions(world, tmp_path):
    world.write(tmp_path)
    path = pipeline.rl_train_file(str(tmp_path), 150)
    rows = qa.load_examples(path)
    assert len(rows) == 250 and rows[0].id == "train_150"
    with pytest.raises(ValueError, match="sft.questions=400"):
        pipeline.rl_train_file(str(tmp_path), 400)
    with pytest.raises(ValueError, match="unknown split 'val'"):
        pipeline.held_out_file(str(tmp_path), "dev+val")


def test_reader_answers_from_the_evidence_alone():
    evidence = (
        "Velmar Rising is a film directed by Tobu Kes. Tobu Kes was born on 3 May 1850. "
        "Ana Kes married Tobu Kes. Tobu Kes was born in Drath. The birthplace of Ana Kes is Drath. "
        "Something else entirely."
    )
    assert read_facts(evidence)[:3] == [
        ("Velmar Rising", "directed_by", "Tobu Kes"),
        ("Tobu Kes", "birth_date", "3 May 1850"),
        ("Ana Kes", "spouse_of", "Tobu Kes"),
    ]
    assert read_answer("Where was the director of Velmar Rising born?", evidence) == "Drath"
    assert read_answer("Who directed Velmar Rising?", evidence) == "Tobu Kes"
    assert read_answer("Were Tobu Kes and Ana Kes born in the same city?", evidence) == "yes"
    assert read_answer("Who was born first, Tobu Kes or Ana Kes?", evidence) == ""  # no date for Ana Kes
    assert read_answer("Who founded Kes Guild?", evidence) == ""
    assert read_answer(
        "Who is older, Tobu Kes or Ana Kes?", evidence + " Ana Kes was born on 1 May 1849."
    ) == ("Ana Kes")
    # evidence is model-written: a date slot holding other words is no date, not a crash
    for date in ("Fesougum", " "):
        assert (
            read_answer("Who is older, Tobu Kes or Ana Kes?", evidence + f" Ana Kes was born on {date}.")
            == ""
        )


def test_world_judge_grounded_when_the_answer_was_retrieved():
    from jaxsearch.agent.protocols import GRAPH_R1_OBSERVATION
    from jaxsearch.retrieval.base import Doc, graph_r1_result_string
    from jaxsearch.scoring.judge import ChatJudge

    grounded = "<search> q </search>\n<information>Doc 1 Tobu Kes was born in Drath.</information>\n<answer> Drath </answer>"
    invented = "<think> I know it. </think>\n<answer> Drath </answer>"
    not_in_docs = "<search> Drath </search>\n<information>nothing</information>\n<answer> Drath </answer>"
    # Graph-R1's observations: the search server's JSON in a <knowledge> user turn
    fact = [Doc("0", "", "Tobu Kes was born in Drath.")]
    knowledge = GRAPH_R1_OBSERVATION.format(knowledge=graph_r1_result_string(fact))
    graph_query = '<think>\nq\n</think>\n<query>\n{"query": "Tobu Kes"}\n</query>'
    graph_grounded = f"{graph_query}{knowledge}Drath.\n</think>\n<answer>\nDrath\n</answer>"
    graph_invented = graph_grounded.replace("Drath.\"", "Kesville.\"")
    responses = (grounded, invented, not_in_docs, graph_grounded, graph_invented)
    samples = [rewards.RewardInput(r, ["Drath"], "Where was Tobu Kes born?") for r in responses]
    scores = rewards.judge_fabrication(ChatJudge(WorldChatModel()), samples)
    assert scores.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]


def test_world_reader_behind_r_search_evidence_reward():
    from jaxsearch.scoring.judge import ChatEvidenceAnswerer

    response = "<information>x</information>\n<evidence> Tobu Kes was born in Drath. </evidence>\n<answer> Drath </answer>"
    samples = [rewards.RewardInput(response, ["Drath"], "Where was Tobu Kes born?")]
    reward = rewards.evidence_reward(ChatEvidenceAnswerer(WorldChatModel()))
    assert reward(samples).tolist() == [1.0]
