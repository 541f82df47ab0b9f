"""Training-free EKA as its authors run it (issue 39, 8(a)): jaxsearch/agent/eka_infer.py and launch/eval.py
--protocol eka_infer, against yxzwang/EarlyKnowledgeAlignment `agent/vllm_infer/EKA_infer.py` and
`agent/tool/tool_env.py`.

Expected strings come from running the authors' functions, extracted unchanged from those files into a scratch
script outside the repository: `build_system_prompt`, `process_tool_call`, `execute_tool_calls_batch`,
`extract_answer_from_text`, `ToolEnv.extract_tool_call`, and `run_single_example` with vLLM replaced by a
client returning the scripted replies below and their search server by a stub answering each query q with
json.dumps({"results": [{"<knowledge>": f"about {q}", "<coherence>": 1.0}]}) (script_api.py's reply format).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jinja2.sandbox
import numpy as np
import pytest
from test_tokenizer import QWEN25_CHAT_TEMPLATE

from jaxsearch.agent import eka_infer as E
from jaxsearch.agent.sampler import STOP_BUDGET, Sampler, SamplingParams, SegmentResult, StopTable
from jaxsearch.models.tokenizer import QwenTokenizer
from jaxsearch.retrieval.base import Doc, graph_r1_result_string

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Who directed Jaws?"
P0 = ["Jaws is a 1975 film.", "Steven Spielberg directed Jaws."]

# ------------------------------------------------------------------------------------------- their text

# build_system_prompt(QUESTION, ...): the instruction and question every case below starts with
THEIR_HEAD = (
    "<|im_start|>system\n"
    "Answer the given question.\n"
    "You must always first do your reasoning inside <think>...</think>.\n"
    "If you need external information, after finishing a <think> block you may call the search "
    "tool by outputting a <query>...</query> block that contains a JSON object with a single "
    'field "query".\n'
    "The environment will execute the search and return the top results wrapped in "
    "<knowledge>...</knowledge>. You can repeat this process and call the tool multiple times.\n"
    "When you have enough information to answer, stop calling the tool and output your final "
    "reasoning in <think>...</think> followed by the final answer in <answer>...</answer>.\n"
    "\n"
    "Output format for tool call:\n"
    "<think>\n"
    "...\n"
    "</think>\n"
    "<query>\n"
    "{\n"
    '  "query": "..."\n'
    "}\n"
    "</query>\n"
    "\n"
    "Output format for answer:\n"
    "<think>\n"
    "...\n"
    "</think>\n"
    "<answer>\n"
    "...\n"
    "</answer>\n"
    "\n"
    "Question: Who directed Jaws?\n"
)
# build_system_prompt(QUESTION, [])  (also what it returns for [""]: the P0 lines join to "")
PROMPT_NO_P0 = THEIR_HEAD + (
    "<|im_end|>\n"
    "<|im_start|>assistant\n"
)
# build_system_prompt(QUESTION, P0)
PROMPT_P0 = THEIR_HEAD + (
    "\n"
    "The following initial knowledge may be useful. It is given to you before any tool calls "
    "and is wrapped in <knowledge> tags.\n"
    "<knowledge>\n"
    "Jaws is a 1975 film.\n"
    "Steven Spielberg directed Jaws.\n"
    "</knowledge>\n"
    "<|im_end|>\n"
    "<|im_start|>assistant\n"
)
# build_system_prompt(QUESTION, ["", ""]): the lines join to "\n", so the block is there, empty
PROMPT_TWO_EMPTY = THEIR_HEAD + (
    "\n"
    "The following initial knowledge may be useful. It is given to you before any tool calls "
    "and is wrapped in <knowledge> tags.\n"
    "<knowledge>\n"
    "\n"
    "\n"
    "</knowledge>\n"
    "<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_prompt_is_theirs_byte_for_byte():
    assert E.build_prompt(QUESTION, []) == PROMPT_NO_P0
    assert E.build_prompt(QUESTION, [""]) == PROMPT_NO_P0
    assert E.build_prompt(QUESTION, P0) == PROMPT_P0
    assert E.build_prompt(QUESTION, ["", ""]) == PROMPT_TWO_EMPTY


# their process_tool_call([reply]) -> (processed, active); ours leaves out the "<|im_end|>" it appends
CUT_CASES = [
    ("<think>\nx\n</think>\n<answer>\nParis\n</answer>", "<think>\nx\n</think>\n<answer>\nParis\n</answer>",
     False),
    ('<query>\n{"query": "a"}\n</query>\n<knowledge>made up</knowledge>', '<query>\n{"query": "a"}\n</query>',
     True),
    ('I wrote </query> first, then <query>{"query": "late"}</query> tail', "I wrote </query>", True),
    ("<query>a</query></query>", "<query>a</query>", True),
    ("no tags at all", "no tags at all", False),
    ("</query> only a close", "</query> only a close", False),
]  # fmt: skip

# ToolEnv.extract_tool_call(text) -> its args["query"], or None for their INVALID_ACTION
PARSE_CASES = [
    ('<query>\n{"query": "a b"}\n</query>', "a b"),
    ('<query>{"query": 5}</query>', "5"),
    ('<query>{"q": "x"}</query>', None),
    ('<query>"the query"</query>', None),
    ('<query>["query"]</query>', None),
    ('<query>{"query": null}</query>', "None"),
    ('<query>{"query": ["x", "y"]}</query>', "['x', 'y']"),
    ('<query>{"query": "a"} trailing</query>', None),
    ('<query>{"query": "first"}</query><query>{"query": "second"}</query>', "first"),
    ('<query>{"query": "caf\\u00e9"}</query>', "café"),
    ("no block", None),
]

# extract_answer_from_text(text)
ANSWER_CASES = [
    ("<think>\na\n</think>\n<answer>\n Paris \n</answer>", "Paris"),
    ("<think>x</think>\n  Paris, France  ", "Paris, France"),
    ("just text  ", "just text"),
    ("<answer>a</answer><answer>b</answer>", "a"),
    ("<think>x</think> <think>y</think> z", "<think>y</think> z"),
]

# execute_tool_calls_batch: the text after a call whose search server answered this string
KNOWLEDGE = '{"results": [{"<knowledge>": "about x", "<coherence>": 1.0}]}'
KNOWLEDGE_TURN = (
    '<|im_start|>user\n<knowledge>\n{"results": [{"<knowledge>": "about x", "<coherence>": 1.0}]}\n'
    "</knowledge><|im_end|>\n<|im_start|>assistant\n<think>"
)


def test_reply_rules_are_theirs():
    for reply, kept, is_call in CUT_CASES:
        assert E.cut_reply(reply) == (kept, is_call)
    for text, query in PARSE_CASES:
        assert E.parse_query(text) == query
    for text, answer in ANSWER_CASES:
        assert E.extract_answer(text) == answer
    # process_tool_call's "<|im_end|>", then their template around the knowledge
    assert E.knowledge_turn(KNOWLEDGE) == "<|im_end|>" + KNOWLEDGE_TURN
    # the search server's reply string for a passage "about x" of score 1 (script_api.py json.dumps)
    assert graph_r1_result_string([Doc.from_contents("d", "about x", 1.0)]) == KNOWLEDGE


def test_one_user_message_under_qwens_chat_template():
    """vLLM's chat API renders [{"role": "user", "content": prompt}] with Qwen2.5's template (default system
    turn, generation prompt) and its tokenizer reads the special-token text in the content as those tokens."""
    tok = QwenTokenizer()
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # transformers'
    expected = env.from_string(QWEN25_CHAT_TEMPLATE).render(
        messages=[{"role": "user", "content": PROMPT_P0}], add_generation_prompt=True
    )
    assert E.chat_text(tok, PROMPT_P0) == expected
    assert expected.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    # HF's added-token split: the special tokens' text first, the text between them encoded as ordinary text
    specials = {"<|im_start|>": 151644, "<|im_end|>": 151645}
    pieces = re.split(r"(<\|im_start\|>|<\|im_end\|>)", expected)
    ids = [t for piece in pieces for t in ([specials[piece]] if piece in specials else tok.encode(piece))]
    agent = E.EkaInferAgent(tok, None, None, 1, 1, 1, 0)
    assert agent._prompt_ids(PROMPT_P0) == ids
    assert ids.count(151644) == 5  # the template's system, user, assistant turns; two typed into the content
    # a reply as vLLM returns it (skip_special_tokens): Qwen2.5's tokenizer_config.json marks ids 151643-151656
    # "special" (dropped) and <tool_call> (151657) not (kept); the EOS that ended the reply is dropped too
    reply = tok.encode("a") + [151644, 151657] + tok.encode(" b") + [151643, 151645]
    assert agent._reply_text(reply) == "a<tool_call> b"


# ------------------------------------------------------------------------------------------- the loop

# The scripted replies of each chat call (the first decodes past its </query>, the second's query is not JSON,
# the third closes a </query> before its <query>) and, from their run_single_example on them with P0, the text
# each call added to the user message: call k+1's message is PROMPT_P0 + ADDED[0] + ... + ADDED[k]; the last
# entry ends the text their answer rule reads (they searched ["Jaws director"] only).
SCRIPT = [
    (
        '<think>\nI should search.\n</think>\n<query>\n{\n  "query": "Jaws director"\n}\n</query>\n'
        "<knowledge>made up</knowledge>"
    ),
    "ok</think>\n<query>not json</query>",
    'I wrote </query> first, then <query>{"query": "late"}</query>',
    "\nSpielberg directed it.\n</think>\n<answer>\nSteven Spielberg\n</answer>",
]
ADDED = [
    (
        "<think>\n"
        "I should search.\n"
        "</think>\n"
        "<query>\n"
        "{\n"
        '  "query": "Jaws director"\n'
        "}\n"
        "</query><|im_end|><|im_start|>user\n"
        "<knowledge>\n"
        '{"results": [{"<knowledge>": "about Jaws director", "<coherence>": 1.0}]}\n'
        "</knowledge><|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    (
        "ok</think>\n"
        "<query>not json</query><|im_end|><|im_start|>user\n"
        "<knowledge>\n"
        'Invalid tool call format. Please use <query>{"query": "statement"}</query> format.\n'
        "</knowledge><|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    (
        "I wrote </query><|im_end|><|im_start|>user\n"
        "<knowledge>\n"
        'Invalid tool call format. Please use <query>{"query": "statement"}</query> format.\n'
        "</knowledge><|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>"
    ),
    "\nSpielberg directed it.\n</think>\n<answer>\nSteven Spielberg\n</answer><|im_end|>",
]


class ScriptSampler:
    """The `Sampler` interface over scripted replies: the k-th `start` begins call k, in which row b writes
    scripts[b][k] then EOS (a model writing to its end of turn). A decode call stops at the token that
    completes `</query>`, at EOS or at its budget (min(budget, max_segment)); the next one goes on where it
    stopped, as the real sampler's cache does. `prompts[b]` holds the prompt text of each call row b made."""

    def __init__(self, tok, scripts, cache_len=8192, max_segment=4096):
        self.tok, self.scripts = tok, [list(s) for s in scripts]
        self.cache_len, self.max_segment = cache_len, max_segment
        self.prompts = [[] for _ in scripts]
        self.pending = [[] for _ in scripts]

    def start(self, params, prompts, keys):
        self.started = [list(p) for p in prompts]
        self.fresh = [True] * len(prompts)

    def decode(self, params, state, budget):
        budget = np.minimum(np.broadcast_to(np.asarray(budget), (len(self.scripts),)), self.max_segment)
        rows = []
        for b, limit in enumerate(budget):
            ids, stop = [], STOP_BUDGET
            if limit > 0 and self.fresh[b]:  # the call's first decode: its reply begins
                self.fresh[b] = False
                self.prompts[b].append(self.tok.decode(self.started[b]))
                self.pending[b] = self.tok.encode(self.scripts[b].pop(0)) + [self.tok.eos_id]
            while limit > 0 and self.pending[b] and len(ids) < limit:
                ids.append(self.pending[b].pop(0))
                if ids[-1] == self.tok.eos_id:
                    stop = 1
                    break
                if "</query>" in self.tok.decode(ids):
                    stop = 0
                    break
            rows.append((ids, stop))
        width = max(1, max(len(ids) for ids, _ in rows))
        tokens = np.zeros((len(rows), width), np.int32)
        for b, (ids, _) in enumerate(rows):
            tokens[b, : len(ids)] = ids
        zeros = np.zeros(tokens.shape, np.float32)
        lengths = np.asarray([len(ids) for ids, _ in rows], np.int32)
        return SegmentResult(tokens, zeros, zeros, lengths, np.asarray([s for _, s in rows])), state


