"""Focus's hard pattern through PyTorch's FlexAttention (`torch.nn.attention.flex_attention`): the ecosystem's own
block-sparse attention, on the CPU and the GPU, measured against the project's kernels (`benchmarks/flex_attention.py`).

The pattern is `focus.attention.pattern.rule.kept` as a `mask_mod`: a pair (i, j) is kept when it is causal, j is a real
token, and it is local (i - j < window), or j is a sink, or the query's and the key's groups meet (one AND of group
bits). The `BlockMask` lets FlexAttention skip the blocks (128 x 128 positions) that hold
no kept pair; every other block is computed in full and masked. Not a path of the plan: how it compares, and why, is
in benchmarks/results/speed/bench/flex_attention.md (`benchmarks/flex_attention.py`, rule `microbenchmark`).
"""

from __future__ import annotations

import functools

import torch

from focus.attention.pattern.rule import GROUP_BITS, SINK_BITS, group_bits, groups_meet, kept


def focus_block_mask(
    query_groups: torch.Tensor, key_groups: torch.Tensor, window: int, valid: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None, heads: int | None = None, block: int = 128,
):
    """The `BlockMask` of Focus's hard pattern: the queries are the last Q of the L tokens (Q = L: a whole sequence;
    Q = 1: a decoding step).

    Args:
        query_groups: (B, Hq, Q, k) the queries' groups, Hq the query heads or the key/value heads whose query heads
            share them; key_groups: (B, K, L, k); ids below `GROUP_BITS`.
        valid: (B, L) bool real tokens, or None; sinks: (B or 1, L) bool sink keys, or None.
        heads: the query heads (default Hq).
    """
    b, q_heads, queries, _ = query_groups.shape
    k_heads, length = key_groups.shape[1], key_groups.shape[2]
    offset = length - queries  # the first query's position
    heads = heads or q_heads
    if max(int(query_groups.max()), int(key_groups.max())) >= GROUP_BITS:
        raise ValueError(f"focus_block_mask takes group ids below {GROUP_BITS}")
    device = key_groups.device
    query_bits, key_bits = group_bits(query_groups), group_bits(key_groups)  # (B, Hq, Q), (B, K, L)
    valid = torch.ones(b, length, dtype=torch.bool, device=device) if valid is None else valid
    if sinks is not None:
        key_bits = key_bits.masked_fill(sinks.expand(b, length)[:, None] & valid[:, None], SINK_BITS)
    per_query_head, per_key_head = heads // q_heads, heads // k_heads

    def mask_mod(batch, head, q_idx, kv_idx):
        meet = groups_meet(query_bits[batch, head // per_query_head, q_idx],
                           key_bits[batch, head // per_key_head, kv_idx])
        position = q_idx + offset
        return kept(position, kv_idx, window, meet, (position >= kv_idx) & valid[batch, kv_idx])

    # Compiled beyond 1,024 pairs a row: the eager build evaluates the mask over every (head, query, key) at once.
    return _create_block_mask()(mask_mod, b, heads, queries, length, device=device, BLOCK_SIZE=block,
                                _compile=queries * length > 1024 * 1024)


def flex_hard_attention(query, key, value, block_mask, scaling: float | None = None, compiled: bool = True):
    """Hard Focus (B, H, L, D) under `block_mask` (`focus_block_mask`); key, value (B, K, L, D), grouped-query heads
    shared. `compiled`: through `torch.compile` (FlexAttention's fast path; the first call of a shape compiles it),
    else its eager reference (small sizes, tests)."""
    function = _compiled_flex() if compiled else _flex()
    return function(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])


def block_density(block_mask, causal: bool = True) -> float:
    """The share of the blocks FlexAttention computes (a block with any kept pair is computed whole) among the causal
    ones of a whole sequence (`causal`), or among all (one decoding query against every key)."""
    q_blocks, kv_blocks = block_mask.kv_num_blocks.shape[-1], block_mask.kv_indices.shape[-1]
    computed = block_mask.kv_num_blocks.sum().item() + (
        0 if block_mask.full_kv_num_blocks is None else block_mask.full_kv_num_blocks.sum().item())
    per_head = q_blocks * (q_blocks + 1) / 2 if causal else q_blocks * kv_blocks
    return computed / (per_head * block_mask.kv_num_blocks[..., 0].numel())


def _flex():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


@functools.cache
def _compiled_flex():
    return torch.compile(_flex(), dynamic=False)


def _create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask
