"""What the rewards read of an episode (issue 39, defects 1-4): the response chunk for chunk as the authors'
rewards read it (invalid-action hints included), an observation cut to max_obs_tokens that never swallows the
policy's later text, SOAR's streams as far as the policy saw them, and SOAR's EM check on whole words."""

import pytest

from jaxsearch.agent import trajectories as traj_lib
from jaxsearch.agent.engine import encode_context
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.agent.trajectories import HINT, OBSERVATION, POLICY, Row
from jaxsearch.models.tokenizer import QwenTokenizer
from jaxsearch.retrieval.base import Doc
from jaxsearch.scoring import rewards as R
from jaxsearch.scoring.rewards import RewardInput

DOCS = [
    Doc("d1", "Alpha river", "The Alpha river flows north into the sea.", 1.0),
    Doc("d2", "Beta town", "Beta town lies on the Alpha river.", 0.5),
]
FACTS = "1. Beta town is a port.\n2. It was founded in 1801."

# per protocol: the policy's text before the first observation, between it and the second, and after
POLICY_TEXT = {
    "search_r1": ("<think>a</think>\n<search>q</search>", "<think>later</think>\n<search>q2</search>",
                  "<think>x</think>\n<answer>Beta town</answer>"),
    "soar": ("<think>a</think>\n<search>q</search>", "<think>later</think>\n<search>q2</search>",
             "<think>x</think>\n<information_source>external</information_source>\n<answer>Beta town</answer>"),
    "rsearch": ("a\n<search>q</search>", "later\n<search>q2</search>",
                "<evidence>e</evidence>\n<answer>Beta town</answer>"),
    "graph_r1": ('<think>a</think>\n<query>{"query": "q"}</query>',
                 '</think>\n<query>{"query": "later"}</query>', "</think>\n<answer>Beta town</answer>"),
}


def _observation(protocol) -> str:
    if protocol.needs_internal_knowledge:
        return protocol.format_observation(DOCS, FACTS)
    return protocol.format_observation(DOCS)


def _response(name: str, first: str, second: str) -> str:
    before, middle, after = POLICY_TEXT[name]
    return before + first + middle + second + after


def _scores(name: str, response: str) -> tuple:
    """What each method's reward reads off a response: the answer, and its format verdict."""
    protocol = get_protocol(name)
    answer = R.extract_answer(response, protocol.observation_tag)
    if name == "graph_r1":
        return answer, R.graph_r1_format_score(response), R.graph_r1_score(response, ["Beta town"])
    if name == "rsearch":
        return answer, R.rsearch_format_score(response), R.parsing.extract_evidence(response)
    return answer, R.is_valid_sequence(response), R.parsing.information_source(response)


@pytest.mark.parametrize("name", sorted(POLICY_TEXT))
def test_an_observation_cut_anywhere_in_its_closing_tag_leaves_the_policys_later_text_to_the_rewards(name):
    """The first observation cut at every character from just before its closing tag to its end: the rewards
    read the same answer and format verdict as for the whole observation, and the policy's text between the
    two observations stays in the policy's view (a regex reading tag pairs ran past the cut into it)."""
    protocol = get_protocol(name)
    full = _observation(protocol)
    close = f"</{protocol.observation_tag}>"
    at = full.rfind(close)
    whole = _response(name, full, full)
    expected = _scores(name, whole)
    assert expected[0] == "Beta town"
    for cut in range(at - 3, len(full) + 1):
        seen = full[:cut]
        text = protocol.close_cut_observation(seen, full)
        assert text.startswith(seen)
        response = _response(name, text, full)
        assert _scores(name, response) == expected, (name, cut, seen[-20:])
        policy_view = R.policy_view(response, protocol.observation_tag)
        assert "later" in policy_view, (name, cut)
        # what the policy saw without the closing: the later text is lost to the rewards (the defect)
        if cut <= at:
            assert "later" not in R.policy_view(_response(name, seen, full), protocol.observation_tag)


