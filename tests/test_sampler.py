"""The jitted sampler against transformers' generate, numpy references and a Python stop-string scan."""

import numpy as np
import pytest
import torch

import jax
import jax.numpy as jnp

from jaxsearch.models import hf_io
from jaxsearch.agent import sampler as S
from jaxsearch.agent import sampling
from jaxsearch.models.sharding import param_shardings, to_decode_layout
from hf_reference import make_hf_model
from tiny_models import FORWARD, LOGPROBS

PIECES = [
    b"</",
    b"search",
    b">",
    b"</search>",
    b"ing</",
    b"answer>",
    b"</answer",
    b">\n\n",
    b"<",
    b"/",
    b"se",
    b"arch>",
    b"x",
    b" ",
    b"an",
    b"swer>",
    b"s",
    b"e",
    b"a",
    b"r",
    b"c",
    b"h",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    hf = make_hf_model("untied_gqa2_hd32", seed=7, init_std=0.2)
    path = tmp_path_factory.mktemp("sampler_model")
    hf.save_pretrained(path)
    config, params = hf_io.load_hf(str(path))
    return hf, config, params


def piece_table(vocab, stops, eos_ids=()):
    """Token i's bytes are PIECES[i % len(PIECES)]: tags get split across tokens in many ways."""
    table = np.zeros((vocab, S.MAX_TOKEN_BYTES), np.uint8)
    lengths = np.zeros(vocab, np.int32)
    for i in range(vocab):
        p = PIECES[i % len(PIECES)]
        table[i, : len(p)] = np.frombuffer(p, np.uint8)
        lengths[i] = len(p)
    return S.StopTable.from_arrays(table, lengths, stops, eos_ids)


def _greedy_equals_transformers(hf, config, params):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, config.vocab_size, n).tolist() for n in (5, 11, 3)]
    ours = S.generate(config, params, prompts, 24)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    ref = hf.generate(
        ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
    )[:, width:].tolist()
    assert ours == ref
    assert len(set(sum(ref, []))) > 10  # the reference output is not degenerate


def test_greedy_generate_equals_transformers(model):
    _greedy_equals_transformers(*model)


def test_greedy_generate_of_a_tied_model_equals_transformers(tmp_path):
    """A tied model's decode loop reads its head from an untied copy on CPU (`qwen2.for_decoding`)."""
    hf = make_hf_model("tied_gqa4_mqa", seed=3, init_std=0.2)
    hf.save_pretrained(tmp_path)
    config, params = hf_io.load_hf(str(tmp_path))
    assert config.tie_word_embeddings and "lm_head" not in params
    _greedy_equals_transformers(hf, config, params)


def test_first_argmax_is_numpys_argmax():
    """Ties go to the first index, as np.argmax; a row of -inf gives 0; a NaN row gives V - 1 (documented)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 300)).astype(np.float32)
    x[:, 7] = x[:, 250] = x.max(1) + 1  # a tie in every row
    x[1] = -np.inf
    x[2, :5] = np.inf
    x[3] = np.round(x[3])  # many ties below the maximum
    got = np.asarray(jax.jit(sampling.first_argmax)(x))
    np.testing.assert_array_equal(got, np.argmax(x, -1))
    x[4] = np.nan
    assert np.asarray(sampling.first_argmax(x))[4] == x.shape[1] - 1


def test_generate_stops_at_a_stop_id(model):
    _, config, params = model
    prompt = [[3, 4, 5]]
    free = S.generate(config, params, prompt, 16)[0]
    stop_id = free[5]
    first = free.index(stop_id)
    assert S.generate(config, params, prompt, 16, stop=[stop_id])[0] == free[: first + 1]


def _reference_stop(byte_pieces, stops):
    """Python scan: the first token after which the segment's bytes contain a stop string."""
    text = b""
    for t, piece in enumerate(byte_pieces):
        text += piece
        for s_idx, s in enumerate(stops):
            if s in text:
                return t + 1, s_idx
    return None


