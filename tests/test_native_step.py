"""The native decoding step (`FocusCache(model, native=True)`) against the dense reference and the eager step."""

import pytest
import torch
from test_attention import make_inputs, make_layer, reference_attention, reference_with_dense_heads
from test_decoding import CASES, counting_calls, decode

import focus.attention.dispatch.kernel_table
import focus.attention.function
from focus import FocusConfig, apply_focus
from focus.attention.cache.decoding import FocusCache
from focus.attention.cache.group_index import GroupIndex
from focus.models import tiny_model


def counting_native_steps():
    """Counts the native decoding steps."""
    return counting_calls("native_decoding_step")


@pytest.fixture(autouse=True)
def masked_steps(monkeypatch):
    """Every one-token step under the mask (the native step's path), whatever the cost model would choose."""
    monkeypatch.setattr(focus.attention.dispatch.kernel_table, "sparse_step_pays", lambda *args: False)


def eager_steps(monkeypatch):
    """The steps of a native index as an eager one's (its prompt stays native)."""
    from dataclasses import replace

    table = focus.attention.dispatch.kernel_table
    rows = tuple(replace(row, declines=lambda config, facts: "the test asks for eager steps")
                 if row.name == "native_step" else row for row in table.KERNEL_TABLE)
    monkeypatch.setattr(table, "KERNEL_TABLE", rows)


