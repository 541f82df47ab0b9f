"""Segment labels against hand-labelled token sequences (tags split across tokens in different ways)."""

import numpy as np
import pytest

from jaxsearch.models.tokenizer import QwenTokenizer
from jaxsearch.agent.segments import SEGMENT_IDS, label_batch, label_token_segments

TAGS = {
    "<think>": "think",
    "<search>": "search",
    "<information>": "information",
    "<answer>": "answer",
    "<information_source>": "information_source",
}
OT, TH, S, A, SRC, INF, K, EV = 0, 1, 2, 3, 5, 6, 7, 4


def labels(pairs, tags=TAGS):
    """pairs: [(token text, expected id)] -> (labels, expected)."""
    got = label_token_segments([t.encode() for t, _ in pairs], tags)
    return got.tolist(), [e for _, e in pairs]


def test_ids_are_the_documented_table():
    assert SEGMENT_IDS == {
        "other": 0,
        "think": 1,
        "search": 2,
        "answer": 3,
        "evidence": 4,
        "information_source": 5,
        "information": 6,
        "knowledge": 7,
    }


def test_tags_split_into_three_tokens():
    got, want = labels(
        [
            ("<", TH),
            ("think", TH),
            (">", TH),
            ("a", TH),
            (" b", TH),
            ("</", TH),
            ("think", TH),
            (">", TH),
            ("\n", OT),
            ("<", S),
            ("search", S),
            (">", S),
            ("q", S),
            ("</", S),
            ("search", S),
            (">", S),
        ]
    )
    assert got == want


def test_token_with_text_on_both_sides_of_a_tag():
    # "ing</" holds think text and the start of </think>; ">\n\n" ends </search> and then is plain text.
    got, want = labels(
        [
            ("<think>", TH),
            ("think", TH),
            ("ing</", TH),
            ("think>", TH),
            ("\n\n", OT),
            ("<search>", S),
            ("q", S),
            ("</search", S),
            (">\n\n", S),
            ("<information>", INF),
            ("Doc 1", INF),
            ("</information>", INF),
            ("\n\n", OT),
        ]
    )
    assert got == want


def test_token_that_opens_a_tag_after_other_text_belongs_to_that_tag():
    got, want = labels(
        [
            ("<think>", TH),
            ("t", TH),
            ("</think>", TH),
            (" <", A),
            ("answer", A),
            (">", A),
            ("x", A),
            ("</answer>", A),
            ("<|im_end|>", OT),
        ]
    )
    assert got == want


def test_token_that_closes_and_opens_belongs_to_the_one_it_closes():
    got, want = labels(
        [
            ("<think", TH),
            (">", TH),
            ("t", TH),
            ("</think", TH),
            (">\n<", TH),
            ("search", S),
            (">", S),
            ("q", S),
            ("</search>", S),
        ]
    )
    assert got == want


def test_tag_split_mid_name_and_multibyte_character_split():
    pairs = [
        (b"<thi", TH),
        (b"nk>", TH),
        (b"caf\xc3", TH),
        (b"\xa9", TH),
        (b"</th", TH),
        (b"ink>", TH),
        (b" done", OT),
    ]
    got = label_token_segments([t for t, _ in pairs], TAGS).tolist()
    assert got == [e for _, e in pairs]


def test_segments_do_not_nest_and_stray_closers_are_text():
    got, want = labels(
        [
            ("</answer>", OT),
            ("<information>", INF),
            ("<answer>", INF),
            ("x", INF),
            ("</answer>", INF),
            ("</think>", INF),
            ("</information>", INF),
            ("<answer>", A),
            ("y", A),
            ("</answer>", A),
        ]
    )
    assert got == want


def test_unclosed_segment_runs_to_the_end():
    got, want = labels([("pre", OT), ("<answer>", A), ("Paris", A), (" and", A)])
    assert got == want


def test_similar_tag_names_are_told_apart():
    got, want = labels(
        [
            ("<information_source>", SRC),
            ("external", SRC),
            ("</information_source>", SRC),
            ("\n", OT),
            ("<information>", INF),
            ("d", INF),
            ("</information>", INF),
        ]
    )
    assert got == want


def test_protocol_specific_tags():
    tags = {"<query>": "search", "<knowledge>": "knowledge", "<evidence>": "evidence"}
    got, want = labels(
        [
            ("<knowledge>", K),
            ("P0", K),
            ("</knowledge>", K),
            ("<think>", OT),
            ("<query>", S),
            ("q", S),
            ("</query>", S),
            ("<evidence>", EV),
            ("e", EV),
            ("</evidence>", EV),
        ],
        tags,
    )
    assert got == want