def test_stop_strings_found_however_tokens_split_them(model):
    _, config, params = model
    stops = ["</search>", "</answer>"]
    table = piece_table(config.vocab_size, stops)
    smp = S.Sampler(config, table, cache_len=128, max_segment=48, sampling=S.SamplingParams(1.0))
    prompts = [[1 + i, 2 + i, 3] for i in range(16)]
    state = smp.start(params, prompts, seed=0)
    seg, _ = smp.decode(params, state, 48)
    n_stopped = 0
    for b in range(16):
        toks = seg.tokens[b, : seg.length[b]]
        ref = _reference_stop([PIECES[t % len(PIECES)] for t in toks], [s.encode() for s in stops])
        if ref is None:
            assert seg.length[b] == 48 and seg.stop[b] == S.STOP_BUDGET, b
        else:
            n_stopped += 1
            assert (seg.length[b], seg.stop[b]) == ref, b
    assert n_stopped >= 4  # the check really exercised stops


def test_roll_window_and_match_against_python():
    table = piece_table(40, ["</search>", "</answer>"])
    rng = np.random.default_rng(1)
    seqs = rng.integers(0, 40, (6, 30))
    window = jnp.zeros((6, S.window_size(table)), jnp.uint8)
    texts = [b""] * 6
    for t in range(30):
        window = S.roll_window(window, jnp.asarray(seqs[:, t], jnp.int32), table)
        texts = [texts[b] + PIECES[seqs[b, t] % len(PIECES)] for b in range(6)]
        w = np.asarray(window)
        for b in range(6):
            tail = texts[b][-w.shape[1] :]
            assert bytes(w[b, w.shape[1] - len(tail) :]) == tail
        hits = np.asarray(S.match_stops(window, table))
        for b in range(6):
            tail = bytes(w[b])
            expect = 0 if b"</search>" in tail else (1 if b"</answer>" in tail else -1)
            assert hits[b] == expect


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_a_fresh_forward(model, temperature):
    """The sampler's log-probs and entropies are those of the training forward at the same temperature
    (`token_logprobs(temperature=)`), and of a numpy log-softmax of logits / temperature."""
    _, config, params = model
    table = piece_table(config.vocab_size, [])
    smp = S.Sampler(config, table, cache_len=64, max_segment=20, sampling=S.SamplingParams(temperature))
    prompts = [[5, 6, 7, 8], [9, 10]]
    state = smp.start(params, prompts, seed=3)
    seg, _ = smp.decode(params, state, 20)
    for b, p in enumerate(prompts):
        gen = seg.tokens[b, : seg.length[b]].tolist()
        seq = np.asarray([p + gen])
        ones = np.ones_like(seq[:, :-1])
        logp = LOGPROBS(config, params, seq[:, :-1], ones, seq[:, 1:], temperature=temperature)
        np.testing.assert_allclose(seg.logprobs[b, : len(gen)], np.asarray(logp)[0, len(p) - 1 :], atol=1e-4)
        logits = np.asarray(FORWARD(config, params, seq, np.ones_like(seq)), np.float64)[0] / temperature
        lp = (
            logits
            - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
            - logits.max(-1, keepdims=True)
        )
        ent = -(np.exp(lp) * lp).sum(-1)[len(p) - 1 : -1]
        np.testing.assert_allclose(seg.entropy[b, : len(gen)], ent, atol=1e-4)
        picked = lp[np.arange(len(p) - 1, seq.shape[1] - 1), seq[0, len(p) :]]
        np.testing.assert_allclose(seg.logprobs[b, : len(gen)], picked, atol=1e-4)