@pytest.fixture
def native_indexes(monkeypatch):
    """The layer tests' indexes ask for the native step, as `FocusCache(model, native=True)` makes them."""
    made = GroupIndex.__init__

    def native(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.native = True

    monkeypatch.setattr(GroupIndex, "__init__", native)


def case_layer(case):
    heads, kv_heads, top_k, window, sinks, pads, route_queries, *dense = case
    config = FocusConfig(num_groups=4, top_k=top_k, window=window, sink_tokens=sinks, mode="hard",
                         route_queries=route_queries, dense_heads=dense[0] if dense else [])
    layer = make_layer(config, kv_heads, 8)
    layer.layer_idx = 0
    return layer, make_inputs(2, heads, kv_heads, 41, 8, pads)


@pytest.mark.usefixtures("native_indexes")
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_native_steps_match_the_dense_reference(case):
    layer, (q, key, v, mask) = case_layer(case)
    with torch.no_grad(), counting_native_steps() as calls:
        steps, _ = decode(layer, q, key, v, mask, prompt=12)
        expected = reference_with_dense_heads(layer, q, key, v, mask, scaling=0.4)[:, :, 12:]
    torch.testing.assert_close(steps, expected, atol=2e-5, rtol=1e-4)
    assert calls[0] == (0 if layer.focus_config.window >= 41 else 41 - 12)  # every one-token step (sinks: in the prompt)


@pytest.mark.usefixtures("native_indexes")
@pytest.mark.parametrize("head_dim", [64, 128, 24])  # unrolled for 64 and 128, any size otherwise
def test_native_steps_over_long_caches_match_the_dense_reference(head_dim):
    """Caches of several chunks (512 keys) and kept-key blocks (64), with padding: every block's rescale and every
    chunk's merge is exercised, at the head sizes the kept-keys loop is unrolled for and one it is not."""
    config = FocusConfig(num_groups=4, top_k=2, window=16, sink_tokens=1, mode="hard", route_queries="query")
    layer = make_layer(config, 2, head_dim)
    layer.layer_idx = 0
    q, key, v, mask = make_inputs(2, 6, 2, 1100, head_dim, pads=(0, 30))
    with torch.no_grad(), counting_native_steps() as calls:
        steps, _ = decode(layer, q, key, v, mask, prompt=1094)
        expected = reference_with_dense_heads(layer, q, key, v, mask, scaling=0.4)[:, :, 1094:]
    torch.testing.assert_close(steps, expected, atol=2e-5, rtol=1e-4)
    assert calls[0] == 6


@pytest.mark.usefixtures("native_indexes")
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_native_steps_undo_the_rotary_embedding_as_the_eager_steps_do(case, monkeypatch):
    layer, (q, key, v, mask) = case_layer(case)
    # Routing undoes a rotary embedding of these frequencies (the written-out reference routes without one).
    layer.register_buffer("focus_inv_freq", 1.0 / 100 ** (torch.arange(0, 8, 2).float() / 8), persistent=False)
    with torch.no_grad(), counting_native_steps() as calls:
        native, native_index = decode(layer, q, key, v, mask, prompt=12)
    eager_steps(monkeypatch)
    with torch.no_grad():
        eager, eager_index = decode(layer, q, key, v, mask, prompt=12)
    assert calls[0] == (0 if layer.focus_config.window >= 41 else 41 - 12)
    assert torch.equal(native_index.groups(), eager_index.groups())
    torch.testing.assert_close(native, eager, atol=1e-6, rtol=1e-5)


@pytest.mark.usefixtures("native_indexes")
def test_steps_before_every_row_has_its_sinks_stay_eager():
    config = FocusConfig(num_groups=4, top_k=2, window=3, sink_tokens=3, mode="hard")
    layer = make_layer(config, 2, 8)
    layer.layer_idx = 0
    q, key, v, mask = make_inputs(2, 4, 2, 20, 8, pads=(0, 9))  # row 1: 9 padding keys, then its 3 sinks
    with torch.no_grad(), counting_native_steps() as calls:
        steps, _ = decode(layer, q, key, v, mask, prompt=10)
        expected = reference_with_dense_heads(layer, q, key, v, mask, scaling=0.4)[:, :, 10:]
    torch.testing.assert_close(steps, expected, atol=2e-5, rtol=1e-4)
    assert calls[0] == 20 - 12  # from the step whose cache holds row 1's third real key on


@pytest.mark.usefixtures("native_indexes")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_native_steps_in_half_precision_route_as_the_eager_steps_within_twice_the_reference_error(dtype, monkeypatch):
    config = FocusConfig(num_groups=8, top_k=2, window=5, sink_tokens=1, mode="hard", route_queries="kv_head")
    layer = make_layer(config, 2, 16)
    layer.layer_idx = 0
    q, key, v, mask = make_inputs(2, 6, 2, 40, 16, pads=(0, 7))
    low = [t.to(dtype) for t in (q, key, v)]
    with torch.no_grad(), counting_native_steps() as calls:
        native, native_index = decode(layer, *low, mask, prompt=12)
        exact = reference_attention(layer, q, key, v, mask, scaling=0.4)[:, :, 12:]
        ref = reference_attention(layer, *low, mask, scaling=0.4)[:, :, 12:].float()
    eager_steps(monkeypatch)
    with torch.no_grad():
        _, eager_index = decode(layer, *low, mask, prompt=12)
    assert calls[0] == 40 - 12
    assert torch.equal(native_index.groups(), eager_index.groups())  # the same groups for every key
    assert torch.equal(native_index.key_bits[:, :, :40], eager_index.key_bits[:, :, :40])
    native_err, ref_err = (native.float() - exact).abs().max(), (ref - exact).abs().max()
    assert native_err <= 2 * ref_err + 1e-3, (native_err, ref_err)


@pytest.mark.parametrize("route_queries", ["query", "kv_head"])
@pytest.mark.parametrize("rotary", [True, False])
@pytest.mark.parametrize("shared", [False, True])
def test_a_prompt_routed_natively_gets_the_eager_groups(route_queries, rotary, shared):
    """`route_prompt_natively` (a FocusCache(native=True) prompt) against the eager routing of the same prompt
    (`cache_key_groups` for the keys, `route_call` then top-k for the queries): the same groups, but where the eager
    scores of the k-th and the next group are within float32 rounding of each other (a product summed in another
    order may take either)."""
    from focus.attention.routers.centroids import top_k_groups
    from focus.attention.routers.routing import (
        cache_key_groups,
        key_positions,
        route_call,
        route_prompt_natively,
        routing_vectors,
    )

    config = FocusConfig(num_groups=7, top_k=2, window=4, sink_tokens=1, mode="hard", route_queries=route_queries,
                         shared_centroids=shared)
    layer = make_layer(config, 2, 16)
    if rotary:
        layer.focus_inv_freq = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
    q, key, _, mask = make_inputs(2, 6, 2, 300, 16, pads=(0, 9), seed=3)
    positions = key_positions(None, 300, q.device)
    with torch.no_grad():  # (with gradients the eager keys would route as in training, by Sinkhorn)
        key_groups, routed = route_prompt_natively(layer, q, key, mask, positions)
        vectors = routing_vectors(layer, key, positions)
        eager = route_call(layer, q, vectors, mask, positions)
    every = 3 if route_queries == "kv_head" else 1  # kv_head: one routing per key/value head (the eager one, repeated)
    query_scores = eager.query_log_assign[:, ::every]
    checks = ((key_groups, cache_key_groups(layer, vectors), eager.key_log_assign),
              (routed.query_groups, top_k_groups(query_scores, 2), query_scores))
    for native, expected, scores in checks:
        third = scores.topk(3, dim=-1).values
        clear = (third[..., 1] - third[..., 2] > 1e-5) & (third[..., 0] - third[..., 1] > 1e-5)
        clear &= eager.valid[:, None]  # (padding's groups are never read)
        assert clear.float().sum() > 0.99 * eager.valid[:, None].expand_as(clear).sum()
        assert torch.equal(native[clear], expected[clear])
    assert torch.equal(routed.sinks, eager.sinks) and torch.equal(routed.valid, eager.valid)


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [1, 2])
def test_generate_with_the_native_step_on_smollm2_gives_the_eager_tokens(smollm2, top_k):
    """Greedy generate() through FocusCache(native=True) after a left-padded prompt of real text: the tokens and
    logits of the eager FocusCache, every step past the prompt native, and the prompt's parts native
    (`native_routed_prefill`)."""
    import focus.attention.kernels.decomposed
    from focus import apply_focus, remove_focus
    from focus.attention.cache.decoding import FocusCache
    from focus.data import load_corpus, tokenize_corpus

    model, tokenizer = smollm2
    text = tokenize_corpus(load_corpus("books", "validation")[:20_000], tokenizer)
    ids = torch.stack([text[:300], torch.cat([torch.full((40,), tokenizer.pad_token_id), text[1000:1260]])])
    mask = torch.ones_like(ids)
    mask[1, :40] = 0
    apply_focus(model, FocusConfig(num_groups=16, window=64, top_k=top_k, mode="hard", route_queries="kv_head"),
                calibration_ids=text[None, 4000:4512])
    try:
        runs = []
        prefills, native_prefill = [], focus.attention.kernels.decomposed.native_routed_prefill

        def counted_prefill(*args):
            out = native_prefill(*args)
            prefills.append(True)
            return out

        focus.attention.kernels.decomposed.native_routed_prefill = counted_prefill
        for compile_step in (False, True):
            with torch.no_grad(), counting_native_steps() as calls:
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                     min_new_tokens=24, past_key_values=FocusCache(model, native=compile_step),
                                     output_logits=True, return_dict_in_generate=True)
            runs.append((out, calls[0], sum(prefills)))
    finally:
        focus.attention.kernels.decomposed.native_routed_prefill = native_prefill
        remove_focus(model)
    (eager, eager_calls, eager_prefills), (native, native_calls, native_prefills) = runs
    assert eager_calls == 0 and native_calls == 23 * model.config.num_hidden_layers
    assert eager_prefills == 0 and native_prefills == model.config.num_hidden_layers
    assert torch.equal(native.sequences, eager.sequences)
    torch.testing.assert_close(torch.stack(native.logits), torch.stack(eager.logits), atol=1e-4, rtol=1e-4)


