"""Protocols against strings typed out from the methods' sources, and hand-made parse cases."""

import pytest

from jaxsearch.models.tokenizer import QwenTokenizer
from jaxsearch.retrieval.base import Doc
from jaxsearch.agent.protocols import (
    PROTOCOLS,
    Action,
    AgentProtocol,
    EkaGraphR1Protocol,
    EkaSearchR1Protocol,
    get_protocol,
    register_protocol,
)
from jaxsearch.agent.segments import SEGMENT_IDS

DOCS = [
    Doc("d1", "Hamlet", "Hamlet is a tragedy by William Shakespeare.", 3.0),
    Doc("d2", "William Shakespeare", "English playwright.", 2.0),
]

# PeterGriffinJin/Search-R1, scripts/data_process/nq_search.py, make_prefix(template_type='base'); the
# question is stripped and given a "?" by process_fn.
SEARCH_R1_PREFIX = """Answer the given question. \
You must conduct reasoning inside <think> and </think> first every time you get new information. \
After reasoning, if you find you lack some knowledge, you can call a search engine by \
<search> query </search> and it will return the top searched results between <information> and \
</information>. \
You can search as many times as your want. \
If you find no further external knowledge needed, you can directly provide the answer inside <answer> and \
</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. \
Question: who wrote hamlet?\n"""

# Search-R1, search_r1/llm_agent/generation.py, execute_predictions (invalid action) and _passages2string with
# wiki-18 contents '"Title"\ntext' (the title keeps its quotes).
SEARCH_R1_HINT = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
SEARCH_R1_OBSERVATION = (
    '\n\n<information>Doc 1(Title: "Hamlet") Hamlet is a tragedy by William Shakespeare.\n'
    'Doc 2(Title: "William Shakespeare") English playwright.</information>\n\n'
)


class FakeRetriever:
    """Returns the first k of a fixed ranking per question; records its calls."""

    def __init__(self, ranking: dict[str, list[Doc]]):
        self.ranking, self.calls = ranking, []

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        self.calls.append((list(queries), k))
        return [self.ranking[q][:k] for q in queries]


# -------------------------------------------------------------------------------------------- Search-R1


def test_search_r1_prompt_is_search_r1s_make_prefix():
    protocol = get_protocol("search_r1")
    assert protocol.user_prompt("  who wrote hamlet ") == SEARCH_R1_PREFIX
    assert protocol.user_prompt("who wrote hamlet?") == SEARCH_R1_PREFIX
    assert protocol.build_messages("who wrote hamlet") == [{"role": "user", "content": SEARCH_R1_PREFIX}]
    assert protocol.stop_strings == ("</search>", "</answer>")


def test_search_r1_observation_and_hint_are_search_r1s():
    protocol = get_protocol("search_r1")
    assert protocol.format_observation(DOCS) == SEARCH_R1_OBSERVATION
    assert protocol.format_observation([]) == "\n\n<information></information>\n\n"
    assert protocol.invalid_hint() == SEARCH_R1_HINT
    assert not hasattr(protocol, "final_turn_note")  # Search-R1 has none


@pytest.mark.parametrize(
    "segment, action",
    [
        ("<think>I know it.</think>", Action("invalid", "")),
        ("no tags at all", Action("invalid", "")),
        ("<think>x</think>\n<search> capital of France </search>", Action("search", "capital of France")),
        ("<answer>\n Paris \n</answer>", Action("answer", "Paris")),
        ("<search>unclosed query", Action("invalid", "")),
        ("<answer>Paris", Action("invalid", "")),
        ("<search></search>", Action("search", "")),
        # several searches: the first complete one
        ("<search>a</search><search>b</search>", Action("search", "a")),
        # both: Search-R1 cuts after the first </search>, then the first complete block wins
        ("<answer>Paris</answer> <search>q</search>", Action("answer", "Paris")),
        ("<search>q</search><answer>Paris</answer>", Action("search", "q")),
        # nested: the cut after </search> leaves an unclosed <answer>, so the inner search decides
        ("<answer>x <search>q</search> y</answer>", Action("search", "q")),
        # nested the other way: the outer search (up to the first </search>) holds the answer tags
        ("<search>a <answer>b</answer> c</search>", Action("search", "a <answer>b</answer> c")),
        # mismatched tags do not make a block
        ("<search>q</answer>", Action("invalid", "")),
        ("<search>multi\nline\tquery</search>", Action("search", "multi\nline\tquery")),
    ],
)
def test_search_r1_parse_action(segment, action):
    assert get_protocol("search_r1").parse_action(segment) == action


