"""The multi-turn episode driver: masks, observations, turn limits and budgets on a tiny world."""

import functools
import time

import numpy as np
import pytest

import jax

from jaxsearch.data.world.generator import generate_world, world_config
from jaxsearch.models.word_tokenizer import WordTokenizer
from jaxsearch.models import qwen2
from jaxsearch.retrieval.bm25 import BM25Retriever
from jaxsearch.retrieval.corpus import Corpus
from jaxsearch.agent import engine as engine_lib
from jaxsearch.agent.engine import AgentEngine, EpisodeConfig, text_generator
from jaxsearch.agent.trajectories import concat
from jaxsearch.agent import sampler as S
from jaxsearch.agent.protocols import get_protocol

from tiny_models import tiny_qwen2_config


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
    config = tiny_qwen2_config(tok.vocab_size)
    params = qwen2.init_params(config, jax.random.PRNGKey(0))
    table = S.StopTable.build(tok, protocol.stop_strings, [tok.eos_id], config.vocab_size)
    smp = S.Sampler(config, table, cache_len=1024, max_segment=12, sampling=S.SamplingParams(1.0))
    questions = [q.question for q in w.questions["dev"][:3]]
    cfg = EpisodeConfig(
        max_turns=2, max_segment_tokens=12, max_obs_tokens=512, initial_k=2, scheduler="lockstep"
    )
    traj = AgentEngine(tok, protocol, retriever, smp, cfg).rollout(params, questions, 1)
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


# ------------------------------------------------------------------ a tiny model that really searches


@pytest.fixture(scope="module")
def searcher():
    from jaxsearch.testing import train_tiny_searcher

    return train_tiny_searcher()


def _searcher_sampler(config, tokenizer, protocol, temperature=0.0, prompt_bucket=192):
    table = S.StopTable.build(tokenizer, protocol.stop_strings, [tokenizer.eos_id], config.vocab_size)
    return S.Sampler(
        config,
        table,
        cache_len=768,
        max_segment=48,
        sampling=S.SamplingParams(temperature),
        prompt_buckets=[prompt_bucket],
        chunk_buckets=[160],
    )


def test_searcher_episodes_mask_observations_and_match_a_fresh_forward(searcher):
    from jaxsearch.rl.train_step import sequence_logprobs

    config, params, tok, world, retriever = searcher
    protocol = get_protocol("search_r1")
    smp = _searcher_sampler(config, tok, protocol, temperature=1.0)
    questions = [q.question for q in world.questions["test"][:8]]
    cfg = EpisodeConfig(
        max_turns=3, retrieval_k=1, max_segment_tokens=48, max_obs_tokens=150, scheduler="lockstep"
    )
    traj = AgentEngine(tok, protocol, retriever, smp, cfg).rollout(params, questions, 3)
    assert traj.searches.mean() >= 1  # it really searches
    for b in range(len(questions)):
        runs = _spans(traj, b)
        context = [tok.decode(ids) for m, ids in runs if m == 0]
        hints = [c for c in context if c == protocol.invalid_hint()]
        observations = [c for c in context if c != protocol.invalid_hint()]
        # every mask-0 span is exactly an observation the retriever produced (or the hint)
        assert observations == traj.observations[b]
        assert len(observations) == traj.searches[b] and len(observations) + len(hints) <= cfg.max_turns
        assert traj.turns[b] <= cfg.max_turns + 1
        for obs, ids in zip(traj.observations[b], traj.doc_ids[b]):
            assert all(retriever.corpus.get(i).text in obs for i in ids)  # the retrieved passages, in full
            assert obs.startswith("\n\n<information>") and obs.endswith("</information>\n\n")
        # each search's query is what the policy asked for in the segment before its observation
        obs_runs = [j for j, (m, ids) in enumerate(runs) if m == 0 and tok.decode(ids) in observations]
        asked = [tok.decode(runs[j - 1][1]) for j in obs_runs]
        assert len(traj.queries[b]) == len(asked) == traj.searches[b]
        for query, text, ids in zip(traj.queries[b], asked, traj.doc_ids[b]):
            # from the segment's first <search> to the </search> that stopped it, as Search-R1's
            # `<(search|answer)>(.*?)</\1>` reads a segment that opens the tag twice (sampled text may)
            assert text[text.index("<search>") + len("<search>") : text.rindex("</search>")].strip() == query
            assert [d.id for d in retriever.search([query], 1)[0]] == ids
    # the recorded sample log-probs are the model's log-probs of exactly these tokens
    fresh = np.asarray(sequence_logprobs(config, params, traj.tokens, traj.attention_mask))
    policy = traj.loss_mask == 1
    np.testing.assert_allclose(traj.logprobs[policy], fresh[policy], atol=2e-4)
    # segment labels: the policy's search text is labelled search; each observation is information
    # (its leading newlines belong to what came before the <information> tag)
    search_id, info_id = 2, 6
    assert (traj.segment_ids[policy] == search_id).any()
    for b in range(len(questions)):
        pos = traj.prompt_lengths[b]
        for m, ids in _spans(traj, b):
            labels = traj.segment_ids[b, pos : pos + len(ids)]
            if m == 0 and tok.decode(ids) in traj.observations[b]:
                assert info_id in labels and set(labels.tolist()) <= {0, info_id}, labels
            pos += len(ids)