@pytest.mark.parametrize("name", sorted(POLICY_TEXT))
def test_encode_context_cuts_the_ids_and_closes_only_the_rewards_text(name):
    """Through the engine's encoding with the real tokenizer, cut at each token of the closing tag: the
    policy gets exactly the first max_tokens ids of the observation; the rewards' text is their decoding,
    closed."""
    tok, protocol = QwenTokenizer(), get_protocol(name)
    full = _observation(protocol)
    full_ids = tok.encode(full, allow_special=protocol.observation_allow_special)
    at = full.rfind(f"</{protocol.observation_tag}>")
    tail = len(tok.encode(full[at:], allow_special=protocol.observation_allow_special))
    for n in range(len(full_ids) - tail - 1, len(full_ids) + 1):
        ids, text = encode_context(tok, protocol, OBSERVATION, full, n)
        assert ids == full_ids[:n]
        seen = tok.decode(ids)
        assert text == (full if n == len(full_ids) else seen[:at] + full[at:])
        response = _response(name, text, full)
        assert _scores(name, response) == _scores(name, _response(name, full, full)), (name, n)


def _soar_trajectory(max_tokens: int):
    """One SOAR row: a search, its observation cut to `max_tokens`, then the policy's answer "Alpha river"
    from the external stream."""
    tok, protocol = QwenTokenizer(), get_protocol("soar")
    row = Row(tok.encode("prompt"), [])
    before = "<think>a</think>\n<search>q</search>"
    after = "<think>x</think>\n<information_source>external</information_source>\n<answer>Alpha river</answer>"
    row.add(POLICY, tok.encode(before), before)
    ids, text = encode_context(tok, protocol, OBSERVATION, _observation(protocol), max_tokens)
    row.add(OBSERVATION, ids, text)
    row.add(POLICY, tok.encode(after), after)
    traj = traj_lib.assemble([row], tok, protocol, timings={})
    (sample,) = R.reward_inputs(traj, [_Example()])
    return traj, sample


class _Example:
    question = "Where is Beta town?"
    golden_answers = ["Alpha river"]


def test_soar_streams_are_what_the_policy_saw():
    """Uncut, E_int and E_ext are the listed facts and Search-R1's passages; cut inside the passages, the
    consistency check, the judges' views and E_ext hold only what the policy read, so an answer from the
    part cut away is not source-consistent (it was before: the reward read the whole stream)."""
    protocol = get_protocol("soar")
    traj, sample = _soar_trajectory(10_000)
    assert traj.internal_knowledge[0] == [FACTS]
    assert traj.retrieved[0] == [
        'Doc 1(Title: "Alpha river") The Alpha river flows north into the sea.\n'
        'Doc 2(Title: "Beta town") Beta town lies on the Alpha river.'
    ]
    assert R.source_consistent(sample)
    tok = QwenTokenizer()
    full = _observation(protocol)
    # cut right before the first passage's text: the policy saw the facts and "Doc 1(Title:" only
    keep = full.index("Alpha river")
    n = len(tok.encode(full[:keep]))
    traj, sample = _soar_trajectory(n)
    assert traj.internal_knowledge[0] == [FACTS]
    assert "Alpha" not in traj.retrieved[0][0] and "Alpha" not in sample.external_knowledge
    assert not R.source_consistent(sample)
    assert "Alpha river flows" not in sample.external_response
    # cut inside the internal label: both streams empty
    traj, _ = _soar_trajectory(len(tok.encode(full[: full.index("Internal") + 4])))
    assert traj.internal_knowledge[0] == [""] and traj.retrieved[0] == [""]


@pytest.mark.parametrize(
    "stream, answer, supported",
    [
        ("Doc 1(Title: Nothing) nothing is known here", "no", False),  # "no" is not a word of "nothing"
        ("1. Beta town is a port.\n2. It was founded in 1801.", "1", False),  # our numbering is not content
        ("1. Beta town is a port.\n2. It was founded in 1801.", "1801", True),
        ("1. The answer is 1 exactly.", "1", True),
        ("Doc 1(Title: New York) New York City is large.", "new york", True),
        ("Doc 1(Title: A) New York City is large.", "york new", False),
        ("Doc 1(Title: A) Paris, France.", "The Paris", True),  # SQuAD normalization on both sides
        ("Doc 1(Title: A) the sea\nDoc 2(Title: B) level rises", "sea level", False),  # one passage at a time
        ("Doc 1(Title: A) x", "", False),
        ("Doc 2(Title: Beta town) Beta town lies on the river.", "Beta town", True),  # the title is content
    ],
)
def test_soar_em_check_matches_whole_words_of_one_fact_or_passage(stream, answer, supported):
    assert R.stream_supports(stream, answer) is supported
    sample = RewardInput(
        f"<information_source>external</information_source><answer>{answer}</answer>", ["gold"],
        external_knowledge=stream,
    )
    assert R.source_consistent(sample) is (supported and bool(answer))