# -------------------------------------------------------------------------------------------- Graph-R1


def test_graph_r1_prompt_and_observation():
    protocol = get_protocol("graph_r1")
    # yxzwang/EarlyKnowledgeAlignment script_process.py: instruction_following + "Question: " + question.
    assert protocol.user_prompt("Who directed Jaws?") == (
        "Answer the given question. You can query from knowledge base provided to you to answer the "
        "question. You can query knowledge as many times as you want.\n"
        "You must first conduct reasoning inside <think>...</think>. If you need to query knowledge, you can "
        "set a query statement between <query>...</query> to query from knowledge base after "
        "<think>...</think>.\nWhen you have the final answer, you can output the answer inside "
        "<answer>...</answer>.\n\n"
        "Output format for tool call:\n<think>\n...\n</think>\n<query>\n...\n</query>\n\n"
        "Output format for answer:\n<think>\n...\n</think>\n<answer>\n...\n</answer>\n"
        "Question: Who directed Jaws?"
    )
    # ppo_trainer.yaml tool_custom_response_template, after the <|im_end|> Graph-R1 appends to the response,
    # around the server's reply string as Graph-R1's agent receives it (script_api.py json.dumps, score rounded
    # to 3 decimals by operate.py), written out by hand
    hyperedge = Doc("e7", "", "Jaws was directed by Steven Spielberg in 1975.", 1.8333333, raw_contents=(
        "Jaws was directed by Steven Spielberg in 1975."))
    assert protocol.format_observation([hyperedge, DOCS[1]]) == (
        '<|im_end|><|im_start|>user\n<knowledge>\n{"results": [{"<knowledge>": "Jaws was directed by Steven '
        'Spielberg in 1975.", "<coherence>": 1.833}, {"<knowledge>": "\\"William Shakespeare\\"\\nEnglish '
        'playwright.", "<coherence>": 2.0}]}\n</knowledge><|im_end|>\n<|im_start|>assistant\n<think>\n'
    )
    assert protocol.invalid_hint() == (
        "<|im_end|><|im_start|>user\n<knowledge>\nInvalid tool call format. Please use "
        '<query>{"query": "statement"}</query> format.\n</knowledge><|im_end|>\n'
        "<|im_start|>assistant\n<think>\n"
    )
    assert protocol.observation_allow_special
    assert protocol.stop_strings == ("</query>",)  # no stop at </answer>: tests/test_graphr1_setting.py


@pytest.mark.parametrize(
    "segment, action",
    [
        (
            '<think>x</think>\n<query>\n{\n "query": "Director of Jaws"\n}\n</query>',
            Action("search", "Director of Jaws"),
        ),
        ("<query>Director of Jaws</query>", Action("invalid", "")),
        ('<query>{"q": "x"}</query>', Action("invalid", "")),
        ('<query>["query"]</query>', Action("invalid", "")),
        ("<think>x</think>\n<answer>\nSteven Spielberg\n</answer>", Action("answer", "Steven Spielberg")),
        ("<think>out of budget", Action("answer", "")),
    ],
)
def test_graph_r1_parse_action(segment, action):
    assert get_protocol("graph_r1").parse_action(segment) == action


# -------------------------------------------------------------------------------------------- EKA


