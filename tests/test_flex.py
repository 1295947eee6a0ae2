"""Focus's hard pattern through FlexAttention (`focus.attention.kernels.flex`) against the dense masked reference."""

import pytest
import torch

from focus.attention.kernels.flex import block_density, flex_hard_attention, focus_block_mask
from focus.attention.pattern.reference import causal_pairs, dense_attention, hard_allowed
from focus.attention.routers.routing import sink_keys


def case(routing: str, seed: int = 0):
    """Two rows (the second left-padded), 6 query heads on 2 key/value heads, top-2 of 8 groups, window 20."""
    g = torch.Generator().manual_seed(seed)
    b, h, k_heads, length, d, groups = 2, 6, 2, 300, 16, 8
    query = torch.randn(b, h, length, d, generator=g)
    key, value = (torch.randn(b, k_heads, length, d, generator=g) for _ in range(2))
    key_groups = torch.rand(b, k_heads, length, groups, generator=g).topk(2, dim=-1).indices
    query_heads = h if routing == "query" else k_heads
    query_groups = torch.rand(b, query_heads, length, groups, generator=g).topk(2, dim=-1).indices
    valid = torch.ones(b, length, dtype=torch.bool)
    valid[1, :11] = False
    return query, key, value, key_groups, query_groups, valid, sink_keys(valid, length, 1)


@pytest.mark.parametrize("routing", ["query", "kv_head"])
def test_flex_attention_under_the_focus_block_mask_is_the_dense_reference(routing):
    query, key, value, key_groups, query_groups, valid, sinks = case(routing)
    mask = focus_block_mask(query_groups, key_groups, 20, valid, sinks, heads=6, block=64)
    got = flex_hard_attention(query, key, value, mask, 0.25, compiled=False)
    base = causal_pairs(300, 300)[None, None] & valid[:, None, None, :]
    per_head = query_groups.repeat_interleave(6 // query_groups.shape[1], dim=1)
    allowed = hard_allowed(per_head, key_groups.repeat_interleave(3, dim=1), 8, 20, base, sinks)
    expected = dense_attention(query, key, value, allowed, None, 0.25)
    rows = valid[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[rows], expected[rows], atol=1e-6, rtol=1e-5)
    assert 0 < block_density(mask) <= 1


def test_a_block_with_no_kept_pair_is_skipped():
    """One group each, queries and keys in different groups: only the blocks the window reaches run."""
    length = 512
    key_groups = torch.zeros(1, 1, length, 1, dtype=torch.long)
    query_groups = torch.ones(1, 1, length, 1, dtype=torch.long)
    mask = focus_block_mask(query_groups, key_groups, 64, block=128)
    # Of the 10 causal blocks, the 4 on the diagonal and the 3 below it (the window reaches back into them) run.
    assert block_density(mask) == pytest.approx(7 / 10)
    with pytest.raises(ValueError, match="group ids below 63"):
        focus_block_mask(query_groups + 70, key_groups, 64)


def test_a_one_query_block_mask_is_the_last_row_of_the_whole_sequences():
    """A decoding step's mask (the query the last of the tokens) keeps what the whole sequence's last row keeps."""
    query, key, value, key_groups, query_groups, valid, sinks = case("query")
    whole = flex_hard_attention(query, key, value, focus_block_mask(query_groups, key_groups, 20, valid, sinks,
                                                                     heads=6, block=64), 0.25, compiled=False)
    step_mask = focus_block_mask(query_groups[:, :, -1:], key_groups, 20, valid, sinks, heads=6, block=64)
    step = flex_hard_attention(query[:, :, -1:], key, value, step_mask, 0.25, compiled=False)
    torch.testing.assert_close(step, whole[:, :, -1:], atol=1e-6, rtol=1e-5)