class StubSearch:
    """The scratch run's search server: one passage "about q" (score 1) per query; P0 from `initial` docs."""

    def __init__(self, initial=()):
        self.queries, self.initial = [], list(initial)

    def search(self, queries, k):
        if self.initial:
            docs = [Doc.from_contents(f"p{j}", text, 1.0) for j, text in enumerate(self.initial[:k])]
            return [docs] * len(queries)
        self.queries += list(queries)
        return [[Doc.from_contents(f"d{len(self.queries)}", f"about {q}", 1.0)] for q in queries]


@pytest.fixture(scope="module")
def qwen():
    return QwenTokenizer()


def scripted_agent(tok, scripts, max_turns=20, max_tokens=4096, **sampler_kw):
    return E.EkaInferAgent(
        tok,
        StubSearch(),
        ScriptSampler(tok, scripts, **sampler_kw),
        max_turns=max_turns,
        max_tokens=max_tokens,
        retrieval_k=1,
        initial_k=2,
        initial_retriever=StubSearch(P0),
    )


def test_each_call_re_templates_their_accumulated_text(qwen):
    agent = scripted_agent(qwen, [SCRIPT])
    traj = agent.rollout(None, [QUESTION], 0)
    messages = [PROMPT_P0 + "".join(ADDED[:k]) for k in range(len(SCRIPT))]
    assert agent.sampler.prompts[0] == [E.chat_text(qwen, m) for m in messages]
    assert agent.retriever.queries == ["Jaws director"]  # the invalid calls search nothing
    # their answer rule on the last reply (their script reads the whole text and returns "...": its prompt's)
    assert traj.answers == ["Steven Spielberg"]
    assert (int(traj.turns[0]), int(traj.searches[0]), bool(traj.truncated[0])) == (4, 1, False)
    assert traj.responses[0] == "".join(ADDED)  # the text their answer rule read, after the prompt
    assert traj.tokens[0, : traj.prompt_lengths[0]].tolist() == qwen.encode(
        E.chat_text(qwen, PROMPT_P0), allow_special=True
    )
    assert [d.contents for d in traj.initial_docs[0]] == P0 and traj.queries == [["Jaws director"]]