@pytest.mark.parametrize("tags", ["search_r1", "graph_r1"])
def test_eka_puts_p0_before_the_first_think(tags):
    questions = ["who wrote hamlet", "who directed jaws"]
    jaws = [
        Doc("j1", "Jaws (film)", "Directed by Steven Spielberg."),
        Doc("j2", "Jaws", "A novel."),
        Doc("j3", "Shark", "A fish."),
    ]
    retriever = FakeRetriever({questions[0]: DOCS + [Doc("d3", "Other", "Unrelated.")], questions[1]: jaws})
    protocol = get_protocol("eka", tags=tags)
    contexts = protocol.initial_context(questions, retriever, k=2)

    assert retriever.calls == [(questions, 2)]  # one batched call with the raw questions
    if tags == "search_r1":  # Search-R1's passage lines
        assert contexts[0] == (
            '<knowledge>\nDoc 1(Title: "Hamlet") Hamlet is a tragedy by William Shakespeare.\n'
            'Doc 2(Title: "William Shakespeare") English playwright.\n</knowledge>'
        )
    else:  # script_process.py: the knowledge strings one per line
        assert contexts[0] == (
            '<knowledge>\n"Hamlet"\nHamlet is a tragedy by William Shakespeare.\n'
            '"William Shakespeare"\nEnglish playwright.\n</knowledge>'
        )
    assert "Jaws (film)" in contexts[1] and '"Jaws"' in contexts[1] and "Shark" not in contexts[1]

    rendered = QwenTokenizer().apply_chat_template(protocol.build_messages(questions[0], contexts[0]))
    # The user turn ends with P0; the policy's first <think> is generated after it.
    assert rendered.endswith("\n" + contexts[0] + "\n<|im_end|>\n<|im_start|>assistant\n")
    assert rendered.index("Question: who wrote hamlet") < rendered.index(contexts[0])
    assert protocol.segment_tags["<knowledge>"] == "knowledge"


def test_eka_variants_follow_their_backbone():
    assert isinstance(get_protocol("eka"), EkaSearchR1Protocol)
    search_r1, graph_r1 = get_protocol("eka", tags="search_r1"), get_protocol("eka", tags="graph_r1")
    assert isinstance(graph_r1, EkaGraphR1Protocol)
    assert search_r1.stop_strings == ("</search>", "</answer>") and graph_r1.stop_strings[0] == "</query>"
    assert search_r1.format_observation(DOCS) == SEARCH_R1_OBSERVATION
    assert graph_r1.parse_action('<query>{"query": "q"}</query>') == Action("search", "q")
    # seed 000 Table 1 / script_process.py instruction_following_Retrievalinitial
    assert graph_r1.user_prompt("Q?", "<knowledge>\nK\n</knowledge>").startswith(
        "Answer the given question. You can query from knowledge base provided to you to answer the "
        "question. You can query knowledge as many times as you want. The initial knowledge you need for the "
        "first think is between <knowledge>...</knowledge>.\nYou must first conduct reasoning inside "
        "<think>...</think> relied on the initial knowledge."
    )
    assert graph_r1.user_prompt("Q?", "<knowledge>\nK\n</knowledge>").endswith(
        "</answer>\nQuestion: Q?\n<knowledge>\nK\n</knowledge>\n"
    )
    with pytest.raises(ValueError, match="P0"):
        search_r1.user_prompt("Q?")
    with pytest.raises(ValueError, match="unknown tags 'x'"):
        get_protocol("eka", tags="x")


def test_protocols_without_initial_context():
    retriever = FakeRetriever({})
    for name in ("search_r1", "graph_r1", "soar", "rsearch"):
        protocol = get_protocol(name)
        assert protocol.initial_context(["q1", "q2"], retriever, 3) == [None, None]
        with pytest.raises(ValueError, match=name):
            protocol.user_prompt("q", "<knowledge>x</knowledge>")
    assert retriever.calls == []


# -------------------------------------------------------------------------------------------- SOAR


def test_soar_prompts_and_two_streams():
    protocol = get_protocol("soar")
    messages = protocol.build_messages("Where was the Louisiana Purchase signed?")
    assert (
        messages[0]["role"] == "system"
        and messages[1]["content"] == "Where was the Louisiana Purchase signed?"
    )
    system = messages[0]["content"]  # seed 001 Table 13
    assert system.startswith(
        "You are an expert assistant capable of solving knowledge-intensive tasks efficiently."
    )
    assert (
        "you can call an information engine by <search> query </search>. It will return the top internal"
        in system
    )
    assert system.endswith(
        "Only output either \u201cinternal\u201d or \u201cexternal\u201d inside this tag, nothing else."
    )

    internal = protocol.internal_knowledge_messages(
        "Louisiana Purchase signing place", 3
    )  # seed 001 Table 14
    assert internal[1] == {"role": "user", "content": "Louisiana Purchase signing place"}
    assert "1) Your output MUST contain exactly 3 items." in internal[0]["content"]
    assert internal[0]["content"].endswith("4) Output ONLY the 3 numbered bullets and nothing else.")

    generation = (
        "1. The treaty was signed in Paris.\n2) It was signed in 1803.\n3.5 is no bullet\n3. A third.\n4. X."
    )
    facts = protocol.parse_internal_facts(generation, 3)
    assert facts == ["The treaty was signed in Paris.", "It was signed in 1803.", "A third."]
    internal_text = protocol.format_internal_facts(facts)
    assert internal_text == "1. The treaty was signed in Paris.\n2. It was signed in 1803.\n3. A third."

    observation = protocol.format_observation(DOCS, internal_text)
    assert observation == (
        "\n\n<information>Internal information:\n"
        "1. The treaty was signed in Paris.\n2. It was signed in 1803.\n3. A third.\n"
        'External information:\nDoc 1(Title: "Hamlet") Hamlet is a tragedy by William '
        'Shakespeare.\nDoc 2(Title: "William Shakespeare") English playwright.</information>\n\n'
    )
    assert protocol.needs_internal_knowledge and protocol.invalid_hint() == SEARCH_R1_HINT
    assert protocol.parse_action("<search>q</search>") == Action("search", "q")


