"""Per-row requests of a rollout (agent/requests.py): each row's own sampling settings, token cap, stop strings
and seed in one decode call, its streamed events, its summary and its cancel, on a tiny random model."""

import numpy as np
import pytest

import jax

from jaxsearch.agent import sampler as S
from jaxsearch.agent import sampling
from jaxsearch.agent.engine import AgentEngine, EpisodeConfig
from jaxsearch.agent.protocols import Action, get_protocol
from jaxsearch.agent.requests import EventStream, RowRequest, row_sampling, stop_answer, summarize
from jaxsearch.agent.slots import Slots
from jaxsearch.agent.trajectories import Row
from jaxsearch.data.world.generator import generate_world, world_config
from jaxsearch.models import qwen2
from jaxsearch.models.word_tokenizer import WordTokenizer
from jaxsearch.retrieval.bm25 import BM25Retriever
from jaxsearch.retrieval.corpus import Corpus

from tiny_models import tiny_qwen2_config

SEGMENT = 12
MIXED = [
    RowRequest(temperature=0.0),
    RowRequest(temperature=0.7, seed=11),
    RowRequest(temperature=1.0, top_p=0.5, seed=12, choice=1),
    RowRequest(temperature=1.3, top_p=0.9, seed=2**40 + 3),
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(engine, params, questions): search_r1 on the tiny world, a random 1-layer model sampling at
    temperature 1 by default, 2 decode slots of 5 steps per call, fixed buckets (one compile each)."""
    path = tmp_path_factory.mktemp("world")
    world = generate_world(world_config("tiny", 0))
    world.write(str(path))
    retriever = BM25Retriever.build(Corpus(str(path / "corpus.jsonl"), progress=False))
    protocol = get_protocol("search_r1")
    extra = [protocol.user_prompt("q?"), protocol.invalid_hint(), "Doc 1(Title: ) <information> </information>"]
    tok = WordTokenizer.build(list(world.texts()) + extra)
    config = tiny_qwen2_config(tok.vocab_size)
    params = _random_params(config)
    table = S.StopTable.build(tok, protocol.stop_strings, [tok.eos_id], config.vocab_size)
    sampler = S.Sampler(config, table, 512, SEGMENT, S.SamplingParams(1.0), prompt_buckets=[256], chunk_buckets=[128])
    limits = EpisodeConfig(
        max_turns=2, retrieval_k=1, max_segment_tokens=SEGMENT, max_obs_tokens=100, micro_batch=2,
        scheduler="slots", steps_per_call=5,
    )  # fmt: skip
    engine = AgentEngine(tok, protocol, retriever, sampler, limits)
    questions = [q.question for q in world.questions["dev"][:4]]
    return engine, params, questions


def _random_params(config):
    """Normal(0, 0.2) weights, norms included, drawn by numpy: `qwen2.init_params` costs ~9 s of compile."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: qwen2.init_params(config, jax.random.PRNGKey(0)))
    return jax.tree.map(lambda s: jax.numpy.asarray(rng.normal(0, 0.2, s.shape).astype(s.dtype)), shapes)


@pytest.fixture
def searching(monkeypatch, setup):
    """Every segment reads as a search (a random model rarely closes a tag): observations follow each turn."""
    engine = setup[0]
    monkeypatch.setattr(engine.protocol, "parse_action", lambda text: Action("search", text.strip()[:40] or "?"))


def _policy_ids(traj, b):
    """Row b's policy tokens (loss mask 1: Search-R1 trains no observation token)."""
    return traj.tokens[b][traj.loss_mask[b] == 1].tolist()


def test_mixed_rows_share_a_call_and_sample_as_alone(setup, searching):
    """Rows of different settings in one batch (2 slots for 4 rows: rows wait, move and share decode calls)
    draw the tokens each draws in another batch, slot and position (the batch reversed; lockstep, all rows
    in one call), seeded rows whatever the rollout's key; the greedy row is the greedy engine's row."""
    engine, params, questions = setup
    together = engine.rollout(params, questions, 5, requests=MIXED)
    reversed_ = engine.rollout(params, questions[::-1], 9, requests=MIXED[1:][::-1] + [None])
    for b in range(1, 4):
        assert _policy_ids(reversed_, 3 - b) == _policy_ids(together, b), b
        assert reversed_.responses[3 - b] == together.responses[b]
    lockstep = engine.replace(limits=engine.limits.replace(scheduler="lockstep"))
    in_lockstep = lockstep.rollout(params, questions, 5, requests=MIXED)
    for b in range(4):
        assert _policy_ids(in_lockstep, b) == _policy_ids(together, b), b
    greedy = lockstep.replace(sampler=_with(engine.sampler, S.SamplingParams(0.0)))
    reference = greedy.rollout(params, questions, 0)
    assert _policy_ids(reference, 0) == _policy_ids(together, 0)
    n = reference.attention_mask[0].sum()
    np.testing.assert_allclose(together.logprobs[0, :n], reference.logprobs[0, :n], atol=1e-5)
    # distinct settings drew distinct tokens (the per-row mode does not sample every row alike)
    assert len({tuple(_policy_ids(together, b)) for b in range(4)}) == 4


def _with(sampler, sampling):
    return S.Sampler(
        sampler.config, sampler.table, sampler.cache_len, sampler.max_segment, sampling,
        sampler.prompt_buckets, sampler.chunk_buckets,
    )  # fmt: skip


def _numpy_filtered(logits, temperature, top_p):
    """Sampling probabilities [V] of one row: softmax(logits / T), nucleus by a sort and a cumulative sum."""
    x = logits.astype(np.float64) / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]  # mass of the larger entries
    keep = np.zeros_like(p, bool)
    keep[order[before < top_p]] = True
    keep |= p >= p[keep].min()  # ties of the smallest kept value stay
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def test_per_row_sampling_matches_the_filtered_softmax():
    """`sample_tokens` with per-row settings: each row's token frequencies, logprobs and entropy are numpy's
    filtered softmax at that row's temperature / top_p; a greedy row takes the argmax with temperature-1
    logprob and entropy; and each row draws what the static path draws with its settings and key."""
    rng = np.random.default_rng(0)
    v, draws = 12, 2000
    logits = rng.normal(0, 2, (4, v)).astype(np.float32)
    temperature = np.asarray([0.0, 0.7, 1.0, 1.6], np.float32)
    top_p = np.asarray([1.0, 1.0, 0.5, 0.8], np.float32)
    rows = S.RowSampling(temperature, top_p, np.zeros((4, 1, 1), np.uint8), np.zeros((4, 1, 1), bool))
    tiled = np.tile(logits, (draws, 1))
    keys = jax.random.split(jax.random.key(0), 4 * draws)
    counters = np.zeros(4 * draws, np.int32)
    fn = jax.jit(sampling.sample_tokens, static_argnums=3)
    out = fn(tiled, keys, counters, S.SamplingParams(), _tile(rows, draws))
    tok, logp, ent = (np.asarray(x).reshape(draws, 4) for x in out)
    full = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    assert (tok[:, 0] == np.argmax(logits[0])).all()
    np.testing.assert_allclose(logp[:, 0], full[0, np.argmax(logits[0])], atol=1e-5)
    np.testing.assert_allclose(ent[:, 0], -(np.exp(full[0]) * full[0]).sum(), atol=1e-5)
    for b in range(1, 4):
        q = _numpy_filtered(logits[b], temperature[b], top_p[b])
        freq = np.bincount(tok[:, b], minlength=v) / draws
        assert (freq[q == 0] == 0).all(), b  # nothing outside the nucleus
        assert np.abs(freq - q).max() < 4 * np.sqrt(0.25 / draws), (b, freq, q)
        np.testing.assert_allclose(logp[:, b], np.log(q[tok[:, b]]), atol=1e-5)
        scaled = logits[b].astype(np.float64) / temperature[b]
        p = np.exp(scaled - scaled.max()) / np.exp(scaled - scaled.max()).sum()
        np.testing.assert_allclose(ent[:, b], -(p * np.log(p)).sum(), atol=1e-4)


    b = 3  # temperature and top_p: the static path with the same settings and keys draws the same tokens
    static = fn(tiled[b::4], keys[b::4], counters[b::4], S.SamplingParams(float(temperature[b]), float(top_p[b])))
    np.testing.assert_array_equal(np.asarray(static[0]), tok[:, b])


