"""SFT data and training: trajectories token-exact against hand-written policy text and the retriever's real
observations, the masked cross-entropy against numpy, and a tiny Qwen2 that learns to search on the tiny world.

The trained tiny searcher is cached by `train_tiny_searcher` under `$JAXSEARCH_TEST_CACHE` (a fresh directory
for each test session, tests/conftest.py), keyed by its arguments and the source of the code it depends on.
"""

import json
import re

import jax
import numpy as np
import pytest

from jaxsearch.agent.sft_traces import (
    PROTOCOL_NAMES,
    SFTExample,
    build_world_tokenizer,
    pad_sft_batch,
    sft_batches,
    sft_dataset,
    sft_trajectory,
)
from jaxsearch.checkpoint import TrainCheckpointer
from jaxsearch.data.world.generator import generate_world, world_config
from jaxsearch.data.world.oracle import solution_trace
from jaxsearch.models import qwen2
from jaxsearch.retrieval.base import Doc
from jaxsearch.retrieval.factory import make_retriever
from jaxsearch.rl.sft import (
    make_sft_step,
    masked_nll,
    sft_optimizer,
    sft_train,
)
from jaxsearch.testing import tiny_searcher_history, train_tiny_searcher
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.agent.sampler import generate

from tiny_models import tiny_qwen2_config

K = 2
WORDS = {  # hand-written: what the think text calls each relation
    "born_in": "birthplace",
    "birth_date": "date of birth",
    "spouse_of": "spouse",
    "works_for": "employer",
    "founded_by": "founder",
    "founded_year": "year of establishment",
    "headquartered_in": "headquarters city",
    "located_in": "country",
    "capital": "capital",
    "official_name": "official name",
    "directed_by": "director",
    "written_by": "author",
    "released_in": "release year",
    "published_in": "publication year",
}


@pytest.fixture(scope="module")
def world():
    return generate_world(world_config("tiny", seed=0))


@pytest.fixture(scope="module")
def tokenizer(world):
    return build_world_tokenizer(world)