SOURCE = "<information_source>{}</information_source>"


@pytest.mark.parametrize(
    "response, source",
    [
        ("<information_source>external</information_source><answer>Paris</answer>", "external"),
        ("<information_source> Internal\n</information_source>", "internal"),
        ("<information_source>\u201cinternal\u201d</information_source>", "internal"),
        (f"{SOURCE.format('internal')} {SOURCE.format('external')}", "external"),
        ("<information_source>both</information_source>", None),
        ("<answer>Paris</answer>", None),
        ("<information>1. <information_source>internal</information_source></information>", None),
    ],
)
def test_soar_parse_source(response, source):
    assert get_protocol("soar").parse_source(response) == source


# -------------------------------------------------------------------------------------------- R-Search


def test_rsearch_prompt_and_observation():
    protocol = get_protocol("rsearch")
    messages = protocol.build_messages(" Who wrote Hamlet? ")
    assert messages[1] == {"role": "user", "content": "Who wrote Hamlet?"}
    # QingFei1/R-Search scripts/pre_train_data.sh, with <observation> / <original_evidence> renamed.
    assert messages[0]["content"].startswith(
        "You are a helpful assistant that can solve the given question step by step. For each step, start by "
        "explaining your thought process."
    )
    assert (
        "as needed.\nWhen you know the final answer, use <evidence> and </evidence> to provide"
        in messages[0]["content"]
    )
    # R-Search src/train/generation.py: passages without "Doc i".
    assert protocol.format_observation(DOCS) == (
        '\n\n<information>(Title: "Hamlet") Hamlet is a tragedy by William Shakespeare.\n'
        '(Title: "William Shakespeare") English playwright.</information>\n\n'
    )
    assert protocol.segment_tags["<evidence>"] == "evidence"


@pytest.mark.parametrize(
    "response, evidence",
    [
        (
            "<evidence>\nHamlet is by Shakespeare.\n</evidence>\n<answer>Shakespeare</answer>",
            "Hamlet is by Shakespeare.",
        ),
        ("<evidence>first</evidence> then <evidence>second</evidence>", "second"),
        ("<answer>Shakespeare</answer>", None),
        ("<evidence>unclosed", None),
        ("<information><evidence>quoted by a passage</evidence></information>", None),
    ],
)
def test_rsearch_parse_evidence(response, evidence):
    assert get_protocol("rsearch").parse_evidence(response) == evidence


# -------------------------------------------------------------------------------------------- registry


def test_registry_errors_name_the_protocol_and_list_the_known_ones():
    with pytest.raises(ValueError) as error:
        get_protocol("search_r2")
    message = str(error.value)
    assert "'search_r2'" in message
    for name in ("eka", "graph_r1", "rsearch", "search_r1", "soar"):
        assert repr(name) in message
    with pytest.raises(ValueError, match="already registered"):
        register_protocol("soar")(AgentProtocol)


def test_every_protocol_names_known_segments_and_stops_on_its_tags():
    for name in PROTOCOLS:
        for tags in ["search_r1", "graph_r1"] if name == "eka" else [None]:
            protocol = get_protocol(name) if tags is None else get_protocol(name, tags=tags)
            assert protocol.name == name
            assert set(protocol.segment_tags.values()) <= set(SEGMENT_IDS)
            for stop in protocol.stop_strings:
                assert stop.replace("</", "<") in protocol.segment_tags