def test_decode_step_rows_time_the_native_step_beside_the_others():
    from focus.eval.decode_speed import decode_step_rows

    rows = decode_step_rows([512], [(8, 32, 2)], [(4, 2)], head_dim=16, repeats=1, progress=lambda _: None,
                            routings=("query", "kv_head"), native=True)
    assert [row["routing"] for row in rows] == ["query", "kv_head"]
    assert all(row["native_s"] > 0 and row["native_speedup"] == row["full_s"] / row["native_s"] for row in rows)


@pytest.mark.parametrize("compile_step", [False, True])
def test_a_cropped_focus_cache_cuts_its_indexes_and_decodes_on_as_if_never_extended(compile_step):
    from test_training import tiny_llama

    from focus import apply_focus
    from focus.attention.cache.decoding import FocusCache

    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 60), generator=torch.Generator().manual_seed(3))
    apply_focus(model, FocusConfig(num_groups=4, window=4, top_k=2, mode="hard"), calibration_ids=ids[:, :32])
    with torch.no_grad():
        cache = FocusCache(model, native=compile_step)
        model(input_ids=ids[:, :30], past_key_values=cache)
        for t in range(30, 40):  # decoded, then taken back
            model(input_ids=ids[:, t : t + 1], past_key_values=cache)
        cache.crop(-10)
        assert {index.length for index in cache.indexes.values()} == {30}
        after = torch.cat([model(input_ids=ids[:, t : t + 1], past_key_values=cache).logits for t in range(30, 45)], 1)
        fresh = FocusCache(model, native=compile_step)
        model(input_ids=ids[:, :30], past_key_values=fresh)
        expected = torch.cat([model(input_ids=ids[:, t : t + 1], past_key_values=fresh).logits for t in range(30, 45)], 1)
    torch.testing.assert_close(after, expected, atol=1e-6, rtol=0)


