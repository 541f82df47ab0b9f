"""The multi-turn episode driver: masks, observations, turn limits and budgets on a tiny world."""

import numpy as np
import pytest

import jax

from jaxsearch.data.synthetic import generate_world, world_config
from jaxsearch.data.word_tokenizer import WordTokenizer
from jaxsearch.models import qwen2
from jaxsearch.retrieval.bm25 import BM25Retriever
from jaxsearch.retrieval.corpus import Corpus
from jaxsearch.rollout import episode
from jaxsearch.rollout import sampler as S
from jaxsearch.rollout.protocols import get_protocol


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    path = tmp_path_factory.mktemp("world")
    w = generate_world(world_config("tiny", 0))
    w.write(str(path))
    retriever = BM25Retriever.build(Corpus(str(path / "corpus.jsonl"), progress=False))
    return w, retriever


def _tokenizer(world, protocol):
    extra = [
        protocol.user_prompt("q?", "<knowledge>k</knowledge>" if protocol.name == "eka" else None),
        protocol.invalid_hint(),
        "Doc 1(Title: ) <knowledge> </knowledge>",
    ]
    return WordTokenizer.build(list(world.texts()) + extra)


def _spans(traj, b):
    """(loss_mask value, token ids) runs of row b's response."""
    start, end = traj.prompt_lengths[b], traj.attention_mask[b].sum()
    runs, cur, ids = [], None, []
    for t in range(start, end):
        m = int(traj.loss_mask[b, t])
        if m != cur and ids:
            runs.append((cur, ids))
            ids = []
        cur = m
        ids.append(int(traj.tokens[b, t]))
    if ids:
        runs.append((cur, ids))
    return runs


@pytest.mark.parametrize("name", ["search_r1", "eka"])
def test_random_policy_episode_masks_and_limits(world, name):
    """A random policy rarely closes a tag: every turn ends at its budget, gets the invalid-action hint
    (mask 0), and the episode stops after max_turns + 1 segments."""
    w, retriever = world
    protocol = get_protocol(name)
    tok = _tokenizer(w, protocol)
    config = qwen2.Qwen2Config(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
    )
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    table = S.StopTable.build(tok, protocol.stop_strings, [tok.eos_id], config.vocab_size)
    smp = S.Sampler(config, table, cache_len=1024, max_segment=12, sampling=S.SamplingParams(1.0))
    questions = [q.question for q in w.questions["dev"][:3]]
    cfg = episode.EpisodeConfig(max_turns=2, max_segment_tokens=12, initial_k=2)
    traj = episode.run_episodes(smp, params, tok, protocol, retriever, questions, cfg, seed=1)
    for b in range(3):
        prompt = tok.decode(traj.tokens[b, : traj.prompt_lengths[b]].tolist())
        if name == "eka":  # P0: the top-2 passages for the raw question, before the first think
            docs = retriever.search([questions[b]], 2)[0]
            assert "<knowledge>" in prompt and all(d.text in prompt for d in docs)
            assert prompt.index("</knowledge>") < len(prompt)  # the policy's first <think> comes after
        runs = _spans(traj, b)
        policy = [ids for m, ids in runs if m == 1]
        context = [tok.decode(ids) for m, ids in runs if m == 0]
        assert traj.turns[b] == len(policy) <= cfg.max_turns + 1
        assert all(len(ids) <= 12 for ids in policy)
        if traj.answers[b] is None and traj.searches[b] == 0:
            assert context == [protocol.invalid_hint()] * cfg.max_turns
        # sampled log-probs sit exactly on the policy tokens
        assert np.all((traj.logprobs[b] != 0) <= (traj.loss_mask[b] == 1))
