"""The paths that run only on CUDA, each against the dense masked reference. On a CUDA machine (flash-attn installed
for the flash cases; docs/testing.md):

    python -m pytest -m gpu tests/test_gpu.py

Skipped where there is no GPU (this file runs in the default tier and skips)."""

import pytest
import torch
from test_decomposed import CASES, inputs, random_groups, reference
from test_training import tiny_llama

from focus import FocusConfig, apply_focus, set_focus_mode
from focus.attention import explain
from focus.attention.decoding import FocusCache
from focus.attention.decomposed import decomposed_hard_attention
from focus.attention.fast_path import fast_path
from focus.attention.routing import sink_keys

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA_CASES = ["top1 gqa sinks", "top2 sinks padding", "top3", "head size 64", "head size 128"]


@pytest.mark.parametrize("routing", ["key", "query", "kv_head"])
@pytest.mark.parametrize("backend", ["flash", "torch"])
@pytest.mark.parametrize("case", CUDA_CASES)
def test_the_decomposition_on_cuda_matches_the_dense_reference(case, backend, routing):
    """flash-attn's segments run in bfloat16: within bfloat16 rounding of the float32 reference."""
    if backend == "flash":
        pytest.importorskip("flash_attn")
    spec = dict(CASES[case])
    window, sink_tokens = spec.pop("window"), spec.pop("sink_tokens")
    pad, empty = spec.pop("pad", 0), spec.pop("empty", ())
    query, key, value, groups, valid = inputs(**spec, pad=pad, empty=empty)
    query_groups = per_query_head = None
    if routing != "key":
        heads = spec["h"] if routing == "query" else spec["k_heads"]
        query_groups = random_groups(spec["b"], heads, spec["length"], spec["num_groups"], spec["top_k"],
                                     torch.Generator().manual_seed(11), empty)
        per_query_head = query_groups.repeat_interleave(spec["h"] // heads, dim=1)
    sinks = sink_keys(valid, valid.shape[1], sink_tokens) if sink_tokens else None
    expected = reference(query, key, value, groups, spec["num_groups"], window, valid, sinks,
                         query_groups=per_query_head)
    cuda = [t.cuda() for t in (query, key, value, groups, valid)]
    got = decomposed_hard_attention(*cuda[:4], window, cuda[4], None if sinks is None else sinks.cuda(),
                                    backend=backend, query_groups=None if query_groups is None else query_groups.cuda())
    rows = valid[:, None, :, None].expand_as(got)
    tolerance = dict(atol=2e-2, rtol=2e-2) if backend == "flash" else dict(atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.cpu()[rows], expected[rows], **tolerance)


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