@pytest.fixture(scope="module")
def retriever(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    world.write(out)
    return make_retriever("bm25", corpus=str(out / "corpus.jsonl"), progress=False)


def expected_policy(name, trace):
    """The policy text of each turn, written out by hand per protocol."""
    *searches, answer = trace
    out = []
    for turn, s in enumerate(searches):
        need = f"I need the {WORDS[s.relation]} of {s.subject}."
        if name == "graph_r1":
            think = "<think>\n" if turn == 0 else ""
            out.append(f'{think}{need}\n</think>\n<query>\n{{"query": "{s.text}"}}\n</query>')
        elif name == "rsearch":
            out.append(f"{need}\n<search> {s.text} </search>")
        else:
            out.append(f"<think> {need} </think>\n<search> {s.text} </search>")
    a = answer.text
    if name == "graph_r1":
        out.append(f"The answer is {a}.\n</think>\n<answer> {a} </answer>")
    elif name == "rsearch":
        facts = " ".join(s.fact for s in searches)
        out.append(f"The answer is {a}.\n<evidence> {facts} </evidence>\n<answer> {a} </answer>")
    elif name == "soar":
        out.append(
            f"<think> The answer is {a}. </think>\n<information_source> external </information_source>\n"
            f"<answer> {a} </answer>"
        )
    else:
        out.append(f"<think> The answer is {a}. </think>\n<answer> {a} </answer>")
    return out


def in_vocabulary(tokenizer, word):
    for token in (word, " " + word):
        try:
            tokenizer.token_to_id(token)
            return True
        except KeyError:
            pass
    return False


def spans(example: SFTExample):
    """Runs of equal loss mask: [(mask, ids), ...]."""
    out = []
    for token, m in zip(example.ids, example.loss_mask):
        if out and out[-1][0] == m:
            out[-1][1].append(token)
        else:
            out.append((m, [token]))
    return out


@pytest.mark.parametrize("name", PROTOCOL_NAMES)
def test_trajectory_is_prompt_policy_and_real_observations(name, world, tokenizer, retriever):
    protocol = get_protocol(name)
    example = next(e for e in world.questions["train"] if e.metadata["hops"] == 3)
    trace = solution_trace(example, world)
    sft = sft_trajectory(protocol, tokenizer, example, trace, retriever, K)

    context = None
    if name == "eka":
        docs = retriever.search([example.question], K)[0]
        lines = "\n".join(f'Doc {i}(Title: "{d.title}") {d.text}' for i, d in enumerate(docs, start=1))
        context = f"<knowledge>\n{lines}\n</knowledge>"
    prompt = tokenizer.apply_chat_template(protocol.build_messages(example.question, context))
    prompt_ids = tokenizer.encode(prompt, allow_special=True)
    assert sft.ids[: sft.prompt_len] == prompt_ids and sft.prompt_len == len(prompt_ids)
    if name != "soar":  # SOAR's prompt has curly quotes, outside the ASCII word tokenizer
        assert tokenizer.decode(prompt_ids) == prompt

    policy = expected_policy(name, trace)
    observations = []
    for step in trace[:-1]:
        docs = retriever.search([step.text], K)[0]  # one call per turn, as the episode driver makes
        args = (docs, "") if name == "soar" else (docs,)
        observations.append(protocol.format_observation(*args))
    expected = [(0, prompt)]
    for text, obs in zip(policy, observations):
        expected += [(1, text), (0, obs)]
    expected.append((1, policy[-1] + "<|im_end|>"))

    got = spans(sft)
    assert [m for m, _ in got] == [m for m, _ in expected]
    for (m, ids), (_, text) in zip(got[1:], expected[1:]):
        assert tokenizer.decode(ids) == text
        if m == 0:
            assert ids == tokenizer.encode(text, allow_special=protocol.observation_allow_special)
        elif text.endswith("<|im_end|>"):
            assert ids == tokenizer.encode(text.removesuffix("<|im_end|>")) + [tokenizer.eos_id]
        else:
            assert ids == tokenizer.encode(text)
    assert sum(sft.loss_mask) == sum(len(tokenizer.encode(t)) for t in policy) + 1

    # Every word is one token: nothing falls back to characters. (Graph-R1's JSON escapes a passage's title
    # newline as "\\n", which splits "\\nThe" into characters: its words are those of the decoded knowledge.)
    if name == "graph_r1":
        knowledge = [re.search(r"<knowledge>\n(.*)\n</knowledge>", o, re.DOTALL).group(1) for o in observations]
        observations = [" ".join(r["<knowledge>"] for r in json.loads(k)["results"]) for k in knowledge]
    for word in re.findall(r"[A-Za-z]+|[0-9]+", prompt + "".join(policy + observations)):
        assert in_vocabulary(tokenizer, word), f"{word!r} is not in the vocabulary"


def test_observation_is_what_the_retriever_returns_even_on_a_miss(world, tokenizer):
    class Fixed:  # returns the same unrelated passage for every query
        def search(self, queries, k):
            return [[Doc("7", "Elsewhere", "Nothing to see here.")] for _ in queries]

    protocol = get_protocol("search_r1")
    example = next(e for e in world.questions["train"] if e.metadata["hops"] == 1)
    sft = sft_trajectory(protocol, tokenizer, example, solution_trace(example, world), Fixed(), 3)
    observation = [ids for m, ids in spans(sft) if m == 0][1]
    assert tokenizer.decode(observation) == (
        '\n\n<information>Doc 1(Title: "Elsewhere") Nothing to see here.</information>\n\n'
    )


def test_pad_sft_batch_right_pads():
    examples = [SFTExample([5, 6, 7], [0, 1, 1], 1), SFTExample([8], [0], 1)]
    ids, attention, loss = pad_sft_batch(examples, 4, pad_id=9)
    np.testing.assert_array_equal(ids, [[5, 6, 7, 9], [8, 9, 9, 9]])
    np.testing.assert_array_equal(attention, [[1, 1, 1, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(loss, [[0, 1, 1, 0], [0, 0, 0, 0]])
    assert ids.dtype == attention.dtype == loss.dtype == np.int32
    with pytest.raises(ValueError, match="more than max_len=2"):
        pad_sft_batch(examples, 2)


def test_sft_dataset_leaves_out_long_examples_and_batches_deterministically(world, tokenizer, retriever):
    every = sft_dataset(world, "train", get_protocol("search_r1"), tokenizer, retriever, 1, 10_000)
    short = sft_dataset(world, "train", get_protocol("search_r1"), tokenizer, retriever, 1, 256)
    assert len(every) == len(world.questions["train"])
    assert short == [e for e in every if len(e.ids) <= 256] and 0 < len(short) < len(every)
    first = [next(sft_batches(short, 4, 256, seed=3)) for _ in range(2)]
    np.testing.assert_array_equal(first[0][0], first[1][0])


def tiny_config(vocab):
    return tiny_qwen2_config(vocab, num_hidden_layers=2, logprob_chunk=8)


def test_masked_nll_matches_numpy():
    config = tiny_config(vocab=23)
    params = qwen2.init_params(config, jax.random.PRNGKey(1))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 23, (3, 12)).astype(np.int32)
    attention = np.ones((3, 12), np.int32)
    attention[1, 9:] = 0  # right padding
    attention[2, 5:] = 0
    loss_mask = rng.integers(0, 2, (3, 12)).astype(np.int32) * attention

    logits = np.asarray(jax.jit(qwen2.forward, static_argnums=0)(config, params, ids, attention), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    terms = [-logp[b, t - 1, ids[b, t]] for b in range(3) for t in range(1, 12) if loss_mask[b, t]]

    loss, count = jax.jit(masked_nll, static_argnums=0)(config, params, ids, attention, loss_mask)
    assert int(count) == len(terms)
    np.testing.assert_allclose(float(loss), np.mean(terms), rtol=1e-5)


def test_sft_step_donates_and_is_deterministic():
    config = tiny_config(vocab=17)
    ids = np.random.default_rng(0).integers(0, 17, (4, 16)).astype(np.int32)
    batch = (ids, np.ones_like(ids), (ids % 2).astype(np.int32))
    optimizer = sft_optimizer(1e-2, 2, 6)
    step = make_sft_step(config, optimizer)
    runs = []
    for _ in range(2):
        params = initial = qwen2.init_params(config, jax.random.PRNGKey(0))
        opt_state = optimizer.init(params)
        losses = []
        for _ in range(6):
            params, opt_state, metrics = step(params, opt_state, *batch)
            losses.append(float(metrics["loss"]))
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(initial))
        runs.append((losses, jax.tree.leaves(params)))
    assert runs[0][0] == runs[1][0] and runs[0][0][-1] < runs[0][0][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)


class _Stop(Exception):
    pass


def _batches(vocab: int, stop_after: int | None = None):
    """A deterministic batch sequence (a new batch each step, as `sft_batches`); raises _Stop after
    `stop_after` batches, like a process killed mid-run."""
    rng = np.random.default_rng(3)
    for n in range(10**6):
        if n == stop_after:
            raise _Stop
        ids = rng.integers(0, vocab, (2, 12)).astype(np.int32)
        yield ids, np.ones_like(ids), (ids % 2).astype(np.int32)


def test_sft_train_resumes_from_its_checkpoint_to_the_same_params_and_losses(tmp_path, capsys):
    config = tiny_config(vocab=19)
    args = dict(steps=7, lr=1e-2, warmup=2, log_every=5, progress=False)

    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    whole = TrainCheckpointer(tmp_path / "whole", save_every=3, max_to_keep=1)
    params_whole, losses_whole = sft_train(config, params, _batches(19), checkpointer=whole, **args)
    whole.close()
    # saves at steps 3 and 6 (not 7: the caller writes the final params), keeping the newest
    assert whole.all_steps() == [6]

    stopped = TrainCheckpointer(tmp_path / "stopped", save_every=3, max_to_keep=1)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    with pytest.raises(_Stop):  # killed while drawing step 5's batch: step 3's save is the newest
        sft_train(config, params, _batches(19, stop_after=4), checkpointer=stopped, **args)
    stopped.close()
    assert stopped.all_steps() == [3]

    # another init: only a restore of step 3's params and optimizer state can reproduce the whole run
    resumed = TrainCheckpointer(tmp_path / "stopped", save_every=3, max_to_keep=1)
    params = qwen2.init_params(config, jax.random.PRNGKey(1))
    params_resumed, losses_resumed = sft_train(config, params, _batches(19), checkpointer=resumed, **args)
    resumed.close()
    assert f"resumed from step 3 (checkpoint {resumed.directory}/3)\n" in capsys.readouterr().err
    assert len(losses_whole) == 7 and losses_resumed == losses_whole
    for a, b in zip(jax.tree.leaves(params_whole), jax.tree.leaves(params_resumed)):
        np.testing.assert_array_equal(a, b)

    mismatched = TrainCheckpointer(tmp_path / "stopped", save_every=3, max_to_keep=1)
    with pytest.raises(ValueError, match="step 6 with 6 losses does not belong to a run of 4 steps"):
        sft_train(config, qwen2.init_params(config, jax.random.PRNGKey(0)), _batches(19),
                  checkpointer=mismatched, **{**args, "steps": 4})  # fmt: skip
    mismatched.close()


@pytest.fixture(scope="module")
def searcher():
    return train_tiny_searcher()


def test_tiny_searcher_learns_to_search(searcher):
    config, params, tokenizer, world, retriever = searcher
    losses = tiny_searcher_history()["loss"]
    print(f"tiny searcher: {len(losses)} steps, loss {losses[0]:.3f} -> {np.mean(losses[-10:]):.3f}")
    assert np.mean(losses[-10:]) < 0.3 * losses[0]

    protocol = get_protocol("search_r1")
    held_out = world.questions["test"][:4]
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(protocol.build_messages(e.question)), allow_special=True
        )
        for e in held_out
    ]
    stop = [tokenizer.token_to_id(t) for t in ("</search>", " </search>", "</answer>", " </answer>")]
    for new in generate(config, params, prompts, 48, stop=stop + [tokenizer.eos_id]):
        text = tokenizer.decode(new)
        assert re.fullmatch(
            r"<think> I need the [a-z ]+ of [A-Z][\w ]+\. </think>\n<search> [\w ]+ </search>", text
        ), text
        action = protocol.parse_action(text)
        assert action.kind == "search" and action.content
        assert retriever.search([action.content], 1)[0], json.dumps(text)