def test_the_turn_cap_and_the_tokens_per_call(qwen):
    # their run_single_example with max_turns=2 on two query replies: 2 calls, prediction "" (it searched
    # twice; the second search's knowledge is never shown, and we skip it)
    agent = scripted_agent(qwen, [SCRIPT[:1] * 3], max_turns=2)
    traj = agent.rollout(None, [QUESTION], 0)
    assert len(agent.sampler.prompts[0]) == 2 and agent.retriever.queries == ["Jaws director"]
    assert traj.answers == [None] and int(traj.turns[0]) == 2
    # max_tokens 12 over decode calls of at most 5 tokens: the reply is cut at 12 tokens, no EOS
    reply = "<think>\nx\n</think>\n" + "word " * 40
    agent = scripted_agent(qwen, [[reply]], max_tokens=12, max_segment=5)
    traj = agent.rollout(None, [QUESTION], 0)
    assert int(traj.loss_mask[0].sum()) == 12
    assert traj.answers == [E.extract_answer(qwen.decode(qwen.encode(reply)[:12]))]
    assert traj.responses[0] == qwen.decode(qwen.encode(reply)[:12]) + "<|im_end|>"


def test_rows_end_apart_and_a_prompt_past_the_cache_ends_its_row(qwen):
    scripts = [[SCRIPT[3]], SCRIPT[:1] + SCRIPT[3:]]
    agent = scripted_agent(qwen, scripts)
    traj = agent.rollout(None, [QUESTION, QUESTION], 0)
    assert traj.answers == ["Steven Spielberg"] * 2 and traj.turns.tolist() == [1, 2]
    first = len(qwen.encode(E.chat_text(qwen, PROMPT_P0), allow_special=True))
    agent = scripted_agent(qwen, [SCRIPT[:1] * 2], cache_len=first + 60)  # the second prompt does not fit
    traj = agent.rollout(None, [QUESTION], 0)
    assert traj.answers == [None] and bool(traj.truncated[0]) and int(traj.turns[0]) == 1


