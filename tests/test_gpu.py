"""The paths that run only on CUDA, each against the dense masked reference. On a CUDA machine (flash-attn installed
for the flash cases; docs/testing.md):

    python -m pytest -m gpu tests/test_gpu.py

Skipped where there is no GPU (this file runs in the default tier and skips)."""

import pytest
import torch
from test_decomposed import check_case
from test_training import tiny_llama

from focus import FocusConfig, apply_focus, set_focus_mode
from focus.attention import explain
from focus.attention.cache.decoding import FocusCache
from focus.attention.dispatch.fast_path import fast_path

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA_CASES = ["top1 gqa sinks", "top2 sinks padding", "top3", "head size 64", "head size 128"]


@pytest.mark.parametrize("routing", ["key", "query", "kv_head"])
@pytest.mark.parametrize("backend", ["flash", "torch"])
@pytest.mark.parametrize("case", CUDA_CASES)
def test_the_decomposition_on_cuda_matches_the_dense_reference(case, backend, routing):
    """flash-attn's segments run in bfloat16: within bfloat16 rounding of the float32 reference."""
    if backend == "flash":
        pytest.importorskip("flash_attn")
    tolerance = dict(atol=2e-2, rtol=2e-2) if backend == "flash" else dict(atol=2e-5, rtol=1e-4)
    check_case(case, backend, routing, "cuda", **tolerance)


@pytest.mark.parametrize("route_queries", ["key", "kv_head"])
def test_a_focus_model_on_cuda_prefills_and_decodes_as_the_dense_path(route_queries):
    """A tiny Llama in hard mode on CUDA: the prompt through the plan's decomposition (flash-attn where it is
    installed), every step through the group index, the logits of the dense masked path's."""
    model = tiny_llama().cuda()
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(2)).cuda()
    apply_focus(model, FocusConfig(num_groups=4, window=4, top_k=2, route_queries=route_queries),
                calibration_ids=ids[:, :32])
    set_focus_mode(model, "hard")
    assert explain(model, keys=40).kernel in ("decomposed_flash", "decomposed_torch")
    assert explain(model, keys=40, queries=1, cache="eager").kernel in ("masked_step", "sparse_step")
    runs = []
    for path in ("auto", "dense"):
        with fast_path(path), torch.no_grad():
            out = model.generate(input_ids=ids, do_sample=False, max_new_tokens=8, min_new_tokens=8,
                                 past_key_values=FocusCache(model), output_logits=True, return_dict_in_generate=True)
        runs.append(torch.stack(out.logits))
    torch.testing.assert_close(runs[0], runs[1], atol=3e-2, rtol=3e-2)


def test_flex_attention_on_cuda_is_the_dense_reference():
    """FlexAttention under Focus's BlockMask, compiled for CUDA (`focus.attention.kernels.flex`): its GPU use, one flag
    away."""
    from test_flex import case

    from focus.attention.kernels.flex import flex_hard_attention, focus_block_mask
    from focus.attention.pattern.reference import causal_pairs, dense_attention, hard_allowed

    query, key, value, key_groups, query_groups, valid, sinks = (t.cuda() for t in case("query"))
    mask = focus_block_mask(query_groups, key_groups, 20, valid, sinks, heads=6)
    got = flex_hard_attention(query, key, value, mask, 0.25)
    base = causal_pairs(300, 300, query.device)[None, None] & valid[:, None, None, :]
    allowed = hard_allowed(query_groups, key_groups.repeat_interleave(3, dim=1), 8, 20, base, sinks)
    expected = dense_attention(query, key, value, allowed, None, 0.25)
    rows = valid[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[rows], expected[rows], atol=2e-5, rtol=1e-4)