def test_empty_inputs():
    assert label_token_segments([], TAGS).shape == (0,)
    assert label_token_segments([b"<think>", b"x"], {}).tolist() == [0, 0]


def test_bad_tags_are_errors():
    with pytest.raises(ValueError, match="'think'"):
        label_token_segments([b"x"], {"think": "think"})
    with pytest.raises(ValueError, match="unknown segment 'thought'"):
        label_token_segments([b"x"], {"<think>": "thought"})


def test_label_batch_right_padded_rows():
    vocab = {0: b"<pad>", 1: b"<", 2: b"think", 3: b">", 4: b"hm", 5: b"</", 6: b"answer", 7: b" <", 8: b"x"}
    ids = np.array(
        [
            [1, 2, 3, 4, 5, 2, 3, 7, 6, 3, 8, 0],
            [7, 6, 3, 8, 5, 6, 3, 0, 0, 0, 0, 0],
        ]
    )
    got = label_batch(ids, [11, 7], vocab.__getitem__, TAGS)
    assert got.dtype == np.int32
    assert got.tolist() == [
        [TH, TH, TH, TH, TH, TH, TH, A, A, A, A, 0],
        [A, A, A, A, A, A, A, 0, 0, 0, 0, 0],
    ]


def test_label_batch_checks_lengths():
    with pytest.raises(ValueError, match="lengths"):
        label_batch(np.zeros((1, 3), int), [4], lambda i: b"a", TAGS)


def test_qwen_tokens_of_a_search_r1_trajectory():
    tokenizer = QwenTokenizer()
    text = (
        "<think>I need the author.</think>\n<search> author of hamlet </search>"
        "\n\n<information></information>\n\n<think>thinking</think> <answer> Shakespeare </answer>"
    )
    pairs = [
        (b"<th", TH), (b"ink", TH), (b">I", TH), (b" need", TH), (b" the", TH), (b" author", TH),
        (b".</", TH), (b"think", TH), (b">\n", TH),
        (b"<", S), (b"search", S), (b">", S), (b" author", S), (b" of", S), (b" ham", S), (b"let", S),
        (b" </", S), (b"search", S), (b">\n\n", S),
        (b"<", INF), (b"information", INF), (b"></", INF), (b"information", INF), (b">\n\n", INF),
        (b"<th", TH), (b"ink", TH), (b">", TH), (b"thinking", TH), (b"</", TH), (b"think", TH), (b">", TH),
        (b" <", A), (b"answer", A), (b">", A), (b" Shakespeare", A), (b" </", A), (b"answer", A), (b">", A),
    ]  # fmt: skip
    ids = tokenizer.encode(text)
    assert [tokenizer.token_bytes(i) for i in ids] == [t for t, _ in pairs]
    got = label_batch(np.array([ids]), [len(ids)], tokenizer.token_bytes, TAGS)
    assert got[0].tolist() == [e for _, e in pairs]


def test_an_observation_is_labelled_on_its_own_whatever_the_policy_left_open():
    """A sampled `<think>` left open before a search (the tiny searcher at temperature 1 writes
    `<think> ... </search><search> q </search>`): the segment ends where the observation begins, the
    observation is information (its leading newlines other), and the policy's next chunk is labelled afresh."""
    from jaxsearch.agent.trajectories import HINT, OBSERVATION, POLICY, response_segments

    class Bytes:  # token id i is texts[i]
        def token_bytes(self, i):
            return texts[i].encode()

    pairs = {
        POLICY: [("<think>", TH), (" a", TH), ("</search>", TH), ("<search>", TH), (" q", TH), ("</search>", TH)],
        OBSERVATION: [("\n\n", OT), ("<information>", INF), ("doc", INF), ("</information>", INF), ("\n\n", OT)],
        HINT: [("<think>", TH), (" b", TH), ("</think>", TH), ("<answer>", A), ("x", A)],
    }
    texts, chunks, want = [], [], []
    for kind in (POLICY, OBSERVATION, HINT):
        ids = list(range(len(texts), len(texts) + len(pairs[kind])))
        texts += [t for t, _ in pairs[kind]]
        want += [e for _, e in pairs[kind]]
        chunks.append((kind, ids, None, None))
    assert response_segments(chunks, Bytes(), TAGS).tolist() == want
    # labelled as one sequence, the observation would sit inside the open <think>
    assert set(label_token_segments([t.encode() for t in texts], TAGS)[6:11].tolist()) == {TH}
