"""R-Search's evidence-free ablation (seed 002 §5.2, Table 3: "removes evidence from rollout and disables
evidence-related rewards in the evidence and format reward"; issue 39 item 8(d)).

QingFei1/R-Search (commit ecba08ded37ec428e9e6ec181e8dadb9e6819756) ships no prompt, script or flag for the
variant, so the references here are (a) the authors' evidence template typed out from
scripts/pre_train_data.sh with its evidence sentences deleted, and (b) values from running the authors' own
reward pieces (qa_f1.py `extract_solution` and `F1_check`, summed as `compute_score_f1` does with its evidence
lines left out) on the same trajectories, in a scratch directory outside this project.
"""

import json
import os
import re

import pytest

from configs import rsearch_7b, rsearch_7b_no_evidence, tiny_cpu_rsearch, tiny_cpu_rsearch_no_evidence
from jaxsearch.agent.protocols import get_protocol
from jaxsearch.agent.sft_traces import build_world_tokenizer, policy_segments
from jaxsearch.config import RunConfig
from jaxsearch.data.world.generator import generate_world, world_config
from jaxsearch.data.world.oracle import Step
from jaxsearch.retrieval.base import Doc
from jaxsearch.scoring import rewards as R
from jaxsearch.scoring.judge import reward_fn_from_config
from jaxsearch.scoring.rewards import RewardInput

# scripts/pre_train_data.sh `system_template` (lines 2-4), typed out, with R-Search's tag names
AUTHORS_TEMPLATE = (
    "You are a helpful assistant that can solve the given question step by step. For each step, start by "
    "explaining your thought process. If additional information is needed, provide a specific query enclosed "
    "in <search> and </search>. The system will return the top search results within <observation> and "
    "</observation>. You can perform multiple searches as needed.\nWhen you know the final answer, use "
    "<original_evidence> and </original_evidence> to provide all potentially relevant original information "
    "from the observations. Ensure the information is complete and preserves the original wording without "
    "modification. If no searches were conducted or observations were made, omit the evidence section. "
    "Finally, provide the final answer within <answer> and </answer> tags."
)
# its three sentences that ask for the evidence
AUTHORS_EVIDENCE_SENTENCES = (
    "When you know the final answer, use <original_evidence> and </original_evidence> to provide all "
    "potentially relevant original information from the observations. ",
    "Ensure the information is complete and preserves the original wording without modification. ",
    "If no searches were conducted or observations were made, omit the evidence section. ",
)
# the project's tag names for R-Search's (agent/protocols.py docstring)
RENAME = (("<observation>", "<information>"), ("</observation>", "</information>"))


def renamed(text):
    for old, new in RENAME:
        text = text.replace(old, new)
    return text


def test_no_evidence_prompt_is_the_authors_template_without_its_evidence_sentences():
    template = AUTHORS_TEMPLATE
    for sentence in AUTHORS_EVIDENCE_SENTENCES:
        assert template.count(sentence) == 1
        template = template.replace(sentence, "")
    expected = renamed(template)
    # the same, typed out in full
    assert expected == (
        "You are a helpful assistant that can solve the given question step by step. For each step, start by "
        "explaining your thought process. If additional information is needed, provide a specific query "
        "enclosed in <search> and </search>. The system will return the top search results within "
        "<information> and </information>. You can perform multiple searches as needed.\nFinally, provide "
        "the final answer within <answer> and </answer> tags."
    )
    protocol = get_protocol("rsearch_no_evidence")
    messages = protocol.build_messages(" Who wrote Hamlet? ")
    assert messages == [
        {"role": "system", "content": expected},
        {"role": "user", "content": "Who wrote Hamlet?"},  # as rsearch: the question is the user turn
    ]
    assert "evidence" not in messages[0]["content"]
    # the full protocol keeps the authors' template (both evidence tags renamed)
    full = renamed(AUTHORS_TEMPLATE).replace("original_evidence>", "evidence>")
    assert get_protocol("rsearch").build_messages("Q?")[0]["content"] == full


def test_the_rollout_is_rsearchs_but_for_the_prompt():
    full, ablated = get_protocol("rsearch"), get_protocol("rsearch_no_evidence")
    assert (full.writes_evidence, ablated.writes_evidence) == (True, False)
    assert ablated.stop_strings == full.stop_strings == ("</search>", "</answer>")
    docs = [Doc("1", "Hamlet", "Hamlet is a tragedy by William Shakespeare.")]
    assert ablated.format_observation(docs) == full.format_observation(docs)
    segment = "I need the author. <search> Hamlet author </search>"
    assert ablated.parse_action(segment) == full.parse_action(segment)


def test_sft_traces_of_the_ablation_write_no_evidence():
    trace = [
        Step("search", "Hamlet author", "p1", "Hamlet", "written_by", fact="Hamlet is by Shakespeare."),
        Step("answer", "Shakespeare"),
    ]
    full = policy_segments(get_protocol("rsearch"), trace)
    ablated = policy_segments(get_protocol("rsearch_no_evidence"), trace)
    assert ablated[0] == full[0] == "I need the author of Hamlet.\n<search> Hamlet author </search>"
    assert full[1] == (
        "The answer is Shakespeare.\n<evidence> Hamlet is by Shakespeare. </evidence>\n"
        "<answer> Shakespeare </answer>"
    )
    assert ablated[1] == "The answer is Shakespeare.\n<answer> Shakespeare </answer>"