def _greedy_run(searcher):
    """(sampler, run, questions, together): greedy search_r1 episodes of 4 test questions in one call
    (`together`); `run(qs)` runs the same episodes for other questions."""
    config, params, tok, world, retriever = searcher
    protocol = get_protocol("search_r1")
    smp = _searcher_sampler(config, tok, protocol)
    cfg = EpisodeConfig(
        max_turns=2, retrieval_k=1, max_segment_tokens=48, max_obs_tokens=150, scheduler="lockstep"
    )

    def run(qs):
        return AgentEngine(tok, protocol, retriever, smp, cfg).rollout(params, qs, 0)

    questions = [q.question for q in world.questions["test"][8:12]]
    return smp, run, questions, run(questions)


def test_rows_do_not_disturb_each_other_and_nothing_recompiles(searcher):
    """Greedy rows give the same trajectory alone or in a batch; a second batch compiles nothing."""
    smp, run, questions, together = _greedy_run(searcher)
    count = smp.compiled_count()
    for b, q in enumerate(questions):
        alone = run([q] * 4)
        n = together.attention_mask[b].sum()
        np.testing.assert_array_equal(alone.tokens[0, :n], together.tokens[b, :n])
        np.testing.assert_array_equal(alone.loss_mask[0, :n], together.loss_mask[b, :n])
    assert smp.compiled_count() == count


def test_micro_batched_rollout_concatenates_to_the_one_call_rollout(searcher):
    """The trainer's `rollout.micro_batch` path: greedy episodes run in two calls and joined by
    `trajectories.concat` equal the same episodes run in one call, field by field."""

    _, run, questions, together = _greedy_run(searcher)
    halves = [run(questions[:2]), run(questions[2:])]
    joined = concat(halves)
    _assert_same_episodes(joined, together)
    assert joined.timings.keys() == halves[0].timings.keys()
    for k, v in joined.timings.items():
        assert v == pytest.approx(halves[0].timings[k] + halves[1].timings[k])


def _assert_same_episodes(a, b, order=None):
    """Trajectories a and b hold the same episodes, field by field (a's row r is b's row order[r])."""
    order = np.arange(len(b.answers)) if order is None else np.asarray(order)
    assert a.tokens.shape == b.tokens.shape
    for name in (
        "tokens",
        "attention_mask",
        "loss_mask",
        "segment_ids",
        "prompt_lengths",
        "turns",
        "searches",
    ):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name)[order], err_msg=name)
    np.testing.assert_allclose(a.logprobs, b.logprobs[order], atol=1e-5)
    for name in ("answers", "responses", "queries", "doc_ids", "observations", "internal_knowledge"):
        assert getattr(a, name) == [getattr(b, name)[r] for r in order], name
    np.testing.assert_array_equal(a.truncated, b.truncated[order])