def _tile(rows, draws):
    return jax.tree.map(lambda x: np.tile(x, (draws,) + (1,) * (x.ndim - 1)), rows)


def test_max_tokens_caps_the_policy_tokens_across_turns(setup, searching):
    """max_tokens counts the policy's tokens over the episode (observations not): the row samples exactly that
    many, over several turns, and ends "length" without an answer."""
    engine, params, questions = setup
    cap = SEGMENT + 5
    traj = engine.rollout(params, questions[:2], 0, requests=[RowRequest(max_tokens=cap), RowRequest(max_tokens=3)])
    for b, expected in ((0, cap), (1, 3)):
        summary = summarize(traj, b)
        assert summary.policy_tokens == len(_policy_ids(traj, b)) == expected
        assert summary.finish_reason == "length" and summary.answer is None
        response = int(traj.attention_mask[b].sum()) - summary.prompt_tokens
        assert summary.retrieved_tokens == response - expected
    assert traj.turns[0] == 2 and summarize(traj, 0).retrieved_tokens > 0  # an observation between the turns


def test_a_request_stop_string_ends_the_row_at_its_token(setup):
    """A stop string that the greedy row writes across a token boundary in its first segment ends the row at
    the token that completes it: the same tokens up to there, the response cut before it, finish "stop"."""
    engine, params, questions = setup
    tok = engine.tokenizer
    greedy = RowRequest(temperature=0.0)
    free = engine.rollout(params, questions[:2], 0, requests=[greedy, greedy])
    ids = _policy_ids(free, 0)[:SEGMENT]
    assert len(ids) >= 6, tok.decode(ids)
    text = tok.decode(ids)
    start, end = len(tok.decode(ids[:3])) - 1, len(tok.decode(ids[:5]))  # across tokens 2, 3 and 4
    stop = text[start:end][:20]
    if "\0" in stop or not stop.strip():
        pytest.skip(f"stop string {stop!r}")
    done = next(j for j in range(len(ids)) if stop in tok.decode(ids[: j + 1]))  # the completing token
    events = []
    request = RowRequest(temperature=0.0, stop=("zzz-never", stop))
    traj = engine.rollout(params, questions[:2], 0, requests=[request, greedy], events=events.append)
    assert _policy_ids(traj, 0) == ids[: done + 1]
    summary = summarize(traj, 0)
    assert summary.finish_reason == "stop" and summary.turns == 1
    assert summary.response == text[: text.find(stop)] and stop not in summary.response
    policy = "".join(e.text for e in events if e.kind == "policy" and e.row == 0)
    assert policy == summary.response  # nothing of the stop string streamed