# ------------------------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny Qwen2 as a params checkpoint, a word tokenizer JSON, the tiny world's corpus and test."""
    from tiny_models import tiny_qwen2_config

    from jaxsearch.data import qa
    from jaxsearch.data.world.generator import generate_world, world_config
    from jaxsearch.models import orbax_io, qwen2
    from jaxsearch.models.word_tokenizer import WordTokenizer

    d = tmp_path_factory.mktemp("eka_infer")
    world = generate_world(world_config("tiny", 0))
    world.write(d / "world")
    extra = [E.build_prompt("q", ["k"]), E.knowledge_turn("k"), E.GRAPH_R1_INVALID_CALL]
    tok = WordTokenizer.build(list(world.texts()) + extra)
    tok.save(d / "tokenizer.json")
    config = tiny_qwen2_config(tok.vocab_size)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    orbax_io.save_params(str(d / "ckpt"), config, params)
    qa.write_jsonl(world.questions["test"][:4], d / "test.jsonl")
    return {"dir": d, "tok": tok, "config": config, "params": params, "world": world}


def test_real_sampler_reuses_its_compiles(tiny):
    from jaxsearch.retrieval.bm25 import BM25Retriever
    from jaxsearch.retrieval.corpus import Corpus

    tok, config = tiny["tok"], tiny["config"]
    table = StopTable.build(tok, ["</query>"], sorted(E.token_ids(tok, E.EOS_TOKENS)), config.vocab_size)
    sampler = Sampler(config, table, 1024, 8, SamplingParams(1.0), prompt_buckets=[512, 1024])
    retriever = BM25Retriever.build(
        Corpus(str(tiny["dir"] / "world" / "corpus.jsonl"), progress=False), progress=False
    )
    agent = E.EkaInferAgent(tok, retriever, sampler, max_turns=2, max_tokens=20, retrieval_k=1, initial_k=1)
    questions = [q.question for q in tiny["world"].questions["test"][:8]]
    traj = agent.rollout(tiny["params"], questions[:4], 0)
    warm = sampler.compiled_count()
    agent.rollout(tiny["params"], questions[4:], 1)
    assert sampler.compiled_count() == warm  # later calls and batches reuse the programs
    eos = E.token_ids(tok, E.EOS_TOKENS)
    for b in range(4):
        n, start = int(traj.loss_mask[b].sum()), int(traj.prompt_lengths[b])
        if int(traj.turns[b]) == 1:  # one call: 20 tokens (decode calls of 8, 8, 4) unless it wrote EOS first
            assert n == 20 or (n < 20 and int(traj.tokens[b, start + n - 1]) in eos)
        top = retriever.search([questions[b]], 1)[0]
        prompt = E.chat_text(tok, E.build_prompt(questions[b], [d.contents for d in top]))
        assert traj.tokens[b, : traj.prompt_lengths[b]].tolist() == tok.encode(prompt, allow_special=True)