def test_the_native_step_runs_below_its_length_and_where_the_sparse_step_would_not_pay(monkeypatch):
    """Which step a SmolLM2-shaped layer (9/3 heads, 16 groups) takes by cache length, native steps asked for."""
    from focus.attention.dispatch.planning import CallFacts, plan
    from focus.attention.dispatch.step_cost import NATIVE_STEP_BELOW, sparse_step_pays

    # the real cost model here
    monkeypatch.setattr(focus.attention.dispatch.kernel_table, "sparse_step_pays", sparse_step_pays)
    def first_sparse(routing_heads, top_k):
        return next((n for n in range(256, 70_000, 256) if sparse_step_pays(16, top_k, routing_heads, 3, n)), None)

    assert {(rh, k): first_sparse(rh, k) for rh, k in ((9, 1), (3, 1), (3, 2), (9, 2))} == {
        (9, 1): 6400, (3, 1): 3584, (3, 2): 10240, (9, 2): None}  # against the eager masked step
    for route_queries, top_k, native_up_to in (("query", 1, NATIVE_STEP_BELOW), ("kv_head", 2, NATIVE_STEP_BELOW),
                                               ("query", 2, 1 << 30)):
        config = FocusConfig(num_groups=16, top_k=top_k, route_queries=route_queries, mode="hard")
        for length in (1024, NATIVE_STEP_BELOW - 1, NATIVE_STEP_BELOW, 2 * NATIVE_STEP_BELOW):
            chosen = plan(config, CallFacts(queries=1, keys=length, cache="native"))
            assert (chosen.kernel == "native_step") == (length < native_up_to), (config, length, chosen)
            assert chosen.kernel in ("native_step", "sparse_step")  # never the eager masked step, where it pays
            stale = plan(config, CallFacts(queries=1, keys=length, cache="native", index_current=False))
            assert stale.kernel != "native_step"  # a cropped index, or sinks not yet seen: the eager step


def test_focus_cache_takes_the_native_kernels_by_default_and_falls_back_with_one_warning(monkeypatch):
    """FocusCache(model) on the CPU runs the native kernels; where they cannot be built it warns once and runs the
    eager path; native=True then fails in one line, native=False never builds; compile_step is a deprecated alias."""
    import warnings

    import focus.attention.native.build as build  # (the room's own test: it breaks the build from inside)

    model = apply_focus(tiny_model("llama"), FocusConfig(num_groups=4, window=4, mode="hard"),
                        calibration_ids=torch.randint(0, 100, (2, 32)))
    assert FocusCache(model).native and not FocusCache(model, native=False).native

    def broken():
        raise RuntimeError("Focus's native CPU kernels could not be built (no compiler here); they need a C++ compiler")

    monkeypatch.setattr(build, "kernels", broken)
    monkeypatch.setattr(build, "_BUILD_FAILED", [])
    with pytest.warns(RuntimeWarning, match="could not be built .* runs the eager PyTorch path") as caught:
        cache = FocusCache(model)
    assert len(caught) == 1 and not cache.native
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # known by now: no second build, no second warning
        assert not FocusCache(model).native
    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():  # and it decodes: the eager path
        model.generate(ids, max_new_tokens=4, do_sample=False, past_key_values=cache)
    with pytest.raises(RuntimeError, match="could not be built"):
        FocusCache(model, native=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not FocusCache(model, native=False).native  # never asks for a build
    with pytest.warns(FutureWarning, match="compile_step=...\\) is deprecated"):
        assert not FocusCache(model, compile_step=False).native


def test_a_lock_a_killed_build_left_is_removed_and_a_live_one_kept(tmp_path, monkeypatch):
    """torch's builder waits forever on its build folder's `lock`: a build killed midway would hang every later
    process at its first native call. An old lock goes (with a warning); a fresh one is a live build's and stays."""
    import os
    import time

    import focus.attention.native.build as build  # (the room's own test: its build's lock)

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "focus_native_test" / "lock"
    lock.parent.mkdir()
    lock.touch()
    assert not build.clear_stale_lock("focus_native_test") and lock.exists()
    old = time.time() - build.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    assert build.clear_stale_lock("focus_native_test") and not lock.exists()
    assert not build.clear_stale_lock("focus_native_test")
