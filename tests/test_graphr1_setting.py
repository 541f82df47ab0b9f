"""Graph-R1's setting as EKA's fork of Graph-R1 runs it (yxzwang/EarlyKnowledgeAlignment, issue 39 defect 6):
where decoding stops, which observation tokens the loss mask trains, and the evaluation's F1.

Expected values come from running the authors' functions on the same input (on the same Qwen2.5 BPE): each is
cited beside it. The episodes run through `AgentEngine` with a scripted sampler (`ScriptedSampler`): no model.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsearch.agent.engine import AgentEngine
from jaxsearch.agent.protocols import GRAPH_R1_OBSERVATION, get_protocol
from jaxsearch.agent.sampler import STOP_BUDGET, SegmentResult
from jaxsearch.agent.trajectories import assemble, context_loss_mask, Row, OBSERVATION, POLICY
from jaxsearch.config import EpisodeConfig
from jaxsearch.data.qa_example import QAExample
from jaxsearch.eval import evaluate as ev
from jaxsearch.models.tokenizer import QwenTokenizer
from jaxsearch.retrieval.base import Doc

TOK = QwenTokenizer()


@dataclasses.dataclass
class _State:
    logits: jnp.ndarray


class ScriptedSampler:
    """The `Sampler` interface over scripted text: row b's k-th decode call writes scripts[b][k] followed by
    EOS (as a model decoding to its end of turn), cut where the real sampler stops: at the token that completes
    a stop string, at EOS, or at the budget (min(budget, max_segment)). Appended chunks are recorded."""

    def __init__(self, tokenizer, stop_strings, scripts, cache_len=4096, max_segment=512):
        self.tokenizer, self.stops, self.scripts = tokenizer, tuple(stop_strings), [list(s) for s in scripts]
        self.cache_len, self.max_segment = cache_len, max_segment
        self.appended = [[] for _ in scripts]

    def start(self, params, prompts, keys):
        return _State(jnp.zeros(1))

    def decode(self, params, state, budget, rows=None):
        b = len(self.scripts)
        budget = np.minimum(np.broadcast_to(np.asarray(budget), (b,)), self.max_segment)
        rows = []
        for i in range(b):
            if budget[i] <= 0:
                rows.append(([], STOP_BUDGET))
                continue
            text = self.scripts[i].pop(0) if self.scripts[i] else ""
            ids, stop = [], STOP_BUDGET
            for t in self.tokenizer.encode(text) + [self.tokenizer.eos_id]:
                if len(ids) == budget[i]:
                    break
                ids.append(t)
                if t == self.tokenizer.eos_id:
                    stop = len(self.stops)
                    break
                done = [k for k, s in enumerate(self.stops) if s in self.tokenizer.decode(ids)]
                if done:
                    stop = done[0]
                    break
            rows.append((ids, stop))
        width = max(1, max(len(ids) for ids, _ in rows))
        tokens = np.zeros((b, width), np.int32)
        for i, (ids, _) in enumerate(rows):
            tokens[i, : len(ids)] = ids
        zeros = np.zeros((b, width), np.float32)
        length = np.asarray([len(ids) for ids, _ in rows], np.int32)
        return SegmentResult(tokens, zeros, zeros, length, np.asarray([s for _, s in rows], np.int32)), state

    def append(self, params, state, chunks):
        for i, chunk in enumerate(chunks):
            self.appended[i].append(list(chunk))
        return state


class QueryRetriever:
    """One doc per query, its text naming the query."""

    def __init__(self):
        self.queries = []

    def search(self, queries, k):
        self.queries += list(queries)
        return [[Doc(f"d{len(self.queries)}-{j}", "Jaws", f"about {q.strip()}", 1.0) for j in range(k)]
                for q in queries]


def scripted_engine(protocol, scripts, limits, **sampler_kw):
    sampler = ScriptedSampler(TOK, protocol.stop_strings, scripts, **sampler_kw)
    return AgentEngine(TOK, protocol, QueryRetriever(), sampler, limits, internal_sampler=sampler)


# ------------------------------------------------------------------------------------- (a) stop strings

# what the policy would write in one call, to its EOS
ANSWER = "<think>\nJaws is a film.\n</think>\n<answer>\nSteven Spielberg\n</answer> I am done."
QUERY = '<think>\nWho directed it?\n</think>\n<query>\n{"query": "Jaws director"}\n</query> then more text'


def test_graph_r1_decodes_past_answer_and_cuts_at_query():
    limits = EpisodeConfig(max_turns=3, retrieval_k=1, max_segment_tokens=128, scheduler="lockstep")
    engine = scripted_engine(get_protocol("graph_r1"), [[ANSWER], [QUERY, ANSWER]], limits)
    traj = engine.rollout(None, ["Who directed Jaws?"] * 2, 0)
    # generation.py ToolGenerationManager._process_tool_call([ANSWER, QUERY]) with eos_token <|im_end|>:
    # (['<think>\nJaws is a film.\n</think>\n<answer>\nSteven Spielberg\n</answer> I am done.<|im_end|>',
    #   '<think>\nWho directed it?\n</think>\n<query>\n{"query": "Jaws director"}\n</query><|im_end|>'],
    #  [False, True])
    kept_answer = ANSWER + "<|im_end|>"
    kept_query = '<think>\nWho directed it?\n</think>\n<query>\n{"query": "Jaws director"}\n</query><|im_end|>'
    assert traj.responses[0] == kept_answer  # the whole call, to EOS: no stop at </answer>
    assert traj.answers[0] == "Steven Spielberg" and traj.turns[0] == 1
    # the query call ends at </query>; the EOS Graph-R1 appends opens our observation chunk
    assert traj.responses[1].startswith(kept_query)
    assert engine.retriever.queries == ["Jaws director"]
    assert traj.responses[1].endswith("<|im_start|>assistant\n<think>\n" + kept_answer)
    assert (traj.searches[1], traj.turns[1]) == (1, 2)


# ------------------------------------------------------------------------------------- (b) loss mask

KNOWLEDGE = '{"results": [{"<knowledge>": "Jaws was directed by Steven Spielberg.", "<coherence>": 1.0}]}'
Q_TEXT = '<think>\nWho directed it?\n</think>\n<query>\n{"query": "Jaws director"}\n</query>'
A_TEXT = "Spielberg directed it.\n</think>\n<answer>\nSteven Spielberg\n</answer>"


@pytest.mark.parametrize("name, tags", [("graph_r1", None), ("eka", "graph_r1")])
def test_graph_r1_loss_mask_trains_the_turn_change_around_knowledge(name, tags):
    protocol = get_protocol(name) if tags is None else get_protocol(name, tags=tags)
    q_ids = TOK.encode(Q_TEXT)
    obs_ids = TOK.encode(GRAPH_R1_OBSERVATION.format(knowledge=KNOWLEDGE), allow_special=True)
    a_ids = TOK.encode(A_TEXT) + [TOK.eos_id]
    row = Row(TOK.encode("prompt"), [])
    row.add(POLICY, q_ids, Q_TEXT)
    row.add(OBSERVATION, obs_ids, "")
    row.add(POLICY, a_ids, A_TEXT)
    traj = assemble([row], TOK, protocol, {})
    response = traj.loss_mask[0, len(row.prompt) :]
    # ray_trainer.py RayPPOTrainer._create_loss_mask on the response q_ids + obs_ids + a_ids (24 + 46 + 19
    # tokens): 1 on the policy's tokens; on the observation's 46 tokens [1] + [0] * 41 + [1] * 4, the trained
    # ones being '<|im_end|>', '\n', '<th', 'ink', '>\n'
    assert (len(q_ids), len(obs_ids), len(a_ids)) == (24, 46, 19)
    assert response.tolist() == [1] * 24 + [1] + [0] * 41 + [1] * 4 + [1] * 19
    trained = [TOK.decode([t]) for t, m in zip(obs_ids, response[24:70]) if m]
    assert trained == ["<|im_end|>", "\n", "<th", "ink", ">\n"]


def test_loss_mask_of_the_invalid_call_hint_and_of_a_cut_observation():
    protocol = get_protocol("graph_r1")
    hint_ids = TOK.encode(protocol.invalid_hint(), allow_special=True)
    mask = context_loss_mask(hint_ids, TOK, protocol)
    assert mask[0] == 1 and mask[-4:].tolist() == [1] * 4 and mask[1:-4].sum() == 0  # as an observation
    cut = hint_ids[:10]  # cut before </knowledge>: the knowledge is never trained
    assert context_loss_mask(cut, TOK, protocol).tolist() == [1] + [0] * 9
    # Search-R1's observations stay wholly masked (its info mask)
    obs = TOK.encode(get_protocol("search_r1").format_observation([Doc("d", "T", "x")]))
    assert context_loss_mask(obs, TOK, get_protocol("search_r1")).sum() == 0


def test_graph_r1_rollout_trains_the_observation_tokens_the_authors_train():
    limits = EpisodeConfig(max_turns=3, retrieval_k=1, max_segment_tokens=128, scheduler="lockstep")
    engine = scripted_engine(get_protocol("graph_r1"), [[QUERY, ANSWER]], limits)
    traj = engine.rollout(None, ["Who directed Jaws?"], 0)
    start = int(traj.prompt_lengths[0])
    tokens, mask = traj.tokens[0, start : int(traj.attention_mask[0].sum())], traj.loss_mask[0, start:]
    obs = engine.sampler.appended[0][0]
    at = next(i for i in range(len(tokens)) if tokens[i : i + len(obs)].tolist() == obs)
    assert mask[:at].all() and mask[at + len(obs) :].sum() == len(tokens) - at - len(obs)
    assert mask[at : at + len(obs)].tolist() == [1] + [0] * (len(obs) - 5) + [1] * 4


def test_invalid_call_hint_is_a_knowledge_turn_with_special_tokens():
    limits = EpisodeConfig(max_turns=3, retrieval_k=1, max_segment_tokens=128, scheduler="lockstep")
    engine = scripted_engine(get_protocol("graph_r1"), [["<query>Jaws director</query>", ANSWER]], limits)
    traj = engine.rollout(None, ["Who directed Jaws?"], 0)
    hint = engine.sampler.appended[0][0]
    # tool_env.py: the invalid-call text goes into the same template as knowledge (<|im_end|> a special token)
    assert hint == TOK.encode(get_protocol("graph_r1").invalid_hint(), allow_special=True)
    assert hint[0] == TOK.eos_id and int(traj.searches[0]) == 0 and traj.answers == ["Steven Spielberg"]


# ------------------------------------------------------------------------------------- (c) evaluation F1


class FixedAnswers:
    """An engine stand-in whose rollout answers each question with a fixed text (`run_batch`'s inputs)."""

    def __init__(self, protocol, answers):
        self.protocol, self.answers = protocol, answers

    def rollout_examples(self, params, examples, key, data_prompt):
        rows = []
        for ex in examples:
            row = Row(TOK.encode(ex.question), [])
            text = f"<think>\nx\n</think>\n<answer>\n{self.answers[ex.question]}\n</answer>"
            row.add(POLICY, TOK.encode(text), text)
            row.answer = self.answers[ex.question]
            rows.append(row)
        return assemble(rows, TOK, self.protocol, {})


# (prediction, golden answers, evaluation/eval.py cal_f1([gold], [pred]) -- no yes/no rule)
F1_CASES = [("no", ["no way"], 2 / 3), ("yes", ["yes , he did"], 0.5), ("No", ["no"], 1.0),
            ("no answer", ["noanswer"], 0.0)]


@pytest.mark.parametrize("name, tags", [("graph_r1", None), ("eka", "graph_r1")])
def test_graph_r1_eval_f1_is_the_authors_plain_token_f1(name, tags):
    protocol = get_protocol(name) if tags is None else get_protocol(name, tags=tags)
    examples = [QAExample(f"q{i}", f"Question {i}?", gold) for i, (_, gold, _) in enumerate(F1_CASES)]
    engine = FixedAnswers(protocol, {ex.question: pred for ex, (pred, _, _) in zip(examples, F1_CASES)})
    records = ev.run_batch(engine, None, examples, 0, len(examples))
    assert [r["metrics"]["f1"] for r in records] == pytest.approx([f1 for *_, f1 in F1_CASES])
    # FlashRAG's yes/no rule stays where it came from (search_r1 evaluates as FlashRAG)
    search_r1 = ev.run_batch(FixedAnswers(get_protocol("search_r1"), engine.answers), None, examples, 0, 4)
    assert [r["metrics"]["f1"] for r in search_r1] == pytest.approx([0.0, 0.0, 1.0, 0.0])