def cli(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # one CPU device
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / "eval.py"), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_cli_help_shows_the_mode_and_refuses_bad_combinations(tmp_path):
    proc = cli("--help")
    assert proc.returncode == 0 and "--protocol eka_infer" in proc.stdout
    base = ["--checkpoint", tmp_path, "--datasets", f"x={tmp_path / 'x.jsonl'}", "--out", tmp_path / "out"]
    proc = cli(*base, "--protocol", "eka_infer", "--initial-k", "0", "--initial-corpus", tmp_path / "c.jsonl")
    assert proc.returncode == 2 and "--initial-k 0 (no P0) contradicts --initial-corpus" in proc.stderr
    from jaxsearch.cli.eval import parse_args

    with pytest.raises(SystemExit):
        parse_args([*map(str, base), "--protocol", "eka_infer", "--builtin-prompt"])
    with pytest.raises(SystemExit):
        parse_args([*map(str, base), "--protocol", "eka", "--initial-k", "0"])
    # their EKA_infer.py argparse defaults under eka_infer (temperature 1.0, top-p 1.0, max-tokens 4096,
    # max-turns 20); other protocols keep ours; a flag given wins
    args = parse_args([*map(str, base), "--protocol", "eka_infer"])
    assert (args.temperature, args.top_p, args.max_segment_tokens, args.max_turns) == (1.0, 1.0, 4096, 20)
    args = parse_args([*map(str, base), "--protocol", "eka"])
    assert (args.temperature, args.top_p, args.max_segment_tokens, args.max_turns) == (0.0, 1.0, 500, 4)
    args = parse_args([*map(str, base), "--protocol", "eka_infer", "--temperature", "0", "--max-turns", "3"])
    assert (args.temperature, args.max_turns) == (0.0, 3)


def test_cli_writes_the_eval_outputs(tiny):
    d = tiny["dir"]
    out = d / "out"
    proc = cli(
        "--checkpoint", d / "ckpt", "--tokenizer", d / "tokenizer.json", "--dtype", "float32",
        "--protocol", "eka_infer", "--retriever", "bm25", "--corpus", d / "world" / "corpus.jsonl",
        "--topk", 1, "--initial-k", 2, "--max-turns", 2, "--max-segment-tokens", 8, "--cache-len", 1024,
        "--batch-size", 4, "--no-progress", "--rs-encoder", "none", "--datasets", f"tiny={d / 'test.jsonl'}",
        "--out", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "tiny.jsonl") as f:
        records = [json.loads(line) for line in f]
    with open(out / "summary.json") as f:
        summary = json.load(f)
    with open(out / "run.json") as f:
        settings = json.load(f)["settings"]
    assert len(records) == 4 and summary["datasets"]["tiny"]["n"] == 4
    assert summary["datasets"]["tiny"]["em"] == np.mean([r["metrics"]["em"] for r in records])
    assert settings["protocol"] == "eka_infer" and settings["initial_k"] == 2
    assert (settings["temperature"], settings["top_p"]) == (1.0, 1.0)  # their defaults
    for r in records:
        assert 1 <= r["turns"] <= 2 and len(r["initial_doc_ids"]) == 2
        assert sum(r["loss_mask"]) <= 8 * r["turns"]
