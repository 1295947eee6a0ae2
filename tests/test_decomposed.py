"""The two-call decomposition of hard Focus equals the dense masked reference, on every available backend."""

import pytest
import torch

from focus.attention.dispatch.facts import available_backends, decomposition_backend
from focus.attention.dispatch.fast_path import current_fast_path, fast_path, use_fast_path
from focus.attention.kernels.decomposed import (
    decomposed_hard_attention,
    pair_counts,
    theoretical_ratio,
)
from focus.attention.native import native_routed_prefill
from focus.attention.pattern.reference import causal_pairs, dense_attention, hard_allowed
from focus.attention.routers.routing import sink_keys


def random_groups(b, k_heads, length, num_groups, top_k, generator, empty=()):
    """Distinct top-k group ids per token, never using the groups in `empty`."""
    usable = torch.tensor([g for g in range(num_groups) if g not in empty])
    scores = torch.rand(b, k_heads, length, len(usable), generator=generator)
    return usable[scores.topk(top_k, dim=-1).indices]


def reference(query, key, value, groups, num_groups, window, valid, sinks, scaling=None, query_groups=None):
    length = query.shape[-2]
    base = causal_pairs(length, length)[None, None] & valid[:, None, None, :]
    allowed = hard_allowed(groups if query_groups is None else query_groups, groups, num_groups, window, base, sinks)
    return dense_attention(query, key, value, allowed, None, scaling)


def inputs(b, h, k_heads, length, d, num_groups, top_k, seed=0, dtype=torch.float32, pad=0, empty=()):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(b, h, length, d, generator=g).to(dtype)
    key = torch.randn(b, k_heads, length, d, generator=g).to(dtype)
    value = torch.randn(b, k_heads, length, d, generator=g).to(dtype)
    groups = random_groups(b, k_heads, length, num_groups, top_k, g, empty)
    valid = torch.ones(b, length, dtype=torch.bool)
    if pad:
        valid[0, :pad] = False  # left padding of the first sequence
    return query, key, value, groups, valid


CASES = {
    "top1 mha": dict(b=1, h=2, k_heads=2, length=97, d=16, num_groups=4, top_k=1, window=8, sink_tokens=0),
    "top1 gqa sinks": dict(b=2, h=6, k_heads=2, length=130, d=8, num_groups=5, top_k=1, window=16, sink_tokens=1),
    "top2 gqa": dict(b=1, h=4, k_heads=2, length=101, d=16, num_groups=6, top_k=2, window=5, sink_tokens=0),
    "top2 sinks padding": dict(b=2, h=3, k_heads=1, length=77, d=8, num_groups=4, top_k=2, window=7, sink_tokens=2,
                               pad=9),
    "top2 gqa 6 heads per kv head": dict(b=1, h=12, k_heads=2, length=70, d=8, num_groups=5, top_k=2, window=6,
                                         sink_tokens=1),
    "top3": dict(b=1, h=2, k_heads=1, length=64, d=8, num_groups=6, top_k=3, window=4, sink_tokens=1),
    # Head sizes the native kernels unroll (64, 128), with runs of more than one key block (64 keys) and padding.
    "head size 64": dict(b=2, h=6, k_heads=2, length=300, d=64, num_groups=3, top_k=2, window=70, sink_tokens=1,
                         pad=11),
    "head size 128": dict(b=1, h=3, k_heads=1, length=200, d=128, num_groups=2, top_k=1, window=20, sink_tokens=0),
    "window 1": dict(b=1, h=1, k_heads=1, length=50, d=8, num_groups=3, top_k=1, window=1, sink_tokens=0),
    "window > length": dict(b=1, h=1, k_heads=1, length=40, d=8, num_groups=3, top_k=2, window=64, sink_tokens=1),
    "empty groups": dict(b=1, h=2, k_heads=1, length=90, d=8, num_groups=8, top_k=2, window=6, sink_tokens=1,
                         empty=(0, 3, 7)),
    "odd length, one group": dict(b=1, h=1, k_heads=1, length=33, d=8, num_groups=1, top_k=1, window=3,
                                  sink_tokens=0),
}


@pytest.mark.parametrize("routing", ["key", "query", "kv_head"])
@pytest.mark.parametrize("backend", available_backends("cpu"))
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_the_dense_reference(case, backend, routing, one_thread):
    """routing "query": each query head has groups of its own (route_queries="query"), so segments hold queries and
    keys that differ; "kv_head": the query heads of a key/value head share theirs (given once per key/value head)."""
    check_case(case, backend, routing)