def test_the_tiny_worlds_tokenizer_holds_the_ablation_prompt_word_for_word():
    """tiny_cpu_rsearch_no_evidence's tokenizer is the world's (built from the other protocols' prompts)."""
    tokenizer = build_world_tokenizer(generate_world(world_config("tiny", seed=0)))
    prompt = tokenizer.apply_chat_template(get_protocol("rsearch_no_evidence").build_messages("Who?"))
    assert tokenizer.decode(tokenizer.encode(prompt, allow_special=True)) == prompt
    vocabulary = {tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)}
    for word in re.findall(r"[A-Za-z]+", prompt):  # no word falls back to characters
        assert {word, " " + word} & vocabulary, word


# --------------------------------------------------------------------------------------------- rewards

OBS = (
    "\n\n<information>(Title: Inception) Inception is a 2010 science fiction action film written and "
    "directed by Christopher Nolan.</information>\n\n"
)
QUESTION, GOLD = "Who directed the film Inception?", ["Christopher Nolan"]
# (id, response, authors' value). The value: qa_f1.py extract_solution(solution_str) -> (ans_format, answer),
# then 0.2 * ans_format + (0 if answer is None else F1_check(answer, golden_answers)): compute_score_f1
# (lines 147-173) without its evidence lines (evid_format's 0.2 and evidence_eval). solution_str was Qwen2.5's
# chat template around the ablation's system prompt (R-Search's tag names) and the question, + the response
# with <observation> / <original_evidence> for <information> / <evidence>.
HAND_CASES = [
    ("search_then_answer", "I need the director. <search>Inception film director</search>" + OBS
     + "<answer>Christopher Nolan</answer>", 1.2),
    ("no_search_partial_answer", "I know it. <answer>the director Nolan</answer>", 0.7),
    ("stray_evidence_ignored", "<search>Inception director</search>" + OBS
     + "<evidence>Inception is by Nolan.</evidence>\n<answer>Christopher Nolan</answer>", 1.2),
    ("two_answers_last_scored", "<search>Inception director</search>" + OBS
     + "<answer>Nolan</answer> or <answer>Christopher Nolan</answer>", 1.0),
    ("answer_and", "<search>Inception director</search>" + OBS + "<answer>and</answer>", 0.0),
    ("empty_answer", "<search>Inception director</search>" + OBS + "<answer> </answer>", 0.0),
    ("no_answer", "<search>Inception director</search>" + OBS + "I could not tell.", 0.0),
]  # fmt: skip


@pytest.fixture(scope="module")
def ablated_reward():
    """The tiny ablation config's reward, built as the trainer builds it (no evidence model is configured)."""
    return reward_fn_from_config(RunConfig.from_dict(tiny_cpu_rsearch_no_evidence.get_config()))


@pytest.mark.parametrize("case", HAND_CASES, ids=[c[0] for c in HAND_CASES])
def test_ablation_reward_equals_the_authors_pieces(case, ablated_reward):
    _, response, authors = case
    total, terms = ablated_reward.score([RewardInput(response, GOLD, QUESTION)])
    assert total[0] == pytest.approx(authors)
    assert set(terms) == {"rsearch_f1", "rsearch_format_no_evidence"}
    assert terms["rsearch_format_no_evidence"][0] in (0.0, 0.2)  # the answer flag alone


def test_no_search_earns_no_evidence_credit_in_the_ablation():
    # qa_f1.py extract_solution: no evidence and no observation is the evidence flag's 0.2 in the full format
    # reward (0.2 + 0.2 = 0.4); the ablation has no evidence flag (0.2, hand-computed)
    response = "I know it. <answer>Christopher Nolan</answer>"
    assert R.rsearch_format_score(response) == pytest.approx(0.4)
    assert R.rsearch_format_score(response, evidence=False) == pytest.approx(0.2)


def test_ablation_reward_on_the_recorded_authors_cases(ablated_reward):
    """tests/data/reward_cases/rsearch.json holds the authors' answer F1 and answer-format flag of 40 full
    R-Search trajectories (qa_f1.py run on them): the ablation's reward is their sum, whatever the
    evidence."""
    path = os.path.join(os.path.dirname(__file__), "data", "reward_cases", "rsearch.json")
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    samples = [RewardInput(c["response"], c["golden_answers"], c["question"]) for c in cases]
    total, _ = ablated_reward.score(samples)
    want = [c["expected"]["answer_f1"] + c["expected"]["format_answer"] for c in cases]
    assert total.tolist() == pytest.approx(want)


# --------------------------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    "ablation, parent",
    [(tiny_cpu_rsearch_no_evidence, tiny_cpu_rsearch), (rsearch_7b_no_evidence, rsearch_7b)],
)
def test_config_differs_from_rsearch_in_the_evidence_only(ablation, parent):
    ablated = RunConfig.from_dict(ablation.get_config()).to_dict()
    full = RunConfig.from_dict(parent.get_config()).to_dict()
    assert ablated.pop("protocol")["name"] == "rsearch_no_evidence"
    assert full.pop("protocol")["name"] == "rsearch"
    # §5.2: the evidence reward and the evidence's format credit go; answer F1 and the answer's format stay
    assert full.pop("reward")["terms"] == (("rsearch_f1", 1.0), ("evidence", 1.0), ("rsearch_format", 1.0))
    assert ablated.pop("reward")["terms"] == (("rsearch_f1", 1.0), ("rsearch_format_no_evidence", 1.0))
    assert ablated.pop("evidence_model") is None and full.pop("evidence_model") is not None
    assert ablated == full