@pytest.mark.parametrize(
    "name, slots, steps, temperature, delay, smallest_width",
    [
        ("search_r1", 3, 16, 0.0, 0.0, 8),
        ("search_r1", 8, 1, 0.0, 0.0, 2),
        ("eka", 5, 48, 0.0, 0.0, 8),
        ("search_r1", 3, 7, 1.0, 0.0, 8),
        ("search_r1", 4, 4, 0.0, 0.05, 8),
        ("soar", 3, 7, 1.0, 0.0, 8),
        ("rsearch", 4, 5, 1.0, 0.0, 1),
    ],
)
def test_decode_slots_give_the_lockstep_episodes(
    searcher, monkeypatch, name, slots, steps, temperature, delay, smallest_width
):
    """Episodes in decode slots (fewer slots than rows: finished rows' slots take waiting rows; once none
    waits, rows move down into the free slots, and with smallest_width below the slots the calls decode only
    the first slots that hold the active rows) equal the
    lockstep rollout's, whatever the number of slots, the steps per call or the rows' arrival order: greedy,
    and sampled too (a row samples with its own key folded with its cache position, so the schedule cannot
    change what it draws: RL's rollouts, hence its learning curves, are the lockstep ones). The sampled rows
    come in GRPO groups of 2 samples per question, so a group's second row copies the first's prompt where
    both start in the same round and prefills it where not. A slow retriever (delay, seconds a search) makes
    the host act while the next decode call runs, a fast one before it: the same episodes. SOAR's internal
    stream, sampled, is the same too, and the same with lockstep in micro-batches: it samples per row and
    search, not per call."""
    from jaxsearch.agent.slots import Slots

    copies, moves = [], []
    monkeypatch.setattr(Slots, "copy_prompt", _counted(Slots.copy_prompt, copies))
    monkeypatch.setattr(Slots, "move", _counted(Slots.move, moves))
    monkeypatch.setattr(engine_lib, "Slots", functools.partial(Slots, smallest_width=smallest_width))
    config, params, tok, world, retriever = searcher
    protocol = get_protocol(name)
    if name == "soar":  # the tiny model writes no numbered facts: its whole generation stands as one
        monkeypatch.setattr(
            type(protocol), "parse_internal_facts", staticmethod(lambda text, k: [text.strip()])
        )
    smp = _searcher_sampler(config, tok, protocol, temperature, prompt_bucket=384)
    cfg = EpisodeConfig(
        max_turns=2,
        retrieval_k=1,
        max_segment_tokens=48,
        max_obs_tokens=150,
        initial_k=1,
        scheduler="lockstep",
    )
    questions = [q.question for q in world.questions["test"][:8]]
    if temperature:
        questions = [q for q in questions for _ in range(2)]
    lockstep = AgentEngine(tok, protocol, retriever, smp, cfg).rollout(params, questions, 0)
    if name == "soar":
        generated = [f for row in lockstep.internal_knowledge for f in row]
        assert len(generated) >= 8 and len(set(generated)) > len(generated) // 2, generated
        micro = AgentEngine(tok, protocol, retriever, smp, cfg.replace(micro_batch=5))
        micro = micro.rollout(params, questions, 0)
        _assert_same_episodes(micro, lockstep)
    if delay:  # record when searches run against the decode calls
        events = []
        retriever = _DelayedRetriever(retriever, 0, delay, delay, events)
        monkeypatch.setattr(Slots, "decode", _recorded(Slots.decode, events, "decode"))
        monkeypatch.setattr(Slots, "fetch", staticmethod(_recorded(Slots.fetch, events, "fetch")))
    in_slots = cfg.replace(micro_batch=slots, scheduler="slots", steps_per_call=steps)
    engine = AgentEngine(tok, protocol, retriever, smp, in_slots)
    _assert_same_episodes(engine.rollout(params, questions, 0), lockstep)
    if temperature == 0.0:  # a sampled row's key is its row index's, so reordering the rows resamples them
        _assert_same_episodes(engine.rollout(params, questions[::-1], 0), lockstep, order=np.arange(8)[::-1])
    else:
        # copied, yet each row samples with its own key: were a copy to share its twin's key, the 16 rows would
        # be 8 sequences (two rows of a group may still agree where the tiny model is sure of itself)
        assert copies and len(set(map(tuple, lockstep.tokens.tolist()))) > 8
    if delay:  # a search ran while a decode call was in flight
        assert any(events[i : i + 3] == ["decode", "search", "fetch"] for i in range(len(events)))

    # The same with the rows' ends scripted, so that rows certainly finish at different turns and a row
    # certainly moves down, whatever the tiny model samples on this machine.
    n = min(slots, len(questions))
    long_row = _top_slot_row_of_the_last_full_round(n, len(questions))
    _script_row_ends(monkeypatch, protocol, long_row)
    scripted = AgentEngine(tok, protocol, retriever, smp, cfg).rollout(params, questions, 0)
    moves.clear()
    _assert_same_episodes(engine.rollout(params, questions, 0), scripted)
    assert sorted(set(scripted.turns.tolist())) == [1, cfg.max_turns + 1]  # rows finish at different turns
    assert moves  # rows finished while another decoded, and it moved down