def test_stop_answer_reads_a_whole_or_an_opened_answer():
    protocol = get_protocol("search_r1")
    assert stop_answer(protocol, "<think>x</think>\n<answer> Paris </answer> and") == "Paris"
    assert stop_answer(protocol, "<think>x</think>\n<answer> Paris, Fra") == "Paris, Fra"
    assert stop_answer(protocol, "<answer>a</answer> then <answer> b") == "a"  # Search-R1: the first block
    assert stop_answer(protocol, "<think> no answer yet") is None


def test_events_stream_each_row_as_it_runs(setup, searching):
    """Per row: the "policy" texts (several per segment: one per decode call) join to each policy segment's
    text, each search arrives with its query and docs before its observation, all in the response's order,
    and the last event is "done" with `summarize`'s summary."""
    engine, params, questions = setup
    tok = engine.tokenizer
    events = []
    traj = engine.rollout(params, questions, 3, requests=MIXED, events=events.append)
    pieces_per_segment = []
    for b in range(4):
        mine = [e for e in events if e.row == b]
        assert [e.kind for e in mine].count("done") == 1 and mine[-1].kind == "done"
        assert mine[-1].summary == summarize(traj, b)
        assert "".join(e.text for e in mine) == traj.responses[b]
        segments, current, searches, observations = [], [], [], []
        for e in mine:
            if e.kind == "policy":
                current.append(e.text)
                continue
            if current:
                segments.append("".join(current))
                pieces_per_segment.append(len(current))
                current = []
            if e.kind == "search":
                searches.append((e.query, [d.id for d in e.docs]))
                assert not observations or len(observations) == len(searches) - 1  # search, then observation
            elif e.kind == "observation":
                observations.append(e.text)
        assert searches == list(zip(traj.queries[b], traj.doc_ids[b]))
        assert observations == traj.observations[b]
        mask = traj.loss_mask[b, traj.prompt_lengths[b] : traj.attention_mask[b].sum()]
        runs = np.split(np.arange(len(mask)), np.flatnonzero(np.diff(mask)) + 1)
        start = traj.prompt_lengths[b]
        expected = [tok.decode(traj.tokens[b, start + r].tolist()) for r in runs if mask[r[0]] == 1]
        assert segments == expected
    assert max(pieces_per_segment) > 1  # streamed per decode call of 5 steps, not per segment