def _scored_row(name: str, chunks: list[tuple[str, str]]) -> RewardInput:
    """One episode assembled from (kind, text) chunks as the engine records them -> what the rewards read."""
    tok, protocol = QwenTokenizer(), get_protocol(name)
    row = Row(tok.encode("prompt"), [])
    for kind, text in chunks:
        row.add(kind, tok.encode(text, allow_special=True), text)
    traj = traj_lib.assemble([row], tok, protocol, timings={})
    (sample,) = R.reward_inputs(traj, [_Example()])
    return sample


def test_graph_r1_scores_an_episode_with_an_invalid_query_as_graph_r1_does():
    """A non-JSON `<query>` gets Graph-R1's invalid-call knowledge turn, then the policy searches and answers.
    Graph-R1's `compute_score_format_answer` (verl/utils/reward_score/qa_em_and_format.py, run on
    "<|im_start|>assistant\n" + this response) gives format 1.5 (three well-formed turns, capped at 1) and
    1.0 in all; with the hint dropped the first two turns merge: format 0.5, reward -0.5 (what we scored)."""
    protocol = get_protocol("graph_r1")
    chunks = [
        (POLICY, "<think>look it up</think>\n<query>Alpha river</query>"),
        (HINT, protocol.invalid_hint()),
        (POLICY, 'fix it</think>\n<query>{"query": "Alpha river"}</query>'),
        (OBSERVATION, protocol.format_observation(DOCS[:1])),
        (POLICY, "found it</think>\n<answer>Alpha river</answer><|im_end|>"),
    ]
    sample = _scored_row("graph_r1", chunks)
    assert sample.response == "".join(text for _, text in chunks)
    assert R.graph_r1_format_score(sample.response) == 1.5
    assert R.graph_r1_score(sample.response, ["Alpha river"]) == 1.0


def test_rsearch_format_reads_the_invalid_action_hint_as_rsearch_does():
    """R-Search's `extract_solution` (src/verl/utils/reward_score/qa_f1.py) counts `<answer>` blocks in the
    decoded prompt + response, which holds the invalid-action text of `execute_predictions`
    (src/train/generation.py) with its "<answer> and </answer>": run on this episode it gives the answer flag
    False and the evidence flag True, format 0.2 (0.4 with the hint dropped, what we scored)."""
    protocol = get_protocol("rsearch")
    chunks = [
        (POLICY, "I should search.\n<search>Beta town</search"),
        (HINT, protocol.invalid_hint()),
        (POLICY, "<search>Beta town</search>"),
        (OBSERVATION, protocol.format_observation(DOCS[1:])),
        (POLICY, "<evidence>Beta town lies on the Alpha river.</evidence>\n<answer>Alpha river</answer>"),
    ]
    sample = _scored_row("rsearch", chunks)
    assert sample.response == "".join(text for _, text in chunks)
    assert R.rsearch_format_score(sample.response) == pytest.approx(0.2)


def test_in_training_f1_follows_the_protocols_rule():
    """The training step's and the held-out evaluation's F1 use the protocol's rule: Graph-R1's `cal_f1`
    (evaluation/eval.py) is plain token F1, "no" against "no way" 2/3; FlashRAG's yes/no rule (Search-R1) 0.
    R-Search's Acc rides beside them."""
    from types import SimpleNamespace

    from jaxsearch.scoring.episodes import heldout_metrics

    tok = QwenTokenizer()
    rows = []
    for answer in ("no", "yes, no way"):
        row = Row(tok.encode("prompt"), [])
        row.add(POLICY, tok.encode(f"<answer>{answer}</answer>"), f"<answer>{answer}</answer>")
        row.answer = answer
        rows.append(row)
    examples = [SimpleNamespace(question="q", golden_answers=["no way"], supporting_ids=None)] * 2
    # row 2: "yes no way" against "no way", precision 2/3, recall 1: F1 0.8 by either rule; Acc (R-Search's
    # acc_score: "no way" in "yes, no way") 1, row 1's 0
    for name, f1 in (("graph_r1", (2 / 3 + 0.8) / 2), ("search_r1", 0.8 / 2)):
        protocol = get_protocol(name)
        traj = traj_lib.assemble(rows, tok, protocol, timings={})
        engine = SimpleNamespace(protocol=protocol, rollout_examples=lambda *args: traj)
        metrics = heldout_metrics(engine, None, {"d": examples}, None)
        assert metrics["eval/d/f1"] == pytest.approx(f1) and metrics["eval/d/acc"] == pytest.approx(0.5)