def test_top_k_and_top_p_sample_only_allowed_tokens():
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(4, 50)) * 3, jnp.float32)
    keys = jax.random.split(jax.random.key(0), 4)
    probs = np.exp(np.asarray(logits) - np.asarray(logits).max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-probs, -1)
    top3 = [set(order[b, :3]) for b in range(4)]
    nucleus = []
    for b in range(4):  # smallest prefix of sorted tokens whose mass reaches 0.6
        cum = np.cumsum(probs[b, order[b]])
        nucleus.append(set(order[b, : int(np.searchsorted(cum, 0.6)) + 1]))
    # 200 draws of each row (fold-in counters 0..199) in one call: rows are sampled independently, so row
    # c * 4 + b is draw c of row b
    rows = np.tile(np.arange(4), 200)
    counters = jnp.repeat(jnp.arange(200), 4)
    tk, lpk, _ = S.sample_tokens(logits[rows], keys[rows], counters, S.SamplingParams(1.0, top_k=3))
    tp, _, _ = S.sample_tokens(logits[rows], keys[rows], counters, S.SamplingParams(1.0, top_p=0.6))
    tk, lpk, tp = (
        np.asarray(tk).reshape(200, 4),
        np.asarray(lpk).reshape(200, 4),
        np.asarray(tp).reshape(200, 4),
    )
    for b in range(4):
        # log-prob under the renormalised top-3 distribution
        z = probs[b, list(top3[b])].sum()
        np.testing.assert_allclose(lpk[:, b], np.log(probs[b, tk[:, b]] / z), atol=1e-5)
    assert all(set(tk[:, b].tolist()) == top3[b] for b in range(4))
    assert all(set(tp[:, b].tolist()) == nucleus[b] for b in range(4))