def _top_slot_row_of_the_last_full_round(slots: int, rows: int) -> int:
    """The row that the slot engine puts in its top slot in the last round that fills every slot, when every
    other row ends in the decode call it starts in (rows enter the free slots in order, lowest slot first).
    The rounds after it fill fewer than all the slots below it, or none, and its other rows end in one call:
    a slot below it is free while it still decodes, so it moves down."""
    return rows - 1 if rows % slots == 0 else slots * (rows // slots) - 1


def _script_row_ends(monkeypatch, protocol, long_row: int):
    """Every row but `long_row` decodes one token (a budget of 1) in its only turn; every segment reads as a
    search, so `long_row` searches until its last turn (max_turns + 1 segments, a decode call or more each).
    Lockstep and slots both ask `_budgets` and `_act_row` with the rollout's row index."""
    from jaxsearch.agent.protocols import Action

    budgets, act_row = AgentEngine._budgets, AgentEngine._act_row

    def one_token_budgets(self, rows, active):
        budget = budgets(self, rows, active)
        short = [i for i in active if i != long_row]
        budget[short] = np.minimum(budget[short], 1)
        return budget

    def one_turn_unless_long(self, rows, i, segment, final, searches, hints):
        act_row(self, rows, i, segment, final or i != long_row, searches, hints)

    monkeypatch.setattr(AgentEngine, "_budgets", one_token_budgets)
    monkeypatch.setattr(AgentEngine, "_act_row", one_turn_unless_long)
    monkeypatch.setattr(protocol, "parse_action", lambda text: Action("search", text.strip() or "?"))


def _recorded(function, events, name):
    def wrapper(*args, **kwargs):
        events.append(name)
        return function(*args, **kwargs)

    return wrapper


def _counted(method, calls):
    def wrapper(self, *args, **kwargs):
        calls.append(args)
        return method(self, *args, **kwargs)

    return wrapper


class _DelayedRetriever:
    """Answers as `retriever` after a random delay of `low`-`high` seconds (a remote retriever under load);
    `events` records each search."""

    def __init__(self, retriever, seed, low=0.0, high=0.02, events=None):
        self.retriever, self.rng, self.low, self.high = retriever, np.random.default_rng(seed), low, high
        self.events = [] if events is None else events

    def search(self, queries, k):
        time.sleep(self.rng.uniform(self.low, self.high))
        self.events.append("search")
        return self.retriever.search(queries, k)


def test_decode_slots_compile_nothing_after_warm_up_and_keep_the_samplers_logprobs(searcher):
    """Sampled episodes in 3 slots, 5 steps per call, retrieval delayed at random: a second rollout compiles
    nothing, and the recorded log-probs are the trainer's teacher-forced ones (fp32)."""
    from jaxsearch.agent.slots import Slots
    from jaxsearch.rl.train_step import sequence_logprobs

    config, params, tok, world, retriever = searcher
    protocol = get_protocol("search_r1")
    smp = _searcher_sampler(config, tok, protocol, temperature=1.0)
    cfg = EpisodeConfig(
        max_turns=3,
        retrieval_k=1,
        max_segment_tokens=48,
        max_obs_tokens=150,
        micro_batch=3,
        scheduler="slots",
        steps_per_call=5,
    )
    engine = AgentEngine(tok, protocol, _DelayedRetriever(retriever, 0), smp, cfg)
    questions = [q.question for q in world.questions["test"][:12]]
    engine.rollout(params, questions[:6], 0)
    count = smp.compiled_count() + Slots(smp, 5).compiled_count()
    traj = engine.rollout(params, questions[6:], 1)
    assert smp.compiled_count() + Slots(smp, 5).compiled_count() == count
    assert traj.searches.sum() >= 6
    fresh = np.asarray(sequence_logprobs(config, params, traj.tokens, traj.attention_mask))
    policy = traj.loss_mask == 1
    np.testing.assert_allclose(traj.logprobs[policy], fresh[policy], atol=1e-5)


def test_soar_observation_holds_the_internal_stream_and_the_passages(searcher, monkeypatch):
    config, params, tok, world, retriever = searcher
    protocol = get_protocol("soar")
    smp = _searcher_sampler(config, tok, protocol, prompt_bucket=384)
    internal_table = S.StopTable.build(tok, [], [tok.eos_id], config.vocab_size)
    internal_smp = S.Sampler(
        config, internal_table, cache_len=512, max_segment=24, sampling=S.SamplingParams(0.0)
    )
    generated = []

    def recording(*args, **kwargs):  # the policy's own generation, recorded for the check below
        generate = text_generator(*args, **kwargs)

        def wrapped(messages, keys):
            out = generate(messages, keys)
            generated.extend(out)
            return out

        return wrapped

    monkeypatch.setattr(engine_lib, "text_generator", recording)

    cfg = EpisodeConfig(
        max_turns=2,
        retrieval_k=1,
        max_segment_tokens=48,
        max_obs_tokens=400,
        internal_k=3,
        scheduler="lockstep",
    )
    questions = [q.question for q in world.questions["test"][:4]]
    engine = AgentEngine(tok, protocol, retriever, smp, cfg, internal_sampler=internal_smp)
    traj = engine.rollout(params, questions, 0)
    n_obs = sum(len(o) for o in traj.observations)
    assert n_obs > 0 and len(generated) == n_obs
    for b in range(len(questions)):
        context = [tok.decode(ids) for m, ids in _spans(traj, b) if m == 0]
        observations = [c for c in context if c != protocol.invalid_hint()]
        assert observations == traj.observations[b]
        for obs, facts in zip(observations, traj.internal_knowledge[b]):
            assert "Internal information:" in obs and "External information:" in obs
            assert facts.strip() in obs
            expected = {
                protocol.format_internal_facts(protocol.parse_internal_facts(g, 3)) for g in generated
            }
            assert facts in expected
        # the two streams apart: per search, the retrieved passages (E_ext) as Search-R1 prints them, and the
        # response the judge sees, where each observation holds those passages only
        assert len(traj.retrieved[b]) == len(traj.doc_ids[b]) == len(traj.internal_knowledge[b])
        external = traj.responses[b]
        for obs, ids, passages in zip(observations, traj.doc_ids[b], traj.retrieved[b]):
            lines = [retriever.corpus.get(i).contents.split("\n") for i in ids]  # _passages2string's split
            shown = [f"Doc {j}(Title: {c[0]}) " + "\n".join(c[1:]) + "\n" for j, c in enumerate(lines, 1)]
            assert passages == "".join(shown).strip()
            external = external.replace(obs, f"\n\n<information>{passages}</information>\n\n", 1)
        assert traj.external_responses[b] == external and "Internal information:" not in external
    # what the rewards see: E_int and E_ext as separate streams, the judge's view without E_int
    from jaxsearch.scoring.rewards import reward_inputs

    for b, sample in enumerate(reward_inputs(traj, world.questions["test"][:4])):
        assert sample.external_knowledge == "\n".join(traj.retrieved[b])
        assert sample.internal_knowledge == "\n".join(traj.internal_knowledge[b])
        assert sample.external_response == traj.external_responses[b] and sample.response == traj.responses[b]
