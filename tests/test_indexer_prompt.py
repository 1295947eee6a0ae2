"""The indexer's prompt kernels (`focus.attention.kernels.indexer_prompt`, rows `indexer_prompt` and
`indexer_native_prompt`) against the dense masked reference over the indexer's pairs (`selectors.selected_pairs`)."""

import pytest
import torch
from test_indexer import Layer, case
from test_reference import padded_causal_mask

from focus.attention.dispatch.kernel_runs import masked
from focus.attention.kernels.call import AttentionCall
from focus.attention.kernels.indexer_prompt import indexer_prompt_attention
from focus.attention.routers.indexer import topk_thresholds
from focus.attention.routers.selectors import selected_pairs

pytestmark = pytest.mark.usefixtures("one_thread")


def native_thresholds(scores, need):
    from focus.attention.native import kernels

    return kernels().indexer_thresholds(scores, need)


THRESHOLDS = [pytest.param(topk_thresholds, id="topk"), pytest.param(native_thresholds, id="native")]


def reference(layer, call):
    return masked(call, selected_pairs(layer, call.query, call.key, call.base_mask, None))


@pytest.mark.parametrize("thresholds", THRESHOLDS)
@pytest.mark.parametrize("route_queries", ["query", "kv_head"])
@pytest.mark.parametrize("budget", [dict(budget=0.0), dict(budget=0.3), dict(budget=1.0), dict(budget_keys=4)])
def test_the_prompt_is_the_dense_reference_over_the_indexers_pairs(thresholds, route_queries, budget):
    """Blocks of 5 queries over 23 keys, the last 17 of them queries (a cached past of 6), left padding, the window and
    a sink: the output of the whole call's mask."""
    layer = Layer(heads=6, k_heads=2, route_queries=route_queries, **budget)
    query, key = case(seed=11, heads=6, length=23)
    value = torch.randn_like(key)
    base = padded_causal_mask(2, 23, [0, 4])[:, :, 6:]  # (B, 1, 17, 23)
    call = AttentionCall(query[:, :, 6:], key, value, base, None, 0.0, None, None)
    with torch.no_grad():
        got = indexer_prompt_attention(layer, call, thresholds, block=5)
        expected = reference(layer, call)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("thresholds", THRESHOLDS)
def test_a_longer_prompt_in_both_dtypes_and_without_a_mask(thresholds):
    """700 tokens in blocks of 256 (the default), no mask (plainly causal), a count budget, 3 query heads per key/value
    head, float32 and bfloat16."""
    layer = Layer(heads=6, k_heads=2, d=16, rank=4, route_queries="kv_head", budget_keys=90, sink_tokens=2)
    query, key = case(seed=12, heads=6, length=700, d=16)
    value = torch.randn_like(key)
    with torch.no_grad():
        for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            call = AttentionCall(*(x.to(dtype) for x in (query, key, value)), None, None, 0.0, None, None)
            got = indexer_prompt_attention(layer, call, thresholds)
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), reference(layer, call).float(), atol=tolerance, rtol=tolerance)


def test_a_mask_that_shows_a_query_later_keys_is_computed_over_every_key():
    """A model mask that is not causal (a query sees keys after it): the block's keys are all the keys, and the output
    is still the reference's."""
    layer = Layer(budget=0.5)
    query, key = case(seed=13, length=16)
    value = torch.randn_like(key)
    base = padded_causal_mask(2, 16, [0, 0])
    base[:, :, 2:6, 10:14] = True  # queries 2-5 see keys 10-13
    call = AttentionCall(query, key, value, base, None, 0.0, None, None)
    with torch.no_grad():
        got = indexer_prompt_attention(layer, call, topk_thresholds, block=4)
    torch.testing.assert_close(got, reference(layer, call), atol=1e-6, rtol=1e-5)


def test_the_native_thresholds_are_topks():
    """Each row's `need`-th largest candidate (-inf: not a candidate): rows that keep none (+inf), all of their
    candidates, or some, with ties."""
    gen = torch.Generator().manual_seed(14)
    scores = torch.randn(40, 300, generator=gen).round(decimals=1)  # ties
    scores[scores < -1] = float("-inf")
    scores[3] = float("-inf")
    candidates = torch.isfinite(scores).sum(dim=-1)
    need = torch.randint(0, 120, (40,), generator=gen).minimum(candidates)
    need[5] = candidates[5]
    need[6] = 0
    expected = topk_thresholds(scores, need)
    assert torch.equal(native_thresholds(scores, need), expected)
    assert expected[3] == expected[6] == float("inf")


def test_generate_runs_the_prompt_kernel_and_its_logits_are_the_dense_paths():
    """A plain forward pass of an indexer model on the CPU (the perplexity's) plans the native prompt kernel and gives
    the dense masked path's logits."""
    from test_training import tiny_llama

    from focus import FocusConfig, apply_focus
    from focus.attention import explain
    from focus.attention.dispatch.fast_path import fast_path

    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 300), generator=torch.Generator().manual_seed(15))
    apply_focus(model, FocusConfig(mode="hard", window=8, selector="indexer", indexer_rank=4, budget_keys=40,
                                   route_queries="kv_head"), calibration_ids=ids[:, :64])
    assert explain(model, keys=300).kernel == "indexer_native_prompt"
    with torch.no_grad():
        got = model(ids).logits
        with fast_path("dense"):
            expected = model(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