class _ByteTokenizer:
    """Tokens are byte strings (a multi-byte character split over two tokens), decoded as one UTF-8 text."""

    pieces = [b"ab", "\u00e9".encode()[:1], "\u00e9".encode()[1:], b"cE", b"N", b"D!"]

    def decode(self, ids):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_policy_events_hold_back_an_incomplete_character_and_a_stop_prefix():
    events = []
    row = Row([1], [])
    row.request = RowRequest(stop=("END",))
    stream = EventStream(events.append, _ByteTokenizer(), [row], first=7)
    for n in range(1, 6):
        stream.partial(0, list(range(n)))
    assert [e.text for e in events] == ["ab", "\u00e9", "c"]  # "\ufffd" held, then "EN" (a stop's start)
    row.add("policy", list(range(6)), "ab\u00e9c")  # the engine's record: cut before "END"
    row.done = True
    stream.report(0)
    assert [e.row for e in events] == [7] * 4 and events[-1].kind == "done"
    assert "".join(e.text for e in events) == "ab\u00e9c"


def test_cancelled_rows_end_early(setup, searching):
    """A row cancelled after its first streamed text ends at the next host turn, a waiting row cancelled before
    it starts ends at once; both "cancelled", the other rows' episodes unchanged."""
    engine, params, questions = setup
    requests = [RowRequest(seed=i) for i in range(4)]
    full = engine.rollout(params, questions, 0, requests=requests)
    events, cancel = [], {3}

    def record(e):
        events.append(e)
        if e.kind == "policy" and e.row == 1:
            cancel.add(1)

    traj = engine.rollout(params, questions, 0, requests=requests, events=record, cancelled=cancel.__contains__)
    assert traj.finish_reasons[1] == traj.finish_reasons[3] == "cancelled"
    assert [e.summary.finish_reason for e in events if e.kind == "done" and e.row in (1, 3)] == ["cancelled"] * 2
    assert traj.policy_tokens[3] == 0 and traj.turns[3] == 0
    assert 0 < traj.policy_tokens[1] < full.policy_tokens[1] and traj.turns[1] == 1
    for b in (0, 2):
        assert _policy_ids(traj, b) == _policy_ids(full, b)
        assert traj.finish_reasons[b] == full.finish_reasons[b] != "cancelled"


def test_new_settings_compile_nothing(setup, searching):
    """A second per-row rollout with other temperatures, top_p, stop strings, caps and seeds compiles
    nothing new: the settings are device arrays, not static arguments."""
    engine, params, questions = setup
    engine.rollout(params, questions, 0, requests=MIXED)
    slots = Slots(engine.sampler, engine.limits.steps_per_call)
    count = slots.compiled_count() + engine.sampler.compiled_count()
    other = [
        RowRequest(temperature=0.3, top_p=0.2, stop=("the",), seed=5),
        RowRequest(temperature=0.0, max_tokens=4),
        None,
        RowRequest(temperature=2.0, stop=("a", "of the", "\u00e9t\u00e9"), seed=1, choice=2),
    ]
    engine.rollout(params, questions, 1, requests=other)
    assert slots.compiled_count() + engine.sampler.compiled_count() == count


@pytest.mark.parametrize(
    "field, value",
    [("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("max_tokens", 0), ("stop", "abc"),
     ("stop", ("a",) * 5), ("stop", ("x" * 33,)), ("stop", ("",)), ("seed", -1), ("choice", -1)],
)  # fmt: skip
def test_bad_requests_name_the_field(field, value):
    with pytest.raises(ValueError, match=field if field != "stop" else "stop"):
        RowRequest(**{field: value})


def test_row_sampling_takes_the_engines_defaults():
    rows = row_sampling([None, RowRequest(top_p=0.3, stop=("ab",))], S.SamplingParams(0.6, 0.9))
    np.testing.assert_allclose(rows.temperature, [0.6, 0.6])
    np.testing.assert_allclose(rows.top_p, [0.9, 0.3])
    assert rows.stops[1, 0, :2].tobytes() == b"ab" and rows.stop_mask.sum() == 2