def test_top_p_cutoff_keeps_the_nucleus_of_a_sort_and_cumulative_sum():
    """The sort-free nucleus (bisection over the float order) against a float64 sort and cumulative sum in
    numpy, on rows with ties, -inf entries (top-k's) and one dominant entry; it may differ only where the
    mass above an entry is within float32 rounding of top_p."""
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(24):
        v = [5, 50, 1276, 8192][trial % 4]
        x = rng.normal(size=(32, v)) * [0.3, 1.0, 3.0, 10.0][trial % 4]
        if trial % 3 == 0:
            x = np.round(x)  # many ties
        if trial % 5 == 0:
            x[:, : v // 3] = -np.inf
        x[0, 0] = 50.0  # a row whose top entry holds all the mass: only it (and its ties) kept
        x = x.astype(np.float32)
        top_p = [0.1, 0.5, 0.9, 0.95][trial % 4]
        cutoff = jax.jit(sampling.top_p_cutoff, static_argnums=1)(jnp.asarray(x), top_p)
        kept = np.asarray(x >= np.asarray(cutoff))
        for row, k in zip(x.astype(np.float64), kept):
            probs = np.exp(row - row.max())
            probs /= probs.sum()
            order = np.argsort(-row, kind="stable")
            above = np.cumsum(probs[order]) - probs[order]  # mass of the entries sorted before each one
            cutoff = row[order][above < top_p].min()
            if np.abs(above - top_p).min() < 1e-6:
                continue  # the boundary is within float32 rounding of the mass
            np.testing.assert_array_equal(k, row >= cutoff)
            checked += 1
    assert checked > 0.97 * 24 * 32


def test_budget_cut_leaves_other_rows_untouched(model):
    _, config, params = model
    table = piece_table(config.vocab_size, [])
    smp = S.Sampler(config, table, cache_len=64, max_segment=20, sampling=S.SamplingParams(0.0))
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    full, _ = smp.decode(params, smp.start(params, prompts, 0), 20)
    cut, state = smp.decode(params, smp.start(params, prompts, 0), np.array([3, 20, 0]))
    assert list(cut.length) == [3, 20, 0] and list(cut.stop) == [S.STOP_BUDGET] * 3
    np.testing.assert_array_equal(cut.tokens[0, :3], full.tokens[0, :3])
    np.testing.assert_array_equal(cut.tokens[1], full.tokens[1])
    assert list(np.asarray(state.cache.lengths)) == [3 + 3, 2 + 20, 4]


def test_sampling_of_a_row_does_not_depend_on_its_batch(model):
    _, config, params = model
    table = piece_table(config.vocab_size, [])
    smp = S.Sampler(config, table, cache_len=64, max_segment=16, sampling=S.SamplingParams(1.0))
    keys = jax.random.split(jax.random.key(5), 3)
    both, _ = smp.decode(params, smp.start(params, [[1, 2, 3], [4, 5], [6]], keys), 16)
    alone, _ = smp.decode(params, smp.start(params, [[4, 5]], keys[1:2]), 16)
    np.testing.assert_array_equal(both.tokens[1], alone.tokens[0])


@pytest.mark.slow  # started first under pytest-xdist (conftest)
def test_multi_turn_appends_match_forward_and_compile_nothing_new(model):
    """4 turns of decode + append with varied observation lengths; a second batch reuses every compile."""
    _, config, params = model
    table = piece_table(config.vocab_size, ["</search>"])
    smp = S.Sampler(
        config,
        table,
        cache_len=256,
        max_segment=12,
        sampling=S.SamplingParams(0.0),
        prompt_buckets=[16],
        chunk_buckets=[8, 16],
    )
    rng = np.random.default_rng(4)
    counts = []
    for batch in range(2):
        prompts = [rng.integers(1, 200, n).tolist() for n in (7, 12, 4)]
        state = smp.start(params, prompts, seed=batch)
        history = [list(p) for p in prompts]
        for turn in range(4):
            seg, state = smp.decode(params, state, 12)
            for b in range(3):
                history[b] += seg.tokens[b, : seg.length[b]].tolist()
            # the first two turns meet both chunk buckets (16, then 8); later lengths are random
            fixed = {(0, 0): [3, 12, 0], (0, 1): [5, 2, 7]}
            lengths = fixed.get((batch, turn), rng.integers(0, 16, 3))
            obs = [rng.integers(1, 200, n).tolist() for n in lengths]
            state = smp.append(params, state, obs)
            for b in range(3):
                history[b] += obs[b]
            counts.append(smp.compiled_count())
        # the cache now holds exactly the history: the next-token logits agree with a full forward
        for b in range(3):
            seq = np.asarray([history[b]])
            ref = np.asarray(FORWARD(config, params, seq, np.ones_like(seq)))[0, -1]
            np.testing.assert_allclose(np.asarray(state.logits[b]), ref, atol=2e-4)
        assert list(np.asarray(state.cache.lengths)) == [len(h) for h in history]
    # every shape (prompt bucket, decode loop, chunk buckets 16 and 8) is met in the first two turns;
    # after that nothing compiles (counts are per jitted function, shared with other tests' samplers)
    assert len(set(counts[1:])) == 1, counts


def test_sampler_on_a_mesh_shards_the_batch_and_samples_the_same_tokens(model):
    """With a mesh, prompts, KV cache and activations are split over the data axes (data=2 x fsdp=4: one
    row per device) and a sampled segment + append + segment is token for token the unsharded one."""
    from jaxsearch import parallel

    _, config, params = model
    mesh = parallel.make_mesh({"data": 2, "fsdp": 4})
    sharded_params = jax.device_put(params, param_shardings(config, mesh))
    table = piece_table(config.vocab_size, ["</search>"])
    kwargs = dict(cache_len=64, max_segment=10, sampling=S.SamplingParams(1.0), chunk_buckets=[8])
    plain, on_mesh = S.Sampler(config, table, **kwargs), S.Sampler(config, table, mesh=mesh, **kwargs)
    prompts = [[i + 1, i + 2, i + 3][: 1 + i % 3] for i in range(8)]
    obs = [[7] * (i % 4) for i in range(8)]
    out = []
    for smp, p in ((plain, params), (on_mesh, sharded_params)):
        state = smp.start(p, prompts, seed=3)
        first, state = smp.decode(p, state, 10)
        state = smp.append(p, state, obs)
        second, state = smp.decode(p, state, 10)
        out.append((first, second, state))
    for a, b in zip(out[0][:2], out[1][:2]):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    cache = out[1][2].cache
    assert cache.k[0].sharding.spec[0] == ("data", "fsdp")  # rows split 8 ways
    assert cache.k[0].addressable_shards[0].data.shape[0] == 1
    assert out[0][2].cache.k[0].sharding.is_fully_replicated


def _collectives(hlo: str) -> set[str]:
    """The cross-device ops in compiled HLO text."""
    import re

    return set(re.findall(r"\b(all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)", hlo))


def test_replicated_params_on_a_data_mesh_decode_per_device_without_collectives(model):
    """Params whole on every device of a data mesh (the replicated decode layout): prefill and decode run as
    one program per device (`parallel.jit_per_device`), whose compiled decode loop holds no collective
    (the mesh's jit all-reduces its loop condition every step), and a sampled segment with a stop string,
    an append and a second segment are the single-device sampler's (tokens, log-probs, entropies, lengths,
    stop codes). Sharded params, or rows the mesh does not divide, take the mesh's jit."""
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxsearch import parallel

    _, config, params = model
    mesh = parallel.make_mesh({"data": 2, "fsdp": 4})
    whole = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    table = piece_table(config.vocab_size, ["</search>"])
    kwargs = dict(cache_len=64, max_segment=12, sampling=S.SamplingParams(1.0), chunk_buckets=[8])
    plain, on_mesh = S.Sampler(config, table, **kwargs), S.Sampler(config, table, mesh=mesh, **kwargs)
    prompts = [[i + 1, i + 2, i + 3][: 1 + i % 3] for i in range(8)]
    obs = [[7] * (i % 4) for i in range(8)]
    budget = np.array([12, 12, 3, 12, 12, 1, 12, 12], np.int32)
    out = []
    for smp, p in ((plain, params), (on_mesh, whole)):
        state = smp.start(p, prompts, seed=3)
        first, state = smp.decode(p, state, budget)
        state = smp.append(p, state, obs)
        second, state = smp.decode(p, state, 12)
        out.append((first, second, state))
    for a, b in zip(out[0][:2], out[1][:2]):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.length, b.length)
        np.testing.assert_array_equal(a.stop, b.stop)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        np.testing.assert_allclose(a.entropy, b.entropy, atol=1e-5)
    assert (out[0][0].stop != S.STOP_BUDGET).any() and (out[0][0].length < 12).any()  # a stop and a budget
    assert out[1][2].cache.k[0].sharding.spec[0] == ("data", "fsdp")  # rows split 8 ways

    per_device = on_mesh._per_device(whole, 8)
    assert per_device is not None
    state = on_mesh.start(whole, prompts, seed=3)
    args = (config, whole, state, budget, table, on_mesh.sampling, 12)
    assert not _collectives(per_device[1].lower(*args).compile().as_text())
    assert "all-reduce" in _collectives(on_mesh._decode.lower(*args).compile().as_text())
    assert on_mesh._per_device(jax.device_put(params, param_shardings(config, mesh)), 8) is None
    assert on_mesh._per_device(whole, 4) is None  # 4 rows over 8 devices: replicated rows, the mesh's jit
    tensor_mesh = parallel.make_mesh({"data": 2, "tensor": 4})  # rows over 2 of the 8: the mesh's jit
    whole_on_tensor_mesh = jax.device_put(params, NamedSharding(tensor_mesh, PartitionSpec()))
    assert S.per_device_batch(tensor_mesh, whole_on_tensor_mesh, 8) is None