@pytest.mark.parametrize("routing", ["query", "kv_head"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_native_rectangles_match_the_dense_reference(case, routing, one_thread):
    """The band, the rectangles and the merge as native calls (`focus.attention.native`, what a
    FocusCache(native=True) prefill runs)."""
    check_case(case, "native", routing)


@pytest.fixture(params=[True, False], ids=["matrix units", "vector units"])
def bfloat16_units(request):
    """Where the native rectangles run bfloat16: on the matrix units (AMX: `csrc/rectangle_amx.cpp`, skipped on a CPU
    without them) or on the vector units (`csrc/rectangle.cpp`, as on every other CPU)."""
    from focus.attention.native import kernels

    if request.param and not kernels().matrix_units():
        pytest.skip("this CPU has no bfloat16 matrix units (AMX)")
    return request.param


@pytest.mark.parametrize("routing", ["query", "kv_head"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_native_bfloat16_error_within_twice_the_reference_error(case, routing, bfloat16_units, one_thread):
    """flash-attn's rule (as for the eager decomposition below), on every case: the native prefill in bfloat16 is at
    most twice as far from the float32 reference as the dense bfloat16 reference is."""
    spec = dict(CASES[case])
    window, sink_tokens = spec.pop("window"), spec.pop("sink_tokens")
    pad, empty = spec.pop("pad", 0), spec.pop("empty", ())
    query, key, value, groups, valid = inputs(**spec, pad=pad, empty=empty, seed=12)
    heads = spec["h"] if routing == "query" else spec["k_heads"]
    query_groups = random_groups(spec["b"], heads, spec["length"], spec["num_groups"], spec["top_k"],
                                 torch.Generator().manual_seed(13), empty)
    per_query_head = query_groups.repeat_interleave(spec["h"] // heads, dim=1)
    sinks = sink_keys(valid, valid.shape[1], sink_tokens) if sink_tokens else torch.zeros_like(valid[:1])
    sinks = sinks.expand_as(valid) & valid
    rows = valid[:, None, :, None].expand(*query.shape)
    exact = reference(query, key, value, groups, spec["num_groups"], window, valid, sinks, query_groups=per_query_head)
    low = [t.bfloat16() for t in (query, key, value)]
    dense = reference(*low, groups, spec["num_groups"], window, valid, sinks, query_groups=per_query_head)
    ours = native_routed_prefill(*low, query_groups.sort(dim=-1)[0], groups.sort(dim=-1)[0], window, valid, sinks,
                                 spec["d"] ** -0.5, matrix_units=bfloat16_units)
    assert (ours - exact)[rows].abs().max() <= 2 * (dense.float() - exact)[rows].abs().max()


@pytest.mark.parametrize("layout", ["70 groups", "right padding"])
def test_the_plan_sends_what_the_native_prefill_does_not_take_to_the_eager_decomposition(layout, one_thread):
    """Group ids from 63 on do not fit the segments' group bits, and padding on the right breaks the band's runs of
    keys: the native prefill refuses them in one line, the plan of a native FocusCache's prompt does not ask it, and
    the eager decomposition it asks instead is the dense reference."""
    from focus.attention.dispatch.planning import CallFacts, plan
    from focus.config import FocusConfig

    num_groups = 70 if layout == "70 groups" else 5
    query, key, value, groups, valid = inputs(2, 4, 2, 150, 16, num_groups, 2, seed=8)
    if layout == "right padding":
        valid[1, -13:] = False
    query_groups = random_groups(2, 4, 150, num_groups, 2, torch.Generator().manual_seed(4))
    sinks = sink_keys(valid, 150, 1)
    with pytest.raises(ValueError, match="group ids below 63" if num_groups == 70 else "padding only on the left"):
        native_routed_prefill(query, key, value, query_groups, groups, 9, valid, sinks.expand(2, 150) & valid, 0.25)
    config = FocusConfig(num_groups=num_groups, top_k=2, window=9, mode="hard", route_queries="query")
    facts = CallFacts(queries=150, keys=150, heads=4, k_heads=2, head_dim=16, cache="native",
                      left_padded=layout != "right padding")
    assert plan(config, facts).kernel == "decomposed_torch"
    assert plan(config.replace(num_groups=5), CallFacts(queries=150, keys=150, cache="native")).kernel == (
        "decomposed_native")
    expected = reference(query, key, value, groups, num_groups, 9, valid, sinks, query_groups=query_groups)
    got = decomposed_hard_attention(query, key, value, groups, 9, valid, sinks, query_groups=query_groups)
    rows = valid[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[rows], expected[rows], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("routing", ["query", "kv_head"])
def test_native_segments_are_the_eager_ones(routing):
    """`segment_rows` (one native counting pass) gives the rows of `rectangle_entries(once=True)` in the same order,
    and every query row the same keys to read, skipped ones included (segments no query reads are left out)."""
    from focus.attention.kernels.rectangle import rectangle_entries
    from focus.attention.native import kernels

    *_, groups, valid = inputs(2, 6, 2, 260, 8, 7, 2, seed=2, pad=17)
    heads = 6 if routing == "query" else 2
    query_groups = random_groups(2, heads, 260, 7, 2, torch.Generator().manual_seed(3), empty=(5,))
    sinks = sink_keys(valid, 260, 1) & valid
    window = 11
    query_rows, first, count, skip, key_rows, bits = kernels().segment_rows(
        query_groups.sort(dim=-1)[0], groups.sort(dim=-1)[0], valid, sinks, window)
    repeat = heads // 2
    entries, keys = rectangle_entries(query_groups.sort(dim=-1)[0],
                                      groups.sort(dim=-1)[0].repeat_interleave(repeat, dim=1), valid, sinks, once=True)
    assert torch.equal(query_rows, entries.head * 260 + entries.position)
    assert torch.equal(skip, keys.query_skip)
    # The eager key rows are of the repeated keys: head (batch * Hq + query head); the native ones of the keys.
    eager_rows = (keys.head // heads * 2 + keys.head % heads // repeat) * 260 + keys.position
    base = keys.query_order - entries.position
    eager_first = torch.searchsorted(keys.order, base)
    eager_count = torch.searchsorted(keys.order, base + torch.clamp_min(entries.position - window, -1),
                                     right=True) - eager_first
    assert torch.equal(count, eager_count)
    for row in range(query_rows.numel()):
        eager = slice(int(eager_first[row]), int(eager_first[row] + eager_count[row]))
        native = slice(int(first[row]), int(first[row] + count[row]))
        assert torch.equal(key_rows[native], eager_rows[eager]) and torch.equal(bits[native], keys.bits[eager])


def check_case(case: str, backend: str, routing: str, device: str = "cpu", atol: float = 2e-6, rtol: float = 1e-5):
    """The decomposition of `case` on `device` against the dense reference (float32, on the CPU)."""
    spec = dict(CASES[case])
    window, sink_tokens = spec.pop("window"), spec.pop("sink_tokens")
    pad, empty = spec.pop("pad", 0), spec.pop("empty", ())
    query, key, value, groups, valid = inputs(**spec, pad=pad, empty=empty)
    query_groups = per_query_head = None
    if routing != "key":
        gen = torch.Generator().manual_seed(11)
        heads = spec["h"] if routing == "query" else spec["k_heads"]
        query_groups = random_groups(spec["b"], heads, spec["length"], spec["num_groups"], spec["top_k"], gen, empty)
        per_query_head = query_groups.repeat_interleave(spec["h"] // heads, dim=1)
    sinks = sink_keys(valid, valid.shape[1], sink_tokens) if sink_tokens else None
    expected = reference(query, key, value, groups, spec["num_groups"], window, valid, sinks,
                         query_groups=per_query_head)
    moved = [None if t is None else t.to(device) for t in (query, key, value, groups, valid, sinks, query_groups)]
    got = decomposed_hard_attention(*moved[:4], window, *moved[4:6], backend=backend, block=16,
                                    query_groups=moved[6]).cpu()
    rows = valid[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[rows], expected[rows], atol=atol, rtol=rtol)
    assert (got[~rows] == 0).all()


def test_query_routed_bfloat16_error_within_twice_the_reference_error(one_thread):
    spec = dict(b=1, h=4, k_heads=2, length=200, d=32, num_groups=4, top_k=2)
    query, key, value, groups, valid = inputs(**spec, seed=6)
    query_groups = random_groups(1, 4, 200, 4, 2, torch.Generator().manual_seed(7))
    sinks = sink_keys(valid, 200, 1)
    exact = reference(query, key, value, groups, 4, 12, valid, sinks, query_groups=query_groups)
    low = [t.bfloat16() for t in (query, key, value)]
    ref_error = (reference(*low, groups, 4, 12, valid, sinks, query_groups=query_groups).float() - exact).abs().max()
    ours = decomposed_hard_attention(*low, groups, 12, valid, sinks, query_groups=query_groups)
    assert (ours.float() - exact).abs().max() <= 2 * ref_error


def test_block_size_does_not_matter(one_thread):
    query, key, value, groups, valid = inputs(1, 2, 1, 150, 8, 4, 2, seed=3)
    outs = [decomposed_hard_attention(query, key, value, groups, 9, valid, block=blk) for blk in (1, 7, 64, 256)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 32, 512])
def test_query_routed_chunks_do_not_matter(chunk, one_thread):
    """Query routing attends each segment's queries to its keys in chunks: whole key prefixes without a mask, the
    band up to the chunk's last query with one. Long segments (3 groups, 300 tokens) give chunks of every kind."""
    query, key, value, groups, valid = inputs(2, 4, 2, 300, 8, 3, 2, seed=5, pad=11)
    query_groups = random_groups(2, 4, 300, 3, 2, torch.Generator().manual_seed(9))
    sinks = sink_keys(valid, 300, 1)
    expected = reference(query, key, value, groups, 3, 10, valid, sinks, query_groups=query_groups)
    got = decomposed_hard_attention(query, key, value, groups, 10, valid, sinks, backend="torch",
                                    query_groups=query_groups, chunk=chunk)
    rows = valid[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[rows], expected[rows], atol=2e-6, rtol=1e-5)


def test_bfloat16_error_within_twice_the_reference_error(one_thread):
    """flash-attn's rule: error vs an fp32 reference at most twice that of the same-precision reference."""
    spec = dict(b=1, h=4, k_heads=2, length=200, d=32, num_groups=4, top_k=2)
    query, key, value, groups, valid = inputs(**spec, seed=5)
    sinks = sink_keys(valid, 200, 1)
    exact = reference(query, key, value, groups, 4, 12, valid, sinks)
    low = [t.bfloat16() for t in (query, key, value)]
    ref_error = (reference(*low, groups, 4, 12, valid, sinks).float() - exact).abs().max()
    ours = decomposed_hard_attention(*low, groups, 12, valid, sinks)
    assert ours.dtype == torch.bfloat16
    assert (ours.float() - exact).abs().max() <= 2 * ref_error


def test_the_fast_path_switch_pins_the_backend_and_restores_it():
    assert current_fast_path() == "auto" and decomposition_backend("cpu") == "torch"
    with fast_path("flash"):
        assert decomposition_backend("cpu") == "flash"
        with fast_path("dense"):
            assert current_fast_path() == "dense"
        assert current_fast_path() == "flash"
    assert current_fast_path() == "auto" and decomposition_backend("cpu") == "torch"
    with pytest.raises(ValueError, match="unknown fast path 'triton'"):
        use_fast_path("triton")


def test_pair_counts_and_theoretical_ratio():
    length, window = 512, 32
    groups = torch.arange(length)[:, None] % 8  # perfectly balanced, top-1
    full, kept = pair_counts(length, window, groups)
    brute = sum(1 for i in range(length) for j in range(i + 1) if i - j < window or groups[i, 0] == groups[j, 0])
    assert full == length * (length + 1) // 2 and kept == brute
    assert abs(full / kept - theoretical_ratio(length, window, 8)) / (full / kept) < 0.05
    query_groups = (torch.arange(length)[:, None] * 7 + 3) % 8  # the queries' own groups
    _, kept = pair_counts(length, window, groups, query_groups=query_groups)
    brute = sum(1 for i in range(length) for j in range(i + 1) if i - j < window or query_groups[i, 0] == groups[j, 0])
    assert kept == brute


# ---- inside a model ----------------------------------------------------------------------------------------------

FAMILY_LENGTH = 40


@pytest.mark.parametrize("route_queries", ["key", "query", "kv_head"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2", "gemma2", "gemma3"])
def test_hard_focus_model_logits_equal_the_dense_path(family, route_queries, monkeypatch, one_thread):
    """Whole-sequence forwards go through the decomposition; its logits equal the dense masked path's, with left
    padding, for every family (Mistral's and Gemma's own sliding windows and Gemma 2's soft-capping take the dense
    path by design: the decomposition is only used where the model mask is causal plus padding)."""
    from focus import FocusConfig, apply_focus
    from focus.attention.dispatch import kernel_runs
    from focus.models import tiny_model

    model = tiny_model(family, seed=0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (2, FAMILY_LENGTH), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    apply_focus(model, FocusConfig(window=4, num_groups=4, top_k=2, mode="hard", route_queries=route_queries),
                calibration_ids=ids)
    calls = []
    original = kernel_runs.decomposed_hard_attention
    monkeypatch.setattr(kernel_runs, "decomposed_hard_attention",
                        lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    with torch.no_grad():
        fast = model(input_ids=ids, attention_mask=mask).logits
        with fast_path("dense"):
            dense = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(fast[real], dense[real], atol=2e-5, rtol=1e-4)
    expected_calls = {"gpt2": 2, "llama": 2, "mistral": 0, "qwen2": 2, "gemma2": 0, "gemma3": 1}[family]
    assert len(calls) == expected_calls  # layers that decomposed


@pytest.mark.parametrize("route_queries", ["key", "query", "kv_head"])
def test_generate_after_a_decomposed_prefill_matches_the_dense_path(route_queries, one_thread):
    from focus import FocusConfig, apply_focus
    from focus.models import tiny_model

    model = tiny_model("llama", seed=0)
    ids = torch.randint(3, model.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(2))
    apply_focus(model, FocusConfig(window=4, num_groups=4, top_k=2, mode="hard", route_queries=route_queries),
                calibration_ids=ids)
    settings = dict(max_new_tokens=12, do_sample=False)
    fast = model.generate(ids, **settings)
    with fast_path("dense"):
        assert torch.equal(fast, model.generate(ids, **settings))