@pytest.mark.parametrize("steps, smallest_width", [(1, 4), (5, 4), (48, 4), (5, 1), (1, 2)])
def test_decode_slots_give_the_samplers_segments(model, steps, smallest_width):
    """Rows inserted one at a time into 4 decode slots, `steps` tokens per call, a finished row's slot taking
    the next row, and once none waits, the highest row moved into it: each row's segment is the lockstep
    sampler's (tokens, log-probs, length, stop code), with stop strings split across tokens and budgets of 1
    and 7 tokens. With smallest_width below 4 the calls decode only the first 1 / 2 slots where those hold
    every active one (rows moved there)."""
    from jaxsearch.agent.slots import Slots

    _, config, params = model
    stops = ["</search>", "</answer>"]
    table = piece_table(config.vocab_size, stops)
    smp = S.Sampler(config, table, cache_len=128, max_segment=48, sampling=S.SamplingParams(1.0))
    prompts = [[1 + i, 2 + i, 3 + i % 3][: 1 + i % 3] for i in range(9)]
    keys = jax.random.split(jax.random.key(3), 9)
    budgets = np.array([48, 48, 7, 48, 1, 30, 48, 48, 48], np.int32)
    ref, _ = smp.decode(params, smp.start(params, prompts, keys), budgets)

    slots = Slots(smp, steps, smallest_width)
    state, waiting, occupant, got, moves = slots.empty(4), list(range(9)), [None] * 4, {}, 0
    parts = [[] for _ in range(4)]
    for slot in (3, 2, 1, 0):
        i = waiting.pop(0)
        state = slots.insert(params, state, slot, prompts[i], budgets[i], key=jax.random.key_data(keys[i]))
        occupant[slot] = i
    while any(o is not None for o in occupant):
        out, state = slots.decode(params, state)
        res = slots.fetch(out)
        for slot, i in enumerate(occupant):
            if i is None:
                continue
            parts[slot].append((res.tokens[slot, : res.length[slot]], res.logprobs[slot, : res.length[slot]]))
            if not res.active[slot]:
                got[i] = ([np.concatenate(x) for x in zip(*parts[slot])], res.stop[slot])
                parts[slot], occupant[slot] = [], None
                if waiting:
                    j = waiting.pop(0)
                    state = slots.insert(
                        params, state, slot, prompts[j], budgets[j], key=jax.random.key_data(keys[j])
                    )
                    occupant[slot] = j
        top = max((s for s, i in enumerate(occupant) if i is not None), default=-1)
        free = [s for s, i in enumerate(occupant) if i is None and s < top]
        if not waiting and free:  # the row of the highest slot, mid-segment, moved down
            state = slots.move(state, top, free[0])
            occupant[free[0]], occupant[top], parts[free[0]], parts[top] = occupant[top], None, parts[top], []
            moves += 1
    assert moves >= 1 or steps == 48  # 48 steps: every row ends its segment in the call it starts
    n_stopped = 0
    for i in range(9):
        (tokens, logprobs), stop = got[i]
        n = ref.length[i]
        np.testing.assert_array_equal(tokens, ref.tokens[i, :n], err_msg=f"row {i}")
        np.testing.assert_allclose(logprobs, ref.logprobs[i, :n], atol=1e-5)  # prefill shapes differ
        assert stop == ref.stop[i], i
        expected = _reference_stop([PIECES[t % len(PIECES)] for t in tokens], [s.encode() for s in stops])
        if expected is None:
            assert len(tokens) == budgets[i] and stop == S.STOP_BUDGET, i
        else:
            n_stopped += 1
            assert (len(tokens), stop) == expected, i
    assert n_stopped >= 2 and len(got[4][0][0]) == 1 and len(got[2][0][0]) <= 7


def _gathered_shapes(hlo: str) -> list[tuple[int, ...]]:
    """The result shapes of every all-gather in compiled HLO text."""
    import re

    shapes = []
    for line in hlo.splitlines():
        match = re.search(
            r"=\s*(.*?)\s+all-gather(-start)?\(", line
        )  # "%name = f32[48,4,32]{...} all-gather("
        if match:
            dims = re.findall(r"\[([\d,]*)\]", match.group(1))
            shapes += [tuple(int(d) for d in ds.split(",") if d) for ds in dims]
    return shapes


@pytest.mark.parametrize(
    "mesh_shape, layout",
    [({"fsdp": 8}, "train"), ({"fsdp": 8}, "replicated"), ({"fsdp": 4, "tensor": 2}, "tensor")],
)
def test_decode_layout_compiles_a_decode_step_without_gathering_weights(model, mesh_shape, layout):
    """The trainer's fsdp-sharded params make every decode step all-gather the weights; the decode layouts
    (a replicated or tensor-parallel copy, `models.sharding.to_decode_layout`) compile the sampler's decode call
    with no all-gather of a weight, and sample the same tokens."""
    from jaxsearch import parallel

    _, config, params = model
    mesh = parallel.make_mesh(mesh_shape)
    train_params = jax.device_put(params, param_shardings(config, mesh))
    decode_params = to_decode_layout(config, train_params, mesh, layout)
    table = piece_table(config.vocab_size, ["</search>"])
    smp = S.Sampler(config, table, cache_len=64, max_segment=10, sampling=S.SamplingParams(0.0), mesh=mesh)
    prompts = [[i + 1, i + 2, i + 3][: 1 + i % 3] for i in range(8)]
    state = smp.start(decode_params, prompts, seed=3)
    budget = np.full(8, 10, np.int32)
    hlo = smp._decode.lower(config, decode_params, state, budget, table, smp.sampling, 10).compile().as_text()
    weight_shapes = {tuple(x.shape) for x in jax.tree_util.tree_leaves(params)}
    gathered_weights = weight_shapes & set(_gathered_shapes(hlo))
    if layout == "train":
        assert gathered_weights  # the check sees weight gathers where there are some
    else:
        assert not gathered_weights, gathered_weights
        leaves = jax.tree_util.tree_leaves(decode_params)
        if layout == "replicated":
            assert all(x.sharding.is_fully_replicated for x in leaves)
        else:
            assert not all(x.sharding.is_fully_replicated for x in leaves)
    seg, _ = smp.decode(decode_params, state, 10)
    ref, _ = S.Sampler(config, table, cache_len=64, max_segment=10, sampling=S.SamplingParams(0.0)).decode(
        params, S.Sampler(config, table, 64, 10, S.SamplingParams(0.0)).start(params, prompts, 3), 10
    )
    np.testing.assert_array_equal(seg.tokens, ref.tokens)


def test_complete_pads_batches_to_row_buckets(model):
    """`complete` decodes any number of prompts on one program per power-of-two row count (SOAR's internal
    stream calls it with however many rows searched): 3 and 4 prompts share one, the padding rows change
    no real row's tokens, and each row keeps its own key."""
    _, config, params = model
    smp = S.Sampler(config, S.StopTable.eos_only(config.vocab_size), cache_len=48, max_segment=12)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, config.vocab_size, n).tolist() for n in (5, 9, 4, 7, 6)]
    keys = jax.random.split(jax.random.key(11), 5)
    four = smp.complete(params, prompts[:4], keys[:4], 12)
    count = smp.compiled_count()
    three = smp.complete(params, prompts[:3], keys[:3], 12)  # padded to 4 with a copy of prompt 0
    assert smp.compiled_count() == count
    assert three == four[:3] and all(len(t) == 12 for t in three)
    # row 2 alone (padded to 1 row: no padding) with its own key: the same tokens as in the batch
    assert smp.complete(params, [prompts[2]], keys[2:3], 12) == [four[2]]
    five = smp.complete(params, prompts, keys, 12)  # 8 rows
    assert five[:4] == four
    # a row count given (the local judge's fixed batch): the same tokens
    assert smp.complete(params, prompts[:3], keys[:3], 12, rows=8) == three
